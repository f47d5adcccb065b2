/* stress_cuda.c: see stress_cuda.h. */
#include "stress_cuda.h"

#include "smla.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_SLOTS 8192
#define S_T 48
#define S_K 1024
#define S_DQK 576
#define S_ROW 1152
#define S_MAX_N 128
#define S_TIMED 20

static int s_fail;

#define FAILF(...)                                                                           \
  do {                                                                                       \
    s_fail++;                                                                                \
    printf("stress_cuda: FAIL " __VA_ARGS__);                                                \
    printf("\n");                                                                            \
  } while (0)

static uint64_t s_rng;
static uint32_t rnd(void) { /* splitmix64, top bits */
  uint64_t z = (s_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}
/* A bf16 in about [-1, 1): random sign, exponent 2^-4..2^0, mantissa. */
static uint16_t rbf16(void) {
  const uint32_t r = rnd();
  return (uint16_t)(((r & 1u) << 15) | ((123u + (r >> 1) % 4u) << 7) | ((r >> 8) & 0x7fu));
}

/* Device inputs shared by every check. */
typedef struct {
  void *cache;     /* [S_SLOTS][S_ROW] bf16 rows */
  void *q;         /* [S_T][S_MAX_N][576] */
  int32_t *slots;  /* [S_T][S_K] */
  float scale;
} inputs;

typedef struct {
  uint16_t *out;   /* [T][N][512] device */
  float *lse;      /* [T][N] device */
} outputs;

static smla_forward_params params(const inputs *in, int N, int64_t row0, int64_t T,
                                  const outputs *o) {
  smla_forward_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = T;
  p.num_heads = N;
  p.topk = S_K;
  p.q_nope = (const uint16_t *)in->q + row0 * S_MAX_N * S_DQK;
  p.q_nope_stride_t = S_MAX_N * S_DQK;
  p.q_nope_stride_h = S_DQK;
  p.q_pe = (const uint16_t *)p.q_nope + 512;
  p.q_pe_stride_t = p.q_nope_stride_t;
  p.q_pe_stride_h = S_DQK;
  p.cache.format = SMLA_CACHE_BF16;
  p.cache.dr = 64;
  p.cache.num_slots = S_SLOTS;
  p.cache.row_bytes = S_ROW;
  p.cache.data = in->cache;
  p.slots = in->slots + row0 * S_K;
  p.slots_stride = S_K;
  p.sm_scale = in->scale;
  p.out = o->out;
  p.out_stride_t = (int64_t)N * 512;
  p.out_stride_h = 512;
  p.lse = o->lse;
  p.lse_stride_t = N;
  return p;
}

static int alloc_out(outputs *o, int64_t T, int N) {
  o->out = NULL;
  o->lse = NULL;
  if (cudaMalloc((void **)&o->out, (size_t)T * N * 512 * 2) != cudaSuccess) return -1;
  if (cudaMalloc((void **)&o->lse, (size_t)T * N * 4) != cudaSuccess) return -1;
  cudaMemset(o->out, 0xff, (size_t)T * N * 512 * 2);
  cudaMemset(o->lse, 0xff, (size_t)T * N * 4);
  return 0;
}
static void free_out(outputs *o) {
  cudaFree(o->out);
  cudaFree(o->lse);
}

/* Host copies of out and lse, rows [0, T). */
typedef struct {
  uint16_t *out;
  float *lse;
} host_out;

static int fetch(host_out *h, const outputs *o, int64_t T, int N) {
  h->out = malloc((size_t)T * N * 512 * 2);
  h->lse = malloc((size_t)T * N * 4);
  if (!h->out || !h->lse) return -1;
  if (cudaMemcpy(h->out, o->out, (size_t)T * N * 512 * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(h->lse, o->lse, (size_t)T * N * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return -1;
  return 0;
}
static void free_host(host_out *h) {
  free(h->out);
  free(h->lse);
}

/* Rows [0, T) of a equal rows [row0, row0 + T) of b, bitwise. */
static int same_rows(const host_out *a, const host_out *b, int64_t row0, int64_t T, int N) {
  return !memcmp(a->out, b->out + row0 * N * 512, (size_t)T * N * 512 * 2) &&
         !memcmp(a->lse, b->lse + row0 * N, (size_t)T * N * 4);
}

static int run(smla_plan *plan, const smla_forward_params *p, cudaStream_t st) {
  const smla_status s = smla_forward(plan, p, st);
  if (s != SMLA_OK) {
    FAILF("smla_forward: %s", smla_status_string(s));
    return -1;
  }
  return 0;
}

/* Under compute-sanitizer (scripts/sanitize_gpu.sh sets SMLA_TEST_UNDER_SANITIZER=1) a
   timing means nothing and each launch costs seconds: one timed forward, no warm-up. */
static int under_sanitizer(void) {
  const char *e = getenv("SMLA_TEST_UNDER_SANITIZER");
  return e && *e && strcmp(e, "0");
}

/* Median µs of S_TIMED forwards (events around each). */
static double time_us(smla_plan *plan, const smla_forward_params *p) {
  cudaEvent_t a, b;
  float ms[S_TIMED];
  const int timed = under_sanitizer() ? 1 : S_TIMED;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < (timed > 1 ? 3 : 0); i++) smla_forward(plan, p, NULL);
  for (int i = 0; i < timed; i++) {
    cudaEventRecord(a, NULL);
    smla_forward(plan, p, NULL);
    cudaEventRecord(b, NULL);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[i], a, b);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  for (int i = 1; i < timed; i++) /* insertion sort */
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      const float t = ms[j];
      ms[j] = ms[j - 1];
      ms[j - 1] = t;
    }
  return 1e3 * ms[timed / 2];
}

static void check_determinism(smla_context *ctx, const inputs *in) {
  const int N = 64;
  smla_plan_desc d = {.max_tokens = S_T, .num_heads = N, .topk = S_K, .dr = 64,
                      .format = SMLA_CACHE_BF16};
  smla_plan *plan = NULL;
  outputs o1, o2;
  host_out h1 = {0}, h2 = {0};
  if (smla_plan_create(ctx, &d, NULL, 0, &plan) != SMLA_OK || alloc_out(&o1, S_T, N) ||
      alloc_out(&o2, S_T, N)) {
    FAILF("determinism: setup: %s", smla_context_message(ctx));
    goto done;
  }
  smla_forward_params p1 = params(in, N, 0, S_T, &o1), p2 = params(in, N, 0, S_T, &o2);
  if (run(plan, &p1, NULL) || run(plan, &p2, NULL)) goto done;
  if (fetch(&h1, &o1, S_T, N) || fetch(&h2, &o2, S_T, N)) {
    FAILF("determinism: download");
    goto done;
  }
  if (!same_rows(&h1, &h2, 0, S_T, N)) FAILF("determinism: two runs of one plan differ");
  printf("stress_cuda: determinism (T %d, N %d, %s): %s\n", S_T, N, smla_plan_describe(plan),
         s_fail ? "differs" : "bitwise identical");
done:
  free_host(&h1);
  free_host(&h2);
  free_out(&o1);
  free_out(&o2);
  smla_plan_destroy(plan);
}

static void check_batch_invariance(smla_context *ctx, const inputs *in) {
  const int N = 16;
  smla_plan_desc d = {.max_tokens = S_T, .num_heads = N, .topk = S_K, .dr = 64,
                      .format = SMLA_CACHE_BF16, .flags = SMLA_PLAN_BATCH_INVARIANT};
  smla_plan_desc d0 = d;
  d0.flags = 0;
  smla_plan *plan = NULL, *plan0 = NULL;
  outputs full, part;
  host_out hf = {0}, hp = {0};
  if (smla_plan_create(ctx, &d, NULL, 0, &plan) != SMLA_OK ||
      smla_plan_create(ctx, &d0, NULL, 0, &plan0) != SMLA_OK || alloc_out(&full, S_T, N) ||
      alloc_out(&part, S_T, N)) {
    FAILF("batch invariance: setup: %s", smla_context_message(ctx));
    goto done;
  }
  smla_forward_params pf = params(in, N, 0, S_T, &full);
  if (run(plan, &pf, NULL) || fetch(&hf, &full, S_T, N)) goto done;
  const int64_t subsets[][2] = {{17, 1}, {0, 1}, {40, 5}, {3, 8}, {S_T - 1, 1}};
  for (size_t i = 0; i < sizeof subsets / sizeof subsets[0]; i++) {
    const int64_t row0 = subsets[i][0], T = subsets[i][1];
    smla_forward_params pp = params(in, N, row0, T, &part);
    if (run(plan, &pp, NULL) || fetch(&hp, &part, T, N)) goto done;
    if (!same_rows(&hp, &hf, row0, T, N))
      FAILF("batch invariance: rows %lld..%lld alone differ from the T = %d batch",
            (long long)row0, (long long)(row0 + T - 1), S_T);
    free_host(&hp);
    hp.out = NULL;
    hp.lse = NULL;
  }
  printf("stress_cuda: batch-invariant plan: %s\n", smla_plan_describe(plan));
  printf("stress_cuda: batch-invariant cost (N %d, K %d, bf16; median of %d, events%s):\n", N,
         S_K, under_sanitizer() ? 1 : S_TIMED,
         under_sanitizer() ? "; under compute-sanitizer: not a timing" : "");
  const int64_t Ts[] = {1, 8, S_T};
  for (int i = 0; i < 3; i++) {
    smla_forward_params pt = params(in, N, 0, Ts[i], &full);
    const double inv = time_us(plan, &pt), def = time_us(plan0, &pt);
    printf("stress_cuda:   T %3lld: default %8.1f us, batch-invariant %8.1f us (%+.0f%%)\n",
           (long long)Ts[i], def, inv, 100.0 * (inv - def) / def);
  }
done:
  free_host(&hf);
  free_host(&hp);
  free_out(&full);
  free_out(&part);
  smla_plan_destroy(plan);
  smla_plan_destroy(plan0);
}

/* ---- concurrency ----------------------------------------------------------------------- */
#define S_WORKERS 3
#define S_ROUNDS 5

typedef struct {
  const inputs *in;
  int N;
  smla_context *ctx;
  smla_plan *plan;
  cudaStream_t stream;
  outputs o;
  host_out alone;
  int mismatches, errors;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  smla_forward_params p = params(w->in, w->N, 0, S_T, &w->o);
  for (int r = 0; r < S_ROUNDS; r++) {
    cudaMemsetAsync(w->o.out, 0xff, (size_t)S_T * w->N * 512 * 2, w->stream);
    if (smla_forward(w->plan, &p, w->stream) != SMLA_OK) {
      w->errors++;
      continue;
    }
    host_out h = {0};
    cudaStreamSynchronize(w->stream);
    if (fetch(&h, &w->o, S_T, w->N) || !same_rows(&h, &w->alone, 0, S_T, w->N)) w->mismatches++;
    free_host(&h);
  }
  return NULL;
}

static void check_concurrency(const inputs *in) {
  worker w[S_WORKERS];
  const int heads[S_WORKERS] = {16, 64, 128};
  memset(w, 0, sizeof w);
  int ok = 1;
  for (int i = 0; i < S_WORKERS && ok; i++) {
    w[i].in = in;
    w[i].N = heads[i];
    smla_plan_desc d = {.max_tokens = S_T, .num_heads = heads[i], .topk = S_K, .dr = 64,
                        .format = SMLA_CACHE_BF16};
    ok = smla_context_create(&w[i].ctx, 0) == SMLA_OK &&
         smla_plan_create(w[i].ctx, &d, NULL, 0, &w[i].plan) == SMLA_OK &&
         cudaStreamCreateWithFlags(&w[i].stream, cudaStreamNonBlocking) == cudaSuccess &&
         !alloc_out(&w[i].o, S_T, heads[i]);
    if (ok) { /* alone first */
      smla_forward_params p = params(in, heads[i], 0, S_T, &w[i].o);
      ok = smla_forward(w[i].plan, &p, w[i].stream) == SMLA_OK &&
           cudaStreamSynchronize(w[i].stream) == cudaSuccess &&
           !fetch(&w[i].alone, &w[i].o, S_T, heads[i]);
    }
  }
  if (!ok) {
    FAILF("concurrency: setup failed");
  } else {
    pthread_t tid[S_WORKERS];
    int started = 0;
    for (int i = 0; i < S_WORKERS; i++)
      if (pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0) started = i + 1;
      else break;
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    if (started != S_WORKERS) FAILF("concurrency: could start only %d threads", started);
    for (int i = 0; i < S_WORKERS; i++)
      if (w[i].mismatches || w[i].errors)
        FAILF("concurrency: N %d: %d of %d concurrent runs differ from the run alone, %d errors",
              w[i].N, w[i].mismatches, S_ROUNDS, w[i].errors);
    printf("stress_cuda: concurrency: %d threads x %d rounds, own context/stream/plan each: %s\n",
           S_WORKERS, S_ROUNDS, s_fail ? "mismatch" : "bitwise as alone");
  }
  for (int i = 0; i < S_WORKERS; i++) {
    free_host(&w[i].alone);
    free_out(&w[i].o);
    if (w[i].stream) cudaStreamDestroy(w[i].stream);
    smla_plan_destroy(w[i].plan);
    smla_context_destroy(w[i].ctx);
  }
}

int smla_test_cuda_stress(uint64_t seed) {
  s_fail = 0;
  if (smla_cuda_device_count() < 1) {
    printf("stress_cuda: SKIPPED (no CUDA device)\n");
    return 0;
  }
  s_rng = seed ^ 0x5157524553530000ull;
  inputs in = {0};
  in.scale = 6.0f / 24.0f; /* ~6 / sqrt(576): peaked, not one-hot */
  const size_t cache_bytes = (size_t)S_SLOTS * S_ROW, q_elems = (size_t)S_T * S_MAX_N * S_DQK;
  uint16_t *hc = malloc(cache_bytes), *hq = malloc(q_elems * 2);
  int32_t *hs = malloc((size_t)S_T * S_K * 4);
  smla_context *ctx = NULL;
  if (!hc || !hq || !hs) {
    FAILF("host allocation");
    goto done;
  }
  for (size_t i = 0; i < cache_bytes / 2; i++) hc[i] = rbf16();
  for (size_t i = 0; i < q_elems; i++) hq[i] = rbf16();
  for (size_t i = 0; i < (size_t)S_T * S_K; i++) hs[i] = rnd() % 16 ? (int32_t)(rnd() % S_SLOTS) : -1;
  if (cudaMalloc(&in.cache, cache_bytes) != cudaSuccess || cudaMalloc(&in.q, q_elems * 2) != cudaSuccess ||
      cudaMalloc((void **)&in.slots, (size_t)S_T * S_K * 4) != cudaSuccess ||
      cudaMemcpy(in.cache, hc, cache_bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(in.q, hq, q_elems * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(in.slots, hs, (size_t)S_T * S_K * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    FAILF("device allocation / upload");
    goto done;
  }
  if (smla_context_create(&ctx, 0) != SMLA_OK) {
    FAILF("smla_context_create(0)");
    goto done;
  }
  check_determinism(ctx, &in);
  check_batch_invariance(ctx, &in);
  check_concurrency(&in);
done:
  smla_context_destroy(ctx);
  cudaFree(in.cache);
  cudaFree(in.q);
  cudaFree(in.slots);
  free(hc);
  free(hq);
  free(hs);
  return s_fail;
}
