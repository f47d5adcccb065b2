/*
 * graph_cuda.h: the CUDA-graph test (tests/graph_cuda.c), built into build/test_smla only
 * when the library is built with CUDA (the Makefile compiles the tests named *_cuda.c then).
 *
 * The test driver calls it once per run, under #ifdef SMLA_HAVE_CUDA:
 *
 *     #ifdef SMLA_HAVE_CUDA
 *     #include "graph_cuda.h"
 *     ...
 *     failures += smla_test_cuda_graph(seed);
 *     #endif
 *
 * What it checks, for a BF16 and an FP8_DS cache (dr = 64): one smla_forward captured in
 * a CUDA graph (global capture mode) and replayed several times after slots, lengths and
 * the bad-input counter are rewritten in place on the device (cudaMemcpyAsync outside
 * the graph); every replay is compared with the CPU backend on the same inputs (out, lse,
 * max_logit, bad_inputs; unused cache rows are NaN). Also: smla_plan_create during the
 * capture returns SMLA_ERR_CAPTURING and leaves the capture valid.
 */
#ifndef SMLA_TEST_GRAPH_CUDA_H
#define SMLA_TEST_GRAPH_CUDA_H

#include <stdint.h>

/* Returns the number of failed checks (0: passed). With no CUDA device it prints
 * "graph_cuda: SKIPPED (...)" and returns 0. Prints one line per failure, at most a few. */
int smla_test_cuda_graph(uint64_t seed);

#endif /* SMLA_TEST_GRAPH_CUDA_H */
