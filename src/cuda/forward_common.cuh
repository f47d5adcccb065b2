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

/* Source of 16-byte chunk c (of 8 bf16) of head `head`'s q row: chunks 0..63 from q_nope,
 * the rest from q_pe. Heads past N get a dummy pointer; load them with 0 source bytes. */
__device__ __forceinline__ const uint16_t *q_chunk_src(const smla_cuda_fwd_args &a, int64_t t,
                                                       int head, int c) {
  if (head >= a.num_heads) return a.q_nope;
  return c < 64 ? a.q_nope + t * a.q_nope_stride_t + head * a.q_nope_stride_h + 8 * c
                : a.q_pe + t * a.q_pe_stride_t + head * a.q_pe_stride_h + 8 * (c - 64);
}

/* One (t, head) row's epilogue, from its sum of weights l and max m: with one split, the
 * final bf16 row `out` scaled by f (the 1/l, sink and FP8_TENSOR value scale; 0 when no
 * entry was used) and lse / max_logit; with several, the partial row `part` (NULL when
 * l == 0: a -inf partial is never read) and its lse / max. `writer`: the one thread of
 * the row that stores the per-row scalars. Each kernel then stores its own columns. */
struct fwd_row_out {
  uint16_t *out; /* final row, or NULL */
  float *part;   /* partial row, or NULL */
  float f;
};

__device__ __forceinline__ fwd_row_out fwd_row_epilogue(const smla_cuda_fwd_args &a, int64_t t,
                                                        int split, int head, float l, float m,
                                                        bool writer) {
  fwd_row_out r = {NULL, NULL, 0.0f};
  const float lse = l == 0.0f ? -INFINITY : m + logf(l);
  if (a.num_splits == 1) {
    if (l != 0.0f) {
      float den = l;
      if (a.sink) den += expf(a.sink[head] - m);
      r.f = a.value_scale / den;
    }
    r.out = a.out + t * a.out_stride_t + (int64_t)head * a.out_stride_h;
    if (writer) {
      if (a.lse) a.lse[t * a.lse_stride_t + head] = lse;
      if (a.max_logit) a.max_logit[t * a.max_logit_stride_t + head] = m;
    }
  } else {
    const int64_t prow = ((int64_t)split * a.num_tokens + t) * a.num_heads + head;
    if (l != 0.0f) {
      r.f = a.value_scale / l;
      r.part = a.part_out + prow * 512;
    }
    if (writer) {
      a.part_lse[prow] = lse;
      a.part_max[prow] = m;
    }
  }
  return r;
}

/* ---- fused split combine ------------------------------------------------------------ */
/* With num_splits > 1 and a.combine_sync set, the S blocks of one (t, group) merge their
 * partial states themselves instead of a second kernel doing it: each block writes its
 * partial as usual, arrives at a per-(t, group) barrier in global memory, and once all S
 * have arrived merges one slice of the 512 output columns (block `split` takes columns
 * [split * cw, split * cw + cw)) from all S partials, which are in L2; split 0 also
 * writes the rows' lse and max_logit. The merge is the one of merge.cu (exact log-sum-exp
 * weights, a -inf partial never read, NaN propagates, the sink factor). It saves the
 * second launch and its dependent chain of lse reads (~4-5 us of a T=1 N=16 forward);
 * it costs one barrier round trip. Needs every block of the (t, group) resident at once:
 * the plan fuses only when the whole grid fits in one wave of SMs. */
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* A sense-reversing barrier of the S blocks of one (t, group): sync[0] counts arrivals,
 * the last arrival resets it and bumps the generation sync[1], which the others wait on.
 * Each thread's partial stores are made visible before its block arrives. */
__device__ __forceinline__ void fwd_combine_barrier(unsigned *sync, int S) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire_gpu(sync + 1);
    __threadfence();
    if (atomicAdd(sync, 1u) == (unsigned)S - 1) {
      atomicExch(sync, 0u);
      __threadfence();
      atomicAdd(sync + 1, 1u);
    } else {
      while (ld_acquire_gpu(sync + 1) == gen) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

/* The merge of one column slice, by all SMLA_CUDA_FWD_THREADS threads of the block. M:
 * heads per block. scr: shared-memory scratch of (2 * S + 2) * M floats, free to reuse. */
__device__ __forceinline__ void fwd_fused_combine(const smla_cuda_fwd_args &a, const fwd_block &b,
                                                  int M, float *scr) {
  constexpr int NT = SMLA_CUDA_FWD_THREADS;
  const float NEG_INF = -INFINITY;
  const int S = a.num_splits, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t t = b.t;
  const int h0 = b.grp * M, nh = min(M, a.num_heads - h0);
  fwd_combine_barrier(a.combine_sync + 2 * (t * a.groups + b.grp), S);

  const int cw = ((512 + S - 1) / S + 3) & ~3;
  const int c0 = b.split * cw, c1 = min(512, c0 + cw);
  const bool scalars = b.split == 0;
  if (c0 >= c1 && !scalars) return;
  float *w_s = scr;              /* [S][M]: lse of each partial, then its weight */
  float *max_s = scr + S * M;    /* [S][M]: max logit of each partial */
  float *factor_s = max_s + S * M;
  const int64_t pstride = a.num_tokens * a.num_heads; /* partial rows per split */
  const int64_t prow0 = t * a.num_heads + h0;
  const bool want_max = a.max_logit != NULL && scalars;
  for (int i = tid; i < S * nh; i += NT) {
    const int p = i / nh, h = i - p * nh;
    w_s[p * M + h] = __ldcg(a.part_lse + p * pstride + prow0 + h);
    if (want_max) max_s[p * M + h] = __ldcg(a.part_max + p * pstride + prow0 + h);
  }
  __syncthreads();
  for (int h = warp; h < nh; h += NT / 32) { /* a warp per head: lse, weights, factor */
    float mx = NEG_INF, m = NEG_INF;
    int nan = 0;
    for (int p = lane; p < S; p += 32) {
      const float l = w_s[p * M + h];
      mx = fmaxf(mx, l); /* skips NaN: counted apart so that it propagates */
      nan |= l != l;
      if (want_max) m = fmax_nan(m, max_s[p * M + h]);
    }
    for (int o = 16; o; o >>= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    nan = __any_sync(0xffffffffu, nan);
    float lse = NEG_INF;
    if (nan) {
      lse = NAN;
    } else if (mx != NEG_INF) {
      float sum = 0.0f;
      for (int p = lane; p < S; p += 32) {
        const float l = w_s[p * M + h];
        if (l != NEG_INF) sum += expf(l - mx);
      }
      for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      lse = mx + logf(sum);
    }
    for (int p = lane; p < S; p += 32) { /* -1: contributes nothing (NaN stays) */
      const float l = w_s[p * M + h];
      w_s[p * M + h] = l == NEG_INF ? -1.0f : expf(l - lse);
    }
    if (lane == 0) {
      factor_s[h] = a.sink && lse != NEG_INF ? 1.0f / (1.0f + expf(a.sink[h0 + h] - lse)) : 1.0f;
      if (scalars && a.lse) a.lse[t * a.lse_stride_t + h0 + h] = lse;
      if (want_max) a.max_logit[t * a.max_logit_stride_t + h0 + h] = m;
    }
  }
  __syncthreads();
  if (c0 >= c1) return;
  /* Outputs of 4 columns, (head, quad); tpo threads (adjacent lanes) share one output's
   * partials and add up with shuffles, so that one round of loads covers all S. */
  const int nq = (c1 - c0) >> 2, outs = nh * nq;
  int tpo = 1;
  while (tpo < 32 && 2 * tpo * outs <= NT && 2 * tpo <= S) tpo *= 2;
  const int per = NT / tpo, j = tid % tpo;
  for (int o0 = 0; o0 < outs; o0 += per) { /* uniform trip count: every lane shuffles */
    const int o = o0 + tid / tpo;
    const bool live = o < outs;
    const int h = live ? o / nq : 0, qd = live ? o - h * nq : 0;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (live) {
      const float *src = a.part_out + (prow0 + h) * 512 + c0 + 4 * qd;
      for (int p = j; p < S; p += 4 * tpo) {
        float w[4];
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const int pu = p + u * tpo;
          w[u] = pu < S ? w_s[pu * M + h] : -1.0f;
          v[u] = w[u] < 0.0f ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                             : __ldcg((const float4 *)(src + pu * pstride * 512));
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (!(w[u] < 0.0f)) {
            acc.x += w[u] * v[u].x, acc.y += w[u] * v[u].y;
            acc.z += w[u] * v[u].z, acc.w += w[u] * v[u].w;
          }
      }
    }
    for (int off = tpo >> 1; off; off >>= 1) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
    }
    if (live && j == 0) {
      const float f = factor_s[h];
      uint16_t *dst = a.out + t * a.out_stride_t + (int64_t)(h0 + h) * a.out_stride_h + c0 + 4 * qd;
      ((uint32_t *)dst)[0] = pack_bf16x2(acc.x * f, acc.y * f);
      ((uint32_t *)dst)[1] = pack_bf16x2(acc.z * f, acc.w * f);
    }
  }
}

/* Adds the block's bad-slot count (each warp's lanes' counts) once per row: group 0. */
__device__ __forceinline__ void fwd_count_bad(const smla_cuda_fwd_args &a, int grp,
                                              unsigned bad) {
  if (a.bad_inputs && grp == 0) {
    const unsigned n = __reduce_add_sync(0xffffffffu, bad);
    if ((threadIdx.x & 31) == 0 && n) atomicAdd(a.bad_inputs, (unsigned long long)n);
  }
}

#endif /* SMLA_CUDA_FORWARD_COMMON_CUH */
