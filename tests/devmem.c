/* devmem.c: see devmem.h. */
#include "devmem.h"

#include <stdlib.h>
#include <string.h>

#ifdef SMLA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define DM_ALIGN 256 /* cudaMalloc's alignment; the host path matches it */

static const char *dm_last_error = "";

const char *dm_error(void) { return dm_last_error; }

static int dm_fail(const char *what) {
  dm_last_error = what;
  return -1;
}

#ifdef SMLA_HAVE_CUDA
static int dm_cuda(cudaError_t e) {
  if (e == cudaSuccess) return 0;
  return dm_fail(cudaGetErrorString(e));
}
#endif

void *dm_alloc(int device, size_t bytes) {
  if (device < 0) {
    const size_t rounded = (bytes + DM_ALIGN - 1) / DM_ALIGN * DM_ALIGN;
    void *p = aligned_alloc(DM_ALIGN, rounded ? rounded : DM_ALIGN);
    if (!p) dm_fail("host allocation failed");
    return p;
  }
#ifdef SMLA_HAVE_CUDA
  void *p = NULL;
  if (dm_cuda(cudaSetDevice(device))) return NULL;
  if (dm_cuda(cudaMalloc(&p, bytes ? bytes : 1))) return NULL;
  return p;
#else
  dm_fail("built without CUDA");
  return NULL;
#endif
}

void dm_free(int device, void *ptr) {
  if (!ptr) return;
  if (device < 0) {
    free(ptr);
    return;
  }
#ifdef SMLA_HAVE_CUDA
  if (dm_cuda(cudaSetDevice(device)) == 0) (void)dm_cuda(cudaFree(ptr));
#endif
}

int dm_upload(int device, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return 0;
  if (device < 0) {
    memcpy(dst, src, bytes);
    return 0;
  }
#ifdef SMLA_HAVE_CUDA
  if (dm_cuda(cudaSetDevice(device))) return -1;
  return dm_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
#else
  return dm_fail("built without CUDA");
#endif
}

int dm_download(int device, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return 0;
  if (device < 0) {
    memcpy(dst, src, bytes);
    return 0;
  }
#ifdef SMLA_HAVE_CUDA
  if (dm_cuda(cudaSetDevice(device))) return -1;
  return dm_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#else
  return dm_fail("built without CUDA");
#endif
}

int dm_memset(int device, void *ptr, int value, size_t bytes) {
  if (bytes == 0) return 0;
  if (device < 0) {
    memset(ptr, value, bytes);
    return 0;
  }
#ifdef SMLA_HAVE_CUDA
  if (dm_cuda(cudaSetDevice(device))) return -1;
  return dm_cuda(cudaMemset(ptr, value, bytes));
#else
  return dm_fail("built without CUDA");
#endif
}

int dm_sync(int device) {
  if (device < 0) return 0;
#ifdef SMLA_HAVE_CUDA
  if (dm_cuda(cudaSetDevice(device))) return -1;
  if (dm_cuda(cudaDeviceSynchronize())) return -1;
  return dm_cuda(cudaGetLastError());
#else
  return dm_fail("built without CUDA");
#endif
}
