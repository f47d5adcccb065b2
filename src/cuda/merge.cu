/*
 * merge.cu: exact log-sum-exp merge of P partial states (SPEC §4), also the forward's
 * split-KV combine (with max_p -> max_logit and the sink factor 1 / (1 + exp(sink - lse))),
 * and the public merge of sinked partials (merge_kernel only: a.sinked).
 *
 * Merged rows: one block of 128 threads per (t, h) (merge_kernel), or for few rows with
 * many partials one block per (t, h, 128 columns) (merge3_kernel), or for the forward's
 * 2..8 dense partials one warp per (t, h) (merge4_kernel); chosen in smla_cuda_merge.
 * Bytes: P * dv * 4 read + dv * 2 written per (t, h). The forward picks many splits only
 * when T * N is small (T=1 N=16 P=32: 1 MB of partials, L2-resident, ~2 us).
 */
#include "kernels.h"
#include "numerics.h"
#include "probe.cuh"
#include "ptx.cuh"

#include <cuda_bf16.h>
#include <math.h>

/* Every combine kernel waits for the forward's writes (griddepcontrol.wait: a no-op after
 * a plain launch) and then lets the next kernel, if it waits alike, be scheduled
 * (launch_dependents). merge3 and merge4 are launched as programmatic dependents of the
 * forward where args.pdl; v1 never is (smla_cuda_merge says why).
 * SMLA_COMBINE_PDL=0 (A/B build): plain launches, no early trigger. */
#ifndef SMLA_COMBINE_PDL
#define SMLA_COMBINE_PDL 1
#endif

#define MERGE_THREADS 128 /* one block per (t, h); 4 values per thread covers dv = 512 */
#define MERGE_CHUNK 128   /* partials whose weights are staged in shared memory at once */
#define MERGE_UNROLL 8    /* partial rows loaded before the first is used */

/* 4 values (vec) or 1 from element `off` of a float or bf16 array. */
__device__ __forceinline__ void load4(const void *base, int bf16, int64_t off, int vec,
                                      float v[4]) {
  if (bf16) {
    const __nv_bfloat16 *p = (const __nv_bfloat16 *)base + off;
    if (vec) {
      const uint2 u = *(const uint2 *)p;
      const __nv_bfloat162 lo = *(const __nv_bfloat162 *)&u.x, hi = *(const __nv_bfloat162 *)&u.y;
      v[0] = __low2float(lo), v[1] = __high2float(lo);
      v[2] = __low2float(hi), v[3] = __high2float(hi);
    } else {
      v[0] = __bfloat162float(p[0]);
    }
  } else {
    const float *p = (const float *)base + off;
    if (vec) {
      const float4 u = *(const float4 *)p;
      v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    } else {
      v[0] = p[0];
    }
  }
}

__device__ __forceinline__ void store4(void *base, int bf16, int64_t off, int vec,
                                       const float v[4]) {
  if (bf16) {
    __nv_bfloat16 *p = (__nv_bfloat16 *)base + off;
    if (vec) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
      uint2 u;
      u.x = *(const uint32_t *)&lo, u.y = *(const uint32_t *)&hi;
      *(uint2 *)p = u;
    } else {
      p[0] = __float2bfloat16_rn(v[0]);
    }
  } else {
    float *p = (float *)base + off;
    if (vec)
      *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else
      p[0] = v[0];
  }
}

/* One block per (t, h). Warp 0 reduces the P lse values (max, then sum of exp); then
 * every thread sweeps its 4 (or 1..4 scalar) output values over the P partial rows,
 * MERGE_UNROLL independent 16-byte loads in flight: a T=1 N=16 P=32 combine is a few
 * L2 round trips, not P of them. A partial with lse = -inf is never read: its load is
 * pointed at a partial that is read anyway and its contribution is selected away. */
template <int VEC>
__global__ void __launch_bounds__(MERGE_THREADS) merge_kernel(const smla_cuda_merge_args a) {
  constexpr int vec = VEC, step = VEC ? 4 : 1, nc = VEC ? 1 : 4;
  __shared__ float w_s[MERGE_CHUNK];
  __shared__ int idx_s[MERGE_CHUNK];
  __shared__ float lse_s, factor_s;
  __shared__ int valid_s;
#if __CUDA_ARCH__ >= 900
  griddep_wait(); /* (a plain launch: a no-op) */
  if (SMLA_COMBINE_PDL) griddep_launch_dependents(); /* the next kernel may be scheduled */
#endif
  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t row = blockIdx.x;
  const int64_t t = row / a.num_heads;
  const int h = (int)(row % a.num_heads);
  const float *lse_p = a.lse_p + t * a.lse_p_stride_t + h;
  const float NEG_INF = -INFINITY;

  if (tid < 32) {
    float mx = NEG_INF;
    int nan = 0, valid = -1;
    for (int p = lane; p < a.num_partials; p += 32) {
      const float l = lse_p[p * a.lse_p_stride_p];
      mx = fmaxf(mx, l); /* skips NaN: counted apart so that it propagates */
      nan |= l != l;
      if (l != NEG_INF && valid < 0) valid = p;
    }
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    nan = __any_sync(0xffffffffu, nan);
    valid = __reduce_max_sync(0xffffffffu, (unsigned)(valid + 1)) - 1; /* some valid one */
    float lse = NEG_INF;
    if (nan) {
      lse = NAN;
    } else if (mx != NEG_INF) {
      float sum = 0.0f;
      for (int p = lane; p < a.num_partials; p += 32) {
        const float l = lse_p[p * a.lse_p_stride_p];
        if (l != NEG_INF) sum += expf(l - mx);
      }
      for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      lse = mx + logf(sum);
    }
    float m = NEG_INF;
    if (a.max_p && a.max_logit)
      for (int p = lane; p < a.num_partials; p += 32)
        m = fmax_nan(m, a.max_p[t * a.max_p_stride_t + h + p * a.max_p_stride_p]);
    for (int o = 16; o; o >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) {
      lse_s = lse;
      factor_s = a.sink && !a.sinked && lse != NEG_INF ? 1.0f / (1.0f + expf(a.sink[h] - lse)) : 1.0f;
      valid_s = valid;
      if (a.lse) a.lse[t * a.lse_stride_t + h] = lse;
      if (a.max_p && a.max_logit) a.max_logit[t * a.max_logit_stride_t + h] = m;
    }
  }
  __syncthreads();
  const float lse = lse_s, factor = factor_s;
  /* Sinked partials: w_p = exp(lae(lse_p, s) - lae(lse, s)) (smla.h, merge). */
  const float sink_h = a.sinked ? a.sink[h] : 0.0f;
  const float lae_all = a.sinked && lse == lse ? smla_logaddexpf(lse, sink_h) : lse;
  const int64_t out_off = t * a.out_stride_t + (int64_t)h * a.out_stride_h;
  const int64_t in_off = t * a.out_p_stride_t + (int64_t)h * a.out_p_stride_h;
  float acc[4][4];
#pragma unroll
  for (int c = 0; c < 4; c++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[c][i] = 0.0f;
  /* This thread's values: d = step * tid + 128 * step * c, c < nc (dv <= 512). */
  if (lse != NEG_INF) {
    for (int p0 = 0; p0 < a.num_partials; p0 += MERGE_CHUNK) {
      const int n = min(MERGE_CHUNK, a.num_partials - p0);
      for (int i = tid; i < n; i += MERGE_THREADS) {
        const float l = lse_p[(p0 + i) * a.lse_p_stride_p];
        const bool skip = l == NEG_INF;
        w_s[i] = skip ? -1.0f /* contributes nothing (NaN stays) */
                 : a.sinked ? expf(smla_logaddexpf(l, sink_h) - lae_all) : expf(l - lse);
        idx_s[i] = skip ? valid_s : p0 + i;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < nc; c++) {
        const int d0 = step * tid + MERGE_THREADS * step * c;
        if (d0 >= a.dv) break;
        int i = 0;
        for (; i + MERGE_UNROLL <= n; i += MERGE_UNROLL) {
          float v[MERGE_UNROLL][4];
#pragma unroll
          for (int u = 0; u < MERGE_UNROLL; u++)
            load4(a.out_p, a.out_p_bf16, in_off + idx_s[i + u] * a.out_p_stride_p + d0, vec, v[u]);
#pragma unroll
          for (int u = 0; u < MERGE_UNROLL; u++) {
            const float w = w_s[i + u];
#pragma unroll
            for (int e = 0; e < step; e++) acc[c][e] += w < 0.0f ? 0.0f : w * v[u][e];
          }
        }
        for (; i < n; i++) {
          float v[4];
          load4(a.out_p, a.out_p_bf16, in_off + idx_s[i] * a.out_p_stride_p + d0, vec, v);
          const float w = w_s[i];
#pragma unroll
          for (int e = 0; e < step; e++) acc[c][e] += w < 0.0f ? 0.0f : w * v[e];
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int c = 0; c < nc; c++) {
    const int d0 = step * tid + MERGE_THREADS * step * c;
    if (d0 >= a.dv) break;
#pragma unroll
    for (int e = 0; e < step; e++) acc[c][e] *= factor;
    store4(a.out, a.out_bf16, out_off + d0, vec, acc[c]);
  }
}

/* ---- v3: few rows, many partials ----------------------------------------------------
 * One block of 8 warps per (t, h, 128-column chunk): lane l owns columns 128 c + 4 l, warp
 * w the partials p = w, w + 8, ... Each warp reduces the P lse values itself (lanes over
 * p, shuffles: no shared memory, no barrier), then issues the loads of its partials all at
 * once (a -inf partial's load is pointed at a valid one and selected away, as in v1), and
 * the 8 warps' sums meet in shared memory. Two dependent L2 round trips (lse, partials)
 * instead of v1's ~6 on T=1 N=16 P=32, but T x N x 4 blocks of 256 threads instead of
 * T x N of 128: past one wave of blocks the rounds repeat per wave and v1 wins.
 * Measured on the H200 (2026-12-03, decode preset, v1 -> v3 whole forward): T x N = 16..128
 * rows faster (T=1 N=16 13.53 -> 10.43 us, T=1 N=128 18.45 -> 16.79, T=8 N=16 16.00 ->
 * 15.60), 256 rows slower (T=2 N=128 21.95 -> 22.57, T=16 N=16 21.10 -> 23.33), 512 and
 * 1024 much slower (T=4 N=128 23.13 -> 29.36, T=8 N=128 30.06 -> 44.42). Hence v3 for
 * P >= 8 and T x N <= MERGE3_MAX_ROWS only. */
#define MERGE3_MAX_ROWS 128
#define MERGE3_WARPS 8
#define MERGE3_COLS 128
#define MERGE3_INFLIGHT 4 /* partial loads per lane in flight (P <= 32 in one round) */

__global__ void __launch_bounds__(MERGE3_WARPS * 32) merge3_kernel(const smla_cuda_merge_args a) {
  __shared__ float4 part_s[MERGE3_WARPS][32];
  PROBE_DECL;
  PROBE_STAMP(0);
#if __CUDA_ARCH__ >= 900
  griddep_wait(); /* a programmatic dependent: the forward's writes first (else a no-op) */
  if (SMLA_COMBINE_PDL) griddep_launch_dependents(); /* the next kernel may be scheduled */
#endif
  PROBE_STAMP(1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = (a.dv + MERGE3_COLS - 1) / MERGE3_COLS;
  const int64_t row = blockIdx.x / chunks;
  const int chunk = (int)(blockIdx.x % chunks);
  const int64_t t = row / a.num_heads;
  const int h = (int)(row % a.num_heads);
  const float *lse_p = a.lse_p + t * a.lse_p_stride_t + h;
  const float NEG_INF = -INFINITY;
  const int P = a.num_partials;

  /* lse of the row, in every warp (lanes over p). */
  float mx = NEG_INF;
  int nan = 0, valid = -1;
  for (int p = lane; p < P; p += 32) {
    const float l = lse_p[p * a.lse_p_stride_p];
    mx = fmaxf(mx, l);
    nan |= l != l;
    if (l != NEG_INF && valid < 0) valid = p;
  }
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  nan = __any_sync(0xffffffffu, nan);
  valid = (int)__reduce_max_sync(0xffffffffu, (unsigned)(valid + 1)) - 1;
  float lse = NEG_INF;
  if (nan) {
    lse = NAN;
  } else if (mx != NEG_INF) {
    float sum = 0.0f;
    for (int p = lane; p < P; p += 32) {
      const float l = lse_p[p * a.lse_p_stride_p]; /* L1 hit: read just above */
      if (l != NEG_INF) sum += expf(l - mx);
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    lse = mx + logf(sum);
  }

  /* max_logit's inputs now, so that their round trip overlaps the partials'. */
  float m = NEG_INF;
  const bool want_max = chunk == 0 && warp == 0 && a.max_p && a.max_logit;
  if (want_max)
    for (int p = lane; p < P; p += 32)
      m = fmax_nan(m, a.max_p[t * a.max_p_stride_t + h + p * a.max_p_stride_p]);

  const int d0 = chunk * MERGE3_COLS + 4 * lane;
  const bool live = d0 < a.dv;
  const int64_t in_off = t * a.out_p_stride_t + (int64_t)h * a.out_p_stride_h + d0;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (lse != NEG_INF && live) {
    for (int p0 = warp; p0 < P; p0 += MERGE3_WARPS * MERGE3_INFLIGHT) {
      float l[MERGE3_INFLIGHT], w[MERGE3_INFLIGHT], v[MERGE3_INFLIGHT][4];
#pragma unroll
      for (int u = 0; u < MERGE3_INFLIGHT; u++) { /* the weights' inputs first (L1 hits) */
        const int p = p0 + u * MERGE3_WARPS;
        l[u] = p < P ? lse_p[p * a.lse_p_stride_p] : NEG_INF;
      }
#pragma unroll
      for (int u = 0; u < MERGE3_INFLIGHT; u++) { /* then every load of the round at once */
        const int p = p0 + u * MERGE3_WARPS;
        w[u] = l[u] == NEG_INF ? -1.0f : expf(l[u] - lse); /* -1: contributes nothing */
        v[u][0] = v[u][1] = v[u][2] = v[u][3] = 0.0f;
        if (p < P) /* a -inf partial's load goes to a valid one, its value selected away */
          load4(a.out_p, a.out_p_bf16,
                in_off + (int64_t)(w[u] < 0.0f ? valid : p) * a.out_p_stride_p, 1, v[u]);
      }
#pragma unroll
      for (int u = 0; u < MERGE3_INFLIGHT; u++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] += w[u] < 0.0f ? 0.0f : w[u] * v[u][e];
    }
  }
  part_s[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp == 0) {
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < MERGE3_WARPS; w++) {
      const float4 x = part_s[w][lane];
      o[0] += x.x, o[1] += x.y, o[2] += x.z, o[3] += x.w;
    }
    const float factor = a.sink && lse != NEG_INF ? 1.0f / (1.0f + expf(a.sink[h] - lse)) : 1.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) o[e] *= factor;
    if (live) store4(a.out, a.out_bf16, t * a.out_stride_t + (int64_t)h * a.out_stride_h + d0, 1, o);
    if (chunk == 0) {
      for (int off = 16; off; off >>= 1) m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (lane == 0) {
        if (a.lse) a.lse[t * a.lse_stride_t + h] = lse;
        if (want_max) a.max_logit[t * a.max_logit_stride_t + h] = m;
      }
    }
  }
  PROBE_STAMP(6);
  PROBE_PUT(3, a.num_partials);
}

/* ---- v4: the forward's combine of 2..8 dense float partials ---------------------------
 * One warp per (t, h), lane l owning columns 4 l + 128 c (c < 4, dv = 512): the P lse
 * values, the P max values and the P x 4 partial float4 of the lane are all loaded in one
 * round (the forward writes every partial row, zeros for a -inf one: a.dense), then the
 * lse, the weights and the sum are computed in registers by every lane alike: one L2
 * round trip per row instead of v1's three (lse, lse again for the weights behind a
 * barrier, partials). Same arithmetic as v1 (lse, weights, p-ordered sum, sink factor,
 * NaN and -inf rules). Picked by P alone (not T), so a batch-invariant plan keeps it;
 * for P > 8 such a plan gets v1 at every T (a.fixed_order: v3 sums in another order). */
#define MERGE4_WARPS 4
#ifndef SMLA_MERGE_CARVEOUT /* 0: no carveout preference for the merge kernels (A/B) */
#define SMLA_MERGE_CARVEOUT 1
#endif

template <int P>
__global__ void __launch_bounds__(MERGE4_WARPS * 32) merge4_kernel(const smla_cuda_merge_args a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  PROBE_DECL;
  PROBE_STAMP(0);
#if __CUDA_ARCH__ >= 900
  /* A programmatic dependent (a.pdl) may start before the forward has finished: wait for
   * its completion and its writes (a no-op for a plain launch). */
  griddep_wait();
  if (SMLA_COMBINE_PDL) griddep_launch_dependents(); /* the next kernel may be scheduled */
#endif
  PROBE_STAMP(1);
  const int64_t row = (int64_t)blockIdx.x * MERGE4_WARPS + warp;
  if (row >= a.num_tokens * a.num_heads) return;
  const int64_t t = row / a.num_heads;
  const int h = (int)(row % a.num_heads);
  const float NEG_INF = -INFINITY;
  const float *lse_p = a.lse_p + t * a.lse_p_stride_t + h;
  const float *out_p = (const float *)a.out_p + t * a.out_p_stride_t +
                       (int64_t)h * a.out_p_stride_h + 4 * lane;
  const bool want_max = a.max_p && a.max_logit;
  float l[P], mp[P];
  float4 v[P][4];
#pragma unroll
  for (int p = 0; p < P; p++) {
    l[p] = lse_p[p * a.lse_p_stride_p];
    mp[p] = want_max ? a.max_p[t * a.max_p_stride_t + h + p * a.max_p_stride_p] : NEG_INF;
#pragma unroll
    for (int c = 0; c < 4; c++) v[p][c] = __ldcg((const float4 *)(out_p + p * a.out_p_stride_p) + 32 * c);
  }
  float mx = NEG_INF;
  bool nan = false;
#pragma unroll
  for (int p = 0; p < P; p++) {
    mx = fmaxf(mx, l[p]); /* skips NaN: counted apart so that it propagates */
    nan |= l[p] != l[p];
  }
  float lse = NEG_INF;
  if (nan) {
    lse = NAN;
  } else if (mx != NEG_INF) {
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++)
      if (l[p] != NEG_INF) sum += expf(l[p] - mx);
    lse = mx + logf(sum);
  }
  float acc[4][4];
#pragma unroll
  for (int c = 0; c < 4; c++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[c][e] = 0.0f;
  if (lse != NEG_INF) {
#pragma unroll
    for (int p = 0; p < P; p++) {
      const float w = l[p] == NEG_INF ? -1.0f : expf(l[p] - lse); /* -1: contributes nothing */
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const float x[4] = {v[p][c].x, v[p][c].y, v[p][c].z, v[p][c].w};
#pragma unroll
        for (int e = 0; e < 4; e++) acc[c][e] += w < 0.0f ? 0.0f : w * x[e];
      }
    }
  }
  const float factor = a.sink && lse != NEG_INF ? 1.0f / (1.0f + expf(a.sink[h] - lse)) : 1.0f;
  const int64_t out_off = t * a.out_stride_t + (int64_t)h * a.out_stride_h + 4 * lane;
#pragma unroll
  for (int c = 0; c < 4; c++) {
#pragma unroll
    for (int e = 0; e < 4; e++) acc[c][e] *= factor;
    store4(a.out, a.out_bf16, out_off + 128 * c, 1, acc[c]);
  }
  if (lane == 0) {
    if (a.lse) a.lse[t * a.lse_stride_t + h] = lse;
    if (want_max) {
      float m = NEG_INF;
#pragma unroll
      for (int p = 0; p < P; p++) m = fmax_nan(m, mp[p]);
      a.max_logit[t * a.max_logit_stride_t + h] = m;
    }
  }
  PROBE_STAMP(6);
  PROBE_PUT(2, P);
}

static int aligned4(const void *p, int64_t elem_bytes, int64_t s0, int64_t s1, int64_t s2) {
  const int64_t q = 4 * elem_bytes;
  return ((uintptr_t)p % (uintptr_t)q) == 0 && (s0 * elem_bytes) % q == 0 &&
         (s1 * elem_bytes) % q == 0 && (s2 * elem_bytes) % q == 0;
}

/* A combine launch; a programmatic dependent of the forward where pdl (its launch then
 * overlaps the forward's blocks). */
static cudaError_t merge_launch(const void *kernel, int64_t blocks, int threads,
                                const smla_cuda_merge_args *a, int pdl, void *stream) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3((unsigned)blocks, 1, 1);
  c.blockDim = dim3((unsigned)threads, 1, 1);
  c.stream = (cudaStream_t)stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  c.attrs = &attr;
  c.numAttrs = SMLA_COMBINE_PDL && pdl ? 1 : 0;
  void *args[1] = {(void *)a};
  return cudaLaunchKernelExC(&c, kernel, args);
}

extern "C" cudaError_t smla_cuda_merge(const smla_cuda_merge_args *a, void *stream) {
  const int64_t blocks = a->num_tokens * a->num_heads; /* one per (t, h) */
  if (blocks <= 0) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const int vec = a->dv % 4 == 0 &&
                  aligned4(a->out_p, a->out_p_bf16 ? 2 : 4, a->out_p_stride_p,
                           a->out_p_stride_t, a->out_p_stride_h) &&
                  aligned4(a->out, a->out_bf16 ? 2 : 4, 0, a->out_stride_t, a->out_stride_h);
  const int64_t blocks3 = blocks * ((a->dv + MERGE3_COLS - 1) / MERGE3_COLS);
  const int P = a->num_partials;
  if (vec && a->dense && !a->sinked && !a->out_p_bf16 && a->dv == 512 && P >= 2 && P <= 8) {
    static const void *const k4[7] = {
        (const void *)merge4_kernel<2>, (const void *)merge4_kernel<3>,
        (const void *)merge4_kernel<4>, (const void *)merge4_kernel<5>,
        (const void *)merge4_kernel<6>, (const void *)merge4_kernel<7>,
        (const void *)merge4_kernel<8>};
    return merge_launch(k4[P - 2], (blocks + MERGE4_WARPS - 1) / MERGE4_WARPS,
                        MERGE4_WARPS * 32, a, a->pdl, stream);
  }
  /* v3 where v1 has too few blocks to hide its dependent rounds (see merge3_kernel). */
  if (vec && a->num_partials >= 8 && blocks <= MERGE3_MAX_ROWS && !a->fixed_order && !a->sinked)
    return merge_launch((const void *)merge3_kernel, blocks3, MERGE3_WARPS * 32, a, a->pdl,
                        stream);
  /* v1 (one block a row, 256..T x N blocks) stays a plain launch: as a programmatic
   * dependent its blocks were scheduled early onto the few SMs the forward left free, and
   * the step took 1.2-3.5 us longer (H100, bench/RESULTS.md session 12 run 2: N=128 T=2
   * 23.5 -> 26.5, N=64 T=4 24.9 -> 28.4). */
  return merge_launch(vec ? (const void *)merge_kernel<1> : (const void *)merge_kernel<0>,
                      blocks, MERGE_THREADS, a, 0, stream);
}

extern "C" cudaError_t smla_cuda_merge_prepare(int *pdl_ok) {
  *pdl_ok = 0;
  cudaFuncAttributes fa;
  const cudaError_t e4 = cudaFuncGetAttributes(&fa, (const void *)merge4_kernel<2>);
  if (e4 != cudaSuccess) return e4;
  *pdl_ok = fa.binaryVersion >= 90;
  if (!SMLA_MERGE_CARVEOUT) return cudaSuccess;
  const void *const k[10] = {
      (const void *)merge_kernel<0>,  (const void *)merge_kernel<1>,
      (const void *)merge3_kernel,    (const void *)merge4_kernel<2>,
      (const void *)merge4_kernel<3>, (const void *)merge4_kernel<4>,
      (const void *)merge4_kernel<5>, (const void *)merge4_kernel<6>,
      (const void *)merge4_kernel<7>, (const void *)merge4_kernel<8>};
  for (int i = 0; i < 10; i++) {
    const cudaError_t e = cudaFuncSetAttribute(k[i], cudaFuncAttributePreferredSharedMemoryCarveout,
                                               cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

PROBE_DEFINE_DUMP(smla_probe_dump_merge)
