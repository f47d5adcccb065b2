/*
 * cpu.h: private to the CPU backend (src/cpu/).
 */
#ifndef SMLA_CPU_H
#define SMLA_CPU_H

#include "internal.h"

/* Runs fn(arg, item, worker) for item in [0, num_items) on up to num_threads workers
 * (the calling thread is worker 0). If a thread can't start, the work is done by fewer
 * workers: always completely, never partially. */
typedef void (*smla_cpu_task)(void *arg, int64_t item, int worker);
void smla_cpu_parallel(int num_threads, int64_t num_items, smla_cpu_task fn, void *arg);

smla_status smla_cpu_convert(smla_context *ctx, const smla_convert_params *p, void *stream);
/* The slot of request r's local position pos (SPEC §1), or -1: one entry of the convert
 * op, which the forward's fused variant applies to each entry as it reads it. */
int32_t smla_cpu_convert_one(const smla_convert_params *p, int32_t r, int32_t pos);
smla_status smla_cpu_cache_write(smla_context *ctx, const smla_cache_write_params *p,
                                 void *stream);
smla_status smla_cpu_merge(smla_context *ctx, const smla_merge_params *p, void *stream);
smla_status smla_cpu_plan_init(smla_plan *plan, size_t *workspace_bytes);
smla_status smla_cpu_forward(smla_plan *plan, const smla_forward_params *p,
                             const smla_convert_params *indices, void *stream);

#endif
