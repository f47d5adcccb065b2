/*
 * dcp_nccl.c: decode context parallelism for sparse MLA with smla and NCCL.
 *
 * A request's KV cache is sharded by token over W ranks (one GPU each), the way vLLM's DCP
 * lays it out: runs of I tokens dealt round robin, each rank keeping its tokens in its own
 * paged cache. One decode step on every rank, all on the rank's stream, no host syncs:
 *   1. smla_convert_indices with cp_size = W, cp_rank = r, compact = 1: the indexer's
 *      request positions -> this rank's own slots, and valid[t] = the row's local length;
 *   2. smla_forward with lse over the shard, written into this rank's part of a gather
 *      buffer [W][out bf16 T*N*512 | lse f32 T*N];
 *   3. ncclAllGather of those parts (in place: one call, every rank gets all W);
 *   4. smla_merge_states over the W partials -> out, lse (exact log-sum-exp merge; a shard
 *      with no used entry has lse -inf and is never read).
 * Each rank is driven by its own host thread (NCCL's advice for CUDA graphs over several
 * GPUs), runs one eager step first (NCCL connects outside any capture), then captures the
 * step in a CUDA graph (thread-local capture) and replays it. The merged output of every
 * rank is checked against a single-GPU forward over the whole cache (within bf16 rounding:
 * the partials travel as bf16).
 *
 *   build/dcp_nccl [--ranks W] [--interleave I] [-N heads] [-T rows] [-K topk]
 *                  [--tokens L] [--simulate] [--bench]
 *
 * --ranks W (default: every visible GPU; NCCL, one rank per GPU). --simulate: the W shards
 * all on GPU 0 and no NCCL (the gather buffer is filled in place): the one-GPU check; its
 * --bench times the merge and the whole step. --bench: after the check, per decode step
 * (graph replays, median of 50 samples of 20, the ranks starting each sample together; the
 * slowest rank's) for T = 1..64 and N = 16, 128: the all-gather, the merge, and the whole
 * step, in µs. NCCL's NVLink multicast is turned off (NCCL_NVLS_ENABLE=0) unless the
 * environment says otherwise. Exit status 0 when every check passed (or no GPU: then it
 * says SKIPPED).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "smla.h"

#define DR 64
#define DQK (SMLA_DC + DR)
#define ROW_BYTES (DQK * 2)
#define BS 64        /* cache block size */
#define MAX_RANKS 16

#define CUDA_OK(x)                                                                           \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "dcp_nccl: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                   \
              cudaGetErrorString(e_));                                                       \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define NCCL_OK(x)                                                                           \
  do {                                                                                       \
    ncclResult_t r_ = (x);                                                                   \
    if (r_ != ncclSuccess) {                                                                 \
      fprintf(stderr, "dcp_nccl: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                   \
              ncclGetErrorString(r_));                                                       \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
#define SMLA_OK_(ctx, x)                                                                     \
  do {                                                                                       \
    smla_status s_ = (x);                                                                    \
    if (s_ != SMLA_OK) {                                                                     \
      fprintf(stderr, "dcp_nccl: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                   \
              smla_context_message(ctx));                                                         \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static uint64_t g_rng = 0x5eed5eedull;
static uint32_t rnd(void) { /* splitmix64, top bits */
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t rbf16(void) { return to_bf16((float)(rnd() % 65536) / 32768.0f - 1.0f); }
static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "dcp_nccl: out of host memory\n");
    exit(1);
  }
  return p;
}

typedef struct {
  int W, I, N, T, K, L, simulate, bench;
} options;

/* One rank: its device, stream, context, plan and buffers. */
typedef struct {
  int dev;
  cudaStream_t stream;
  smla_context *ctx;
  smla_plan *plan;
  ncclComm_t comm;
  int64_t num_slots;     /* its cache: blocks * BS rows */
  int blocks;
  void *cache;           /* [num_slots][ROW_BYTES] */
  int32_t *table;        /* [blocks]: identity */
  uint16_t *q;           /* [T][N][576] */
  int32_t *pos, *req;    /* [T][K], [T] */
  int32_t *slots, *len;  /* [T][K], [T] */
  uint8_t *gather;       /* [W][chunk] */
  uint16_t *out;         /* [T][N][512] merged */
  float *lse;            /* [T][N] merged */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
} rank_t;

typedef struct {
  options o;
  size_t out_bytes, chunk;     /* per rank: out bytes, then lse; chunk padded to 256 */
  uint16_t *h_q, *h_kv;        /* host: q [T][N][576], token rows [L][576] */
  int32_t *h_pos;              /* [T][K] request positions, -1 = none */
  rank_t r[MAX_RANKS];
  pthread_barrier_t bar;       /* the rank threads' */
} problem;

static int owner(const problem *p, int64_t pos) { return (int)((pos / p->o.I) % p->o.W); }

/* Builds rank r's shard (or, with r < 0, the whole cache: a one-rank "union") on `dev`. */
static void rank_setup(problem *p, rank_t *k, int r, int dev, int for_union) {
  const options *o = &p->o;
  memset(k, 0, sizeof *k);
  k->dev = dev;
  CUDA_OK(cudaSetDevice(dev));
  CUDA_OK(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking));
  if (smla_context_create(&k->ctx, dev) != SMLA_OK) {
    fprintf(stderr, "dcp_nccl: smla_context_create(%d) failed\n", dev);
    exit(1);
  }
  int64_t count = 0;
  for (int64_t t = 0; t < o->L; t++) count += for_union || owner(p, t) == r;
  k->blocks = (int)((count + BS - 1) / BS);
  if (k->blocks < 1) k->blocks = 1;
  k->num_slots = (int64_t)k->blocks * BS;
  uint8_t *hc = xmalloc((size_t)k->num_slots * ROW_BYTES);
  uint16_t *nan = (uint16_t *)hc;
  for (size_t i = 0; i < (size_t)k->num_slots * DQK; i++) nan[i] = 0x7fc0u; /* unused rows */
  int64_t q = 0;
  for (int64_t t = 0; t < o->L; t++)
    if (for_union || owner(p, t) == r) /* local position q, identity block table */
      memcpy(hc + (size_t)q++ * ROW_BYTES, p->h_kv + (size_t)t * DQK, ROW_BYTES);
  int32_t *ht = xmalloc((size_t)k->blocks * 4);
  for (int b = 0; b < k->blocks; b++) ht[b] = b;
  const size_t TN = (size_t)o->T * o->N;
  CUDA_OK(cudaMalloc(&k->cache, (size_t)k->num_slots * ROW_BYTES));
  CUDA_OK(cudaMalloc((void **)&k->table, (size_t)k->blocks * 4));
  CUDA_OK(cudaMalloc((void **)&k->q, TN * DQK * 2));
  CUDA_OK(cudaMalloc((void **)&k->pos, (size_t)o->T * o->K * 4));
  CUDA_OK(cudaMalloc((void **)&k->req, (size_t)o->T * 4));
  CUDA_OK(cudaMalloc((void **)&k->slots, (size_t)o->T * o->K * 4));
  CUDA_OK(cudaMalloc((void **)&k->len, (size_t)o->T * 4));
  CUDA_OK(cudaMalloc((void **)&k->out, TN * SMLA_DC * 2));
  CUDA_OK(cudaMalloc((void **)&k->lse, TN * 4));
  CUDA_OK(cudaMemcpy(k->cache, hc, (size_t)k->num_slots * ROW_BYTES, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(k->table, ht, (size_t)k->blocks * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(k->q, p->h_q, TN * DQK * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(k->pos, p->h_pos, (size_t)o->T * o->K * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(k->req, 0, (size_t)o->T * 4));
  CUDA_OK(cudaMemset(k->out, 0xff, TN * SMLA_DC * 2)); /* poison */
  CUDA_OK(cudaMemset(k->lse, 0xff, TN * 4));
  free(hc);
  free(ht);
  /* The copies and memsets above went to the legacy stream, which the rank's non-blocking
   * stream does not wait for. */
  CUDA_OK(cudaDeviceSynchronize());
  smla_plan_desc d;
  memset(&d, 0, sizeof d);
  d.max_tokens = o->T;
  d.num_heads = o->N;
  d.topk = o->K;
  d.dr = DR;
  d.format = SMLA_CACHE_BF16;
  SMLA_OK_(k->ctx, smla_plan_create(k->ctx, &d, NULL, 0, &k->plan));
}

static void rank_free(rank_t *k) {
  if (!k->ctx) return;
  cudaSetDevice(k->dev);
  if (k->exec) cudaGraphExecDestroy(k->exec);
  if (k->graph) cudaGraphDestroy(k->graph);
  smla_plan_destroy(k->plan);
  smla_context_destroy(k->ctx);
  cudaFree(k->cache);
  cudaFree(k->table);
  cudaFree(k->q);
  cudaFree(k->pos);
  cudaFree(k->req);
  cudaFree(k->slots);
  cudaFree(k->len);
  cudaFree(k->out);
  cudaFree(k->lse);
  cudaStreamDestroy(k->stream);
}

/* Steps 1-2 of rank r (cp_rank r of W; W == 1 or r < 0: no filter) on k's stream: the
 * forward's out and lse into part `part` of `gather` (or into out/lse when gather is NULL). */
static void enqueue_shard(const problem *p, rank_t *k, int r, uint8_t *gather, int part) {
  const options *o = &p->o;
  smla_convert_params c;
  memset(&c, 0, sizeof c);
  c.num_tokens = o->T;
  c.topk = o->K;
  c.req_id = k->req;
  c.block_table = k->table;
  c.num_requests = 1;
  c.blocks_per_request = k->blocks;
  c.block_table_stride = k->blocks;
  c.block_size = BS;
  c.local = k->pos;
  c.local_stride = o->K;
  c.slots = k->slots;
  c.slots_stride = o->K;
  c.valid = k->len;
  c.compact = 1;
  if (r >= 0 && o->W > 1) {
    c.cp_size = o->W;
    c.cp_rank = r;
    c.cp_interleave = o->I;
  }
  SMLA_OK_(k->ctx, smla_convert_indices(k->ctx, &c, k->stream));
  smla_forward_params f;
  memset(&f, 0, sizeof f);
  f.num_tokens = o->T;
  f.num_heads = o->N;
  f.topk = o->K;
  f.q_nope = k->q;
  f.q_nope_stride_t = (int64_t)o->N * DQK;
  f.q_nope_stride_h = DQK;
  f.q_pe = k->q + SMLA_DC;
  f.q_pe_stride_t = (int64_t)o->N * DQK;
  f.q_pe_stride_h = DQK;
  f.cache.format = SMLA_CACHE_BF16;
  f.cache.dr = DR;
  f.cache.num_slots = k->num_slots;
  f.cache.row_bytes = ROW_BYTES;
  f.cache.data = k->cache;
  f.slots = k->slots;
  f.slots_stride = o->K;
  f.lengths = k->len;
  f.sm_scale = 1.0f / sqrtf((float)DQK);
  f.out = gather ? (void *)(gather + (size_t)part * p->chunk) : (void *)k->out;
  f.out_stride_t = (int64_t)o->N * SMLA_DC;
  f.out_stride_h = SMLA_DC;
  f.lse = gather ? (float *)(gather + (size_t)part * p->chunk + p->out_bytes) : k->lse;
  f.lse_stride_t = o->N;
  SMLA_OK_(k->ctx, smla_forward(k->plan, &f, k->stream));
}

/* Step 4: merge the W parts of `gather` into k's out / lse. */
static void enqueue_merge(const problem *p, rank_t *k, const uint8_t *gather) {
  const options *o = &p->o;
  smla_merge_params m;
  memset(&m, 0, sizeof m);
  m.num_partials = o->W;
  m.num_tokens = o->T;
  m.num_heads = o->N;
  m.dv = SMLA_DC;
  m.out_p = gather;
  m.out_p_dtype = SMLA_DTYPE_BF16;
  m.out_p_stride_p = (int64_t)(p->chunk / 2);
  m.out_p_stride_t = (int64_t)o->N * SMLA_DC;
  m.out_p_stride_h = SMLA_DC;
  m.lse_p = (const float *)(gather + p->out_bytes);
  m.lse_p_stride_p = (int64_t)(p->chunk / 4);
  m.lse_p_stride_t = o->N;
  m.out = k->out;
  m.out_dtype = SMLA_DTYPE_BF16;
  m.out_stride_t = (int64_t)o->N * SMLA_DC;
  m.out_stride_h = SMLA_DC;
  m.lse = k->lse;
  m.lse_stride_t = o->N;
  SMLA_OK_(k->ctx, smla_merge_states(k->ctx, &m, k->stream));
}

/* What rank r's decode step enqueues on its own stream, by stage bits: 1 = convert and
 * forward over its shard, 2 = the in-place all-gather (its own communicator), 4 = merge.
 * Simulated: rank 0's stream runs every shard, straight into rank 0's gather buffer. */
static void enqueue_rank(problem *p, int r, int stages) {
  rank_t *k = &p->r[r];
  if (p->o.simulate) {
    rank_t *k0 = &p->r[0];
    for (int s = 0; (stages & 1) && s < p->o.W; s++) {
      rank_t *ks = &p->r[s];
      cudaStream_t keep = ks->stream;
      ks->stream = k0->stream; /* one stream: one graph holds the whole step */
      enqueue_shard(p, ks, s, k0->gather, s);
      ks->stream = keep;
    }
    if (stages & 4) enqueue_merge(p, k0, k0->gather);
    return;
  }
  if (stages & 1) enqueue_shard(p, k, r, k->gather, r);
  if (stages & 2)
    NCCL_OK(ncclAllGather(k->gather + (size_t)r * p->chunk, k->gather, p->chunk, ncclUint8,
                          k->comm, k->stream));
  if (stages & 4) enqueue_merge(p, k, k->gather);
}

/* Captures rank r's stages into its graph (thread-local capture: one thread per rank). */
static void rank_capture(problem *p, int r, int stages) {
  rank_t *k = &p->r[r];
  if (k->exec) CUDA_OK(cudaGraphExecDestroy(k->exec));
  if (k->graph) CUDA_OK(cudaGraphDestroy(k->graph));
  k->exec = NULL;
  k->graph = NULL;
  CUDA_OK(cudaStreamBeginCapture(k->stream, cudaStreamCaptureModeThreadLocal));
  enqueue_rank(p, r, stages);
  CUDA_OK(cudaStreamEndCapture(k->stream, &k->graph));
  CUDA_OK(cudaGraphInstantiate(&k->exec, k->graph, 0));
}

/* Median over 50 samples of 20 replays of rank r's graph, per replay, in microseconds,
 * from events on its own stream; the ranks start each sample together (barrier). */
static double rank_time(problem *p, int r) {
  enum { SAMPLES = 50, REPS = 20 };
  rank_t *k = &p->r[r];
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  float ms[SAMPLES];
  for (int s = 0; s < SAMPLES; s++) {
    if (!p->o.simulate) pthread_barrier_wait(&p->bar);
    CUDA_OK(cudaEventRecord(a, k->stream));
    for (int i = 0; i < REPS; i++) CUDA_OK(cudaGraphLaunch(k->exec, k->stream));
    CUDA_OK(cudaEventRecord(b, k->stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms[s], a, b));
  }
  for (int i = 1; i < SAMPLES; i++)
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      const float t = ms[j];
      ms[j] = ms[j - 1];
      ms[j - 1] = t;
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e3 * ms[SAMPLES / 2] / REPS;
}

/* One rank's work, on its own host thread (NCCL's advice for CUDA graphs with several
 * GPUs: a thread per GPU, so that no launch can block another rank's). */
typedef struct {
  problem *p;
  int r, n;
  int stages[3];  /* graphs to capture (and time, when timing) */
  int timing;
  double us[3];
} job_t;

static void *rank_thread(void *arg) {
  job_t *j = arg;
  problem *p = j->p;
  rank_t *k = &p->r[j->r];
  CUDA_OK(cudaSetDevice(k->dev));
  enqueue_rank(p, j->r, 1 | 2 | 4); /* one eager step: NCCL connects outside any capture */
  CUDA_OK(cudaStreamSynchronize(k->stream));
  if (!p->o.simulate) pthread_barrier_wait(&p->bar);
  /* Poison again what the eager step wrote, so that the check sees the graphs' results.
   * (A peer writes this rank's gather only inside a collective, after this on its stream.) */
  CUDA_OK(cudaMemsetAsync(k->gather, 0xff, (size_t)p->o.W * p->chunk, k->stream));
  CUDA_OK(cudaMemsetAsync(k->out, 0xff, (size_t)p->o.T * p->o.N * SMLA_DC * 2, k->stream));
  CUDA_OK(cudaMemsetAsync(k->lse, 0xff, (size_t)p->o.T * p->o.N * 4, k->stream));
  CUDA_OK(cudaStreamSynchronize(k->stream));
  if (!p->o.simulate) pthread_barrier_wait(&p->bar);
  for (int i = 0; i < j->n; i++) {
    rank_capture(p, j->r, j->stages[i]);
    for (int rep = 0; rep < 2; rep++) /* twice: a replay must leave nothing behind */
      CUDA_OK(cudaGraphLaunch(k->exec, k->stream));
    CUDA_OK(cudaStreamSynchronize(k->stream));
    if (j->timing) j->us[i] = rank_time(p, j->r);
  }
  return NULL;
}

/* Runs the jobs: a thread per rank, or rank 0 alone when simulated. Returns the slowest
 * rank's time of each job. */
static void run_ranks(problem *p, const int *stages, int n, int timing, double *us) {
  const int W = p->o.simulate ? 1 : p->o.W;
  job_t jobs[MAX_RANKS];
  pthread_t tid[MAX_RANKS];
  if (!p->o.simulate && pthread_barrier_init(&p->bar, NULL, (unsigned)W)) {
    fprintf(stderr, "dcp_nccl: pthread_barrier_init failed\n");
    exit(1);
  }
  for (int r = 0; r < W; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].p = p;
    jobs[r].r = r;
    jobs[r].n = n;
    jobs[r].timing = timing;
    for (int i = 0; i < n; i++) jobs[r].stages[i] = stages[i];
    if (W == 1) {
      rank_thread(&jobs[r]);
    } else if (pthread_create(&tid[r], NULL, rank_thread, &jobs[r])) {
      fprintf(stderr, "dcp_nccl: pthread_create failed\n");
      exit(1);
    }
  }
  if (W > 1)
    for (int r = 0; r < W; r++) pthread_join(tid[r], NULL);
  if (!p->o.simulate) pthread_barrier_destroy(&p->bar);
  for (int i = 0; i < n && us; i++) {
    us[i] = 0.0;
    for (int r = 0; r < W; r++)
      if (jobs[r].us[i] > us[i]) us[i] = jobs[r].us[i];
  }
}

static void problem_init(problem *p, const options *o, ncclComm_t *comms) {
  memset(p, 0, sizeof *p);
  p->o = *o;
  const size_t TN = (size_t)o->T * o->N;
  p->out_bytes = TN * SMLA_DC * 2;
  p->chunk = (p->out_bytes + TN * 4 + 255) & ~(size_t)255;
  p->h_q = xmalloc(TN * DQK * 2);
  for (size_t i = 0; i < TN * DQK; i++) p->h_q[i] = rbf16();
  p->h_kv = xmalloc((size_t)o->L * DQK * 2);
  for (size_t i = 0; i < (size_t)o->L * DQK; i++) p->h_kv[i] = rbf16();
  p->h_pos = xmalloc((size_t)o->T * o->K * 4);
  for (int t = 0; t < o->T; t++)
    for (int k = 0; k < o->K; k++) /* distinct-ish random positions, ~1 in 16 empty */
      p->h_pos[t * o->K + k] = rnd() % 16 ? (int32_t)(rnd() % (uint32_t)o->L) : -1;
  /* One rank_t per rank; simulated ranks all live on GPU 0 and share rank 0's gather. */
  for (int r = 0; r < o->W; r++) {
    rank_setup(p, &p->r[r], r, o->simulate ? 0 : r, 0);
    if (!o->simulate || r == 0) {
      CUDA_OK(cudaMalloc((void **)&p->r[r].gather, (size_t)o->W * p->chunk));
      CUDA_OK(cudaMemset(p->r[r].gather, 0xff, (size_t)o->W * p->chunk));
      CUDA_OK(cudaDeviceSynchronize());
    }
    if (comms) p->r[r].comm = comms[r];
  }
}

static void problem_free(problem *p) {
  for (int r = 0; r < p->o.W; r++) {
    if (p->r[r].gather) {
      cudaSetDevice(p->r[r].dev);
      cudaFree(p->r[r].gather);
    }
    rank_free(&p->r[r]);
  }
  free(p->h_q);
  free(p->h_kv);
  free(p->h_pos);
}

/* Checks every active rank's merged out / lse against a one-GPU forward over the union. */
static int check(problem *p) {
  const options *o = &p->o;
  const size_t TN = (size_t)o->T * o->N;
  rank_t u;
  rank_setup(p, &u, -1, p->r[0].dev, 1);
  enqueue_shard(p, &u, -1, NULL, 0);
  CUDA_OK(cudaStreamSynchronize(u.stream));
  uint16_t *ref = xmalloc(TN * SMLA_DC * 2), *got = xmalloc(TN * SMLA_DC * 2);
  float *rl = xmalloc(TN * 4), *gl = xmalloc(TN * 4);
  CUDA_OK(cudaMemcpy(ref, u.out, TN * SMLA_DC * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(rl, u.lse, TN * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int r = 0; r < (p->o.simulate ? 1 : p->o.W); r++) {
    CUDA_OK(cudaSetDevice(p->r[r].dev));
    CUDA_OK(cudaMemcpy(got, p->r[r].out, TN * SMLA_DC * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gl, p->r[r].lse, TN * 4, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    int64_t nbad = 0;
    /* bf16 partials, merged: |d| <= 4e-3 + 1e-2 |ref| (tests/cases_dcp.c); values in [-1, 1]. */
    for (size_t i = 0; i < TN * SMLA_DC; i++) {
      const double a = from_bf16(got[i]), b = from_bf16(ref[i]);
      const double d = fabs(a - b), tol = 4e-3 + 1e-2 * fabs(b);
      if (!(d <= tol)) nbad++;
      if (d / tol > worst) worst = d / tol;
    }
    for (size_t i = 0; i < TN; i++) {
      const int both_inf = isinf(gl[i]) && isinf(rl[i]) && (gl[i] < 0) == (rl[i] < 0);
      if (!both_inf && !(fabs((double)gl[i] - rl[i]) <= 2e-4 + 1e-5 * fabs(rl[i]))) nbad++;
    }
    printf("  rank %d: merged out and lse vs the one-GPU forward over the whole cache: %s "
           "(worst |d| / tol %.2f)\n", r, nbad ? "MISMATCH" : "ok", worst);
    if (nbad) {
      printf("  rank %d: %lld values outside the bound\n", r, (long long)nbad);
      bad = 1;
    }
  }
  rank_free(&u);
  free(ref);
  free(got);
  free(rl);
  free(gl);
  return bad;
}

static int parse(int argc, char **argv, options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--simulate")) o->simulate = 1;
    else if (!strcmp(a, "--bench")) o->bench = 1;
    else if (v && !strcmp(a, "--ranks")) o->W = atoi(argv[++i]);
    else if (v && !strcmp(a, "--interleave")) o->I = atoi(argv[++i]);
    else if (v && !strcmp(a, "-N")) o->N = atoi(argv[++i]);
    else if (v && !strcmp(a, "-T")) o->T = atoi(argv[++i]);
    else if (v && !strcmp(a, "-K")) o->K = atoi(argv[++i]);
    else if (v && !strcmp(a, "--tokens")) o->L = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: dcp_nccl [--ranks W] [--interleave I] [-N heads] [-T rows] "
                      "[-K topk] [--tokens L] [--simulate] [--bench]\n");
      return -1;
    }
  }
  if (o->W < 1 || o->W > MAX_RANKS || o->I < 1 || o->N < 1 || o->N > 128 || o->T < 1 ||
      o->K < 1 || o->L < 1) {
    fprintf(stderr, "dcp_nccl: need 1 <= ranks <= %d, interleave, T, K, tokens >= 1, "
                    "1 <= N <= 128\n", MAX_RANKS);
    return -1;
  }
  return 0;
}

/* One configuration: set up, one eager step, the step captured and replayed twice, then
 * the check; or, timing, the graphs of the merge, the all-gather and the whole step. */
static int run(const options *o, ncclComm_t *comms, int timing) {
  problem p;
  problem_init(&p, o, comms);
  int bad = 0;
  if (!timing) {
    const int whole = 1 | 2 | 4;
    run_ranks(&p, &whole, 1, 0, NULL);
    bad = check(&p);
  } else if (o->simulate) {
    const int stages[2] = {4, 1 | 4};
    double us[2];
    run_ranks(&p, stages, 2, 1, us);
    printf("  T %3d  N %3d  W %d (simulated on one GPU): merge %7.2f us, whole step %8.2f us\n",
           o->T, o->N, o->W, us[0], us[1]);
  } else {
    const int stages[3] = {4, 2, 1 | 2 | 4};
    double us[3];
    run_ranks(&p, stages, 3, 1, us);
    printf("  T %3d  N %3d  W %d: all-gather %7.2f us, merge %7.2f us (overhead %7.2f), "
           "whole step %8.2f us (slowest rank each)\n", o->T, o->N, o->W, us[1], us[0],
           us[0] + us[1], us[2]);
  }
  problem_free(&p);
  return bad;
}

int main(int argc, char **argv) {
  options o = {0, 1, 16, 8, 2048, 16384, 0, 0};
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("dcp_nccl: SKIPPED (no CUDA device)\n");
    return 0;
  }
  o.W = ndev < MAX_RANKS ? ndev : MAX_RANKS;
  if (parse(argc, argv, &o)) return 2;
  if (!o.simulate && o.W > ndev) {
    fprintf(stderr, "dcp_nccl: --ranks %d but %d GPU(s) are visible (one rank per GPU; "
                    "--simulate puts every shard on GPU 0)\n", o.W, ndev);
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast off unless set otherwise */
  ncclComm_t comms[MAX_RANKS];
  int devs[MAX_RANKS];
  if (!o.simulate) {
    for (int r = 0; r < o.W; r++) devs[r] = r;
    NCCL_OK(ncclCommInitAll(comms, o.W, devs));
  }
  int ver = 0;
  ncclGetVersion(&ver);
  printf("dcp_nccl: %d rank(s)%s, interleave %d, T %d, N %d, K %d, %d tokens; NCCL %d, "
         "NCCL_NVLS_ENABLE=%s\n", o.W, o.simulate ? " simulated on GPU 0" : " (one per GPU)",
         o.I, o.T, o.N, o.K, o.L, ver, getenv("NCCL_NVLS_ENABLE"));
  int bad = run(&o, o.simulate ? NULL : comms, 0);
  if (o.bench) {
    printf("per decode step, CUDA-graph replays, median of 50 x 20:\n");
    const int Ns[2] = {16, 128};
    for (int ni = 0; ni < 2; ni++)
      for (int T = 1; T <= 64; T *= 2) {
        options b = o;
        b.T = T;
        b.N = Ns[ni];
        run(&b, o.simulate ? NULL : comms, 1);
      }
  }
  if (!o.simulate)
    for (int r = 0; r < o.W; r++) ncclCommDestroy(comms[r]);
  printf("dcp_nccl: %s\n", bad ? "FAILED" : "all checks passed");
  return bad ? 1 : 0;
}
