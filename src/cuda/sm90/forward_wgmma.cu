/*
 * forward_wgmma.cu: the Hopper (sm_90a) sparse-MLA forward for BF16 caches and 64 heads
 * per block (SPEC §3), tensor cores through wgmma with both operands in shared memory (and
 * P from registers); and, at the end, the small-head kernel (N <= 32 by default: heads on
 * the wgmma N axis; the plan gives the generic kernel the fewest rows, where it is faster).
 * Design, napkin math and every measured version (v1-v22; v2-v8's code is in the git
 * history, v3 / v7 last at d2d16d7, v12 at 8663169, v13 at f3d4a0c, v15 (tile pairs) at
 * dea8388, v16 (S before the cross PV) at 6c73d08, v18 (two gather warpgroups) at dcf51d5,
 * v19 (either event first) at b193fe8, v20 (the column pair, 2-block clusters) at d70d269,
 * v22 (the scorer: S and softmax on a third compute warpgroup) at e5161fd; v23 (three
 * 48-row stages, the scorer a tile ahead, a persistent grid; built, not yet run on a GPU)
 * below, -DSMLA_FWD90_V23=1/2):
 * docs/design/cuda-sm90-forward.md.
 *
 * Work: units (row t, group of 64 heads, KV split), the same grid, split policy,
 * partial-state format and combine as the generic kernel (forward_impl.cuh), so the plan
 * can pick either; one block a unit, but at one split without a cluster merge, where the
 * grid is persistent (v14, SMLA_FWD90_PERSIST) and each block takes several units in
 * turn. Three warpgroups (384 threads):
 * a gather warpgroup (setmaxnreg 56) brings Q and the KV tiles of 64 gathered rows into
 * two stages (cp.async, 8 lanes a row), publishes each tile's used-entry bits and signals
 * `full`; two compute warpgroups (setmaxnreg 224) run v11, the relay (w11_loop): tile j
 * belongs to warpgroup j % 2, which computes
 *   S[64][64] = Q[64][dqk] K^T     dqk/16 wgmma m64n64k16 (A = Q, B = K rows, K-major)
 *   the online softmax             from the reference max the other warpgroup passed on
 *                                  with tile j-1; P (bf16) to registers and to the stage's
 *                                  P block, the new reference max to xm, arrive on pready
 *   O[:, own 256] += P V           4 k-steps of 2 wgmma m64n128k16, P from registers
 * while the other warpgroup adds the same P (from the P block) times V to its 256 output
 * columns. Each compute warp arrives on the stage's `empty` once its PV of the tile has
 * completed; the gather warpgroup then refills the stage with tile j + 2.
 *
 * Shared memory (bytes from a 1024-aligned base; every operand in the 128-byte-swizzle
 * layout wgmma reads: a [kb][64 rows][128 B] stack of 8 KB blocks of 64 bf16 columns,
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8)): Q 9 x 8 KB, KV 2 stages x 9 x 8
 * KB, an 8 KB block at p (dr = 64: it holds only xm, 1 KB; dr = 0: P of stage 0, then P of
 * stage 1 and xm follow), row sums, maxima and largest logits, the used-entry words (at
 * offset 64 of a 256-byte region: the layout the earlier loops shared), mbarriers. dr =
 * 64: 225 KB (+1 KB alignment slack) of the 227 KB opt-in, checked below at compile time. A masked entry's row is zero-filled without reading the cache and its
 * logits are -inf, so NaN in unused rows cannot leak in.
 * Epilogue: the final row (one split), a partial row for the combine kernel, or with
 * a.cluster_merge (2..8 splits as one cluster, v6) the merged row (w_cluster_factor,
 * w_cluster_sum below).
 */
#include "../forward_common.cuh"
#include "../probe.cuh"
#include "wgmma.cuh"

#include <limits.h>

/* SMLA_FWD90_LAZY_RESCALE (v10, default 1; 0 rescales at every tile): a row's reference
 * max (the one its sum and O are relative to) moves only when the tile's max passes it by
 * more than W_TAU = 8 ln 2, so P <= 2^8 (bf16 P keeps its relative precision; the fp32
 * sums have room), and a warp rescales its O (128 multiplies a thread) only when one of
 * its rows moved. max_logit comes from a separate running max (m_top). The rounding of P
 * and of the sums changes, not their error bounds. */
#ifndef SMLA_FWD90_LAZY_RESCALE
#define SMLA_FWD90_LAZY_RESCALE 1
#endif
#define W_TAU (SMLA_FWD90_LAZY_RESCALE ? 5.5451774f : 0.0f)
/* The epilogue stages O in shared memory and stores whole rows (measured against
 * per-thread fragment stores in bench/RESULTS.md, 2026-12-04): floats per staged row. */
#define W_OST_STRIDE 520


/* SMLA_FWD90_PDL (session 16; default 1): the sm90 kernels are launched as programmatic
 * dependents of the stream's previous kernel where the plan asks (a.pdl), as the generic
 * kernel is; 0 launches them plainly. The plan asks for the small-head kernel only: with
 * PDL, T = 1 took 0.4-0.6 us less there, but at N = 128 the 64-head kernel took 2 us more
 * (17.5 -> 19.5 us; N = 64: 16.0 -> 15.3), bench/RESULTS.md session 16 call 2. */
#ifndef SMLA_FWD90_PDL
#define SMLA_FWD90_PDL 1
#endif

/* SMLA_FWD90_PERSIST (v14, session 20; docs/design/cuda-sm90-forward.md; the default since
 * session 22): 1: the 64-head kernel with one split and no cluster merge runs as a persistent
 * grid of a.resident_blocks blocks, each taking units (t, group) blockIdx.x, + gridDim.x, ..,
 * so that the next unit's Q (once the last S of this one is done) and first two tiles (once
 * their stages' PVs are) load under this unit's last tiles and epilogue; a unit with a next
 * one stores its final rows from registers, the block's last unit stages them. 0: one
 * block a unit, the epilogue staged through shared memory (v11 as measured to session 19;
 * the unit loop then makes one pass and nobody waits on qfree). Measured with the mended
 * epilogue (H100, bench/RESULTS.md session 22, v11 in the same calls, cold): N = 128 T =
 * 1024 1190 against 1277-1301 us, T = 4096 5114 against 5323-5354 (also 5% amortized); N =
 * 64 T = 1024 and 4096 ~1% faster; T = 16 and 64 level. */
#ifndef SMLA_FWD90_PERSIST
#define SMLA_FWD90_PERSIST 1
#endif

#define W_THREADS 256 /* the two compute warpgroups */
#define W_BLOCK (W_THREADS + 128) /* and the gather warpgroup */
#define W_HEADS 64
#define W_KB_BYTES 8192 /* one [64 rows][128 B] block of 64 bf16 columns */

struct w_layout {
  uint32_t q, kv, p, xm, red, rowmax, rowtop, mask, bar, total;
};

__host__ __device__ constexpr w_layout w_layout_of(int dr) {
  w_layout l = {};
  const uint32_t tile = (uint32_t)((512 + dr) / 64) * W_KB_BYTES;
  l.q = 0;
  l.kv = l.q + tile;
  l.p = l.kv + 2u * tile; /* dr = 0: P of stage 0, then P of stage 1 (dr = 64: P of a
                             stage goes in its rope block, which only S reads) */
  /* [2 stages][m, top][64] float: the reference max and the largest logit after the
   * stage's tile (dr = 64: in the 8 KB block at p). */
  l.xm = dr ? l.p : l.p + 2u * W_KB_BYTES;
  l.red = dr ? l.p + W_KB_BYTES : l.xm + 1024u; /* [2][64] float */
  l.rowmax = l.red + 2u * 64u * 4u; /* [64] float: the max each row's sum is relative to */
  l.rowtop = l.rowmax + 64u * 4u; /* [64] float: each row's largest logit (max_logit) */
  l.mask = l.rowtop + 64u * 4u;  /* at 64: [2] uint64, each stage's used-entry bits */
  l.bar = l.mask + 4u * 64u;     /* mbarriers full[2], empty[2], pready[2], qfree */
  l.total = l.bar + 7u * 8u;
  return l;
}
/* Both layouts, with the 1 KB slack that aligns the base, within the 227 KB opt-in (else
 * the plan would drop to the generic kernel at run time). */
static_assert(w_layout_of(64).total + 1024u <= 232448u, "sm90 layout, dr = 64");
static_assert(w_layout_of(0).total + 1024u <= 232448u, "sm90 layout, dr = 0");

/* Byte offset of 16-byte chunk c (of 8 bf16 columns) of row r in a stack of 128-byte-
 * swizzled 8 KB blocks. */
__device__ __forceinline__ uint32_t w_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * W_KB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}


/* The in-kernel split merge (a.cluster_merge; docs/design/cuda-sm90-forward.md, v6 and
 * v21): the splits of one (t, head group) are one cluster. Every block reads the row max m
 * and sum l of every split from the others' shared memory, scales its own O by its weight
 * exp(m_k - M) / (L + sink term) (the same M and L in every block: same order of reads
 * and sums) into its staged O, and after a second cluster barrier sums the S values of
 * the columns it owns, 8-column units [64 k / S, 64 (k + 1) / S) for block k, reading the
 * other blocks' staged O over distributed shared memory; a third barrier (arrive after
 * those reads, wait before exit) keeps every block's stages alive until the others are
 * done. v6 exchanged the columns through partial rows in L2: 4.2-4.7 us slower a forward
 * (H100, bench/RESULTS.md session 26 call 1). The A/B against the combine kernel is a plan
 * flag (SMLA_PLAN_SEPARATE_MERGE, `smla bench --separate-merge`), not a build. */

/* Row `row`'s weight of this block's O in the cluster's merged row, and (writer) the
 * merged lse and max_logit. red_s, rowmax_s: shared addresses of red and rowmax. */
__device__ __forceinline__ float w_cluster_factor(const smla_cuda_fwd_args &a, int64_t t,
                                                  int head, int row, uint32_t red_s,
                                                  uint32_t rowmax_s, uint32_t rowtop_s,
                                                  float l_own, float m_own, bool writer) {
  const float NEG_INF = -INFINITY;
  const int S = a.num_splits;
  float mk[8], lk[8], M = NEG_INF, top = NEG_INF;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    mk[k] = NEG_INF, lk[k] = 0.0f;
    if (k >= S) continue;
    mk[k] = ld_cluster_f32(rowmax_s + 4u * row, (uint32_t)k);
    lk[k] = ld_cluster_f32(red_s + 4u * row, (uint32_t)k) +
            ld_cluster_f32(red_s + 256u + 4u * row, (uint32_t)k);
    if (writer) top = fmax_nan(top, ld_cluster_f32(rowtop_s + 4u * row, (uint32_t)k));
  }
#pragma unroll
  for (int k = 0; k < 8; k++)
    if (k < S) M = fmax_nan(M, mk[k]); /* a NaN max poisons the row */
  float L = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; k++)
    if (k < S) L += lk[k] * part_weight(mk[k], lk[k], M);
  if (writer) fwd_store_row_scalars(a, t, head, M, L, top);
  return part_weight(m_own, l_own, M) * row_out_factor(a.sink, head, M, L, a.value_scale);
}

/* Block `me` of the cluster sums its columns over the S splits (its own from the staged
 * ost, the others' from their staged ost at the same shared address, over distributed
 * shared memory) and stores them as bf16: every load of a thread issued before the first
 * add (up to 33 x 16 bytes). */
template <int S>
__device__ __forceinline__ void w_cluster_sum(const smla_cuda_fwd_args &a, int64_t t, int h0,
                                              int me, const float *ost, int tid) {
  const uint32_t ost_s = smem_addr(ost);
  constexpr int UMAX = (64 + S - 1) / S; /* 8-column units a block owns, at most */
  constexpr int IPT = (64 * 2 * UMAX + W_THREADS - 1) / W_THREADS; /* float4 per thread */
  const int u0 = 64 * me / S, u1 = 64 * (me + 1) / S;
  const int c0 = 8 * u0, nch = 2 * (u1 - u0), items = 64 * nch;
  float4 v[IPT][S];
#pragma unroll
  for (int u = 0; u < IPT; u++) {
    const int i = tid + W_THREADS * u;
    const int row = i / nch, col = c0 + 4 * (i - row * nch);
    const bool ok = i < items && h0 + row < a.num_heads;
#pragma unroll
    for (int k = 0; k < S; k++) {
      if (!ok)
        v[u][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      else if (k == me)
        v[u][k] = *(const float4 *)(ost + row * W_OST_STRIDE + col);
      else
        v[u][k] = ld_cluster_f32x4(ost_s + 4u * (uint32_t)(row * W_OST_STRIDE + col), (uint32_t)k);
    }
  }
#pragma unroll
  for (int u = 0; u < IPT; u++) {
    const int i = tid + W_THREADS * u;
    const int row = i / nch, col = c0 + 4 * (i - row * nch), head = h0 + row;
    if (i >= items || head >= a.num_heads) continue;
    float4 acc = v[u][0];
#pragma unroll
    for (int k = 1; k < S; k++)
      acc.x += v[u][k].x, acc.y += v[u][k].y, acc.z += v[u][k].z, acc.w += v[u][k].w;
    uint16_t *dst = a.out + t * a.out_stride_t + (int64_t)head * a.out_stride_h + col;
    *(uint2 *)dst = make_uint2(pack_bf16x2(acc.x, acc.y), pack_bf16x2(acc.z, acc.w));
  }
}

/* ---- v11: the relay (docs/design/cuda-sm90-forward.md) -----------------------------------
 * Tile j belongs to compute warpgroup j % 2, which computes its whole S (m64n64k16: Q read
 * once a tile), its softmax and P, and adds P V to its own 256 output columns from registers
 * (RS); the other warpgroup adds the same P, from the stage's P block, times V to its
 * columns (SS). Each warpgroup alternates between a tile of its own and one of the other's:
 *   OWN(j):   wait for the PV before and release its part of that stage | wait for tile j
 *             | S(j) | softmax from m(j-1): m(j) and P(j), P(j) to the P block, m(j) to xm,
 *             arrive on pready | O *= alpha where a row moved | O += P(j) V(j) (RS)
 *   CROSS(j): wait for the PV before and release its part of that stage | wait on pready
 *             | O and l rescaled to m(j) where a row moved | O += P(j) V(j) (SS)
 * The stage of tile j-1 is released at the top of the next step, before the wait for tile
 * j: the orders that issue S(j) earlier (EARLY_S, v12: session 15) tied that release to
 * tile j's landing and lost 18-41% (one tile in flight instead of two).
 * The reference max (and the largest logit, for max_logit) runs one way from tile to tile,
 * so each warpgroup's softmax runs while the other's S and PVs use the tensor cores, and
 * every row has the same reference in both warpgroups after each tile. A stage is released
 * by 8 warp arrivals, each as soon as that warp's PV of the tile has completed, and is
 * refilled with tile j + 2: the gathers keep v7's one tile of look-ahead (v8's pairs held
 * both stages). The used-entry bits come from the gather warpgroup (a 64-bit word a stage,
 * published with the tile), so the compute warps load no slot. */
/* Measured against v3 / v7, its predecessors (H100, bench/RESULTS.md session 13 run 5, cold):
 * N=128 T=1024 1379-1416 -> 1207-1214 us, T=64 97.4 -> 83.9-84.4, T=16 41.8-42.1 -> 39.4,
 * N=64 T=1024 827 -> 790, T=1 equal. */

__device__ __forceinline__ void w11_pin_o(float O[2][64]) {
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
}

__device__ __forceinline__ void w11_scale_o(float O[2][64], const float f[2]) {
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int i = 0; i < 64; i++) O[h][i] *= f[(i >> 1) & 1];
}

/* O[:, 256 wg + ...] += P V of the stage at kvb, P from registers: pa[4k..4k+3] is this
 * thread's A fragment of k-step k (the accumulator layout of S, packed to bf16 pairs). */
__device__ __forceinline__ void w11_pv_rs(float O[2][64], const uint32_t pa[16], uint32_t kvb,
                                          int wg) {
  w11_pin_o(O);
  wg_fence();
#pragma unroll
  for (int k = 0; k < 4; k++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      wgmma_m64n128k16_rs_tb(O[h], pa + 4 * k,
                             wg_desc(kvb + (uint32_t)((4 * wg + 2 * h) * W_KB_BYTES + k * 16 * 128),
                                     W_KB_BYTES, 1024));
  wg_commit();
}

/* O[:, 256 wg + ...] += P V over KS k-steps of 16 entries, one commit group: V the rows of
 * the stage at kvb (column blocks BLK bytes apart, read MN-major), P from shared memory at
 * p_s, K-major, a k-step PKSTEP bytes on: in the 128-byte swizzle (PLBO = 0: v11's [64][64]
 * block) or without swizzle (v23's [64][48]: core matrices PLBO bytes apart along K, PSBO
 * along M). */
template <int KS, uint32_t BLK, uint32_t PKSTEP = 32, uint32_t PLBO = 0, uint32_t PSBO = 0>
__device__ __forceinline__ void w_pv_ss(float O[2][64], uint32_t p_s, uint32_t kvb, int wg) {
  w11_pin_o(O);
  wg_fence();
#pragma unroll
  for (int k = 0; k < KS; k++) {
    const uint64_t da = PLBO ? wg_desc_plain(p_s + PKSTEP * k, PLBO, PSBO)
                             : wg_desc(p_s + PKSTEP * k, 16, 1024);
#pragma unroll
    for (int h = 0; h < 2; h++)
      wgmma_m64n128k16_ss_tb(O[h], da,
                             wg_desc(kvb + (uint32_t)((4 * wg + 2 * h) * BLK + k * 16 * 128),
                                     BLK, 1024));
  }
  wg_commit();
}

/* v11's cross PV: the 64 entries of the stage at kvb, P from the [64][64] block at p_s. */
__device__ __forceinline__ void w11_pv_ss(float O[2][64], uint32_t p_s, uint32_t kvb, int wg) {
  w_pv_ss<4, W_KB_BYTES>(O, p_s, kvb, wg);
}

/* A probe build (kind 12 since session 23; kind 11 before) sums compute thread 0's time over
 * its tiles in pt[1..6]: 1 (own tiles) the wait for the other warpgroup's cross PV before
 * this tile's S (its stage and the tensor cores' turn), 2 the wait on full (own tiles: the
 * gathers' share), 3 S issued and waited for, 4 the logits, row max, exponentials and P and
 * m published, 5 (the other's tiles) the wait for this warpgroup's own PV before and on
 * pready (the relay), 6 l and O rescaled and the PV issued (own and the other's tiles).
 * Kind 11 had the own PV wait and pready in 1 with the cross PV wait, and the publish in 5. */
#if SMLA_PROBE
#define W11_PROBE_ARGS , unsigned long long *pt
#define W11_STEP_PROBE_ARGS , unsigned long long *pt, unsigned long long &plast
#define W11_STEP_PROBE , pt, plast
#if SMLA_PROBE_G
#define W11_PHASE(k_) (void)plast /* kind 13: pt holds the gather stamps' sums */
#else
#define W11_PHASE(k_)                                                                      \
  do {                                                                                     \
    if (threadIdx.x == 0) {                                                                \
      const unsigned long long n_ = probe_now();                                           \
      pt[(k_)] += n_ - plast;                                                              \
      plast = n_;                                                                          \
    }                                                                                      \
  } while (0)
#endif
#else
#define W11_PHASE(k_)
#define W11_PROBE_ARGS
#define W11_STEP_PROBE_ARGS
#define W11_STEP_PROBE
#endif

/* The top of a step at tile j: the PV of tile j-1 (this warpgroup's part; RS: pa was read
 * until here) is done, and this warp releases its part of that stage. */
__device__ __forceinline__ void w11_release_prev(int j, uint32_t gj, uint32_t empty_b,
                                                 float O[2][64], const uint32_t pa[16]) {
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
  w11_pin_o(O);
  if (j >= 1 && (threadIdx.x & 31) == 0) mbar_arrive(empty_b + 8u * ((gj & 1u) ^ 1u));
}

/* CROSS(j), after the wait on pready: l and O moved to m(j) where a row moved, and the
 * row's largest logit taken (xmj: [m, top][64] after tile j). */
__device__ __forceinline__ void w11_cross_scale(const float *xmj, int r0, float O[2][64],
                                                float m_run[2], float l_run[2],
                                                float m_top[2]) {
  const float NEG_INF = -INFINITY;
  float f[2];
  bool moved = false;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = r0 + 8 * hh;
    const float mj = xmj[row];
    m_top[hh] = xmj[64 + row];
    moved |= !(mj == m_run[hh]); /* NaN moves */
    const float use = mj == NEG_INF ? 0.0f : mj;
    f[hh] = ex2_approx((m_run[hh] - use) * FWD_LOG2E);
    l_run[hh] *= f[hh];
    m_run[hh] = mj;
  }
  if (__any_sync(0xffffffffu, moved)) w11_scale_o(O, f);
}

/* OWN(j), once S(j) is in s: logits scaled and masked (um: this thread's used bits), the
 * row max from m(j-1) (m_run becomes m(j)), P(j) to pa, and the factor alpha and the sums
 * lsum with which the caller moves l and O, once no PV into O is in flight. NB: n8 column
 * blocks of the tile (8: v11's 64 entries; 6: v23's 48). */
template <int NB = 8>
__device__ __forceinline__ void w11_own_softmax(const smla_cuda_fwd_args &a, float s[4 * NB],
                                                uint64_t um, float m_run[2], float m_top[2],
                                                uint32_t pa[2 * NB], float alpha[2],
                                                float lsum[2], bool &moved) {
  const float NEG_INF = -INFINITY;
  float tmax[2] = {NEG_INF, NEG_INF};
  if (!SMLA_PROBE_NO_EXP) fwd_scale_logits<4 * NB>(s, a.logit_scale, a.softcap);
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = s[4 * n + e];
      v = (um >> (8 * n + (e & 1))) & 1u ? v : NEG_INF;
      s[4 * n + e] = v;
      tmax[e >> 1] = fmax_nan(tmax[e >> 1], v); /* a NaN logit poisons the row */
    }
  float mls[2];
  lsum[0] = lsum[1] = 0.0f;
  moved = false;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 1));
    tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 2));
    m_top[hh] = fmax_nan(m_top[hh], tmax[hh]);
    float m_new = fmax_nan(m_run[hh], tmax[hh]); /* NaN: out, lse, max NaN */
    /* Lazy (v10): the reference stays while the max grew by at most W_TAU. */
    if (W_TAU > 0.0f && m_new - m_run[hh] <= W_TAU) m_new = m_run[hh];
    else moved = true;
    const float use = m_new == NEG_INF ? 0.0f : m_new; /* nothing used yet */
    alpha[hh] = ex2_approx((m_run[hh] - use) * FWD_LOG2E);
    m_run[hh] = m_new;
    mls[hh] = use * FWD_LOG2E;
  }
#pragma unroll
  for (int n = 0; n < NB; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
#if SMLA_PROBE_NO_EXP
      const float p0 = fmaf(s[4 * n + 2 * hh], FWD_LOG2E, -mls[hh]);
      const float p1 = fmaf(s[4 * n + 2 * hh + 1], FWD_LOG2E, -mls[hh]);
#else
      const float p0 = ex2_approx(fmaf(s[4 * n + 2 * hh], FWD_LOG2E, -mls[hh]));
      const float p1 = ex2_approx(fmaf(s[4 * n + 2 * hh + 1], FWD_LOG2E, -mls[hh]));
#endif
      lsum[hh] += p0 + p1;
      pa[2 * n + hh] = pack_bf16x2(p0, p1);
    }
#if SMLA_PROBE
#pragma unroll
  for (int i = 0; i < 2 * NB; i++) asm volatile("" ::"r"(pa[i]) : "memory");
#endif
}

/* OWN(j)'s hand-off: P(j) to the P block pb, m(j) and the largest logit to xmj, then the
 * arrival on pready. */
__device__ __forceinline__ void w11_own_publish(const uint32_t pa[16], int r0, int tig,
                                                uint8_t *pb, float *xmj, uint32_t pready_st,
                                                const float m_run[2], const float m_top[2]) {
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(uint32_t *)(pb + w_chunk(r0 + 8 * hh, n) + 4 * tig) = pa[2 * n + hh];
  if (tig == 0)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) xmj[r0 + 8 * hh] = m_run[hh], xmj[64 + r0 + 8 * hh] = m_top[hh];
  fence_proxy_async(); /* P visible to the other warpgroup's wgmma */
  /* Every thread arrives for its own P and xm stores (one arrival a warp after
   * __syncwarp measured the same, bench/RESULTS.md session 13 run 3, and racecheck,
   * which does not order the other lanes' stores before lane 0's arrival, flagged it). */
  mbar_arrive(pready_st);
}

/* One step of a compute warpgroup: tile j, its own (OWN) or the other's (CROSS), as the
 * "v11: the relay" comment above describes; the state (O, the row statistics, s, pa, q_s) lives in
 * the caller. */
template <int DR>
__device__ __forceinline__ void w11_step(const smla_cuda_fwd_args &a, uint8_t *smem,
                                         uint32_t sbase, const w_layout &L, int wg, int j,
                                         uint32_t gj, int ntiles, bool own, float O[2][64],
                                         float m_run[2],
                                         float l_run[2], float m_top[2], float s[32],
                                         uint32_t pa[16], uint32_t &q_s W11_STEP_PROBE_ARGS) {
  constexpr int KB = (512 + DR) / 64;
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3, r0 = 16 * wq + g;
  const uint32_t kv_s = sbase + L.kv;
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u, pready_b = full_b + 32u;
  const uint32_t qfree_b = full_b + 48u;
  const volatile uint64_t *umask = (const volatile uint64_t *)(smem + L.mask + 64);
  {
    /* Stage and phase by the block's tile count gj (units before this one included);
     * which warpgroup owns the tile, by its index j in the unit. */
    const uint32_t st = gj & 1u, par = (gj >> 1) & 1u;
    const uint32_t kvb = kv_s + st * TILE;
    const uint32_t pblk = DR ? kvb + 8u * W_KB_BYTES : sbase + L.p + st * W_KB_BYTES;
    float *xmj = (float *)(smem + L.xm) + st * 128u; /* [m, top][64] after tile j */
    w11_release_prev(j, gj, empty_b, O, pa);
    if (!own) { /* CROSS(j) */
      mbar_wait(pready_b + 8u * st, par); /* P(j), m(j); tile j landed before it */
      W11_PHASE(5);
      /* the stage and the P block, seen here, visible to wgmma */
      if (!SMLA_PROBE_NO_FENCE) fence_proxy_async();
      w11_cross_scale(xmj, r0, O, m_run, l_run, m_top);
      w11_pv_ss(O, pblk, kvb, wg);
      W11_PHASE(6);
      return;
    }
    /* OWN(j) */
    W11_PHASE(1);
#if SMLA_PROBE && SMLA_PROBE_G
    const unsigned long long g_s = probe_now();
#endif
    mbar_wait(full_b + 8u * st, par); /* tile j (and Q) */
#if SMLA_PROBE && SMLA_PROBE_G
    if (threadIdx.x == 0) {
      const unsigned long long g_r = probe_now();
      const unsigned long long g_q =
          *(const volatile unsigned long long *)(smem + L.mask + 128u + 8u * st);
      pt[1] += g_r - g_q;
      pt[2] += g_s >= g_q ? g_s - g_q : 0ull;
      pt[3] += 1ull;
      pt[4] += g_r - g_s;
      pt[5] += g_q > g_s ? g_q - g_s : 0ull;
    }
#endif
    W11_PHASE(2);
    if (!SMLA_PROBE_NO_FENCE) fence_proxy_async();
    /* bit 8 n + e: column 8 n + 2 tig + e used */
    const uint64_t um = umask[st] >> (2 * tig);
    asm volatile("mov.u32 %0, %0;" : "+r"(q_s)); /* descriptors not hoisted (spills) */
    wg_s_issue<64, SMLA_PROBE_S_HALF ? KB / 2 : KB>(s, q_s, W_KB_BYTES, kvb, W_KB_BYTES);
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; i++) wg_pin(s[i]);
    /* This warpgroup's last S of the unit has read Q: the next unit's may come in. */
    if (j + 2 >= ntiles && lane == 0) mbar_arrive(qfree_b);
    W11_PHASE(3);
    float alpha[2], lsum[2];
    bool moved;
    w11_own_softmax(a, s, um, m_run, m_top, pa, alpha, lsum, moved);
    w11_own_publish(pa, r0, tig, smem + (pblk - sbase), xmj, pready_b + 8u * st, m_run,
                    m_top);
    W11_PHASE(4);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
    if (W_TAU == 0.0f || __any_sync(0xffffffffu, moved)) w11_scale_o(O, alpha);
    w11_pv_rs(O, pa, kvb, wg);
    W11_PHASE(6);
  }
}

/* One compute warpgroup's tiles: O (its 256 columns), m_run, l_run (its own tiles' share of
 * the row sums) and m_top as the epilogue expects them; both warpgroups end at the same
 * m_run and m_top. */
template <int DR>
__device__ __forceinline__ void w11_loop(const smla_cuda_fwd_args &a, int ntiles, uint32_t g0,
                                         uint8_t *smem, uint32_t sbase, const w_layout &L,
                                         int wg, float O[2][64], float m_run[2], float l_run[2],
                                         float m_top[2] W11_PROBE_ARGS) {
#if SMLA_PROBE
  unsigned long long plast = probe_now();
#endif
  uint32_t q_s = sbase + L.q;
  float s[32];
  uint32_t pa[16];
#pragma unroll
  for (int i = 0; i < 16; i++) pa[i] = 0u;
  const int lane = threadIdx.x & 31;
  const uint32_t empty_b = sbase + L.bar + 16u, qfree_b = sbase + L.bar + 48u;
  if (ntiles <= wg && lane == 0) mbar_arrive(qfree_b); /* no tile of its own: no S */
#pragma unroll 1
  for (int j = 0; j < ntiles; j++)
    w11_step<DR>(a, smem, sbase, L, wg, j, g0 + (uint32_t)j, ntiles, (j & 1) == wg, O, m_run,
                 l_run, m_top, s, pa, q_s W11_STEP_PROBE);
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
  w11_pin_o(O);
  /* The last tile's stage (its PVs done): the next unit's tiles may come in. */
  if (lane == 0) mbar_arrive(empty_b + 8u * ((g0 + (uint32_t)ntiles - 1u) & 1u));
}


/* Q's first NCB column blocks of heads h0.. of row t into the 64-row stack at q_s, by the
 * gather warpgroup: warp pw copies rows 16 pw..16 pw + 15, 4 rows x 8 chunks an
 * instruction; heads past N are zero-filled. */
template <int NCB>
__device__ __forceinline__ void w_load_q(const smla_cuda_fwd_args &a, uint32_t q_s, int64_t t,
                                         int h0, int pw, int rl, int cl) {
#pragma unroll 1
  for (int rg = 0; rg < 4; rg++) {
    const int row = 16 * pw + 4 * rg + rl, head = h0 + row;
#pragma unroll 1
    for (int cb = 0; cb < NCB; cb++)
      cp_async_16(q_s + w_chunk(row, 8 * cb + cl), q_chunk_src(a, t, head, 8 * cb + cl),
                  head < a.num_heads ? 16 : 0);
  }
}

/* A gather warp's copies of its RPW (16, or 8 with two gather warpgroups) rows of a tile
 * (KB column blocks) into the stage at base: 4 rows an instruction, lane (rl, cl) chunk cl
 * of row 4 rg + rl; the slot sc and used bit u_mine of row RPW pw + r sit in lane r (and
 * r + RPW, ..). */
template <int KB, int RPW>
__device__ __forceinline__ void w_gather_rows(const smla_cuda_fwd_args &a, uint32_t base,
                                              int pw, int rl, int cl, int32_t sc, int u_mine) {
#pragma unroll 1
  for (int rg = 0; rg < RPW / 4; rg++) {
    const int rr = 4 * rg + rl, row = RPW * pw + rr;
    const int32_t sl = __shfl_sync(0xffffffffu, sc, rr);
    const int u = __shfl_sync(0xffffffffu, u_mine, rr);
    const uint8_t *src = a.cache + (u ? (int64_t)sl * a.row_bytes : 0);
#if !SMLA_PROBE_NO_GATHER
#pragma unroll
    for (int cb = 0; cb < KB; cb++)
      cp_async_16(base + w_chunk(row, 8 * cb + cl), src + 16 * (8 * cb + cl), u ? 16u : 0u);
#else
    (void)base, (void)row, (void)src;
#endif
  }
}

/* The epilogue's last step, both sm90 kernels: rows first, first + step, .. < n of the
 * staged output (ost, W_OST_STRIDE floats a row) to the row dst_s[row] points at, one warp
 * a row: bf16 final rows (one split, 16 bytes a lane) or fp32 partial rows; NULL (a head
 * past N, or l == 0 for a partial: a -inf partial is never read) is skipped. */
__device__ __forceinline__ void w_store_rows(const smla_cuda_fwd_args &a, const float *ost,
                                             void *const *dst_s, int first, int n, int step) {
  const int lane = threadIdx.x & 31;
  if (a.num_splits == 1) {
#pragma unroll 1
    for (int row = first; row < n; row += step) {
      uint16_t *dst = (uint16_t *)dst_s[row];
      if (!dst) continue;
#pragma unroll
      for (int i = 0; i < 2; i++) { /* 8 columns a lane, 16 bytes out */
        const int col = 8 * (lane + 32 * i);
        const float4 u = *(const float4 *)(ost + row * W_OST_STRIDE + col);
        const float4 v = *(const float4 *)(ost + row * W_OST_STRIDE + col + 4);
        *(uint4 *)(dst + col) = make_uint4(pack_bf16x2(u.x, u.y), pack_bf16x2(u.z, u.w),
                                           pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
      }
    }
  } else {
#pragma unroll 1
    for (int row = first; row < n; row += step) {
      float *dst = (float *)dst_s[row];
      if (!dst) continue;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int col = 4 * (lane + 32 * i);
        *(float4 *)(dst + col) = *(const float4 *)(ost + row * W_OST_STRIDE + col);
      }
    }
  }
}

/* The gather warpgroups' tile loop (both sm90 kernels): warp pw copies rows RPW pw.. (RPW
 * 16, or 8 with two gather warpgroups) of tile j (the block's tile g0 + j: g0 tiles of
 * earlier units came before it) into stage (g0 + j) % 2 (kv_s + stage * KB * 8 KB) once
 * that stage's readers have released it (empty, 16 bytes after full), after publishing its
 * RPW used-entry bits of the tile in the stage's word at mask_p (one arrival a warp on
 * full), then arrives on full once its own copies have landed. Returns this thread's
 * bad-slot count (lanes < RPW: each row once). */
template <int KB, int RPW>
__device__ __forceinline__ unsigned w_gather_tiles(const smla_cuda_fwd_args &a, uint8_t *mask_p,
                                                   uint32_t kv_s, uint32_t full_b,
                                                   slot_pipe &spipe, int32_t req,
                                                   const int32_t *slot_row, int ks, int kend,
                                                   int ntiles, uint32_t g0, int pw, int rl,
                                                   int cl, int my_row) {
  static_assert(RPW == 16 || RPW == 8, "a gather warp copies 16 or 8 rows of a tile");
  const uint32_t empty_b = full_b + 16u;
  const int lane = threadIdx.x & 31;
  unsigned bad = 0;
#pragma unroll 1
  for (int j = 0; j < ntiles; j++) {
    const uint32_t gj = g0 + (uint32_t)j, st = gj & 1u;
    if (gj >= 2) mbar_wait(empty_b + 8u * st, ((gj >> 1) - 1u) & 1u);
#if SMLA_PROBE && SMLA_PROBE_G
    if (blockDim.x == W_BLOCK && pw == 0 && lane == 0) /* the 64-head kernel: kind 13 */
      *(volatile unsigned long long *)(mask_p + 64u + 8u * st) = probe_now();
#endif
    const int32_t sc = slot_pipe_next(spipe, a, req, slot_row, ks, kend, j, my_row);
    unsigned nb = 0;
    const int u_mine = entry_used(a, sc, ks + j * FWD_BN + my_row, kend, 0, &nb);
    bad += lane < RPW ? nb : 0u; /* the other lanes hold the same rows again */
    { /* bits RPW pw..RPW pw + RPW - 1 of the stage's used-entry word */
      const unsigned bits = __ballot_sync(0xffffffffu, u_mine) & ((1u << RPW) - 1u);
      if (lane == 0) {
        if (RPW == 16)
          *(volatile uint16_t *)(mask_p + 8u * st + 2u * (uint32_t)pw) = (uint16_t)bits;
        else
          *(volatile uint8_t *)(mask_p + 8u * st + (uint32_t)pw) = (uint8_t)bits;
        mbar_arrive(full_b + 8u * st);
      }
    }
    w_gather_rows<KB, RPW>(a, kv_s + st * (uint32_t)(KB * W_KB_BYTES), pw, rl, cl, sc, u_mine);
    /* This thread's arrival, once its copies have landed. */
    mbar_arrive_cp_async_noinc(full_b + 8u * st);
  }
  return bad;
}

template <int DR>
__global__ void __launch_bounds__(W_BLOCK, 1)
    fwd90_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int KB = (512 + DR) / 64; /* 8 KB column blocks per row stack */
  const float NEG_INF = -INFINITY;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  /* 128-byte swizzle is a function of address bits 4-9: the stacks must be 1024-aligned. */
  const uint32_t raw_base = smem_addr(smem_raw);
  const uint32_t sbase = (raw_base + 1023u) & ~1023u;
  uint8_t *smem = smem_raw + (sbase - raw_base);
  const w_layout L = w_layout_of(DR);
  float *red = (float *)(smem + L.red);
  float *rowmax_s = (float *)(smem + L.rowmax);
  float *rowtop_s = (float *)(smem + L.rowtop);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7, wq = (tid >> 5) & 3; /* warpgroup; warp within it */
  const int g = lane >> 2, tig = lane & 3;
  const int r0 = 16 * wq + g; /* this thread's rows: r0 and r0 + 8 */

  /* A programmatic dependent (a.pdl) may be launched while the stream's previous kernel
   * still runs: nothing global is touched before it has completed (SMLA_FWD90_PDL). */
  if (a.pdl) griddep_wait();
  /* Units (t, group, split) b = blockIdx.x, + gridDim.x, ..: one a block, but in the
   * persistent grid (SMLA_FWD90_PERSIST, one split, no cluster merge), where the stages
   * and Q of the next unit fill while this one's last tiles and epilogue run. */
  const uint32_t units = (uint32_t)(a.num_tokens * a.groups * a.num_splits);

  unsigned bad = 0; /* entries >= S or < -1 this thread counted, in units of group 0 */
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv;
  /* Everything of the compute warps (O included) lives inside their branch: code after
   * the join runs at the gather warpgroup's register count. */
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u, qfree_b = full_b + 48u;
  if (tid == 0) {
    /* full: the 128 gather threads' copies and one arrival a gather warp (its mask bits);
     * empty: the 8 compute warps; pready: the 128 threads of the tile's warpgroup; qfree:
     * the 8 compute warps, once a unit, when their last S of it is done. */
    mbar_init(full_b, 132), mbar_init(full_b + 8u, 132);
    mbar_init(empty_b, 8), mbar_init(empty_b + 8u, 8);
    mbar_init(full_b + 32u, 128), mbar_init(full_b + 40u, 128);
    mbar_init(qfree_b, 8);
  }
  __syncthreads();
  if (tid >= W_THREADS) {
    /* The gather warpgroup. Warp pw gathers rows 16 pw..16 pw + 15 of each tile (and
     * of Q), per instruction 4 rows x 8 chunks (128 contiguous bytes of each row, one
     * swizzled 128-byte line of shared memory); lane l < 16 owns the slot of row
     * 16 pw + l (its used bit, its bad count) and hands it out by shuffle. Units with no
     * tile (lengths) take no part in the qfree handshake on either side. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    const int pw = (tid - W_THREADS) >> 5, cl = lane & 7, rl = lane >> 3;
    const int my_row = 16 * pw + (lane & 15);
    uint32_t g0 = 0, nq = 0; /* tiles and Q loads of this block's earlier units */
#pragma unroll 1
    for (uint32_t bid = blockIdx.x; bid < units; bid += gridDim.x) {
      const fwd_block blk = fwd_block_at(a, bid);
      if (blk.ntiles == 0) continue;
      /* Tile 0's slots first: their load's latency runs under the Q issue (and under the
       * wait for the previous unit's last S). */
      slot_pipe spipe = slot_pipe_start(a, blk.req, blk.slot_row, blk.ks, blk.kend, my_row);
      if (nq > 0) mbar_wait(qfree_b, (nq - 1u) & 1u);
      w_load_q<KB>(a, q_s, blk.t, blk.grp * W_HEADS, pw, rl, cl);
      const unsigned nb = w_gather_tiles<KB, 16>(a, smem + L.mask + 64u, kv_s, full_b, spipe,
                                                 blk.req, blk.slot_row, blk.ks, blk.kend,
                                                 blk.ntiles, g0, pw, rl, cl, my_row);
      if (blk.grp == 0) bad += nb;
      g0 += (uint32_t)blk.ntiles;
      nq++;
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
#define W_SYNC() named_bar_sync(1, W_THREADS)
  uint32_t g0 = 0; /* tiles of this block's earlier units */
#pragma unroll 1
  for (uint32_t bid = blockIdx.x; bid < units; bid += gridDim.x) {
  /* Only bid and g0 live across the tile loop (the rest spilled there): the unit's row,
   * group and split are decoded again for the epilogue. */
  const int ntiles = fwd_block_at(a, bid).ntiles;
  PROBE_DECL;
  PROBE_STAMP(0);
  /* O: [2 halves of 128 columns][16 n8 blocks x 4]; column of O[h][4j + e] is
   * 256 wg + 128 h + 8 j + 2 tig + (e & 1), row r0 + 8 (e >> 1). */
  float O[2][64];
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int i = 0; i < 64; i++) O[h][i] = 0.0f;
  /* m_run: the max each row's l_run and O are relative to (lags the running max by up to
   * W_TAU with the lazy rescale); m_top: the row's largest logit so far (max_logit). */
  float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f}, m_top[2] = {NEG_INF, NEG_INF};

  if (ntiles > 0) {
#if SMLA_PROBE
    w11_loop<DR>(a, ntiles, g0, smem, sbase, L, wg, O, m_run, l_run, m_top, probe_t_);
#else
    w11_loop<DR>(a, ntiles, g0, smem, sbase, L, wg, O, m_run, l_run, m_top);
#endif
    g0 += (uint32_t)ntiles;
    /* The combine kernel (a programmatic dependent, smla_cuda_merge_args.pdl) may be
     * scheduled from here on; it waits for this grid's completion before it reads. */
    if (bid + gridDim.x >= units) griddep_launch_dependents();

    /* Row sums: quad, then across the two warpgroups. */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float l = l_run[hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = r0 + 8 * hh;
      if (tig == 0) {
        red[wg * 64 + row] = l;
        if (wg == 0) rowmax_s[row] = m_run[hh], rowtop_s[row] = m_top[hh];
      }
    }
  } else {
    /* No used entry can exist in this split: every row gets l = 0, m = -inf. */
    for (int i = tid; i < 128; i += W_THREADS) red[i] = 0.0f;
    for (int i = tid; i < 64; i += W_THREADS) rowmax_s[i] = rowtop_s[i] = NEG_INF;
  }
  W_SYNC();

  const fwd_block blk = fwd_block_at(a, bid);
  const int64_t t = blk.t;
  const int split = blk.split, h0 = blk.grp * W_HEADS;
  const bool cmerge = a.cluster_merge != 0;
  if (SMLA_FWD90_PERSIST == 1 && bid + gridDim.x < units) { /* one split, no cluster merge */
    /* ---- epilogue, one split, a next unit to come: the final rows straight from the
     * registers (Q and the stages belong to the next unit by now). Each lane pairs with
     * its neighbour (tig ^ 1) so that a store is 8 bytes and a warp's store fills one
     * 32-byte sector of each of its 8 rows. red and the row maxima are read before the
     * barrier that lets the next unit's epilogue write them. The block's last unit
     * stages its rows (below): nothing comes after it. ---- */
    const bool odd = tig & 1;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = r0 + 8 * hh, head = h0 + row;
      const bool live = head < a.num_heads;
      fwd_row_out r = {NULL, NULL, 0.0f};
      if (live)
        r = fwd_row_epilogue(a, t, split, head, red[row] + red[64 + row], rowmax_s[row],
                             rowtop_s[row], wg == 0 && tig == 0);
      uint16_t *dst = live ? r.out + 256 * wg + 2 * (tig & ~1) : NULL;
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int q = 0; q < 8; q++) {
          const uint32_t w0 = pack_bf16x2(O[h][8 * q + 2 * hh] * r.f,
                                          O[h][8 * q + 2 * hh + 1] * r.f);
          const uint32_t w1 = pack_bf16x2(O[h][8 * q + 4 + 2 * hh] * r.f,
                                          O[h][8 * q + 4 + 2 * hh + 1] * r.f);
          const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);
          if (live) /* columns 16 q + 8 odd + 2 (tig & ~1) .. + 3 of this half */
            *(uint2 *)(dst + 128 * h + 16 * q + 8 * odd) =
                odd ? make_uint2(got, w1) : make_uint2(w0, got);
        }
    }
    W_SYNC();
  } else {
  /* ---- epilogue: final (num_splits == 1) or partial state, staged (a block's last unit,
   * which is its only one but in the persistent grid) ---- */
  /* O goes through shared memory (the KV stages are free: every tile was consumed and
   * both warpgroups passed the barrier above), then out in whole rows: each warp stores
   * 512 contiguous bytes per instruction instead of 8 rows x 32 B. Rows of 520 floats:
   * the 8 rows of a warp's float2 writes fall on different banks. */
  static_assert(W_HEADS * W_OST_STRIDE * 4 <= w_layout_of(DR).xm - w_layout_of(DR).kv,
                "staged O: the stages (and P blocks)");
  float *ost = (float *)(smem + L.kv);
  void **dst_s = (void **)(smem + L.q); /* per row: its output row, or NULL */
  /* Every split's m and l (red, rowmax_s, written before the barrier above) published to
   * the cluster. Nothing in red and rowmax_s changes after this. */
  if (cmerge) cluster_sync_acq_rel();
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = r0 + 8 * hh, head = h0 + row;
    const bool writer = wg == 0 && tig == 0;
    if (head >= a.num_heads) {
      if (writer && !cmerge) dst_s[row] = NULL;
      continue;
    }
    float f;
    if (cmerge) {
      f = w_cluster_factor(a, t, head, row, sbase + L.red, sbase + L.rowmax, sbase + L.rowtop,
                           red[row] + red[64 + row], rowmax_s[row], writer && split == 0);
    } else {
      const fwd_row_out r = fwd_row_epilogue(a, t, split, head, red[row] + red[64 + row],
                                             rowmax_s[row], rowtop_s[row], writer);
      if (writer) dst_s[row] = r.out ? (void *)r.out : (void *)r.part;
      f = r.f;
    }
    const int col0 = 256 * wg + 2 * tig;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int nb = 0; nb < 16; nb++) {
        const int col = col0 + 128 * h + 8 * nb;
        *(float2 *)(ost + row * W_OST_STRIDE + col) =
            make_float2(O[h][4 * nb + 2 * hh] * f, O[h][4 * nb + 2 * hh + 1] * f);
      }
  }
  W_SYNC();
  {
    const int warp = tid >> 5; /* 8 warps, 8 rows each */
    if (cmerge) {
      /* The staged O published to the cluster (the barrier also ends every read of this
       * block's red / rowmax_s); then this block's columns, summed over the S blocks'
       * staged O; then no block leaves while another may still read its stages. */
      const int S = a.num_splits;
      cluster_sync_acq_rel();
      switch (S) {
      case 2: w_cluster_sum<2>(a, t, h0, split, ost, tid); break;
      case 3: w_cluster_sum<3>(a, t, h0, split, ost, tid); break;
      case 4: w_cluster_sum<4>(a, t, h0, split, ost, tid); break;
      case 5: w_cluster_sum<5>(a, t, h0, split, ost, tid); break;
      case 6: w_cluster_sum<6>(a, t, h0, split, ost, tid); break;
      case 7: w_cluster_sum<7>(a, t, h0, split, ost, tid); break;
      default: w_cluster_sum<8>(a, t, h0, split, ost, tid); break;
      }
      cluster_arrive_release(); /* this block's distributed reads are done */
      cluster_wait();
    } else {
      w_store_rows(a, ost, dst_s, warp, W_HEADS, W_THREADS / 32);
    }
  }
  } /* staged epilogue */
  PROBE_STAMP(7);
  PROBE_PUT(SMLA_PROBE_G ? 13 : 12, ntiles);
  } /* units */
  } /* compute warps */
#undef W_SYNC

  fwd_count_bad(a, 0, bad);
}

/* ---- v23: three 48-row stages, the scorer ahead by a tile (sessions 28-29; SMLA_FWD90_V23;
 * docs/design/cuda-sm90-forward.md, "v23") ----------------------------------------------
 * v22 split the chain by role (a scorer warpgroup for S and the softmax, two accumulator
 * warpgroups for P V) and lost because S(j + 1) could only start once tile j + 1 had
 * landed in the stage tile j - 1 frees, so the scorer's softmax ran with nothing of its own
 * on the tensor cores. v23 makes room for a third tile in flight: tiles of 48 entries (a
 * stage is 9 column blocks of [48 rows][128 B], 54 KB), three stages (162 KB), and Q's last
 * KB - 7 column blocks (the rope columns and 64 more at dr = 64) held in the scorer's
 * registers as the A fragments of RS wgmma, so that Q keeps 56 KB of shared memory.
 *   the scorer (warpgroup 2, V_REG_SCORER registers): for every tile j, wait for tile j + 1 and issue
 *     S(j + 1) = Q K^T (28 wgmma m64n48k16 from shared memory, 4 (KB - 7) from registers),
 *     then wait for S(j) (issued a step earlier), the softmax of tile j with its own row
 *     state (v11's w11_own_softmax over 6 n8 blocks), P(j) (bf16, [64][48]) to the stage's P
 *     block and each row's factor alpha(j) to xa, arrive on pready. S(j + 1) thus runs on
 *     the tensor cores under softmax(j). At a unit's end it applies the row rules (1 / l,
 *     sink, lse, max_logit) and hands each row's factor and output row to the accumulators.
 *   the accumulators (warpgroups 0 and 1, V_REG_ACC registers): v22's: wait on pready, O *= alpha
 *     where a row of the warp moved, O += P(j) V(j) (3 k-steps of 2 wgmma m64n128k16 from
 *     shared memory), wait for it, release the stage (8 warp arrivals).
 *   the gather warpgroup (3, V_REG_GATHER registers): Q's first 7 column blocks, then every tile into
 *     stage j % 3 once tile j - 3's PVs are done, 12 rows a warp, and each warp's 12 used
 *     bits (a 16-bit word a warp and stage).
 * P's rows are 96 bytes, which no swizzle atom holds: P is laid out as 8-row x 16-byte core
 * matrices without swizzle (v_p_off), in the stage's rope block at dr = 64 (only S reads it)
 * or in a P block of its own at dr = 0. One split, no cluster merge; a persistent grid
 * (SMLA_FWD90_V23_PERSIST, below) or one unit a block; the plan's other shapes run v11 /
 * v14. */
#ifndef SMLA_FWD90_V23
#define SMLA_FWD90_V23 0
#endif
#if SMLA_FWD90_V23
#define V_ROWS 48                 /* entries a tile */
#define V_KB_BYTES (V_ROWS * 128) /* one [48 rows][128 B] column block of a stage */
#define V_QKB 7                   /* Q's column blocks in shared memory (the rest: registers) */
#define V_BLOCK 512
/* Registers a thread of each role (setmaxnreg): the 512 threads share the 64K of the SM. */
#ifndef V_REG_GATHER
#define V_REG_GATHER 40
#endif
#ifndef V_REG_SCORER
#define V_REG_SCORER 152
#endif
#ifndef V_REG_ACC
#define V_REG_ACC 160
#endif
static_assert(128 * (V_REG_GATHER + V_REG_SCORER + 2 * V_REG_ACC) <= 65536, "v23's registers");
/* SMLA_FWD90_V23=2: each accumulator refills the column blocks it alone reads (V23's second
 * form; the gather warpgroup then copies the rope block, the slots and the used bits). */
#define V_REFILL (SMLA_FWD90_V23 >= 2)

struct v_layout {
  uint32_t q, kv, p, xa, rf, dst, mask, sring, bar, total;
};

__host__ __device__ constexpr v_layout v_layout_of(int dr) {
  v_layout l = {};
  const uint32_t kb = (uint32_t)((512 + dr) / 64);
  l.q = 0;
  l.kv = V_QKB * W_KB_BYTES;
  l.p = l.kv + 3u * kb * V_KB_BYTES; /* dr = 0: [3 stages] P blocks of 6 KB */
  l.xa = dr ? l.p : l.p + 3u * V_KB_BYTES; /* [3 stages][64] float: alpha of the tile */
  /* The unit's row epilogue, by the scorer for the accumulators: [64] float, each row's
   * output factor; [64] pointers, each row's output row (NULL: a head past N). */
  l.rf = l.xa + 3u * 64u * 4u;
  l.dst = l.rf + 64u * 4u;
  /* [4][4 gather warps] uint16 used bits: by stage (V23 = 1) or by tile % 4 (= 2) */
  l.mask = l.dst + 64u * 8u;
  l.sring = l.mask + 32u; /* V23 = 2: [4][48] int32, the slots of tile j % 4 (-1: unused) */
  /* mbarriers full[3], empty[3], pready[3], sready[4], qfree, rready, rfree */
  l.bar = l.sring + 4u * 48u * 4u;
  l.total = l.bar + 16u * 8u;
  return l;
}
static_assert(v_layout_of(64).total + 1024u <= 232448u, "v23 layout, dr = 64");
static_assert(v_layout_of(0).total + 1024u <= 232448u, "v23 layout, dr = 0");
static_assert(W_HEADS * W_OST_STRIDE * 4 <= 3u * 8u * V_KB_BYTES, "v23's staged O: the stages");

/* Byte offset of 16-byte chunk c of row r in a stage (128-byte swizzle, 6 KB blocks). */
__device__ __forceinline__ uint32_t v_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * V_KB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Byte offset of P's element (row r, entry c) in the P block: core matrices of 8 rows x 8
 * entries (128 contiguous bytes), the 8 row groups of entry group c / 8 in a 1 KB run. */
__device__ __forceinline__ uint32_t v_p_off(int r, int c) {
  return (uint32_t)((c >> 3) * 1024 + (r >> 3) * 128 + (r & 7) * 16 + (c & 7) * 2);
}

/* The raw index entry k of the row, or -1 past the end. */
__device__ __forceinline__ int32_t v_raw(const int32_t *slot_row, int k, int kend) {
  return k < kend ? __ldg(slot_row + k) : -1;
}

/* S = Q K^T of the stage at kvb into s (zeroed here): Q's first V_QKB blocks from shared
 * memory, the rest from qa (this thread's A fragments, 4 registers a k-step). One commit
 * group; the caller waits. */
template <int KB>
__device__ __forceinline__ void v_s_issue(float s[24], uint32_t q_s, uint32_t kvb,
                                          const uint32_t *qa) {
#pragma unroll
  for (int i = 0; i < 24; i++) s[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 24; i++) wg_pin(s[i]);
  wg_fence();
#pragma unroll
  for (int kb = 0; kb < V_QKB; kb++)
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++)
      wgmma_m64n48k16_ss(s, wg_desc(q_s + kb * W_KB_BYTES + k4 * 32, 16, 1024),
                         wg_desc(kvb + kb * V_KB_BYTES + k4 * 32, 16, 1024));
#pragma unroll
  for (int kb = V_QKB; kb < KB; kb++)
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++)
      wgmma_m64n48k16_rs(s, qa + 16 * (kb - V_QKB) + 4 * k4,
                         wg_desc(kvb + kb * V_KB_BYTES + k4 * 32, 16, 1024));
  wg_commit();
}

/* Where tile j is the last, one wgmma into nxt in place of S(j + 1), so that every path
 * leaves the same accumulators in flight (else ptxas serializes every wgmma of the loop);
 * its result is never read. */
__device__ __forceinline__ void v_s_dummy(float s[24], uint32_t q_s) {
#pragma unroll
  for (int i = 0; i < 24; i++) s[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 24; i++) wg_pin(s[i]);
  wg_fence();
  wgmma_m64n48k16_ss(s, wg_desc(q_s, 16, 1024), wg_desc(q_s, 16, 1024));
  wg_commit();
}

/* The scorer's step at tile j of the unit (the block's tile g0 + j; stage st, phase parity
 * par): S(j + 1) issued into nxt once its tile has landed, S(j) (in cur) waited for, its
 * softmax, P(j) and alpha(j) out. */
template <int KB, int DR>
__device__ __forceinline__ void v_score_step(const smla_cuda_fwd_args &a, uint8_t *smem,
                                             uint32_t sbase, const v_layout &L, int j,
                                             int ntiles, uint32_t g0, uint32_t &st, uint32_t &par,
                                             float cur[24], float nxt[24], const uint32_t *qa,
                                             float m_run[2], float l_run[2], float m_top[2]) {
  constexpr uint32_t TILE = KB * V_KB_BYTES;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3, r0 = 16 * wq + g;
  const uint32_t kv_s = sbase + L.kv, full_b = sbase + L.bar, pready_b = full_b + 48u;
  const uint32_t st1 = st == 2u ? 0u : st + 1u, par1 = st == 2u ? par ^ 1u : par;
  if (j + 1 < ntiles) {
    mbar_wait(full_b + 8u * st1, par1); /* tile j + 1 */
    fence_proxy_async();
    v_s_issue<KB>(nxt, sbase + L.q, kv_s + st1 * TILE, qa);
  } else {
    v_s_dummy(nxt, sbase + L.q);
  }
  wg_wait<1>(); /* S(j) */
#pragma unroll
  for (int i = 0; i < 24; i++) wg_pin(cur[i]);
  if (j >= ntiles) return; /* the pair's second step past an odd tile count */
  const uint32_t st0 = st;
  st = st1, par = par1; /* the next unit starts where this one ends */
  const volatile uint16_t *mk = (const volatile uint16_t *)(smem + L.mask) +
                                4u * (V_REFILL ? (g0 + (uint32_t)j) & 3u : st0);
  const uint64_t word = (uint64_t)mk[0] | ((uint64_t)mk[1] << 12) | ((uint64_t)mk[2] << 24) |
                        ((uint64_t)mk[3] << 36);
  uint32_t pa[12];
  float alpha[2], lsum[2];
  bool moved;
  w11_own_softmax<6>(a, cur, word >> (2 * tig), m_run, m_top, pa, alpha, lsum, moved);
  uint8_t *pb = DR ? smem + L.kv + st0 * TILE + 8u * V_KB_BYTES : smem + L.p + st0 * V_KB_BYTES;
#pragma unroll
  for (int n = 0; n < 6; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(uint32_t *)(pb + v_p_off(r0 + 8 * hh, 8 * n + 2 * tig)) = pa[2 * n + hh];
  float *xa = (float *)(smem + L.xa) + 64u * st0;
  if (tig == 0)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) xa[r0 + 8 * hh] = alpha[hh];
  fence_proxy_async(); /* P visible to the accumulators' wgmma */
  mbar_arrive(pready_b + 8u * st0);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
}

/* V_REFILL: accumulator warpgroup wg copies the block's tile gj's rows into its own column
 * blocks 4 wg .. 4 wg + 3 of stage st (which only its PV and S read: S(gj - 3) and its PV
 * are done), with the slots the gather warpgroup left in the ring, and arrives on full once
 * they land. */
template <int KB>
__device__ __forceinline__ void v_refill(const smla_cuda_fwd_args &a, uint8_t *smem,
                                         uint32_t sbase, const v_layout &L, uint32_t gj,
                                         uint32_t st, int wg) {
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
  const int rl = lane >> 3, cl = lane & 7;
  const uint32_t ri = gj & 3u;
  mbar_wait(sbase + L.bar + 72u + 8u * ri, (gj >> 2) & 1u); /* sready[ri] */
  const volatile int32_t *ring = (const volatile int32_t *)(smem + L.sring) + 48u * ri;
  const uint32_t kvb = sbase + L.kv + st * (uint32_t)(KB * V_KB_BYTES);
#pragma unroll
  for (int rg = 0; rg < 3; rg++) {
    int row = 12 * wq + 4 * rg + rl;
    asm volatile("mov.b32 %0, %0;" : "+r"(row)); /* addresses not hoisted (spills) */
    const int32_t sl = ring[row];
    const uint8_t *src = a.cache + (sl >= 0 ? (int64_t)sl * a.row_bytes : 0);
#if !SMLA_PROBE_NO_GATHER
#pragma unroll
    for (int cb = 4 * wg; cb < 4 * wg + 4; cb++)
      cp_async_16(kvb + v_chunk(row, 8 * cb + cl), src + 16 * (8 * cb + cl), sl >= 0 ? 16u : 0u);
#else
    (void)src, (void)kvb, (void)cl;
#endif
  }
  mbar_arrive_cp_async_noinc(sbase + L.bar + 8u * st);
}

/* A final bf16 row straight from the accumulators' registers (the persistent grid's
 * epilogue, where the stages already belong to the next unit): this thread's row r0 + 8 hh
 * of O times f, to columns 256 wg.. of out_row (NULL: a head past N, nothing stored). Each
 * lane pairs with its neighbour (tig ^ 1) so that a store is 8 bytes and a warp's store
 * fills one 32-byte sector of each of its 8 rows; every lane runs the shuffles. (v14's
 * epilogue has the same stores inline: written through this helper its SASS changed, so it
 * waits for a device run to be moved over.) */
__device__ __forceinline__ void v_store_row_regs(const float O[2][64], int hh, uint16_t *out_row,
                                                 int wg, float f, int tig) {
  const bool odd = tig & 1, live = out_row != NULL;
  uint16_t *d = live ? out_row + 256 * wg + 2 * (tig & ~1) : NULL;
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int q = 0; q < 8; q++) {
      const uint32_t w0 = pack_bf16x2(O[h][8 * q + 2 * hh] * f, O[h][8 * q + 2 * hh + 1] * f);
      const uint32_t w1 =
          pack_bf16x2(O[h][8 * q + 4 + 2 * hh] * f, O[h][8 * q + 4 + 2 * hh + 1] * f);
      const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);
      if (live) /* columns 16 q + 8 odd + 2 (tig & ~1) .. + 3 of this half */
        *(uint2 *)(d + 128 * h + 16 * q + 8 * odd) =
            odd ? make_uint2(got, w1) : make_uint2(w0, got);
    }
}

/* Tiles of a unit (V_ROWS entries a tile). */
__device__ __forceinline__ int v_ntiles(const fwd_block &b) {
  return b.kend > b.ks ? (b.kend - b.ks + V_ROWS - 1) / V_ROWS : 0;
}

/* SMLA_FWD90_V23_PERSIST (default 1; V23 = 1 only: the refill's first three tiles of a
 * unit would wait on the previous unit's stages): v23 as a persistent grid of
 * a.resident_blocks blocks, each taking units bid = blockIdx.x, + gridDim.x, .., as v14:
 * the next unit's Q (once the scorer's last S of this one is done) and first tiles (once
 * their stages' PVs are) load under this unit's last tiles and epilogue; a unit with a next
 * one stores its rows from the registers, the block's last unit stages them. Stages and
 * their phases run on across units (the block's tile count g). 0: one block a unit. */
#ifndef SMLA_FWD90_V23_PERSIST
#define SMLA_FWD90_V23_PERSIST 1
#endif
#define V_PERSIST (SMLA_FWD90_V23_PERSIST && !V_REFILL)

template <int DR>
__global__ void __launch_bounds__(V_BLOCK, 1)
    fwd90_v23_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int KB = (512 + DR) / 64;
  constexpr uint32_t TILE = KB * V_KB_BYTES;
  const float NEG_INF = -INFINITY;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_base = smem_addr(smem_raw);
  const uint32_t sbase = (raw_base + 1023u) & ~1023u;
  uint8_t *smem = smem_raw + (sbase - raw_base);
  const v_layout L = v_layout_of(DR);
  float *rf_s = (float *)(smem + L.rf);
  void **dst_s = (void **)(smem + L.dst);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7, wq = (tid >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3;
  const int r0 = 16 * wq + g;

  if (a.pdl) griddep_wait();
  /* Units (t, group) bid = blockIdx.x, + gridDim.x, .. (one split): each role counts and
   * decodes them after its setmaxnreg (values carried across the register split were
   * spilled). */
#define V_UNITS() const uint32_t units = (uint32_t)(a.num_tokens * a.groups * a.num_splits)
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv;
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 24u, pready_b = full_b + 48u;
  const uint32_t sready_b = full_b + 72u, qfree_b = full_b + 104u, rready_b = full_b + 112u,
                 rfree_b = full_b + 120u;
  if (tid == 0) {
    /* full: the gather warpgroup's 128 copies and 4 mask arrivals (V_REFILL: and the two
     * accumulators' 256); empty: the 8 accumulator warps; pready: the scorer's 128
     * threads; sready (V_REFILL): the gather warpgroup's 128 threads, a tile's slots;
     * qfree: the scorer's 128 threads once a unit with tiles, its last S done (Q's blocks
     * may be refilled); rready: the scorer's 128, once a unit, the rows' factors and
     * output rows written; rfree: the 8 accumulator warps, once a unit, those read. */
    for (uint32_t s = 0; s < 3u; s++)
      mbar_init(full_b + 8u * s, V_REFILL ? 388 : 132), mbar_init(empty_b + 8u * s, 8),
          mbar_init(pready_b + 8u * s, 128);
    for (uint32_t s = 0; s < 4u; s++) mbar_init(sready_b + 8u * s, 128);
    mbar_init(qfree_b, 128), mbar_init(rready_b, 128), mbar_init(rfree_b, 8);
  }
  __syncthreads();
  if (wg == 3) { /* the gather warpgroup */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(V_REG_GATHER) : "memory");
    V_UNITS();
    unsigned bad = 0; /* entries >= S or < -1 this thread counted, in units of group 0 */
    const int pw = (tid - 384) >> 5, cl = lane & 7, rl = lane >> 3;
    const int my_row = 12 * pw + lane % 12; /* lanes 12.. hold rows again */
    volatile uint16_t *mk = (volatile uint16_t *)(smem + L.mask);
    volatile int32_t *ring = (volatile int32_t *)(smem + L.sring);
    uint32_t gt = 0, nq = 0; /* the block's tiles and Q loads so far */
#pragma unroll 1
    for (uint32_t bid = blockIdx.x; bid < units; bid += gridDim.x) {
      const fwd_block blk = fwd_block_at(a, bid);
      const int ntiles = v_ntiles(blk);
      if (ntiles == 0) continue; /* no Q, no tiles, no qfree handshake */
      const bool counts = blk.grp == 0; /* bad slots: counted once a row */
      int32_t slot_n = slot_of(a, blk.req, v_raw(blk.slot_row, blk.ks + my_row, blk.kend));
      int32_t raw_n = v_raw(blk.slot_row, blk.ks + V_ROWS + my_row, blk.kend);
#pragma unroll 1
      for (int j = 0; j < ntiles; j++, gt++) {
        /* stage gt % 3, phase parity (gt / 3) & 1 (derived: two registers fewer) */
        const uint32_t g3 = gt / 3u, st = gt - 3u * g3, par = g3 & 1u;
        if (!V_REFILL && gt >= 3) mbar_wait(empty_b + 8u * st, par ^ 1u); /* tile gt - 3's PVs */
        const int32_t sc = slot_n;
        slot_n = slot_of(a, blk.req, raw_n);
        raw_n = v_raw(blk.slot_row, blk.ks + V_ROWS * (j + 2) + my_row, blk.kend);
        unsigned nb = 0;
        const int u_mine = entry_used(a, sc, blk.ks + V_ROWS * j + my_row, blk.kend, 0, &nb);
        bad += lane < 12 && counts ? nb : 0u;
        const unsigned bits = __ballot_sync(0xffffffffu, u_mine) & 0xfffu;
        const uint32_t mi = V_REFILL ? gt & 3u : st; /* the used bits' slot */
        if (V_REFILL) { /* the slots for the accumulators, then this tile's rope block */
          if (lane < 12) ring[48u * mi + my_row] = u_mine ? sc : -1;
          mbar_arrive(sready_b + 8u * mi);
        }
        /* V_REFILL: tile gt - 3's full phase may still be open (the accumulators' copies),
         * so this tile's arrivals on full wait for its PVs too. */
        if (V_REFILL && gt >= 3) mbar_wait(empty_b + 8u * st, par ^ 1u); /* P(gt - 3) read */
        if (lane == 0) {
          mk[4u * mi + (uint32_t)pw] = (uint16_t)bits;
          mbar_arrive(full_b + 8u * st);
        }
        const uint32_t kvb = kv_s + st * TILE;
#pragma unroll 1
        for (int rg = 0; rg < 3; rg++) {
          const int rr = 4 * rg + rl, row = 12 * pw + rr;
          const int32_t sl = __shfl_sync(0xffffffffu, sc, rr);
          const int u = __shfl_sync(0xffffffffu, u_mine, rr);
          const uint8_t *src = a.cache + (u ? (int64_t)sl * a.row_bytes : 0);
#if !SMLA_PROBE_NO_GATHER
#pragma unroll
          for (int cb = V_REFILL ? 8 : 0; cb < KB; cb++) /* V_REFILL: the rope block only */
            cp_async_16(kvb + v_chunk(row, 8 * cb + cl), src + 16 * (8 * cb + cl), u ? 16u : 0u);
#else
          (void)src, (void)kvb, (void)row;
#endif
        }
        if (j == 0) {
          /* Q after tile 0's copies (which need only their stage, so they go out while the
           * previous unit's last tiles run), once the scorer's last S of that unit is
           * done; this thread's arrival on tile 0's full below then covers Q's copies too. */
          if (nq > 0) mbar_wait(qfree_b, (nq - 1u) & 1u);
          w_load_q<V_QKB>(a, q_s, blk.t, blk.grp * W_HEADS, pw, rl, cl);
        }
        mbar_arrive_cp_async_noinc(full_b + 8u * st);
      }
      nq++;
    }
    fwd_count_bad(a, 0, bad);
  } else if (wg == 2) { /* the scorer */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(V_REG_SCORER) : "memory");
    V_UNITS();
    constexpr int QR = KB - V_QKB; /* Q's column blocks in registers */
    uint32_t g0 = 0, nu = 0, st = 0, par = 0; /* the block's tiles and units so far */
#pragma unroll 1
    for (uint32_t bid = blockIdx.x; bid < units; bid += gridDim.x) {
      const fwd_block blk = fwd_block_at(a, bid);
      const int ntiles = v_ntiles(blk), h0 = blk.grp * W_HEADS;
      float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f}, m_top[2] = {NEG_INF, NEG_INF};
      if (ntiles > 0) {
        uint32_t qa[16 * QR];
#pragma unroll
        for (int kb = 0; kb < QR; kb++)
#pragma unroll
          for (int i = 0; i < 16; i++) { /* k-step i / 4, fragment register i % 4 */
            const int row = r0 + 8 * (i & 1), head = h0 + row;
            const int col = 64 * (V_QKB + kb) + 16 * (i >> 2) + 8 * ((i >> 1) & 1) + 2 * tig;
            qa[16 * kb + i] = head < a.num_heads ? *(const uint32_t *)(q_chunk_src(a, blk.t, head, col >> 3) + (col & 7))
                                                 : 0u;
          }
        float sa[24], sb[24];
        mbar_wait(full_b + 8u * st, par); /* tile 0 and Q */
        fence_proxy_async();
        v_s_issue<KB>(sa, q_s, kv_s + st * TILE, qa);
        wg_wait<0>();
        /* Tiles in pairs, sa and sb taking turns. No group is in flight across the loop's
         * back edge (the wait after each pair: S(j + 2), which ran under softmax(j + 1)):
         * ptxas serializes every wgmma of the kernel where an accumulator in flight there
         * is read in the loop (C7514; a 20-line reproduction, session 28). */
#pragma unroll 1
        for (int j = 0; j < ntiles; j += 2) {
          v_score_step<KB, DR>(a, smem, sbase, L, j, ntiles, g0, st, par, sa, sb, qa, m_run,
                               l_run, m_top);
          v_score_step<KB, DR>(a, smem, sbase, L, j + 1, ntiles, g0, st, par, sb, sa, qa,
                               m_run, l_run, m_top);
          wg_wait<0>();
        }
        mbar_arrive(qfree_b); /* every S of the unit done: Q's blocks may take the next one */
        g0 += (uint32_t)ntiles;
      }
      /* The rows' epilogue rules (1 / l, the sink, lse, max_logit: fwd_row_epilogue), here
       * rather than in the accumulators, whose O leaves no registers for them. */
      if (nu > 0) mbar_wait(rfree_b, (nu - 1u) & 1u); /* the previous unit's read */
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        float l = l_run[hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = r0 + 8 * hh, head = h0 + row;
        if (tig == 0) {
          void *out = NULL;
          if (head < a.num_heads) {
            const fwd_row_out r =
                fwd_row_epilogue(a, blk.t, 0, head, l, m_run[hh], m_top[hh], true);
            rf_s[row] = r.f;
            out = r.out;
          }
          dst_s[row] = out; /* NULL: the row is skipped (its rf_s is never read) */
        }
      }
      mbar_arrive(rready_b);
      nu++;
    }
  } else { /* the accumulators: O[:, 256 wg ..] */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(V_REG_ACC) : "memory");
    V_UNITS();
    const float *xa_all = (const float *)(smem + L.xa);
    uint32_t gt = 0, nu = 0, st = 0, par = 0; /* the block's tiles and units so far */
#pragma unroll 1
    for (uint32_t bid = blockIdx.x; bid < units; bid += gridDim.x) {
      const int ntiles = v_ntiles(fwd_block_at(a, bid));
      float O[2][64];
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) O[h][i] = 0.0f;
      /* V_REFILL: one unit a block (the host never gives it a persistent grid), so its
       * stages are fresh; a grid of fewer blocks would refill stages still in use. */
      if (V_REFILL)
#pragma unroll 1
        for (int j = 0; j < 3 && j < ntiles; j++)
          v_refill<KB>(a, smem, sbase, L, (uint32_t)j, (uint32_t)j, wg);
#pragma unroll 1
      for (int j = 0; j < ntiles; j++, gt++) {
        const uint32_t kvb = kv_s + st * TILE;
        const uint32_t pblk = DR ? kvb + 8u * V_KB_BYTES : sbase + L.p + st * V_KB_BYTES;
        mbar_wait(pready_b + 8u * st, par); /* P(j), alpha(j); tile j landed before it */
        fence_proxy_async();
        float f[2];
        bool moved = false;
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          f[hh] = xa_all[64u * st + r0 + 8 * hh];
          moved |= !(f[hh] == 1.0f); /* NaN moves */
        }
        if (__any_sync(0xffffffffu, moved)) w11_scale_o(O, f);
        /* P without swizzle: lbo along K, sbo along M (the PTX ISA's reading of a K-major
         * operand; not yet run on a GPU: -DSMLA_V23_PSWAP=1 builds the other reading, for
         * the first device run to fall back on if this one fails its values); a k-step is
         * 2 core matrices (2 KB) on. */
#ifdef SMLA_V23_PSWAP
        w_pv_ss<3, V_KB_BYTES, 2048, 128, 1024>(O, pblk, kvb, wg);
#else
        w_pv_ss<3, V_KB_BYTES, 2048, 1024, 128>(O, pblk, kvb, wg);
#endif
        wg_wait<0>();
        w11_pin_o(O);
        __syncwarp(); /* every lane's read of xa before the release */
        if (lane == 0) mbar_arrive(empty_b + 8u * st);
        if (V_REFILL && j + 3 < ntiles) v_refill<KB>(a, smem, sbase, L, gt + 3u, st, wg);
        st = st == 2u ? 0u : st + 1u;
        par ^= st == 0u ? 1u : 0u;
      }
      const bool last = bid + gridDim.x >= units; /* the block's last unit */
      if (last) griddep_launch_dependents();
      mbar_wait(rready_b, nu & 1u); /* the scorer's row factors and output rows */
      float f[2];
      uint16_t *orow[2];
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
        f[hh] = rf_s[r0 + 8 * hh], orow[hh] = (uint16_t *)dst_s[r0 + 8 * hh];
      __syncwarp();
      if (lane == 0) mbar_arrive(rfree_b);
      nu++;
      if (!last) {
        /* ---- epilogue, a next unit to come: the rows from the registers ---- */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) v_store_row_regs(O, hh, orow[hh], wg, f[hh], tig);
        continue;
      }
      /* ---- epilogue, the block's last unit: v11's staged rows, through the stages (both
       * accumulators' last PVs done at the barrier; the scorer's last S before rready; no
       * tile comes after). dst_s stays: no unit comes after this one to rewrite it. ---- */
      named_bar_sync(1, W_THREADS);
      float *ost = (float *)(smem + L.kv);
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = r0 + 8 * hh, col0 = 256 * wg + 2 * tig;
        if (!orow[hh]) continue;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int nb = 0; nb < 16; nb++)
            *(float2 *)(ost + row * W_OST_STRIDE + col0 + 128 * h + 8 * nb) =
                make_float2(O[h][4 * nb + 2 * hh] * f[hh], O[h][4 * nb + 2 * hh + 1] * f[hh]);
      }
      named_bar_sync(1, W_THREADS);
      w_store_rows(a, ost, dst_s, tid >> 5, W_HEADS, W_THREADS / 32);
    }
  }
#undef V_UNITS
}
#endif /* SMLA_FWD90_V23 */

/* ---- small heads: swap-AB tiles, N <= 32 (SMLA_FWD90_SMALL) -----------------------------
 * One block per (row t, split), HG = 8, 16 or 32 heads (the fewest that hold N), no matrix
 * work for heads past HG: the heads sit on the wgmma N axis.
 *   S^T[64 entries][HG] = K Q^T    36 wgmma m64nHGk16 (A = the stage's K rows, K-major;
 *                                  B = Q, [HG rows][576] K-major)
 *   the online softmax per head    a column of S^T: the max over the warp's 16 entries by
 *                                  shuffles, over the 4 warps through shared memory
 *   O^T[512][HG] += V^T P^T        8 x 4 wgmma m64nHGk16 (A = V^T, read MN-major from the
 *                                  rows of V: imm-trans-a; B = P^T, [HG][64] K-major)
 * by one compute warpgroup, tile after tile (the rows bound this kernel: at 16 heads a
 * tile's 68 wgmma read ~160 KB of shared memory, ~0.7 us, against ~2.3 us for its 72 KB of
 * rows at 4.2 TB/s over 132 SMs), and v11's gather warpgroup, two stages of 64 rows. Q
 * is [kb][HG rows][128 B], 128-byte swizzle. No in-kernel split merge: the plan merges
 * this kernel's splits with the combine kernel. */
/* SMLA_FWD90_SMALL: which N the plan gives this kernel on sm_90 devices. 2 (default since
 * session 17): N <= 32; 1: N <= 16 (session 16's default); 0: none (the generic kernel
 * takes N <= 32). Against the generic kernel (H100, bench/RESULTS.md session 16 call 2
 * and session 17 call 2, amortized): faster at every T for N = 8; from T = 4 for N = 16
 * and from T = 8 for N = 32 (11% at T = 1024 and 512), slower below (N = 32 T = 1: 13.3
 * against 11.9 us). The plan's few-rows chain (backend.c, few_rows_chain) weighs, by the
 * cost model, this kernel in narrower head groups (8, 16 or 32 heads a block, several
 * groups) and the generic kernel against the plan's own at T <= 32. */
#ifndef SMLA_FWD90_SMALL
#define SMLA_FWD90_SMALL 2
#endif
/* SMLA_FWD90S_MERGE: 1 lets the plan merge the small-head kernel's splits inside the kernel
 * (one cluster a row, over distributed shared memory: fwd_dsmem_merge, the generic kernel's
 * merge; docs/design/decode-one-launch.md, session 23); 0 (the default until the cost
 * model is fitted with it): the combine kernel only. */
#ifndef SMLA_FWD90S_MERGE
#define SMLA_FWD90S_MERGE 0
#endif
/* SMLA_FWD90S_GATHER_WGS (session 27): the small-head kernel's gather warpgroups at 8 and 16
 * heads a block. 2: two, 8 rows of a tile a warp (384 threads a block); 1: one, 16 rows a
 * warp (256). One SM alone brings a 64-row tile in 1.25 us with 256 gather threads against
 * 1.72 with 128 (H100, bench/gather.cu, bench/RESULTS.md session 27 call 4), and at few rows
 * (decode) a block's tile waits on its gathers. 32 heads a block keep one (the compute
 * warpgroup's O^T needs the registers). The default since session 29 (H100, cold /
 * amortized against one, bench/RESULTS.md session 29 call 2): T = 1 N = 8 and 16 0.3-0.4
 * us faster amortized (8.3-8.5 against 8.7-8.9), 0.0-0.3 cold; T = 16 N = 16 0.3 faster;
 * T = 64 and 1024 level; the whole suite and the sanitizer clean. */
#ifndef SMLA_FWD90S_GATHER_WGS
#define SMLA_FWD90S_GATHER_WGS 2
#endif
#define WS_GWG(hg) ((hg) <= 16 ? SMLA_FWD90S_GATHER_WGS : 1)
#define WS_BLOCK(hg) (128 + 128 * WS_GWG(hg))
#if SMLA_FWD90_SMALL

struct ws_layout {
  uint32_t q, kv, p, red, mask, bar, warm, total;
};

__host__ __device__ constexpr ws_layout ws_layout_of(int dr, int hg) {
  ws_layout l = {};
  const uint32_t kb = (uint32_t)((512 + dr) / 64);
  l.q = 0;
  l.kv = (kb * (uint32_t)hg * 128u + 1023u) & ~1023u;
  l.p = l.kv + 2u * kb * W_KB_BYTES;      /* P^T, [hg][64] bf16, 128-byte swizzle */
  l.red = l.p + (uint32_t)hg * 128u;      /* [2][4 warps][hg] float: maxima, sums */
  l.mask = l.red + 2u * 4u * (uint32_t)hg * 4u; /* at 64: [2] uint64 used-entry words */
  l.bar = l.mask + 4u * 64u;              /* full[2], empty[2] */
  l.warm = l.bar + 4u * 8u;               /* [16] uint32, written only (SMLA_FWD_WARM_PARAMS) */
  l.total = l.warm + 64u;
  return l;
}
static_assert(ws_layout_of(64, 32).total + 1024u <= 232448u, "small-head layout");

template <int DR, int HG>
__global__ void __launch_bounds__(WS_BLOCK(HG), 1)
    fwd90s_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int GWG = WS_GWG(HG);  /* gather warpgroups */
  constexpr int RPW = 16 / GWG;    /* rows of a tile a gather warp copies */
  constexpr int KB = (512 + DR) / 64;
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  constexpr uint32_t QB = HG * 128; /* a Q block: [HG rows][128 B] */
  constexpr int NB = HG / 8;        /* n8 blocks of heads */
  const float NEG_INF = -INFINITY;
  static_assert(HG * W_OST_STRIDE * 4 <= 2 * TILE, "staged O^T: the stages");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_base = smem_addr(smem_raw);
  const uint32_t sbase = (raw_base + 1023u) & ~1023u;
  uint8_t *smem = smem_raw + (sbase - raw_base);
  constexpr ws_layout L = ws_layout_of(DR, HG);
  float *red = (float *)(smem + L.red);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wq = (tid >> 5) & 3, g = lane >> 2, tig = lane & 3;
  const int r0 = 16 * wq + g; /* this thread's entries of a tile: r0 and r0 + 8 */

#if SMLA_FWD_WARM_PARAMS
  const uint32_t warm = param_warm_issue(a);
  if (a.pdl) griddep_wait(); /* as the 64-head kernel */
  param_warm_keep(warm, sbase + L.warm);
#else
  if (a.pdl) griddep_wait(); /* as the 64-head kernel */
#endif
  const fwd_block blk = fwd_block_of(a);
  const int64_t t = blk.t;
  const int grp = blk.grp, split = blk.split, ks = blk.ks, kend = blk.kend;
  const int ntiles = blk.ntiles, h0 = grp * HG;
  unsigned bad = 0;
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv, p_s = sbase + L.p;
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u;
  if (tid == 0) {
    /* full: the gather threads' copies and one arrival a gather warp (its mask bits);
     * empty: the 128 compute threads, each for its own reads of the stage's mask word
     * (racecheck does not order the other lanes' reads before lane 0's arrival, and with
     * one arrival a warp flagged the mask writes of tile j + 2: session 17 call 1). */
    constexpr uint32_t NFULL = 128u * GWG + 4u * GWG;
    mbar_init(full_b, NFULL), mbar_init(full_b + 8u, NFULL);
    mbar_init(empty_b, 128), mbar_init(empty_b + 8u, 128);
  }
  __syncthreads();
  if (tid >= 128) {
    /* The gather warpgroups, as the 64-head kernel's: warp pw, rows RPW pw.. of each
     * tile; Q's HG rows first, tile 0's slots before them. With two, the 384 threads
     * start at 168 registers: the gathers give theirs to the compute warpgroup. */
    if constexpr (GWG == 2)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (ntiles > 0) {
      const int pw = (tid - 128) >> 5, cl = lane & 7, rl = lane >> 3;
      const int my_row = RPW * pw + (lane & (RPW - 1));
      slot_pipe spipe = slot_pipe_start(a, blk.req, blk.slot_row, ks, kend, my_row);
      /* Q's rows spread over the gather warps (4 a warp an instruction): at T = 1 its
       * copies and tile 0's are the block's first round trip. */
#pragma unroll 1
      for (int row = 4 * pw + rl; row < HG; row += 16 * GWG) {
        const int head = h0 + row;
#pragma unroll 1
        for (int cb = 0; cb < KB; cb++) {
          const int c = 8 * cb + cl;
          cp_async_16(q_s + (uint32_t)(cb * QB + row * 128 + (((c & 7) ^ (row & 7)) << 4)),
                      q_chunk_src(a, t, head, c), head < a.num_heads ? 16 : 0);
        }
      }
      bad = w_gather_tiles<KB, RPW>(a, smem + L.mask + 64u, kv_s, full_b, spipe, blk.req,
                                    blk.slot_row, ks, kend, ntiles, 0u, pw, rl, cl, my_row);
    }
  } else {
    if constexpr (GWG == 2)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
#define WS_SYNC() named_bar_sync(1, 128)
    /* O^T: [8 blocks of 64 output columns][n8 block n, e]: output column 64 mt + r0 +
     * 8 (e >> 1) of head 8 n + 2 tig + (e & 1). Per head (n, c = e & 1): m_run (the max
     * l_run and O are relative to), l_run (this thread's two entries a tile), m_top. */
    float O[8][HG / 2];
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
      for (int i = 0; i < HG / 2; i++) O[mt][i] = 0.0f;
    float m_run[NB][2], l_run[NB][2], m_top[NB][2];
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) m_run[n][c] = NEG_INF, l_run[n][c] = 0.0f, m_top[n][c] = NEG_INF;
    const volatile uint64_t *umask = (const volatile uint64_t *)(smem + L.mask + 64);
    uint8_t *pb = smem + L.p;

#pragma unroll 1
    for (int j = 0; j < ntiles; j++) {
      const uint32_t st = (uint32_t)(j & 1);
      const uint32_t kvb = kv_s + st * TILE;
      mbar_wait(full_b + 8u * st, (uint32_t)((j >> 1) & 1)); /* tile j (and Q) */
      fence_proxy_async();
      const uint64_t um = umask[st];
      const bool u0 = (um >> r0) & 1u, u1 = (um >> (r0 + 8)) & 1u;
      float s[HG / 2];
      wg_s_issue<HG, KB>(s, kvb, W_KB_BYTES, q_s, QB); /* S^T = K Q^T */
      wg_wait<0>();
#pragma unroll
      for (int i = 0; i < HG / 2; i++) wg_pin(s[i]);

      /* The tile's max of each head: this thread's two entries, the warp's 16, the 4 warps'. */
      fwd_scale_logits<HG / 2>(s, a.logit_scale, a.softcap);
      float tmax[NB][2];
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          s[4 * n + c] = u0 ? s[4 * n + c] : NEG_INF;
          s[4 * n + 2 + c] = u1 ? s[4 * n + 2 + c] : NEG_INF;
          float v = fmax_nan(s[4 * n + c], s[4 * n + 2 + c]); /* a NaN logit poisons the head */
          v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 16));
          if (g == 0) red[wq * HG + 8 * n + 2 * tig + c] = v;
        }
      WS_SYNC();
      float alpha[NB][2], mls[NB][2];
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int h = 8 * n + 2 * tig + c;
          tmax[n][c] = fmax_nan(fmax_nan(red[h], red[HG + h]), fmax_nan(red[2 * HG + h], red[3 * HG + h]));
          m_top[n][c] = fmax_nan(m_top[n][c], tmax[n][c]);
          const float m_new = fmax_nan(m_run[n][c], tmax[n][c]); /* NaN: out, lse, max NaN */
          const float use = m_new == NEG_INF ? 0.0f : m_new;     /* nothing used yet */
          alpha[n][c] = ex2_approx((m_run[n][c] - use) * FWD_LOG2E);
          m_run[n][c] = m_new;
          mls[n][c] = use * FWD_LOG2E;
        }
      /* P^T (bf16) to the [HG][64] block: entry r of head h at chunk (r / 8) ^ (h % 8). */
#pragma unroll
      for (int n = 0; n < NB; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = e & 1, h = 8 * n + 2 * tig + c, r = r0 + 8 * (e >> 1);
          const float p = ex2_approx(fmaf(s[4 * n + e], FWD_LOG2E, -mls[n][c]));
          l_run[n][c] = (e >> 1) ? l_run[n][c] + p : l_run[n][c] * alpha[n][c] + p;
          *(__nv_bfloat16 *)(pb + h * 128 + (((r >> 3) ^ (h & 7)) << 4) + 2 * (r & 7)) =
              __float2bfloat16_rn(p);
        }
#pragma unroll
      for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int i = 0; i < HG / 2; i++) O[mt][i] *= alpha[i >> 2][i & 1];
      fence_proxy_async(); /* P^T visible to wgmma */
      WS_SYNC();           /* every warp's P^T stored, and red read */
#pragma unroll
      for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int i = 0; i < HG / 2; i++) wg_pin(O[mt][i]);
      wg_fence();
#pragma unroll
      for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int k = 0; k < 4; k++)
          wgmma_m64nNk16_ss<HG, 1>(O[mt], wg_desc(kvb + mt * W_KB_BYTES + k * 16 * 128, W_KB_BYTES, 1024),
                                   wg_desc(p_s + k * 32, 16, 1024));
      wg_commit();
      wg_wait<0>();
#pragma unroll
      for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int i = 0; i < HG / 2; i++) wg_pin(O[mt][i]);
      mbar_arrive(empty_b + 8u * st); /* this thread is done with the stage */
    }
    griddep_launch_dependents();

    /* ---- epilogue: l over the warp's and the 4 warps' entries, then each head's row ---- */
    float f[NB][2];
    void **dst_s = (void **)(smem + L.q); /* per head: its output row, or NULL */
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        float l = l_run[n][c];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        if (g == 0) red[4 * HG + wq * HG + 8 * n + 2 * tig + c] = l;
      }
    WS_SYNC(); /* also: every wgmma read of Q done (dst_s overwrites it) */
    float *ost = (float *)(smem + L.kv);
    float lh[NB][2]; /* each head's sum over the 4 warps */
#pragma unroll
    for (int n = 0; n < NB; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int h = 8 * n + 2 * tig + c, head = h0 + h;
        const bool writer = wq == 0 && g == 0;
        lh[n][c] = red[4 * HG + h] + red[5 * HG + h] + red[6 * HG + h] + red[7 * HG + h];
        f[n][c] = 1.0f;
        if (a.cluster_merge) {
          /* The row's splits merge in the kernel (fwd_dsmem_merge): O staged unnormalized,
           * each head's max and sum over the first 2 HG floats of red (the maxima, last
           * read in the last tile; the sums read here are past them). */
          if (writer) red[h] = m_run[n][c], red[HG + h] = lh[n][c];
          continue;
        }
        f[n][c] = 0.0f;
        if (head >= a.num_heads) {
          if (writer) dst_s[h] = NULL;
          continue;
        }
        const fwd_row_out r =
            fwd_row_epilogue(a, t, split, head, lh[n][c], m_run[n][c], m_top[n][c], writer);
        if (writer) dst_s[h] = r.out ? (void *)r.out : (void *)r.part;
        f[n][c] = r.f;
      }
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
      for (int i = 0; i < HG / 2; i++) {
        const int n = i >> 2, e = i & 3, h = 8 * n + 2 * tig + (e & 1);
        ost[h * W_OST_STRIDE + 64 * mt + r0 + 8 * (e >> 1)] = O[mt][i] * f[n][e & 1];
      }
    if (a.cluster_merge) {
      fwd_dsmem_merge<HG, 128, W_OST_STRIDE, 1>(a, kv_s, sbase + L.red, sbase + L.red + 4u * HG,
                                                (int *)(smem + L.mask), tid, t, grp, split, h0);
    } else {
      WS_SYNC();
      w_store_rows(a, ost, dst_s, wq, HG, 4);
    }
#undef WS_SYNC
  }
  fwd_count_bad(a, grp, bad);
}
#endif /* SMLA_FWD90_SMALL */

PROBE_DEFINE_DUMP(smla_probe_dump_fwd90)

/* Heads a block of the small-head kernel for N (0: N > 32, or the kernel is not built). */
extern "C" int smla_cuda_fwd90_small_heads(int num_heads) {
#if SMLA_FWD90_SMALL
  return num_heads <= 8 ? 8 : num_heads <= 16 ? 16 : num_heads <= 32 && SMLA_FWD90_SMALL >= 2 ? 32 : 0;
#else
  (void)num_heads;
  return 0;
#endif
}

/* The tile loop a plan with hb heads a block runs (smla_plan_describe). */
extern "C" const char *smla_cuda_fwd90_variant(int hb) {
  if (hb < 64) return "swap-AB small-head tiles (heads on the wgmma N axis)";
#if SMLA_FWD90_V23
  return V_PERSIST ? "tile loop v23 (scorer, three 48-row stages), one split as a persistent "
                     "grid, v11 (relay) for splits"
                   : "tile loop v23 (scorer, three 48-row stages) at one split, v11 (relay) "
                     "for splits";
#endif
  return SMLA_FWD90_PERSIST == 1 ? "tile loop v11 (relay), one split as a persistent grid"
                                 : "tile loop v11 (relay)";
}

extern "C" uint32_t smla_cuda_fwd90_smem_bytes(int dr, int hb) {
#if SMLA_FWD90_SMALL
  if (hb < 64) return ws_layout_of(dr, hb).total + 1024u;
#endif
  (void)hb;
#if SMLA_FWD90_V23
  if (v_layout_of(dr).total > w_layout_of(dr).total) return v_layout_of(dr).total + 1024u;
#endif
  return w_layout_of(dr).total + 1024u; /* + slack to align the base to 1024 */
}

/* The kernel for a Dr and heads a block. */
static const void *w_kernel(int dr, int hb) {
#if SMLA_FWD90_SMALL
  if (hb == 8) return dr == 64 ? (const void *)fwd90s_kernel<64, 8> : (const void *)fwd90s_kernel<0, 8>;
  if (hb == 16) return dr == 64 ? (const void *)fwd90s_kernel<64, 16> : (const void *)fwd90s_kernel<0, 16>;
  if (hb == 32) return dr == 64 ? (const void *)fwd90s_kernel<64, 32> : (const void *)fwd90s_kernel<0, 32>;
#endif
  (void)hb;
  return dr == 64 ? (const void *)fwd90_kernel<64> : (const void *)fwd90_kernel<0>;
}

/* v23 (SMLA_FWD90_V23) runs the 64-head kernel's plans of one split without a cluster
 * merge; v11 / v14 the rest. */
static const void *w_kernel_v23(int dr) {
#if SMLA_FWD90_V23
  return dr == 64 ? (const void *)fwd90_v23_kernel<64> : (const void *)fwd90_v23_kernel<0>;
#else
  (void)dr;
  return NULL;
#endif
}

extern "C" cudaError_t smla_cuda_fwd90_prepare(int dr, int hb, int max_smem) {
  if (hb == 64 && w_kernel_v23(dr)) {
    const cudaError_t e = cudaFuncSetAttribute(
        w_kernel_v23(dr), cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
    if (e != cudaSuccess) return e;
  }
  return cudaFuncSetAttribute(w_kernel(dr, hb), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              max_smem);
}

/* Threads a block of the kernel for hb heads a block. */
static unsigned w_threads(int hb) {
  return hb < 64 ? (unsigned)WS_BLOCK(hb) : (unsigned)W_BLOCK;
}

/* A launch configuration of the forward: clusters of `cluster` blocks (1: none), a
 * programmatic dependent when pdl. attr: room for 2 attributes. */
static cudaLaunchConfig_t w_config(unsigned blocks, unsigned threads, uint32_t smem, int cluster,
                                   int pdl, void *stream, cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(blocks, 1, 1);
  c.blockDim = dim3(threads, 1, 1);
  c.dynamicSmemBytes = smem;
  c.stream = (cudaStream_t)stream;
  unsigned n = 0;
  if (cluster > 1) { /* no cluster attribute on a plain launch */
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = (unsigned)cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    n++;
  }
  if (pdl && SMLA_FWD90_PDL) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  c.attrs = attr;
  c.numAttrs = n;
  return c;
}

/* Resident clusters of `splits` blocks (0: none): one cluster a row and head group, the
 * 64-head kernel's (w_cluster_sum) and the small-head kernel's (SMLA_FWD90S_MERGE builds)
 * over distributed shared memory. */
extern "C" cudaError_t smla_cuda_fwd90_cluster_capacity(int dr, int hb, int splits,
                                                        int *clusters) {
  *clusters = 0;
  if (splits < 2 || splits > 8 || (hb < 64 && !SMLA_FWD90S_MERGE)) return cudaSuccess;
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t c = w_config((unsigned)splits, w_threads(hb),
                                  smla_cuda_fwd90_smem_bytes(dr, hb), splits, 0, NULL, attr);
  return cudaOccupancyMaxActiveClusters(clusters, w_kernel(dr, hb), &c);
}

extern "C" cudaError_t smla_cuda_fwd90_launch(int dr, int hb, const smla_cuda_fwd_args *a,
                                              void *stream) {
  const int64_t blocks = a->num_tokens * a->groups * a->num_splits;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const int C = a->cluster_merge;
  if (C && (a->num_splits < 2 || a->num_splits > 8 || C != a->num_splits))
    return cudaErrorInvalidValue; /* one cluster a row */
  if (hb < 64 && smla_cuda_fwd90_small_heads(hb) != hb) return cudaErrorInvalidValue;
  cudaLaunchAttribute attr[2];
  void *args[1] = {(void *)a};
#if SMLA_FWD90_V23
  if (hb == 64 && a->num_splits == 1 && !C) {
    const int64_t grid = V_PERSIST && a->resident_blocks > 0 && blocks > a->resident_blocks
                             ? a->resident_blocks
                             : blocks;
    cudaLaunchConfig_t c = w_config((unsigned)grid, V_BLOCK, v_layout_of(dr).total + 1024u, 1,
                                    a->pdl, stream, attr);
    return cudaLaunchKernelExC(&c, w_kernel_v23(dr), args);
  }
#endif
  int64_t grid = blocks; /* the persistent grid: at most one block a resident slot */
  if (SMLA_FWD90_PERSIST == 1 && hb == 64 && a->num_splits == 1 && !a->cluster_merge &&
      a->resident_blocks > 0 && grid > a->resident_blocks)
    grid = a->resident_blocks;
  cudaLaunchConfig_t c = w_config((unsigned)grid, w_threads(hb),
                                  smla_cuda_fwd90_smem_bytes(dr, hb),
                                  C ? C : 1, a->pdl, stream, attr);
  return cudaLaunchKernelExC(&c, w_kernel(dr, hb), args);
}
