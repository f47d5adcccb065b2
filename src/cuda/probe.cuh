/*
 * probe.cuh: a measurement build's phase stamps (NVCC_EXTRA=-DSMLA_PROBE=1; never in the
 * library a user gets). Thread 0 of the first and the last block of a launch records up
 * to 8 %globaltimer stamps (ns) into its translation unit's ring; the tool that ran the
 * kernels prints the rings at exit through smla_probe_dump_<unit>() (tools/bench.c,
 * weak references), one line an event, for scripts/probe_chain.py to line up.
 * Without SMLA_PROBE every macro here is empty.
 */
#ifndef SMLA_CUDA_PROBE_CUH
#define SMLA_CUDA_PROBE_CUH

#ifndef SMLA_PROBE
#define SMLA_PROBE 0
#endif
/* SMLA_PROBE_NO_GATHER=1 (a diagnosis build, never a result): the sm90 64-head kernel's
 * gather warps skip their row copies (the stages keep whatever they held), so a run times
 * the tile chain with rows that are always there. */
#ifndef SMLA_PROBE_NO_GATHER
#define SMLA_PROBE_NO_GATHER 0
#endif
/* SMLA_PROBE_G=1 (with SMLA_PROBE=1; kind 13 in place of 12): the 64-head kernel's gather
 * warp 0 stamps the time it may refill a stage (its empty wait done), and compute thread 0
 * sums over its own tiles: t1 wait done - that stamp (the refill's start to the rows'
 * use: an upper bound of the rows' latency, the full wait included),
 * t2 wait start - stamp (where >= 0), t3 the count, t4 the full wait itself, t5 stamp -
 * wait start (where > 0: the refill began after the wait did). */
#ifndef SMLA_PROBE_G
#define SMLA_PROBE_G 0
#endif
/* Ablations of the 64-head kernel's tile step (diagnosis builds; wrong results): each takes
 * one piece off the relay chain, so that the time it saves is that piece's share.
 * SMLA_PROBE_NO_FENCE: no proxy fence after the waits on full and pready (the publisher's
 * stays); SMLA_PROBE_NO_EXP: the logits go to P without scaling or exponentials (the row
 * maxima stay); SMLA_PROBE_S_HALF: S over the first half of the column blocks only. */
#ifndef SMLA_PROBE_NO_FENCE
#define SMLA_PROBE_NO_FENCE 0
#endif
#ifndef SMLA_PROBE_NO_EXP
#define SMLA_PROBE_NO_EXP 0
#endif
#ifndef SMLA_PROBE_S_HALF
#define SMLA_PROBE_S_HALF 0
#endif
#if SMLA_PROBE_NO_GATHER || SMLA_PROBE_NO_FENCE || SMLA_PROBE_NO_EXP || SMLA_PROBE_S_HALF
#pragma message("smla: a diagnosis build (SMLA_PROBE_NO_GATHER / _NO_FENCE / _NO_EXP / " \
                "_S_HALF): the sm90 forward's results are wrong; time it, never use it")
#endif

#if SMLA_PROBE
#include <stdint.h>
#include <stdio.h>

#define PROBE_RING 16384
#define PROBE_STAMPS 8

typedef struct probe_event {
  unsigned long long t[PROBE_STAMPS];
  int kind, block, blocks, extra;
} probe_event;

/* Per translation unit (internal linkage): its kernels' events. */
static __device__ probe_event probe_ring[PROBE_RING];
static __device__ unsigned probe_next;

__device__ __forceinline__ unsigned long long probe_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#define PROBE_DECL unsigned long long probe_t_[PROBE_STAMPS] = {0, 0, 0, 0, 0, 0, 0, 0}
#define PROBE_STAMP(i) (probe_t_[(i)] = probe_now())
/* Records the stamps of thread 0 of the first and the last block. */
#define PROBE_PUT(kind_, extra_)                                                           \
  do {                                                                                     \
    if (threadIdx.x == 0 && (blockIdx.x == 0 || blockIdx.x == gridDim.x - 1)) {            \
      const unsigned i_ = atomicAdd(&probe_next, 1u) % PROBE_RING;                         \
      for (int k_ = 0; k_ < PROBE_STAMPS; k_++) probe_ring[i_].t[k_] = probe_t_[k_];       \
      probe_ring[i_].kind = (kind_);                                                       \
      probe_ring[i_].block = (int)blockIdx.x;                                              \
      probe_ring[i_].blocks = (int)gridDim.x;                                              \
      probe_ring[i_].extra = (extra_);                                                     \
    }                                                                                      \
  } while (0)

/* Prints this unit's ring (the last PROBE_RING events) to stderr. */
#define PROBE_DEFINE_DUMP(name_)                                                           \
  extern "C" void name_(void) {                                                            \
    static probe_event h[PROBE_RING];                                                      \
    unsigned n = 0;                                                                        \
    if (cudaDeviceSynchronize() != cudaSuccess ||                                          \
        cudaMemcpyFromSymbol(&n, probe_next, sizeof n) != cudaSuccess ||                   \
        cudaMemcpyFromSymbol(h, probe_ring, sizeof h) != cudaSuccess) {                    \
      fprintf(stderr, "probe: no ring\n");                                                 \
      return;                                                                              \
    }                                                                                      \
    const unsigned m = n < PROBE_RING ? n : PROBE_RING;                                    \
    for (unsigned i = 0; i < m; i++) {                                                     \
      const probe_event *e = &h[(n - m + i) % PROBE_RING];                                 \
      fprintf(stderr, "probe %d %d %d %d", e->kind, e->block, e->blocks, e->extra);        \
      for (int k = 0; k < PROBE_STAMPS; k++) fprintf(stderr, " %llu", e->t[k]);            \
      fprintf(stderr, "\n");                                                               \
    }                                                                                      \
  }
#else
#define PROBE_DECL
#define PROBE_STAMP(i)
#define PROBE_PUT(kind_, extra_)
#define PROBE_DEFINE_DUMP(name_)
#endif

#endif
