/*
 * internal.h: what the API layer (src/api.c) and the backends (src/cpu, src/cuda) share.
 *
 * Layering: api.c validates every argument (shapes, strides, alignment, pointers) before it
 * calls a backend, so a backend may assume valid params and only has to be right about
 * device data (hostile slots, indices, NaN). Backends never include api.c's helpers other
 * than smla_set_error().
 */
#ifndef SMLA_INTERNAL_H
#define SMLA_INTERNAL_H

#include "smla.h"

#include <stdarg.h>

#define SMLA_MSG_BYTES 512
#define SMLA_DESCRIBE_BYTES SMLA_DESCRIBE_MAX

/* e4m3 (E4M3FN) largest finite value: the saturation bound of every fp8 writer. */
#define SMLA_E4M3_MAX 448.0f
/* FP8_DS: Dc is quantized in 4 groups of 128 values, one float scale each. */
#define SMLA_DS_GROUP 128
#define SMLA_DS_GROUPS (SMLA_DC / SMLA_DS_GROUP)
/* FP8_DS scale floor from the SPEC's rule 2^ceil(log2(max(amax/448, 1e-4))). */
#define SMLA_DS_MIN_SCALE_ARG 1e-4f

typedef struct smla_backend smla_backend;

struct smla_context {
  int device;                     /* SMLA_DEVICE_CPU or CUDA ordinal */
  int num_threads;                /* CPU: workers per call (resolved, >= 1) */
  const smla_backend *backend;
  void *backend_state;            /* backend-owned (CUDA: cached device properties) */
  char message[SMLA_MSG_BYTES];
};

struct smla_plan {
  smla_context *ctx;
  smla_plan_desc desc;
  void *workspace;
  size_t workspace_bytes;
  int owns_workspace;             /* 1: allocated by the plan, freed on destroy */
  char describe[SMLA_DESCRIBE_BYTES];
  /* Backend choices, filled by backend->plan_init from shapes alone. */
  int num_splits;                 /* KV splits per row (>= 1) */
  int heads_per_block;            /* CUDA: heads per block; CPU: heads per work item */
  int kernel;                     /* backend-specific kernel id */
  int merge_clusters[9];          /* CUDA: clusters of s blocks resident at once, s 2..8
                                     (0: none; all 0: every split uses the combine) */
  int combine_pdl;                /* CUDA: the combine may be a programmatic dependent */
  int forward_pdl;                /* CUDA generic kernel: launched as a programmatic
                                     dependent of the stream's previous kernel */
  /* CUDA: workspace layout. partial_rows (t, split) rows of partial state from offset 0;
   * the generic kernel's in-kernel merge counters (int32, zero between forwards, zeroed by
   * backend->plan_ready) at counters_offset, counter_rows x groups x 8 of them. */
  int64_t partial_rows;
  size_t counters_offset;
  int64_t counter_rows;
  /* CUDA: the KV split of every T, chosen once at plan creation (the forward only looks it
   * up). T <= split_rows: split_table[T - 1], bits 0-6 the split count (the cost model's
   * at most 64), bit 7 set when the splits merge inside the kernel; T > split_rows:
   * split_rest splits (a forced count may be up to 1024: no flag bits in it), merged in the
   * kernel when split_rest_merged. Owned by the plan (freed by smla_plan_destroy); NULL
   * where every T splits alike. */
  uint8_t *split_table;
  int64_t split_rows;
  int split_rest, split_rest_merged;
  int split_len_rest;             /* CUDA: entries per split of split_rest (forced splits
                                     need not be whole tiles) */
  int num_threads;                /* CPU: workers (fixed at plan creation) */
  /* CUDA: the plan of another kernel for T <= small_t_rows (the generic kernel, where the
   * small-head sm90 kernel is slower at few rows), its workspace region from small_t_offset
   * of this plan's; NULL: one kernel for every T. Owned by the plan (smla_plan_destroy). */
  struct smla_plan *small_t;
  int64_t small_t_rows;
  size_t small_t_offset;
};

/* One const table per backend (ggml style). Params are validated before these run. */
struct smla_backend {
  const char *name;
  smla_status (*init)(smla_context *ctx);            /* may be NULL */
  void (*fini)(smla_context *ctx);                   /* may be NULL */
  smla_status (*convert)(smla_context *ctx, const smla_convert_params *p, void *stream);
  smla_status (*cache_write)(smla_context *ctx, const smla_cache_write_params *p,
                             void *stream);
  smla_status (*merge)(smla_context *ctx, const smla_merge_params *p, void *stream);
  /* Fills plan->num_splits, heads_per_block, kernel, describe; sets *workspace_bytes.
   * Called once per smla_plan_workspace_size and smla_plan_create, before any workspace
   * exists (plan->workspace == NULL). The CUDA one also sets the kernel's shared-memory
   * attribute, so a size query has that (idempotent) side effect too. */
  smla_status (*plan_init)(smla_plan *plan, size_t *workspace_bytes);
  /* indices != NULL (smla_forward_indices): p->slots is NULL and each row's slots are the
   * conversion (compact = 0) of indices->local; both already validated. */
  smla_status (*forward)(smla_plan *plan, const smla_forward_params *p,
                         const smla_convert_params *indices, void *stream);
  /* After the plan has its workspace (its own or the caller's): what it must hold before
   * the first forward (CUDA: the merge counters zeroed). May be NULL. */
  smla_status (*plan_ready)(smla_plan *plan);
  smla_status (*alloc)(smla_context *ctx, size_t bytes, void **ptr);
  void (*free)(smla_context *ctx, void *ptr);
  /* SMLA_OK, or SMLA_ERR_CAPTURING when the calling thread is capturing. May be NULL. */
  smla_status (*check_not_capturing)(smla_context *ctx);
};

extern const smla_backend smla_cpu_backend;
#ifdef SMLA_HAVE_CUDA
extern const smla_backend smla_cuda_backend;
int smla_cuda_count(void);
smla_status smla_cuda_name(int device, char *buf, size_t buf_bytes);
#endif

/* Frees a plan's host memory: the struct, its split table and its few-rows chain (the
 * plans in small_t, each with its own), not its workspace. For plans made by a backend's
 * plan_init on calloc'ed structs (smla_plan_create's, and the CUDA plan's chain). */
void smla_plan_free_host(smla_plan *plan);

/* Records a message on ctx (may be NULL) and returns status. printf-style. */
smla_status smla_set_error(smla_context *ctx, smla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif /* SMLA_INTERNAL_H */
