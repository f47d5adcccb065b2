/*
 * backend.c: the CPU backend's table, its allocator and its worker threads.
 *
 * Threads are started per call and joined before the call returns (a call costs ~20 µs
 * per extra thread, noise next to a forward). Work is handed out through one atomic
 * counter, so uneven rows balance themselves.
 */
#include "cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
  smla_cpu_task fn;
  void *arg;
  int64_t num_items;
  atomic_llong next;
} pool_job;

typedef struct {
  pool_job *job;
  int worker;
} pool_worker;

static void run_items(pool_job *job, int worker) {
  for (;;) {
    const int64_t item = atomic_fetch_add(&job->next, 1);
    if (item >= job->num_items) return;
    job->fn(job->arg, item, worker);
  }
}

static void *worker_main(void *p) {
  pool_worker *w = p;
  run_items(w->job, w->worker);
  return NULL;
}

/* At most this many workers are started for one call. */
#define MAX_WORKERS 256

void smla_cpu_parallel(int num_threads, int64_t num_items, smla_cpu_task fn, void *arg) {
  pool_job job = {.fn = fn, .arg = arg, .num_items = num_items};
  atomic_init(&job.next, 0);
  int n = num_threads < 1 ? 1 : (num_threads > MAX_WORKERS ? MAX_WORKERS : num_threads);
  if (n > num_items) n = (int)(num_items < 1 ? 1 : num_items);
  pthread_t tid[MAX_WORKERS];
  pool_worker w[MAX_WORKERS];
  int started = 0;
  for (int i = 1; i < n; i++) {
    w[i].job = &job;
    w[i].worker = i;
    if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) break; /* fewer workers */
    started = i;
  }
  run_items(&job, 0);
  for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
}

static smla_status cpu_alloc(smla_context *ctx, size_t bytes, void **ptr) {
  /* 256-byte alignment as for caller-provided workspaces. */
  size_t rounded = (bytes + 255) & ~(size_t)255;
  *ptr = aligned_alloc(256, rounded ? rounded : 256);
  if (!*ptr)
    return smla_set_error(ctx, SMLA_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu bytes", bytes);
  return SMLA_OK;
}

static void cpu_free(smla_context *ctx, void *ptr) {
  (void)ctx;
  free(ptr);
}

const smla_backend smla_cpu_backend = {
    .name = "cpu",
    .init = NULL,
    .fini = NULL,
    .convert = smla_cpu_convert,
    .cache_write = smla_cpu_cache_write,
    .merge = smla_cpu_merge,
    .plan_init = smla_cpu_plan_init,
    .forward = smla_cpu_forward,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .check_not_capturing = NULL,
};
