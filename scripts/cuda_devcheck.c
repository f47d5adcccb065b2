/*
 * cuda_devcheck.c: TEMPORARY developer checker for the generic CUDA backend (not part of
 * the build). Compares every CUDA op with the CPU backend on fresh random inputs, forces
 * each forward kernel variant, runs the graph test, and times graph-replayed forwards.
 *   cuda_devcheck check [quick]   correctness
 *   cuda_devcheck bench           timings
 */
#include "internal.h"
#include "cuda/kernels.h"
#include "numerics.h"
#include "../tests/graph_cuda.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fails;
static unsigned long long rng = 88172645463325252ull;
static unsigned rnd(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (unsigned)(rng >> 11);
}
static float urand(void) { return (float)(rnd() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }
static uint16_t bf(float f) { return smla_f32_to_bf16(f); }
static float fb(uint16_t h) { return smla_bf16_to_f32(h); }

#define CU(x)                                                                                \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      printf("CUDA FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define SM(ctx, x)                                                                           \
  do {                                                                                       \
    smla_status s_ = (x);                                                                    \
    if (s_ != SMLA_OK) {                                                                     \
      printf("SMLA FAIL %s:%d %s: %s: %s\n", __FILE__, __LINE__, #x, smla_status_string(s_), \
             smla_context_message(ctx));                                                     \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static void *dup_dev(const void *h, size_t n) {
  void *d;
  CU(cudaMalloc(&d, n ? n : 1));
  if (n) CU(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  return d;
}
static void down(void *h, const void *d, size_t n) {
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

static smla_context *G, *C;

/* ---- cache write: bit-exact ---- */
static void check_cache_write(void) {
  const int T = 700, S = 600;
  for (int fmt = 0; fmt < 3; fmt++)
    for (int dr = 0; dr <= 64; dr += 64) {
      const size_t rb = smla_cache_row_size(fmt, dr) + 16 * (fmt == 1);
      uint16_t *kv = malloc((size_t)T * 520 * 2), *pe = malloc((size_t)T * 72 * 2);
      int64_t *slot = malloc(T * 8);
      for (int t = 0; t < T; t++) {
        const float mag = powf(2.0f, (float)((int)(rnd() % 60) - 40));
        for (int i = 0; i < 520; i++) {
          float v = urand() * mag;
          unsigned r = rnd() % 1000;
          if (r == 0) v = NAN;
          else if (r == 1) v = INFINITY;
          else if (r == 2) v = -INFINITY;
          else if (r == 3) v = 1e30f;
          else if (r < 6) v = smla_bits_f32(rnd() & 0x807fffffu); /* subnormal */
          kv[t * 520 + i] = bf(v);
        }
        for (int i = 0; i < 72; i++) pe[t * 72 + i] = bf(urand() * 3);
        const unsigned r = rnd() % 10;
        slot[t] = r == 0 ? -1 - (int)(rnd() % 5) : r == 1 ? S + (int)(rnd() % 4) : t < S ? t : -1;
      }
      uint8_t *hc = malloc(S * rb), *gc = malloc(S * rb);
      for (size_t i = 0; i < S * rb; i++) hc[i] = (uint8_t)(i * 7);
      void *dkv = dup_dev(kv, (size_t)T * 520 * 2), *dpe = dup_dev(pe, (size_t)T * 72 * 2);
      void *dslot = dup_dev(slot, T * 8), *dc = dup_dev(hc, S * rb);
      uint64_t hb = 5, gb = 5;
      void *dbad = dup_dev(&gb, 8);
      smla_cache_write_params w = {0};
      w.num_tokens = T, w.kv_c_stride = 520, w.k_pe_stride = 72;
      w.cache.format = fmt, w.cache.dr = dr, w.cache.num_slots = S, w.cache.row_bytes = rb;
      w.cache.scale = 0.0123f;
      w.kv_c = kv, w.k_pe = dr ? pe : NULL, w.slot = slot, w.cache.data = hc, w.bad_inputs = &hb;
      SM(C, smla_cache_write(C, &w, NULL));
      w.kv_c = dkv, w.k_pe = dr ? dpe : NULL, w.slot = dslot, w.cache.data = dc, w.bad_inputs = dbad;
      SM(G, smla_cache_write(G, &w, NULL));
      down(gc, dc, S * rb);
      down(&gb, dbad, 8);
      size_t diff = 0;
      for (size_t i = 0; i < S * rb; i++) diff += gc[i] != hc[i];
      printf("cache_write fmt=%d dr=%d: %zu bytes differ, bad %llu vs %llu\n", fmt, dr, diff,
             (unsigned long long)gb, (unsigned long long)hb);
      if (diff || gb != hb) fails++;
      cudaFree(dkv), cudaFree(dpe), cudaFree(dslot), cudaFree(dc), cudaFree(dbad);
      free(kv), free(pe), free(slot), free(hc), free(gc);
    }
}

/* ---- convert: exact ---- */
static void check_convert(void) {
  for (int compact = 0; compact < 2; compact++)
    for (int K = 1; K <= 3000; K = K * 7 + 3) {
      const int T = 37, R = 5, B = 9, bs = 3 + (int)(rnd() % 60);
      int32_t *req = malloc(T * 4), *bt = malloc(R * (B + 2) * 4), *loc = malloc((size_t)T * K * 4);
      for (int t = 0; t < T; t++) req[t] = (int)(rnd() % 8) - 1; /* some out of range */
      for (int i = 0; i < R * (B + 2); i++)
        bt[i] = rnd() % 10 == 0 ? -1 : (rnd() % 5 == 0 ? 0x7ffffff0 / bs + (int)(rnd() % 3) : (int)(rnd() % 5000));
      for (int i = 0; i < T * K; i++) loc[i] = (int)(rnd() % (B * bs + 20)) - 10;
      int32_t *hs = malloc((size_t)T * K * 4), *gs = malloc((size_t)T * K * 4), hv[37], gv[37];
      void *dreq = dup_dev(req, T * 4), *dbt = dup_dev(bt, R * (B + 2) * 4);
      void *dloc = dup_dev(loc, (size_t)T * K * 4), *dsl, *dv;
      CU(cudaMalloc(&dsl, (size_t)T * K * 4));
      CU(cudaMalloc(&dv, T * 4));
      smla_convert_params p = {0};
      p.num_tokens = T, p.topk = K, p.num_requests = R, p.blocks_per_request = B;
      p.block_table_stride = B + 2, p.block_size = bs, p.local_stride = K, p.slots_stride = K;
      p.compact = compact;
      p.req_id = req, p.block_table = bt, p.local = loc, p.slots = hs, p.valid = hv;
      SM(C, smla_convert_indices(C, &p, NULL));
      p.req_id = dreq, p.block_table = dbt, p.local = dloc, p.slots = dsl, p.valid = dv;
      SM(G, smla_convert_indices(G, &p, NULL));
      down(gs, dsl, (size_t)T * K * 4);
      down(gv, dv, T * 4);
      int bad = memcmp(gs, hs, (size_t)T * K * 4) != 0 || memcmp(gv, hv, T * 4) != 0;
      printf("convert compact=%d K=%d: %s\n", compact, K, bad ? "MISMATCH" : "ok");
      fails += bad;
      cudaFree(dreq), cudaFree(dbt), cudaFree(dloc), cudaFree(dsl), cudaFree(dv);
      free(req), free(bt), free(loc), free(hs), free(gs);
    }
}

static double rel_row_err(const float *a, const float *b, int n, int *nan_mismatch) {
  double e = 0, r = 0;
  for (int i = 0; i < n; i++) {
    if (isnan(a[i]) != isnan(b[i])) {
      *nan_mismatch = 1;
      continue;
    }
    if (isnan(a[i])) continue;
    e = fmax(e, fabs(a[i] - b[i]));
    r = fmax(r, fabs(b[i]));
  }
  return e / fmax(r, 1e-6);
}

static int scalar_mismatch(float a, float b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) != isnan(b);
  if (isinf(a) || isinf(b)) return a != b;
  return fabs(a - b) > tol * fmax(1.0, fabs(b));
}

/* ---- merge ---- */
static void check_merge(void) {
  const int Ps[] = {1, 3, 40}, dvs[] = {512, 100, 3};
  for (int pi = 0; pi < 3; pi++)
    for (int di = 0; di < 3; di++)
      for (int in_bf = 0; in_bf < 2; in_bf++)
        for (int out_bf = 0; out_bf < 2; out_bf++) {
          const int P = Ps[pi], T = 7, N = 5, dv = dvs[di];
          const int sh = dv + 4, st = N * sh + 4, sp = T * st;
          const size_t eb = in_bf ? 2 : 4, ob = out_bf ? 2 : 4;
          uint8_t *op = malloc((size_t)P * sp * eb);
          float *lp = malloc((size_t)P * T * N * 4);
          for (int i = 0; i < P * sp; i++) {
            const float v = urand() * 3;
            if (in_bf) ((uint16_t *)op)[i] = bf(v);
            else ((float *)op)[i] = v;
          }
          for (int p = 0; p < P; p++)
            for (int t = 0; t < T; t++)
              for (int h = 0; h < N; h++) {
                float l = urand() * 20;
                if (rnd() % 4 == 0 || t == 3) l = -INFINITY;
                lp[(p * T + t) * N + h] = l;
                if (l == -INFINITY) /* NaN rows must not be read */
                  for (int d = 0; d < dv; d++) {
                    const int i = p * sp + t * st + h * sh + d;
                    if (in_bf) ((uint16_t *)op)[i] = 0x7fc0;
                    else ((float *)op)[i] = NAN;
                  }
              }
          const size_t osz = (size_t)T * N * dv;
          uint8_t *ho = malloc(osz * ob), *go = malloc(osz * ob);
          float hl[35], gl[35];
          void *dop = dup_dev(op, (size_t)P * sp * eb), *dlp = dup_dev(lp, (size_t)P * T * N * 4), *doo, *dl;
          CU(cudaMalloc(&doo, osz * ob));
          CU(cudaMalloc(&dl, 35 * 4));
          smla_merge_params m = {0};
          m.num_partials = P, m.num_tokens = T, m.num_heads = N, m.dv = dv;
          m.out_p_dtype = in_bf ? SMLA_DTYPE_BF16 : SMLA_DTYPE_F32;
          m.out_p_stride_p = sp, m.out_p_stride_t = st, m.out_p_stride_h = sh;
          m.lse_p_stride_p = T * N, m.lse_p_stride_t = N;
          m.out_dtype = out_bf ? SMLA_DTYPE_BF16 : SMLA_DTYPE_F32;
          m.out_stride_t = (int64_t)N * dv, m.out_stride_h = dv, m.lse_stride_t = N;
          m.out_p = op, m.lse_p = lp, m.out = ho, m.lse = hl;
          SM(C, smla_merge_states(C, &m, NULL));
          m.out_p = dop, m.lse_p = dlp, m.out = doo, m.lse = dl;
          SM(G, smla_merge_states(G, &m, NULL));
          down(go, doo, osz * ob);
          down(gl, dl, 35 * 4);
          double worst = 0;
          int bad = 0;
          float *a = malloc(dv * 4), *b = malloc(dv * 4);
          for (int r = 0; r < T * N; r++) {
            for (int d = 0; d < dv; d++) {
              const size_t i = (size_t)r * dv + d;
              a[d] = out_bf ? fb(((uint16_t *)go)[i]) : ((float *)go)[i];
              b[d] = out_bf ? fb(((uint16_t *)ho)[i]) : ((float *)ho)[i];
            }
            int nm = 0;
            const double e = rel_row_err(a, b, dv, &nm);
            worst = fmax(worst, e);
            bad |= nm || e > (out_bf ? 1e-2 : 1e-4) || scalar_mismatch(gl[r], hl[r], 1e-5);
          }
          printf("merge P=%d dv=%d in_bf=%d out_bf=%d: worst %.2e %s\n", P, dv, in_bf, out_bf,
                 worst, bad ? "MISMATCH" : "ok");
          fails += bad;
          free(a), free(b), free(op), free(lp), free(ho), free(go);
          cudaFree(dop), cudaFree(dlp), cudaFree(doo), cudaFree(dl);
        }
}

/* ---- forward ---- */
typedef struct fcase {
  int fmt, dr, T, N, K, S, lengths, softcap, sink, splits, invariant, dups, mtiles, pipe;
  float sm_scale;
} fcase;

static int optin_smem(void) {
  int v = 0;
  CU(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  return v;
}

static double g_worst;

static void run_forward_case(const fcase *c) {
  const int T = c->T, N = c->N, K = c->K, S = c->S, dr = c->dr, dqk = 512 + dr;
  const int used_rows = S * 3 / 4;
  const size_t rb = smla_cache_row_size(c->fmt, dr) + (rnd() % 2) * 16;
  /* q: [T][N][dqk] with padding per head and per row */
  const int qh = dqk + 8, qt = N * qh + 16;
  uint16_t *q = malloc((size_t)T * qt * 2);
  for (int i = 0; i < T * qt; i++) q[i] = bf(urand() * 2);
  /* cache: rows written by the CPU writer, rows >= used_rows NaN */
  uint16_t *kv = malloc((size_t)S * 512 * 2), *pe = malloc((size_t)S * 64 * 2 + 2);
  int64_t *sl = malloc(S * 8);
  for (int i = 0; i < S * 512; i++) kv[i] = bf(urand() * 1.5f);
  for (int i = 0; i < S * 64; i++) pe[i] = bf(urand() * 1.5f);
  for (int i = 0; i < S; i++) sl[i] = i;
  uint8_t *cache = malloc(S * rb);
  memset(cache, 0, S * rb);
  smla_cache_write_params w = {0};
  w.num_tokens = S, w.kv_c = kv, w.kv_c_stride = 512, w.k_pe = dr ? pe : NULL, w.k_pe_stride = 64;
  w.slot = sl, w.cache.format = c->fmt, w.cache.dr = dr, w.cache.num_slots = S;
  w.cache.row_bytes = rb, w.cache.data = cache, w.cache.scale = 0.0078125f * 1.37f;
  SM(C, smla_cache_write(C, &w, NULL));
  memset(cache + (size_t)used_rows * rb, 0xff, (size_t)(S - used_rows) * rb);
  int32_t *slots = malloc((size_t)T * (K + 3) * 4), *len = malloc(T * 4);
  for (int t = 0; t < T; t++) {
    for (int k = 0; k < K + 3; k++) {
      unsigned r = rnd() % 100;
      slots[t * (K + 3) + k] = r < 85 ? (int)(rnd() % used_rows) : r < 93 ? -1 : r < 97 ? S + (int)(rnd() % 9) : -2 - (int)(rnd() % 100);
      if (c->dups && k > 0 && rnd() % 3 == 0) slots[t * (K + 3) + k] = slots[t * (K + 3) + k - 1];
    }
    if (t % 5 == 4) for (int k = 0; k < K; k++) slots[t * (K + 3) + k] = -1; /* empty row */
    unsigned r = rnd() % 5;
    len[t] = r == 0 ? 0 : r == 1 ? K + 5 : r == 2 ? -1 : (int)(rnd() % (K + 1));
  }
  float *sink = malloc(N * 4);
  for (int h = 0; h < N; h++) sink[h] = h == 1 ? -INFINITY : urand() * 3;
  const int oh = 512 + 8, ot = N * oh + 8, lt = N + 3;
  const size_t osz = (size_t)T * ot;
  uint16_t *ho = malloc(osz * 2), *go = malloc(osz * 2);
  float *hl = malloc(T * lt * 4), *gl = malloc(T * lt * 4), *hm = malloc(T * lt * 4), *gm = malloc(T * lt * 4);
  for (size_t i = 0; i < osz; i++) ho[i] = 0x7fc1;
  for (int i = 0; i < T * lt; i++) hl[i] = hm[i] = NAN;
  uint64_t hb = 0, gb = 0;

  smla_plan_desc d = {0};
  d.max_tokens = T + (int)(rnd() % 3), d.num_heads = N, d.topk = K, d.dr = dr, d.format = c->fmt;
  d.flags = c->invariant ? SMLA_PLAN_BATCH_INVARIANT : 0, d.num_splits = c->splits;
  smla_plan *cp, *gp;
  SM(C, smla_plan_create(C, &d, NULL, 0, &cp));
  SM(G, smla_plan_create(G, &d, NULL, 0, &gp));
  if (c->mtiles) { /* force a variant */
    gp->heads_per_block = 16 * c->mtiles;
    gp->kernel = c->pipe;
    smla_cuda_fwd_config cfg = {c->fmt, dr, c->mtiles, c->pipe};
    if ((int)smla_cuda_fwd_layout_of(c->fmt, dr, c->mtiles, c->pipe).total > optin_smem()) {
      printf("  (variant mt=%d pipe=%d does not fit, skipped)\n", c->mtiles, c->pipe);
      goto out;
    }
    cudaError_t e = c->fmt == 0 ? smla_cuda_fwd_prepare_bf16(&cfg, optin_smem())
                    : c->fmt == 1 ? smla_cuda_fwd_prepare_fp8(&cfg, optin_smem())
                                  : smla_cuda_fwd_prepare_ds(&cfg, optin_smem());
    CU(e);
  }
  smla_forward_params f = {0};
  f.num_tokens = T, f.num_heads = N, f.topk = K;
  f.q_nope_stride_t = qt, f.q_nope_stride_h = qh, f.q_pe_stride_t = qt, f.q_pe_stride_h = qh;
  f.cache = w.cache, f.slots_stride = K + 3, f.sm_scale = c->sm_scale;
  f.softcap = c->softcap ? 12.5f : 0.0f;
  f.out_stride_t = ot, f.out_stride_h = oh, f.lse_stride_t = lt, f.max_logit_stride_t = lt;
  f.q_nope = q, f.q_pe = dr ? q + 512 : NULL, f.cache.data = cache, f.slots = slots;
  f.lengths = c->lengths ? len : NULL, f.sink = c->sink ? sink : NULL;
  f.out = ho, f.lse = hl, f.max_logit = hm, f.bad_inputs = &hb;
  SM(C, smla_forward(cp, &f, NULL));
  {
    void *dq = dup_dev(q, (size_t)T * qt * 2), *dc = dup_dev(cache, S * rb);
    void *ds = dup_dev(slots, (size_t)T * (K + 3) * 4), *dlen = dup_dev(len, T * 4);
    void *dsink = dup_dev(sink, N * 4), *dout = dup_dev(ho, osz * 2);
    void *dl = dup_dev(gl, T * lt * 4), *dm = dup_dev(gm, T * lt * 4), *db = dup_dev(&gb, 8);
    CU(cudaMemset(dout, 0xff, osz * 2));
    CU(cudaMemset(dl, 0xff, T * lt * 4));
    CU(cudaMemset(dm, 0xff, T * lt * 4));
    f.q_nope = dq, f.q_pe = dr ? (uint16_t *)dq + 512 : NULL, f.cache.data = dc, f.slots = ds;
    f.lengths = c->lengths ? dlen : NULL, f.sink = c->sink ? dsink : NULL;
    f.out = dout, f.lse = dl, f.max_logit = dm, f.bad_inputs = db;
    SM(G, smla_forward(gp, &f, NULL));
    down(go, dout, osz * 2);
    down(gl, dl, T * lt * 4);
    down(gm, dm, T * lt * 4);
    down(&gb, db, 8);
    cudaFree(dq), cudaFree(dc), cudaFree(ds), cudaFree(dlen), cudaFree(dsink), cudaFree(dout);
    cudaFree(dl), cudaFree(dm), cudaFree(db);
  }
  {
    double worst = 0;
    int bad = 0, pad_bad = 0, nm_any = 0, sc_bad = 0;
    float a[512], b[512];
    for (int t = 0; t < T; t++)
      for (int h = 0; h < N; h++) {
        for (int i = 0; i < 512; i++) {
          a[i] = fb(go[(size_t)t * ot + h * oh + i]);
          b[i] = fb(ho[(size_t)t * ot + h * oh + i]);
        }
        for (int i = 512; i < oh && (h + 1) * oh <= ot; i++)
          pad_bad |= go[(size_t)t * ot + h * oh + i] != 0xffff;
        int nm = 0;
        const double e = rel_row_err(a, b, 512, &nm);
        worst = fmax(worst, e);
        nm_any |= nm;
        if (scalar_mismatch(gl[t * lt + h], hl[t * lt + h], 2e-3) ||
            scalar_mismatch(gm[t * lt + h], hm[t * lt + h], 2e-3)) {
          if (sc_bad < 3)
            printf("    t=%d h=%d lse %g vs %g, max %g vs %g\n", t, h, gl[t * lt + h],
                   hl[t * lt + h], gm[t * lt + h], hm[t * lt + h]);
          sc_bad++;
        }
      }
    bad = worst > 1.5e-2 || pad_bad || nm_any || sc_bad || gb != hb;
    g_worst = fmax(g_worst, worst);
    printf("fwd fmt=%d dr=%d T=%d N=%d K=%d len=%d cap=%d sink=%d splits=%d inv=%d mt=%d pipe=%d: "
           "err %.2e nan%d pad%d lse%d bad %llu/%llu %s | %s\n",
           c->fmt, dr, T, N, K, c->lengths, c->softcap, c->sink, c->splits, c->invariant,
           c->mtiles, c->pipe, worst, nm_any, pad_bad, sc_bad, (unsigned long long)gb,
           (unsigned long long)hb, bad ? "MISMATCH" : "ok", smla_plan_describe(gp));
    fails += bad;
  }
out:
  smla_plan_destroy(cp), smla_plan_destroy(gp);
  free(q), free(kv), free(pe), free(sl), free(cache), free(slots), free(len), free(sink);
  free(ho), free(go), free(hl), free(gl), free(hm), free(gm);
}

static void check_forward(int quick) {
  fcase c;
  /* shapes x formats, default plan */
  const int shapes[][3] = {{1, 16, 2048}, {3, 1, 300}, {37, 20, 129}, {5, 64, 1}, {9, 100, 700},
                           {4, 128, 2048}, {2, 48, 64}, {40, 128, 200}};
  const int qshapes[][3] = {{3, 20, 300}, {2, 70, 129}};
  for (int fmt = 0; fmt < 3; fmt++)
    for (int dr = 64; dr >= 0; dr -= 64)
      for (int si = 0; si < (quick ? 2 : 8); si++) {
        memset(&c, 0, sizeof c);
        c.fmt = fmt, c.dr = dr;
        c.T = quick ? qshapes[si][0] : shapes[si][0];
        c.N = quick ? qshapes[si][1] : shapes[si][1];
        c.K = quick ? qshapes[si][2] : shapes[si][2];
        c.S = 4096, c.sm_scale = si % 2 ? 0.3f : 1.0f / sqrtf(512.0f + dr);
        c.lengths = si % 3 != 0, c.softcap = si % 4 == 1, c.sink = si % 2 == 0, c.dups = si % 3 == 1;
        if (quick) c.splits = si + 1;
        run_forward_case(&c);
      }
  /* split policies */
  for (int sp = 0; sp < (quick ? 0 : 5); sp++) {
    memset(&c, 0, sizeof c);
    c.fmt = sp % 3, c.dr = 64, c.T = 6, c.N = 16 + 16 * sp, c.K = 1000, c.S = 3000;
    c.sm_scale = 0.1f, c.lengths = 1, c.sink = 1;
    c.splits = (int[]){1, 3, 7, 64, 1000}[sp];
    run_forward_case(&c);
    c.splits = 0, c.invariant = 1;
    run_forward_case(&c);
  }
  /* every variant (quick: the 64-head ones) */
  for (int fmt = 0; fmt < 3; fmt++)
    for (int dr = 64; dr >= (quick ? 64 : 0); dr -= 64)
      for (int mt = quick ? 4 : 1; mt <= 4; mt *= 2)
        for (int pipe = fmt == 0 ? 1 : 0; pipe <= 2; pipe++) {
          memset(&c, 0, sizeof c);
          c.fmt = fmt, c.dr = dr, c.T = 3, c.N = mt == 4 ? 70 : 16 * mt, c.K = 333, c.S = 2048;
          c.sm_scale = 0.2f, c.lengths = 1, c.sink = pipe == 1, c.softcap = pipe == 2;
          c.splits = 2, c.mtiles = mt, c.pipe = pipe;
          run_forward_case(&c);
        }
}

/* ---- bench ---- */
static void bench_case(int fmt, int dr, int T, int N, int K, int splits, void *dq, void *dc,
                       int64_t S, void *dslots, void *dout) {
  smla_plan_desc d = {0};
  d.max_tokens = T, d.num_heads = N, d.topk = K, d.dr = dr, d.format = fmt, d.num_splits = splits;
  smla_plan *p;
  SM(G, smla_plan_create(G, &d, NULL, 0, &p));
  smla_forward_params f = {0};
  const int dqk = 512 + dr;
  f.num_tokens = T, f.num_heads = N, f.topk = K;
  f.q_nope = dq, f.q_pe = dr ? (uint16_t *)dq + 512 : NULL;
  f.q_nope_stride_t = (int64_t)N * dqk, f.q_nope_stride_h = dqk;
  f.q_pe_stride_t = (int64_t)N * dqk, f.q_pe_stride_h = dqk;
  f.cache.format = fmt, f.cache.dr = dr, f.cache.num_slots = S;
  f.cache.row_bytes = smla_cache_row_size(fmt, dr), f.cache.data = dc, f.cache.scale = 0.01f;
  f.slots = dslots, f.slots_stride = K, f.sm_scale = 1.0f / sqrtf((float)dqk);
  f.out = dout, f.out_stride_t = (int64_t)N * 512, f.out_stride_h = 512;
  cudaStream_t st;
  CU(cudaStreamCreate(&st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  SM(G, smla_forward(p, &f, st));
  CU(cudaStreamEndCapture(st, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; i++) CU(cudaGraphLaunch(ge, st));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  const double flop = 2.0 * T * N * K * (double)(dqk + 512);
  int reps = flop > 1e11 ? 10 : flop > 1e9 ? 50 : 200;
  float ms[5];
  for (int r = 0; r < 5; r++) {
    CU(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++) CU(cudaGraphLaunch(ge, st));
    CU(cudaEventRecord(e1, st));
    CU(cudaEventSynchronize(e1));
    CU(cudaEventElapsedTime(&ms[r], e0, e1));
  }
  for (int i = 0; i < 5; i++)
    for (int j = i + 1; j < 5; j++)
      if (ms[j] < ms[i]) { float x = ms[i]; ms[i] = ms[j]; ms[j] = x; }
  const double us = ms[2] * 1000.0 / reps;
  printf("bench fmt=%d dr=%d T=%4d N=%3d K=%d splits=%2d: %9.2f us  %6.1f TFLOP/s | %s\n", fmt, dr,
         T, N, K, splits, us, flop / us * 1e-6, smla_plan_describe(p));
  cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  smla_plan_destroy(p);
}

static void bench(void) {
  const int64_t S = 262144;
  const int K = 2048, Tmax = 1024, Nmax = 128;
  /* cache: 4096 random source rows written to every slot */
  const int src = 4096;
  uint16_t *kv = malloc((size_t)src * 512 * 2), *pe = malloc((size_t)src * 64 * 2);
  for (int i = 0; i < src * 512; i++) kv[i] = bf(urand());
  for (int i = 0; i < src * 64; i++) pe[i] = bf(urand());
  void *dkv = dup_dev(kv, (size_t)src * 512 * 2), *dpe = dup_dev(pe, (size_t)src * 64 * 2);
  int64_t *sl = malloc(src * 8);
  void *dsl;
  CU(cudaMalloc(&dsl, src * 8));
  void *dcache[3];
  for (int fmt = 0; fmt < 3; fmt++) {
    CU(cudaMalloc(&dcache[fmt], S * smla_cache_row_size(fmt, 64)));
    for (int64_t b = 0; b < S; b += src) {
      for (int i = 0; i < src; i++) sl[i] = b + i;
      CU(cudaMemcpy(dsl, sl, src * 8, cudaMemcpyHostToDevice));
      smla_cache_write_params w = {0};
      w.num_tokens = src, w.kv_c = dkv, w.kv_c_stride = 512, w.k_pe = dpe, w.k_pe_stride = 64;
      w.slot = dsl, w.cache.format = fmt, w.cache.dr = 64, w.cache.num_slots = S;
      w.cache.row_bytes = smla_cache_row_size(fmt, 64), w.cache.data = dcache[fmt], w.cache.scale = 0.01f;
      SM(G, smla_cache_write(G, &w, NULL));
    }
  }
  const size_t qn = (size_t)Tmax * Nmax * 576;
  uint16_t *q = malloc(qn * 2);
  for (size_t i = 0; i < qn; i++) q[i] = bf(urand());
  void *dq = dup_dev(q, qn * 2);
  int32_t *slots = malloc((size_t)Tmax * K * 4);
  for (size_t i = 0; i < (size_t)Tmax * K; i++) slots[i] = (int32_t)(rnd() % S);
  void *dslots = dup_dev(slots, (size_t)Tmax * K * 4), *dout;
  CU(cudaMalloc(&dout, (size_t)Tmax * Nmax * 512 * 2));
  const int sh[][2] = {{1, 16}, {16, 16}, {16, 128}, {1024, 16}, {1024, 128}, {1, 128}, {64, 128}, {128, 16}};
  for (int i = 0; i < 8; i++) bench_case(0, 64, sh[i][0], sh[i][1], K, 0, dq, dcache[0], S, dslots, dout);
  for (int i = 0; i < 5; i++) bench_case(2, 64, sh[i][0], sh[i][1], K, 0, dq, dcache[2], S, dslots, dout);
  bench_case(1, 64, 1024, 128, K, 0, dq, dcache[1], S, dslots, dout);
  bench_case(1, 64, 1, 16, K, 0, dq, dcache[1], S, dslots, dout);
  /* split sweeps for the cost model */
  const int sw[] = {1, 2, 4, 8, 16, 32};
  for (int i = 0; i < 6; i++) bench_case(0, 64, 1, 16, K, sw[i], dq, dcache[0], S, dslots, dout);
  for (int i = 0; i < 5; i++) bench_case(0, 64, 16, 128, K, sw[i], dq, dcache[0], S, dslots, dout);
  for (int i = 0; i < 4; i++) bench_case(0, 64, 16, 16, K, sw[i], dq, dcache[0], S, dslots, dout);
  for (int i = 0; i < 3; i++) bench_case(0, 64, 64, 128, K, sw[i], dq, dcache[0], S, dslots, dout);
  for (int i = 0; i < 3; i++) bench_case(0, 64, 128, 16, K, sw[i], dq, dcache[0], S, dslots, dout);
}

int main(int argc, char **argv) {
  const int is_bench = argc > 1 && strcmp(argv[1], "bench") == 0;
  const int quick = argc > 2 && strcmp(argv[2], "quick") == 0;
  SM(G, smla_context_create(&G, 0));
  SM(C, smla_context_create(&C, SMLA_DEVICE_CPU));
  char name[256];
  smla_cuda_device_name(0, name, sizeof name);
  printf("device: %s\n", name);
  if (is_bench) {
    bench();
  } else {
    check_cache_write();
    check_convert();
    check_merge();
    check_forward(quick);
    const int gf = smla_test_cuda_graph(7);
    printf("graph test failures: %d\n", gf);
    fails += gf;
    printf("forward worst rel err %.3e\n", g_worst);
  }
  printf("TOTAL FAILS: %d\n", fails);
  smla_context_destroy(G);
  smla_context_destroy(C);
  return fails != 0;
}
