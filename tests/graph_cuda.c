/* graph_cuda.c: see graph_cuda.h. */
#include "graph_cuda.h"

#include "numerics.h" /* bf16 of the random inputs and of out, as in harness.c */
#include "smla.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G_T 5          /* rows captured (the plan serves up to G_MAX_T) */
#define G_MAX_T 8
#define G_N 16         /* heads */
#define G_K 300        /* entries per row: 5 tiles, the last one partial */
#define G_DR 64
#define G_DQK (SMLA_DC + G_DR)
#define G_SLOTS 1024   /* rows written; rows >= G_USED are NaN and never referenced */
#define G_USED 768
#define G_REPLAYS 4
/* smla_forward_indices replays: G_R requests of G_B blocks of G_BS slots; block ids map
 * into the written rows (< G_USED / G_BS) or past the cache (bad inputs), or are -1. */
#define G_R 3
#define G_BS 16
#define G_B 40
#define G_OUT_TOL 1e-2 /* per (t, h): |out - ref| / max(|ref|, 1e-3) over the row (bf16 P) */
#define G_LSE_TOL 1e-3
#define G_MAX_REPORTS 8

static int g_fail, g_reports;

static void fail(const char *what, int a, int b, double got, double want) {
  g_fail++;
  if (g_reports++ < G_MAX_REPORTS)
    printf("graph_cuda: FAIL %s (%d, %d): got %.6g, want %.6g\n", what, a, b, got, want);
}

static unsigned g_rng;
static unsigned rnd(void) { /* xorshift32 */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 17;
  g_rng ^= g_rng << 5;
  return g_rng;
}
static float urand(void) { return (float)(rnd() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }

#define CU(call)                                                                             \
  do {                                                                                       \
    const cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      printf("graph_cuda: FAIL %s: %s\n", #call, cudaGetErrorString(e_));                    \
      g_fail++;                                                                              \
      goto done;                                                                             \
    }                                                                                        \
  } while (0)
#define SM(call, want)                                                                       \
  do {                                                                                       \
    const smla_status s_ = (call);                                                           \
    if (s_ != (want)) {                                                                      \
      printf("graph_cuda: FAIL %s = %s (want %s): %s\n", #call, smla_status_string(s_),      \
             smla_status_string(want), smla_context_message(gctx));                          \
      g_fail++;                                                                              \
      goto done;                                                                             \
    }                                                                                        \
  } while (0)

/* New slots (some -1, some >= S, some < -1, duplicates allowed) and lengths. */
static void fresh_indices(int32_t *slots, int32_t *lengths) {
  for (int t = 0; t < G_T; t++) {
    for (int k = 0; k < G_K; k++) {
      const unsigned r = rnd() % 100;
      slots[t * G_K + k] = r < 80   ? (int32_t)(rnd() % G_USED)
                           : r < 90 ? -1
                           : r < 95 ? G_SLOTS + (int32_t)(rnd() % 50)
                                    : -2 - (int32_t)(rnd() % 1000);
    }
    const unsigned r = rnd() % 6;
    lengths[t] = r == 0 ? 0 : r == 1 ? G_K + 7 : r == 2 ? -3 : (int32_t)(rnd() % (G_K + 1));
  }
}

/* New request ids, block table and request-local positions (every kind of invalid one),
 * and lengths, for smla_forward_indices. */
static void fresh_fused(int32_t *req, int32_t *bt, int32_t *local, int32_t *lengths) {
  for (int t = 0; t < G_T; t++) {
    const unsigned r = rnd() % 8;
    req[t] = r == 0 ? G_R : r == 1 ? -1 : (int32_t)(rnd() % G_R);
  }
  for (int i = 0; i < G_R * G_B; i++) {
    const unsigned r = rnd() % 100;
    bt[i] = r < 85   ? (int32_t)(rnd() % (G_USED / G_BS))
            : r < 92 ? -1
                     : G_SLOTS / G_BS + (int32_t)(rnd() % 4); /* past the cache: bad */
  }
  for (int t = 0; t < G_T; t++)
    for (int k = 0; k < G_K; k++) {
      const unsigned r = rnd() % 100;
      local[t * G_K + k] = r < 88   ? (int32_t)(rnd() % (G_B * G_BS))
                           : r < 93 ? -1
                           : r < 97 ? G_B * G_BS + (int32_t)(rnd() % 100)
                                    : -2 - (int32_t)(rnd() % 100);
    }
  for (int t = 0; t < G_T; t++) {
    const unsigned r = rnd() % 4;
    lengths[t] = r == 0 ? G_K : (int32_t)(rnd() % (G_K + 1));
  }
}

static void compare(const uint16_t *out, const float *lse, const float *mx, const uint16_t *ro,
                    const float *rl, const float *rm, int replay) {
  for (int t = 0; t < G_T; t++)
    for (int h = 0; h < G_N; h++) {
      const uint16_t *o = out + ((size_t)t * G_N + h) * SMLA_DC;
      const uint16_t *r = ro + ((size_t)t * G_N + h) * SMLA_DC;
      double err = 0.0, ref = 0.0;
      for (int d = 0; d < SMLA_DC; d++) {
        const double a = smla_bf16_to_f32(o[d]), b = smla_bf16_to_f32(r[d]);
        if (isnan(a) != isnan(b)) {
          fail("out NaN mismatch", t, h, a, b);
          break;
        }
        if (isnan(a)) continue;
        err = fmax(err, fabs(a - b));
        ref = fmax(ref, fabs(b));
      }
      if (err > G_OUT_TOL * fmax(ref, 1e-3)) fail("out", replay * 100 + t, h, err, ref);
      const float ls[2] = {lse[t * G_N + h], mx[t * G_N + h]};
      const float rs[2] = {rl[t * G_N + h], rm[t * G_N + h]};
      for (int i = 0; i < 2; i++) {
        const int same_class = (isinf(ls[i]) && isinf(rs[i]) && ls[i] == rs[i]) ||
                               (isnan(ls[i]) && isnan(rs[i]));
        if (same_class) continue;
        if (!isfinite(ls[i]) || !isfinite(rs[i]) ||
            fabs(ls[i] - rs[i]) > G_LSE_TOL * fmax(1.0, fabs(rs[i])))
          fail(i ? "max_logit" : "lse", replay * 100 + t, h, ls[i], rs[i]);
      }
    }
}

static smla_context *gctx; /* for SM()'s message */

/* fused: the captured call is smla_forward_indices, replayed with request ids, block table
 * and positions rewritten in place; the reference is smla_convert_indices then
 * smla_forward on the CPU. splits > 0 forces the plan's KV splits: 10 (of 30 entries) run
 * on an sm_90 device as 2 clusters of 5 a row on the generic kernel, merged by the last
 * cluster to finish, whose counters every replay must leave at zero for the next. */
static void run_format(smla_cache_format format, int fused, int splits) {
  smla_context *gpu = NULL, *cpu = NULL;
  smla_plan *gplan = NULL, *cplan = NULL, *extra = NULL;
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int capturing = 0;
  const size_t row_bytes = smla_cache_row_size(format, G_DR);
  const size_t q_elems = (size_t)G_T * G_N * G_DQK, o_elems = (size_t)G_T * G_N * SMLA_DC;
  uint16_t *h_q = malloc(q_elems * 2), *h_kv = malloc((size_t)G_SLOTS * SMLA_DC * 2);
  uint16_t *h_pe = malloc((size_t)G_SLOTS * G_DR * 2);
  int64_t *h_slot = malloc(G_SLOTS * sizeof(int64_t));
  uint8_t *h_cache = malloc(G_SLOTS * row_bytes);
  int32_t *h_slots = malloc((size_t)G_T * G_K * 4), h_len[G_T];
  int32_t h_req[G_T], h_bt[G_R * G_B], *h_local = malloc((size_t)G_T * G_K * 4);
  uint16_t *h_out = malloc(o_elems * 2), *r_out = malloc(o_elems * 2);
  float h_lse[G_T * G_N], h_max[G_T * G_N], r_lse[G_T * G_N], r_max[G_T * G_N];
  uint64_t h_bad = 0, r_bad = 0;
  void *d_q = NULL, *d_kv = NULL, *d_pe = NULL, *d_slot = NULL, *d_cache = NULL, *d_slots = NULL;
  void *d_len = NULL, *d_out = NULL, *d_lse = NULL, *d_max = NULL, *d_bad = NULL;
  void *d_req = NULL, *d_bt = NULL, *d_local = NULL;
  smla_convert_params ix;
  memset(&ix, 0, sizeof ix);
  if (!h_q || !h_kv || !h_pe || !h_slot || !h_cache || !h_slots || !h_out || !r_out ||
      !h_local) {
    printf("graph_cuda: FAIL out of host memory\n");
    g_fail++;
    goto done;
  }

  SM(smla_context_create(&gpu, 0), SMLA_OK);
  gctx = gpu;
  SM(smla_context_create(&cpu, SMLA_DEVICE_CPU), SMLA_OK);

  /* Inputs: q as one [T][N][576] buffer (q_pe points into it), cache rows written on both
   * backends by smla_cache_write, rows >= G_USED then overwritten with NaN bytes. */
  for (size_t i = 0; i < q_elems; i++) h_q[i] = smla_f32_to_bf16(urand() * 2.0f);
  for (size_t i = 0; i < (size_t)G_SLOTS * SMLA_DC; i++) h_kv[i] = smla_f32_to_bf16(urand());
  for (size_t i = 0; i < (size_t)G_SLOTS * G_DR; i++) h_pe[i] = smla_f32_to_bf16(urand());
  for (int i = 0; i < G_SLOTS; i++) h_slot[i] = i;
  CU(cudaMalloc(&d_q, q_elems * 2));
  CU(cudaMalloc(&d_kv, (size_t)G_SLOTS * SMLA_DC * 2));
  CU(cudaMalloc(&d_pe, (size_t)G_SLOTS * G_DR * 2));
  CU(cudaMalloc(&d_slot, G_SLOTS * sizeof(int64_t)));
  CU(cudaMalloc(&d_cache, G_SLOTS * row_bytes));
  CU(cudaMalloc(&d_slots, (size_t)G_T * G_K * 4));
  CU(cudaMalloc(&d_len, G_T * 4));
  CU(cudaMalloc(&d_out, o_elems * 2));
  CU(cudaMalloc(&d_lse, G_T * G_N * 4));
  CU(cudaMalloc(&d_max, G_T * G_N * 4));
  CU(cudaMalloc(&d_bad, 8));
  CU(cudaMalloc(&d_req, sizeof h_req));
  CU(cudaMalloc(&d_bt, sizeof h_bt));
  CU(cudaMalloc(&d_local, (size_t)G_T * G_K * 4));
  CU(cudaMemcpy(d_q, h_q, q_elems * 2, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(d_kv, h_kv, (size_t)G_SLOTS * SMLA_DC * 2, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(d_pe, h_pe, (size_t)G_SLOTS * G_DR * 2, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(d_slot, h_slot, G_SLOTS * sizeof(int64_t), cudaMemcpyHostToDevice));
  CU(cudaStreamCreate(&stream)); /* a blocking stream, as engines use */

  smla_cache_write_params w;
  memset(&w, 0, sizeof w);
  w.num_tokens = G_SLOTS;
  w.kv_c_stride = SMLA_DC;
  w.k_pe_stride = G_DR;
  w.cache.format = format;
  w.cache.dr = G_DR;
  w.cache.num_slots = G_SLOTS;
  w.cache.row_bytes = (int64_t)row_bytes;
  w.cache.scale = 0.03125f;
  w.kv_c = h_kv, w.k_pe = h_pe, w.slot = h_slot, w.cache.data = h_cache;
  SM(smla_cache_write(cpu, &w, NULL), SMLA_OK);
  w.kv_c = d_kv, w.k_pe = d_pe, w.slot = d_slot, w.cache.data = d_cache;
  SM(smla_cache_write(gpu, &w, stream), SMLA_OK);
  memset(h_cache + (size_t)G_USED * row_bytes, 0xff, (size_t)(G_SLOTS - G_USED) * row_bytes);
  CU(cudaMemsetAsync((uint8_t *)d_cache + (size_t)G_USED * row_bytes, 0xff,
                     (size_t)(G_SLOTS - G_USED) * row_bytes, stream));
  {
    uint8_t *back = malloc(G_SLOTS * row_bytes);
    if (!back) goto done;
    if (cudaMemcpyAsync(back, d_cache, G_SLOTS * row_bytes, cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      free(back);
      printf("graph_cuda: FAIL cache download\n");
      g_fail++;
      goto done;
    }
    if (memcmp(back, h_cache, G_SLOTS * row_bytes) != 0)
      fail("cache bytes differ", format, 0, 0, 0);
    free(back);
  }

  smla_plan_desc d;
  memset(&d, 0, sizeof d);
  d.max_tokens = G_MAX_T;
  d.num_heads = G_N;
  d.topk = G_K;
  d.dr = G_DR;
  d.format = format;
  d.num_splits = splits;
  SM(smla_plan_create(gpu, &d, NULL, 0, &gplan), SMLA_OK);
  SM(smla_plan_create(cpu, &d, NULL, 0, &cplan), SMLA_OK);

  smla_forward_params f;
  memset(&f, 0, sizeof f);
  f.num_tokens = G_T;
  f.num_heads = G_N;
  f.topk = G_K;
  f.q_nope_stride_t = (int64_t)G_N * G_DQK, f.q_nope_stride_h = G_DQK;
  f.q_pe_stride_t = (int64_t)G_N * G_DQK, f.q_pe_stride_h = G_DQK;
  f.cache = w.cache;
  f.slots_stride = G_K;
  f.sm_scale = 1.0f / sqrtf((float)G_DQK);
  f.softcap = 0.0f;
  f.out_stride_t = (int64_t)G_N * SMLA_DC, f.out_stride_h = SMLA_DC;
  f.lse_stride_t = G_N, f.max_logit_stride_t = G_N;
  f.q_nope = d_q, f.q_pe = (uint16_t *)d_q + SMLA_DC;
  f.cache.data = d_cache, f.slots = d_slots, f.lengths = d_len, f.out = d_out, f.lse = d_lse;
  f.max_logit = d_max, f.bad_inputs = d_bad;
  ix.num_tokens = G_T;
  ix.topk = G_K;
  ix.req_id = d_req;
  ix.block_table = d_bt;
  ix.num_requests = G_R;
  ix.blocks_per_request = G_B;
  ix.block_table_stride = G_B;
  ix.block_size = G_BS;
  ix.local = d_local;
  ix.local_stride = G_K;
  if (fused) f.slots = NULL;

  /* Capture: plan creation refused, forward recorded, capture still valid after. */
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  capturing = 1;
  {
    const smla_status s = smla_plan_create(gpu, &d, NULL, 0, &extra);
    if (s != SMLA_ERR_CAPTURING) {
      printf("graph_cuda: FAIL smla_plan_create during capture = %s (want %s)\n",
             smla_status_string(s), smla_status_string(SMLA_ERR_CAPTURING));
      g_fail++;
    }
  }
  if (fused)
    SM(smla_forward_indices(gplan, &f, &ix, stream), SMLA_OK);
  else
    SM(smla_forward(gplan, &f, stream), SMLA_OK);
  capturing = 0;
  CU(cudaStreamEndCapture(stream, &graph));
  CU(cudaGraphInstantiate(&exec, graph, 0));

  for (int rep = 0; rep < G_REPLAYS; rep++) {
    if (fused) {
      fresh_fused(h_req, h_bt, h_local, h_len);
      CU(cudaMemcpyAsync(d_req, h_req, sizeof h_req, cudaMemcpyHostToDevice, stream));
      CU(cudaMemcpyAsync(d_bt, h_bt, sizeof h_bt, cudaMemcpyHostToDevice, stream));
      CU(cudaMemcpyAsync(d_local, h_local, (size_t)G_T * G_K * 4, cudaMemcpyHostToDevice,
                         stream));
      /* the reference slots: the CPU's convert of the same indices */
      smla_convert_params hx = ix;
      hx.req_id = h_req, hx.block_table = h_bt, hx.local = h_local;
      hx.slots = h_slots, hx.slots_stride = G_K;
      gctx = cpu;
      SM(smla_convert_indices(cpu, &hx, NULL), SMLA_OK);
      gctx = gpu;
    } else {
      fresh_indices(h_slots, h_len);
      CU(cudaMemcpyAsync(d_slots, h_slots, (size_t)G_T * G_K * 4, cudaMemcpyHostToDevice,
                         stream));
    }
    h_bad = 0;
    CU(cudaMemcpyAsync(d_len, h_len, G_T * 4, cudaMemcpyHostToDevice, stream));
    CU(cudaMemcpyAsync(d_bad, &h_bad, 8, cudaMemcpyHostToDevice, stream));
    CU(cudaMemsetAsync(d_out, 0xff, o_elems * 2, stream)); /* poison: NaN */
    CU(cudaMemsetAsync(d_lse, 0xff, G_T * G_N * 4, stream));
    CU(cudaMemsetAsync(d_max, 0xff, G_T * G_N * 4, stream));
    CU(cudaGraphLaunch(exec, stream));
    CU(cudaMemcpyAsync(h_out, d_out, o_elems * 2, cudaMemcpyDeviceToHost, stream));
    CU(cudaMemcpyAsync(h_lse, d_lse, sizeof h_lse, cudaMemcpyDeviceToHost, stream));
    CU(cudaMemcpyAsync(h_max, d_max, sizeof h_max, cudaMemcpyDeviceToHost, stream));
    CU(cudaMemcpyAsync(&h_bad, d_bad, 8, cudaMemcpyDeviceToHost, stream));
    CU(cudaStreamSynchronize(stream));

    smla_forward_params c = f;
    c.q_nope = h_q, c.q_pe = h_q + SMLA_DC;
    c.cache.data = h_cache, c.slots = h_slots, c.slots_stride = G_K, c.lengths = h_len;
    c.out = r_out, c.lse = r_lse, c.max_logit = r_max, c.bad_inputs = &r_bad;
    r_bad = 0;
    gctx = cpu;
    SM(smla_forward(cplan, &c, NULL), SMLA_OK);
    gctx = gpu;
    compare(h_out, h_lse, h_max, r_out, r_lse, r_max, rep);
    if (h_bad != r_bad) fail("bad_inputs", rep, format, (double)h_bad, (double)r_bad);
  }

done:
  if (capturing) { /* end a capture left open by a failure */
    cudaGraph_t g = NULL;
    (void)cudaStreamEndCapture(stream, &g);
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  if (exec) (void)cudaGraphExecDestroy(exec);
  if (graph) (void)cudaGraphDestroy(graph);
  if (stream) (void)cudaStreamDestroy(stream);
  smla_plan_destroy(extra);
  smla_plan_destroy(gplan);
  smla_plan_destroy(cplan);
  smla_context_destroy(gpu);
  smla_context_destroy(cpu);
  gctx = NULL;
  void *dev[] = {d_q,   d_kv,  d_pe,  d_slot, d_cache, d_slots, d_len,
                 d_out, d_lse, d_max, d_bad,  d_req,   d_bt,    d_local};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
    if (dev[i]) (void)cudaFree(dev[i]);
  free(h_q), free(h_kv), free(h_pe), free(h_slot), free(h_cache), free(h_slots);
  free(h_out), free(r_out), free(h_local);
}

int smla_test_cuda_graph(uint64_t seed) {
  if (smla_cuda_device_count() == 0) {
    printf("graph_cuda: SKIPPED (no CUDA device)\n");
    return 0;
  }
  g_fail = 0;
  g_reports = 0;
  g_rng = (unsigned)(seed ^ (seed >> 32)) * 2654435761u + 12345u;
  if (!g_rng) g_rng = 1;
  run_format(SMLA_CACHE_BF16, 0, 0);
  run_format(SMLA_CACHE_FP8_DS, 0, 0);
  run_format(SMLA_CACHE_BF16, 1, 0);
  run_format(SMLA_CACHE_FP8_DS, 1, 0);
  run_format(SMLA_CACHE_BF16, 0, 10);
  run_format(SMLA_CACHE_FP8_DS, 1, 10);
  printf("graph_cuda: %s (%d failure%s; smla_forward and smla_forward_indices, bf16 and "
         "fp8-ds, the plan's splits and 10 forced, %d replays each)\n",
         g_fail ? "FAILED" : "ok", g_fail, g_fail == 1 ? "" : "s", G_REPLAYS);
  return g_fail;
}
