/*
 * stress_cuda.h: GPU reliability checks (tests/stress_cuda.c), built into build/test_smla
 * only with CUDA, like graph_cuda.h.
 *
 * - determinism: the same forward on the same plan twice gives bitwise identical out/lse;
 * - batch invariance: with SMLA_PLAN_BATCH_INVARIANT a row's out/lse are bitwise the same
 *   whether it runs alone, in a batch of 5 or of 48 (and the time cost of the flag is
 *   printed for T = 1, 8, 48 against the default plan);
 * - concurrency: 3 host threads, each with its own context, stream and plan (N = 16, 64,
 *   128) over one shared cache, running at once give bitwise the results each gave alone.
 */
#ifndef SMLA_TEST_STRESS_CUDA_H
#define SMLA_TEST_STRESS_CUDA_H

#include <stdint.h>

/* Returns the number of failed checks; prints "stress_cuda: SKIPPED" with no GPU. */
int smla_test_cuda_stress(uint64_t seed);

#endif
