/*
 * forward_common.cuh: pieces the sparse-MLA forward kernels share (the generic mma.sync
 * kernel in forward_impl.cuh and the sm_90a wgmma kernel in sm90/forward_wgmma.cu):
 * format ids, bf16 packing, and the loader's per-entry slot fetch and used/bad test.
 */
#ifndef SMLA_CUDA_FORWARD_COMMON_CUH
#define SMLA_CUDA_FORWARD_COMMON_CUH

#include "convert.cuh"
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

/* Entry ks + tile * BN + lr of the index row as stored (a slot; with a.conv.req_id
 * (smla_forward_indices) a position of request req), or -1 past the end. */
__device__ __forceinline__ int32_t raw_at(const int32_t *slot_row, int ks, int kend, int tile,
                                          int lr) {
  const int k = ks + tile * FWD_BN + lr;
  return k < kend ? __ldg(slot_row + k) : -1;
}

/* The slot of a raw entry: itself, or its conversion as smla_convert_indices would make it
 * (one block-table load, which depends on the raw entry's). */
__device__ __forceinline__ int32_t slot_of(const smla_cuda_fwd_args &a, int32_t req,
                                           int32_t raw) {
  return a.conv.req_id ? convert_one(a.conv, req, raw) : raw;
}

/* The next slot a loader thread needs: entry ks + tile * BN + lr, or -1 past the end. */
__device__ __forceinline__ int32_t slot_at(const smla_cuda_fwd_args &a, int32_t req,
                                           const int32_t *slot_row, int ks, int kend, int tile,
                                           int lr) {
  return slot_of(a, req, raw_at(slot_row, ks, kend, tile, lr));
}

/* A loader thread's slots two tiles deep: `slot` is the next tile's slot, `raw` the raw
 * entry of the tile after. Fused (smla_forward_indices), each level's load then has a
 * tile to land in: a slot_at of the next tile would stall the thread on the raw load
 * before the block-table load could issue, in front of the current tile's copies. */
struct slot_pipe {
  int32_t slot, raw;
};

__device__ __forceinline__ slot_pipe slot_pipe_start(const smla_cuda_fwd_args &a, int32_t req,
                                                     const int32_t *slot_row, int ks, int kend,
                                                     int lr) {
  slot_pipe p;
  p.slot = slot_at(a, req, slot_row, ks, kend, 0, lr);
  p.raw = raw_at(slot_row, ks, kend, 1, lr);
  return p;
}

/* Tile `tile`'s slot; the pipe moves on to tiles tile + 1 (converting) and tile + 2.
 * DEEP = false keeps one tile of look-ahead (slot_at of tile + 1; `raw` unused) for a
 * kernel instance with no register to spare. */
template <bool DEEP = true>
__device__ __forceinline__ int32_t slot_pipe_next(slot_pipe &p, const smla_cuda_fwd_args &a,
                                                  int32_t req, const int32_t *slot_row, int ks,
                                                  int kend, int tile, int lr) {
  const int32_t s = p.slot;
  if (DEEP) {
    p.slot = slot_of(a, req, p.raw);
    p.raw = raw_at(slot_row, ks, kend, tile + 2, lr);
  } else {
    p.slot = slot_at(a, req, slot_row, ks, kend, tile + 1, lr);
  }
  return s;
}

/* Entry state of one loader row: used (read it), counted as bad (>= S or < -1). */
__device__ __forceinline__ bool entry_used(const smla_cuda_fwd_args &a, int32_t s, int k,
                                           int kend, int lp, unsigned *bad) {
  const bool in_range = k < kend;
  const bool used = in_range && s >= 0 && (int64_t)s < a.num_slots;
  if (lp == 0 && in_range && (s < -1 || (int64_t)s >= a.num_slots)) (*bad)++;
  return used;
}

/* Logits in place: v * scale, then softcap * tanh(v / softcap) where softcap > 0. One
 * branch for the whole array: a branch a value (the form before session 13) kept the
 * compiler from overlapping the values' instructions, ~30 cycles a value on the exposed
 * softmax path (SASS of the sm90 kernel: 32 branches a tile, one after another; measured
 * 2-6% of the sm90 rows, bench/RESULTS.md session 13 run 5). */
template <int N>
__device__ __forceinline__ void fwd_scale_logits(float *v, float scale, float softcap) {
  if (softcap > 0.0f) {
#pragma unroll
    for (int i = 0; i < N; i++) {
      const float x = v[i] * scale;
      v[i] = softcap * tanhf(x / softcap);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i++) v[i] *= scale;
  }
}

/* One unit of the forward's work (a block's, but in the sm90 64-head kernel's persistent
 * grid): units are numbered (t, split, group) with the group fastest (with cluster_merge:
 * (t, group, split), split fastest); entries [ks, kend) of row t (the split clamped by
 * lengths[t]). */
struct fwd_block {
  int64_t t;
  int grp, split, ks, kend, ntiles;
  const int32_t *slot_row;
  int32_t req; /* smla_forward_indices: row t's request (else 0) */
};

/* The block's (t, group, split) by 32-bit unsigned division: the grid is one dimension of at
 * most 2^31 - 1 blocks (the launches refuse more), so every quotient and remainder is the
 * same as in 64 bits, where division by a run-time divisor is a software routine (~70
 * instructions) that every global address of the block (lengths, slots, Q) waited on.
 * Measured against the 64-bit form (H100, bench/RESULTS.md session 16): T = 1 N = 16
 * 9.92-9.96 -> 9.76-9.80 us amortized, T <= 4 0.1-0.16 us faster, T >= 16 equal. */
__device__ __forceinline__ fwd_block fwd_block_at(const smla_cuda_fwd_args &a, uint32_t bid) {
  fwd_block b;
  const uint32_t S = (uint32_t)a.num_splits, G = (uint32_t)a.groups;
  if (a.cluster_merge) { /* (t, group, split): a cluster is the splits of one (t, group) */
    const uint32_t rest = bid / S;
    b.split = (int)(bid - rest * S);
    const uint32_t t = rest / G;
    b.grp = (int)(rest - t * G);
    b.t = t;
  } else {
    const uint32_t rest = bid / G;
    b.grp = (int)(bid - rest * G);
    const uint32_t t = rest / S;
    b.split = (int)(rest - t * S);
    b.t = t;
  }
  int len = a.topk;
  if (a.lengths) len = min(max(a.lengths[b.t], 0), a.topk);
  b.ks = b.split * a.split_len;
  b.kend = min(min(b.ks + a.split_len, a.topk), len);
  b.ntiles = b.kend > b.ks ? (b.kend - b.ks + FWD_BN - 1) / FWD_BN : 0;
  b.slot_row = a.slots + b.t * a.slots_stride;
  b.req = a.conv.req_id ? __ldg(a.conv.req_id + b.t) : 0;
  return b;
}

/* This block's work in a grid of one block per (t, group, split). */
__device__ __forceinline__ fwd_block fwd_block_of(const smla_cuda_fwd_args &a) {
  return fwd_block_at(a, blockIdx.x);
}

/* Source of 16-byte chunk c (of 8 bf16) of head `head`'s q row: chunks 0..63 from q_nope,
 * the rest from q_pe. Heads past N get a dummy pointer; load them with 0 source bytes. */
__device__ __forceinline__ const uint16_t *q_chunk_src(const smla_cuda_fwd_args &a, int64_t t,
                                                       int head, int c) {
  if (head >= a.num_heads) return a.q_nope;
  return c < 64 ? a.q_nope + t * a.q_nope_stride_t + head * a.q_nope_stride_h + 8 * c
                : a.q_pe + t * a.q_pe_stride_t + head * a.q_pe_stride_h + 8 * (c - 64);
}

/* The rules of a row's final state, written once for the forward's epilogue, the sm90
 * kernel's cluster merge and the generic kernel's in-kernel merge (the combine kernel,
 * merge.cu, works from lse values, not (max, sum) pairs, and has its own form of them).
 * A row (or a part of one: a split, a cluster) is a max M and a sum L of exp(logit - M)
 * over its used entries; L = 0 when it has none (then M = -inf).
 * - A part (m, l) weighs exp(m - M) in a merge whose max is M; 0 when l = 0 (-inf - -inf
 *   would be NaN). M is the max.NaN of the parts' m: a NaN logit poisons the row.
 * - lse = M + log(L), -inf when L = 0.
 * - The output factor: value_scale / (L + exp(sink - M)) with a sink, value_scale / L
 *   without; 0 when L = 0 (the row is zeros). */
__device__ __forceinline__ float part_weight(float m, float l, float M) {
  return l != 0.0f ? expf(m - M) : 0.0f;
}

__device__ __forceinline__ float row_lse(float M, float L) {
  return L == 0.0f ? -INFINITY : M + logf(L);
}

__device__ __forceinline__ float row_out_factor(const float *sink, int head, float M, float L,
                                                float value_scale) {
  if (L == 0.0f) return 0.0f;
  float den = L;
  if (sink) den += expf(sink[head] - M);
  return value_scale / den;
}

/* A final row's lse and max_logit, where the caller asked for them. M is the max the
 * row's L is relative to; top the row's largest logit (the same value, unless a kernel
 * let its M lag behind the running max: the sm90 kernel's lazy rescale). */
__device__ __forceinline__ void fwd_store_row_scalars(const smla_cuda_fwd_args &a, int64_t t,
                                                      int head, float M, float L, float top) {
  if (a.lse) a.lse[t * a.lse_stride_t + head] = row_lse(M, L);
  if (a.max_logit) a.max_logit[t * a.max_logit_stride_t + head] = top;
}

/* One (t, head) row's epilogue, from its sum of weights l and max m: with one split, the
 * final bf16 row `out` scaled by f (the 1/l, sink and FP8_TENSOR value scale; 0 when no
 * entry was used) and lse / max_logit; with several, the partial row `part` (written
 * with f = 0, i.e. zeros, when l == 0, so that the combine may load it before it knows
 * the lse: smla_cuda_merge_args.dense) and its lse / max. `writer`: the one thread of
 * the row that stores the per-row scalars. Each kernel then stores its own columns. */
struct fwd_row_out {
  uint16_t *out; /* final row, or NULL */
  float *part;   /* partial row, or NULL */
  float f;
};

__device__ __forceinline__ fwd_row_out fwd_row_epilogue(const smla_cuda_fwd_args &a, int64_t t,
                                                        int split, int head, float l, float m,
                                                        float top, bool writer) {
  fwd_row_out r = {NULL, NULL, 0.0f};
  if (a.num_splits == 1) {
    r.f = row_out_factor(a.sink, head, m, l, a.value_scale);
    r.out = a.out + t * a.out_stride_t + (int64_t)head * a.out_stride_h;
    if (writer) fwd_store_row_scalars(a, t, head, m, l, top);
  } else {
    const int64_t prow = ((int64_t)split * a.num_tokens + t) * a.num_heads + head;
    r.f = row_out_factor(NULL, head, m, l, a.value_scale); /* the combine adds the sink */
    r.part = a.part_out + prow * 512; /* zeros when l == 0: the combine reads every row */
    if (writer) {
      a.part_lse[prow] = row_lse(m, l);
      a.part_max[prow] = top; /* the combine's max_logit */
    }
  }
  return r;
}

/* ---- sm_90 only (call under __CUDA_ARCH__ >= 900): the in-kernel merge of KV splits ---- */

/* bar.sync over the NT threads that run the merge: the whole block (BAR 0, the generic
 * kernel), or the compute warpgroup of the small-head sm90 kernel (its named barrier). */
template <int BAR, int NT>
__device__ __forceinline__ void fwd_merge_bar() {
  if constexpr (BAR == 0) __syncthreads();
  else asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(NT) : "memory");
}

/* The in-kernel merge of KV splits over distributed shared memory (a.cluster_merge = C >=
 * 2, R = num_splits / C clusters a row; docs/design/decode-one-launch.md), shared by the
 * generic kernel and the small-head sm90 kernel. Called by the NT threads of every block of
 * the cluster that staged the block's state: O unnormalized as [M][ST] floats at ost_s, each
 * row's max at m_s and sum at l_s (shared addresses of this block's layout, the same in
 * every block of the cluster); flag: an int of shared memory.
 * 1. A cluster barrier publishes the staged state.
 * 2. Block k merges its float4 columns [128 k / C, 128 (k + 1) / C) of every row over the C
 *    blocks through distributed shared memory: weights exp(m_i - M) (0 where l_i = 0), M
 *    the max of the m_i (NaN if any is), L the weighted sum of the l_i. Thread (row,
 *    sub): NT / M threads a row, each taking every (NT / M)-th unit.
 * 3. R = 1: the final row (times value_scale / (L + sink term); zeros when L = 0) and, from
 *    block 0, lse and max_logit: the rules of fwd_row_epilogue over the merged (M, L).
 *    R > 1: the slice and (M, L) to the workspace, a fence, one count a block on
 *    merge_counters[(t, group, k)]; the block that counts R merges the R slices the same
 *    way (weights exp(M_r - M'), sum of L_r weighted) into the final row and resets the
 *    counter. No block waits for another across clusters: the last one does the work.
 * A second cluster barrier (arrive after the distributed reads, wait before exit) keeps
 * each block's shared memory alive while the others read it. Threads of the block that do
 * not call this must have exited (the cluster barriers count every thread that has not). */
template <int M, int NT, int ST, int BAR>
__device__ __forceinline__ void fwd_dsmem_merge(const smla_cuda_fwd_args &a, uint32_t ost_s,
                                                uint32_t m_s, uint32_t l_s, int *flag, int tid,
                                                int64_t t, int grp, int split, int h0) {
  constexpr int TPR = NT / M;
  static_assert(TPR * M == NT && TPR >= 1, "whole rows a thread group");
  const float NEG_INF = -INFINITY;
  cluster_sync_acq_rel();

  const int C = a.cluster_merge, R = a.num_splits / C, k = split % C, r = split / C;
  const int u0 = 128 * k / C, u1 = 128 * (k + 1) / C;
  const int row = tid / TPR, sub = tid - row * TPR, head = h0 + row;
  const bool live = head < a.num_heads;
  float w[8], M_ = NEG_INF, L_ = 0.0f;
  {
    float mk[8], lk[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
      mk[i] = NEG_INF;
      lk[i] = 0.0f;
      if (i < C && live) {
        mk[i] = ld_cluster_f32(m_s + 4u * row, (uint32_t)i);
        lk[i] = ld_cluster_f32(l_s + 4u * row, (uint32_t)i);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) M_ = fmax_nan(M_, mk[i]);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      w[i] = part_weight(mk[i], lk[i], M_);
      L_ = fmaf(lk[i], w[i], L_);
    }
  }
  uint16_t *orow = a.out + t * a.out_stride_t + (int64_t)head * a.out_stride_h;
  const int64_t prow = (((int64_t)r * a.num_tokens + t) * a.num_heads + head) * 512;
  const float f = row_out_factor(a.sink, head, M_, L_, a.value_scale);
  if (live) {
#pragma unroll 1
    for (int u = u0 + sub; u < u1; u += TPR) {
      const uint32_t at = ost_s + (uint32_t)(row * ST + 4 * u) * 4u;
      float4 v[8];
#pragma unroll
      for (int i = 0; i < 8; i++)
        if (i < C) v[i] = ld_cluster_f32x4(at, (uint32_t)i);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < 8; i++)
        if (i < C && w[i] != 0.0f) { /* 0 x a NaN of an unused split's O stays out */
          acc.x = fmaf(v[i].x, w[i], acc.x);
          acc.y = fmaf(v[i].y, w[i], acc.y);
          acc.z = fmaf(v[i].z, w[i], acc.z);
          acc.w = fmaf(v[i].w, w[i], acc.w);
        }
      if (R == 1)
        *(uint2 *)(orow + 4 * u) =
            make_uint2(pack_bf16x2(acc.x * f, acc.y * f), pack_bf16x2(acc.z * f, acc.w * f));
      else
        *(float4 *)(a.part_out + prow + 4 * u) = acc;
    }
  }
  cluster_arrive_release(); /* this block's distributed reads are done */
  if (R == 1) {
    if (k == 0 && sub == 0 && live) fwd_store_row_scalars(a, t, head, M_, L_, M_);
  } else {
    const int64_t mrow = (((int64_t)k * R + r) * a.num_tokens + t) * a.num_heads + head;
    if (sub == 0 && live) {
      a.part_max[mrow] = M_;
      a.part_lse[mrow] = L_;
    }
    /* One release a block (after the barrier, which orders the block's writes before it)
     * and one acquire in the last block, as a block-wide semaphore does. */
    fwd_merge_bar<BAR, NT>();
    int *counter = a.merge_counters + (t * a.groups + grp) * 8 + k;
    if (tid == 0) {
      __threadfence();
      const int last = atomicAdd(counter, 1) == R - 1;
      if (last) __threadfence(); /* the other clusters' slices, counted before this */
      *flag = last;
    }
    fwd_merge_bar<BAR, NT>();
    if (*flag) {
      if (live) {
        /* R <= SMLA_CUDA_FWD_MERGE_MAX_R (the plan's limit): each unit's R slices and the R (M, L)
         * pairs are loaded together (one L2 round trip), then weighed; a weight of 0
         * (a cluster with no used entry) keeps its slice out of the sum. */
        const int64_t mstep = a.num_tokens * a.num_heads;
        const int64_t m0 = (int64_t)k * R * mstep + t * a.num_heads + head;
        const int64_t p0 = (t * a.num_heads + head) * 512, pstep = mstep * 512;
#pragma unroll 1
        for (int u = u0 + sub; u < u1; u += TPR) {
          float Mq[SMLA_CUDA_FWD_MERGE_MAX_R], Lq[SMLA_CUDA_FWD_MERGE_MAX_R];
          float4 v[SMLA_CUDA_FWD_MERGE_MAX_R];
#pragma unroll
          for (int q = 0; q < SMLA_CUDA_FWD_MERGE_MAX_R; q++) {
            Mq[q] = NEG_INF;
            Lq[q] = 0.0f;
            if (q < R) {
              Mq[q] = __ldcg(a.part_max + m0 + q * mstep);
              Lq[q] = __ldcg(a.part_lse + m0 + q * mstep);
              v[q] = __ldcg((const float4 *)(a.part_out + p0 + q * pstep + 4 * u));
            }
          }
          float Mf = NEG_INF, Lf = 0.0f;
#pragma unroll
          for (int q = 0; q < SMLA_CUDA_FWD_MERGE_MAX_R; q++) Mf = fmax_nan(Mf, Mq[q]);
          float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
          for (int q = 0; q < SMLA_CUDA_FWD_MERGE_MAX_R; q++) {
            const float wq = part_weight(Mq[q], Lq[q], Mf);
            Lf = fmaf(Lq[q], wq, Lf);
            if (q < R && wq != 0.0f) {
              acc.x = fmaf(v[q].x, wq, acc.x);
              acc.y = fmaf(v[q].y, wq, acc.y);
              acc.z = fmaf(v[q].z, wq, acc.z);
              acc.w = fmaf(v[q].w, wq, acc.w);
            }
          }
          const float ff = row_out_factor(a.sink, head, Mf, Lf, a.value_scale);
          *(uint2 *)(orow + 4 * u) = make_uint2(pack_bf16x2(acc.x * ff, acc.y * ff),
                                                pack_bf16x2(acc.z * ff, acc.w * ff));
          if (k == 0 && sub == 0 && u == u0) /* sub 0 has a unit: u1 - u0 >= 16 */
            fwd_store_row_scalars(a, t, head, Mf, Lf, Mf);
        }
      }
      if (tid == 0) *counter = 0; /* every count of this launch is in */
    }
  }
  cluster_wait(); /* no block leaves while another may still read its shared memory */
}

/* The launch's arguments warmed (SMLA_FWD_WARM_PARAMS, default 1: the generic and the
 * small-head kernels, both programmatic dependents): each warp issues one constant load
 * into its own 64-byte line of the ~376-byte argument block (warp w: byte 64 w, the last
 * warps the last word) before the dependency wait, so that the lines the prologue reads
 * after it, each a miss that stalls its warp, come in under the wait: the block is a new
 * constant buffer every launch. param_warm_keep stores the word to the warp's own word of
 * a scratch region nothing reads (else the compiler drops the load). Measured (H100,
 * bench/RESULTS.md session 18 call 1, two runs each): T = 1 N = 8 8.52 -> 8.37-8.42 us,
 * N = 16 9.98 -> 9.84-9.86 amortized, cold 0.1-0.3 less; the 64-head kernel (a plain
 * launch, no wait to hide under) 0.06-0.12 slower, so it does not warm. The prediction
 * (0.5-1 us) missed: the 1.47 us before the first gathers are not mostly these misses. */
#ifndef SMLA_FWD_WARM_PARAMS
#define SMLA_FWD_WARM_PARAMS 1
#endif
__device__ __forceinline__ uint32_t param_warm_issue(const smla_cuda_fwd_args &a) {
  constexpr int WORDS = (int)(sizeof(smla_cuda_fwd_args) / 4);
  int i = 16 * (int)(threadIdx.x >> 5);
  if (i > WORDS - 1) i = WORDS - 1;
  return ((const uint32_t *)&a)[i];
}
__device__ __forceinline__ void param_warm_keep(uint32_t word, uint32_t scratch) {
  if ((threadIdx.x & 31) == 0)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(scratch + 4u * ((threadIdx.x >> 5) & 15)),
                 "r"(word)
                 : "memory");
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
