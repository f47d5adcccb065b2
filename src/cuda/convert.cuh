/*
 * convert.cuh: one entry of the index conversion (SPEC §1, smla.h), shared by the convert
 * kernel (convert.cu) and the forward kernels' fused variant (smla_forward_indices).
 */
#ifndef SMLA_CUDA_CONVERT_CUH
#define SMLA_CUDA_CONVERT_CUH

#include "kernels.h"

#include <limits.h>

/* Slot of request-local position p of request r, or -1 when the entry is invalid. */
__device__ __forceinline__ int32_t convert_one(const smla_cuda_convert_args &a, int32_t r,
                                               int32_t p) {
  if (r < 0 || r >= a.num_requests || p < 0) return -1;
  if (a.cp_size >= 2) { /* this rank's entries only, at their local position */
    const int64_t il = a.cp_interleave;
    if ((p / il) % a.cp_size != a.cp_rank) return -1;
    p = (int32_t)((p / (il * a.cp_size)) * il + p % il);
  }
  const int32_t bi = a.block_shift >= 0 ? p >> a.block_shift : p / a.block_size;
  if (bi >= a.blocks_per_request) return -1;
  const int32_t blk = a.block_table[(int64_t)r * a.block_table_stride + bi];
  if (blk < 0) return -1;
  const int32_t off = a.block_shift >= 0 ? p & (a.block_size - 1) : p - bi * a.block_size;
  const int64_t slot = (int64_t)blk * a.block_size + off;
  return slot > INT32_MAX ? -1 : (int32_t)slot;
}

#endif /* SMLA_CUDA_CONVERT_CUH */
