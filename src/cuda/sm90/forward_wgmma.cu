/*
 * forward_wgmma.cu: the Hopper (sm_90a) sparse-MLA forward for BF16 caches and 64 heads
 * per block (SPEC §3), tensor cores through wgmma with both operands in shared memory (and
 * P from registers); and, at the end, the small-head kernel (N <= 32 by default: heads on
 * the wgmma N axis; the plan gives the generic kernel the fewest rows, where it is faster).
 * Design, napkin math and every measured version (v1-v24; v2-v8's code is in the git
 * history, v3 / v7 last at d2d16d7, v12 at 8663169, v13 at f3d4a0c, v15 (tile pairs; back
 * as v24, SMLA_FWD90_PAIR) at dea8388, v16 (S before the cross PV) at 6c73d08, v18 (two gather warpgroups) at dcf51d5,
 * v19 (either event first) at b193fe8, v20 (the column pair, 2-block clusters) at d70d269,
 * v22 (the scorer: S and softmax on a third compute warpgroup) at e5161fd, v23 (three
 * 48-row stages, the scorer a tile ahead, a persistent grid) at 37bc82a):
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

/* SMLA_FWD90_NB_PREADY (session 30; built, not yet run; default 0): v11's P hand-off (pready)
 * through named barriers 2 + stage (bar.arrive by the 128 threads of the tile's warpgroup,
 * bar.sync by all 256 compute threads) instead of an mbarrier of 128 arrivals polled with
 * try_wait, as FlashMLA's kernel hands its row maxima and P between warpgroups
 * (docs/design/cuda-sm90-forward.md, session 30). A named barrier has no phase: the next
 * arrival on a stage's barrier (tile j + 2, the same warpgroup, or across a unit's end,
 * after the epilogue's barrier) always follows the other warpgroup's wait for tile j,
 * which the relay's order guarantees (P(j + 1) comes after that wait). */
#ifndef SMLA_FWD90_NB_PREADY
#define SMLA_FWD90_NB_PREADY 0
#endif

/* SMLA_FWD90_PAIR (v24 in docs/design/cuda-sm90-forward.md: session 21's v15 on today's
 * kernel; default 0 until measured): 1: the 64-head kernel runs tiles in pairs (w24_pairs
 * below) with half-stage barriers, instead of v11's relay; warpgroup 0 issues the next
 * pair's S behind its cross PV and releases stage 1's left half once that PV is done
 * (FlashMLA's order; session 21's PAIR=2, that release before the next S waits, measured
 * the same and is gone). SMLA_FWD90_PAIR_NB (default 1; with PAIR only): the four
 * hand-offs a pair between the compute warpgroups (m0, m1, P0, P1) on named barriers 2-5
 * (bar.arrive by the sender, bar.sync by the receiver: FlashMLA's); 0: on mbarriers of 128
 * arrivals polled with try_wait (v15's). */
#ifndef SMLA_FWD90_PAIR
#define SMLA_FWD90_PAIR 0
#endif
#ifndef SMLA_FWD90_PAIR_NB
#define SMLA_FWD90_PAIR_NB 1
#endif

#define W_THREADS 256 /* the two compute warpgroups */
#define W_BLOCK (W_THREADS + 128) /* and the gather warpgroup */
#define W_HEADS 64
#define W_KB_BYTES 8192 /* one [64 rows][128 B] block of 64 bf16 columns */

struct w_layout {
  uint32_t q, kv, p, xm, red, rowmax, rowtop, mask, bar, total;
};

/* Offsets from L.bar of the mbarriers. v11: full[2], empty[2], pready[2], qfree. v24
 * (SMLA_FWD90_PAIR): full[stage][half], empty[stage][half] (half 0: column blocks 0-3, V's
 * left 256 columns; half 1: the rest), mready[wg], pready[wg], qfree. */
#define W_BAR_FULL(st, h) (SMLA_FWD90_PAIR ? 8u * (2u * (st) + (h)) : 8u * (st))
#define W_BAR_EMPTY(st, h) (SMLA_FWD90_PAIR ? 32u + 8u * (2u * (st) + (h)) : 16u + 8u * (st))
#define W_BAR_MREADY(w) (64u + 8u * (w))
#define W_BAR_PREADY(w) (SMLA_FWD90_PAIR ? 80u + 8u * (w) : 32u + 8u * (w))
#define W_BAR_QFREE (SMLA_FWD90_PAIR ? 96u : 48u)

__host__ __device__ constexpr w_layout w_layout_of(int dr) {
  w_layout l = {};
  const uint32_t tile = (uint32_t)((512 + dr) / 64) * W_KB_BYTES;
  l.q = 0;
  l.kv = l.q + tile;
  l.p = l.kv + 2u * tile;
  if (SMLA_FWD90_PAIR) {
    /* v24: P of tile 2i (warpgroup 0's) goes in stage 0's rope block at dr = 64 (at p at
     * dr = 0), P of tile 2i + 1 at p (p + 8 KB at dr = 0): stage 1's rope block is
     * refilled before warpgroup 0's PV has read it. xm: [wg][64] float, each warpgroup's
     * reference max of the pair; rowtop: [wg][64], each warpgroup's largest logit. */
    l.xm = l.p + (dr ? 1u : 2u) * W_KB_BYTES;
    l.red = l.xm + 2u * 64u * 4u;
    l.rowmax = l.red + 2u * 64u * 4u;
    l.rowtop = l.rowmax + 64u * 4u;
    l.mask = l.rowtop + 2u * 64u * 4u; /* [2] uint64 at offset 0 (v11: at 64) */
    l.bar = l.mask + 16u;
    l.total = l.bar + 13u * 8u;
    return l;
  }
  /* dr = 0: P of stage 0, then P of stage 1 (dr = 64: P of a stage goes in its rope
   * block, which only S reads) */
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

/* A row's largest logit from this block's rowtop (v24 keeps one a warpgroup; the cluster
 * merge reads both through w_cluster_factor). */
__device__ __forceinline__ float w_row_top(const float *rowtop, int row) {
  return SMLA_FWD90_PAIR ? fmax_nan(rowtop[row], rowtop[64 + row]) : rowtop[row];
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
    if (writer && SMLA_FWD90_PAIR) /* v24: one largest logit a warpgroup */
      top = fmax_nan(top, ld_cluster_f32(rowtop_s + 256u + 4u * row, (uint32_t)k));
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

/* v11's cross PV: O[:, 256 wg + ...] += P V over the 4 k-steps of the stage at kvb (V read
 * MN-major), P from the [64][64] block at p_s (K-major, 128-byte swizzle); one commit group. */
__device__ __forceinline__ void w11_pv_ss(float O[2][64], uint32_t p_s, uint32_t kvb, int wg) {
  w11_pin_o(O);
  wg_fence();
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint64_t da = wg_desc(p_s + 32u * k, 16, 1024);
#pragma unroll
    for (int h = 0; h < 2; h++)
      wgmma_m64n128k16_ss_tb(O[h], da,
                             wg_desc(kvb + (uint32_t)((4 * wg + 2 * h) * W_KB_BYTES + k * 16 * 128),
                                     W_KB_BYTES, 1024));
  }
  wg_commit();
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

/* pa stays in its registers up to here (an RS wgmma read it asynchronously until the
 * wait before this). */
__device__ __forceinline__ void w_keep_pa(const uint32_t pa[16]) {
#pragma unroll
  for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
}

/* The top of a step at tile j: the PV of tile j-1 (this warpgroup's part; RS: pa was read
 * until here) is done, and this warp releases its part of that stage. */
__device__ __forceinline__ void w11_release_prev(int j, uint32_t gj, uint32_t empty_b,
                                                 float O[2][64], const uint32_t pa[16]) {
  wg_wait<0>();
  w_keep_pa(pa);
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

/* The online softmax of one tile's S (v11's own tiles, v24's every tile), s holding the
 * raw accumulators of this thread's rows r0, r0 + 8: logits scaled (softcap) and masked by
 * the used-entry bits um (bit 8 n + e: column 8 n + 2 tig + e), m_top raised to the tile's
 * max; m_new the reference max from mref (lazy, v10: it stays while the max grew by at most
 * W_TAU), alpha the factor that moves what O and the sums were relative to (m_run) to
 * m_new, lsum P's row sums, pa P as bf16 pairs (the A fragment of an RS wgmma); moved:
 * whether a row's reference changed. OWN_REF (v11: mref is m_run, and m_new may be it too):
 * moved where the max grew past the lazy bound; else where m_new is not m_run. */
template <bool OWN_REF>
__device__ __forceinline__ void w_softmax(const smla_cuda_fwd_args &a, float s[32], uint64_t um,
                                          const float *mref, const float *m_run, float m_top[2],
                                          float *m_new, float alpha[2], float lsum[2],
                                          uint32_t pa[16], bool &moved) {
  constexpr int NB = 8; /* n8 column blocks of the tile */
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
    float m = fmax_nan(mref[hh], tmax[hh]); /* NaN: out, lse, max NaN */
    if (W_TAU > 0.0f && m - mref[hh] <= W_TAU) m = mref[hh];
    else if (OWN_REF) moved = true;
    if (!OWN_REF) moved |= !(m == m_run[hh]); /* NaN moves */
    const float use = m == NEG_INF ? 0.0f : m; /* nothing used yet */
    alpha[hh] = ex2_approx((m_run[hh] - use) * FWD_LOG2E);
    m_new[hh] = m;
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
      if (!OWN_REF) s[4 * n + 2 * hh] = p0, s[4 * n + 2 * hh + 1] = p1; /* v24 rescales P */
      lsum[hh] += p0 + p1;
      pa[2 * n + hh] = pack_bf16x2(p0, p1);
    }
#if SMLA_PROBE
#pragma unroll
  for (int i = 0; i < 2 * NB; i++) asm volatile("" ::"r"(pa[i]) : "memory");
#endif
}

/* pa (this thread's fragment of a [64][64] bf16 P) into the 128-byte-swizzled block at pb. */
__device__ __forceinline__ void w_store_p(uint8_t *pb, const uint32_t pa[16], int r0, int tig) {
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
      *(uint32_t *)(pb + w_chunk(r0 + 8 * hh, n) + 4 * tig) = pa[2 * n + hh];
}

/* OWN(j)'s hand-off: P(j) to the P block pb, m(j) and the largest logit to xmj, then the
 * arrival on pready (stage st's mbarrier, or its named barrier: SMLA_FWD90_NB_PREADY). */
__device__ __forceinline__ void w11_own_publish(const uint32_t pa[16], int r0, int tig,
                                                uint8_t *pb, float *xmj, uint32_t pready_st,
                                                uint32_t st, const float m_run[2],
                                                const float m_top[2]) {
  w_store_p(pb, pa, r0, tig);
  if (tig == 0)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) xmj[r0 + 8 * hh] = m_run[hh], xmj[64 + r0 + 8 * hh] = m_top[hh];
  fence_proxy_async(); /* P visible to the other warpgroup's wgmma */
  /* Every thread arrives for its own P and xm stores (one arrival a warp after
   * __syncwarp measured the same, bench/RESULTS.md session 13 run 3, and racecheck,
   * which does not order the other lanes' stores before lane 0's arrival, flagged it). */
  if (SMLA_FWD90_NB_PREADY)
    named_bar_arrive(2 + (int)st, W_THREADS);
  else
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
      /* P(j), m(j); tile j landed before it */
      if (SMLA_FWD90_NB_PREADY)
        named_bar_sync(2 + (int)st, W_THREADS);
      else
        mbar_wait(pready_b + 8u * st, par);
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
    w_softmax<true>(a, s, um, m_run, m_run, m_top, m_run, alpha, lsum, pa, moved);
    w11_own_publish(pa, r0, tig, smem + (pblk - sbase), xmj, pready_b + 8u * st, st, m_run,
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
  w_keep_pa(pa);
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
 * (column blocks CB0..CB1 - 1: all KB of them, or one half-stage's in v24) into the stage
 * at base: 4 rows an instruction, lane (rl, cl) chunk cl of row 4 rg + rl; the slot sc and
 * used bit u_mine of row RPW pw + r sit in lane r (and r + RPW, ..). */
template <int CB0, int CB1, int RPW>
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
    for (int cb = CB0; cb < CB1; cb++)
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
    w_gather_rows<0, KB, RPW>(a, kv_s + st * (uint32_t)(KB * W_KB_BYTES), pw, rl, cl, sc, u_mine);
    /* This thread's arrival, once its copies have landed. */
    mbar_arrive_cp_async_noinc(full_b + 8u * st);
  }
  return bad;
}

/* ---- v24: tiles in pairs (SMLA_FWD90_PAIR; docs/design/cuda-sm90-forward.md, v15 and v24)
 * Pair i is tiles 2i (stage 0, warpgroup 0's) and 2i + 1 (stage 1, warpgroup 1's). Each
 * warpgroup computes its tile's whole S (m64n64k16: Q read once a tile), and both S run
 * at once. The reference max runs one way inside the pair: warpgroup 0's softmax from the
 * pair's reference M gives m0 and P0; warpgroup 1's from m0 gives m1 and P1; warpgroup 0
 * stores P0 exp(m0 - m1) for warpgroup 1, so both warpgroups end the pair at m1, the next
 * pair's M. Output columns: warpgroup w owns 256 w..256 w + 255 and adds its own P from
 * registers (RS), the other's from shared memory (SS).
 *   wg 0: softmax0, m0 out | O += P0 V0[left] (RS) | m1 in: P0 exp(m0 - m1) out | P1 in:
 *         O *= exp(m0 - m1), O += P1 V1[left] (SS) | S of tile 2i + 2, left half first
 *   wg 1: S of tile 2i + 1, right half first | m0 in: softmax1, m1 out | O += P1 V1[right]
 *         (RS) | P1 out | P0 in: O += P0 V0[right] (SS)
 * Each stage is two halves with their own barriers (half 0: column blocks 0-3, V's left
 * 256 columns; half 1: blocks 4.., V's right 256 and the rope block), released by the
 * warpgroup whose PV reads it last and refilled in the order they free up: stage 0 half
 * 0 (warpgroup 0's RS PV), stage 1 half 1 (warpgroup 1's RS PV), stage 0 half 1 and stage
 * 1 half 0 (the SS PVs). So the next pair's first halves load while this pair's second PVs
 * run (v8 released whole stages and held both for a pair). A unit with an odd tile count
 * ends with a pair whose second tile has no used entry (zeros, logits -inf).
 * The hand-offs (m0, m1, P0, P1 on named barriers 2, 3, 4, 5; SMLA_FWD90_PAIR_NB): a named
 * barrier has no phase, so a sender must not arrive for pair i + 1 before the receiver has
 * waited for pair i. Each is ordered so by another hand-off. Warpgroup 1 sends m1 of pair
 * i after its wait for m0 of pair i, and warpgroup 0 sends m0 of pair i + 1 after its
 * waits for m1 and P1 of pair i: so m0 (i + 1) follows the wait for m0 (i), and m1 (i +
 * 1) and P1 (i + 1), which warpgroup 1 sends after its wait for m0 (i + 1), follow the
 * waits for m1 (i) and P1 (i). Warpgroup 0 sends P0 of pair i + 1 after its wait for m1
 * of pair i + 1, which warpgroup 1 sends after its whole pair i, its wait for P0 (i)
 * included. A unit's pairs end in the epilogue's barrier on both sides. This needs both
 * warpgroups to run the same np pairs of every unit (both take np from the unit's tile
 * count) with no early exit: a pair one of them skipped (an all-masked tile, say) would put
 * the counts out of step without a hang to show it. */

/* A hand-off between the compute warpgroups: the sender's 128 threads arrive (their stores
 * before it are seen by the receiver after its wait), on named barrier id, or on the
 * mbarrier at bar (v15's form, SMLA_FWD90_PAIR_NB=0). */
__device__ __forceinline__ void w24_signal(uint32_t bar, int id) {
  if (SMLA_FWD90_PAIR_NB) named_bar_arrive(id, W_THREADS);
  else mbar_arrive(bar);
}
__device__ __forceinline__ void w24_wait(uint32_t bar, int id, uint32_t par) {
  if (SMLA_FWD90_PAIR_NB) named_bar_sync(id, W_THREADS);
  else mbar_wait(bar, par);
}

/* S[64][64] += Q K^T over column blocks KB0..KB1 - 1 of the stage at kvb, one commit group;
 * ZERO: s zeroed first (the first part of a tile). */
template <int KB0, int KB1, bool ZERO>
__device__ __forceinline__ void w24_s_part(float s[32], uint32_t q_s, uint32_t kvb) {
  /* Opaque addresses: the stage is fixed, so the descriptors would otherwise be hoisted
   * out of the loop (and spilled). */
  asm volatile("mov.u32 %0, %0;" : "+r"(q_s));
  asm volatile("mov.u32 %0, %0;" : "+r"(kvb));
  if (ZERO) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 32; i++) wg_pin(s[i]);
  wg_fence();
#pragma unroll
  for (int kb = KB0; kb < KB1; kb++)
#pragma unroll
    for (int k4 = 0; k4 < 4; k4++)
      wgmma_m64n64k16_ss(s, wg_desc(q_s + kb * W_KB_BYTES + k4 * 32, 16, 1024),
                         wg_desc(kvb + kb * W_KB_BYTES + k4 * 32, 16, 1024));
  wg_commit();
}

/* One compute warpgroup's pairs of a unit (WG 0: tiles 2i, WG 1: tiles 2i + 1; the comment
 * above says in which order), the block's pairs gp0.. (the stage phases count them). */
template <int DR, int WG>
__device__ __forceinline__ void w24_pairs(const smla_cuda_fwd_args &a, int np, uint32_t gp0,
                                          uint8_t *smem, uint32_t sbase, const w_layout &L,
                                          float O[2][64], float m_run[2], float l_run[2],
                                          float m_top[2]) {
  constexpr int KB = (512 + DR) / 64;
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3, r0 = 16 * wq + g;
  const uint32_t bar = sbase + L.bar, kv0 = sbase + L.kv, kv1 = kv0 + TILE;
  const uint32_t p0s = DR ? kv0 + 8u * W_KB_BYTES : sbase + L.p; /* P0 (warpgroup 0's) */
  const uint32_t p1s = sbase + L.p + (DR ? 0u : W_KB_BYTES);      /* P1 (warpgroup 1's) */
  float *xm = (float *)(smem + L.xm); /* [wg][64]: m0, m1 */
  const volatile uint64_t *umask = (const volatile uint64_t *)(smem + L.mask);
  const uint32_t q_s = sbase + L.q;
  float s[32];
  uint32_t pa[16];
  if constexpr (WG == 0) {
    { /* the first pair's S */
      const uint32_t par = gp0 & 1u;
      mbar_wait(bar + W_BAR_FULL(0, 0), par);
      fence_proxy_async();
      w24_s_part<0, 4, true>(s, q_s, kv0);
      mbar_wait(bar + W_BAR_FULL(0, 1), par);
      fence_proxy_async();
      w24_s_part<4, KB, false>(s, q_s, kv0);
      wg_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; i++) wg_pin(s[i]);
    }
#pragma unroll 1
    for (int p = 0; p < np; p++) {
      const uint32_t par = (gp0 + (uint32_t)p) & 1u;
      /* This warpgroup's last S of the unit has read Q: the next unit's may come in. */
      if (p + 1 == np && lane == 0) mbar_arrive(bar + W_BAR_QFREE);
      float m0[2], alpha[2], lsum[2];
      bool moved;
      w_softmax<false>(a, s, umask[0] >> (2 * tig), m_run, m_run, m_top, m0, alpha, lsum, pa, moved);
      if (tig == 0) xm[r0] = m0[0], xm[r0 + 8] = m0[1];
      w24_signal(bar + W_BAR_MREADY(0), 2);
#pragma unroll
      for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
      if (__any_sync(0xffffffffu, moved)) w11_scale_o(O, alpha);
      w11_pv_rs(O, pa, kv0, 0);
      wg_wait<0>();
      w_keep_pa(pa);
      w11_pin_o(O);
      mbar_arrive(bar + W_BAR_EMPTY(0, 0)); /* stage 0's left half: its last reader done */
      /* m1: P0 and O move to it. */
      w24_wait(bar + W_BAR_MREADY(1), 3, par);
      float beta[2];
      bool moved1 = false;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const float m1 = xm[64 + r0 + 8 * hh];
        moved1 |= !(m1 == m0[hh]); /* NaN moves */
        const float use = m1 == -INFINITY ? 0.0f : m1;
        beta[hh] = ex2_approx((m0[hh] - use) * FWD_LOG2E);
        m_run[hh] = m1;
      }
      const bool scale = __any_sync(0xffffffffu, moved1);
      if (scale) {
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int hh = 0; hh < 2; hh++)
            pa[2 * n + hh] =
                pack_bf16x2(s[4 * n + 2 * hh] * beta[hh], s[4 * n + 2 * hh + 1] * beta[hh]);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) l_run[hh] *= beta[hh];
      }
      w_store_p(smem + (p0s - sbase), pa, r0, tig);
      fence_proxy_async(); /* P0 visible to warpgroup 1's wgmma */
      w24_signal(bar + W_BAR_PREADY(0), 4);
      if (scale) w11_scale_o(O, beta);
      w24_wait(bar + W_BAR_PREADY(1), 5, par);
      fence_proxy_async();
      w11_pv_ss(O, p1s, kv1, 0);
      if (p + 1 < np) { /* the next pair's S, its left half under this PV */
        mbar_wait(bar + W_BAR_FULL(0, 0), par ^ 1u);
        fence_proxy_async();
        w24_s_part<0, 4, true>(s, q_s, kv0);
        wg_wait<1>();
        w11_pin_o(O);
        mbar_arrive(bar + W_BAR_EMPTY(1, 0));
        mbar_wait(bar + W_BAR_FULL(0, 1), par ^ 1u);
        fence_proxy_async();
        w24_s_part<4, KB, false>(s, q_s, kv0);
        wg_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; i++) wg_pin(s[i]);
      } else {
        wg_wait<0>();
        w11_pin_o(O);
        mbar_arrive(bar + W_BAR_EMPTY(1, 0));
      }
    }
  } else {
#pragma unroll 1
    for (int p = 0; p < np; p++) {
      const uint32_t par = (gp0 + (uint32_t)p) & 1u;
      mbar_wait(bar + W_BAR_FULL(1, 1), par); /* the half warpgroup 1's own PV frees first */
      fence_proxy_async();
      w24_s_part<4, KB, true>(s, q_s, kv1);
      mbar_wait(bar + W_BAR_FULL(1, 0), par);
      fence_proxy_async();
      w24_s_part<0, 4, false>(s, q_s, kv1);
      wg_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; i++) wg_pin(s[i]);
      if (p + 1 == np && lane == 0) mbar_arrive(bar + W_BAR_QFREE);
      const uint64_t um = umask[1] >> (2 * tig);
      w24_wait(bar + W_BAR_MREADY(0), 2, par);
      float m0[2], m1[2], alpha[2], lsum[2];
      m0[0] = xm[r0], m0[1] = xm[r0 + 8];
      bool moved;
      w_softmax<false>(a, s, um, m0, m_run, m_top, m1, alpha, lsum, pa, moved);
      if (tig == 0) xm[64 + r0] = m1[0], xm[64 + r0 + 8] = m1[1];
      w24_signal(bar + W_BAR_MREADY(1), 3);
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
        m_run[hh] = m1[hh];
      }
      if (__any_sync(0xffffffffu, moved)) w11_scale_o(O, alpha);
      w11_pv_rs(O, pa, kv1, 1);
      w_store_p(smem + (p1s - sbase), pa, r0, tig);
      fence_proxy_async(); /* P1 visible to warpgroup 0's wgmma */
      w24_signal(bar + W_BAR_PREADY(1), 5);
      w24_wait(bar + W_BAR_PREADY(0), 4, par);
      fence_proxy_async();
      w11_pv_ss(O, p0s, kv0, 1);
      wg_wait<1>();
      w_keep_pa(pa);
      mbar_arrive(bar + W_BAR_EMPTY(1, 1)); /* stage 1's right half: its last reader done */
      wg_wait<0>();
      w11_pin_o(O);
      mbar_arrive(bar + W_BAR_EMPTY(0, 1));
    }
  }
}

/* The gather warpgroup's pairs of a unit (v24): per pair the four half-stages in the order
 * their readers free them, each after its empty barrier (from the block's second pair on):
 * tile 2i's half 0 into stage 0 and tile 2i + 1's half 1 into stage 1 (each with its tile's
 * used-entry bits, one arrival a warp on that half's full), then tile 2i's half 1 and
 * tile 2i + 1's half 0. Warp pw copies rows 16 pw.. of both tiles. A tile past the unit's
 * end (an odd count) has no used entry: zeros. Returns this thread's bad-slot count. */
template <int KB>
__device__ __forceinline__ unsigned w24_gather_pairs(const smla_cuda_fwd_args &a,
                                                     uint8_t *mask_p, uint32_t kv_s,
                                                     uint32_t bar, slot_pipe &spipe,
                                                     int32_t req, const int32_t *slot_row,
                                                     int ks, int kend, int np, uint32_t gp0,
                                                     int pw, int rl, int cl, int my_row) {
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  const int lane = threadIdx.x & 31;
  unsigned bad = 0;
#pragma unroll 1
  for (int p = 0; p < np; p++) {
    const uint32_t gp = gp0 + (uint32_t)p, prev = (gp - 1u) & 1u;
    const int j0 = 2 * p, j1 = 2 * p + 1;
    const int32_t sc0 = slot_pipe_next(spipe, a, req, slot_row, ks, kend, j0, my_row);
    const int32_t sc1 = slot_pipe_next(spipe, a, req, slot_row, ks, kend, j1, my_row);
    unsigned nb = 0;
    const int u0 = entry_used(a, sc0, ks + j0 * FWD_BN + my_row, kend, 0, &nb);
    const int u1 = entry_used(a, sc1, ks + j1 * FWD_BN + my_row, kend, 0, &nb);
    bad += lane < 16 ? nb : 0u; /* lanes 16..31 hold the same rows again */
    const unsigned bits0 = __ballot_sync(0xffffffffu, u0) & 0xffffu;
    const unsigned bits1 = __ballot_sync(0xffffffffu, u1) & 0xffffu;
    if (gp >= 1) mbar_wait(bar + W_BAR_EMPTY(0, 0), prev);
    if (lane == 0) {
      *(volatile uint16_t *)(mask_p + 2u * (uint32_t)pw) = (uint16_t)bits0;
      mbar_arrive(bar + W_BAR_FULL(0, 0));
    }
    w_gather_rows<0, 4, 16>(a, kv_s, pw, rl, cl, sc0, u0);
    mbar_arrive_cp_async_noinc(bar + W_BAR_FULL(0, 0));
    if (gp >= 1) mbar_wait(bar + W_BAR_EMPTY(1, 1), prev);
    if (lane == 0) {
      *(volatile uint16_t *)(mask_p + 8u + 2u * (uint32_t)pw) = (uint16_t)bits1;
      mbar_arrive(bar + W_BAR_FULL(1, 1));
    }
    w_gather_rows<4, KB, 16>(a, kv_s + TILE, pw, rl, cl, sc1, u1);
    mbar_arrive_cp_async_noinc(bar + W_BAR_FULL(1, 1));
    if (gp >= 1) mbar_wait(bar + W_BAR_EMPTY(0, 1), prev);
    w_gather_rows<4, KB, 16>(a, kv_s, pw, rl, cl, sc0, u0);
    mbar_arrive_cp_async_noinc(bar + W_BAR_FULL(0, 1));
    if (gp >= 1) mbar_wait(bar + W_BAR_EMPTY(1, 0), prev);
    w_gather_rows<0, 4, 16>(a, kv_s + TILE, pw, rl, cl, sc1, u1);
    mbar_arrive_cp_async_noinc(bar + W_BAR_FULL(1, 0));
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
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u, qfree_b = full_b + W_BAR_QFREE;
  if (tid == 0 && SMLA_FWD90_PAIR) {
    /* v24. full[st][h]: the 128 gather threads' copies, and on the half that comes first
     * (tile 2i: half 0, tile 2i + 1: half 1) one arrival a gather warp (its mask bits);
     * empty[st][h], mready, pready (the last two only on mbarrier hand-offs,
     * SMLA_FWD90_PAIR_NB=0): the 128 threads of the warpgroup that reads the half last, or
     * publishes; qfree: the 8 compute warps, as v11's. */
    mbar_init(full_b + W_BAR_FULL(0, 0), 132), mbar_init(full_b + W_BAR_FULL(0, 1), 128);
    mbar_init(full_b + W_BAR_FULL(1, 0), 128), mbar_init(full_b + W_BAR_FULL(1, 1), 132);
#pragma unroll
    for (uint32_t i = 0; i < 4; i++) mbar_init(full_b + W_BAR_EMPTY(0, 0) + 8u * i, 128);
#pragma unroll
    for (uint32_t w = 0; w < 2 && !SMLA_FWD90_PAIR_NB; w++)
      mbar_init(full_b + W_BAR_MREADY(w), 128), mbar_init(full_b + W_BAR_PREADY(w), 128);
    mbar_init(qfree_b, 8);
  } else if (tid == 0) {
    /* full: the 128 gather threads' copies and one arrival a gather warp (its mask bits);
     * empty: the 8 compute warps; pready (not on named barriers, SMLA_FWD90_NB_PREADY):
     * the 128 threads of the tile's warpgroup; qfree: the 8 compute warps, once a unit,
     * when their last S of it is done. */
    mbar_init(full_b, 132), mbar_init(full_b + 8u, 132);
    mbar_init(empty_b, 8), mbar_init(empty_b + 8u, 8);
    if (!SMLA_FWD90_NB_PREADY) mbar_init(full_b + 32u, 128), mbar_init(full_b + 40u, 128);
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
#if SMLA_FWD90_PAIR
      const int np = (blk.ntiles + 1) / 2;
      const unsigned nb = w24_gather_pairs<KB>(a, smem + L.mask, kv_s, full_b, spipe, blk.req,
                                               blk.slot_row, blk.ks, blk.kend, np, g0, pw, rl,
                                               cl, my_row);
      if (blk.grp == 0) bad += nb;
      g0 += (uint32_t)np; /* v24: pairs */
#else
      const unsigned nb = w_gather_tiles<KB, 16>(a, smem + L.mask + 64u, kv_s, full_b, spipe,
                                                 blk.req, blk.slot_row, blk.ks, blk.kend,
                                                 blk.ntiles, g0, pw, rl, cl, my_row);
      if (blk.grp == 0) bad += nb;
      g0 += (uint32_t)blk.ntiles;
#endif
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
#if SMLA_FWD90_PAIR
    const int np = (ntiles + 1) / 2;
    if (wg == 0) w24_pairs<DR, 0>(a, np, g0, smem, sbase, L, O, m_run, l_run, m_top);
    else w24_pairs<DR, 1>(a, np, g0, smem, sbase, L, O, m_run, l_run, m_top);
    g0 += (uint32_t)np; /* v24: pairs */
#elif SMLA_PROBE
    w11_loop<DR>(a, ntiles, g0, smem, sbase, L, wg, O, m_run, l_run, m_top, probe_t_);
    g0 += (uint32_t)ntiles;
#else
    w11_loop<DR>(a, ntiles, g0, smem, sbase, L, wg, O, m_run, l_run, m_top);
    g0 += (uint32_t)ntiles;
#endif
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
        else if (SMLA_FWD90_PAIR) rowtop_s[64 + row] = m_top[hh]; /* v24: one a warpgroup */
      }
    }
  } else {
    /* No used entry can exist in this split: every row gets l = 0, m = -inf. */
    for (int i = tid; i < 128; i += W_THREADS) red[i] = 0.0f;
    for (int i = tid; i < 64; i += W_THREADS) rowmax_s[i] = rowtop_s[i] = NEG_INF;
    if (SMLA_FWD90_PAIR)
      for (int i = tid; i < 64; i += W_THREADS) rowtop_s[64 + i] = NEG_INF;
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
                             w_row_top(rowtop_s, row), wg == 0 && tig == 0);
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
                                             rowmax_s[row], w_row_top(rowtop_s, row), writer);
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
  if (SMLA_FWD90_PAIR)
    return SMLA_FWD90_PERSIST == 1 ? "tile loop v24 (pairs), one split as a persistent grid"
                                   : "tile loop v24 (pairs)";
  return SMLA_FWD90_PERSIST == 1 ? "tile loop v11 (relay), one split as a persistent grid"
                                 : "tile loop v11 (relay)";
}

extern "C" uint32_t smla_cuda_fwd90_smem_bytes(int dr, int hb) {
#if SMLA_FWD90_SMALL
  if (hb < 64) return ws_layout_of(dr, hb).total + 1024u;
#endif
  (void)hb;
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

extern "C" cudaError_t smla_cuda_fwd90_prepare(int dr, int hb, int max_smem) {
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
  int64_t grid = blocks; /* the persistent grid: at most one block a resident slot */
  if (SMLA_FWD90_PERSIST == 1 && hb == 64 && a->num_splits == 1 && !a->cluster_merge &&
      a->resident_blocks > 0 && grid > a->resident_blocks)
    grid = a->resident_blocks;
  cudaLaunchConfig_t c = w_config((unsigned)grid, w_threads(hb),
                                  smla_cuda_fwd90_smem_bytes(dr, hb),
                                  C ? C : 1, a->pdl, stream, attr);
  return cudaLaunchKernelExC(&c, w_kernel(dr, hb), args);
}
