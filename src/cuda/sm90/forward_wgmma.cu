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
 */
#include "../forward_common.cuh"
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
/* v4, ping-pong warpgroups over 32-entry tiles (fwd90pp_kernel, below): built instead of
 * v3 / v2 with NVCC_EXTRA=-DSMLA_FWD90_PP=1. */
#ifndef SMLA_FWD90_PP
#define SMLA_FWD90_PP 0
#endif

#define W_THREADS 256 /* the two compute warpgroups */

#define W_BLOCK (W_THREADS + (SMLA_FWD90_WS ? 128 : 0))
#define W_HEADS 64
#define W_KB_BYTES 8192 /* one [64 rows][128 B] block of 64 bf16 columns */

struct w_layout {
  uint32_t q, kv, p, red, rowmax, mask, bar, total;
};

__host__ __device__ __forceinline__ w_layout w_layout_of(int dr) {
  w_layout l;
  const uint32_t tile = (uint32_t)((512 + dr) / 64) * W_KB_BYTES;
  l.q = 0;
  l.kv = l.q + tile;
  l.p = l.kv + 2u * tile;
  l.red = l.p + W_KB_BYTES;      /* [2][64] float */
  l.rowmax = l.red + 2u * 64u * 4u; /* [64] float */
  l.mask = l.rowmax + 64u * 4u;  /* [4][64] uint8 (not with SMLA_FWD90_WS) */
  l.bar = l.mask + 4u * 64u;     /* mbarriers full[2], empty[2] (SMLA_FWD90_WS) */
  l.total = l.bar + 4u * 8u;
  return l;
}

/* Byte offset of 16-byte chunk c (of 8 bf16 columns) of row r in a stack of 128-byte-
 * swizzled 8 KB blocks. */
__device__ __forceinline__ uint32_t w_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * W_KB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

template <int DR>
__global__ void __launch_bounds__(W_BLOCK, 1)
    fwd90_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int BN = FWD_BN;
  constexpr int DQK = 512 + DR;
#if !SMLA_FWD90_WS
  constexpr int QCH = DQK / 8;  /* 16-byte chunks per bf16 row */
#endif
  constexpr int KB = DQK / 64;  /* 8 KB column blocks per row stack */
  constexpr uint32_t TILE = KB * W_KB_BYTES;
  const float NEG_INF = -INFINITY;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  /* 128-byte swizzle is a function of address bits 4-9: the stacks must be 1024-aligned. */
  const uint32_t raw_base = smem_addr(smem_raw);
  const uint32_t sbase = (raw_base + 1023u) & ~1023u;
  uint8_t *smem = smem_raw + (sbase - raw_base);
  const w_layout L = w_layout_of(DR);
  float *red = (float *)(smem + L.red);
  float *rowmax_s = (float *)(smem + L.rowmax);
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

  unsigned bad = 0; /* entries >= S or < -1 this thread counted */
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv, p_s = sbase + L.p;
#if SMLA_FWD90_WS
  /* Everything of the compute warps (O included) lives inside their branch: code after
   * the join runs at the gather warpgroup's register count. */
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 16u;
  if (tid == 0) {
    mbar_init(full_b, 128), mbar_init(full_b + 8u, 128); /* the gather threads */
    mbar_init(empty_b, 8), mbar_init(empty_b + 8u, 8);   /* the compute warps */
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
#pragma unroll 1
      for (int rg = 0; rg < 4; rg++) {
        const int row = 16 * pw + 4 * rg + rl, head = h0 + row;
#pragma unroll 1
        for (int cb = 0; cb < KB; cb++)
          cp_async_16(q_s + w_chunk(row, 8 * cb + cl), q_chunk_src(a, t, head, 8 * cb + cl),
                      head < a.num_heads ? 16 : 0);
      }
      int32_t sn = slot_at(slot_row, ks, kend, 0, my_row);
#pragma unroll 1
      for (int j = 0; j < ntiles; j++) {
        const uint32_t st = (uint32_t)(j & 1);
        if (j >= 2) mbar_wait(empty_b + 8u * st, (uint32_t)(((j >> 1) - 1) & 1));
        const int32_t sc = sn;
        if (j + 1 < ntiles) sn = slot_at(slot_row, ks, kend, j + 1, my_row);
        unsigned nb = 0;
        const int u_mine = entry_used(a, sc, ks + j * BN + my_row, kend, 0, &nb);
        bad += lane < 16 ? nb : 0u; /* lanes 16..31 hold the same rows again */
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
  float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};

  if (ntiles > 0) {
#if !SMLA_FWD90_WS
    /* Q rows (heads h0..h0+63), zero past N. Joins the first cp.async group. */
    for (int idx = tid; idx < W_HEADS * QCH; idx += W_THREADS) {
      const int row = idx / QCH, c = idx - row * QCH, head = h0 + row;
      cp_async_16(q_s + w_chunk(row, c), q_chunk_src(a, t, head, c), head < a.num_heads ? 16 : 0);
    }

    int32_t slot_pf = slot_at(slot_row, ks, kend, 0, lr); /* prefetched one tile ahead */
    /* This thread's chunks of its row: c = lp + 4 i, i.e. block i / 2, chunk lp + 4 (i & 1). */
    const uint32_t row_off = (uint32_t)(lr * 128);
#define W_ISSUE_TILE(j, stage_base)                                                         \
  do {                                                                                      \
    const int32_t s_ = slot_pf;                                                             \
    slot_pf = slot_at(slot_row, ks, kend, (j) + 1, lr);                                     \
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
    int32_t cslot[8];
#define W_LOAD_SLOTS(jj)                                                                   \
  _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) cslot[q_] =                             \
      slot_at(slot_row, ks, kend, (jj), wg * 32 + (q_ >> 1) * 8 + 2 * tig + (q_ & 1))
    W_LOAD_SLOTS(0);
#endif
    for (int j = 0; j < ntiles; j++) {
      const uint32_t kvb = kv_s + (uint32_t)(j & 1) * TILE;
#if SMLA_FWD90_WS
      mbar_wait(full_b + 8u * (uint32_t)(j & 1), (uint32_t)((j >> 1) & 1)); /* tile j (and Q) */
      fence_proxy_async(); /* the gather warp's copies, seen here, visible to wgmma */
#else
      cp_async_wait<0>(); /* tile j (and Q) landed for this thread: the only group out */
      fence_proxy_async(); /* ...and is visible to wgmma's reads */
      /* This barrier also ends tile j-1: every thread waited for its PV(j-1) before it, so
       * from here tile j+1 may be gathered into the stage PV(j-1) read, and P and red
       * rewritten. */
      __syncthreads();
#endif

      /* ---- S = Q K^T: all 64 heads x this warpgroup's 32 entries ---- */
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; i++) s[i] = 0.0f;
      wg_fence();
#pragma unroll
      for (int kb = 0; kb < KB; kb++)
#pragma unroll
        for (int k4 = 0; k4 < 4; k4++) {
          const uint64_t da = wg_desc(q_s + kb * W_KB_BYTES + k4 * 32, 16, 1024);
          const uint64_t db =
              wg_desc(kvb + kb * W_KB_BYTES + wg * 32 * 128 + k4 * 32, 16, 1024);
          wgmma_m64n32k16_ss(s, da, db);
        }
      wg_commit();
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
      unsigned um = 0;
#pragma unroll
      for (int q = 0; q < 8; q++)
        um |= (cslot[q] >= 0 && (int64_t)cslot[q] < a.num_slots ? 1u : 0u) << q;
      if (j + 1 < ntiles) W_LOAD_SLOTS(j + 1);
#define W_USED(nb, e) ((um >> (2 * (nb) + ((e) & 1))) & 1u)
#else
      const uint8_t *mk = mask_s + (j & 3) * BN;
#define W_USED(nb, e) mk[wg * 32 + (nb) * 8 + 2 * tig + ((e) & 1)] /* the S column */
#endif
      float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int nb = 0; nb < 4; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float v = s[4 * nb + e] * a.logit_scale;
          if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
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
      float mls[2], alpha[2], lsum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = r0 + 8 * hh;
        const float mx = fmax_nan(red[row], red[64 + row]);
        const float m_new = fmax_nan(m_run[hh], mx); /* NaN: out, lse, max NaN */
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
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) O[h][i] *= alpha[(i >> 1) & 1];
      fence_proxy_async(); /* P visible to wgmma */
      W_SYNC();

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
      wg_wait<0>();
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
#if SMLA_FWD90_WS
      if (lane == 0) mbar_arrive(empty_b + 8u * (uint32_t)(j & 1)); /* the stage is free */
#endif
    }
#if SMLA_FWD90_WS
#undef W_LOAD_SLOTS
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
        if (wg == 0) rowmax_s[row] = m_run[hh];
      }
    }
  } else {
    /* No used entry can exist in this split: every row gets l = 0, m = -inf. */
    for (int i = tid; i < 128; i += W_THREADS) red[i] = 0.0f;
    for (int i = tid; i < 64; i += W_THREADS) rowmax_s[i] = NEG_INF;
  }
  W_SYNC();

  /* ---- epilogue: final (num_splits == 1) or partial state ---- */
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = r0 + 8 * hh, head = h0 + row;
    if (head >= a.num_heads) continue;
    const fwd_row_out r = fwd_row_epilogue(a, t, split, head, red[row] + red[64 + row],
                                           rowmax_s[row], wg == 0 && tig == 0);
    const int col0 = 256 * wg + 2 * tig;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int nb = 0; nb < 16; nb++) {
        const int col = col0 + 128 * h + 8 * nb;
        const float v0 = O[h][4 * nb + 2 * hh] * r.f, v1 = O[h][4 * nb + 2 * hh + 1] * r.f;
        if (r.out) *(uint32_t *)(r.out + col) = pack_bf16x2(v0, v1);
        if (r.part) *(float2 *)(r.part + col) = make_float2(v0, v1);
      }
  }
  } /* compute warps */
#undef W_SYNC

  fwd_count_bad(a, grp, bad);
}

/* ---- v4: ping-pong warpgroups over 32-entry tiles (SMLA_FWD90_PP=1) ------------------------
 * The same gather warpgroup as v3, but tiles of 32 entries in four stages (the same 144 KB
 * as v3's two stages of 64), and the two compute warpgroups take turns: warpgroup w owns
 * the tiles j with j % 2 == w. For its own tile it computes the whole S (64 heads x 32
 * entries, m64n32k16: Q is read once per tile instead of twice), the softmax against
 * m(j-1), the running max the other warpgroup published with tile j-1, and publishes P(j)
 * (a 32-column half of one 8 KB block), alpha(j) and m(j) through shared memory and named
 * barrier 2 + j % 2 (bar.arrive by the owner, bar.sync by the other). Both warpgroups then
 * add P(j) V(j) into their own 256 output columns, as in v3. So the softmax of one
 * warpgroup runs under the other's S and both PVs, and no barrier joins the two
 * warpgroups inside the loop: only the running max passes from tile to tile.
 * Per own tile j of warpgroup w (pend: the tile of its PV still in flight):
 *   a. wait full(j); issue S(j)
 *   b. wait P(j-1) published; wait PV(pend) (free its stage); O, l *= alpha(j-1); issue PV(j-1)
 *   c. wait S(j); softmax(j); P(j), alpha(j), m(j) -> shared memory; bar.arrive
 *   d. wait PV(j-1) (free its stage); O, l *= alpha(j); l += rowsum P(j); issue PV(j)
 * P(j) and its alpha/m slot overwrite those of tile j-2: the owner waits (named barrier
 * 4 + j % 2) for the other warpgroup's PV(j-2), which that one arrives at in its step d;
 * its own PV(j-2) it waited for in step b. Each warpgroup's l sums its own tiles' rows;
 * the epilogue adds the two. */
#define P_TB 32         /* entries per tile */
#define P_STAGES 4      /* KV stages */
#define P_KB_BYTES 4096 /* one [32 rows][128 B] block of 64 bf16 columns */

struct p_layout {
  uint32_t q, kv, p, amx, red, bar, total;
};

__host__ __device__ __forceinline__ p_layout p_layout_of(int dr) {
  p_layout l;
  const uint32_t kb = (uint32_t)((512 + dr) / 64);
  l.q = 0;                                   /* [kb][64 rows][128 B] */
  l.kv = l.q + kb * W_KB_BYTES;              /* [P_STAGES][kb][32 rows][128 B] */
  l.p = l.kv + P_STAGES * kb * P_KB_BYTES;   /* [64 rows][2 halves of 32 bf16] */
  l.amx = l.p + W_KB_BYTES;                  /* [2 slots][alpha[64], m[64]] float */
  l.red = l.amx + 2u * 128u * 4u;            /* [2][64] float: row sums */
  l.bar = l.red + 2u * 64u * 4u;             /* full[P_STAGES], empty[P_STAGES] */
  l.total = l.bar + 2u * P_STAGES * 8u;
  return l;
}

/* Byte offset of 16-byte chunk c of row r in a stack of 32-row 128-byte-swizzled blocks. */
__device__ __forceinline__ uint32_t p_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * P_KB_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Slot of entry ks + tile * P_TB + r, or -1 past the end. */
__device__ __forceinline__ int32_t p_slot(const int32_t *slot_row, int ks, int kend, int tile,
                                          int r) {
  const int k = ks + tile * P_TB + r;
  return k < kend ? __ldg(slot_row + k) : -1;
}

/* Softmax of own tile j (v4): scale, softcap and mask this thread's 16 logits (um: its
 * 8 columns' used bits), the row max against m(j-1) (the other warpgroup's, in slot
 * (j-1) % 2 of amx), then, once tile j-2's half of P and slot are free, P(j) (bf16, into
 * half j % 2 of the P block), alpha(j) and m(j) published: fence and bar.arrive. Returns
 * alpha(j) and the row sums of this thread's probabilities. */
__device__ __forceinline__ void p_softmax_publish(const smla_cuda_fwd_args &a, float (&s)[16],
                                                  unsigned um, int j, int r0, int tig,
                                                  float *amx, uint8_t *p_smem, float alpha[2],
                                                  float lsum[2]) {
  const float NEG_INF = -INFINITY;
  float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
  for (int nb = 0; nb < 4; nb++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = s[4 * nb + e] * a.logit_scale;
      if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
      v = ((um >> (2 * nb + (e & 1))) & 1u) ? v : NEG_INF;
      s[4 * nb + e] = v;
      tmax[e >> 1] = fmax_nan(tmax[e >> 1], v); /* a NaN logit poisons the row */
    }
  float mls[2], m_pub[2];
  lsum[0] = lsum[1] = 0.0f;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 1));
    tmax[hh] = fmax_nan(tmax[hh], __shfl_xor_sync(0xffffffffu, tmax[hh], 2));
    const float m_prev = j >= 1 ? amx[((j - 1) & 1) * 128 + 64 + r0 + 8 * hh] : NEG_INF;
    const float m_new = fmax_nan(m_prev, tmax[hh]); /* NaN: out, lse, max NaN */
    const float m_use = m_new == NEG_INF ? 0.0f : m_new; /* nothing used yet */
    alpha[hh] = ex2_approx((m_prev - m_use) * FWD_LOG2E);
    mls[hh] = m_use * FWD_LOG2E;
    m_pub[hh] = m_new;
  }
  /* P(j-2)'s half and slot are free once the other warpgroup's PV(j-2) is done. */
  if (j >= 2) named_bar_sync(4 + (j & 1), W_THREADS);
  if (tig == 0) {
    float *ax = amx + (j & 1) * 128;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) ax[r0 + 8 * hh] = alpha[hh], ax[64 + r0 + 8 * hh] = m_pub[hh];
  }
#pragma unroll
  for (int nb = 0; nb < 4; nb++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const float p0 = ex2_approx(fmaf(s[4 * nb + 2 * hh], FWD_LOG2E, -mls[hh]));
      const float p1 = ex2_approx(fmaf(s[4 * nb + 2 * hh + 1], FWD_LOG2E, -mls[hh]));
      lsum[hh] += p0 + p1;
      const int row = r0 + 8 * hh, col = (j & 1) * 32 + nb * 8 + 2 * tig;
      *(uint32_t *)(p_smem + w_chunk(row, col >> 3) + (col & 7) * 2) =
          pack_bf16x2(p0, p1);
    }
  fence_proxy_async(); /* P(j) visible to both warpgroups' wgmma */
  named_bar_arrive(2 + (j & 1), W_THREADS);
}

template <int DR>
__global__ void __launch_bounds__(W_THREADS + 128, 1)
    fwd90pp_kernel(const __grid_constant__ smla_cuda_fwd_args a) {
  constexpr int DQK = 512 + DR;
  constexpr int KB = DQK / 64;
  constexpr uint32_t STAGE = KB * P_KB_BYTES;
  const float NEG_INF = -INFINITY;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_base = smem_addr(smem_raw);
  const uint32_t sbase = (raw_base + 1023u) & ~1023u; /* the swizzle needs 1024 alignment */
  uint8_t *smem = smem_raw + (sbase - raw_base);
  const p_layout L = p_layout_of(DR);
  float *amx = (float *)(smem + L.amx), *red = (float *)(smem + L.red);

  const int tid = threadIdx.x, lane = tid & 31;
  /* Read through a shuffle so that the compiler knows it is the same across the warp:
   * the loop's branches depend on it, and wgmma in a divergent path is serialized. */
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
  const int g = lane >> 2, tig = lane & 3;
  const int r0 = 16 * wq + g; /* this thread's rows of S and O: r0 and r0 + 8 */

  const fwd_block blk = fwd_block_of(a);
  const int64_t t = blk.t;
  const int split = blk.split, ks = blk.ks, kend = blk.kend, h0 = blk.grp * W_HEADS;
  const int nt = kend > ks ? (kend - ks + P_TB - 1) / P_TB : 0;
  const int32_t *slot_row = blk.slot_row;

  unsigned bad = 0;
  const uint32_t q_s = sbase + L.q, kv_s = sbase + L.kv, p_s = sbase + L.p;
  const uint32_t full_b = sbase + L.bar, empty_b = full_b + 8u * P_STAGES;
  if (tid == 0)
    for (int i = 0; i < P_STAGES; i++) {
      mbar_init(full_b + 8u * i, 128); /* the gather threads */
      mbar_init(empty_b + 8u * i, 8);  /* the compute warps, after their PV of the tile */
    }
  __syncthreads();
  if (tid >= W_THREADS) {
    /* The gather warpgroup: Q as in v3, then warp pw gathers rows 8 pw..8 pw + 7 of each
     * tile, 4 rows x 8 chunks per instruction; lane l < 8 owns the slot of row 8 pw + l. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    if (nt > 0) {
      const int pw = (tid - W_THREADS) >> 5, cl = lane & 7, rl = lane >> 3;
#pragma unroll 1
      for (int rg = 0; rg < 4; rg++) {
        const int row = 16 * pw + 4 * rg + rl, head = h0 + row;
#pragma unroll 1
        for (int cb = 0; cb < KB; cb++)
          cp_async_16(q_s + w_chunk(row, 8 * cb + cl), q_chunk_src(a, t, head, 8 * cb + cl),
                      head < a.num_heads ? 16 : 0);
      }
      const int my_row = 8 * pw + (lane & 7);
      int32_t sn = p_slot(slot_row, ks, kend, 0, my_row);
#pragma unroll 1
      for (int j = 0; j < nt; j++) {
        const uint32_t st = (uint32_t)(j % P_STAGES);
        if (j >= P_STAGES) mbar_wait(empty_b + 8u * st, (uint32_t)((j / P_STAGES - 1) & 1));
        const int32_t sc = sn;
        if (j + 1 < nt) sn = p_slot(slot_row, ks, kend, j + 1, my_row);
        unsigned nb = 0;
        const int u_mine = entry_used(a, sc, ks + j * P_TB + my_row, kend, 0, &nb);
        bad += lane < 8 ? nb : 0u; /* lanes 8..31 hold the same rows again */
        const uint32_t base = kv_s + st * STAGE;
#pragma unroll
        for (int rg = 0; rg < 2; rg++) {
          const int rr = 4 * rg + rl, row = 8 * pw + rr;
          const int32_t sl = __shfl_sync(0xffffffffu, sc, rr);
          const int u = __shfl_sync(0xffffffffu, u_mine, rr);
          const uint8_t *src = a.cache + (u ? (int64_t)sl * a.row_bytes : 0);
#pragma unroll
          for (int cb = 0; cb < KB; cb++)
            cp_async_16(base + p_chunk(row, 8 * cb + cl), src + 16 * (8 * cb + cl), u ? 16u : 0u);
        }
        mbar_arrive_cp_async_noinc(full_b + 8u * st);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    /* O as in v3: column of O[h][4j + e] is 256 wg + 128 h + 8 j + 2 tig + (e & 1). */
    float O[2][64];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int i = 0; i < 64; i++) O[h][i] = 0.0f;
    float l_run[2] = {0.0f, 0.0f};

#define P_PIN_O()                                                                          \
  _Pragma("unroll") for (int h_ = 0; h_ < 2; h_++)                                         \
      _Pragma("unroll") for (int i_ = 0; i_ < 64; i_++) wg_pin(O[h_][i_])
    /* O += P(c) V(c) over this warpgroup's 256 columns: 2 k-steps x 2 wgmma m64n128k16. */
#define P_ISSUE_PV(c)                                                                      \
  do {                                                                                     \
    const uint32_t vb_ = kv_s + (uint32_t)((c) % P_STAGES) * STAGE;                        \
    P_PIN_O();                                                                             \
    wg_fence();                                                                            \
    _Pragma("unroll") for (int k_ = 0; k_ < P_TB / 16; k_++) {                             \
      const uint64_t da_ = wg_desc(p_s + (uint32_t)((c) & 1) * 64u + k_ * 32, 16, 1024);   \
      _Pragma("unroll") for (int h_ = 0; h_ < 2; h_++) {                                   \
        const uint64_t db_ = wg_desc(                                                      \
            vb_ + (uint32_t)((4 * wg + 2 * h_) * P_KB_BYTES + k_ * 16 * 128), P_KB_BYTES,  \
            1024);                                                                         \
        wgmma_m64n128k16_ss_tb(O[h_], da_, db_);                                           \
      }                                                                                    \
    }                                                                                      \
    wg_commit();                                                                           \
  } while (0)
    /* The slots of this thread's 8 columns of S in own tile jj. */
    int32_t cslot[8];
#define P_LOAD_SLOTS(jj)                                                                   \
  _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++) cslot[q_] =                             \
      p_slot(slot_row, ks, kend, (jj), (q_ >> 1) * 8 + 2 * tig + (q_ & 1))

    if (wg < nt) P_LOAD_SLOTS(wg);
    /* Waits until the other warpgroup published tile c (P, alpha, m) and, for this
     * warpgroup's wgmma, until the tile's rows landed. */
#define P_WAIT_PUBLISHED(c)                                                                \
  do {                                                                                     \
    named_bar_sync(2 + ((c) & 1), W_THREADS);                                              \
    mbar_wait(full_b + 8u * (uint32_t)((c) % P_STAGES), (uint32_t)(((c) / P_STAGES) & 1)); \
    fence_proxy_async();                                                                   \
  } while (0)
    /* O, l *= alpha(c); O += P(c) V(c). */
#define P_RESCALE_ISSUE(c)                                                                 \
  do {                                                                                     \
    const float *al_ = amx + ((c) & 1) * 128;                                              \
    const float al0_ = al_[r0], al1_ = al_[r0 + 8];                                        \
    l_run[0] *= al0_, l_run[1] *= al1_;                                                    \
    _Pragma("unroll") for (int h_ = 0; h_ < 2; h_++)                                       \
        _Pragma("unroll") for (int i_ = 0; i_ < 64; i_++) O[h_][i_] *= (i_ & 2) ? al1_ : al0_; \
    P_ISSUE_PV(c);                                                                         \
  } while (0)
    /* S(j) = Q K(j)^T, all 64 heads x the tile's 32 entries, once its rows landed. */
    float s[16];
#define P_ISSUE_S(jj)                                                                      \
  do {                                                                                     \
    mbar_wait(full_b + 8u * (uint32_t)((jj) % P_STAGES), (uint32_t)(((jj) / P_STAGES) & 1)); \
    fence_proxy_async();                                                                   \
    const uint32_t kb_s_ = kv_s + (uint32_t)((jj) % P_STAGES) * STAGE;                     \
    _Pragma("unroll") for (int i_ = 0; i_ < 16; i_++) s[i_] = 0.0f;                        \
    wg_fence();                                                                            \
    _Pragma("unroll") for (int kb_ = 0; kb_ < KB; kb_++)                                   \
        _Pragma("unroll") for (int k4_ = 0; k4_ < 4; k4_++)                                \
            wgmma_m64n32k16_ss(s, wg_desc(q_s + kb_ * W_KB_BYTES + k4_ * 32, 16, 1024),    \
                               wg_desc(kb_s_ + kb_ * P_KB_BYTES + k4_ * 32, 16, 1024));    \
    wg_commit();                                                                           \
  } while (0)
    /* After S(jj) was waited for: this thread's used bits, the next own tile's slots,
     * and the softmax, published. */
#define P_SOFTMAX(jj)                                                                      \
  do {                                                                                     \
    _Pragma("unroll") for (int i_ = 0; i_ < 16; i_++) wg_pin(s[i_]);                       \
    unsigned um_ = 0; /* bit 2 nb + (e & 1): this thread's entry of column block nb */     \
    _Pragma("unroll") for (int q_ = 0; q_ < 8; q_++)                                       \
        um_ |= (cslot[q_] >= 0 && (int64_t)cslot[q_] < a.num_slots ? 1u : 0u) << q_;       \
    if ((jj) + 2 < nt) P_LOAD_SLOTS((jj) + 2);                                             \
    p_softmax_publish(a, s, um_, (jj), r0, tig, amx, smem + L.p, alpha, lsum);             \
  } while (0)
    float alpha[2], lsum[2];
    /* The loop below starts each round with no wgmma in flight (with one carried over
     * the back edge, the compiler serializes every wgmma), so the PV of the last own tile
     * is issued at the top of the round after its softmax. jp: that tile, or -1. Before
     * the loop, each warpgroup's first round, without a PV to issue at its top. */
    int jp = -1;
#define P_TAKE_IN_DONE(c)                                                                  \
  do { /* PV(c) of the other warpgroup's tile c waited for: free its stage and P half */   \
    if (lane == 0) mbar_arrive(empty_b + 8u * (uint32_t)((c) % P_STAGES));                 \
    if ((c) + 2 < nt) named_bar_arrive(4 + ((c) & 1), W_THREADS);                          \
  } while (0)
#define P_ADD_OWN(jj)                                                                      \
  do { /* O, l *= alpha(jj); l += rowsum P(jj); O += P(jj) V(jj) */                        \
    _Pragma("unroll") for (int hh_ = 0; hh_ < 2; hh_++) l_run[hh_] =                       \
        l_run[hh_] * alpha[hh_] + lsum[hh_];                                               \
    _Pragma("unroll") for (int h_ = 0; h_ < 2; h_++)                                       \
        _Pragma("unroll") for (int i_ = 0; i_ < 64; i_++) O[h_][i_] *= alpha[(i_ >> 1) & 1]; \
    P_ISSUE_PV(jj);                                                                        \
  } while (0)
    if (wg == 0) {
      if (nt > 0) { /* tile 0: no tile before it */
        P_ISSUE_S(0);
        wg_wait<0>();
        P_SOFTMAX(0);
        jp = 0;
      }
    } else if (nt > 1) { /* take in tile 0 under S(1), then tile 1 */
      P_ISSUE_S(1);
      P_WAIT_PUBLISHED(0);
      P_RESCALE_ISSUE(0); /* O is still zero: no PV to wait for */
      wg_wait<1>();       /* S(1) done (PV(0) may still run) */
      P_SOFTMAX(1);
      wg_wait<0>();
      P_PIN_O();
      P_TAKE_IN_DONE(0);
      jp = 1;
    } else if (nt == 1) { /* only tile 0, warpgroup 0's */
      P_WAIT_PUBLISHED(0);
      P_RESCALE_ISSUE(0);
      wg_wait<0>();
      P_PIN_O();
    }
#pragma unroll 1
    for (int j = jp + 2; jp >= 0 && j < nt; j += 2) { /* own tile j, the other's j - 1 */
      P_ADD_OWN(jp);
      P_ISSUE_S(j);
      P_WAIT_PUBLISHED(j - 1);
      wg_wait<1>(); /* PV(jp) done (S(j) may still run): its stage is free */
      P_PIN_O();
      if (lane == 0) mbar_arrive(empty_b + 8u * (uint32_t)(jp % P_STAGES));
      P_RESCALE_ISSUE(j - 1);
      wg_wait<1>(); /* S(j) done (PV(j-1) may still run) */
      P_SOFTMAX(j);
      wg_wait<0>(); /* PV(j-1) done */
      P_PIN_O();
      P_TAKE_IN_DONE(j - 1);
      jp = j;
    }
    if (jp >= 0) { /* the last own tile's PV, and the other's tile after it, if any */
      P_ADD_OWN(jp);
      if (jp + 1 < nt) {
        P_WAIT_PUBLISHED(jp + 1);
        wg_wait<0>();
        P_PIN_O();
        P_RESCALE_ISSUE(jp + 1);
      }
      wg_wait<0>();
      P_PIN_O();
    }
#undef P_TAKE_IN_DONE
#undef P_ADD_OWN
#undef P_LOAD_SLOTS
#undef P_ISSUE_S
#undef P_SOFTMAX
#undef P_WAIT_PUBLISHED
#undef P_RESCALE_ISSUE
#undef P_ISSUE_PV
#undef P_PIN_O

    /* Row sums: quad, then the two warpgroups' (each summed its own tiles). */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float l = l_run[hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (tig == 0) red[wg * 64 + r0 + 8 * hh] = l;
    }
    named_bar_sync(1, W_THREADS);

    /* ---- epilogue: final (num_splits == 1) or partial state, as in v3 ---- */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = r0 + 8 * hh, head = h0 + row;
      if (head >= a.num_heads) continue;
      const float m = nt > 0 ? amx[((nt - 1) & 1) * 128 + 64 + row] : NEG_INF;
      const fwd_row_out r = fwd_row_epilogue(a, t, split, head, red[row] + red[64 + row], m,
                                             wg == 0 && tig == 0);
      const int col0 = 256 * wg + 2 * tig;
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int nb = 0; nb < 16; nb++) {
          const int col = col0 + 128 * h + 8 * nb;
          const float v0 = O[h][4 * nb + 2 * hh] * r.f, v1 = O[h][4 * nb + 2 * hh + 1] * r.f;
          if (r.out) *(uint32_t *)(r.out + col) = pack_bf16x2(v0, v1);
          if (r.part) *(float2 *)(r.part + col) = make_float2(v0, v1);
        }
    }
  }

  fwd_count_bad(a, blk.grp, bad);
}

#if SMLA_FWD90_PP
#define FWD90_KERNEL fwd90pp_kernel
#define FWD90_LAYOUT p_layout_of
#else
#define FWD90_KERNEL fwd90_kernel
#define FWD90_LAYOUT w_layout_of
#endif

extern "C" uint32_t smla_cuda_fwd90_smem_bytes(int dr) {
  return FWD90_LAYOUT(dr).total + 1024u; /* + slack to align the base to 1024 */
}

extern "C" cudaError_t smla_cuda_fwd90_prepare(int dr, int max_smem) {
  return dr == 64 ? cudaFuncSetAttribute(FWD90_KERNEL<64>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem)
                  : cudaFuncSetAttribute(FWD90_KERNEL<0>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
}

extern "C" cudaError_t smla_cuda_fwd90_launch(int dr, const smla_cuda_fwd_args *a,
                                              void *stream) {
  const int64_t blocks = a->num_tokens * a->groups * a->num_splits;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const uint32_t smem = smla_cuda_fwd90_smem_bytes(dr);
  const unsigned threads = SMLA_FWD90_PP ? W_THREADS + 128 : W_BLOCK;
  if (dr == 64)
    FWD90_KERNEL<64><<<(unsigned)blocks, threads, smem, (cudaStream_t)stream>>>(*a);
  else
    FWD90_KERNEL<0><<<(unsigned)blocks, threads, smem, (cudaStream_t)stream>>>(*a);
  return cudaGetLastError();
}
