/*
 * kernels.h: the generic CUDA kernels' launchers (the .cu files of src/cuda/), called by
 * the host glue src/cuda/backend.c. Private to src/cuda/.
 *
 * Every launcher enqueues on `stream` (a cudaStream_t; NULL = legacy stream), never
 * synchronizes, allocates or reads device memory on the host, and returns
 * cudaGetLastError() after its launches (cudaSuccess when there was nothing to do). The
 * args structs carry validated values only (src/api.c checked shapes, strides, alignment);
 * the kernels only defend against hostile device data (slots, indices, NaN).
 *
 * Strides are in elements of the tensor's own type, as in smla.h.
 */
#ifndef SMLA_CUDA_KERNELS_H
#define SMLA_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- 1. convert indices (convert.cu) --------------------------------------------------- */
typedef struct smla_cuda_convert_args {
  int64_t num_tokens;          /* T >= 1 */
  int topk;                    /* K */
  const int32_t *req_id;       /* [T] */
  const int32_t *block_table;  /* [R][B], row stride block_table_stride */
  int num_requests, blocks_per_request;
  int64_t block_table_stride;
  int block_size;
  int block_shift;             /* log2(block_size) when a power of two, else -1: a shift and a
                                  mask instead of a division (the fused sm90 forward converts
                                  each entry in many threads: at N = 128 T = 64 it executed
                                  41% more instructions than the unfused launch, ncu
                                  2026-12-06, most of them these conversions) */
  const int32_t *local;        /* [T][K], row stride local_stride */
  int64_t local_stride;
  int32_t *slots;              /* [T][K] out, row stride slots_stride */
  int64_t slots_stride;
  int32_t *valid;              /* [T] out; may be NULL */
  int compact;
  int cp_size, cp_rank, cp_interleave; /* context-parallel filter: cp_size >= 2, I >= 1 */
} smla_cuda_convert_args;

cudaError_t smla_cuda_convert(const smla_cuda_convert_args *a, void *stream);

/* ---- 2. cache write (cache_write.cu) --------------------------------------------------- */
typedef struct smla_cuda_cache_write_args {
  int64_t num_tokens;          /* T >= 1 */
  const uint16_t *kv_c;        /* [T][512] bf16 bits, row stride kv_c_stride */
  int64_t kv_c_stride;
  const uint16_t *k_pe;        /* [T][dr] bf16 bits, row stride k_pe_stride; NULL iff dr == 0 */
  int64_t k_pe_stride;
  const int64_t *slot;         /* [T] */
  int format;                  /* smla_cache_format */
  int dr;                      /* 64 or 0 */
  int64_t num_slots, row_bytes;
  uint8_t *cache;              /* [S][row_bytes] */
  float scale;                 /* FP8_TENSOR */
  unsigned long long *bad_inputs; /* may be NULL */
} smla_cuda_cache_write_args;

cudaError_t smla_cuda_cache_write(const smla_cuda_cache_write_args *a, void *stream);

/* ---- 3. merge partial states (merge.cu); also the forward's split-KV combine ----------- */
typedef struct smla_cuda_merge_args {
  int num_partials;            /* P >= 1 */
  int64_t num_tokens;          /* T >= 1 */
  int num_heads;               /* N >= 1 */
  int dv;                      /* 1..512 */
  const void *out_p;           /* [P][T][N][dv], float or bf16 */
  int out_p_bf16;
  int64_t out_p_stride_p, out_p_stride_t, out_p_stride_h;
  const float *lse_p;          /* [P][T][N], head stride 1 */
  int64_t lse_p_stride_p, lse_p_stride_t;
  const float *max_p;          /* [P][T][N] per-partial max logit; may be NULL */
  int64_t max_p_stride_p, max_p_stride_t;
  void *out;                   /* [T][N][dv], float or bf16 */
  int out_bf16;
  int64_t out_stride_t, out_stride_h;
  float *lse;                  /* [T][N]; may be NULL */
  int64_t lse_stride_t;
  float *max_logit;            /* [T][N] = max over p of max_p; NULL unless max_p is set */
  int64_t max_logit_stride_t;
  const float *sink;           /* [N]: out *= 1 / (1 + exp(sink[h] - lse)); may be NULL */
  int sinked;                  /* 1: the partials are sinked forwards' outputs (the public
                                  merge with a sink, smla.h): weights exp(lae(lse_p, s) -
                                  lae(lse, s)) and no factor. Only merge_kernel (v1) runs. */
  int dense;                   /* 1: every partial row is written, -inf ones too (the
                                  forward's): loads may be issued before the lse is known */
  int pdl;                     /* 1: merge3 / merge4 are launched as programmatic dependents
                                  of the previous kernel on the stream (a forward: the sm90
                                  one triggers after its tile loop, the generic one at its
                                  start); they wait for its completion. v1 is always a
                                  plain launch (merge.cu says why). */
  int fixed_order;             /* 1: the summation order may depend on P only, not on T or
                                  N (batch-invariant plans): no merge3_kernel */
} smla_cuda_merge_args;

cudaError_t smla_cuda_merge(const smla_cuda_merge_args *a, void *stream);
/* At plan creation, on the plan's device: the merge kernels ask for the shared-memory
 * carveout the forward kernels use (so that the SMs are not reconfigured between the
 * two), and *pdl_ok says whether the combine's binary can wait for a programmatic launch
 * (its griddepcontrol.wait exists in sm_90+ code only: a build JIT-compiled from sm_80
 * PTX must not be launched as a dependent). */
cudaError_t smla_cuda_merge_prepare(int *pdl_ok);

/* ---- 4. forward (forward_bf16.cu, forward_fp8.cu, forward_ds.cu) ----------------------- */

/* Entries (KV rows) per tile: one cp.async stage, one softmax step. */
#define SMLA_CUDA_FWD_BN 64
/* Threads per forward block: 8 warps. */
#define SMLA_CUDA_FWD_THREADS 256

/* A forward kernel variant. Compile time: format, dr, mtiles (heads per block = 16 *
 * mtiles: 1, 2 or 4). Run time: pipe = cp.async stages of bf16 KV tiles (1 or 2) for the
 * BF16 format; for the fp8 formats the number of raw-tile staging buffers (0: rows are
 * loaded through registers, no overlap; 1 or 2: tiles in flight while one computes). */
typedef struct smla_cuda_fwd_config {
  int format, dr, mtiles, pipe;
} smla_cuda_fwd_config;

typedef struct smla_cuda_fwd_args {
  int64_t num_tokens;          /* T >= 1 */
  int num_heads, topk;         /* N, K */
  int groups;                  /* head groups: ceil(N / (16 * mtiles)) */
  int num_splits;              /* KV splits per row, >= 1 */
  int split_len;               /* entries per split (last one shorter) */
  const uint16_t *q_nope;      /* [T][N][512] */
  int64_t q_nope_stride_t, q_nope_stride_h;
  const uint16_t *q_pe;        /* [T][N][dr]; unused when dr == 0 */
  int64_t q_pe_stride_t, q_pe_stride_h;
  const uint8_t *cache;        /* [S][row_bytes] */
  int64_t num_slots, row_bytes;
  const int32_t *slots;        /* [T][K], row stride slots_stride */
  int64_t slots_stride;
  const int32_t *lengths;      /* [T]; may be NULL */
  float logit_scale;           /* sm_scale, times cache.scale for FP8_TENSOR */
  float value_scale;           /* 1, or cache.scale for FP8_TENSOR */
  float softcap;               /* > 0: on */
  const float *sink;           /* [N]; may be NULL; used where the kernel writes the final
                                  row (one split, or merged in the kernel) */
  /* num_splits == 1: final outputs */
  uint16_t *out;               /* [T][N][512] bf16 */
  int64_t out_stride_t, out_stride_h;
  float *lse;                  /* [T][N]; may be NULL */
  int64_t lse_stride_t;
  float *max_logit;            /* [T][N]; may be NULL */
  int64_t max_logit_stride_t;
  /* num_splits > 1: partial states, index (split * T + t) * N + h */
  float *part_out;             /* [splits][T][N][512], normalized by the split's own sum */
  float *part_lse;             /* [splits][T][N]; -inf: the split saw no used entry */
  float *part_max;             /* [splits][T][N] */
  /* cluster_merge = C >= 2: the splits merge inside the kernel, no combine kernel. Blocks
   * are numbered (t, group, split), split fastest, and launched as clusters of C
   * consecutive splits. sm90 kernels: C == num_splits (2..8); the 64-head kernel sums each
   * block's columns over the blocks' staged O (distributed shared memory, no part_out), the
   * small-head one as the generic kernel's R = 1 below.
   * Generic kernel (sm_90 code only: smla_cuda_fwd_caps): R = num_splits / C clusters a
   * (t, group); the blocks of a cluster merge through distributed shared memory
   * (fwd_dsmem_merge, which the small-head kernel calls too), block k owning
   * float4 columns [128 k / C, 128 (k + 1) / C); with R > 1, block k of each cluster
   * writes its merged slice (unnormalized, relative to the cluster's max) to part_out row
   * (r * T + t) * N + h and the cluster's max and sum to part_max / part_lse at ((k * R +
   * r) * T + t) * N + h, then counts itself on merge_counters; the block that counts last
   * merges the R slices into the final row and sets its counter back to 0. */
  int cluster_merge;
  int *merge_counters;         /* generic, R > 1: [T][groups][8], zero between launches */
  int pdl;                     /* launched as a programmatic dependent of the stream's
                                  previous kernel (waits for it before its first global
                                  access; generic: needs sm_90 code, smla_cuda_fwd_caps;
                                  sm90: the plan asks it for the small-head kernel only) */
  unsigned long long *bad_inputs; /* may be NULL */
  /* Blocks of one SM's worth each that the device holds at once (its SM count). The sm90
   * 64-head kernel with one split and no cluster merge runs as a persistent grid of at
   * most this many blocks, block b taking units b, b + grid, .. (SMLA_FWD90_PERSIST); 0,
   * and every other kernel: one block a unit. */
  int resident_blocks;
  /* smla_forward_indices: conv.req_id != NULL; then slots / slots_stride are the request-
   * local positions (conv.local), each converted by convert_one as read (conv.slots,
   * valid, compact unused). */
  smla_cuda_convert_args conv;
} smla_cuda_fwd_args;

/* Shared-memory layout of a variant, in bytes from the dynamic smem base (all offsets
 * 16-byte aligned). Shared by the host (plan sizing) and the kernels (carving). */
typedef struct smla_cuda_fwd_layout {
  uint32_t q;      /* [16*mtiles][dqk] bf16, 16-byte chunks XOR-swizzled by row */
  uint32_t kv;     /* [kv_bufs][64][dqk] bf16, swizzled like q */
  uint32_t raw;    /* [raw_bufs][64][raw_row] fp8 rows as stored in the cache */
  uint32_t p;      /* [p_bufs][16*mtiles][64] bf16 probabilities, swizzled; FP8_DS: one
                    * buffer per group g of 128 output columns, P times the entries'
                    * group-g scales */
  uint32_t red;    /* [128] float: per-warp row maxima / sums */
  uint32_t alpha;  /* [16*mtiles] float: rescale factor of the running output */
  uint32_t rowmax; /* [16*mtiles] float: final row max */
  uint32_t mask;   /* [4][64] uint8: entry used, per tile (tile & 3) */
  uint32_t scale;  /* FP8_DS: [64][4] float group scales of the tile's rows (else empty) */
  uint32_t warm;   /* [16] uint32 scratch, written only (SMLA_FWD_WARM_PARAMS) */
  uint32_t total;
  int kv_bufs, raw_bufs, raw_row, p_bufs;
} smla_cuda_fwd_layout;

#ifdef __CUDACC__
#define SMLA_CUDA_HD __host__ __device__ __forceinline__
#else
#define SMLA_CUDA_HD static inline
#endif

SMLA_CUDA_HD smla_cuda_fwd_layout smla_cuda_fwd_layout_of(int format, int dr, int mtiles,
                                                         int pipe) {
  smla_cuda_fwd_layout l;
  const uint32_t dqk = 512u + (uint32_t)dr, m = 16u * (uint32_t)mtiles;
  const uint32_t bn = SMLA_CUDA_FWD_BN;
  l.kv_bufs = format == 0 ? pipe : 1;
  l.raw_bufs = format == 0 ? 0 : pipe;
  l.raw_row = format == 1 ? (int)dqk : format == 2 ? 528 + 2 * dr : 0;
  l.p_bufs = format == 2 ? 4 : 1;
  l.q = 0;
  l.kv = l.q + m * dqk * 2u;
  l.raw = l.kv + (uint32_t)l.kv_bufs * bn * dqk * 2u;
  l.p = l.raw + (uint32_t)l.raw_bufs * bn * (uint32_t)l.raw_row;
  l.red = l.p + (uint32_t)l.p_bufs * m * bn * 2u;
  l.alpha = l.red + 128u * 4u;
  l.rowmax = l.alpha + m * 4u;
  l.mask = l.rowmax + m * 4u;
  l.scale = l.mask + 4u * bn;
  l.warm = l.scale + (format == 2 ? bn * 16u : 0u);
  l.total = l.warm + 64u;
  return l;
}

/* What the generic kernel of a variant can do on the current device (call after
 * prepare): *pdl_ok, whether it may be launched as a programmatic dependent (args.pdl;
 * its machine code came from sm_90+ PTX, which has griddepcontrol); with cluster >= 2,
 * *clusters = how many clusters of that many blocks can be resident at once (0: none, or
 * the kernel has no cluster code, or the staged O does not fit the variant). */
cudaError_t smla_cuda_fwd_caps_bf16(const smla_cuda_fwd_config *c, int cluster, int *clusters,
                                    int *pdl_ok);
cudaError_t smla_cuda_fwd_caps_fp8(const smla_cuda_fwd_config *c, int cluster, int *clusters,
                                   int *pdl_ok);
cudaError_t smla_cuda_fwd_caps_ds(const smla_cuda_fwd_config *c, int cluster, int *clusters,
                                  int *pdl_ok);
/* The staged O of the generic kernel's in-kernel merge: floats a row (16 x 8 rows of a
 * warp's float2 writes on distinct banks). Fits below L.red for every variant the plan
 * lets merge (checked there). */
#define SMLA_CUDA_FWD_OST_STRIDE 520
/* The generic kernel's in-kernel merge: clusters a (t, head group) at most (R). */
#define SMLA_CUDA_FWD_MERGE_MAX_R 16

/* Per-format entry points (one translation unit each). prepare lets the variant's kernel
 * use up to max_smem bytes of dynamic shared memory (cudaFuncSetAttribute: host-side, call
 * outside graph capture, at plan creation). launch: grid T * groups * num_splits blocks of
 * SMLA_CUDA_FWD_THREADS threads. */
cudaError_t smla_cuda_fwd_prepare_bf16(const smla_cuda_fwd_config *c, int max_smem);
cudaError_t smla_cuda_fwd_prepare_fp8(const smla_cuda_fwd_config *c, int max_smem);
cudaError_t smla_cuda_fwd_prepare_ds(const smla_cuda_fwd_config *c, int max_smem);
cudaError_t smla_cuda_fwd_launch_bf16(const smla_cuda_fwd_config *c,
                                      const smla_cuda_fwd_args *a, void *stream);
cudaError_t smla_cuda_fwd_launch_fp8(const smla_cuda_fwd_config *c,
                                     const smla_cuda_fwd_args *a, void *stream);
cudaError_t smla_cuda_fwd_launch_ds(const smla_cuda_fwd_config *c,
                                    const smla_cuda_fwd_args *a, void *stream);

/* The sm_90a wgmma forward (src/cuda/sm90/forward_wgmma.cu): BF16 cache, hb = 64 heads per
 * block (v11) or hb = 8, 16 or 32 (the small-head kernel; 8 or 16 only where built with
 * SMLA_FWD90_SMALL=1: smla_cuda_fwd90_small_heads says which for N); the same args, grid (T
 * * groups * num_splits blocks) and partial states as the generic kernel. Machine code for
 * sm_90a only: launch it on sm_90 devices. */
int smla_cuda_fwd90_small_heads(int num_heads); /* 0: none for this N in this build */
const char *smla_cuda_fwd90_variant(int hb);
uint32_t smla_cuda_fwd90_smem_bytes(int dr, int hb);
cudaError_t smla_cuda_fwd90_prepare(int dr, int hb, int max_smem);
cudaError_t smla_cuda_fwd90_launch(int dr, int hb, const smla_cuda_fwd_args *a, void *stream);
/* How many clusters of `splits` blocks of the sm90 forward can be resident at once (0: a
 * cluster of that size cannot run, or hb < 64: the small-head kernel never merges in the
 * kernel). Call after smla_cuda_fwd90_prepare. */
cudaError_t smla_cuda_fwd90_cluster_capacity(int dr, int hb, int splits, int *clusters);

#ifdef __cplusplus
}
#endif
#endif /* SMLA_CUDA_KERNELS_H */
