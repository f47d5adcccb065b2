/*
 * gather.cu: the gather-only microbenchmark of issue 21 (build/gather_bench, sm_90a).
 *
 * What sets the ceiling of the byte-bound forward (N <= 64): how fast one SM, and all of
 * them, can bring 64 random cache rows (1152 bytes each for bf16, Dr = 64) into shared
 * memory, with nothing else running. Each block (one per SM: the stages take over half the
 * shared memory) gathers `tiles` tiles of 64 rows, drawn at random from a pool of 262144
 * rows (302 MB, 5x the L2), into a ring of 2 or 3 stages, and consumes each tile by reading
 * one word per row (so the tile must have landed). Ways of copying:
 *   cpasync     cp.async.cg 16-byte copies by 128 threads, one commit group per tile
 *   cpasync256  the same with the .L2::256B prefetch hint
 *   bulk        one cp.async.bulk (the copy engine) per row, issued by one warp,
 *               completing on the stage's mbarrier
 *   multicast2  a 2-block cluster: each block issues half of the rows with
 *               .multicast::cluster, so every row lands in both blocks (the N = 128
 *               design: each row read once from memory for both head groups)
 *   cpasync32   cp.async as above with 32-row tiles (4 threads a row), 2..4 stages: the
 *               same bytes in flight in finer steps
 *   cpasync32x2 the same, two blocks per SM (each half the shared memory): does a second
 *               block's requests lift the per-SM rate (a per-block limit) or not (DRAM)?
 *   cpasync2wg  64-row tiles copied by 256 threads (two gather warpgroups) of one block:
 *               is the second block's lift (cpasync32x2) a matter of threads issuing, which
 *               one block can have too?
 *   cpasync3wg  the same by 384 threads (6 a row): v23's gathers, where the two
 *               accumulator warpgroups refill their own column blocks beside the gather
 *               warpgroup (docs/design/cuda-sm90-forward.md, v23)
 *   mixed       one block of 128 threads: rows 0-31 of each tile by cp.async (64 threads),
 *               rows 32-63 by one cp.async.bulk a row (a warp), both landing on the stage's
 *               mbarrier: does the copy engine add its rate to the load path's, so that one
 *               SM brings a tile in well under cp.async's ~1.6 us?
 * for 1, 16, 66 and all SMs (x2 blocks for cpasync32x2). Prints microseconds per run, TB/s of rows delivered into
 * shared memory (multicast: both copies counted) and of rows read from memory, and the
 * per-SM rate, beside the device-to-device copy ceiling of the same run.
 *
 *   build/gather_bench [--row-bytes 1152] [--pool 262144] [--tiles 96] [--reps 10]
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 64      /* rows per tile (the forward's BN) */
#define THREADS 128  /* one warpgroup: the forward's gather warpgroup */

#define BENCH_NAME "gather_bench"
#include "bench_ck.cuh"

enum { WAY_CPASYNC, WAY_CPASYNC256, WAY_BULK, WAY_MULTICAST2, WAY_CPASYNC32, WAY_CPASYNC32X2,
       WAY_CPASYNC2WG, WAY_MIXED, WAY_CPASYNC3WG, NUM_WAYS };
static const char *way_name[NUM_WAYS] = {"cpasync",   "cpasync256", "bulk",
                                         "multicast2", "cpasync32",  "cpasync32x2",
                                         "cpasync2wg", "mixed",      "cpasync3wg"};
/* rows a tile, and blocks an SM */
static const int way_rows[NUM_WAYS] = {ROWS, ROWS, ROWS, ROWS, 32, 32, ROWS, ROWS, ROWS};
static const int way_per_sm[NUM_WAYS] = {1, 1, 1, 1, 1, 2, 1, 1, 1};

typedef struct gather_args {
  const uint8_t *pool;
  const int32_t *idx; /* [cluster][tile][rows]: a cluster's blocks share their rows */
  int row_bytes, tiles, stages;
  int rows; /* rows a tile (cp.async ways; the bulk ways use ROWS) */
  unsigned long long *sink;
} gather_args;

__device__ __forceinline__ uint32_t sa(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

/* Arrive on the mbarrier at the same offset in cluster block `rank` (release, cluster). */
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

/* Waits for the phase of that parity (acquire at cluster scope: covers remote arrivals). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nW_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra W_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_row(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void bulk_row_mc(uint32_t dst, const void *src, uint32_t bytes,
                                            uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* The consumer: one word of every row of the stage (rows = 32 or 64). */
__device__ __forceinline__ unsigned touch(const uint8_t *stage, int row_bytes, int rows) {
  const int tid = threadIdx.x;
  return *(const unsigned *)(stage + (size_t)(tid % rows) * row_bytes + 4 * (tid / rows));
}

/* cp.async: THREADS / rows threads per row (thread tpr r + j copies chunks j, j + tpr, ...
 * of row r); one commit group per tile, stages - 1 tiles in flight ahead of the one
 * consumed. */
template <int HINT>
__device__ __forceinline__ void cpasync_issue(const gather_args &a, const int32_t *idx,
                                              uint8_t *smem, int tile) {
  const int tpr = (int)blockDim.x / a.rows, tid = threadIdx.x, r = tid / tpr;
  const int chunks = a.row_bytes / 16;
  const uint8_t *src = a.pool + (size_t)idx[tile * a.rows + r] * a.row_bytes;
  const uint32_t dst =
      sa(smem + (size_t)(tile % a.stages) * a.rows * a.row_bytes + (size_t)r * a.row_bytes);
  for (int c = tid % tpr; c < chunks; c += tpr) {
    if (HINT)
      asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst + 16 * c),
                   "l"(src + 16 * c)
                   : "memory");
    else
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * c),
                   "l"(src + 16 * c)
                   : "memory");
  }
}

template <int HINT>
__global__ void __launch_bounds__(3 * THREADS, 1) gather_cpasync(const gather_args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int32_t *idx = a.idx + (size_t)blockIdx.x * a.tiles * a.rows;
  unsigned acc = 0;
  for (int t = 0; t < a.stages - 1; t++) {
    if (t < a.tiles) cpasync_issue<HINT>(a, idx, smem, t);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int t = 0; t < a.tiles; t++) {
    if (t + a.stages - 1 < a.tiles) cpasync_issue<HINT>(a, idx, smem, t + a.stages - 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    /* stages - 1 groups may stay pending: tile t's group has landed */
    if (a.stages == 4) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
    else if (a.stages == 3) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads();
    acc += touch(smem + (size_t)(t % a.stages) * a.rows * a.row_bytes, a.row_bytes, a.rows);
    __syncthreads(); /* the stage is refilled next */
  }
  if (acc == 0x9e3779b9u) atomicAdd(a.sink, 1ull); /* keeps the reads */
}

/* Warp 0: the rows of `tile` this block issues (CL = 2: its half, to both blocks). */
template <int CL>
__device__ __forceinline__ void bulk_issue(const gather_args &a, const int32_t *idx,
                                           uint8_t *smem, uint64_t *full, uint32_t rank,
                                           int tile) {
  const int lane = threadIdx.x & 31, s = tile % a.stages;
  const uint32_t bar = sa(&full[s]);
  if (lane == 0) mbar_expect_tx(bar, (uint32_t)ROWS * a.row_bytes); /* all rows land here */
  __syncwarp();
  uint8_t *st = smem + (size_t)s * ROWS * a.row_bytes;
  for (int r = (int)rank * (ROWS / CL) + lane; r < ((int)rank + 1) * (ROWS / CL); r += 32) {
    const uint8_t *src = a.pool + (size_t)idx[tile * ROWS + r] * a.row_bytes;
    const uint32_t dst = sa(st + (size_t)r * a.row_bytes);
    if (CL > 1) bulk_row_mc(dst, src, (uint32_t)a.row_bytes, bar, (uint16_t)((1u << CL) - 1));
    else bulk_row(dst, src, (uint32_t)a.row_bytes, bar);
  }
}

/* Copy engine, one cp.async.bulk per row. CL = 1: the block's own rows. CL = 2: a cluster
 * of two blocks; each issues half of every tile's rows, multicast to both. full[s]: the
 * stage's bytes have landed (one expect_tx arrival + the tile's bytes); empty[s]: every
 * block of the cluster has consumed the stage (CL arrivals), so it may be refilled. */
template <int CL>
__global__ void __launch_bounds__(THREADS, 1) gather_bulk(const gather_args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[4], empty[4];
  const int tid = threadIdx.x, warp = tid >> 5;
  const uint32_t stage_bytes = (uint32_t)ROWS * a.row_bytes;
  const uint32_t rank = CL > 1 ? cluster_rank() : 0;
  const int32_t *idx = a.idx + (size_t)(blockIdx.x / CL) * a.tiles * ROWS;
  if (tid == 0) {
    for (int s = 0; s < a.stages; s++) {
      mbar_init(sa(&full[s]), 1);
      mbar_init(sa(&empty[s]), CL);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (CL > 1) cluster_sync(); /* the partner's barriers exist before any copy lands */
  else __syncthreads();
  unsigned acc = 0;
  if (warp == 0)
    for (int t = 0; t < a.stages && t < a.tiles; t++) bulk_issue<CL>(a, idx, smem, full, rank, t);
  for (int t = 0; t < a.tiles; t++) {
    const int s = t % a.stages;
    mbar_wait(sa(&full[s]), (uint32_t)(t / a.stages) & 1u);
    acc += touch(smem + (size_t)s * stage_bytes, a.row_bytes, ROWS);
    __syncthreads(); /* every thread of this block is done with the stage */
    if (tid == 0)
      for (uint32_t k = 0; k < (uint32_t)CL; k++) {
        if (CL > 1) mbar_arrive_cluster(sa(&empty[s]), k);
        else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sa(&empty[s]))
                          : "memory");
      }
    const int next = t + a.stages;
    if (warp == 0 && next < a.tiles) {
      mbar_wait(sa(&empty[s]), (uint32_t)(t / a.stages) & 1u); /* both blocks consumed */
      bulk_issue<CL>(a, idx, smem, full, rank, next);
    }
  }
  if (CL > 1) cluster_sync(); /* no copy or arrival may target a block that has exited */
  if (acc == 0x9e3779b9u) atomicAdd(a.sink, 1ull);
}

/* mixed: warps 0-1 copy rows 0-31 of a tile by cp.async (2 threads a row, each arriving on
 * the stage's full barrier once its copies land: cp.async.mbarrier.arrive.noinc), warp 2
 * rows 32-63 by one cp.async.bulk a row (its lane 0 posts the bytes with expect_tx). full[s]
 * counts the 64 cp.async threads and the one expect_tx arrival. */
__device__ __forceinline__ void mixed_issue(const gather_args &a, const int32_t *idx,
                                            uint8_t *smem, uint64_t *full, int tile) {
  const int tid = threadIdx.x, s = tile % a.stages;
  const uint32_t bar = sa(&full[s]);
  uint8_t *st = smem + (size_t)s * ROWS * a.row_bytes;
  if (tid < 64) {
    const int r = tid >> 1, chunks = a.row_bytes / 16;
    const uint8_t *src = a.pool + (size_t)idx[tile * ROWS + r] * a.row_bytes;
    const uint32_t dst = sa(st + (size_t)r * a.row_bytes);
    for (int c = tid & 1; c < chunks; c += 2)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 16 * c),
                   "l"(src + 16 * c)
                   : "memory");
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
  } else if (tid < 96) {
    const int lane = tid & 31, r = 32 + lane;
    if (lane == 0) mbar_expect_tx(bar, 32u * (uint32_t)a.row_bytes);
    __syncwarp();
    bulk_row(sa(st + (size_t)r * a.row_bytes),
             a.pool + (size_t)idx[tile * ROWS + r] * a.row_bytes, (uint32_t)a.row_bytes, bar);
  }
}

__global__ void __launch_bounds__(THREADS, 1) gather_mixed(const gather_args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[4];
  const int tid = threadIdx.x;
  const int32_t *idx = a.idx + (size_t)blockIdx.x * a.tiles * ROWS;
  if (tid == 0)
    for (int s = 0; s < a.stages; s++) mbar_init(sa(&full[s]), 65);
  __syncthreads();
  unsigned acc = 0;
  for (int t = 0; t < a.stages && t < a.tiles; t++) mixed_issue(a, idx, smem, full, t);
  for (int t = 0; t < a.tiles; t++) {
    const int s = t % a.stages;
    mbar_wait(sa(&full[s]), (uint32_t)(t / a.stages) & 1u);
    acc += touch(smem + (size_t)s * ROWS * a.row_bytes, a.row_bytes, ROWS);
    __syncthreads(); /* every thread is done with the stage */
    if (t + a.stages < a.tiles) mixed_issue(a, idx, smem, full, t + a.stages);
  }
  if (acc == 0x9e3779b9u) atomicAdd(a.sink, 1ull);
}

static int cmp_float(const void *x, const void *y) {
  const float a = *(const float *)x, b = *(const float *)y;
  return (a > b) - (a < b);
}

static float median(float *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_float);
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* One launch of `way` on `blocks` blocks; returns its median time in microseconds. */
static float run_way(int way, int blocks, int stages, const gather_args *a, int reps,
                     cudaEvent_t e0, cudaEvent_t e1) {
  const size_t smem = (size_t)stages * a->rows * a->row_bytes;
  float *t = (float *)malloc(sizeof(float) * (size_t)reps);
  for (int r = -2; r < reps; r++) { /* two warm-ups */
    CK(cudaEventRecord(e0));
    if (way == WAY_CPASYNC || way == WAY_CPASYNC32 || way == WAY_CPASYNC32X2) {
      gather_cpasync<0><<<blocks, THREADS, smem>>>(*a);
    } else if (way == WAY_CPASYNC2WG) {
      gather_cpasync<0><<<blocks, 2 * THREADS, smem>>>(*a);
    } else if (way == WAY_CPASYNC3WG) {
      gather_cpasync<0><<<blocks, 3 * THREADS, smem>>>(*a);
    } else if (way == WAY_MIXED) {
      gather_mixed<<<blocks, THREADS, smem>>>(*a);
    } else if (way == WAY_CPASYNC256) {
      gather_cpasync<1><<<blocks, THREADS, smem>>>(*a);
    } else if (way == WAY_BULK) {
      gather_bulk<1><<<blocks, THREADS, smem>>>(*a);
    } else {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = 2;
      at[0].val.clusterDim.y = 1;
      at[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3((unsigned)blocks);
      cfg.blockDim = dim3(THREADS);
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, gather_bulk<2>, *a));
    }
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 0) t[r] = 1e3f * ms;
  }
  const float m = median(t, reps);
  free(t);
  return m;
}

int main(int argc, char **argv) {
  int row_bytes = 1152, pool_rows = 262144, tiles = 96, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--row-bytes")) row_bytes = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--pool")) pool_rows = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tiles")) tiles = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: gather_bench [--row-bytes B] [--pool ROWS] [--tiles T] [--reps R]\n");
      return 2;
    }
  }
  if (row_bytes % 16 || row_bytes < 16 || pool_rows < ROWS || tiles < 1 || reps < 1) {
    fprintf(stderr, "gather_bench: --row-bytes must be a multiple of 16, --pool >= %d\n", ROWS);
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t pool_bytes = (size_t)pool_rows * row_bytes;
  uint8_t *pool;
  int32_t *idx;
  unsigned long long *sink;
  CK(cudaMalloc(&pool, pool_bytes));
  CK(cudaMemset(pool, 0x3c, pool_bytes));
  const size_t nidx = (size_t)sms * tiles * ROWS;
  int32_t *h = (int32_t *)malloc(nidx * sizeof *h);
  uint64_t x = 0x243f6a8885a308d3ull;
  for (size_t i = 0; i < nidx; i++) { /* xorshift64*: random rows, repeats allowed */
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    h[i] = (int32_t)(((x * 0x2545f4914f6cdd1dull) >> 33) % (uint64_t)pool_rows);
  }
  CK(cudaMalloc(&idx, nidx * sizeof *idx));
  CK(cudaMemcpy(idx, h, nidx * sizeof *idx, cudaMemcpyHostToDevice));
  free(h);
  CK(cudaMalloc(&sink, sizeof *sink));
  /* (cpasync32x2: twice the blocks at half the rows: the same index count) */
  CK(cudaFuncSetAttribute(gather_cpasync<0>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)prop.sharedMemPerBlockOptin));
  CK(cudaFuncSetAttribute(gather_cpasync<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)prop.sharedMemPerBlockOptin));
  CK(cudaFuncSetAttribute(gather_mixed, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)prop.sharedMemPerBlockOptin - 1024));
  CK(cudaFuncSetAttribute(gather_bulk<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)prop.sharedMemPerBlockOptin - 1024));
  CK(cudaFuncSetAttribute(gather_bulk<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)prop.sharedMemPerBlockOptin - 1024));

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  /* The copy ceiling of this run: 1 GiB device to device, read + written. */
  {
    const size_t n = (size_t)1 << 30;
    void *s, *d;
    CK(cudaMalloc(&s, n));
    CK(cudaMalloc(&d, n));
    float t[5];
    for (int r = -1; r < 5; r++) {
      CK(cudaEventRecord(e0));
      CK(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 0) t[r] = ms;
    }
    printf("gather_bench: %s, %d SMs; copy ceiling %.2f TB/s (1 GiB device to device, "
           "read+written)\n",
           prop.name, sms, 2.0 * n / (median(t, 5) * 1e-3) * 1e-12);
    CK(cudaFree(s));
    CK(cudaFree(d));
  }
  printf("rows of %d bytes, %d per tile, %d tiles per block, pool %d rows (%.0f MB); median of "
         "%d\n\n",
         row_bytes, ROWS, tiles, pool_rows, pool_bytes * 1e-6, reps);
  printf("%-11s %6s %6s %10s %10s %10s %12s %11s\n", "way", "blocks", "stages", "us",
         "TB/s_smem", "TB/s_mem", "GB/s_per_SM", "us_per_tile");
  const int counts[4] = {1, 16, 66, sms};
  for (int way = 0; way < NUM_WAYS; way++) {
    /* stages that fit: per_sm blocks share the SM's shared memory */
    const size_t stage_bytes = (size_t)way_rows[way] * row_bytes;
    const int fit = (int)(prop.sharedMemPerMultiprocessor / way_per_sm[way] / stage_bytes);
    const int fit_block = (int)(prop.sharedMemPerBlockOptin / stage_bytes);
    const int max_st = way_rows[way] == ROWS ? 3 : 4;
    for (int stages = 2; stages <= max_st && stages <= fit && stages <= fit_block; stages++)
      for (int c = 0; c < 4; c++) {
        int blocks = counts[c] * way_per_sm[way];
        if (way == WAY_MULTICAST2) blocks = blocks < 2 ? 2 : blocks & ~1;
        gather_args a;
        a.pool = pool;
        a.idx = idx;
        a.row_bytes = row_bytes;
        a.tiles = tiles;
        a.stages = stages;
        a.rows = way_rows[way];
        a.sink = sink;
        const float us = run_way(way, blocks, stages, &a, reps, e0, e1);
        const double smem_bytes = (double)blocks * tiles * a.rows * row_bytes;
        const double mem_bytes = way == WAY_MULTICAST2 ? smem_bytes / 2 : smem_bytes;
        printf("%-11s %6d %6d %10.1f %10.3f %10.3f %12.1f %11.3f\n", way_name[way], blocks,
               stages, us, smem_bytes / (us * 1e-6) * 1e-12, mem_bytes / (us * 1e-6) * 1e-12,
               smem_bytes / (blocks / way_per_sm[way]) / (us * 1e-6) * 1e-9, us / tiles);
        fflush(stdout);
      }
  }
  CK(cudaFree(pool));
  CK(cudaFree(idx));
  CK(cudaFree(sink));
  return 0;
}
