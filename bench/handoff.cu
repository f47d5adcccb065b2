/*
 * handoff.cu: the warpgroup hand-off microbenchmark (build/handoff_bench, sm_90a). v15 (tiles
 * in pairs, FlashMLA's schedule on v11's parts; docs/design/cuda-sm90-forward.md) hands four
 * things a pair of tiles from one compute warpgroup to the other (m0, m1, P0, P1), each
 * through an mbarrier that every thread of the sender arrives on and every thread of the
 * receiver polls with try_wait; FlashMLA's kernel hands the same four through named
 * barriers (bar.arrive by the sender, bar.sync by the receiver). On an SM nearly alone v15
 * took ~2.9 µs a tile where FlashMLA takes ~2.0. This times one hand-off of each kind with
 * nothing else on the SM, so the difference a pair can owe to them is known.
 *
 * One block of 256 threads (two warpgroups) a launch, or one per SM (--blocks). The two
 * warpgroups play ping-pong `iters` times: warpgroup 0 stores a word a thread into shared
 * memory and signals, warpgroup 1 waits, reads a word the other wrote, stores its own and
 * signals back, warpgroup 0 waits and reads. A round trip is two hand-offs, each with the
 * store before and the load after it, as the forward's P hand-off has them. Kinds:
 *   mbar128  mbarrier of 128 arrivals (every thread of the sender; the forward's pready)
 *   mbar4    mbarrier of 4 arrivals (lane 0 of each warp after __syncwarp)
 *   named    bar.arrive id, 256 by the sender, bar.sync id, 256 by the receiver
 *   fence    mbar128 with fence.proxy.async after the stores (what a P hand-off to wgmma
 *            needs) and after the wait
 * Prints ns a hand-off (half a round trip, globaltimer) and SM cycles (clock64) beside it.
 *
 *   build/handoff_bench [--iters 20000] [--reps 5] [--blocks 1]
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/sm90/wgmma.cuh"

#define BENCH_NAME "handoff_bench"
#include "bench_ck.cuh"

enum { K_MBAR128, K_MBAR4, K_NAMED, K_FENCE, K_COUNT };
static const char *const KIND_NAME[K_COUNT] = {"mbar128", "mbar4", "named", "fence"};

__device__ __forceinline__ uint64_t gtimer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* The sender's signal for round i (bar: the mbarrier, id: the named barrier). */
template <int KIND>
__device__ __forceinline__ void signal(uint32_t bar, int id) {
  if (KIND == K_NAMED) {
    named_bar_arrive(id, 256);
  } else if (KIND == K_MBAR4) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
  } else {
    if (KIND == K_FENCE) fence_proxy_async();
    mbar_arrive(bar);
  }
}

template <int KIND>
__device__ __forceinline__ void await(uint32_t bar, int id, uint32_t parity) {
  if (KIND == K_NAMED) {
    named_bar_sync(id, 256);
  } else {
    mbar_wait(bar, parity);
    if (KIND == K_FENCE) fence_proxy_async();
  }
}

/* out[block]: {globaltimer ns, clock64 cycles} of warpgroup 0's thread 0 over the loop;
 * sink keeps the loads. */
template <int KIND>
__global__ void __launch_bounds__(256, 1) k_pingpong(int iters, unsigned long long *out,
                                                      uint32_t *sink) {
  __shared__ __align__(8) uint64_t bars[2];
  __shared__ uint32_t box[2][128];
  const uint32_t b0 = (uint32_t)__cvta_generic_to_shared(&bars[0]);
  const uint32_t b1 = (uint32_t)__cvta_generic_to_shared(&bars[1]);
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  if (threadIdx.x == 0) {
    const uint32_t count = KIND == K_MBAR4 ? 4u : 128u;
    mbar_init(b0, count);
    mbar_init(b1, count);
  }
  __syncthreads();
  uint32_t acc = 0;
  uint64_t g0 = 0, c0 = 0;
  if (wg == 0 && t == 0) g0 = gtimer(), c0 = clock64();
#pragma unroll 1
  for (int i = 0; i < iters; i++) {
    const uint32_t par = (uint32_t)i & 1u;
    if (wg == 0) {
      box[0][t] = (uint32_t)i + acc;
      signal<KIND>(b0, 1);
      await<KIND>(b1, 2, par);
      acc += box[1][127 - t];
    } else {
      await<KIND>(b0, 1, par);
      acc += box[0][127 - t];
      box[1][t] = (uint32_t)i + acc;
      signal<KIND>(b1, 2);
    }
  }
  if (wg == 0 && t == 0) {
    out[2 * blockIdx.x] = gtimer() - g0;
    out[2 * blockIdx.x + 1] = clock64() - c0;
  }
  sink[blockIdx.x * 256 + threadIdx.x] = acc;
}

typedef void (*kern_t)(int, unsigned long long *, uint32_t *);

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int iters = 20000, reps = 5, blocks = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: handoff_bench [--iters N] [--reps R] [--blocks B]\n");
      return 2;
    }
  }
  if (iters < 2 || reps < 1 || reps > 64 || blocks < 1) {
    fprintf(stderr, "handoff_bench: --iters >= 2, --reps 1..64, --blocks >= 1\n");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    fprintf(stderr, "handoff_bench: needs an sm_90 device (found sm_%d%d)\n", prop.major,
            prop.minor);
    return 1;
  }
  unsigned long long *d_out;
  uint32_t *d_sink;
  CK(cudaMalloc(&d_out, sizeof(unsigned long long) * 2 * (size_t)blocks));
  CK(cudaMalloc(&d_sink, sizeof(uint32_t) * 256 * (size_t)blocks));
  unsigned long long *h_out = (unsigned long long *)malloc(sizeof *h_out * 2 * (size_t)blocks);
  if (!h_out) return 1;
  const kern_t kerns[K_COUNT] = {k_pingpong<K_MBAR128>, k_pingpong<K_MBAR4>,
                                 k_pingpong<K_NAMED>, k_pingpong<K_FENCE>};
  printf("%s, %d SMs; %d blocks, %d round trips a launch, median of %d launches\n", prop.name,
         prop.multiProcessorCount, blocks, iters, reps);
  printf("%-8s %12s %14s\n", "kind", "ns/handoff", "cycles/handoff");
  for (int k = 0; k < K_COUNT; k++) {
    double ns[64], cyc[64];
    kerns[k]<<<blocks, 256>>>(2, d_out, d_sink); /* warm-up */
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; r++) {
      kerns[k]<<<blocks, 256>>>(iters, d_out, d_sink);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h_out, d_out, sizeof *h_out * 2 * (size_t)blocks, cudaMemcpyDeviceToHost));
      double gmax = 0.0, cmax = 0.0; /* the slowest block's */
      for (int b = 0; b < blocks; b++) {
        if ((double)h_out[2 * b] > gmax) gmax = (double)h_out[2 * b];
        if ((double)h_out[2 * b + 1] > cmax) cmax = (double)h_out[2 * b + 1];
      }
      ns[r] = gmax / (2.0 * iters);
      cyc[r] = cmax / (2.0 * iters);
    }
    qsort(ns, (size_t)reps, sizeof ns[0], cmp_double);
    qsort(cyc, (size_t)reps, sizeof cyc[0], cmp_double);
    printf("%-8s %12.1f %14.1f\n", KIND_NAME[k], ns[reps / 2], cyc[reps / 2]);
  }
  free(h_out);
  CK(cudaFree(d_out));
  CK(cudaFree(d_sink));
  return 0;
}
