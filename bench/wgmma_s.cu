/*
 * wgmma_s.cu: the S-only microbenchmark (build/wgmma_s_bench, sm_90a), the first measurement
 * of the rebuild named after v12 (docs/design/cuda-sm90-forward.md, "Next, by size", session
 * 15): would S of 32-row tiles, which reads Q from shared memory twice as often per entry as
 * v11's 64-row tiles, be bound by shared memory?
 *
 * One block per SM, Q (64 heads x 576 bf16) and a tile of K rows (64 x 576) resident in
 * shared memory in the forward's 128-byte-swizzle layout (contents: small bf16 values; only
 * the time is read). Each compute warpgroup issues S = Q K^T for `iters` tiles of 64 entries
 * and waits for each:
 *   n64    36 wgmma m64n64k16 a 64-entry tile (v11's S)
 *   n32    2 x 36 wgmma m64n32k16 a 64 entries (two 32-row tiles, each its own commit and
 *          wait: the S of the rebuild)
 *   n48    36 wgmma m64n48k16 a 48-entry tile (rows 0-47 of the stack; v23's S, all 36
 *          k-steps with Q from shared memory), its PVs 3 k-steps; times reported per 64
 *          entries (x 64 / 48)
 * with one warpgroup issuing (the other idle: S alone on the tensor cores), both (two S
 * streams at once, the most S ever overlaps with S), or a tile's tensor work as the forward
 * has it: warpgroup 0 issues S, then both add P V to their 256 output columns (8 wgmma
 * m64n128k16 each, P and V from shared memory), each waiting for its own, the two in step
 * by a barrier a tile (warpgroup 1's PV runs beside warpgroup 0's S). Prints µs per
 * 64 entries (per warpgroup where both issue S) and the floor beside it at the clock the
 * driver reports: S 1152 tensor cycles, a tile 2176 (S + both PVs).
 *
 *   build/wgmma_s_bench [--iters 2000] [--reps 5]
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/sm90/wgmma.cuh"

#define DQK 576
#define KB (DQK / 64)        /* 8 KB column blocks of a 64-row stack */
#define BLOCK_BYTES 8192
#define SMEM_BYTES (2 * KB * BLOCK_BYTES + 1024) /* Q and one tile, + alignment slack */

#define BENCH_NAME "wgmma_s_bench"
#include "bench_ck.cuh"

/* O[:, 256 wg + ...] += P V over KS k-steps of 16 entries, P [64][16 KS] at p_s (K-major),
 * V the rows at v_s (MN-major): the forward's cross PV (w11_pv_ss), one commit group. */
template <int KS>
__device__ __forceinline__ void pv_ss(float O[2][64], uint32_t p_s, uint32_t v_s, int wg) {
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
  wg_fence();
#pragma unroll
  for (int k = 0; k < KS; k++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      wgmma_m64n128k16_ss_tb(O[h], wg_desc(p_s + k * 32, 16, 1024),
                             wg_desc(v_s + (uint32_t)((4 * wg + 2 * h) * BLOCK_BYTES + k * 16 * 128),
                                     BLOCK_BYTES, 1024));
  wg_commit();
}

/* S of 64 entries, waited for: one n64 tile, or two n32 tiles (rows 0-31 and 32-63 of the
 * same stack: [32 rows][128 B] blocks of 4 KB, 1024-aligned, the swizzle unchanged), each
 * its own commit and wait. Returns one value, so the accumulators stay live. */
template <int WAY>
__device__ __forceinline__ float s_tile(uint32_t q_s, uint32_t k_s) {
  constexpr int N = WAY == 1 ? 32 : WAY == 2 ? 48 : 64; /* entries a tile */
  float s[32], acc = 0.0f;
#pragma unroll
  for (int half = 0; half < (WAY == 1 ? 2 : 1); half++) {
    wg_s_issue<N, KB>(s, q_s, 8192u, k_s + (uint32_t)half * 4096u, 8192u);
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < N / 2; i++) wg_pin(s[i]);
    acc += s[0];
  }
  return acc;
}

/* WAY: 0 n64, 1 n32, 2 n48; mode: 0 S by warpgroup 0 alone, 1 S by both, 2 a tile (S by
 * warpgroup 0, then both PVs, the two warpgroups in step by a barrier a tile). out: one
 * float a thread, so the accumulators stay live. */
template <int WAY>
__global__ void __launch_bounds__(256, 1) s_kernel(int mode, int iters, float *out) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t *smem = smem_raw + (base - raw);
  const int tid = threadIdx.x, wg = tid >> 7;
  for (int i = tid; i < 2 * KB * BLOCK_BYTES / 2; i += blockDim.x)
    ((uint16_t *)smem)[i] = (uint16_t)(0x3f80u + (i & 7)); /* bf16 ~1.0x, finite */
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* visible to wgmma */
  __syncthreads();
  const uint32_t q_s = base, k_s = base + KB * BLOCK_BYTES;
  float acc = 0.0f;
  if (mode == 2) {
    float O[2][64]; /* P is read from Q's first block (its values do not matter here) */
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int i = 0; i < 64; i++) O[h][i] = 0.0f;
#pragma unroll 1
    for (int it = 0; it < iters; it++) {
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (wg == 0) acc += s_tile<WAY>(q_s, k_s);
      pv_ss<WAY == 2 ? 3 : 4>(O, q_s, k_s, wg);
      wg_wait<0>();
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) wg_pin(O[h][i]);
    }
    acc += O[0][0] + O[1][63];
  } else if (wg == 0 || mode == 1) {
#pragma unroll 1
    for (int it = 0; it < iters; it++) acc += s_tile<WAY>(q_s, k_s);
  }
  out[blockIdx.x * blockDim.x + tid] = acc;
}

int main(int argc, char **argv) {
  int iters = 2000, reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: wgmma_s_bench [--iters 2000] [--reps 5]\n");
      return 2;
    }
  }
  if (iters < 1 || reps < 1) {
    fprintf(stderr, "wgmma_s_bench: --iters and --reps must be positive\n");
    return 2;
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  if (p.major != 9) {
    fprintf(stderr, "wgmma_s_bench: needs an sm_90 device (this is sm_%d%d)\n", p.major, p.minor);
    return 1;
  }
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  CK(cudaFuncSetAttribute(s_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
  CK(cudaFuncSetAttribute(s_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
  CK(cudaFuncSetAttribute(s_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
  float *out;
  CK(cudaMalloc(&out, (size_t)p.multiProcessorCount * 256 * sizeof(float)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double mhz = clock_khz * 1e-3;
  printf("%s, %d SMs, %.0f MHz: tensor-rate floors per 64 entries: S %.3f us, a tile (S and "
         "both PVs) %.3f us\n", p.name, p.multiProcessorCount, mhz, 1152.0 / mhz, 2176.0 / mhz);
  printf("%-4s %-16s %6s %14s %10s\n", "way", "issuing", "SMs", "us/64 entries", "x floor");
  const int sms[2] = {1, p.multiProcessorCount};
  static const char *mode_name[3] = {"S, one WG", "S, both WGs", "tile (S + 2 PV)"};
  static const char *way_name[3] = {"n64", "n32", "n48"};
  for (int way = 0; way < 3; way++)
    for (int mode = 0; mode < 3; mode++)
      for (int si = 0; si < 2; si++) {
        const double floor_us = (mode == 2 ? 2176.0 : 1152.0) / mhz;
        float best = 1e30f;
        for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
          CK(cudaEventRecord(e0));
          if (way == 2) s_kernel<2><<<sms[si], 256, SMEM_BYTES>>>(mode, iters, out);
          else if (way) s_kernel<1><<<sms[si], 256, SMEM_BYTES>>>(mode, iters, out);
          else s_kernel<0><<<sms[si], 256, SMEM_BYTES>>>(mode, iters, out);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          CK(cudaGetLastError());
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (r > 0 && ms < best) best = ms;
        }
        const double us = best * 1e3 / iters * (way == 2 ? 64.0 / 48.0 : 1.0);
        printf("%-4s %-16s %6d %14.3f %10.2f\n", way_name[way], mode_name[mode], sms[si], us,
               us / floor_us);
      }
  CK(cudaFree(out));
  return 0;
}
