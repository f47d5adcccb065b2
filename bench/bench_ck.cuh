/*
 * bench_ck.cuh: the error check of the CUDA microbenchmarks in bench/. CK(call): a failed
 * runtime call prints the program (BENCH_NAME, defined by the includer), the call and the
 * error, and exits 1.
 */
#ifndef SMLA_BENCH_CK_CUH
#define SMLA_BENCH_CK_CUH

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name) before including bench_ck.cuh"
#endif

#define CK(call)                                                                           \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s: %s failed: %s\n", BENCH_NAME, #call, cudaGetErrorString(e_));   \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#endif
