/*
 * forward_wgmma.cu: the Hopper (sm_90a) sparse-MLA forward for BF16 caches and 64 heads
 * per block (SPEC §3), tensor cores through wgmma with both operands in shared memory.
 * Design, napkin math and measured versions: docs/design/cuda-sm90-forward.md.
 *
 * Work: one block of two compute warpgroups (256 threads; v3 adds a gather warpgroup,
 * 384 in all) per (row t, group of 64 heads, KV split), the same grid, split policy, partial-state format and combine as the generic
 * kernel (forward_impl.cuh), so the plan can pick either. Per tile of 64 gathered rows:
 *   S[64][64] = Q[64][dqk] K^T     warpgroup w: entries 32w..32w+31, dqk/16 wgmma
 *                                  m64n32k16 (A = Q, B = K rows, both K-major)
 *   online softmax                 row max exchanged between the two warpgroups in shared
 *                                  memory; P (bf16) written to shared memory
 *   O[64][512] += P[64][64] V      warpgroup w: output columns 256w..256w+255, 4 k-steps of
 *                                  2 wgmma m64n128k16 (A = P K-major, B = V MN-major)
 * Every thread of both warpgroups holds the same two rows (heads 16*warp + g, + 8) of S
 * and of O, so the rescale factor of its O rows is the one it computed itself.
 *
 * Shared memory (bytes from a 1024-aligned base; every operand in the 128-byte-swizzle
 * layout wgmma reads: a [kb][64 rows][128 B] stack of 8 KB blocks of 64 bf16 columns,
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8)):
 *   Q 9 x 8 KB, KV 2 stages x 9 x 8 KB, P 8 KB, row max/sum exchange, tile masks (v2),
 *   mbarriers (v3). dr = 64: 72 + 144 + 8 + 1 KB = 225 KB (+1 KB alignment slack) of
 *   the 227 KB opt-in.
 * Gathers: cp.async 16-byte copies, two stages deep; a masked entry's row is zero-filled
 * without reading the cache and its logits are -inf, so NaN in unused rows cannot leak in.
 * Per tile j (v2): wait for tile j, barrier (which also ends tile j-1), S(j) issued, tile
 * j+1's gathers issued under it (4 threads per row), softmax (one barrier for the row
 * max), P written, barrier, PV(j) waited for: three barriers per tile.
 * Per tile j (v3): the gather warpgroup waits for stage j % 2 to be free (empty), issues
 * tile j (8 lanes per row, 4 rows per instruction) and arrives on full; the compute
 * warpgroups wait on full, S(j), softmax (named barrier for the row max), P written,
 * named barrier, PV(j), one arrival per warp on empty.
 * Per tile j (v7, the EARLY instance, from 32 tiles a split): as v3, but after PV(j) is
 * issued, if tile j+1 has landed (one thread of the warpgroup tests full and tells the
 * others), S(j+1) is issued behind it and PV(j) waited for after; else PV(j) is waited
 * for and its stage released first, then S(j+1) issued once tile j+1 lands.
 * Epilogue: the final row (one split), a partial row for the combine kernel, or with
 * a.cluster_merge (2..8 splits as one cluster, v6) the merged row (w_cluster_factor,
 * w_cluster_sum below).
 */
#include "../forward_common.cuh"
#include "../probe.cuh"
#include "wgmma.cuh"

#include <limits.h>

/* v3, warp-specialized (the default; NVCC_EXTRA=-DSMLA_FWD90_WS=0 builds v2, the loop
 * where all 256 threads gather): a third warpgroup gathers the KV tiles (and Q) with 56
 * registers a thread (setmaxnreg; the compute warpgroups get 224: 56 + 2 x 224 = 3 x 168,
 * the launch's count) and signals them through mbarriers (full[stage]: one
 * cp.async-tracked arrival of each of its 128 threads; empty[stage]: the 8 compute warps
 * after PV), so that the two compute warpgroups issue no cp.async and sync through named
 * barriers of 256 threads only (each compute thread masks its own 8 logits a tile from
 * slots it loads a tile ahead). Predicted: ~15-20% per tile, T=16 N=128 44.9 -> ~38 us;
 * measured 41.4 us, T=64 N=128 114 -> 100 us, T=1024 N=128 1725 -> 1517 us
 * (docs/design/cuda-sm90-forward.md). */
#ifndef SMLA_FWD90_WS
#define SMLA_FWD90_WS 1
#endif
/* v7 (the kernel's EARLY instance): where tile j+1 has landed when PV(j) is issued, S(j+1)
 * is queued right behind it, before PV(j) is waited for, so that the tensor cores go from
 * one to the other without the wait, the empty arrival and the full wait in between.
 * Measured (bench/RESULTS.md, 2026-12-04): 1.2-6% faster at 32 tiles a block and more
 * (T >= 64, N = 128), 1.2-1.7% slower at 8-16 (T = 16, 32), so the launch takes it from
 * W_EARLY_MIN_TILES tiles a split on (the whole launch: a row shortened by lengths runs
 * it too). Needs the gather warpgroup (SMLA_FWD90_WS).
 * SMLA_FWD90_EARLY_FORCE (a test build): 0 takes the "not landed" branch every tile, 1
 * the "landed" one (waiting for tile j+1 if need be), so that tests reach both. */
#define W_EARLY_MIN_TILES 32
#define W_EARLY (SMLA_FWD90_WS && EARLY)
#ifndef SMLA_FWD90_EARLY_FORCE
#define SMLA_FWD90_EARLY_FORCE -1
#endif
/* SMLA_FWD90_BALLOT_MASK (default 1; 0 builds the earlier per-thread masks for A/B): each
 * compute lane loads one slot a tile instead of 8, and a warp ballot hands the used bits
 * to the 8 lanes that share its columns; fused, each entry is then converted 4 times in a
 * warpgroup instead of 32. Measured (H100, bench/RESULTS.md session 11): the fused step
 * 1.5-1.6x faster (T=64 N=128 166 -> 103 us, T=1024 N=128 2468 -> 1572 us). */
#ifndef SMLA_FWD90_BALLOT_MASK
#define SMLA_FWD90_BALLOT_MASK 1
#endif
/* SMLA_FWD90_LAZY_RESCALE (v10, default 1; 0 builds v9's rescale every tile): a row's
 * reference max (the one its sum and O are relative to) moves only when the tile's max
 * passes it by more than W_TAU = 8 ln 2, so P <= 2^8 (bf16 P keeps its relative
 * precision; the fp32 sums have room), and a warp rescales its O (128 multiplies a
 * thread) only when one of its rows moved. max_logit comes from a separate running max.
 * The rounding of P and of the sums changes, not their error bounds. */
#ifndef SMLA_FWD90_LAZY_RESCALE
#define SMLA_FWD90_LAZY_RESCALE 1
#endif
#define W_TAU (SMLA_FWD90_LAZY_RESCALE ? 5.5451774f : 0.0f)
/* The epilogue stages O in shared memory and stores whole rows (measured against
 * per-thread fragment stores in bench/RESULTS.md, 2026-12-04): floats per staged row. */
#define W_OST_STRIDE 520
/* A probe build (NVCC_EXTRA=-DSMLA_PROBE=1, src/cuda/probe.cuh; kind 10): compute thread 0
 * of the first and last block records its entry (t0), tile 0 landed (t1), the loop's end
 * (t2), the end (t7), and per-tile phase times summed over its tiles: t3 softmax to the
 * row-max rendezvous, t4 to the P rendezvous, t5 PV issued and waited for (with S(j+1)
 * queued behind it in the EARLY instance), t6 the rest to the next tile's start (the full
 * wait and S(j) in the v3 order; S(j+1)'s completion in the EARLY one). */
#if SMLA_PROBE
#define W_PHASE(k_)                                                                        \
  do {                                                                                     \
    if (tid == 0) {                                                                        \
      const unsigned long long n_ = probe_now();                                           \
      probe_t_[3 + (k_)] += n_ - probe_last_;                                              \
      probe_last_ = n_;                                                                    \
    }                                                                                      \
  } while (0)
#else
#define W_PHASE(k_)
#endif

#define W_THREADS 256 /* the two compute warpgroups */

#define W_BLOCK (W_THREADS + (SMLA_FWD90_WS ? 128 : 0))
#define W_HEADS 64
#define W_KB_BYTES 8192 /* one [64 rows][128 B] block of 64 bf16 columns */

struct w_layout {
  uint32_t q, kv, p, xm, red, rowmax, rowtop, mask, bar, total;
};

__host__ __device__ __forceinline__ w_layout w_layout_of(int dr) {
  w_layout l;
  const uint32_t tile = (uint32_t)((512 + dr) / 64) * W_KB_BYTES;
  l.q = 0;
  l.kv = l.q + tile;
  l.p = l.kv + 2u * tile; /* v3 / v7: P; v11, dr = 0: P of stage 0, then P of stage 1 (dr =
                             64: P of a stage goes in its rope block) */
  /* v11: [2 stages][m, top][64] float, the reference max and the largest logit after the
   * stage's tile (dr = 64: in the P block v11 leaves unused). */
  l.xm = dr ? l.p : l.p + 2u * W_KB_BYTES;
  l.red = dr ? l.p + W_KB_BYTES : l.xm + 1024u; /* [2][64] float */
  l.rowmax = l.red + 2u * 64u * 4u; /* [64] float: the max each row's sum is relative to */
  l.rowtop = l.rowmax + 64u * 4u; /* [64] float: each row's largest logit (max_logit) */
  l.mask = l.rowtop + 64u * 4u;  /* [4][64] uint8 (not with SMLA_FWD90_WS; v7: [2] flags
                                    at 0; v11: [2] uint64 used-entry masks at 64) */
  l.bar = l.mask + 4u * 64u;     /* mbarriers full[2], empty[2], (v11) pready[2] */
  l.total = l.bar + 6u * 8u;
  return l;
}

/* Byte offset of 16-byte chunk c (of 8 bf16 columns) of row r in a stack of 128-byte-
 * swizzled 8 KB blocks. */
__device__ __forceinline__ uint32_t w_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * W_KB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* The in-kernel split merge (a.cluster_merge; docs/design/cuda-sm90-forward.md, v6): the
 * splits of one (t, head group) are one cluster. Every block reads the row max m and sum
 * l of every split from the others' shared memory, scales its own O by its weight
 * exp(m_k - M) / (L + sink term) (the same M and L in every block: same order of
 * reads and sums), writes the columns it does not own to its partial rows, and after a
 * second cluster barrier sums the S values of the columns it owns: 8-column units
 * [64 k / S, 64 (k + 1) / S) for block k. The A/B against the combine kernel is a plan
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
    if (k >= S) break;
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
 * ost, the others' from their partial rows, written before the barrier) and stores them
 * as bf16: every load of a thread issued before the first add (up to 33 x 16 bytes). */
template <int S>
__device__ __forceinline__ void w_cluster_sum(const smla_cuda_fwd_args &a, int64_t t, int h0,
                                              int me, const float *ost, int tid) {
  constexpr int UMAX = (64 + S - 1) / S; /* 8-column units a block owns, at most */
  constexpr int IPT = (64 * 2 * UMAX + W_THREADS - 1) / W_THREADS; /* float4 per thread */
  const int u0 = 64 * me / S, u1 = 64 * (me + 1) / S;
  const int c0 = 8 * u0, nch = 2 * (u1 - u0), items = 64 * nch;
  float4 v[IPT][S];
#pragma unroll
  for (int u = 0; u < IPT; u++) {
    const int i = tid + W_THREADS * u;
    const int row = i / nch, col = c0 + 4 * (i - row * nch), head = h0 + row;
    const bool ok = i < items && head < a.num_heads;
#pragma unroll
    for (int k = 0; k < S; k++) {
      if (!ok)
        v[u][k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      else if (k == me)
        v[u][k] = *(const float4 *)(ost + row * W_OST_STRIDE + col);
      else
        v[u][k] = __ldcg((const float4 *)(a.part_out +
                                          (((int64_t)k * a.num_tokens + t) * a.num_heads +
                                           head) * 512 + col));
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

/* ---- v11: the relay (SMLA_FWD90_RELAY; docs/design/cuda-sm90-forward.md) ----------------
 * Tile j belongs to compute warpgroup j % 2, which computes its whole S (m64n64k16: Q read
 * once a tile), its softmax and P, and adds P V to its own 256 output columns from registers
 * (RS); the other warpgroup adds the same P, from the stage's P block, times V to its
 * columns (SS). Each warpgroup alternates between a tile of its own and one of the other's:
 *   OWN(j):   wait for the PV before and release its part of that stage | wait for tile j
 *             | S(j) | softmax from m(j-1): m(j) and P(j), P(j) to the P block, m(j) to xm,
 *             arrive on pready | O *= alpha where a row moved | O += P(j) V(j) (RS)
 *   CROSS(j): wait for the PV before and release its part of that stage | wait on pready
 *             | O and l rescaled to m(j) where a row moved | O += P(j) V(j) (SS)
 * The reference max (and the largest logit, for max_logit) runs one way from tile to tile,
 * so each warpgroup's softmax runs while the other's S and PVs use the tensor cores, and
 * every row has the same reference in both warpgroups after each tile. A stage is released
 * by 8 warp arrivals, each as soon as that warp's PV of the tile has completed, and is
 * refilled with tile j + 2: the gathers keep v7's one tile of look-ahead (v8's pairs held
 * both stages). The used-entry bits come from the gather warpgroup (a 64-bit word a stage,
 * published with the tile), so the compute warps load no slot. */
/* SMLA_FWD90_RELAY: 2 (the default since session 13) runs v11 at every tile count; 1 v11
 * from W_EARLY_MIN_TILES tiles a split and v3 below; 0 builds v3 / v7 alone (for A/B).
 * Measured against v3 / v7 (H100, bench/RESULTS.md session 13 run 5): N=128 T=1024
 * 1379-1416 -> 1207-1214 us cold, T=64 97.4 -> 83.9-84.4, T=16 41.8-42.1 -> 39.4,
 * N=64 T=1024 827 -> 790, T=1 equal. */
#ifndef SMLA_FWD90_RELAY
#define SMLA_FWD90_RELAY 2
#endif

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

/* O[:, 256 wg + ...] += P V of the stage at kvb, P from the [64][64] block at p_s. */
__device__ __forceinline__ void w11_pv_ss(float O[2][64], uint32_t p_s, uint32_t kvb, int wg) {
  w11_pin_o(O);
  wg_fence();
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint64_t da = wg_desc(p_s + k * 32, 16, 1024);
#pragma unroll
    for (int h = 0; h < 2; h++)
      wgmma_m64n128k16_ss_tb(O[h], da,
                             wg_desc(kvb + (uint32_t)((4 * wg + 2 * h) * W_KB_BYTES + k * 16 * 128),
                                     W_KB_BYTES, 1024));
  }
  wg_commit();
}

/* One compute warpgroup's tiles: O (its 256 columns), m_run, l_run (its own tiles' share of
 * the row sums) and m_top as the v3 loop leaves them; both warpgroups end at the same m_run
 * and m_top. */
/* A probe build (kind 11) sums compute thread 0's time over its tiles in pt[1..6]: 1 the
 * wait for the PV before, 2 the wait on full (own tile) or pready (the other's), 3 S issued
 * and waited for, 4 the logits, row max and exponentials, 5 P and m stored and published,
 * 6 l and O rescaled and the PV issued (own and the other's tiles). */
#if SMLA_PROBE
#define W11_PHASE(k_)                                                                      \
  do {                                                                                     \
    if (threadIdx.x == 0) {                                                                \
      const unsigned long long n_ = probe_now();                                           \
      pt[(k_)] += n_ - plast;                                                              \
      plast = n_;                                                                          \
    }                                                                                      \
  } while (0)
#define W11_PROBE_ARGS , unsigned long long *pt
#else
#define W11_PHASE(k_)
#define W11_PROBE_ARGS
#endif

template <int DR>
__device__ __forceinline__ void w11_loop(const smla_cuda_fwd_args &a, int ntiles, uint8_t *smem,
                                         uint32_t sbase, const w_layout &L, int wg,
                                         float O[2][64], float m_run[2], float l_run[2],
                                         float m_top[2] W11_PROBE_ARGS) {
#if SMLA_PROBE
  unsigned long long plast = probe_now();
#endif
  constexpr int KB = (512 + DR) / 64;
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  const float NEG_INF = -INFINITY;
  const int lane = threadIdx.x & 31, wq = (threadIdx.x >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3, r0 = 16 * wq + g;
  const uint32_t kv_s = sbase + L.kv;
  uint32_t q_s = sbase + L.q;
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u, pready_b = full_b + 32u;
  const volatile uint64_t *umask = (const volatile uint64_t *)(smem + L.mask + 64);
  float s[32];
  uint32_t pa[16];
#pragma unroll
  for (int i = 0; i < 16; i++) pa[i] = 0u;
#pragma unroll 1
  for (int j = 0; j < ntiles; j++) {
    const uint32_t st = (uint32_t)(j & 1), par = (uint32_t)((j >> 1) & 1);
    const uint32_t kvb = kv_s + st * TILE;
    const uint32_t pblk = DR ? kvb + 8u * W_KB_BYTES : sbase + L.p + st * W_KB_BYTES;
    float *xmj = (float *)(smem + L.xm) + st * 128u; /* [m, top][64] after tile j */
    /* The PV of tile j-1 (this warpgroup's part; RS: pa was read until here) is done. */
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
    w11_pin_o(O);
    if (j >= 1 && lane == 0) mbar_arrive(empty_b + 8u * (st ^ 1u));
    W11_PHASE(1);
    if ((j & 1) != wg) { /* CROSS(j) */
      mbar_wait(pready_b + 8u * st, par); /* P(j), m(j); tile j landed before it */
      W11_PHASE(2);
      fence_proxy_async(); /* the stage and the P block, seen here, visible to wgmma */
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
      w11_pv_ss(O, pblk, kvb, wg);
      W11_PHASE(6);
      continue;
    }
    /* OWN(j) */
    mbar_wait(full_b + 8u * st, par); /* tile j (and Q) */
    W11_PHASE(2);
    fence_proxy_async();
    const uint64_t um = umask[st] >> (2 * tig); /* bit 8 n + e: column 8 n + 2 tig + e used */
    asm volatile("mov.u32 %0, %0;" : "+r"(q_s)); /* descriptors not hoisted (spills) */
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) wg_pin(s[i]);
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < KB; kb++)
#pragma unroll
      for (int k4 = 0; k4 < 4; k4++)
        wgmma_m64n64k16_ss(s, wg_desc(q_s + kb * W_KB_BYTES + k4 * 32, 16, 1024),
                           wg_desc(kvb + kb * W_KB_BYTES + k4 * 32, 16, 1024));
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; i++) wg_pin(s[i]);
    W11_PHASE(3);

    float tmax[2] = {NEG_INF, NEG_INF};
    fwd_scale_logits<32>(s, a.logit_scale, a.softcap);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float v = s[4 * n + e];
        v = (um >> (8 * n + (e & 1))) & 1u ? v : NEG_INF;
        s[4 * n + e] = v;
        tmax[e >> 1] = fmax_nan(tmax[e >> 1], v); /* a NaN logit poisons the row */
      }
    float alpha[2], mls[2], lsum[2] = {0.0f, 0.0f};
    bool moved = false;
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
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const float p0 = ex2_approx(fmaf(s[4 * n + 2 * hh], FWD_LOG2E, -mls[hh]));
        const float p1 = ex2_approx(fmaf(s[4 * n + 2 * hh + 1], FWD_LOG2E, -mls[hh]));
        lsum[hh] += p0 + p1;
        pa[2 * n + hh] = pack_bf16x2(p0, p1);
      }
#if SMLA_PROBE
#pragma unroll
    for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
#endif
    W11_PHASE(4);
    uint8_t *pb = smem + (pblk - sbase);
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
    mbar_arrive(pready_b + 8u * st);
    W11_PHASE(5);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
    if (W_TAU == 0.0f || __any_sync(0xffffffffu, moved)) w11_scale_o(O, alpha);
    w11_pv_rs(O, pa, kvb, wg);
    W11_PHASE(6);
  }
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < 16; i++) asm volatile("" ::"r"(pa[i]) : "memory");
  w11_pin_o(O);
}

template <int DR, bool EARLY>
__global__ void __launch_bounds__(W_BLOCK, 1)
    fwd90_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int BN = FWD_BN;
  constexpr int DQK = 512 + DR;
#if !SMLA_FWD90_WS
  constexpr int QCH = DQK / 8;  /* 16-byte chunks per bf16 row */
#endif
  constexpr int KB = DQK / 64;  /* 8 KB column blocks per row stack */
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  constexpr bool RELAY = SMLA_FWD90_WS && (SMLA_FWD90_RELAY == 2 || (SMLA_FWD90_RELAY == 1 && EARLY));
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
#if !SMLA_FWD90_WS
  uint8_t *mask_s = smem + L.mask;
#endif

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid >> 7, wq = (tid >> 5) & 3; /* warpgroup; warp within it */
  const int g = lane >> 2, tig = lane & 3;
  const int r0 = 16 * wq + g; /* this thread's rows: r0 and r0 + 8 */
#if !SMLA_FWD90_WS
  const int lr = tid >> 2, lp = tid & 3; /* loader: row of the tile, quarter of the row */
#endif

  const fwd_block blk = fwd_block_of(a);
  const int64_t t = blk.t;
  const int grp = blk.grp, split = blk.split, ks = blk.ks, kend = blk.kend;
  const int ntiles = blk.ntiles, h0 = grp * W_HEADS;
  const int32_t *slot_row = blk.slot_row;
  const int32_t req = blk.req;

  unsigned bad = 0; /* entries >= S or < -1 this thread counted */
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv, p_s = sbase + L.p;
  PROBE_DECL;
  PROBE_STAMP(0);
#if SMLA_PROBE
  unsigned long long probe_last_ = 0;
#endif
#if SMLA_FWD90_WS
  /* Everything of the compute warps (O included) lives inside their branch: code after
   * the join runs at the gather warpgroup's register count. */
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u;
  if (tid == 0) {
    /* The gather threads (v11: and one more arrival a gather warp, its mask bits). */
    mbar_init(full_b, RELAY ? 132 : 128), mbar_init(full_b + 8u, RELAY ? 132 : 128);
    mbar_init(empty_b, 8), mbar_init(empty_b + 8u, 8);   /* the compute warps */
    if (RELAY) mbar_init(full_b + 32u, 128), mbar_init(full_b + 40u, 128); /* pready */
  }
  __syncthreads();
  if (tid >= W_THREADS) {
    /* The gather warpgroup. Warp pw gathers rows 16 pw..16 pw + 15 of each tile (and
     * of Q), per instruction 4 rows x 8 chunks (128 contiguous bytes of each row, one
     * swizzled 128-byte line of shared memory); lane l < 16 owns the slot of row
     * 16 pw + l (its mask byte, its bad count) and hands it out by shuffle. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (ntiles > 0) {
      const int pw = (tid - W_THREADS) >> 5, cl = lane & 7, rl = lane >> 3;
      const int my_row = 16 * pw + (lane & 15);
      /* Tile 0's slots first: their load's latency runs under the Q issue. */
      slot_pipe spipe = slot_pipe_start(a, req, slot_row, ks, kend, my_row);
#pragma unroll 1
      for (int rg = 0; rg < 4; rg++) {
        const int row = 16 * pw + 4 * rg + rl, head = h0 + row;
#pragma unroll 1
        for (int cb = 0; cb < KB; cb++)
          cp_async_16(q_s + w_chunk(row, 8 * cb + cl), q_chunk_src(a, t, head, 8 * cb + cl),
                      head < a.num_heads ? 16 : 0);
      }
#pragma unroll 1
      for (int j = 0; j < ntiles; j++) {
        const uint32_t st = (uint32_t)(j & 1);
        if (j >= 2) mbar_wait(empty_b + 8u * st, (uint32_t)(((j >> 1) - 1) & 1));
        const int32_t sc = slot_pipe_next(spipe, a, req, slot_row, ks, kend, j, my_row);
        unsigned nb = 0;
        const int u_mine = entry_used(a, sc, ks + j * BN + my_row, kend, 0, &nb);
        bad += lane < 16 ? nb : 0u; /* lanes 16..31 hold the same rows again */
        if (RELAY) { /* bits 16 pw..16 pw + 15 of the stage's used-entry word */
          const unsigned bits = __ballot_sync(0xffffffffu, u_mine) & 0xffffu;
          if (lane == 0) {
            *(volatile uint16_t *)(smem + L.mask + 64u + 8u * st + 2u * (uint32_t)pw) =
                (uint16_t)bits;
            mbar_arrive(full_b + 8u * st);
          }
        }
        const uint32_t base = kv_s + st * TILE;
#pragma unroll 1
        for (int rg = 0; rg < 4; rg++) {
          const int rr = 4 * rg + rl, row = 16 * pw + rr;
          const int32_t sl = __shfl_sync(0xffffffffu, sc, rr);
          const int u = __shfl_sync(0xffffffffu, u_mine, rr);
          const uint8_t *src = a.cache + (u ? (int64_t)sl * a.row_bytes : 0);
#pragma unroll
          for (int cb = 0; cb < KB; cb++)
            cp_async_16(base + w_chunk(row, 8 * cb + cl), src + 16 * (8 * cb + cl), u ? 16u : 0u);
        }
        mbar_arrive_cp_async_noinc(full_b + 8u * st); /* this thread's arrival, once its
                                                         copies have landed */
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
#define W_SYNC() named_bar_sync(1, W_THREADS)
#else
#define W_SYNC() __syncthreads()
  {
#endif
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
#if SMLA_FWD90_WS
    if (RELAY) {
      w11_loop<DR>(a, ntiles, smem, sbase, L, wg, O, m_run, l_run, m_top
#if SMLA_PROBE
                   , probe_t_
#endif
      );
    } else
#endif
    {
#if !SMLA_FWD90_WS
    /* Q rows (heads h0..h0+63), zero past N. Joins the first cp.async group. */
    for (int idx = tid; idx < W_HEADS * QCH; idx += W_THREADS) {
      const int row = idx / QCH, c = idx - row * QCH, head = h0 + row;
      cp_async_16(q_s + w_chunk(row, c), q_chunk_src(a, t, head, c), head < a.num_heads ? 16 : 0);
    }

    slot_pipe spipe = slot_pipe_start(a, req, slot_row, ks, kend, lr); /* two tiles ahead */
    /* This thread's chunks of its row: c = lp + 4 i, i.e. block i / 2, chunk lp + 4 (i & 1). */
    const uint32_t row_off = (uint32_t)(lr * 128);
#define W_ISSUE_TILE(j, stage_base)                                                         \
  do {                                                                                      \
    const int32_t s_ = slot_pipe_next(spipe, a, req, slot_row, ks, kend, (j), lr);         \
    const bool used_ = entry_used(a, s_, ks + (j) * BN + lr, kend, lp, &bad);               \
    if (lp == 0) mask_s[((j) & 3) * BN + lr] = used_;                                       \
    const uint8_t *src_ = a.cache + (used_ ? (int64_t)s_ * a.row_bytes : 0);                \
    const uint32_t n_ = used_ ? 16u : 0u;                                                   \
    _Pragma("unroll") for (int i_ = 0; i_ < QCH / 4; i_++) {                                \
      const int c_ = lp + 4 * (i_ & 1);                                                     \
      cp_async_16((stage_base) + (uint32_t)((i_ >> 1) * W_KB_BYTES) + row_off +             \
                      (uint32_t)((c_ ^ (lr & 7)) << 4),                                     \
                  src_ + 16 * (lp + 4 * i_), n_);                                           \
    }                                                                                       \
  } while (0)

    W_ISSUE_TILE(0, kv_s);
    cp_async_commit();
#endif

#if SMLA_FWD90_WS
    /* The slots of this thread's 8 entries of the tile (its S columns), loaded a tile
     * ahead: each compute thread masks its own logits, so no flag passes from the gather
     * warpgroup through shared memory (it counts the bad entries). */
#define W_COL(q_) (wg * 32 + ((q_) >> 1) * 8 + 2 * tig + ((q_) & 1))
#if SMLA_FWD90_BALLOT_MASK
    /* The 8 lanes g = 0..7 of a warp with the same tig hold the same 8 columns: lane
     * (g, tig) loads (and, fused, converts) only column W_COL(g), and one ballot gives
     * every lane its 8 bits (bit 4 q + tig of the ballot is column W_COL(q) of lanes tig). */
    int32_t cslot1, craw1; /* tile jj's slot, tile jj + 1's raw entry of column W_COL(g) */
#define W_LOAD_SLOTS(jj)                                                                   \
  do {                                                                                     \
    cslot1 = slot_of(a, req, craw1);                                                       \
    craw1 = raw_at(slot_row, ks, kend, (jj) + 1, W_COL(g));                                \
  } while (0)
#define W_UMASK(um_)                                                                       \
  do {                                                                                     \
    const unsigned b_ =                                                                    \
        __ballot_sync(0xffffffffu, cslot1 >= 0 && (int64_t)cslot1 < a.num_slots);          \
    um_ = 0;                                                                               \
    _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) um_ |= ((b_ >> (4 * q_ + tig)) & 1u) << q_; \
  } while (0)
    craw1 = raw_at(slot_row, ks, kend, 0, W_COL(g));
#else
    int32_t cslot[8], craw[8]; /* tile jj's slots, tile jj + 1's raw entries (slot_pipe) */
#define W_LOAD_SLOTS(jj)                                                                   \
  _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) {                                       \
    cslot[q_] = slot_of(a, req, craw[q_]);                                                 \
    craw[q_] = raw_at(slot_row, ks, kend, (jj) + 1, W_COL(q_));                            \
  }
#define W_UMASK(um_)                                                                       \
  do {                                                                                     \
    um_ = 0;                                                                               \
    _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) um_ |=                                \
        (cslot[q_] >= 0 && (int64_t)cslot[q_] < a.num_slots ? 1u : 0u) << q_;              \
  } while (0)
    _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) craw[q_] =
        raw_at(slot_row, ks, kend, 0, W_COL(q_));
#endif
    W_LOAD_SLOTS(0);
#endif
    /* S = Q K^T of the tile in stage kvb_: all 64 heads x this warpgroup's 32 entries. */
#define W_ISSUE_S(kvb_)                                                                    \
  do {                                                                                     \
    uint32_t qs_ = q_s;                                                                    \
    if (W_EARLY) /* not hoisted out of the loop: 36 live descriptors would spill */          \
      asm volatile("mov.u32 %0, %1;" : "=r"(qs_) : "r"(q_s));                              \
    _Pragma("unroll") for (int i_ = 0; i_ < 16; i_++) s[i_] = 0.0f;                        \
    if (W_EARLY) /* the zeros held before the fence (else ptxas must repair the order) */  \
      _Pragma("unroll") for (int i_ = 0; i_ < 16; i_++) wg_pin(s[i_]);                     \
    wg_fence();                                                                            \
    _Pragma("unroll") for (int kb_ = 0; kb_ < KB; kb_++)                                   \
    _Pragma("unroll") for (int k4_ = 0; k4_ < 4; k4_++)                                    \
      wgmma_m64n32k16_ss(s, wg_desc(qs_ + kb_ * W_KB_BYTES + k4_ * 32, 16, 1024),          \
                         wg_desc((kvb_) + kb_ * W_KB_BYTES + wg * 32 * 128 + k4_ * 32, 16,  \
                                 1024));                                                   \
    wg_commit();                                                                           \
  } while (0)
    float s[16];
#if SMLA_FWD90_WS
    /* EARLY: the used-entry bits of the next S, made from cslot before that S is issued (its 8
     * slots are not live across the wgmma then). */
    unsigned um_next = 0;
#define W_MASK_NEXT() W_UMASK(um_next)
    if (EARLY) {
      W_MASK_NEXT();
      mbar_wait(full_b, 0u); /* tile 0 (and Q) */
      fence_proxy_async();
      PROBE_STAMP(1);
      W_ISSUE_S(kv_s);
      wg_wait<0>(); /* no wgmma in flight where the loop begins or loops */
    }
#endif
    for (int j = 0; j < ntiles; j++) {
      const uint32_t kvb = kv_s + (uint32_t)(j & 1) * TILE;
#if SMLA_FWD90_WS
      if (!EARLY) { /* (EARLY: S(j) has completed, at the end of the last iteration) */
        mbar_wait(full_b + 8u * (uint32_t)(j & 1), (uint32_t)((j >> 1) & 1)); /* tile j, Q */
        fence_proxy_async(); /* the gather warp's copies, seen here, visible to wgmma */
      }
#else
      cp_async_wait<0>(); /* tile j (and Q) landed for this thread: the only group out */
      fence_proxy_async(); /* ...and is visible to wgmma's reads */
      /* This barrier also ends tile j-1: every thread waited for its PV(j-1) before it, so
       * from here tile j+1 may be gathered into the stage PV(j-1) read, and P and red
       * rewritten. */
      __syncthreads();
#endif
#if SMLA_PROBE
      if (j == 0) { /* (EARLY: t1 before S(0), above) */
        if (!W_EARLY) PROBE_STAMP(1);
        if (tid == 0) probe_last_ = probe_now();
      } else {
        W_PHASE(3);
      }
#endif

      if (!W_EARLY) W_ISSUE_S(kvb);
#if !SMLA_FWD90_WS
      /* The gathers of tile j+1 are issued while the tensor cores work on S(j). */
      if (j + 1 < ntiles) W_ISSUE_TILE(j + 1, kv_s + (uint32_t)((j + 1) & 1) * TILE);
      cp_async_commit();
#endif
      wg_wait<0>();
#pragma unroll
      for (int i = 0; i < 16; i++) wg_pin(s[i]);

      /* ---- online softmax: scale, softcap, mask; row max across both warpgroups ---- */
#if SMLA_FWD90_WS
      /* Bit 2 nb + (e & 1): this thread's entry of column block nb is used. */
      unsigned um = um_next; /* EARLY: made from cslot before S(j) was issued */
      if (!EARLY) W_UMASK(um);
      if (j + 1 < ntiles) W_LOAD_SLOTS(j + 1);
#define W_USED(nb, e) ((um >> (2 * (nb) + ((e) & 1))) & 1u)
#else
      const uint8_t *mk = mask_s + (j & 3) * BN;
#define W_USED(nb, e) mk[wg * 32 + (nb) * 8 + 2 * tig + ((e) & 1)] /* the S column */
#endif
      float tmax[2] = {NEG_INF, NEG_INF};
      fwd_scale_logits<16>(s, a.logit_scale, a.softcap);
#pragma unroll
      for (int nb = 0; nb < 4; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float v = s[4 * nb + e];
          v = W_USED(nb, e) ? v : NEG_INF;
          s[4 * nb + e] = v;
          tmax[e >> 1] = fmax_nan(tmax[e >> 1], v); /* a NaN logit poisons the row */
        }
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 1));
        tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 2));
        if (tig == 0) red[wg * 64 + r0 + 8 * hh] = tmax[hh];
      }
      W_SYNC();
      W_PHASE(0);
      float mls[2], alpha[2], lsum[2] = {0.0f, 0.0f};
      bool moved = false; /* (lazy rescale) a row of this thread changed its reference max */
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = r0 + 8 * hh;
        const float mx = fmax_nan(red[row], red[64 + row]);
        m_top[hh] = fmax_nan(m_top[hh], mx);
        float m_new = fmax_nan(m_run[hh], mx); /* NaN: out, lse, max NaN */
        /* Lazy: the reference stays while the max grew by at most W_TAU (so P <= 2^8);
         * a NaN, the first used entry (-inf - -inf or x - -inf) fail the test and move it. */
        if (W_TAU > 0.0f && m_new - m_run[hh] <= W_TAU) m_new = m_run[hh];
        else moved = true;
        const float m_use = m_new == NEG_INF ? 0.0f : m_new; /* nothing used yet */
        alpha[hh] = ex2_approx((m_run[hh] - m_use) * FWD_LOG2E);
        m_run[hh] = m_new;
        mls[hh] = m_use * FWD_LOG2E;
      }
#pragma unroll
      for (int nb = 0; nb < 4; nb++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const float p0 = ex2_approx(fmaf(s[4 * nb + 2 * hh], FWD_LOG2E, -mls[hh]));
          const float p1 = ex2_approx(fmaf(s[4 * nb + 2 * hh + 1], FWD_LOG2E, -mls[hh]));
          lsum[hh] += p0 + p1;
          const int row = r0 + 8 * hh, col = wg * 32 + nb * 8 + 2 * tig;
          *(uint32_t *)(smem + L.p + w_chunk(row, col >> 3) + (col & 7) * 2) =
              pack_bf16x2(p0, p1);
        }
#pragma unroll
      for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + lsum[hh];
      if (W_TAU == 0.0f || __any_sync(0xffffffffu, moved))
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int i = 0; i < 64; i++) O[h][i] *= alpha[(i >> 1) & 1];
      fence_proxy_async(); /* P visible to wgmma */
      W_SYNC();
      W_PHASE(1);

      /* ---- O += P V: all 64 heads x this warpgroup's 256 output columns ---- */
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
      wg_fence();
#pragma unroll
      for (int k = 0; k < BN / 16; k++) {
        const uint64_t da = wg_desc(p_s + k * 32, 16, 1024);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const uint64_t db =
              wg_desc(kvb + (uint32_t)((4 * wg + 2 * h) * W_KB_BYTES + k * 16 * 128),
                      W_KB_BYTES, 1024);
          wgmma_m64n128k16_ss_tb(O[h], da, db);
        }
      }
      wg_commit();
#if SMLA_FWD90_WS
      if (EARLY) {
      /* Tile j+1 landed: S(j+1) queued behind PV(j), then PV(j) waited for. Not yet: PV(j)
       * waited for and stage j % 2 released first (the gathers of tile j+2 must not wait
       * for tile j+1), then S(j+1). One thread of the warpgroup decides for all four
       * warps (wgmma is warpgroup-wide), through a flag and the warpgroup's own barrier. */
#define W_PV_DONE()                                                                        \
  do {                                                                                     \
    _Pragma("unroll") for (int h_ = 0; h_ < 2; h_++)                                       \
    _Pragma("unroll") for (int i_ = 0; i_ < 64; i_++) wg_pin(O[h_][i_]);                   \
    if (lane == 0) mbar_arrive(empty_b + 8u * (uint32_t)(j & 1)); /* the stage is free */  \
    W_PHASE(2);                                                                            \
  } while (0)
      if (j + 1 < ntiles) {
        const uint32_t full1 = full_b + 8u * (uint32_t)((j + 1) & 1);
        const uint32_t par1 = (uint32_t)(((j + 1) >> 1) & 1);
        volatile uint32_t *ready_s = (volatile uint32_t *)(smem + L.mask) + wg;
        W_MASK_NEXT();
        if ((tid & 127) == 0)
          *ready_s = SMLA_FWD90_EARLY_FORCE >= 0 ? (uint32_t)SMLA_FWD90_EARLY_FORCE
                                                 : mbar_test(full1, par1);
        if (wg) named_bar_sync(3, 128); else named_bar_sync(2, 128); /* ids known to ptxas */
        if (*ready_s) {
          mbar_wait(full1, par1); /* complete: returns at once, with acquire */
          fence_proxy_async();
          W_ISSUE_S(kv_s + (uint32_t)((j + 1) & 1) * TILE);
          wg_wait<1>();
          W_PV_DONE();
        } else {
          wg_wait<0>();
          W_PV_DONE();
          mbar_wait(full1, par1);
          fence_proxy_async();
          W_ISSUE_S(kv_s + (uint32_t)((j + 1) & 1) * TILE);
        }
      } else {
        wg_wait<0>();
        W_PV_DONE();
      }
      wg_wait<0>(); /* S(j+1) */
#undef W_PV_DONE
      } else {
        wg_wait<0>();
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
        if (lane == 0) mbar_arrive(empty_b + 8u * (uint32_t)(j & 1)); /* the stage is free */
        W_PHASE(2);
      }
#else
      wg_wait<0>();
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
#endif
    }
#undef W_ISSUE_S
#if SMLA_FWD90_WS
#undef W_MASK_NEXT
#undef W_UMASK
#endif
    } /* !RELAY */
    if (!RELAY) {
      W_PHASE(3);
      PROBE_STAMP(2);
    }
    /* The combine kernel (a programmatic dependent, smla_cuda_merge_args.pdl) may be
     * scheduled from here on; it waits for this grid's completion before it reads. */
    griddep_launch_dependents();
#if SMLA_FWD90_WS
#undef W_LOAD_SLOTS
#undef W_COL
#else
#undef W_ISSUE_TILE
    cp_async_wait<0>();
#endif
#undef W_USED

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

  /* ---- epilogue: final (num_splits == 1) or partial state ---- */
  /* O goes through shared memory (the KV stages are free: every tile was consumed and
   * both warpgroups passed the barrier above), then out in whole rows: each warp stores
   * 512 contiguous bytes per instruction instead of 8 rows x 32 B. Rows of 520 floats:
   * the 8 rows of a warp's float2 writes fall on different banks. */
  static_assert(W_HEADS * W_OST_STRIDE * 4 <= 2 * TILE + W_KB_BYTES, "staged O: KV + P");
  float *ost = (float *)(smem + L.kv);
  void **dst_s = (void **)(smem + L.q); /* per row: its output row, or NULL */
  const bool cmerge = a.cluster_merge != 0;
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
      /* The columns other blocks own, to this split's partial rows (every row of a head
       * < N, zeros included: the owners read them all); then the cluster barrier that
       * also ends every read of this block's red / rowmax_s; then this block's columns. */
      const int S = a.num_splits;
      const int c0 = 8 * (64 * split / S), c1 = 8 * (64 * (split + 1) / S);
#pragma unroll 1
      for (int row = warp; row < W_HEADS; row += W_THREADS / 32) {
        const int head = h0 + row;
        if (head >= a.num_heads) continue;
        float *dst = a.part_out + (((int64_t)split * a.num_tokens + t) * a.num_heads + head) * 512;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int col = 4 * (lane + 32 * i);
          if (col >= c0 && col < c1) continue;
          *(float4 *)(dst + col) = *(const float4 *)(ost + row * W_OST_STRIDE + col);
        }
      }
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
    } else if (a.num_splits == 1) {
#pragma unroll 1
      for (int row = warp; row < W_HEADS; row += W_THREADS / 32) {
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
      for (int row = warp; row < W_HEADS; row += W_THREADS / 32) {
        float *dst = (float *)dst_s[row];
        if (!dst) continue; /* l == 0: a -inf partial is never read */
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int col = 4 * (lane + 32 * i);
          *(float4 *)(dst + col) = *(const float4 *)(ost + row * W_OST_STRIDE + col);
        }
      }
    }
  }
  PROBE_STAMP(7);
  PROBE_PUT(RELAY ? 11 : 10, ntiles);
  } /* compute warps */
#undef W_SYNC

  fwd_count_bad(a, grp, bad);
}

PROBE_DEFINE_DUMP(smla_probe_dump_fwd90)

extern "C" uint32_t smla_cuda_fwd90_smem_bytes(int dr) {
  return w_layout_of(dr).total + 1024u; /* + slack to align the base to 1024 */
}

/* The kernel for a Dr and whether it pipelines S behind PV (v7, W_EARLY_MIN_TILES). */
static const void *w_kernel(int dr, bool early) {
  if (dr == 64)
    return early ? (const void *)fwd90_kernel<64, true> : (const void *)fwd90_kernel<64, false>;
  return early ? (const void *)fwd90_kernel<0, true> : (const void *)fwd90_kernel<0, false>;
}

extern "C" cudaError_t smla_cuda_fwd90_prepare(int dr, int max_smem) {
  cudaError_t e = cudaSuccess;
  for (int early = 0; early < 2 && e == cudaSuccess; early++)
    e = cudaFuncSetAttribute(w_kernel(dr, early != 0),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
  return e;
}

/* A launch configuration of the forward: clusters of `cluster` blocks (1: none). */
static cudaLaunchConfig_t w_config(unsigned blocks, uint32_t smem, int cluster, void *stream,
                                   cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(blocks, 1, 1);
  c.blockDim = dim3(W_BLOCK, 1, 1);
  c.dynamicSmemBytes = smem;
  c.stream = (cudaStream_t)stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)cluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  c.attrs = attr;
  c.numAttrs = cluster > 1 ? 1 : 0; /* no cluster attribute on a plain launch */
  return c;
}

extern "C" int smla_cuda_fwd90_early_min_tiles(void) {
  return SMLA_FWD90_WS && SMLA_FWD90_RELAY == 0 ? W_EARLY_MIN_TILES : 0;
}

extern "C" int smla_cuda_fwd90_relay_min_tiles(void) {
  if (!SMLA_FWD90_WS) return 0;
  return SMLA_FWD90_RELAY == 2 ? 1 : SMLA_FWD90_RELAY == 1 ? W_EARLY_MIN_TILES : 0;
}

extern "C" cudaError_t smla_cuda_fwd90_cluster_capacity(int dr, int splits, int *clusters) {
  *clusters = 0;
  if (splits < 2 || splits > 8) return cudaSuccess;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t c = w_config((unsigned)splits, smla_cuda_fwd90_smem_bytes(dr), splits,
                                  NULL, &attr);
  return cudaOccupancyMaxActiveClusters(clusters, w_kernel(dr, false), &c); /* both alike */
}

extern "C" cudaError_t smla_cuda_fwd90_launch(int dr, const smla_cuda_fwd_args *a,
                                              void *stream) {
  const int64_t blocks = a->num_tokens * a->groups * a->num_splits;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  if (a->cluster_merge && (a->num_splits < 2 || a->num_splits > 8 || a->cluster_merge != a->num_splits))
    return cudaErrorInvalidValue;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t c = w_config((unsigned)blocks, smla_cuda_fwd90_smem_bytes(dr),
                                  a->cluster_merge ? a->num_splits : 1, stream, &attr);
  void *args[1] = {(void *)a};
  const bool early = SMLA_FWD90_WS && (a->split_len + 63) / 64 >= W_EARLY_MIN_TILES;
  /* (the plan's describe says so: smla_cuda_fwd90_early_min_tiles) */
  return cudaLaunchKernelExC(&c, w_kernel(dr, early), args);
}
