/*
 * smla.c: the `smla` command-line tool.
 *
 *   smla info     version, build features, CPU cores, CUDA devices (or why there are none)
 *   smla check    one forward on random data against a double-precision reference here
 *   smla bench    forward timings at DeepSeek-V3.2 shapes (tools/bench.c)
 *
 * Exit codes: 0 ok, 1 failure (an smla call, a check, a resource), 2 bad command line.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: smla <command> [options]\n"
          "  info                 version, build features, CPU cores, CUDA devices\n"
          "  check [options]      forward on random data vs a double-precision reference\n"
          "  bench [options]      forward timings at DeepSeek-V3.2 shapes\n"
          "  version              the library version\n"
          "`smla <command> --help` lists a command's options.\n");
}

/* ======================================================================================
 * smla info
 * ==================================================================================== */
static int cmd_info(void) {
  printf("smla %s (version number %u)\n", smla_version_string(), smla_version());
  printf("build features: %s\n", smla_build_features());
  printf("CPU cores online: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
  const int n = smla_cuda_device_count();
  if (n > 0) {
    printf("CUDA devices: %d\n", n);
    for (int i = 0; i < n; i++) {
      char name[256];
      const smla_status s = smla_cuda_device_name(i, name, sizeof name);
      printf("  %d: %s\n", i, s == SMLA_OK ? name : smla_status_string(s));
    }
    return TOOL_EXIT_OK;
  }
  /* Why none: ask the library for device 0 (it says "no CUDA" or "no device"), and when
   * the tool has CUDA, the runtime's own reason. */
  smla_context *ctx = NULL;
  const smla_status s = smla_context_create(&ctx, 0);
  smla_context_destroy(ctx);
  printf("CUDA devices: none (%s",
         s == SMLA_OK ? "count 0 but device 0 opened" : smla_status_string(s));
#ifdef SMLA_HAVE_CUDA
  char why[256] = "";
  tool_cuda_device_count(why, sizeof why);
  if (why[0]) printf("; CUDA runtime: %s", why);
#endif
  printf(")\n");
  return TOOL_EXIT_OK;
}

/* ======================================================================================
 * smla check: the reference below is written from the SPEC alone, in double precision,
 * and reads the cache bytes that smla_cache_write produced (decoding them itself).
 * ==================================================================================== */
#define CHECK_OUT_ATOL 2e-3 /* bf16 output: |got - ref| <= 2e-3 + 1e-2 * |ref| */
#define CHECK_OUT_RTOL 1e-2
#define CHECK_LSE_ATOL 1e-3 /* float lse from float logits of exact bf16/fp8 products */
#define CHECK_LSE_RTOL 1e-4
#define CHECK_Q_AMP 4.0f    /* q in +-[1/16, 4): logits of std ~1.3, a peaked softmax */
#define CHECK_MASK_ONE_IN 16 /* about 1 entry in 16 is -1 (masked) */
#define CHECK_WRITE_PAD 7    /* padding rows (slot -1) mixed into the cache write */
#define CHECK_SHOW 5         /* mismatches printed */

typedef struct check_opts {
  int device, dr, topk, heads;
  int64_t tokens, slots;
  smla_cache_format format;
  uint64_t seed;
} check_opts;

static double ref_bf16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* OCP E4M3FN: bias 7, no infinities, S.1111.111 = NaN. */
static double ref_e4m3(uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) v = ldexp(m, -9);
  else v = ldexp(8 + m, e - 10); /* (1 + m/8) * 2^(e-7) */
  return sign ? -v : v;
}

static double ref_f32(const uint8_t *p) {
  float f;
  memcpy(&f, p, 4);
  return f;
}

/* Decodes one cache row into ckv[Dc] and kpe[Dr], straight from the SPEC's table. */
static void ref_decode_row(const smla_cache *c, const uint8_t *row, double *ckv, double *kpe) {
  switch (c->format) {
  case SMLA_CACHE_BF16:
    for (int i = 0; i < SMLA_DC; i++) ckv[i] = ref_bf16(row + 2 * i);
    for (int i = 0; i < c->dr; i++) kpe[i] = ref_bf16(row + 2 * (SMLA_DC + i));
    break;
  case SMLA_CACHE_FP8_TENSOR:
    for (int i = 0; i < SMLA_DC; i++) ckv[i] = ref_e4m3(row[i]) * c->scale;
    for (int i = 0; i < c->dr; i++) kpe[i] = ref_e4m3(row[SMLA_DC + i]) * c->scale;
    break;
  case SMLA_CACHE_FP8_DS:
    for (int i = 0; i < SMLA_DC; i++)
      ckv[i] = ref_e4m3(row[i]) * ref_f32(row + SMLA_DC + 4 * (i / 128));
    for (int i = 0; i < c->dr; i++) kpe[i] = ref_bf16(row + SMLA_DC + 16 + 2 * i);
    break;
  }
}

static void check_usage(FILE *f) {
  fprintf(f,
          "usage: smla check [--device cpu|N] [-T 4] [-N 16] [-K 2048] [--dr 0|64]\n"
          "                  [--format bf16|fp8_tensor|fp8_ds] [--slots 4096] [--seed 1]\n"
          "  Builds a random cache with smla_cache_write (unreferenced rows NaN), runs\n"
          "  smla_forward with lse, and compares both with a double-precision reference\n"
          "  that decodes the written rows. Default device: GPU 0 if there is one.\n");
}

static int check_parse(int argc, char **argv, check_opts *o) {
  int device_given = 0, slots_given = 0;
  memset(o, 0, sizeof *o);
  o->tokens = 4;
  o->heads = 16;
  o->topk = 2048;
  o->dr = 64;
  o->format = SMLA_CACHE_BF16;
  o->slots = 4096;
  o->seed = 1;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long x = 0;
    int bad = 0;
    const char *want = ""; /* the valid values, for the message */
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      check_usage(stdout);
      exit(TOOL_EXIT_OK);
    }
    if (!v) {
      fprintf(stderr, "smla check: %s needs a value\n", a);
      return -1;
    }
    if (strcmp(a, "--device") == 0) {
      want = "cpu or a CUDA device ordinal 0..1023";
      bad = tool_parse_device(v, &o->device);
      device_given = 1;
    } else if (strcmp(a, "-T") == 0) {
      want = "an integer 0..65536";
      if (!(bad = tool_parse_int(v, 0, 1 << 16, &x))) o->tokens = x;
    } else if (strcmp(a, "-N") == 0) {
      want = "an integer 1..128";
      if (!(bad = tool_parse_int(v, 1, SMLA_MAX_HEADS, &x))) o->heads = (int)x;
    } else if (strcmp(a, "-K") == 0) {
      want = "an integer 1..1048576";
      if (!(bad = tool_parse_int(v, 1, 1 << 20, &x))) o->topk = (int)x;
    } else if (strcmp(a, "--dr") == 0) {
      want = "64 or 0";
      if (!(bad = tool_parse_int(v, 0, 64, &x) || (x != 0 && x != 64))) o->dr = (int)x;
    } else if (strcmp(a, "--format") == 0) {
      want = "bf16, fp8_tensor or fp8_ds";
      bad = tool_parse_format(v, &o->format);
    } else if (strcmp(a, "--slots") == 0) {
      want = "an integer 1..16777216";
      if (!(bad = tool_parse_int(v, 1, 1 << 24, &x))) o->slots = x;
      slots_given = 1;
    } else if (strcmp(a, "--seed") == 0) {
      want = "an integer 0..2^63-1";
      if (!(bad = tool_parse_int(v, 0, INT64_MAX, &x))) o->seed = (uint64_t)x;
    } else {
      fprintf(stderr, "smla check: unknown option %s\n", a);
      return -1;
    }
    if (bad) {
      fprintf(stderr, "smla check: bad value for %s: %s (want %s)\n", a, v, want);
      return -1;
    }
  }
  if (!device_given) o->device = smla_cuda_device_count() > 0 ? 0 : SMLA_DEVICE_CPU;
  if (!slots_given && o->slots < 2 * (int64_t)o->topk) o->slots = 2 * (int64_t)o->topk;
  if (o->topk > o->slots) {
    fprintf(stderr, "smla check: -K %d is more than --slots %lld (slots are distinct per row)\n",
            o->topk, (long long)o->slots);
    return -1;
  }
  return 0;
}

/* Error tracking for one compared quantity. */
typedef struct check_err {
  double max_abs, max_rel, worst_ratio; /* ratio = err / tol; > 1 fails */
  int64_t bad, shown;
} check_err;

static void check_compare(check_err *e, const char *what, int64_t t, int h, int i, double got,
                          double ref, double atol, double rtol) {
  const int both_nan = isnan(got) && isnan(ref);
  const int both_inf = isinf(got) && isinf(ref) && (got > 0) == (ref > 0);
  double err = 0, tol = atol + rtol * fabs(ref);
  if (!both_nan && !both_inf) err = fabs(got - ref);
  if (isnan(err)) err = INFINITY;
  if (err > e->max_abs) e->max_abs = err;
  if (fabs(ref) >= 1e-2 && err / fabs(ref) > e->max_rel) e->max_rel = err / fabs(ref);
  if (err / tol > e->worst_ratio) e->worst_ratio = err / tol;
  if (err > tol) {
    if (e->shown++ < CHECK_SHOW)
      printf("  mismatch %s[t=%lld][h=%d][%d]: got %.6g, ref %.6g (tol %.3g)\n", what,
             (long long)t, h, i, got, ref, tol);
    e->bad++;
  }
}

/* The SPEC's FP8_DS group scale, 2^ceil(log2(max(amax/448, 1e-4))), in double. */
static double ref_ds_scale(double amax) {
  double x = amax / 448.0;
  if (!(x >= 1e-4)) x = 1e-4;
  int e;
  const double f = frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
  return ldexp(1.0, f == 0.5 ? e - 1 : e);
}

/* Host-side inputs of one check. */
typedef struct check_data {
  int64_t rows;       /* W: rows given to smla_cache_write (S slots + padding rows) */
  uint16_t *kv, *pe;  /* [W][Dc], [W][Dr] bf16 */
  int64_t *wslot;     /* [W] destination slot, -1 for padding */
  uint8_t *used;      /* [S] 1 where some query row uses the slot */
  int32_t *slots;     /* [T][K] forward slots */
  uint16_t *q;        /* [T][N][Dqk] bf16 (q_pe after the Dc latent of each head) */
  uint8_t *cache;     /* [S][row_bytes] the cache as written, downloaded */
} check_data;

/* Slots: K distinct per row, then about 1 in 16 masked to -1. Write rows: every slot once
 * in a shuffled order with padding rows (slot -1) among them; rows that no query uses
 * are NaN, so a forward that read one would show it. */
static int check_make_inputs(const check_opts *o, tool_rng *rng, check_data *c) {
  const int64_t T = o->tokens, S = o->slots, W = c->rows;
  const int K = o->topk, dr = o->dr;
  const uint16_t nan_bf16 = 0x7fc0;
  tool_sampler slot_rows = {0}, order = {0};
  int32_t *perm = malloc((size_t)S * sizeof *perm);
  int rc = -1;
  if (!perm || tool_sampler_init(&slot_rows, S) || tool_sampler_init(&order, S)) goto done;
  for (int64_t t = 0; t < T; t++) {
    int32_t *row = c->slots + t * K;
    tool_sampler_draw(&slot_rows, rng, row, K);
    for (int k = 0; k < K; k++) {
      if (tool_rng_below(rng, CHECK_MASK_ONE_IN) == 0) row[k] = -1;
      else c->used[row[k]] = 1;
    }
  }
  tool_sampler_draw(&order, rng, perm, (int)S);
  int64_t next = 0, pads_left = W - S;
  for (int64_t w = 0; w < W; w++) {
    uint16_t *kr = c->kv + w * SMLA_DC, *pr = c->pe + w * dr;
    /* a padding row with probability pads_left / rows left: pads spread evenly */
    const int pad = pads_left > 0 && tool_rng_below(rng, (uint64_t)(W - w)) < (uint64_t)pads_left;
    const int32_t s = pad ? -1 : perm[next++];
    pads_left -= pad;
    c->wslot[w] = s;
    if (s < 0 || c->used[s]) {
      tool_fill_bf16(rng, kr, SMLA_DC, 1.0f);
      tool_fill_bf16(rng, pr, (size_t)dr, 1.0f);
    } else {
      for (int i = 0; i < SMLA_DC; i++) kr[i] = nan_bf16;
      for (int i = 0; i < dr; i++) pr[i] = nan_bf16;
    }
  }
  tool_fill_bf16(rng, c->q, (size_t)T * o->heads * (SMLA_DC + dr), CHECK_Q_AMP);
  rc = 0;
done:
  if (rc) fprintf(stderr, "smla: out of host memory\n");
  free(perm);
  tool_sampler_free(&slot_rows);
  tool_sampler_free(&order);
  return rc;
}

/* The writer, on the used rows: bf16 exact; fp8 within half an e4m3 step (2^-4 relative)
 * plus half the smallest subnormal step (2^-10 of the scale); FP8_DS group scales equal
 * to the SPEC's formula. Returns the number of rows checked. */
static int64_t check_writer(const check_opts *o, const smla_cache *cache, const check_data *c,
                            check_err *e) {
  const int dr = o->dr;
  const size_t row_bytes = (size_t)cache->row_bytes;
  int64_t checked = 0;
  for (int64_t w = 0; w < c->rows; w++) {
    const int64_t s = c->wslot[w];
    if (s < 0 || !c->used[s]) continue;
    const uint8_t *row = c->cache + (size_t)s * row_bytes;
    double ckv[SMLA_DC], kpe[64], in[SMLA_DC + 64];
    ref_decode_row(cache, row, ckv, kpe);
    for (int i = 0; i < SMLA_DC; i++) in[i] = ref_bf16((const uint8_t *)(c->kv + w * SMLA_DC + i));
    for (int i = 0; i < dr; i++) in[SMLA_DC + i] = ref_bf16((const uint8_t *)(c->pe + w * dr + i));
    for (int i = 0; i < SMLA_DC + dr; i++) {
      const double got = i < SMLA_DC ? ckv[i] : kpe[i - SMLA_DC];
      double atol = 1e-300, rtol = 0; /* bf16 values: exact */
      if (o->format == SMLA_CACHE_FP8_TENSOR) {
        atol = ldexp(cache->scale, -10);
        rtol = 0x1p-4;
      } else if (o->format == SMLA_CACHE_FP8_DS && i < SMLA_DC) {
        atol = ldexp(ref_f32(row + SMLA_DC + 4 * (i / 128)), -10);
        rtol = 0x1p-4;
      }
      check_compare(e, "cache", s, 0, i, got, in[i], atol, rtol);
    }
    if (o->format == SMLA_CACHE_FP8_DS)
      for (int g = 0; g < SMLA_DC / 128; g++) {
        double amax = 0;
        for (int i = g * 128; i < (g + 1) * 128; i++) amax = fmax(amax, fabs(in[i]));
        check_compare(e, "ds_scale", s, 0, g, ref_f32(row + SMLA_DC + 4 * g), ref_ds_scale(amax),
                      1e-300, 0);
      }
    checked++;
  }
  return checked;
}

/* The forward, from the SPEC: for each (t, h), logits over the used entries (decoded from
 * the written rows), softmax, PV. */
static void check_forward(const check_opts *o, const smla_cache *cache, const check_data *c,
                          float sm_scale, const uint16_t *out, const float *lse, check_err *oe,
                          check_err *le) {
  const int64_t T = o->tokens, S = o->slots;
  const int N = o->heads, K = o->topk, dr = o->dr, dqk = SMLA_DC + dr;
  double *ckv = malloc((size_t)K * SMLA_DC * sizeof *ckv);
  double *kpe = malloc((size_t)K * 64 * sizeof *kpe);
  double *w = malloc((size_t)K * sizeof *w), q[SMLA_DC + 64];
  if (!ckv || !kpe || !w) {
    fprintf(stderr, "smla: out of host memory\n");
    oe->bad++;
    goto done;
  }
  for (int64_t t = 0; t < T; t++) {
    const int32_t *row = c->slots + t * K;
    int n = 0;
    for (int k = 0; k < K; k++)
      if (row[k] >= 0 && row[k] < S) {
        ref_decode_row(cache, c->cache + (size_t)row[k] * (size_t)cache->row_bytes,
                       ckv + (size_t)n * SMLA_DC, kpe + (size_t)n * 64);
        n++;
      }
    for (int h = 0; h < N; h++) {
      const uint16_t *qh = c->q + ((size_t)t * N + h) * dqk;
      for (int j = 0; j < dqk; j++) q[j] = ref_bf16((const uint8_t *)(qh + j));
      double m = -INFINITY, z = 0;
      for (int i = 0; i < n; i++) {
        double dot = 0;
        for (int j = 0; j < SMLA_DC; j++) dot += q[j] * ckv[(size_t)i * SMLA_DC + j];
        for (int j = 0; j < dr; j++) dot += q[SMLA_DC + j] * kpe[(size_t)i * 64 + j];
        w[i] = (double)sm_scale * dot;
        m = fmax(m, w[i]);
      }
      for (int i = 0; i < n; i++) z += (w[i] = exp(w[i] - m));
      for (int j = 0; j < SMLA_DC; j++) {
        double acc = 0;
        for (int i = 0; i < n; i++) acc += w[i] * ckv[(size_t)i * SMLA_DC + j];
        const double got = ref_bf16((const uint8_t *)(out + ((size_t)t * N + h) * SMLA_DC + j));
        check_compare(oe, "out", t, h, j, got, n ? acc / z : 0.0, CHECK_OUT_ATOL, CHECK_OUT_RTOL);
      }
      check_compare(le, "lse", t, h, 0, lse[t * N + h], n ? m + log(z) : -INFINITY,
                    CHECK_LSE_ATOL, CHECK_LSE_RTOL);
    }
  }
done:
  free(ckv);
  free(kpe);
  free(w);
}

static int cmd_check(int argc, char **argv) {
  check_opts o;
  if (check_parse(argc, argv, &o)) {
    check_usage(stderr);
    return TOOL_EXIT_USAGE;
  }
  const int64_t T = o.tokens, S = o.slots, T1 = T ? T : 1;
  const int N = o.heads, K = o.topk, dr = o.dr, dqk = SMLA_DC + dr;
  const size_t row_bytes = smla_cache_row_size(o.format, dr);
  const size_t q_bytes = (size_t)T1 * N * dqk * 2, out_bytes = (size_t)T1 * N * SMLA_DC * 2;
  const size_t lse_bytes = (size_t)T1 * N * sizeof(float), slots_bytes = (size_t)T1 * K * 4;
  tool_device d;
  if (tool_device_open(&d, o.device)) return TOOL_EXIT_FAIL;
  int rc = TOOL_EXIT_FAIL;
  tool_rng rng;
  tool_rng_seed(&rng, o.seed);

  check_data c = {0};
  c.rows = S + CHECK_WRITE_PAD;
  c.kv = malloc((size_t)c.rows * SMLA_DC * 2);
  c.pe = malloc((size_t)c.rows * (dr ? dr : 1) * 2);
  c.wslot = malloc((size_t)c.rows * sizeof *c.wslot);
  c.used = calloc((size_t)S, 1);
  c.slots = malloc(slots_bytes);
  c.q = malloc(q_bytes);
  c.cache = malloc((size_t)S * row_bytes);
  uint16_t *h_out = malloc(out_bytes);
  float *h_lse = malloc(lse_bytes);
  void *d_cache = NULL, *d_q = NULL, *d_slots = NULL, *d_out = NULL, *d_lse = NULL, *d_bad = NULL;
  smla_plan *plan = NULL;
  if (!c.kv || !c.pe || !c.wslot || !c.used || !c.slots || !c.q || !c.cache || !h_out || !h_lse) {
    fprintf(stderr, "smla: out of host memory\n");
    goto done;
  }
  printf("smla check: %s, T %lld, N %d, K %d, Dr %d, format %s (%zu B/row), %lld slots, "
         "seed %llu\n",
         o.device >= 0 ? "GPU" : "CPU", (long long)T, N, K, dr, tool_format_name(o.format),
         row_bytes, (long long)S, (unsigned long long)o.seed);
  if (o.device >= 0) {
    char name[256];
    if (smla_cuda_device_name(o.device, name, sizeof name) == SMLA_OK)
      printf("device: %d: %s\n", o.device, name);
  }
  if (check_make_inputs(&o, &rng, &c)) goto done;

  smla_cache cache = {0};
  cache.format = o.format;
  cache.dr = dr;
  cache.num_slots = S;
  cache.row_bytes = (int64_t)row_bytes;
  cache.scale = 1.0f / 448.0f; /* FP8_TENSOR: inputs in +-1 use the whole e4m3 range */
  cache.data = d_cache = tool_alloc(&d, (size_t)S * row_bytes);
  if (!d_cache || tool_write_rows(&d, &cache, c.kv, dr ? c.pe : NULL, c.wslot, c.rows) ||
      tool_download(&d, c.cache, d_cache, (size_t)S * row_bytes))
    goto done;

  d_q = tool_alloc(&d, q_bytes);
  d_slots = tool_alloc(&d, slots_bytes);
  d_out = tool_alloc(&d, out_bytes);
  d_lse = tool_alloc(&d, lse_bytes);
  d_bad = tool_alloc(&d, sizeof(uint64_t));
  if (!d_q || !d_slots || !d_out || !d_lse || !d_bad || tool_upload(&d, d_q, c.q, q_bytes) ||
      tool_upload(&d, d_slots, c.slots, slots_bytes) ||
      tool_memset(&d, d_out, 0xff, out_bytes) || /* poisoned: NaN until written */
      tool_memset(&d, d_lse, 0xff, lse_bytes) || tool_memset(&d, d_bad, 0, sizeof(uint64_t)))
    goto done;

  if (tool_plan(&d, T1, N, K, dr, o.format, 0, 0, 0, &plan)) goto done;
  printf("plan: %s\n", smla_plan_describe(plan));
  smla_forward_params p;
  tool_forward_params(&p, T, N, K, &cache, d_q, d_slots, d_out, d_lse, d_bad);
  smla_status st = smla_forward(plan, &p, d.stream);
  if (st != SMLA_OK) {
    tool_report(&d, "smla_forward", st);
    goto done;
  }
  uint64_t bad = 0;
  if (tool_sync(&d) || tool_download(&d, h_out, d_out, out_bytes) ||
      tool_download(&d, h_lse, d_lse, lse_bytes) || tool_download(&d, &bad, d_bad, sizeof bad))
    goto done;

  check_err werr = {0}, oerr = {0}, lerr = {0};
  const int64_t checked = check_writer(&o, &cache, &c, &werr);
  check_forward(&o, &cache, &c, p.sm_scale, h_out, h_lse, &oerr, &lerr);
  const int pass = !werr.bad && !oerr.bad && !lerr.bad && bad == 0;
  printf("cache_write: %lld used rows decoded, max abs err %.3g (%s): %lld bad\n",
         (long long)checked, werr.max_abs,
         o.format == SMLA_CACHE_BF16 ? "bf16: exact" : "fp8: half a step; ds scales exact",
         (long long)werr.bad);
  printf("out: max abs err %.3g, max rel err %.3g (where |ref| >= 1e-2), worst err/tol %.3g; "
         "tol %.0e + %.0e*|ref|: %lld bad of %lld\n",
         oerr.max_abs, oerr.max_rel, oerr.worst_ratio, CHECK_OUT_ATOL, CHECK_OUT_RTOL,
         (long long)oerr.bad, (long long)T * N * SMLA_DC);
  printf("lse: max abs err %.3g, worst err/tol %.3g; tol %.0e + %.0e*|ref|: %lld bad of %lld\n",
         lerr.max_abs, lerr.worst_ratio, CHECK_LSE_ATOL, CHECK_LSE_RTOL, (long long)lerr.bad,
         (long long)T * N);
  printf("bad_inputs: %llu (expected 0)\n", (unsigned long long)bad);
  printf("%s\n", pass ? "PASS" : "FAIL");
  rc = pass ? TOOL_EXIT_OK : TOOL_EXIT_FAIL;
done:
  smla_plan_destroy(plan);
  tool_free(&d, d_cache);
  tool_free(&d, d_q);
  tool_free(&d, d_slots);
  tool_free(&d, d_out);
  tool_free(&d, d_lse);
  tool_free(&d, d_bad);
  free(c.kv);
  free(c.pe);
  free(c.wslot);
  free(c.used);
  free(c.slots);
  free(c.q);
  free(c.cache);
  free(h_out);
  free(h_lse);
  tool_device_close(&d);
  return rc;
}

/* ======================================================================================
 * main
 * ==================================================================================== */
int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return TOOL_EXIT_USAGE;
  }
  /* The command line, for the bench record. */
  size_t len = 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *command_line = malloc(len);
  if (!command_line) return TOOL_EXIT_FAIL;
  command_line[0] = 0;
  for (int i = 0; i < argc; i++) {
    if (i) strcat(command_line, " ");
    strcat(command_line, argv[i]);
  }
  const char *cmd = argv[1];
  int rc;
  if (strcmp(cmd, "info") == 0) rc = cmd_info();
  else if (strcmp(cmd, "check") == 0) rc = cmd_check(argc - 1, argv + 1);
  else if (strcmp(cmd, "bench") == 0) rc = tool_bench_main(argc - 1, argv + 1, command_line);
  else if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("smla %s\n", smla_version_string());
    rc = TOOL_EXIT_OK;
  } else if (strcmp(cmd, "help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
    usage(stdout);
    rc = TOOL_EXIT_OK;
  } else {
    fprintf(stderr, "smla: unknown command '%s'\n", cmd);
    usage(stderr);
    rc = TOOL_EXIT_USAGE;
  }
  free(command_line);
  return rc;
}
