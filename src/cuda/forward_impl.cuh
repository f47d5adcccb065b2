/*
 * forward_impl.cuh: the generic sparse-MLA forward kernel (SPEC §3), tensor cores through
 * mma.sync.m16n8k16 bf16 (sm_80+). Included by forward_bf16.cu, forward_fp8.cu and
 * forward_ds.cu, which instantiate one cache format each (parallel builds).
 *
 * Work: one block (8 warps) per (row t, head group, KV split). A head group is M = 16 *
 * MT heads (MT = 1, 2, 4: N <= 16, <= 32, else 64 per group; rows past N are zero and
 * never written). The block walks its split's entries in tiles of BN = 64 gathered rows,
 * FlashAttention-2 style:
 *   S[M][64] = Q[M][dqk] K^T      8 warps: 4x2 of 16x32 (MT=4), 2x4 of 16x16, 1x8 of 16x8
 *   online softmax on S           row max exchanged between warps in shared memory;
 *                                 P written to shared memory as bf16
 *   O[M][512] += P[M][64] V       warp w owns output columns 64w..64w+63, all M rows
 * Q (M x dqk bf16) stays in shared memory for the whole block; KV tiles are gathered by
 * cp.async 16-byte copies (4 threads per row), two stages deep for BF16. fp8 rows
 * are staged raw (1-2 buffers) and widened to bf16 in shared memory: e4m3 -> bf16 is
 * exact. Scales are applied in float, never by rounding a scaled value to bf16, so any
 * finite scale reads exactly as the CPU's e4m3 * scale (SPEC §3: rows dequantized to their
 * float values): the FP8_TENSOR scale is folded into the logit scale and the output scale;
 * FP8_DS sums each 128-column group of S apart and adds it times the entry's group scale,
 * and writes P four times, each copy times the entries' scales of one group, for the
 * warps whose output columns lie in that group. Masked entries (slot outside [0, S), past
 * lengths[t] or past the split) never read the cache: cp.async zero-fills their row, and
 * their logits are set to -inf, so NaN in unused rows cannot leak in. A NaN logit of a
 * used entry makes the row's max, lse and out NaN.
 *
 * Napkin math, MT=4 (64 heads) per 64-entry tile: 2*64*64*(576+512) = 8.9 MFLOP = 2176
 * mma.sync.m16n8k16; at ~8 cycles per mma per SM sub-partition that is ~4.4K cycles of
 * tensor work. Shared-memory operand traffic: S 8 warps x 108 ldmatrix.x4 (442 KB), PV
 * 8 warps x 32 (131 KB), + 72 KB of cp.async fills: ~5K cycles at 128 B/clk; the S phase
 * is bound by it (3.5K cycles against 2.3K of mma), the PV phase by the mma. With the
 * phases serialized by barriers: ~6.5K cycles (~3.3 us) per tile per SM, T=1024 N=128
 * K=2048 (584 GFLOP, 65536 tiles on 132 SMs) in ~1.7 ms. Measured (H200, 2026-12-02):
 * 2.42 ms, 4.7 us per tile (ncu: tensor pipe ~30-40% busy, 8 warps per SM, 255
 * registers, issue-latency bound). Gather bytes: 64 * 1152 = 72 KB per tile, hidden
 * behind one tile of compute by the second stage.
 * Shared memory, MT=4 BF16 dr=64: Q 72 KB + 2 x KV 72 KB + P 8 KB + 1.3 KB = 225 KB
 * (fits the 227 KB opt-in of sm_90; smaller devices get pipe = 1 or fewer heads).
 */
#ifndef SMLA_CUDA_FORWARD_IMPL_CUH
#define SMLA_CUDA_FORWARD_IMPL_CUH

#include "forward_common.cuh"
#include "probe.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <limits.h>
#include <math.h>

#define FWD_THREADS SMLA_CUDA_FWD_THREADS
#define FWD_MERGE_MAX_R SMLA_CUDA_FWD_MERGE_MAX_R

/* Two e4m3 (low byte first) -> two floats, exact (through f16). */
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
  return __half22float2(__half2(r));
}

/* 16 e4m3 values (one 16-byte chunk) * sc -> 16 bf16 in two 16-byte chunks. */
__device__ __forceinline__ void widen_chunk(uint4 raw, float sc, uint4 *lo, uint4 *hi) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 a = e4m3x2_to_float2(w[i] & 0xffffu);
    const float2 b = e4m3x2_to_float2(w[i] >> 16);
    o[2 * i] = pack_bf16x2(a.x * sc, a.y * sc);
    o[2 * i + 1] = pack_bf16x2(b.x * sc, b.y * sc);
  }
  *lo = make_uint4(o[0], o[1], o[2], o[3]);
  *hi = make_uint4(o[4], o[5], o[6], o[7]);
}

/* Byte offset of 16-byte chunk c of row r in a swizzled tile with row pitch `pitch`:
 * chunk c ^ (r % 8), so the 8 rows an ldmatrix phase reads hit 8 distinct bank groups. */
__device__ __forceinline__ uint32_t swz(int r, int c, int pitch) {
  return (uint32_t)(r * pitch + ((c ^ (r & 7)) << 4));
}

#if __CUDA_ARCH__ >= 900
/* The in-kernel merge of the generic kernel (a.cluster_merge = C >= 2; kernels.h says the
 * layout; docs/design/decode-one-launch.md the design). Called by every thread of every
 * block of the cluster once the block's tile loop is done: its O (unnormalized) is in
 * registers, its row maxima in rowmax_s and its per-warp row sums in red. O is staged in
 * this block's shared memory (over Q and the KV stages, all consumed), the row sums in the
 * alpha slot; fwd_dsmem_merge (forward_common.cuh) does the rest. */
template <int MT, int WN>
__device__ __forceinline__ void fwd_merge_in_kernel(const smla_cuda_fwd_args &a, uint8_t *smem,
                                                    const smla_cuda_fwd_layout &L,
                                                    float (&O)[MT][8][4], int64_t t, int grp,
                                                    int split, int h0) {
  constexpr int M = 16 * MT, ST = SMLA_CUDA_FWD_OST_STRIDE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  float *ost = (float *)smem; /* [M][ST] */
  const float *red = (const float *)(smem + L.red);
  float *lrow = (float *)(smem + L.alpha); /* [M] row sums */
  const uint32_t sbase = smem_addr(smem);
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = mt * 16 + g + 8 * hh;
#pragma unroll
      for (int nt = 0; nt < 8; nt++)
        *(float2 *)(ost + row * ST + warp * 64 + nt * 8 + 2 * tig) =
            make_float2(O[mt][nt][2 * hh], O[mt][nt][2 * hh + 1]);
    }
  if (tid < M) {
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < WN; w++) l += red[w * M + tid];
    lrow[tid] = l;
  }
  fwd_dsmem_merge<M, FWD_THREADS, ST, 0>(a, sbase, sbase + L.rowmax, sbase + L.alpha,
                                         (int *)(smem + L.mask), tid, t, grp, split, h0);
}
#endif

template <int FMT, int DR, int MT>
__global__ void __launch_bounds__(FWD_THREADS, 1)
    fwd_kernel(const __grid_constant__ smla_cuda_fwd_args a, const int pipe) {
  constexpr int BN = FWD_BN;
  constexpr int DQK = 512 + DR;
  constexpr int QCH = DQK / 8;   /* 16-byte chunks per bf16 row */
  constexpr int ROWB = DQK * 2;  /* bf16 row pitch in shared memory */
  constexpr int M = 16 * MT;
  /* S phase: all 8 warps, 16 x (64 / WN) each (64 heads: 4 x 2 warps of 16x32, 3 ldmatrix
   * per 4 mma). SMLA_FWD_S4=1 (experiment): 64 heads on 4 warps of 32x32 (SMT = 2, 4
   * ldmatrix per 8 mma, a third less shared-memory traffic, one warp per sub-partition).
   * Verdict (H200, 2026-12-02, bf16 K=2048): slower, T=1024 N=128 2.94 ms vs 2.46 ms,
   * T=16 N=128 64 vs 55 us: one warp per sub-partition can not hide ldmatrix -> mma. */
#ifndef SMLA_FWD_S4
#define SMLA_FWD_S4 0
#endif
  constexpr int S_WARPS = SMLA_FWD_S4 && MT == 4 ? 4 : 8;
  constexpr int SMT = SMLA_FWD_S4 && MT == 4 ? 2 : 1; /* m16 tiles per S warp */
  constexpr int WM = MT / SMT;           /* S warps along the heads */
  constexpr int WN = S_WARPS / WM;       /* S warps along the entries */
  constexpr int NTS = BN / WN / 8;       /* n8 tiles per S warp */
  static_assert(WN * M == 128, "red[] holds WN x M floats");
  constexpr int RAW_ROW = FMT == FMT_FP8 ? DQK : FMT == FMT_DS ? 528 + 2 * DR : 16;
  constexpr int RAW_CH = RAW_ROW / 16;
  constexpr int FP8_CH = FMT == FMT_FP8 ? DQK / 16 : 32; /* e4m3 chunks per row */
  constexpr int UNITS = FP8_CH + (FMT == FMT_DS ? DR / 8 : 0); /* widen work per row */
  const float NEG_INF = -INFINITY;

  extern __shared__ __align__(16) uint8_t smem[];
  const smla_cuda_fwd_layout L = smla_cuda_fwd_layout_of(FMT, DR, MT, pipe);
  const uint32_t sbase = smem_addr(smem);
  float *red = (float *)(smem + L.red);
  float *alpha_s = (float *)(smem + L.alpha);
  float *rowmax_s = (float *)(smem + L.rowmax);
  uint8_t *mask_s = smem + L.mask;
  float *scale_s = (float *)(smem + L.scale); /* FP8_DS: [BN][4] group scales of the tile */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tig = lane & 3, x7 = lane & 7;
  const int lr = tid >> 2, lp = tid & 3; /* loader: row of the tile, quarter of the row */

  PROBE_DECL;
  PROBE_STAMP(0);
#if SMLA_FWD_WARM_PARAMS
  const uint32_t warm = param_warm_issue(a);
#endif
#if __CUDA_ARCH__ >= 900
  /* A programmatic dependent (a.pdl) may start while the stream's previous kernel still
   * runs: nothing global (inputs, outputs, workspace, counters) is touched before it has
   * completed. Dependents of this grid may be scheduled from here on (they wait alike). */
  if (a.pdl) {
    griddep_wait();
    griddep_launch_dependents();
  }
#endif
#if SMLA_FWD_WARM_PARAMS
  param_warm_keep(warm, sbase + L.warm);
#endif
  PROBE_STAMP(1);
  const fwd_block blk = fwd_block_of(a);
  const int64_t t = blk.t;
  const int grp = blk.grp, split = blk.split, ks = blk.ks, kend = blk.kend;
  const int ntiles = blk.ntiles, h0 = grp * M;
  const int32_t *slot_row = blk.slot_row;
  const int32_t req = blk.req;

  float O[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int i = 0; i < 4; i++) O[mt][nt][i] = 0.0f;
  float m_run[SMT][2], l_run[SMT][2];
#pragma unroll
  for (int mi = 0; mi < SMT; mi++) {
    m_run[mi][0] = m_run[mi][1] = NEG_INF;
    l_run[mi][0] = l_run[mi][1] = 0.0f;
  }
  unsigned bad = 0;

  if (ntiles > 0) {
    const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv, p_s = sbase + L.p;
    /* Two tiles ahead (one for the fp8 formats: their 64-head instance has no register
     * to spare: 28 bytes of spills with two). The slots' loads go out before Q's copies,
     * so that their round trip, which tile 0's gathers wait on, runs under the Q issue
     * (~50 instructions a copy; the copies' "memory" clobber keeps the compiler from
     * hoisting the loads above them). Against the other order (H100, bench/RESULTS.md
     * session 14 call 1, N = 16): 0.6-1.8% at T = 16..4096, nothing at T = 1. */
    constexpr bool PIPE_DEEP = FMT == FMT_BF16;
    slot_pipe spipe = slot_pipe_start(a, req, slot_row, ks, kend, lr);
    /* Q rows (heads h0..h0+M-1), zero past N. Joins the first cp.async group. */
    for (int idx = tid; idx < M * QCH; idx += FWD_THREADS) {
      const int row = idx / QCH, c = idx - row * QCH, head = h0 + row;
      cp_async_16(q_s + swz(row, c, ROWB), q_chunk_src(a, t, head, c),
                  head < a.num_heads ? 16 : 0);
    }
    PROBE_STAMP(7); /* the slots' loads and Q's copies issued (nothing waited for yet) */

    /* Gathers tile j's row lr (this thread's quarter) into a bf16 KV buffer or a raw one. */
#define ISSUE_TILE(j, dst_row)                                                              \
  do {                                                                                      \
    const int32_t s_ = slot_pipe_next<PIPE_DEEP>(spipe, a, req, slot_row, ks, kend, (j), lr);          \
    const bool used_ = entry_used(a, s_, ks + (j) * BN + lr, kend, lp, &bad);               \
    if (lp == 0) mask_s[((j) & 3) * BN + lr] = used_;                                       \
    const uint8_t *src_ = a.cache + (used_ ? (int64_t)s_ * a.row_bytes : 0);                \
    const uint32_t n_ = used_ ? 16u : 0u;                                                   \
    if (FMT == FMT_BF16) {                                                                  \
      _Pragma("unroll") for (int i_ = 0; i_ < QCH / 4; i_++) {                              \
        const int c_ = lp + 4 * i_;                                                         \
        cp_async_16((dst_row) + ((c_ ^ (lr & 7)) << 4), src_ + 16 * c_, n_);                \
      }                                                                                     \
    } else {                                                                                \
      _Pragma("unroll") for (int i_ = 0; i_ < (RAW_CH + 3) / 4; i_++) {                     \
        const int c_ = lp + 4 * i_;                                                         \
        if (c_ < RAW_CH) cp_async_16((dst_row) + 16 * c_, src_ + 16 * c_, n_);              \
      }                                                                                     \
    }                                                                                       \
  } while (0)

    const bool s_warp = S_WARPS == 8 || warp < S_WARPS; /* folds to true for 8 */
    const int wm = warp % WM, wn = warp / WM;
    const uint32_t a_row = q_s + (uint32_t)((wm * 16 * SMT + (lane & 15)) * ROWB);
    const int a_hi = lane >> 4, b_hi = (lane >> 3) & 1;
    const int b_n0 = wn * 8 * NTS + (lane & 7) + (NTS > 1 ? ((lane >> 4) & 1) * 8 : 0);
    (void)s_warp;

    const int kv_bufs = FMT == FMT_BF16 ? pipe : 1;
    if (FMT == FMT_BF16) {
      ISSUE_TILE(0, kv_s + (uint32_t)(lr * ROWB));
      cp_async_commit();
      PROBE_STAMP(2); /* (thread 0's slot of tile 0 has arrived) */
    } else if (pipe >= 1) {
      ISSUE_TILE(0, sbase + L.raw + (uint32_t)(lr * RAW_ROW));
      cp_async_commit();
      if (pipe == 2) {
        if (ntiles > 1) ISSUE_TILE(1, sbase + L.raw + (uint32_t)((BN + lr) * RAW_ROW));
        cp_async_commit();
      }
    } else {
      cp_async_commit(); /* Q alone */
    }

    for (int j = 0; j < ntiles; j++) {
      const int buf = FMT == FMT_BF16 && kv_bufs == 2 ? (j & 1) : 0;
      if (FMT == FMT_BF16) {
        /* Two stages: tile j+1 is issued before waiting for tile j, so two tiles are in
         * flight during the wait. (Issuing tile j+2 only after tile j+1 had landed, one
         * barrier fewer per tile, cost 22% at 16 heads: 882 vs 725 us, T=1024 N=16.) */
        if (kv_bufs == 2) {
          if (j + 1 < ntiles)
            ISSUE_TILE(j + 1, kv_s + (uint32_t)((((j + 1) & 1) * BN + lr) * ROWB));
          cp_async_commit();
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) PROBE_STAMP(3);
      } else {
        if (pipe == 2)
          cp_async_wait<1>();
        else
          cp_async_wait<0>();
        __syncthreads();
        if (pipe >= 1) {
          /* Widen the staged raw tile j into the bf16 KV buffer. */
          const uint8_t *raw = smem + L.raw + (j % pipe) * BN * RAW_ROW;
#pragma unroll 2
          for (int idx = tid; idx < BN * UNITS; idx += FWD_THREADS) {
            const int r = idx / UNITS, u = idx - r * UNITS;
            const uint8_t *rrow = raw + r * RAW_ROW;
            uint8_t *krow = smem + L.kv + r * ROWB;
            if (u < FP8_CH) {
              /* FP8_DS: the group scales go to scale_s, applied in float by S and P. */
              if (FMT == FMT_DS && (u & 7) == 0)
                scale_s[r * 4 + (u >> 3)] = ((const float *)(rrow + 512))[u >> 3];
              uint4 lo, hi;
              widen_chunk(*(const uint4 *)(rrow + 16 * u), 1.0f, &lo, &hi);
              *(uint4 *)(krow + ((2 * u) ^ (r & 7)) * 16) = lo;
              *(uint4 *)(krow + ((2 * u + 1) ^ (r & 7)) * 16) = hi;
            } else {
              const int c = 64 + (u - FP8_CH);
              *(uint4 *)(krow + (c ^ (r & 7)) * 16) =
                  *(const uint4 *)(rrow + 528 + 16 * (u - FP8_CH));
            }
          }
        } else {
          /* No staging buffer: load this thread's row quarter through registers. */
          const int32_t s_ = slot_pipe_next<PIPE_DEEP>(spipe, a, req, slot_row, ks, kend, j, lr);
          const bool used_ = entry_used(a, s_, ks + j * BN + lr, kend, lp, &bad);
          if (lp == 0) mask_s[(j & 3) * BN + lr] = used_;
          const uint8_t *src = a.cache + (used_ ? (int64_t)s_ * a.row_bytes : 0);
          uint8_t *krow = smem + L.kv + lr * ROWB;
          const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
          uint4 scales = zero;
          if (FMT == FMT_DS && used_) scales = ld_nc_16(src + 512);
          if (FMT == FMT_DS && lp == 0) *(uint4 *)(scale_s + lr * 4) = scales;
#pragma unroll
          for (int i = 0; i < UNITS / 4; i++) {
            const int u = lp + 4 * i;
            if (u < FP8_CH) {
              const uint4 v = used_ ? ld_nc_16(src + 16 * u) : zero;
              uint4 lo, hi;
              widen_chunk(v, 1.0f, &lo, &hi);
              *(uint4 *)(krow + ((2 * u) ^ (lr & 7)) * 16) = lo;
              *(uint4 *)(krow + ((2 * u + 1) ^ (lr & 7)) * 16) = hi;
            } else {
              const int c = 64 + (u - FP8_CH);
              *(uint4 *)(krow + (c ^ (lr & 7)) * 16) =
                  used_ ? ld_nc_16(src + 528 + 16 * (u - FP8_CH)) : zero;
            }
          }
        }
        __syncthreads();
        if (pipe >= 1) {
          if (j + pipe < ntiles)
            ISSUE_TILE(j + pipe, sbase + L.raw + (uint32_t)(((j % pipe) * BN + lr) * RAW_ROW));
          cp_async_commit();
        }
      }
      const uint32_t kvb = kv_s + (uint32_t)(buf * BN * ROWB);

      /* ---- S = Q K^T: this warp's 16*SMT heads x 8*NTS entries ---- */
      /* FP8_DS: the 128 columns of group gi are summed apart in pacc and added to sacc times
       * each entry's group scale (float, as the CPU's e4m3 * scale: exact for any scale,
       * where scaling the e4m3 values into bf16 would round them); other formats and the
       * rope part sum straight through pacc. */
      float sacc[SMT][NTS][4], pacc[SMT][NTS][4];
#pragma unroll
      for (int mi = 0; mi < SMT; mi++)
#pragma unroll
        for (int nt = 0; nt < NTS; nt++)
#pragma unroll
          for (int i = 0; i < 4; i++) sacc[mi][nt][i] = pacc[mi][nt][i] = 0.0f;
      const uint8_t *mk = mask_s + (j & 3) * BN;
      float tmax[SMT][2];
      if (s_warp) {
        /* One k-step of 16 columns into pacc. */
#define S_STEP(kk)                                                                          \
  do {                                                                                      \
    uint32_t af[SMT][4];                                                                    \
    _Pragma("unroll") for (int mi = 0; mi < SMT; mi++)                                      \
        ldmatrix_x4(af[mi], a_row + (uint32_t)(mi * 16 * ROWB + (((2 * (kk) + a_hi) ^ x7) << 4))); \
    if (NTS == 1) {                                                                         \
      uint32_t bf[2];                                                                       \
      ldmatrix_x2(bf, kvb + (uint32_t)(b_n0 * ROWB + (((2 * (kk) + b_hi) ^ x7) << 4)));     \
      _Pragma("unroll") for (int mi = 0; mi < SMT; mi++)                                    \
          mma_bf16_16816(pacc[mi][0], af[mi], bf[0], bf[1]);                                \
    } else {                                                                                \
      _Pragma("unroll") for (int np = 0; np < NTS / 2; np++) {                              \
        uint32_t bf[4];                                                                     \
        ldmatrix_x4(bf, kvb + (uint32_t)((b_n0 + np * 16) * ROWB +                          \
                                         (((2 * (kk) + b_hi) ^ x7) << 4)));                 \
        _Pragma("unroll") for (int mi = 0; mi < SMT; mi++) {                                \
          mma_bf16_16816(pacc[mi][2 * np], af[mi], bf[0], bf[1]);                           \
          mma_bf16_16816(pacc[mi][2 * np + 1], af[mi], bf[2], bf[3]);                       \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  } while (0)
        /* sacc += pacc * the entries' scale (gi >= 0: group gi's; -1: none), pacc = 0. */
#define S_FOLD(gi)                                                                          \
  do {                                                                                      \
    _Pragma("unroll") for (int nt = 0; nt < NTS; nt++)                                      \
    _Pragma("unroll") for (int e = 0; e < 2; e++) {                                         \
      const int col_ = wn * 8 * NTS + nt * 8 + 2 * tig + e;                                 \
      const float sc_ = (gi) >= 0 ? scale_s[col_ * 4 + (gi)] : 1.0f;                        \
      _Pragma("unroll") for (int mi = 0; mi < SMT; mi++)                                    \
      _Pragma("unroll") for (int hh = 0; hh < 2; hh++) {                                    \
        sacc[mi][nt][2 * hh + e] = fmaf(pacc[mi][nt][2 * hh + e], sc_, sacc[mi][nt][2 * hh + e]); \
        pacc[mi][nt][2 * hh + e] = 0.0f;                                                    \
      }                                                                                     \
    }                                                                                       \
  } while (0)
        if (FMT == FMT_DS) {
          /* The rope part first, then the groups, not unrolled over them and their steps
           * unrolled by 4: unrolled further, the loads hoisted ahead spill (ptxas, 64
           * heads, dr 64: 52 bytes). */
#pragma unroll
          for (int kk = 32; kk < DQK / 16; kk++) S_STEP(kk);
          if (DR > 0) S_FOLD(-1);
#pragma unroll 1
          for (int gi = 0; gi < 4; gi++) {
#pragma unroll 4
            for (int k8 = 0; k8 < 8; k8++) S_STEP(8 * gi + k8);
            S_FOLD(gi);
          }
        } else {
#pragma unroll
          for (int kk = 0; kk < DQK / 16; kk++) S_STEP(kk);
          S_FOLD(-1);
        }
#undef S_STEP
#undef S_FOLD

        /* ---- online softmax: scale, softcap, mask; row max across the WN warps ---- */
#pragma unroll
        for (int mi = 0; mi < SMT; mi++) {
          tmax[mi][0] = tmax[mi][1] = NEG_INF;
          fwd_scale_logits<NTS * 4>(&sacc[mi][0][0], a.logit_scale, a.softcap);
#pragma unroll
          for (int nt = 0; nt < NTS; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              const bool u = mk[wn * 8 * NTS + nt * 8 + 2 * tig + e] != 0;
#pragma unroll
              for (int hh = 0; hh < 2; hh++) {
                float v = sacc[mi][nt][2 * hh + e];
                v = u ? v : NEG_INF;
                sacc[mi][nt][2 * hh + e] = v;
                tmax[mi][hh] = fmax_nan(tmax[mi][hh], v); /* a NaN logit poisons the row */
              }
            }
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            tmax[mi][hh] = fmax_nan(tmax[mi][hh], __shfl_xor_sync(0xffffffffu, tmax[mi][hh], 1));
            tmax[mi][hh] = fmax_nan(tmax[mi][hh], __shfl_xor_sync(0xffffffffu, tmax[mi][hh], 2));
            if (tig == 0) red[wn * M + wm * 16 * SMT + mi * 16 + g + 8 * hh] = tmax[mi][hh];
          }
        }
      }
      __syncthreads();
      if (s_warp) {
#pragma unroll
        for (int mi = 0; mi < SMT; mi++) {
          float mls[2], alpha[2], lsum[2] = {0.0f, 0.0f};
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            const int row = wm * 16 * SMT + mi * 16 + g + 8 * hh;
            float mx = NEG_INF;
#pragma unroll
            for (int w = 0; w < WN; w++) mx = fmax_nan(mx, red[w * M + row]);
            const float m_new = fmax_nan(m_run[mi][hh], mx); /* NaN: out, lse, max NaN */
            const float m_use = m_new == NEG_INF ? 0.0f : m_new; /* nothing used yet */
            alpha[hh] = ex2_approx((m_run[mi][hh] - m_use) * FWD_LOG2E);
            m_run[mi][hh] = m_new;
            mls[hh] = m_use * FWD_LOG2E;
          }
#pragma unroll
          for (int nt = 0; nt < NTS; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
              const float p0 = ex2_approx(fmaf(sacc[mi][nt][2 * hh], FWD_LOG2E, -mls[hh]));
              const float p1 = ex2_approx(fmaf(sacc[mi][nt][2 * hh + 1], FWD_LOG2E, -mls[hh]));
              lsum[hh] += p0 + p1;
              const int row = wm * 16 * SMT + mi * 16 + g + 8 * hh;
              const int col = wn * 8 * NTS + nt * 8 + 2 * tig;
              const uint32_t at = L.p + swz(row, col >> 3, BN * 2) + (col & 7) * 2;
              if (FMT != FMT_DS) {
                *(uint32_t *)(smem + at) = pack_bf16x2(p0, p1);
              } else {
                /* FP8_DS: P of group gi carries the entries' group-gi scales (one rounding
                 * to bf16, as plain P gets), so V stays exact e4m3 in bf16. */
#pragma unroll
                for (int gi = 0; gi < 4; gi++)
                  *(uint32_t *)(smem + at + gi * (M * BN * 2)) =
                      pack_bf16x2(p0 * scale_s[col * 4 + gi], p1 * scale_s[(col + 1) * 4 + gi]);
              }
            }
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            l_run[mi][hh] = l_run[mi][hh] * alpha[hh] + lsum[hh];
            if (wn == 0 && tig == 0) alpha_s[wm * 16 * SMT + mi * 16 + g + 8 * hh] = alpha[hh];
          }
        }
      }
      __syncthreads();

      /* ---- O = alpha O + P V: all M heads x this warp's 64 output columns ---- */
      /* FP8_DS: this warp's columns 64w..64w+63 lie in group w / 2: its own P buffer. */
      const uint32_t pv_group = FMT == FMT_DS ? (uint32_t)(warp >> 1) : 0u;
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const float a0 = alpha_s[mt * 16 + g], a1 = alpha_s[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
          O[mt][nt][0] *= a0, O[mt][nt][1] *= a0;
          O[mt][nt][2] *= a1, O[mt][nt][3] *= a1;
        }
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
          ldmatrix_x4(pa[mt], p_s + pv_group * (M * BN * 2) +
                                  swz(mt * 16 + (lane & 15), 2 * kk + (lane >> 4), BN * 2));
        const int krow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int np = 0; np < 4; np++) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, kvb + swz(krow, warp * 8 + np * 2 + (lane >> 4), ROWB));
#pragma unroll
          for (int mt = 0; mt < MT; mt++) {
            mma_bf16_16816(O[mt][2 * np], pa[mt], bf[0], bf[1]);
            mma_bf16_16816(O[mt][2 * np + 1], pa[mt], bf[2], bf[3]);
          }
        }
      }
      __syncthreads(); /* the KV buffer, P, red and alpha are rewritten next tile */
      if (FMT == FMT_BF16 && kv_bufs == 1 && j + 1 < ntiles) { /* one stage: load after use */
        ISSUE_TILE(j + 1, kv_s + (uint32_t)(lr * ROWB));
        cp_async_commit();
      }
    }
#undef ISSUE_TILE
    cp_async_wait<0>();
    PROBE_STAMP(4);

    /* Row sums: quad, then across the WN warps sharing a row. */
    if (s_warp) {
#pragma unroll
      for (int mi = 0; mi < SMT; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          float l = l_run[mi][hh];
          l += __shfl_xor_sync(0xffffffffu, l, 1);
          l += __shfl_xor_sync(0xffffffffu, l, 2);
          const int row = wm * 16 * SMT + mi * 16 + g + 8 * hh;
          if (tig == 0) {
            red[wn * M + row] = l;
            if (wn == 0) rowmax_s[row] = m_run[mi][hh];
          }
        }
    }
  } else {
    /* No used entry can exist in this split: every row gets l = 0, m = -inf. */
    for (int i = tid; i < 128; i += FWD_THREADS) red[i] = 0.0f;
    for (int i = tid; i < M; i += FWD_THREADS) rowmax_s[i] = NEG_INF;
  }
  __syncthreads();
  PROBE_STAMP(5);

  /* ---- epilogue: merged in the kernel, final (num_splits == 1) or partial state ---- */
#if __CUDA_ARCH__ >= 900
  if (a.cluster_merge) {
    fwd_merge_in_kernel<MT, WN>(a, smem, L, O, t, grp, split, h0);
    fwd_count_bad(a, grp, bad);
    PROBE_STAMP(6);
    PROBE_PUT(1, a.num_splits);
    return;
  }
#endif
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = mt * 16 + g + 8 * hh, head = h0 + row;
      if (head >= a.num_heads) continue;
      float l = 0.0f;
#pragma unroll
      for (int w = 0; w < WN; w++) l += red[w * M + row];
      const fwd_row_out r =
          fwd_row_epilogue(a, t, split, head, l, rowmax_s[row], rowmax_s[row],
                           warp == 0 && tig == 0);
      const int col = warp * 64 + 2 * tig;
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const float v0 = O[mt][nt][2 * hh] * r.f, v1 = O[mt][nt][2 * hh + 1] * r.f;
        if (r.out) *(uint32_t *)(r.out + col + nt * 8) = pack_bf16x2(v0, v1);
        if (r.part) *(float2 *)(r.part + col + nt * 8) = make_float2(v0, v1);
      }
    }

  fwd_count_bad(a, grp, bad);
  PROBE_STAMP(6);
  PROBE_PUT(0, a.num_splits);
}

/* Whether the in-kernel merge's staged O ([16 mt][SMLA_CUDA_FWD_OST_STRIDE] floats, over
 * Q, the stages and P) fits below the variant's row-state arrays. */
static bool fwd_merge_fits(const smla_cuda_fwd_layout &L, int mt) {
  return (uint32_t)(16 * mt * SMLA_CUDA_FWD_OST_STRIDE * 4) <= L.red;
}

/* A launch of `blocks` blocks of the generic kernel: clusters of `cluster` blocks (0: no
 * cluster attribute), a programmatic dependent when pdl. attr: room for 2 attributes. */
static cudaLaunchConfig_t fwd_launch_config(unsigned blocks, uint32_t smem, int cluster,
                                            int pdl, void *stream, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks, 1, 1);
  cfg.blockDim = dim3(FWD_THREADS, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = (cudaStream_t)stream;
  unsigned n = 0;
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = (unsigned)cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    n++;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cfg;
}

template <int FMT, int DR, int MT>
static cudaError_t fwd_launch_t(const smla_cuda_fwd_config *c, const smla_cuda_fwd_args *a,
                                void *stream) {
  const smla_cuda_fwd_layout L = smla_cuda_fwd_layout_of(FMT, DR, MT, c->pipe);
  const int64_t blocks = a->num_tokens * a->groups * a->num_splits;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const int C = a->cluster_merge;
  if (C && (C < 2 || C > 8 || a->num_splits % C != 0 ||
            a->num_splits / C > SMLA_CUDA_FWD_MERGE_MAX_R ||
            (a->num_splits > C && !a->merge_counters) || !fwd_merge_fits(L, MT)))
    return cudaErrorInvalidValue;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      fwd_launch_config((unsigned)blocks, L.total, C, a->pdl, stream, attr);
  return cudaLaunchKernelEx(&cfg, fwd_kernel<FMT, DR, MT>, *a, c->pipe);
}

/* SMLA_FWD_PDL=0 (A/B build): the generic forward is never a programmatic dependent. */
#ifndef SMLA_FWD_PDL
#define SMLA_FWD_PDL 1
#endif

template <int FMT, int DR, int MT>
static cudaError_t fwd_caps_t(const smla_cuda_fwd_config *c, int cluster, int *clusters,
                              int *pdl_ok) {
  *clusters = 0;
  *pdl_ok = 0;
  cudaFuncAttributes fa;
  cudaError_t e = cudaFuncGetAttributes(&fa, fwd_kernel<FMT, DR, MT>);
  if (e != cudaSuccess) return e;
  /* The code that runs came from sm_90+ PTX: griddepcontrol and clusters are in it (a
   * device JIT-compiling the compute_80 PTX gets a kernel without them). */
  if (fa.ptxVersion < 90) return cudaSuccess;
  *pdl_ok = SMLA_FWD_PDL;
  const smla_cuda_fwd_layout L = smla_cuda_fwd_layout_of(FMT, DR, MT, c->pipe);
  if (cluster < 2 || !fwd_merge_fits(L, MT)) return cudaSuccess;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      fwd_launch_config((unsigned)cluster, L.total, cluster, 0, NULL, attr);
  return cudaOccupancyMaxActiveClusters(clusters, fwd_kernel<FMT, DR, MT>, &cfg);
}

template <int FMT, int DR, int MT>
static cudaError_t fwd_prepare_t(int max_smem) {
  return cudaFuncSetAttribute(fwd_kernel<FMT, DR, MT>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
}

/* The six (dr, mtiles) variants of one format. */
#define SMLA_FWD_DEFINE(NAME, FMT)                                                           \
  extern "C" cudaError_t smla_cuda_fwd_launch_##NAME(                                       \
      const smla_cuda_fwd_config *c, const smla_cuda_fwd_args *a, void *stream) {           \
    const int v = (c->dr == 64 ? 0 : 3) + (c->mtiles == 1 ? 0 : c->mtiles == 2 ? 1 : 2);    \
    switch (v) {                                                                            \
    case 0: return fwd_launch_t<FMT, 64, 1>(c, a, stream);                                  \
    case 1: return fwd_launch_t<FMT, 64, 2>(c, a, stream);                                  \
    case 2: return fwd_launch_t<FMT, 64, 4>(c, a, stream);                                  \
    case 3: return fwd_launch_t<FMT, 0, 1>(c, a, stream);                                   \
    case 4: return fwd_launch_t<FMT, 0, 2>(c, a, stream);                                   \
    default: return fwd_launch_t<FMT, 0, 4>(c, a, stream);                                  \
    }                                                                                       \
  }                                                                                         \
  extern "C" cudaError_t smla_cuda_fwd_caps_##NAME(const smla_cuda_fwd_config *c,           \
                                                   int cluster, int *clusters, int *pdl) {  \
    const int v = (c->dr == 64 ? 0 : 3) + (c->mtiles == 1 ? 0 : c->mtiles == 2 ? 1 : 2);    \
    switch (v) {                                                                            \
    case 0: return fwd_caps_t<FMT, 64, 1>(c, cluster, clusters, pdl);                      \
    case 1: return fwd_caps_t<FMT, 64, 2>(c, cluster, clusters, pdl);                      \
    case 2: return fwd_caps_t<FMT, 64, 4>(c, cluster, clusters, pdl);                      \
    case 3: return fwd_caps_t<FMT, 0, 1>(c, cluster, clusters, pdl);                       \
    case 4: return fwd_caps_t<FMT, 0, 2>(c, cluster, clusters, pdl);                       \
    default: return fwd_caps_t<FMT, 0, 4>(c, cluster, clusters, pdl);                      \
    }                                                                                       \
  }                                                                                         \
  extern "C" cudaError_t smla_cuda_fwd_prepare_##NAME(const smla_cuda_fwd_config *c,        \
                                                      int max_smem) {                       \
    const int v = (c->dr == 64 ? 0 : 3) + (c->mtiles == 1 ? 0 : c->mtiles == 2 ? 1 : 2);    \
    switch (v) {                                                                            \
    case 0: return fwd_prepare_t<FMT, 64, 1>(max_smem);                                     \
    case 1: return fwd_prepare_t<FMT, 64, 2>(max_smem);                                     \
    case 2: return fwd_prepare_t<FMT, 64, 4>(max_smem);                                     \
    case 3: return fwd_prepare_t<FMT, 0, 1>(max_smem);                                      \
    case 4: return fwd_prepare_t<FMT, 0, 2>(max_smem);                                      \
    default: return fwd_prepare_t<FMT, 0, 4>(max_smem);                                     \
    }                                                                                       \
  }

#endif /* SMLA_CUDA_FORWARD_IMPL_CUH */
