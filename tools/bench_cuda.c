/*
 * bench_cuda.c: the tool's direct CUDA runtime and cuBLAS calls (built only with CUDA).
 * Memory and copies for `smla check` / `smla bench` on a GPU, CUDA-event and CUDA-graph
 * timing, and the two measured ceilings behind the percent-of-roofline columns.
 */
#include "bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_TRY(call)                                                                    \
  do {                                                                                    \
    const cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "smla: %s failed: %s (%s)\n", #call, cudaGetErrorString(e_),        \
              cudaGetErrorName(e_));                                                      \
      goto fail;                                                                          \
    }                                                                                     \
  } while (0)

/* Ceiling sizes: a 1 GiB copy runs ~0.5 ms at 4.3 TB/s, long past launch overhead and
 * 18x the L2; an 8192^3 bf16 product is 1.1 TFLOP, ~1.4 ms at 790 TFLOP/s. */
#define CEIL_COPY_BYTES ((size_t)1 << 30)
#define CEIL_GEMM_N 8192
#define CEIL_WARMUP 3
#define CEIL_SAMPLES 10

int tool_cuda_device_count(char *why, size_t why_bytes) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, why_bytes, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
  }
  if (n == 0) snprintf(why, why_bytes, "the CUDA runtime sees no device");
  return n;
}

int tool_cuda_set_device(int device) {
  CUDA_TRY(cudaSetDevice(device));
  return 0;
fail:
  return -1;
}

int tool_cuda_stream_create(void **stream) {
  cudaStream_t s = NULL;
  /* Non-blocking: no implicit sync with the legacy stream, and capturable. */
  CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = s;
  return 0;
fail:
  return -1;
}

void tool_cuda_stream_destroy(void *stream) { cudaStreamDestroy((cudaStream_t)stream); }

int tool_cuda_malloc(void **p, size_t bytes) {
  *p = NULL;
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess) {
    fprintf(stderr, "smla: cudaMalloc of %zu bytes failed: %s\n", bytes, cudaGetErrorString(e));
    *p = NULL;
    return -1;
  }
  return 0;
}

void tool_cuda_free(void *p) { cudaFree(p); }

int tool_cuda_copy(void *stream, void *dst, const void *src, size_t bytes, int dir) {
  static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                              cudaMemcpyDeviceToDevice};
  /* Async on the tool's stream, then a stream sync: ordered with the smla calls on that
   * stream, and complete (pageable host memory included) when this returns. */
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kinds[dir], (cudaStream_t)stream));
  CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
  return 0;
fail:
  return -1;
}

int tool_cuda_memset(void *stream, void *dst, int byte, size_t bytes) {
  CUDA_TRY(cudaMemsetAsync(dst, byte, bytes, (cudaStream_t)stream));
  CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
  return 0;
fail:
  return -1;
}

int tool_cuda_sync(void *stream) {
  CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
  CUDA_TRY(cudaGetLastError());
  return 0;
fail:
  return -1;
}

/* What both timings hold: the graph, its executable, the two events (NULL: not made). */
static void timing_release(cudaGraphExec_t exec, cudaGraph_t graph, cudaEvent_t e0,
                           cudaEvent_t e1) {
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
}

/* Captures calls 0..count-1 of fn into *graph and instantiates it. 0, -1 on a CUDA error
 * (printed), or the smla_status fn returned (the capture is ended, the stream usable). */
static int capture(cudaStream_t s, tool_launch_fn fn, void *arg, int count, cudaGraph_t *graph,
                   cudaGraphExec_t *exec) {
  CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < count; i++) {
    const int r = fn(arg, i, (void *)s);
    if (r) {
      cudaStreamEndCapture(s, graph);
      return r;
    }
  }
  CUDA_TRY(cudaStreamEndCapture(s, graph));
  CUDA_TRY(cudaGraphInstantiate(exec, *graph, 0));
  return 0;
fail:
  return -1;
}

int tool_cuda_time(void *stream, tool_launch_fn fn, void *arg, int use_graph, int per_graph,
                   int warmup, int samples, double *sample_us) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int rc = -1;
  CUDA_TRY(cudaEventCreate(&e0));
  CUDA_TRY(cudaEventCreate(&e1));
  if (use_graph) {
    if ((rc = capture(s, fn, arg, per_graph, &graph, &exec)) != 0) goto fail;
    rc = -1;
    for (int i = 0; i < warmup; i++) CUDA_TRY(cudaGraphLaunch(exec, s));
    CUDA_TRY(cudaStreamSynchronize(s));
    for (int i = 0; i < samples; i++) {
      float ms = 0;
      CUDA_TRY(cudaEventRecord(e0, s));
      CUDA_TRY(cudaGraphLaunch(exec, s));
      CUDA_TRY(cudaEventRecord(e1, s));
      CUDA_TRY(cudaEventSynchronize(e1));
      CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
      sample_us[i] = 1e3 * (double)ms / per_graph;
    }
  } else {
    for (int i = 0; i < warmup; i++) {
      const int r = fn(arg, i, stream);
      if (r) {
        rc = r;
        goto fail;
      }
    }
    CUDA_TRY(cudaStreamSynchronize(s));
    for (int i = 0; i < samples; i++) {
      float ms = 0;
      CUDA_TRY(cudaEventRecord(e0, s));
      const int r = fn(arg, warmup + i, stream);
      if (r) {
        rc = r;
        goto fail;
      }
      CUDA_TRY(cudaEventRecord(e1, s));
      CUDA_TRY(cudaEventSynchronize(e1));
      CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
      sample_us[i] = 1e3 * (double)ms;
    }
  }
  CUDA_TRY(cudaGetLastError());
  rc = 0;
fail:
  timing_release(exec, graph, e0, e1);
  return rc;
}

int tool_cuda_time_cold(void *stream, tool_launch_fn fn, void *arg, void *flush,
                        size_t flush_bytes, int warmup, int samples, double *sample_us) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int rc = -1;
  CUDA_TRY(cudaEventCreate(&e0));
  CUDA_TRY(cudaEventCreate(&e1));
  if ((rc = capture(s, fn, arg, 1, &graph, &exec)) != 0) goto fail;
  rc = -1;
  for (int i = 0; i < warmup + samples; i++) {
    float ms = 0;
    /* The zeroing evicts the L2 (256 MiB over a 50-60 MB L2) and is not timed. */
    CUDA_TRY(cudaMemsetAsync(flush, 0, flush_bytes, s));
    CUDA_TRY(cudaEventRecord(e0, s));
    CUDA_TRY(cudaGraphLaunch(exec, s));
    CUDA_TRY(cudaEventRecord(e1, s));
    CUDA_TRY(cudaEventSynchronize(e1));
    CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= warmup) sample_us[i - warmup] = 1e3 * (double)ms;
  }
  CUDA_TRY(cudaGetLastError());
  rc = 0;
fail:
  timing_release(exec, graph, e0, e1);
  return rc;
}

int tool_cuda_ceilings(void *stream, double *copy_bytes_per_s, double *gemm_flop_per_s) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cublasHandle_t blas = NULL;
  void *src = NULL, *dst = NULL, *a = NULL, *b = NULL, *c = NULL;
  uint16_t *host = NULL;
  double ms[CEIL_SAMPLES];
  float elapsed = 0;
  const size_t n = CEIL_GEMM_N, mat_bytes = n * n * 2;
  int rc = -1;
  CUDA_TRY(cudaEventCreate(&e0));
  CUDA_TRY(cudaEventCreate(&e1));

  /* Copy: what a gather-bound kernel can at best stream from HBM. */
  CUDA_TRY(cudaMalloc(&src, CEIL_COPY_BYTES));
  CUDA_TRY(cudaMalloc(&dst, CEIL_COPY_BYTES));
  CUDA_TRY(cudaMemsetAsync(src, 0x3c, CEIL_COPY_BYTES, s));
  for (int i = 0; i < CEIL_WARMUP + CEIL_SAMPLES; i++) {
    CUDA_TRY(cudaEventRecord(e0, s));
    CUDA_TRY(cudaMemcpyAsync(dst, src, CEIL_COPY_BYTES, cudaMemcpyDeviceToDevice, s));
    CUDA_TRY(cudaEventRecord(e1, s));
    CUDA_TRY(cudaEventSynchronize(e1));
    CUDA_TRY(cudaEventElapsedTime(&elapsed, e0, e1));
    if (i >= CEIL_WARMUP) ms[i - CEIL_WARMUP] = elapsed;
  }
  *copy_bytes_per_s = 2.0 * (double)CEIL_COPY_BYTES / (1e-3 * tool_median(ms, CEIL_SAMPLES));
  cudaFree(src);
  cudaFree(dst);
  src = dst = NULL;

  /* GEMM: the tensor-core rate on random bf16 (zeros would run faster: less power). */
  host = malloc(mat_bytes);
  if (!host) {
    fprintf(stderr, "smla: out of host memory\n");
    goto fail;
  }
  CUDA_TRY(cudaMalloc(&a, mat_bytes));
  CUDA_TRY(cudaMalloc(&b, mat_bytes));
  CUDA_TRY(cudaMalloc(&c, mat_bytes));
  tool_rng rng;
  tool_rng_seed(&rng, 12345);
  tool_fill_bf16(&rng, host, n * n, 1.0f);
  CUDA_TRY(cudaMemcpyAsync(a, host, mat_bytes, cudaMemcpyHostToDevice, s));
  CUDA_TRY(cudaStreamSynchronize(s));
  tool_fill_bf16(&rng, host, n * n, 1.0f);
  CUDA_TRY(cudaMemcpyAsync(b, host, mat_bytes, cudaMemcpyHostToDevice, s));
  CUDA_TRY(cudaStreamSynchronize(s));
  cublasStatus_t bs = cublasCreate(&blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(blas, s);
  const float alpha = 1.0f, beta = 0.0f;
  for (int i = 0; bs == CUBLAS_STATUS_SUCCESS && i < CEIL_WARMUP + CEIL_SAMPLES; i++) {
    CUDA_TRY(cudaEventRecord(e0, s));
    bs = cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &alpha, a,
                      CUDA_R_16BF, (int)n, b, CUDA_R_16BF, (int)n, &beta, c, CUDA_R_16BF,
                      (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CUDA_TRY(cudaEventRecord(e1, s));
    CUDA_TRY(cudaEventSynchronize(e1));
    CUDA_TRY(cudaEventElapsedTime(&elapsed, e0, e1));
    if (i >= CEIL_WARMUP) ms[i - CEIL_WARMUP] = elapsed;
  }
  if (bs != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "smla: cuBLAS failed: %s\n", cublasGetStatusString(bs));
    goto fail;
  }
  *gemm_flop_per_s = 2.0 * (double)n * n * n / (1e-3 * tool_median(ms, CEIL_SAMPLES));
  rc = 0;
fail:
  if (blas) cublasDestroy(blas);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  free(host);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return rc;
}
