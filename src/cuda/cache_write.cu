/*
 * cache_write.cu: concat-and-cache (SPEC §2), bit-identical to the CPU writer: the same
 * numerics.h conversions on the same float values (float(bf16) / scale, IEEE division).
 *
 * One block of 128 threads per token; each thread owns 4 consecutive latent values, so
 * an FP8_DS group of 128 values is exactly one warp and its amax is one warp reduction.
 * Bytes per token: 1152 read + 576..1152 written; memory-bound, ~2-3 us for 4K tokens.
 */
#include "kernels.h"
#include "numerics.h"

#include <limits.h>

#define WRITE_THREADS 128 /* 512 latent values / 4 per thread */

/* v / scale (IEEE division), except that a NaN v passes through with its sign: the GPU's
 * arithmetic returns the canonical (positive) NaN, the CPU's keeps the operand's, and the
 * e4m3 NaN keeps the sign (0x7f | sign). */
__device__ __forceinline__ float div_keep_nan(float v, float scale) {
  return v != v ? v : v / scale;
}

__global__ void __launch_bounds__(WRITE_THREADS)
    cache_write_kernel(const smla_cuda_cache_write_args a) {
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t slot = a.slot[t];
  if (slot < 0) return; /* padding */
  if (slot >= a.num_slots) {
    if (tid == 0 && a.bad_inputs) atomicAdd(a.bad_inputs, 1ull);
    return;
  }
  uint8_t *row = a.cache + slot * a.row_bytes;
  const uint16_t *kv = a.kv_c + t * a.kv_c_stride;
  const uint16_t *pe = a.k_pe ? a.k_pe + t * a.k_pe_stride : NULL;

  if (a.format == 0) { /* BF16: a copy, 16 bytes per thread */
    const int chunks = (512 + a.dr) / 8;
    for (int c = tid; c < chunks; c += WRITE_THREADS) {
      const uint4 v = c < 64 ? *(const uint4 *)(kv + 8 * c) : *(const uint4 *)(pe + 8 * (c - 64));
      *(uint4 *)(row + 16 * c) = v;
    }
    return;
  }

  if (a.format == 1) { /* FP8_TENSOR: every value / scale */
    const int quads = (512 + a.dr) / 4;
    for (int c = tid; c < quads; c += WRITE_THREADS) {
      const uint2 v = c < 128 ? *(const uint2 *)(kv + 4 * c) : *(const uint2 *)(pe + 4 * (c - 128));
      const uint16_t h[4] = {(uint16_t)(v.x & 0xffffu), (uint16_t)(v.x >> 16),
                             (uint16_t)(v.y & 0xffffu), (uint16_t)(v.y >> 16)};
      uint32_t packed = 0;
      for (int i = 0; i < 4; i++)
        packed |= (uint32_t)smla_f32_to_e4m3(div_keep_nan(smla_bf16_to_f32(h[i]), a.scale))
                  << (8 * i);
      *(uint32_t *)(row + 4 * c) = packed;
    }
    return;
  }

  /* FP8_DS: warp w quantizes group w with scale 2^ceil(log2(max(amax / 448, 1e-4))). */
  const uint2 v = *(const uint2 *)(kv + 4 * tid);
  const uint16_t h[4] = {(uint16_t)(v.x & 0xffffu), (uint16_t)(v.x >> 16),
                         (uint16_t)(v.y & 0xffffu), (uint16_t)(v.y >> 16)};
  float f[4], amax = 0.0f;
  for (int i = 0; i < 4; i++) {
    f[i] = smla_bf16_to_f32(h[i]);
    amax = fmaxf(amax, fabsf(f[i])); /* fmaxf skips NaN, as the CPU writer does */
  }
  /* amax is >= 0 and never NaN: its bit pattern orders like the value. */
  amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
  const float scale = smla_ds_scale(amax);
  uint32_t packed = 0;
  for (int i = 0; i < 4; i++)
    packed |= (uint32_t)smla_f32_to_e4m3(div_keep_nan(f[i], scale)) << (8 * i);
  *(uint32_t *)(row + 4 * tid) = packed;
  if ((tid & 31) == 0) *(float *)(row + 512 + 4 * (tid >> 5)) = scale;
  if (tid < a.dr / 8) *(uint4 *)(row + 528 + 16 * tid) = *(const uint4 *)(pe + 8 * tid);
}

extern "C" cudaError_t smla_cuda_cache_write(const smla_cuda_cache_write_args *a, void *stream) {
  if (a->num_tokens <= 0) return cudaSuccess;
  if (a->num_tokens > INT_MAX) return cudaErrorInvalidValue; /* one block per token */
  cache_write_kernel<<<(unsigned)a->num_tokens, WRITE_THREADS, 0, (cudaStream_t)stream>>>(*a);
  return cudaGetLastError();
}
