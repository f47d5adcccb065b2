/*
 * devmem.h: a tiny memory shim for the tests, so one test case can run on any context.
 * device is SMLA_DEVICE_CPU (-1: host memory, malloc/memcpy) or a CUDA ordinal (>= 0:
 * cudaMalloc/cudaMemcpy; only when the tests are built with -DSMLA_HAVE_CUDA, otherwise
 * every call on a CUDA device fails). Allocations are 256-byte aligned on both.
 * Calls return 0 on success and -1 on failure (dm_error() then says why).
 */
#ifndef SMLA_TEST_DEVMEM_H
#define SMLA_TEST_DEVMEM_H

#include <stddef.h>

/* `bytes` of device memory (0 is allowed and gives a valid pointer), or NULL. */
void *dm_alloc(int device, size_t bytes);
/* NULL is a no-op. */
void dm_free(int device, void *ptr);
/* host src -> device dst */
int dm_upload(int device, void *dst, const void *src, size_t bytes);
/* device src -> host dst */
int dm_download(int device, void *dst, const void *src, size_t bytes);
/* every byte of ptr[0, bytes) := value */
int dm_memset(int device, void *ptr, int value, size_t bytes);
/* waits for the device's work (CUDA: cudaDeviceSynchronize) and reports a pending error */
int dm_sync(int device);
/* what the last failing call said (static string) */
const char *dm_error(void);

#endif /* SMLA_TEST_DEVMEM_H */
