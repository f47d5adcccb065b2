/*
 * backend.c: the generic CUDA backend's table (host glue, C11 over the CUDA runtime).
 *
 * Every call makes ctx->device current for its duration and restores the caller's
 * device afterwards (cudaGetDevice / cudaSetDevice are host-side and legal during graph
 * capture), launches on the caller's stream, and maps a failed launch to SMLA_ERR_CUDA
 * with the runtime's error string. The forward path does no allocation, no
 * synchronization and no device-to-host read, so it can be captured; plan creation
 * (which may cudaMalloc and sets kernel attributes) refuses to run during capture.
 *
 * Split-KV choice (plan_init / forward, host only, from shapes alone): a small cost model
 * of one forward as waves of blocks times the per-block time, plus the combine; the
 * constants were set from napkin math (see forward_impl.cuh) and H200 measurements.
 */
#include "internal.h"
#include "cuda/kernels.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

/* Device properties cached at context creation (ctx->backend_state). */
typedef struct cuda_state {
  int sm_count;
  int smem_optin;  /* bytes of shared memory one block may opt in to */
  double mem_bytes_per_us; /* peak memory bandwidth (memory clock x bus width), for the
                              cost model; 0: the device did not say */
  int cc_major, cc_minor;
  char name[256];
} cuda_state;

/* ---- errors and the current device ------------------------------------------------- */

static smla_status cuda_fail(smla_context *ctx, cudaError_t e, const char *what) {
  (void)cudaGetLastError(); /* clear a non-sticky error so later launch checks are clean */
  return smla_set_error(ctx, SMLA_ERR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

static int is_capture_error(cudaError_t e) {
  return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureImplicit ||
         e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureWrongThread;
}

/* log2(bs) for a power of two (the engines' 64), else -1 (smla_cuda_convert_args). */
static int block_shift_of(int bs) {
  if (bs <= 0 || (bs & (bs - 1)) != 0) return -1;
  int k = 0;
  while ((1 << k) < bs) k++;
  return k;
}

/* Makes ctx->device current; *prev receives the caller's device for device_leave(). */
static smla_status device_enter(smla_context *ctx, const char *fn, int *prev) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return cuda_fail(ctx, e, fn);
  *prev = cur;
  if (cur != ctx->device) {
    e = cudaSetDevice(ctx->device);
    if (e != cudaSuccess) return cuda_fail(ctx, e, fn);
  }
  return SMLA_OK;
}

static void device_leave(smla_context *ctx, int prev) {
  if (prev >= 0 && prev != ctx->device) (void)cudaSetDevice(prev);
}

static smla_status launched(smla_context *ctx, int prev, cudaError_t e, const char *what) {
  device_leave(ctx, prev);
  return e == cudaSuccess ? SMLA_OK : cuda_fail(ctx, e, what);
}

/* ---- devices --------------------------------------------------------------------------- */

int smla_cuda_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

smla_status smla_cuda_name(int device, char *buf, size_t buf_bytes) {
  int n = 0;
  const cudaError_t ce = cudaGetDeviceCount(&n);
  if (ce != cudaSuccess) { /* say why: no driver, driver too old, ... */
    (void)cudaGetLastError();
    snprintf(buf, buf_bytes, "no CUDA device %d (cudaGetDeviceCount: %s)", device,
             cudaGetErrorString(ce));
    return SMLA_ERR_NO_DEVICE;
  }
  if (device < 0 || device >= n) {
    snprintf(buf, buf_bytes, "no CUDA device %d (%d visible)", device, n);
    return SMLA_ERR_NO_DEVICE;
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(buf, buf_bytes, "CUDA device %d (properties unavailable)", device);
    return SMLA_ERR_CUDA;
  }
  snprintf(buf, buf_bytes, "%s, sm_%d%d, %d SMs", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
  return SMLA_OK;
}

static smla_status cuda_init(smla_context *ctx) {
  const int n = smla_cuda_count();
  if (ctx->device >= n)
    return smla_set_error(ctx, SMLA_ERR_NO_DEVICE, "smla_context_create: device %d, but %d "
                          "CUDA device(s) are visible", ctx->device, n);
  struct cudaDeviceProp prop;
  const cudaError_t e = cudaGetDeviceProperties(&prop, ctx->device);
  if (e != cudaSuccess) return cuda_fail(ctx, e, "smla_context_create: cudaGetDeviceProperties");
  if (prop.major < 8)
    return smla_set_error(ctx, SMLA_ERR_UNSUPPORTED, "smla_context_create: device %d (%s) is "
                          "sm_%d%d; the CUDA kernels need sm_80 or newer", ctx->device,
                          prop.name, prop.major, prop.minor);
  cuda_state *st = calloc(1, sizeof *st);
  if (!st)
    return smla_set_error(ctx, SMLA_ERR_OUT_OF_MEMORY, "smla_context_create: out of host memory");
  st->sm_count = prop.multiProcessorCount;
  st->smem_optin = (int)prop.sharedMemPerBlockOptin;
  /* Peak bandwidth: memory clock (kHz) x bus width (bits) x 2 (double data rate) / 8. */
  int mem_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, ctx->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, ctx->device) != cudaSuccess) {
    (void)cudaGetLastError();
    mem_khz = bus_bits = 0;
  }
  st->mem_bytes_per_us = (double)mem_khz * 1e3 * bus_bits * 2.0 / 8.0 * 1e-6;
  st->cc_major = prop.major;
  st->cc_minor = prop.minor;
  snprintf(st->name, sizeof st->name, "%s", prop.name);
  ctx->backend_state = st;
  return SMLA_OK;
}

static void cuda_fini(smla_context *ctx) {
  free(ctx->backend_state);
  ctx->backend_state = NULL;
}

/* ---- memory and capture ------------------------------------------------------------- */

static smla_status cuda_check_not_capturing(smla_context *ctx) {
  int prev;
  smla_status s = device_enter(ctx, "smla_plan_create", &prev);
  if (s != SMLA_OK) return s;
  /* Asking about the legacy stream answers cudaErrorStreamCaptureImplicit while any
   * blocking stream of the device is captured (the capture is not invalidated); the
   * per-thread stream is asked too. A capture on a non-blocking stream in global mode is
   * caught later: cudaMalloc then fails with cudaErrorStreamCaptureUnsupported. */
  const cudaStream_t streams[2] = {cudaStreamLegacy, cudaStreamPerThread};
  for (int i = 0; i < 2; i++) {
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(streams[i], &status);
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (is_capture_error(e) || (e == cudaSuccess && status != cudaStreamCaptureStatusNone)) {
      device_leave(ctx, prev);
      return smla_set_error(ctx, SMLA_ERR_CAPTURING, "smla_plan_create: a CUDA graph capture "
                            "is active on device %d; create plans before capturing",
                            ctx->device);
    }
    if (e != cudaSuccess) {
      device_leave(ctx, prev);
      return cuda_fail(ctx, e, "smla_plan_create: cudaStreamIsCapturing");
    }
  }
  device_leave(ctx, prev);
  return SMLA_OK;
}

static smla_status cuda_alloc(smla_context *ctx, size_t bytes, void **ptr) {
  int prev;
  *ptr = NULL;
  smla_status s = device_enter(ctx, "smla_plan_create", &prev);
  if (s != SMLA_OK) return s;
  const cudaError_t e = cudaMalloc(ptr, bytes);
  device_leave(ctx, prev);
  if (e == cudaSuccess) return SMLA_OK;
  *ptr = NULL;
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation)
    return smla_set_error(ctx, SMLA_ERR_OUT_OF_MEMORY, "smla_plan_create: cudaMalloc of %zu "
                          "bytes on device %d failed: %s", bytes, ctx->device,
                          cudaGetErrorString(e));
  if (is_capture_error(e))
    return smla_set_error(ctx, SMLA_ERR_CAPTURING, "smla_plan_create: cudaMalloc during CUDA "
                          "graph capture (%s); create plans before capturing",
                          cudaGetErrorString(e));
  return cuda_fail(ctx, e, "smla_plan_create: cudaMalloc");
}

static void cuda_free(smla_context *ctx, void *ptr) {
  if (!ptr) return;
  int prev;
  if (device_enter(ctx, "smla_plan_destroy", &prev) != SMLA_OK) return;
  if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
  device_leave(ctx, prev);
}

/* ---- convert, cache write, merge ------------------------------------------------------ */

static smla_status cuda_convert(smla_context *ctx, const smla_convert_params *p, void *stream) {
  int prev;
  smla_status s = device_enter(ctx, "smla_convert_indices", &prev);
  if (s != SMLA_OK) return s;
  smla_cuda_convert_args a;
  memset(&a, 0, sizeof a);
  a.num_tokens = p->num_tokens;
  a.topk = p->topk;
  a.req_id = p->req_id;
  a.block_table = p->block_table;
  a.num_requests = p->num_requests;
  a.blocks_per_request = p->blocks_per_request;
  a.block_table_stride = p->block_table_stride;
  a.block_size = p->block_size;
  a.block_shift = block_shift_of(p->block_size);
  a.local = p->local;
  a.local_stride = p->local_stride;
  a.slots = p->slots;
  a.slots_stride = p->slots_stride;
  a.valid = p->valid;
  a.compact = p->compact;
  if (p->cp_size >= 2) {
    a.cp_size = p->cp_size;
    a.cp_rank = p->cp_rank;
    a.cp_interleave = p->cp_interleave > 0 ? p->cp_interleave : 1;
  }
  return launched(ctx, prev, smla_cuda_convert(&a, stream), "smla_convert_indices: kernel");
}

static smla_status cuda_cache_write(smla_context *ctx, const smla_cache_write_params *p,
                                    void *stream) {
  int prev;
  smla_status s = device_enter(ctx, "smla_cache_write", &prev);
  if (s != SMLA_OK) return s;
  smla_cuda_cache_write_args a;
  memset(&a, 0, sizeof a);
  a.num_tokens = p->num_tokens;
  a.kv_c = (const uint16_t *)p->kv_c;
  a.kv_c_stride = p->kv_c_stride;
  a.k_pe = p->cache.dr > 0 ? (const uint16_t *)p->k_pe : NULL;
  a.k_pe_stride = p->k_pe_stride;
  a.slot = p->slot;
  a.format = (int)p->cache.format;
  a.dr = p->cache.dr;
  a.num_slots = p->cache.num_slots;
  a.row_bytes = p->cache.row_bytes;
  a.cache = (uint8_t *)p->cache.data;
  a.scale = p->cache.scale;
  a.bad_inputs = (unsigned long long *)p->bad_inputs;
  return launched(ctx, prev, smla_cuda_cache_write(&a, stream), "smla_cache_write: kernel");
}

static smla_status cuda_merge(smla_context *ctx, const smla_merge_params *p, void *stream) {
  int prev;
  smla_status s = device_enter(ctx, "smla_merge_states", &prev);
  if (s != SMLA_OK) return s;
  smla_cuda_merge_args a;
  memset(&a, 0, sizeof a);
  a.num_partials = p->num_partials;
  a.num_tokens = p->num_tokens;
  a.num_heads = p->num_heads;
  a.dv = p->dv;
  a.out_p = p->out_p;
  a.out_p_bf16 = p->out_p_dtype == SMLA_DTYPE_BF16;
  a.out_p_stride_p = p->out_p_stride_p;
  a.out_p_stride_t = p->out_p_stride_t;
  a.out_p_stride_h = p->out_p_stride_h;
  a.lse_p = p->lse_p;
  a.lse_p_stride_p = p->lse_p_stride_p;
  a.lse_p_stride_t = p->lse_p_stride_t;
  a.out = p->out;
  a.out_bf16 = p->out_dtype == SMLA_DTYPE_BF16;
  a.out_stride_t = p->out_stride_t;
  a.out_stride_h = p->out_stride_h;
  a.lse = p->lse;
  a.lse_stride_t = p->lse_stride_t;
  a.sink = p->sink;
  a.sinked = p->sink != NULL;
  return launched(ctx, prev, smla_cuda_merge(&a, stream), "smla_merge_states: kernel");
}

/* ---- plan: variant, splits, workspace -------------------------------------------------- */

/* Cost model (microseconds): a forward of T rows in s splits of tps tiles is
 *   waves x (tps x tile + the kernel's fixed cost a wave) + the merge,
 * tile = the largest of the kernel's tile time alone on its SM, one gather round trip
 * (TILE_LATENCY_US), and the active blocks' 64 rows each at GATHER_FRAC of the device's
 * peak memory bandwidth, of which a head group past the first of its (row, split) reads
 * GROUP_ROW_SHARE (the rest hits L2); the merge: the combine kernel (COMBINE_FIXED_US, the
 * partial rows written and read at COMBINE_FRAC of peak) or the in-kernel merge. It ranks
 * paths, of one kernel (the splits) and of several (the few-rows chain); it does not
 * predict a launch's fixed cost, which every path of a shape pays alike.
 * Fitted by scripts/fit_cost_model.py --fit to `smla bench --paths --timing amortized`
 * (H100 SXM, 3.35 TB/s peak; bench/RESULTS.md session 17 calls 2-3 and session 18 call 1
 * and session 19 call 2: every split 1..32, in-kernel or combine merge, every kernel, and
 * the narrower head groups at T <= 32; N = 8..128, T = 1..512), to the least regret of the
 * plan's choice plus half the rms log error of every path. The rates are fractions of the
 * device's peak so that the model moves with the card; the tile times and fixed costs are
 * the H100's and hold for sm_90 cards alike. */
static const double TILE_COMPUTE_US[5] = {0.0, 2.24, 2.85, 0.0, 4.92}; /* generic, by mtiles */
/* The sm_90a kernels' tiles alone: v11's 64-head tile; the small-head kernel's by heads a
 * block (8, 16, 32); and each kernel's fixed cost a wave (Q load, the first tile's
 * latency, the epilogue): the generic kernel's, v11's, the small-head kernel's by heads
 * (3.6 us in groups of 8 against 6.5 in one group of 32: why narrower groups win at few
 * rows). */
#define SM90_TILE_COMPUTE_US 1.67
static const double SM90S_TILE_US[3] = {1.0, 1.26, 1.23};
#define BLOCK_FIXED_US 7.61
#define SM90_BLOCK_FIXED_US 9.92
static const double SM90S_BLOCK_FIXED_US[3] = {3.59, 4.64, 6.53};
#define GROUP_ROW_SHARE 0.56
#define KERNEL_SM90 16             /* plan->kernel: the wgmma kernel (else the generic pipe) */
#define TILE_LATENCY_US 1.03       /* one gather round trip (one tile in flight per SM) */
#define GATHER_FRAC 1.47           /* 1152-byte random rows over a 302 MB pool: above peak
                                      by the L2's hits (and it lumps what the model leaves
                                      out: a ranking rate, not a measured one) */
#define COMBINE_FIXED_US 0.0       /* the combine launched as a programmatic dependent */
#define COMBINE_FRAC 1.10          /* partials written once and read once, mostly in L2 */
#define CLUSTER_MERGE_US 3.33       /* the 64-head kernel's in-kernel merge of s splits (v21: 3
                                       cluster barriers, (s-1)/s of O over distributed shared
                                       memory): CLUSTER_MERGE_US + s x CLUSTER_MERGE_SPLIT_US,
                                       fitted on the default's --paths (H100, bench/RESULTS.md
                                       session 27 call 1: 7 -> 5 of 35 shapes missed by > 5%;
                                       0.51, v6's 4.96 less v21's measured saving, chose merges
                                       of 4-8 splits that ran 1.4-4.1 us slower than the
                                       combine) */
#define CLUSTER_MERGE_SPLIT_US 0.20
#define DEFAULT_PEAK_BYTES_PER_US 2.0e6 /* a device that does not report its memory clock */
/* The generic kernel's in-kernel merge: one cluster of C a row (2 cluster barriers, O over
 * distributed shared memory), and R > 1 clusters a row (slices to L2, a release and a
 * count, the last block's L2 round trip): fitted with the rest (the cluster's own cost
 * went to 0: its residency limit, in split_cost, is what the runs show). */
#define DSMEM_MERGE_US 0.0
#define LAST_ARRIVER_US 0.84
/* The small-head sm90 kernel's merge (one cluster a row; SMLA_FWD90S_MERGE builds): not
 * fitted yet. 1.0 starts the fit (its multiplicative steps cannot move a 0); fitted alone
 * to session 23's one H100 run of 6 shapes it stays at 1.05, and the plan still misses 2
 * of them by its small-head tiles at T = 16, not by this constant. */
#define SM90S_MERGE_US 1.0
#define MAX_AUTO_SPLITS 64         /* beyond this the combine dominates */
#define NO_SPLIT_WAVES 4           /* T * groups >= 4 waves of SMs: never split */

typedef struct fwd_choice {
  smla_cuda_fwd_config cfg;
  int sm90;           /* 1: the sm_90a wgmma kernel */
  int hb;             /* heads a block (sm90: 64, or the small-head kernel's 8..32) */
  int wide_merge;     /* the 64-head kernel's merge: one cluster a row (CLUSTER_MERGE_US;
                         else R clusters of C a row, fwd_dsmem_merge) */
  double tile_us;     /* compute time of one 64-entry tile of one block */
  double wave_us;     /* the kernel's fixed cost a wave */
  int groups;         /* head groups of 16 * mtiles heads */
  int ntiles;         /* ceil(K / 64) */
  int gather_bytes;   /* bytes gathered per cache row */
  const int *merge_clusters; /* the plan's resident clusters by size; NULL: no merge in
                                the kernel (SMLA_PLAN_SEPARATE_MERGE, or none can run) */
} fwd_choice;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The cluster size with which s splits merge inside the kernel, or 0 (the combine
 * kernel): the sm90 kernels, the whole split list as one cluster (2..8); the generic
 * kernel, the largest C in 2..8 that divides s with at most SMLA_CUDA_FWD_MERGE_MAX_R
 * clusters a row. The small-head kernel could merge R > 1 clusters a row too (its merge is
 * the generic kernel's), but every such path measured slower than the combine (H100,
 * bench/RESULTS.md session 23 call 1: 28 of 28 pairs at T = 1 and 16, by 1.4-13 us at T =
 * 1), where one cluster a row was level or faster at T = 1. Only sizes whose clusters can
 * be resident (plan time query) count. */
static int merge_cluster_of(const fwd_choice *c, int s) {
  if (!c->merge_clusters || s < 2) return 0;
  if (c->sm90) return s <= 8 && c->merge_clusters[s] > 0 ? s : 0;
  for (int C = 8; C >= 2; C--)
    if (s % C == 0 && s / C <= SMLA_CUDA_FWD_MERGE_MAX_R && c->merge_clusters[C] > 0) return C;
  return 0;
}

/* Modelled microseconds of a forward of T rows in s splits of tps tiles, merged in the
 * kernel (clusters) or by the combine kernel. */
static double split_cost(const fwd_choice *c, const cuda_state *st, int num_heads, int64_t T,
                         int s, int64_t tps, int merged) {
  /* Blocks resident at once: every SM, or as many as the clusters of s fill. */
  int64_t resident = st->sm_count;
  const int C = merged ? merge_cluster_of(c, s) : 0;
  if (C && (int64_t)c->merge_clusters[C] * C < resident)
    resident = (int64_t)c->merge_clusters[C] * C;
  const int64_t blocks = T * c->groups * s;
  const int64_t active = blocks < resident ? blocks : resident;
  const int64_t waves = ceil_div(blocks, resident);
  double tile = c->tile_us;
  if (tile < TILE_LATENCY_US) tile = TILE_LATENCY_US;
  const double peak = st->mem_bytes_per_us > 0.0 ? st->mem_bytes_per_us
                                                 : DEFAULT_PEAK_BYTES_PER_US;
  const double share = (1.0 + (c->groups - 1) * GROUP_ROW_SHARE) / c->groups;
  const double mem = (double)SMLA_CUDA_FWD_BN * c->gather_bytes * (double)active * share /
                     (GATHER_FRAC * peak);
  if (tile < mem) tile = mem;
  double cost = (double)waves * ((double)tps * tile + c->wave_us);
  if (C)
    cost += c->wide_merge ? CLUSTER_MERGE_US + s * CLUSTER_MERGE_SPLIT_US
            : c->sm90   ? SM90S_MERGE_US
                        : DSMEM_MERGE_US + (s > C ? LAST_ARRIVER_US : 0.0);
  else if (s > 1)
    cost += COMBINE_FIXED_US +
            (double)T * num_heads * s * SMLA_DC * 4.0 * 2.0 / (COMBINE_FRAC * peak);
  return cost;
}

/* Splits, entries per split and merge (1: in the kernel) for T rows, by the cost model. */
static int auto_splits(const fwd_choice *c, const cuda_state *st, int num_heads, int topk,
                       int64_t T, int *split_len, int *merged) {
  *split_len = topk;
  *merged = 0;
  if (T * c->groups >= (int64_t)NO_SPLIT_WAVES * st->sm_count) return 1;
  double best = 1e300;
  int best_s = 1, best_len = topk, best_m = 0;
  const int max_s = c->ntiles < MAX_AUTO_SPLITS ? c->ntiles : MAX_AUTO_SPLITS;
  /* Splits of equal whole tiles where the tile count allows (it has a divisor other than
   * 1 and itself): the uneven 11 splits of 32 tiles the model preferred measured 8-12%
   * slower than 8 splits at each of the 3 shapes it was chosen for (H100, bench/RESULTS.md
   * session 17 call 3), as slow as 16. */
  int composite = 0;
  for (int d = 2; d * d <= c->ntiles && !composite; d++) composite = c->ntiles % d == 0;
  for (int s = 1; s <= max_s; s++) {
    const int64_t tps = ceil_div(c->ntiles, s);
    const int64_t s_eff = ceil_div(c->ntiles, tps);
    if (s_eff != s) continue; /* same tiles per split as a smaller s */
    if (composite && c->ntiles % s != 0) continue;
    for (int m = 0; m <= (merge_cluster_of(c, s) > 0); m++) {
      const double cost = split_cost(c, st, num_heads, T, s, tps, m);
      if (cost < best * 0.999) { /* ties go to fewer splits, then to the combine kernel */
        best = cost;
        best_s = s;
        best_len = (int)(tps * SMLA_CUDA_FWD_BN);
        best_m = m;
      }
    }
  }
  *split_len = best_s == 1 ? topk : best_len;
  *merged = best_m;
  return best_s;
}

/* Rows of T for which the batch-invariant plan fixes its splits: one wave of blocks. */
static int64_t invariant_rows(const fwd_choice *c, const cuda_state *st, int64_t max_tokens) {
  int64_t t = ceil_div(st->sm_count, c->groups);
  if (t > max_tokens) t = max_tokens;
  return t < 1 ? 1 : t;
}

static void forced_splits(int want, int topk, int *splits, int *split_len) {
  int s = want < topk ? want : topk;
  const int len = (int)ceil_div(topk, s);
  *splits = (int)ceil_div(topk, len); /* no empty split */
  *split_len = len;
}

static void plan_choice(const smla_plan *plan, fwd_choice *c) {
  memset(c, 0, sizeof *c);
  c->cfg.format = (int)plan->desc.format;
  c->cfg.dr = plan->desc.dr;
  c->cfg.mtiles = plan->heads_per_block / 16; /* the generic kernel's; unused on sm90 */
  c->sm90 = plan->kernel == KERNEL_SM90;
  c->hb = plan->heads_per_block;
  c->wide_merge = c->sm90 && c->hb == 64;
  c->cfg.pipe = c->sm90 ? 2 : plan->kernel;
  const int small = c->hb == 8 ? 0 : c->hb == 16 ? 1 : 2; /* the small-head kernel's */
  c->tile_us = !c->sm90 ? TILE_COMPUTE_US[c->cfg.mtiles]
               : c->hb < 64 ? SM90S_TILE_US[small] : SM90_TILE_COMPUTE_US;
  c->wave_us = !c->sm90 ? BLOCK_FIXED_US
               : c->hb < 64 ? SM90S_BLOCK_FIXED_US[small] : SM90_BLOCK_FIXED_US;
  c->groups = (int)ceil_div(plan->desc.num_heads, plan->heads_per_block);
  c->ntiles = (int)ceil_div(plan->desc.topk, SMLA_CUDA_FWD_BN);
  c->gather_bytes = (int)smla_cache_row_size(plan->desc.format, plan->desc.dr);
  c->merge_clusters =
      !(plan->desc.flags & SMLA_PLAN_SEPARATE_MERGE) ? plan->merge_clusters : NULL;
}

/* Splits for a forward of T rows under the plan's policy, and whether they merge in the
 * kernel, by the cost model (plan time only: the forward reads plan->split_table). A
 * batch-invariant plan fixes both from one T, so every row of every T is computed and
 * merged the same way. */
static int model_splits(const smla_plan *plan, const fwd_choice *c, const cuda_state *st,
                        int64_t T, int *split_len, int *merged) {
  const smla_plan_desc *d = &plan->desc;
  if (d->num_splits > 0) { /* forced: merged in the kernel wherever it can be */
    int s;
    forced_splits(d->num_splits, d->topk, &s, split_len);
    *merged = merge_cluster_of(c, s) > 0;
    return s;
  }
  const int64_t T_model = (d->flags & SMLA_PLAN_BATCH_INVARIANT)
                              ? invariant_rows(c, st, d->max_tokens) : T;
  return auto_splits(c, st, d->num_heads, d->topk, T_model, split_len, merged);
}

#define SPLIT_MERGED 0x80 /* split_table: the splits merge in the kernel */
_Static_assert(MAX_AUTO_SPLITS < SPLIT_MERGED, "split_table's count bits hold the model's");

/* The plan's split of T rows (from the table made by fill_split_table). */
static int plan_splits(const smla_plan *plan, const fwd_choice *c, int64_t T, int *split_len,
                       int *merged) {
  if (T > plan->split_rows) {
    *split_len = plan->split_len_rest;
    *merged = plan->split_rest_merged;
    return plan->split_rest;
  }
  const int e = plan->split_table[T - 1];
  const int s = e & ~SPLIT_MERGED;
  *merged = (e & SPLIT_MERGED) != 0;
  /* model_splits' lengths: the whole list unsplit, else whole tiles per split */
  *split_len = s == 1 ? plan->desc.topk : (int)(ceil_div(c->ntiles, s) * SMLA_CUDA_FWD_BN);
  return s;
}

/* Runs the cost model once per T that may split (T * groups below NO_SPLIT_WAVES waves,
 * and T <= max_tokens), so that a forward spends no host time on it. A forced or
 * batch-invariant policy has one split for every T and needs no table. */
static smla_status fill_split_table(smla_plan *plan, const fwd_choice *c,
                                    const cuda_state *st) {
  const smla_plan_desc *d = &plan->desc;
  int split_len, merged;
  plan->split_table = NULL;
  plan->split_rows = 0;
  if (d->num_splits > 0 || (d->flags & SMLA_PLAN_BATCH_INVARIANT)) {
    const int s = model_splits(plan, c, st, 1, &split_len, &merged);
    plan->split_rest = s; /* forced: up to 1024, so not in split_table's 8-bit code */
    plan->split_rest_merged = merged;
    plan->split_len_rest = split_len;
    return SMLA_OK;
  }
  const int64_t waves_rows = ceil_div((int64_t)NO_SPLIT_WAVES * st->sm_count, c->groups);
  const int64_t rows = waves_rows < d->max_tokens ? waves_rows : d->max_tokens;
  plan->split_table = malloc((size_t)rows);
  if (!plan->split_table)
    return smla_set_error(plan->ctx, SMLA_ERR_OUT_OF_MEMORY, "smla_plan_create: out of "
                          "host memory (%lld-byte split table)", (long long)rows);
  for (int64_t T = 1; T <= rows; T++) {
    const int s = model_splits(plan, c, st, T, &split_len, &merged);
    plan->split_table[T - 1] = (uint8_t)(s | (merged ? SPLIT_MERGED : 0));
  }
  plan->split_rows = rows;
  plan->split_rest = 1;
  plan->split_rest_merged = 0;
  plan->split_len_rest = d->topk;
  /* Beyond the table: T > max_tokens (refused before a forward gets here), or T * groups
   * >= NO_SPLIT_WAVES waves, where the model never splits; checked, not assumed. */
  if (rows < d->max_tokens && model_splits(plan, c, st, rows + 1, &split_len, &merged) != 1)
    return smla_set_error(plan->ctx, SMLA_ERR_INTERNAL, "smla_plan_create: the cost model "
                          "splits T = %lld, beyond its table", (long long)rows + 1);
  return SMLA_OK;
}

/* Whether s splits merged in the kernel take R > 1 clusters a row: the generic kernel's last
 * arriver, which needs the plan's merge counters and reads the other clusters' slices from
 * partial rows (the sm90 kernels merge a row in one cluster: merge_cluster_of is s). */
static int last_arriver_of(const fwd_choice *c, int s, int merged) {
  return merged && merge_cluster_of(c, s) < s;
}

/* Whether s splits (merged: in the kernel) write partial rows to the workspace: through the
 * combine kernel, or for the last arriver; not when one cluster holds a row's splits (its
 * blocks read each other's staged O over distributed shared memory). */
static int partials_of(const fwd_choice *c, int s, int merged) {
  return s > 1 && (!merged || last_arriver_of(c, s, merged));
}

/* Workspace bytes per partial row (t, split): out [N][512] float + lse [N] + max [N]. */
static size_t partial_row_bytes(int num_heads) {
  return (size_t)num_heads * (SMLA_DC * 4 + 4 + 4);
}

static const char *format_name(smla_cache_format f) {
  return f == SMLA_CACHE_BF16 ? "bf16" : f == SMLA_CACHE_FP8_TENSOR ? "fp8-tensor" : "fp8-ds";
}

/* The plan's kernel on the current device: how many clusters of `cluster` blocks can be
 * resident (0: none, or cluster < 2), and (generic kernel) *pdl, whether it may be a
 * programmatic dependent. A failed query counts as "cannot" (and is cleared: it is not
 * sticky, and later launch checks must not see it). */
static int kernel_caps(const fwd_choice *c, int cluster, int *pdl) {
  int n = 0;
  cudaError_t e;
  *pdl = 0;
  if (c->sm90) e = smla_cuda_fwd90_cluster_capacity(c->cfg.dr, c->hb, cluster, &n);
  else switch (c->cfg.format) {
  case SMLA_CACHE_BF16: e = smla_cuda_fwd_caps_bf16(&c->cfg, cluster, &n, pdl); break;
  case SMLA_CACHE_FP8_TENSOR: e = smla_cuda_fwd_caps_fp8(&c->cfg, cluster, &n, pdl); break;
  default: e = smla_cuda_fwd_caps_ds(&c->cfg, cluster, &n, pdl); break;
  }
  if (e == cudaSuccess) return n;
  (void)cudaGetLastError();
  *pdl = 0;
  return 0;
}

/* The describe's words for s splits merged in the kernel in clusters of C. */
static void merged_text(char *buf, size_t n, int wide_merge, int C, int s) {
  if (wide_merge)
    snprintf(buf, n, " merged in-kernel");
  else
    snprintf(buf, n, " merged in-kernel (%d clusters of %d)", s / C, C);
}

/* The fewest rows: at few rows most SMs idle, and more, narrower blocks (the small-head
 * kernel's shorter one-tile chain, the groups past the first reading the same rows from
 * L2), or the generic kernel's, can beat the plan's own kernel (H100, bench/RESULTS.md
 * session 19 call 2: N = 32 T = 4 in groups of 8 12.79 us against 17.09 in one group of
 * 32; N = 128 T = 1 in groups of 16 13.53 against 17.55 on the 64-head kernel). An sm_90
 * plan (its own head group and splits) weighs, at each T <= FEW_ROWS_MAX, its own kernel
 * against plans of the same shape in narrower groups (8, 16, 32 heads on the small-head
 * kernel; 16, 32, 64 on the generic one; at most 8 groups), by the cost model, and hands
 * each run of T that another wins to a plan of that kernel and group (the few-rows
 * chain: plan->small_t, whose own small_t takes the run below it, each with its own
 * workspace region). FEW_ROWS_MAX: what smla bench --paths measures the narrower groups
 * to; FEW_ROWS_LINKS: the runs kept (3 on the measured shapes: N = 64 in groups of 8,
 * 16, 32; N = 16 on an H200 in 8, 16, 8, where the model's margins are 1-2%). Each
 * candidate is planned twice (once to weigh it, once for its run's rows): plan time only.
 * Not under a forced split count, a forced head group or batch
 * invariance (a row's result would then depend on T through the kernel). */
#define FEW_ROWS_MAX 32
#define FEW_ROWS_LINKS 3
#define FEW_ROWS_CANDIDATES 6

typedef struct few_rows_cand {
  int portable; /* 1: the generic kernel */
  int hb;       /* heads a block (desc.heads_per_block) */
} few_rows_cand;

/* The candidates for N heads, in the order ties go (after the plan's own kernel). */
static int few_rows_candidates(int num_heads, few_rows_cand *out) {
  const int own = num_heads > 32 ? 64 : num_heads > 16 ? 32 : num_heads > 8 ? 16 : 8;
  int n = 0;
  for (int hb = 8; hb <= 32; hb *= 2)
    if (hb < own && ceil_div(num_heads, hb) <= 8) out[n++] = (few_rows_cand){0, hb};
  for (int hb = 16; hb <= 64; hb *= 2)
    if (hb <= (own > 16 ? own : 16) && ceil_div(num_heads, hb) <= 8)
      out[n++] = (few_rows_cand){1, hb};
  return n;
}

/* Heads a block of the sm_90a kernels for N heads and a forced cap (0: none; the plan's
 * desc.heads_per_block): the 64-head kernel for N > 32, else the fewest of 8, 16, 32 that
 * hold N, each at most the cap; 0 where the small-head kernel this build has does not
 * take that many (the generic kernel then). */
static int sm90_heads(int num_heads, int cap) {
  int hb = num_heads > 32 ? 64 : num_heads > 16 ? 32 : num_heads > 8 ? 16 : 8;
  if (cap > 0 && hb > cap) hb = cap;
  if (hb == 64) return 64;
  return smla_cuda_fwd90_small_heads(hb) == hb ? hb : 0;
}

static smla_status cuda_plan_init(smla_plan *plan, size_t *workspace_bytes);

/* Modelled microseconds of T rows on a plan: its split of T (the table) by split_cost. */
static double plan_cost(const smla_plan *plan, const cuda_state *st, int64_t T) {
  fwd_choice c;
  plan_choice(plan, &c);
  int split_len, merged;
  const int s = plan_splits(plan, &c, T, &split_len, &merged);
  return split_cost(&c, st, plan->desc.num_heads, T, s, ceil_div(c.ntiles, s), merged);
}

/* A plan of plan's shape and policy for T <= rows on the generic kernel (portable) or the
 * sm_90a kernels, in groups of hb heads; *bytes: its workspace. */
static smla_status sub_plan(const smla_plan *plan, int portable, int hb, int64_t rows,
                            smla_plan **out, size_t *bytes) {
  *out = NULL;
  *bytes = 0;
  smla_plan *g = calloc(1, sizeof *g);
  if (!g)
    return smla_set_error(plan->ctx, SMLA_ERR_OUT_OF_MEMORY, "smla_plan_create: out of "
                          "host memory");
  g->ctx = plan->ctx;
  g->desc = plan->desc;
  if (portable) g->desc.flags |= SMLA_PLAN_PORTABLE;
  g->desc.heads_per_block = hb;
  g->desc.max_tokens = rows;
  const smla_status s = cuda_plan_init(g, bytes);
  if (s != SMLA_OK) {
    smla_plan_free_host(g);
    return s;
  }
  *out = g;
  return SMLA_OK;
}

/* Builds plan's few-rows chain (see FEW_ROWS_MAX) after the plan itself is made: the
 * candidates are planned for T <= FEW_ROWS_MAX, the model picks one per T (ties to the
 * plan's own kernel, then to the earlier candidate), and each of the first FEW_ROWS_LINKS
 * runs of T up to the last that the plan does not win gets a plan made for its rows.
 * Grows *workspace_bytes by the chain's regions; adds "; T <= R: kernel, H heads/block"
 * to the description for each link, from the top. */
static smla_status few_rows_chain(smla_plan *plan, const cuda_state *st,
                                  size_t *workspace_bytes) {
  const smla_plan_desc *d = &plan->desc;
  const int64_t R = d->max_tokens < FEW_ROWS_MAX ? d->max_tokens : FEW_ROWS_MAX;
  few_rows_cand cand[FEW_ROWS_CANDIDATES];
  const int nc = few_rows_candidates(d->num_heads, cand);
  smla_plan *g[FEW_ROWS_CANDIDATES] = {0};
  smla_status s = SMLA_OK;
  for (int k = 0; k < nc && s == SMLA_OK; k++) {
    size_t bytes;
    s = sub_plan(plan, cand[k].portable, cand[k].hb, R, &g[k], &bytes);
    /* a candidate this device or build plans as another kernel or group: not weighed (the
     * small-head kernel built without that group, too little shared memory) */
    if (s == SMLA_OK && ((g[k]->kernel == KERNEL_SM90) == cand[k].portable ||
                         g[k]->heads_per_block != cand[k].hb)) {
      smla_plan_free_host(g[k]);
      g[k] = NULL;
    }
  }
  int8_t pick[FEW_ROWS_MAX]; /* by T - 1: a candidate, or -1 for the plan itself */
  int64_t last = 0;
  for (int64_t T = 1; T <= R && s == SMLA_OK; T++) {
    double best = plan_cost(plan, st, T);
    pick[T - 1] = -1;
    for (int k = 0; k < nc; k++) {
      const double v = g[k] ? plan_cost(g[k], st, T) : best;
      if (v < best * 0.999) {
        best = v;
        pick[T - 1] = (int8_t)k;
      }
    }
    if (pick[T - 1] >= 0) last = T;
  }
  for (int k = 0; k < nc; k++) smla_plan_free_host(g[k]);
  if (s != SMLA_OK) return s;
  int run_k[FEW_ROWS_LINKS];
  int64_t run_end[FEW_ROWS_LINKS];
  int nr = 0;
  for (int64_t T = 1; T <= last; T++) {
    if (nr > 0 && run_k[nr - 1] == pick[T - 1]) {
      run_end[nr - 1] = T;
      continue;
    }
    if (nr == FEW_ROWS_LINKS) break;
    run_k[nr] = pick[T - 1];
    run_end[nr++] = T;
  }
  while (nr > 0 && run_k[nr - 1] < 0) nr--; /* the plan's own kernel above the last link */
  smla_plan *below = NULL;
  size_t below_bytes = 0;
  for (int i = 0; i < nr; i++) { /* bottom up: each link holds the one below it */
    const int k = run_k[i];
    smla_plan *link;
    size_t bytes;
    s = sub_plan(plan, k >= 0 ? cand[k].portable : 0,
                 k >= 0 ? cand[k].hb : plan->heads_per_block, run_end[i], &link, &bytes);
    if (s != SMLA_OK) {
      smla_plan_free_host(below);
      return s;
    }
    if (below) {
      link->small_t = below;
      link->small_t_rows = below->desc.max_tokens;
      link->small_t_offset = (bytes + 255) / 256 * 256;
      bytes = link->small_t_offset + below_bytes;
    }
    below = link;
    below_bytes = bytes;
  }
  if (!below) return SMLA_OK;
  plan->small_t = below;
  plan->small_t_rows = below->desc.max_tokens;
  plan->small_t_offset = (*workspace_bytes + 255) / 256 * 256;
  *workspace_bytes = plan->small_t_offset + below_bytes;
  for (const smla_plan *l = plan->small_t; l; l = l->small_t) {
    const size_t n = strlen(plan->describe);
    snprintf(plan->describe + n, sizeof plan->describe - n, "; T <= %lld: %s, "
             "%d heads/block", (long long)l->desc.max_tokens,
             l->kernel == KERNEL_SM90 ? "cuda-sm90" : "cuda-generic", l->heads_per_block);
  }
  return SMLA_OK;
}

static smla_status cuda_plan_init(smla_plan *plan, size_t *workspace_bytes) {
  smla_context *ctx = plan->ctx;
  const cuda_state *st = ctx->backend_state;
  const smla_plan_desc *d = &plan->desc;
  const char *fn = "smla_plan_create";

  /* The sm_90a wgmma kernel where it applies: an sm_90 device (H100/H200), a BF16 cache
   * and N > 32 (64-head tiles), or the N the build gives the small-head kernel (8, 16 or
   * 32 heads on the wgmma N axis: N <= 32 by default, SMLA_FWD90_SMALL), unless the
   * caller asks for the portable kernels; the generic 16/32-head blocks take the other
   * N <= 32. desc.heads_per_block caps the heads a block (N then runs in several groups);
   * the fewest rows may go to another kernel or head group (few_rows_chain). */
  const int hb90 = sm90_heads(d->num_heads, d->heads_per_block);
  const uint32_t smem90 = hb90 ? smla_cuda_fwd90_smem_bytes(d->dr, hb90) : 0;
  const int sm90 = st->cc_major == 9 && st->cc_minor == 0 && d->format == SMLA_CACHE_BF16 &&
                   hb90 > 0 && !(d->flags & SMLA_PLAN_PORTABLE) &&
                   (int)smem90 <= st->smem_optin;
  /* Else heads per block: the fewest m16 tiles that hold N (at most 4 = 64 heads), then
   * the deepest pipeline that fits the device's shared memory; fewer heads if none fits. */
  int mtiles = d->num_heads <= 16 ? 1 : d->num_heads <= 32 ? 2 : 4;
  while (d->heads_per_block > 0 && 16 * mtiles > d->heads_per_block && mtiles > 1) mtiles /= 2;
  int pipe = sm90 ? 2 : -1;
  while (!sm90) {
    const int deepest = 2, shallowest = d->format == SMLA_CACHE_BF16 ? 1 : 0;
    for (int p = deepest; p >= shallowest; p--) {
      const smla_cuda_fwd_layout L = smla_cuda_fwd_layout_of((int)d->format, d->dr, mtiles, p);
      if ((int)L.total <= st->smem_optin) {
        pipe = p;
        break;
      }
    }
    if (pipe >= 0 || mtiles == 1) break;
    mtiles /= 2;
  }
  if (pipe < 0)
    return smla_set_error(ctx, SMLA_ERR_UNSUPPORTED, "%s: device %d allows %d bytes of shared "
                          "memory per block, too few for the generic forward", fn,
                          ctx->device, st->smem_optin);
  plan->heads_per_block = sm90 ? hb90 : 16 * mtiles;
  plan->kernel = sm90 ? KERNEL_SM90 : pipe;

  fwd_choice c;
  plan_choice(plan, &c);
  const smla_cuda_fwd_layout L = smla_cuda_fwd_layout_of(c.cfg.format, c.cfg.dr, mtiles, pipe);

  /* Kernel attribute: may use all the opt-in shared memory (a permission, not a size). */
  int prev;
  smla_status s = device_enter(ctx, fn, &prev);
  if (s != SMLA_OK) return s;
  cudaError_t e;
  if (sm90) {
    e = smla_cuda_fwd90_prepare(d->dr, hb90, st->smem_optin);
  } else switch (d->format) {
  case SMLA_CACHE_BF16: e = smla_cuda_fwd_prepare_bf16(&c.cfg, st->smem_optin); break;
  case SMLA_CACHE_FP8_TENSOR: e = smla_cuda_fwd_prepare_fp8(&c.cfg, st->smem_optin); break;
  default: e = smla_cuda_fwd_prepare_ds(&c.cfg, st->smem_optin); break;
  }
  if (e == cudaSuccess) e = smla_cuda_merge_prepare(&plan->combine_pdl);
  s = launched(ctx, prev, e, "smla_plan_create: cudaFuncSetAttribute");
  if (s != SMLA_OK) return s;
  /* Forwards of 2..8 splits a cluster may merge inside the kernel where such a cluster can
   * be resident (the sm90 kernels: one cluster per (t, head group), the 64-head kernel's
   * and, in SMLA_FWD90S_MERGE builds, the small-head kernel's, through distributed shared
   * memory; the generic kernel: R clusters of C, merged through distributed shared
   * memory and, for R > 1, by the last cluster to finish); the
   * cost model picks per split count. A device, driver or binary without cluster launch
   * (the query fails, or says 0) gets the combine kernel for every split count. The
   * generic kernel is also launched as a programmatic dependent where its code has
   * griddepcontrol (sm_90 machine code). */
  memset(plan->merge_clusters, 0, sizeof plan->merge_clusters);
  int merge_lo = 0, merge_hi = 0, pdl = 0;
  s = device_enter(ctx, fn, &prev);
  if (s != SMLA_OK) return s;
  if (!sm90) (void)kernel_caps(&c, 1, &pdl);
  else pdl = c.hb < 64; /* the small-head kernel; the 64-head one measured slower at N =
                          128 T = 1 as a dependent (forward_wgmma.cu, SMLA_FWD90_PDL) */
  plan->forward_pdl = pdl && st->cc_major >= 9;
  for (int k = 2; k <= 8 && !(d->flags & SMLA_PLAN_SEPARATE_MERGE); k++) {
    const int n = kernel_caps(&c, k, &pdl);
    if (n > 0) {
      plan->merge_clusters[k] = n;
      if (!merge_lo) merge_lo = k;
      merge_hi = k;
    }
  }
  device_leave(ctx, prev);
  char loop[96] = "";
  if (sm90) snprintf(loop, sizeof loop, ", %s", smla_cuda_fwd90_variant(hb90));
  char merge[128] = "";
  if (merge_lo) {
    int n = snprintf(merge, sizeof merge, "; in-kernel merge for %d-%d splits (resident "
                     "clusters of %d..%d:", merge_lo, merge_hi, merge_lo, merge_hi);
    for (int k = merge_lo; k <= merge_hi && n > 0 && n < (int)sizeof merge; k++)
      n += snprintf(merge + n, sizeof merge - (size_t)n, " %d", plan->merge_clusters[k]);
    if (n > 0 && n < (int)sizeof merge) snprintf(merge + n, sizeof merge - (size_t)n, ")");
  }

  s = fill_split_table(plan, &c, st);
  if (s != SMLA_OK) return s;
  /* Partial rows the workspace must hold: max over T <= max_tokens of T * splits(T), over
   * the T whose splits leave the kernel as partial rows (partials_of). */
  int64_t cap = 0;
  int split_len, merged, s_one = plan_splits(plan, &c, 1, &split_len, &merged);
  const int merged_one = merged;
  const int s_max = plan_splits(plan, &c, d->max_tokens, &split_len, &merged);
  const int merged_max = merged;
  /* Merge counters (generic kernel, R > 1 clusters a row): rows of T that need them. */
  int64_t crow = 0;
  if (!plan->split_table) {
    cap = partials_of(&c, s_one, merged_one) ? d->max_tokens * s_one : 0;
    if (last_arriver_of(&c, s_one, merged_one)) crow = d->max_tokens;
  } else {
    for (int64_t T = 1; T <= plan->split_rows; T++) {
      const int k = plan->split_table[T - 1] & ~SPLIT_MERGED;
      const int m = (plan->split_table[T - 1] & SPLIT_MERGED) != 0;
      if (partials_of(&c, k, m) && T * k > cap) cap = T * k;
      if (last_arriver_of(&c, k, m)) crow = T;
    }
  }
  /* The grid is (row, head group, split) in one dimension of at most 2^31-1 blocks. */
  const int64_t grid_max = (cap > d->max_tokens ? cap : d->max_tokens) * c.groups;
  if (grid_max > INT32_MAX)
    return smla_set_error(ctx, SMLA_ERR_UNSUPPORTED, "%s: max_tokens = %lld needs %lld blocks "
                          "per launch, beyond the 2^31-1 of one grid dimension", fn,
                          (long long)d->max_tokens, (long long)grid_max);
  plan->num_splits = s_max;
  plan->partial_rows = cap;
  plan->counter_rows = crow;
  const size_t part_bytes = (size_t)cap * partial_row_bytes(d->num_heads);
  plan->counters_offset = crow ? (part_bytes + 255) / 256 * 256 : part_bytes;
  *workspace_bytes = plan->counters_offset + (size_t)crow * c.groups * 8 * sizeof(int32_t);

  /* "merged in-kernel", with the clusters of a DSMEM merge: C a cluster x R a row */
  char m_one[48] = "", m_max[48] = "";
  const int c_one = merged_one ? merge_cluster_of(&c, s_one) : 0;
  const int c_max = merged_max ? merge_cluster_of(&c, s_max) : 0;
  if (c_one) merged_text(m_one, sizeof m_one, c.wide_merge, c_one, s_one);
  if (c_max) merged_text(m_max, sizeof m_max, c.wide_merge, c_max, s_max);

  const char *policy = d->num_splits > 0 ? "forced"
                       : (d->flags & SMLA_PLAN_BATCH_INVARIANT) ? "batch-invariant, fixed"
                                                                : "per T by cost model";
  snprintf(plan->describe, sizeof plan->describe,
           "%s: %s dr=%d, %d heads/block x %d groups, %s %d (%u KB smem), "
           "%s bf16%s%s; splits %s (T=1: %d%s, T=%lld: %d%s; %d SMs, %.2f TB/s%s); "
           "%lld partial rows%s",
           sm90 ? "cuda-sm90" : "cuda-generic", format_name(d->format), d->dr,
           plan->heads_per_block, c.groups,
           d->format == SMLA_CACHE_BF16 ? "kv stages" : "fp8 staging", pipe,
           (unsigned)((sm90 ? smem90 : L.total) / 1024), sm90 ? "wgmma" : "mma.sync", loop,
           plan->forward_pdl ? ", programmatic launch" : "", policy, s_one, m_one,
           (long long)d->max_tokens, s_max, m_max, st->sm_count,
           (st->mem_bytes_per_us > 0.0 ? st->mem_bytes_per_us : DEFAULT_PEAK_BYTES_PER_US) * 1e-6,
           st->mem_bytes_per_us > 0.0 ? "" : " assumed", (long long)cap, merge);
  /* The fewest rows on other kernels or narrower head groups where the model says those
   * are faster (few_rows_chain). */
  if (sm90 && d->num_splits == 0 && d->heads_per_block == 0 &&
      !(d->flags & SMLA_PLAN_BATCH_INVARIANT))
    return few_rows_chain(plan, st, workspace_bytes);
  return SMLA_OK;
}

/* The merge counters start at zero (each forward leaves them so): a memset on the legacy
 * stream, waited for, once per plan (plan creation may synchronize; it is refused during
 * capture). */
static smla_status cuda_plan_ready(smla_plan *plan) {
  if (plan->small_t) { /* the few-rows plan: its region of this plan's workspace */
    smla_plan *g = plan->small_t;
    g->workspace = plan->workspace ? (char *)plan->workspace + plan->small_t_offset : NULL;
    g->workspace_bytes = plan->workspace_bytes - plan->small_t_offset;
    const smla_status s = cuda_plan_ready(g);
    if (s != SMLA_OK) return s;
  }
  if (plan->counter_rows == 0) return SMLA_OK;
  smla_context *ctx = plan->ctx;
  const int64_t groups = ceil_div(plan->desc.num_heads, plan->heads_per_block);
  const size_t bytes = (size_t)(plan->counter_rows * groups * 8) * sizeof(int32_t);
  int prev;
  smla_status s = device_enter(ctx, "smla_plan_create", &prev);
  if (s != SMLA_OK) return s;
  cudaError_t e = cudaMemsetAsync((char *)plan->workspace + plan->counters_offset, 0, bytes,
                                  cudaStreamLegacy);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  device_leave(ctx, prev);
  if (e == cudaSuccess) return SMLA_OK;
  if (is_capture_error(e)) {
    (void)cudaGetLastError();
    return smla_set_error(ctx, SMLA_ERR_CAPTURING, "smla_plan_create: zeroing the plan's "
                          "merge counters during CUDA graph capture (%s); create plans "
                          "before capturing", cudaGetErrorString(e));
  }
  return cuda_fail(ctx, e, "smla_plan_create: zeroing the merge counters");
}

/* ---- forward --------------------------------------------------------------------------- */

static smla_status cuda_forward(smla_plan *plan, const smla_forward_params *p,
                                const smla_convert_params *indices, void *stream) {
  if (plan->small_t && p->num_tokens <= plan->small_t_rows)
    return cuda_forward(plan->small_t, p, indices, stream);
  smla_context *ctx = plan->ctx;
  const char *fn = "smla_forward";
  fwd_choice c;
  plan_choice(plan, &c);
  const int64_t T = p->num_tokens;
  const int N = p->num_heads;
  int split_len, merged;
  const int splits = plan_splits(plan, &c, T, &split_len, &merged);

  smla_cuda_fwd_args a;
  memset(&a, 0, sizeof a);
  a.num_tokens = T;
  a.num_heads = N;
  a.topk = p->topk;
  a.groups = c.groups;
  a.num_splits = splits;
  a.split_len = split_len;
  a.q_nope = (const uint16_t *)p->q_nope;
  a.q_nope_stride_t = p->q_nope_stride_t;
  a.q_nope_stride_h = p->q_nope_stride_h;
  a.q_pe = c.cfg.dr > 0 ? (const uint16_t *)p->q_pe : (const uint16_t *)p->q_nope;
  a.q_pe_stride_t = p->q_pe_stride_t;
  a.q_pe_stride_h = p->q_pe_stride_h;
  a.cache = (const uint8_t *)p->cache.data;
  a.num_slots = p->cache.num_slots;
  a.row_bytes = p->cache.row_bytes;
  a.slots = p->slots;
  a.slots_stride = p->slots_stride;
  a.lengths = p->lengths;
  if (indices) { /* converted inside the kernel as each entry is read */
    a.slots = indices->local;
    a.slots_stride = indices->local_stride;
    a.conv.req_id = indices->req_id;
    a.conv.block_table = indices->block_table;
    a.conv.num_requests = indices->num_requests;
    a.conv.blocks_per_request = indices->blocks_per_request;
    a.conv.block_table_stride = indices->block_table_stride;
    a.conv.block_size = indices->block_size;
    a.conv.block_shift = block_shift_of(indices->block_size);
    a.conv.cp_size = indices->cp_size;
    a.conv.cp_rank = indices->cp_rank;
    a.conv.cp_interleave = indices->cp_interleave > 0 ? indices->cp_interleave : 1;
  }
  const int tensor = p->cache.format == SMLA_CACHE_FP8_TENSOR;
  a.logit_scale = tensor ? p->sm_scale * p->cache.scale : p->sm_scale;
  a.value_scale = tensor ? p->cache.scale : 1.0f;
  a.softcap = p->softcap;
  a.sink = p->sink;
  a.out = (uint16_t *)p->out;
  a.out_stride_t = p->out_stride_t;
  a.out_stride_h = p->out_stride_h;
  a.lse = p->lse;
  a.lse_stride_t = p->lse_stride_t;
  a.max_logit = p->max_logit;
  a.max_logit_stride_t = p->max_logit_stride_t;
  a.bad_inputs = (unsigned long long *)p->bad_inputs;
  a.cluster_merge = merged ? merge_cluster_of(&c, splits) : 0;
  a.pdl = plan->forward_pdl;
  a.resident_blocks = ((const cuda_state *)ctx->backend_state)->sm_count;
  if (last_arriver_of(&c, splits, merged)) { /* R > 1 clusters a row */
    if (T > plan->counter_rows)
      return smla_set_error(ctx, SMLA_ERR_INTERNAL, "%s: T = %lld needs merge counters the "
                            "plan has for %lld rows only", fn, (long long)T,
                            (long long)plan->counter_rows);
    a.merge_counters = (int *)((char *)plan->workspace + plan->counters_offset);
  }

  const int64_t part_stride_p = T * N; /* in (t, h) rows */
  int64_t cap = 0;
  if (partials_of(&c, splits, merged)) {
    cap = plan->workspace ? plan->partial_rows : 0;
    if (T * splits > cap)
      return smla_set_error(ctx, SMLA_ERR_INTERNAL, "%s: %lld rows x %d splits exceed the "
                            "plan's workspace of %lld partial rows", fn, (long long)T, splits,
                            (long long)cap);
    a.part_out = (float *)plan->workspace;
    a.part_lse = (float *)((char *)plan->workspace + (size_t)cap * N * SMLA_DC * 4);
    a.part_max = a.part_lse + cap * N;
  }

  int prev;
  smla_status s = device_enter(ctx, fn, &prev);
  if (s != SMLA_OK) return s;
  cudaError_t e;
  if (c.sm90) {
    e = smla_cuda_fwd90_launch(c.cfg.dr, c.hb, &a, stream);
  } else switch (p->cache.format) {
  case SMLA_CACHE_BF16: e = smla_cuda_fwd_launch_bf16(&c.cfg, &a, stream); break;
  case SMLA_CACHE_FP8_TENSOR: e = smla_cuda_fwd_launch_fp8(&c.cfg, &a, stream); break;
  default: e = smla_cuda_fwd_launch_ds(&c.cfg, &a, stream); break;
  }
  if (e != cudaSuccess || splits == 1 || a.cluster_merge)
    return launched(ctx, prev, e, "smla_forward: kernel");

  smla_cuda_merge_args m;
  memset(&m, 0, sizeof m);
  m.num_partials = splits;
  m.num_tokens = T;
  m.num_heads = N;
  m.dv = SMLA_DC;
  m.out_p = a.part_out;
  m.out_p_stride_p = part_stride_p * SMLA_DC;
  m.out_p_stride_t = (int64_t)N * SMLA_DC;
  m.out_p_stride_h = SMLA_DC;
  m.lse_p = a.part_lse;
  m.lse_p_stride_p = part_stride_p;
  m.lse_p_stride_t = N;
  m.max_p = a.part_max;
  m.max_p_stride_p = part_stride_p;
  m.max_p_stride_t = N;
  m.out = p->out;
  m.out_bf16 = 1;
  m.out_stride_t = p->out_stride_t;
  m.out_stride_h = p->out_stride_h;
  m.lse = p->lse;
  m.lse_stride_t = p->lse_stride_t;
  m.max_logit = p->max_logit;
  m.max_logit_stride_t = p->max_logit_stride_t;
  m.sink = p->sink;
  m.dense = 1; /* the forward writes every partial row (zeros where lse = -inf) */
  /* The sm90 forward triggers it after its tile loop, the generic one (a.pdl) at its start */
  m.pdl = (c.sm90 || a.pdl) && plan->combine_pdl;
  m.fixed_order = (plan->desc.flags & SMLA_PLAN_BATCH_INVARIANT) != 0;
  return launched(ctx, prev, smla_cuda_merge(&m, stream), "smla_forward: combine kernel");
}

const smla_backend smla_cuda_backend = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .convert = cuda_convert,
    .cache_write = cuda_cache_write,
    .merge = cuda_merge,
    .plan_init = cuda_plan_init,
    .plan_ready = cuda_plan_ready,
    .forward = cuda_forward,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .check_not_capturing = cuda_check_not_capturing,
};
