/*
 * convert.cu: request-local token positions -> cache slots (SPEC §1).
 *
 * With cp_size >= 2 only the entries of rank cp_rank are kept, at their position in that
 * rank's own sequence (the context-parallel filter, smla.h).
 * One block per row t. Plain mode: each thread maps its entries independently (slots may
 * alias local: every element is read and written by the same thread). Compact mode: an
 * in-order stream compaction, 256 entries per step: a warp ballot gives each valid entry
 * its rank inside the warp, a prefix over the 8 warp counts (shared memory) its rank in
 * the step, and a running base carries the steps; then -1 fills the tail.
 * Bytes: K * (4 read + 4 written) per row; 2048 entries = 16 KB, memory-bound.
 */
#include "convert.cuh"

#define CONVERT_THREADS 256
#define CONVERT_WARPS (CONVERT_THREADS / 32)

__global__ void __launch_bounds__(CONVERT_THREADS)
    convert_kernel(const smla_cuda_convert_args a) {
  __shared__ int warp_count[CONVERT_WARPS];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t r = a.req_id[t];
  const int32_t *local = a.local + t * a.local_stride;
  int32_t *slots = a.slots + t * a.slots_stride;

  if (!a.compact) {
    int valid = 0;
    for (int k = tid; k < a.topk; k += CONVERT_THREADS) {
      const int32_t s = convert_one(a, r, local[k]);
      slots[k] = s;
      valid += s >= 0;
    }
    if (a.valid) {
      valid = __reduce_add_sync(0xffffffffu, (unsigned)valid);
      if (lane == 0) warp_count[warp] = valid;
      __syncthreads();
      if (tid == 0) {
        int total = 0;
        for (int w = 0; w < CONVERT_WARPS; w++) total += warp_count[w];
        a.valid[t] = total;
      }
    }
    return;
  }

  int base = 0; /* valid entries written so far (uniform across the block) */
  for (int k0 = 0; k0 < a.topk; k0 += CONVERT_THREADS) {
    const int k = k0 + tid;
    const int32_t s = k < a.topk ? convert_one(a, r, local[k]) : -1;
    const unsigned ballot = __ballot_sync(0xffffffffu, s >= 0);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, step = 0;
    for (int w = 0; w < CONVERT_WARPS; w++) {
      const int c = warp_count[w];
      before += w < warp ? c : 0;
      step += c;
    }
    if (s >= 0) slots[base + before + __popc(ballot & ((1u << lane) - 1u))] = s;
    base += step;
    __syncthreads(); /* warp_count is rewritten by the next step */
  }
  for (int k = base + tid; k < a.topk; k += CONVERT_THREADS) slots[k] = -1;
  if (tid == 0 && a.valid) a.valid[t] = base;
}

extern "C" cudaError_t smla_cuda_convert(const smla_cuda_convert_args *a, void *stream) {
  if (a->num_tokens <= 0) return cudaSuccess;
  if (a->num_tokens > INT_MAX) return cudaErrorInvalidValue; /* one block per row */
  convert_kernel<<<(unsigned)a->num_tokens, CONVERT_THREADS, 0, (cudaStream_t)stream>>>(*a);
  return cudaGetLastError();
}
