/*
 * forward_common.cuh: pieces the sparse-MLA forward kernels share (the generic mma.sync
 * kernel in forward_impl.cuh and the sm_90a wgmma kernel in sm90/forward_wgmma.cu):
 * format ids, bf16 packing, and the loader's per-entry slot fetch and used/bad test.
 */
#ifndef SMLA_CUDA_FORWARD_COMMON_CUH
#define SMLA_CUDA_FORWARD_COMMON_CUH

#include "kernels.h"
#include "ptx.cuh"

#include <cuda_bf16.h>
#include <math.h>

#define FMT_BF16 0
#define FMT_FP8 1
#define FMT_DS 2

#define FWD_BN SMLA_CUDA_FWD_BN
#define FWD_LOG2E 1.4426950408889634f

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(const uint32_t *)&v;
}

/* The next slot a loader thread needs: entry ks + tile * BN + lr, or -1 past the end. */
__device__ __forceinline__ int32_t slot_at(const int32_t *slot_row, int ks, int kend, int tile,
                                           int lr) {
  const int k = ks + tile * FWD_BN + lr;
  return k < kend ? __ldg(slot_row + k) : -1;
}

/* Entry state of one loader row: used (read it), counted as bad (>= S or < -1). */
__device__ __forceinline__ bool entry_used(const smla_cuda_fwd_args &a, int32_t s, int k,
                                           int kend, int lp, unsigned *bad) {
  const bool in_range = k < kend;
  const bool used = in_range && s >= 0 && (int64_t)s < a.num_slots;
  if (lp == 0 && in_range && (s < -1 || (int64_t)s >= a.num_slots)) (*bad)++;
  return used;
}

/* What one block of the forward grid works on: blocks are numbered (t, split, group) with
 * the group fastest; entries [ks, kend) of row t (the split clamped by lengths[t]). */
struct fwd_block {
  int64_t t;
  int grp, split, ks, kend, ntiles;
  const int32_t *slot_row;
};

__device__ __forceinline__ fwd_block fwd_block_of(const smla_cuda_fwd_args &a) {
  fwd_block b;
  const int64_t bid = blockIdx.x;
  b.grp = (int)(bid % a.groups);
  const int64_t rest = bid / a.groups;
  b.split = (int)(rest % a.num_splits);
  b.t = rest / a.num_splits;
  int len = a.topk;
  if (a.lengths) len = min(max(a.lengths[b.t], 0), a.topk);
  b.ks = b.split * a.split_len;
  b.kend = min(min(b.ks + a.split_len, a.topk), len);
  b.ntiles = b.kend > b.ks ? (b.kend - b.ks + FWD_BN - 1) / FWD_BN : 0;
  b.slot_row = a.slots + b.t * a.slots_stride;
  return b;
}

#endif /* SMLA_CUDA_FORWARD_COMMON_CUH */
