/*
 * numerics.h: the bit-level number formats, shared by the CPU backend and the CUDA kernels
 * so that both write bit-identical caches. Plain C, also compiled by nvcc (SMLA_HD).
 *
 * bf16: the top 16 bits of an IEEE float; float -> bf16 rounds to nearest-even, NaN stays
 *   NaN (quiet). e4m3 (OCP E4M3FN): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 *   infinities; S.1111.111 is NaN; largest finite 448 = 1.75 * 2^8; smallest subnormal 2^-9.
 */
#ifndef SMLA_NUMERICS_H
#define SMLA_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SMLA_HD __host__ __device__ __forceinline__
#else
#define SMLA_HD static inline
#endif

SMLA_HD uint32_t smla_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

SMLA_HD float smla_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

SMLA_HD float smla_bf16_to_f32(uint16_t h) { return smla_bits_f32((uint32_t)h << 16); }

SMLA_HD uint16_t smla_f32_to_bf16(float f) {
  uint32_t u = smla_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

/* e4m3 byte -> float (exact). */
SMLA_HD float smla_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15u && m == 7u) return smla_bits_f32(sign | 0x7fc00000u);
  if (e == 0u) { /* subnormal: m * 2^-9 */
    const float v = (float)m * 0.001953125f;
    return sign ? -v : v;
  }
  /* normal: rebias 7 -> 127 and widen the mantissa 3 -> 23 bits */
  return smla_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* float -> e4m3, round to nearest-even, saturating at +-448 (Inf too); NaN -> NaN. */
SMLA_HD uint8_t smla_f32_to_e4m3(float f) {
  const uint32_t u = smla_f32_bits(f);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 */
  if (a < 0x3c800000u) {                                /* < 2^-6: subnormal range */
    /* q = round(|f| * 2^9), 0..8; 8 becomes the smallest normal (bits 0x08) exactly. */
    const float q = rintf(smla_bits_f32(a) * 512.0f);
    return (uint8_t)(sign | (uint8_t)q);
  }
  /* normal: keep 3 of 23 mantissa bits, rounding to nearest-even on the bit pattern;
   * a carry out of the mantissa bumps the exponent, which is the right result. */
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  r >>= 20;                       /* exponent(8) | mantissa(3), float bias */
  r -= (120u << 3);               /* rebias 127 -> 7 */
  if (r > 0x7eu) r = 0x7eu;       /* rounding up past 448 saturates */
  return (uint8_t)(sign | r);
}

/* FP8_DS group scale: 2^ceil(log2(max(amax / 448, 1e-4))), computed exactly. */
SMLA_HD float smla_ds_scale(float amax) {
  float x = amax / 448.0f;
  if (!(x >= 1e-4f)) x = 1e-4f; /* also catches NaN */
  if (x > 3.0e38f) x = 3.0e38f; /* Inf amax: largest power of two below FLT_MAX */
  const uint32_t u = smla_f32_bits(x);
  int e = (int)((u >> 23) & 0xffu) - 127; /* x = 1.m * 2^e, x normal here */
  if (u & 0x7fffffu) e += 1;              /* not a power of two: round the log up */
  if (e > 127) e = 127;
  return smla_bits_f32((uint32_t)(e + 127) << 23);
}

/* log(exp(a) + exp(b)) for a, b not +inf or NaN (-inf allowed), without overflow: the sink
 * rule of the merge (smla.h, merge). */
SMLA_HD float smla_logaddexpf(float a, float b) {
  const float hi = a > b ? a : b, lo = a > b ? b : a;
  if (lo == -INFINITY) return hi;
  return hi + log1pf(expf(lo - hi));
}

#endif /* SMLA_NUMERICS_H */
