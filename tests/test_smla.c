/*
 * test_smla.c: the test driver's main. Every op on every backend (the CPU always, CUDA
 * device 0 when there is one) against the double-precision reference (tests/ref.c), CUDA
 * also against the CPU backend.
 *
 *   build/test_smla                       all cases, fresh random inputs (seed printed)
 *   build/test_smla --seed N              replay a run (or SMLA_TEST_SEED=N)
 *   build/test_smla --filter forward_K    only cases whose name contains the string
 *                                         (comma-separated: any of them, "forward,merge")
 *   build/test_smla --fail-fast           stop at the first failed case (scripts/mutants.py)
 *   build/test_smla --list                case names
 *
 * First line: the seed. Last line: "N passed, M failed, K skipped" (one count per case and
 * backend it ran on or would have run on: without a GPU every case's CUDA run, and the two
 * CUDA-only checks, are counted as skipped; a case that tests nothing a backend has, such
 * as forced KV splits on the CPU, reports "skip" there); the exit status is 1 when
 * anything failed.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The CUDA-graph capture/replay test (tests/graph_cuda.h, graph_cuda.c), built only with
 * CUDA: it returns its number of failed checks. */
#ifdef SMLA_HAVE_CUDA
#include "graph_cuda.h"
#include "stress_cuda.h"
#endif

static void usage(void) {
  printf("usage: test_smla [--seed N] [--filter SUBSTRING[,SUBSTRING...]] [--fail-fast] [--list]\n"
         "  SMLA_TEST_SEED=N in the environment replays a run too (--seed wins).\n");
}

static int parse_seed(const char *s, uint64_t *seed) {
  char *end = NULL;
  const unsigned long long v = strtoull(s, &end, 0);
  if (!s[0] || !end || *end) return 0;
  *seed = (uint64_t)v;
  return 1;
}

static uint64_t fresh_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
  x ^= x >> 31; /* keep it short enough to type: 48 bits */
  return x & 0xffffffffffffull;
}

int main(int argc, char **argv) {
  const char *filter = NULL;
  int list = 0, have_seed = 0, fail_fast = 0;
  uint64_t seed = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      if (!parse_seed(argv[++i], &seed)) {
        fprintf(stderr, "test_smla: --seed wants a number, got \"%s\"\n", argv[i]);
        return 2;
      }
      have_seed = 1;
    } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
      filter = argv[++i];
    } else if (!strcmp(argv[i], "--fail-fast")) {
      fail_fast = 1;
    } else if (!strcmp(argv[i], "--list")) {
      list = 1;
    } else {
      usage();
      return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
    }
  }
  const char *env = getenv("SMLA_TEST_SEED");
  if (!have_seed && env && env[0]) {
    if (!parse_seed(env, &seed)) {
      fprintf(stderr, "test_smla: SMLA_TEST_SEED wants a number, got \"%s\"\n", env);
      return 2;
    }
    have_seed = 1;
  }
  if (!have_seed) seed = fresh_seed();

  t_register_forward_cases();
  t_register_forward_more_cases();
  t_register_cache_cases();
  t_register_ops_cases();
  t_register_meta_cases();
  t_register_validate_cases();
  t_register_dcp_cases();
  int passed = 0, failed = 0, skipped = 0;
  if (list) {
    t_run_cases(filter, seed, 1, 0, &passed, &failed, &skipped);
    return 0;
  }

  printf("seed: %llu (replay: test_smla --seed %llu%s%s)\n", (unsigned long long)seed,
         (unsigned long long)seed, filter ? " --filter " : "", filter ? filter : "");
  printf("smla %s, features: %s\n", smla_version_string(), smla_build_features());

  g_backends[T_CPU].name = "cpu";
  g_backends[T_CPU].device = SMLA_DEVICE_CPU;
  g_backends[T_CPU].create_status = smla_context_create(&g_backends[T_CPU].ctx, SMLA_DEVICE_CPU);
  g_num_backends = 1;
  if (g_backends[T_CPU].create_status != SMLA_OK)
    printf("CPU context: smla_context_create failed: %s\n",
           smla_status_string(g_backends[T_CPU].create_status));

  const int built_with_cuda = strstr(smla_build_features(), "cuda") != NULL;
  const int gpus = smla_cuda_device_count();
  if (gpus > 0) {
    char name[256] = "";
    smla_cuda_device_name(0, name, sizeof name);
    g_backends[T_CUDA].name = "cuda:0";
    g_backends[T_CUDA].device = 0;
    g_backends[T_CUDA].create_status = smla_context_create(&g_backends[T_CUDA].ctx, 0);
    g_num_backends = 2;
    printf("GPU tests: cuda:0 = %s (%d device%s visible)%s%s\n", name, gpus, gpus > 1 ? "s" : "",
           g_backends[T_CUDA].create_status == SMLA_OK ? "" : "; smla_context_create failed: ",
           g_backends[T_CUDA].create_status == SMLA_OK
               ? "" : smla_status_string(g_backends[T_CUDA].create_status));
  } else {
    printf("GPU tests: SKIPPED (no CUDA device; built with CUDA: %s)\n", built_with_cuda ? "yes" : "no");
  }
  fflush(stdout);

  const double t0 = t_now_ms();
  int matched = t_run_cases(filter, seed, 0, fail_fast, &passed, &failed, &skipped);
  /* Without a GPU, each matched case's CUDA run (and the graph and stress checks below)
   * did not happen: counted as skipped, so the closing line says so. */
  int gpu_skipped = 0;
  if (gpus <= 0) {
    gpu_skipped = matched;
    if (t_filter_match(filter, "cuda_graph")) gpu_skipped++;
    if (t_filter_match(filter, "cuda_stress")) gpu_skipped++;
    skipped += gpu_skipped;
  }

#ifdef SMLA_HAVE_CUDA
  /* Counted like a case: passed once, or failed once per failed check. */
  if (gpus > 0 && t_filter_match(filter, "cuda_graph") && !(fail_fast && failed)) {
    const double g0 = t_now_ms();
    matched++;
    const int graph_failures = smla_test_cuda_graph(seed);
    if (graph_failures) failed += graph_failures;
    else passed++;
    printf("%s cuda_graph [cuda:0]", graph_failures ? "FAIL" : "ok  ");
    if (graph_failures) printf(" (%d failed checks)", graph_failures);
    printf(" %.0f ms\n", t_now_ms() - g0);
  }
  /* Determinism, batch invariance (and its cost), multi-thread multi-stream concurrency. */
  if (gpus > 0 && t_filter_match(filter, "cuda_stress") && !(fail_fast && failed)) {
    const double g0 = t_now_ms();
    matched++;
    const int stress_failures = smla_test_cuda_stress(seed);
    if (stress_failures) failed += stress_failures;
    else passed++;
    printf("%s cuda_stress [cuda:0]", stress_failures ? "FAIL" : "ok  ");
    if (stress_failures) printf(" (%d failed checks)", stress_failures);
    printf(" %.0f ms\n", t_now_ms() - g0);
  }
#endif

  if (!matched) { /* a typo in --filter must not look like a green run */
    printf("FAIL: no case matches --filter \"%s\"\n", filter ? filter : "");
    failed++;
  }
  printf("time: %.1f s\n", (t_now_ms() - t0) / 1000.0);
  for (int b = 0; b < g_num_backends; b++) smla_context_destroy(g_backends[b].ctx);
  if (gpu_skipped)
    printf("GPU: %d case runs SKIPPED (no CUDA device: each case's cuda:0 run and the "
           "CUDA-only checks)\n", gpu_skipped);
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  fflush(stdout);
  return failed ? 1 : 0;
}
