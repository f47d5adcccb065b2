/*
 * bench.h: what the parts of the `smla` command-line tool share.
 *
 *   tools/smla.c       main, `smla info`, `smla check` (forward vs a double reference)
 *   tools/bench.c      `smla bench`, plus the helpers below: random data, device memory,
 *                      argument parsing, filling a cache through smla_cache_write
 *   tools/bench_cuda.c CUDA runtime and cuBLAS calls (built only with CUDA): memory,
 *                      CUDA-event and CUDA-graph timing, the copy and matrix ceilings
 *
 * The tool uses the public API (smla.h) only; src/numerics.h is included for its bf16
 * rounding of random data. Tool code prints its own errors to stderr.
 */
#ifndef SMLA_TOOLS_BENCH_H
#define SMLA_TOOLS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "smla.h"

/* Exit codes of every subcommand. */
#define TOOL_EXIT_OK 0
#define TOOL_EXIT_FAIL 1  /* an smla call failed, a check failed, a resource was missing */
#define TOOL_EXIT_USAGE 2 /* bad command line */

/* ---- random numbers (splitmix64: small, fast, good enough for test data) ------------- */
typedef struct tool_rng {
  uint64_t state;
} tool_rng;

void tool_rng_seed(tool_rng *r, uint64_t seed);
uint64_t tool_rng_next(tool_rng *r);
/* Uniform in [0, n), n >= 1. */
uint64_t tool_rng_below(tool_rng *r, uint64_t n);
/* Uniform in +-[amp/64, amp): random sign, never zero (zeros make kernels look fast). */
float tool_rng_nonzero(tool_rng *r, float amp);
/* n bf16 values from tool_rng_nonzero(amp), rounded to nearest-even. */
void tool_fill_bf16(tool_rng *r, uint16_t *dst, size_t n, float amp);

/* Draws rows of distinct slots in [0, num_slots) by partial Fisher-Yates over a permutation
 * that lives across draws (each row is a uniform sample without replacement). */
typedef struct tool_sampler {
  int32_t *perm; /* [num_slots] */
  int64_t num_slots;
} tool_sampler;

int tool_sampler_init(tool_sampler *s, int64_t num_slots); /* 0 ok, -1 out of memory */
void tool_sampler_free(tool_sampler *s);
/* k <= num_slots distinct slots into dst[0..k). */
void tool_sampler_draw(tool_sampler *s, tool_rng *r, int32_t *dst, int k);

/* ---- memory on the tool's device (host memory for a CPU context) -------------------- */
typedef struct tool_device {
  int device;        /* SMLA_DEVICE_CPU or a CUDA ordinal */
  void *stream;      /* cudaStream_t of the tool (non-blocking); NULL on the CPU */
  smla_context *ctx;
} tool_device;

/* Creates the context (and on a GPU selects the device and makes a stream). Prints the
 * reason and returns -1 on failure. */
int tool_device_open(tool_device *d, int device);
void tool_device_close(tool_device *d);
/* 256-byte aligned; NULL (and a message) on failure. */
void *tool_alloc(const tool_device *d, size_t bytes);
void tool_free(const tool_device *d, void *p);
/* Copies, complete when they return (ordered on the tool's stream). 0 ok, -1 failed. */
int tool_upload(const tool_device *d, void *dst, const void *src, size_t bytes);
int tool_download(const tool_device *d, void *dst, const void *src, size_t bytes);
int tool_memset(const tool_device *d, void *dst, int byte, size_t bytes);
int tool_sync(const tool_device *d);
/* Prints "smla: <what>: <status string>: <context message>" to stderr. */
void tool_report(const tool_device *d, const char *what, smla_status s);

/* Writes num_rows host rows (kv_c [rows][Dc], k_pe [rows][Dr] bf16, slot [rows]) into
 * cache through smla_cache_write (staging them on the device first for a GPU).
 * 0 ok; on failure prints why and returns -1. */
int tool_write_rows(const tool_device *d, const smla_cache *cache, const uint16_t *kv_c,
                    const uint16_t *k_pe, const int64_t *slot, int64_t num_rows);

/* A plan of its own workspace for (max_tokens, N, K, Dr, format, forced splits or 0,
 * forced heads a block or 0, SMLA_PLAN_* flags). 0 ok, -1 (printed). */
int tool_plan(const tool_device *d, int64_t max_tokens, int heads, int topk, int dr,
              smla_cache_format format, int num_splits, int heads_per_block, uint32_t flags,
              smla_plan **plan);
/* Forward params in the tool's layout: q one [T][N][Dc + Dr] bf16 buffer with q_pe inside
 * it after each head's latent (as engines pass a concatenated q), slots [T][K], out
 * [T][N][Dv] bf16, lse [T][N]; sm_scale 1/sqrt(Dqk). */
void tool_forward_params(smla_forward_params *p, int64_t tokens, int heads, int topk,
                         const smla_cache *cache, const void *q, const int32_t *slots,
                         void *out, float *lse, uint64_t *bad_inputs);

/* Median of n values (sorts v). */
double tool_median(double *v, int n);

/* ---- command-line parsing helpers ---------------------------------------------------- */
/* "cpu" -> SMLA_DEVICE_CPU, "N" -> N. 0 ok, -1 bad. */
int tool_parse_device(const char *s, int *device);
int tool_parse_format(const char *s, smla_cache_format *f);
const char *tool_format_name(smla_cache_format f);
int tool_parse_int(const char *s, long long lo, long long hi, long long *v);
/* Comma-separated list of ints in [lo, hi]; returns the count (<= max), -1 on error. */
int tool_parse_list(const char *s, long long lo, long long hi, int64_t *out, int max);

double tool_now_s(void); /* CLOCK_MONOTONIC seconds */

/* `smla bench ...` (argv[0] is "bench"). Returns the process exit code. */
int tool_bench_main(int argc, char **argv, const char *command_line);

#ifdef SMLA_HAVE_CUDA
/* ---- tools/bench_cuda.c: the CUDA runtime and cuBLAS (each prints its own errors) --- */
int tool_cuda_device_count(char *why, size_t why_bytes); /* 0 and a reason when none */
int tool_cuda_set_device(int device);
int tool_cuda_stream_create(void **stream);
void tool_cuda_stream_destroy(void *stream);
int tool_cuda_malloc(void **p, size_t bytes);
void tool_cuda_free(void *p);
/* dir: 0 host -> device, 1 device -> host, 2 device -> device; synchronizes the stream. */
int tool_cuda_copy(void *stream, void *dst, const void *src, size_t bytes, int dir);
int tool_cuda_memset(void *stream, void *dst, int byte, size_t bytes);
int tool_cuda_sync(void *stream);

/* Enqueues forward number `index` (the caller maps it to an input set) on stream.
 * Returns 0, or an smla_status. */
typedef int (*tool_launch_fn)(void *arg, int index, void *stream);

/* Times fn with CUDA events. use_graph != 0: captures per_graph calls (indices 0..) into
 * one CUDA graph and times `samples` replays, each sample = replay time / per_graph.
 * Else each sample is one call (index = sample number). warmup untimed runs first.
 * Returns 0, -1 on a CUDA error (printed), or the smla_status fn returned. */
int tool_cuda_time(void *stream, tool_launch_fn fn, void *arg, int use_graph, int per_graph,
                   int warmup, int samples, double *sample_us);

/* Cold timing, the way the peers were measured: one call (index 0) captured into a CUDA
 * graph; before each replay flush_bytes at flush are zeroed (untimed), so the replay finds
 * nothing of its inputs in L2 and pays a graph launch of its own. Each sample is one
 * replay. Returns as tool_cuda_time. */
int tool_cuda_time_cold(void *stream, tool_launch_fn fn, void *arg, void *flush,
                        size_t flush_bytes, int warmup, int samples, double *sample_us);

/* The two ceilings of the percent-of-roofline columns, measured now on the current device:
 * device-to-device copy (bytes read + written per second, median of several ~1 GiB
 * copies) and a bf16 cuBLAS matrix product 8192^3 with fp32 accumulation on random data
 * (FLOP per second, median of several). 0 ok, -1 on failure (printed). */
int tool_cuda_ceilings(void *stream, double *copy_bytes_per_s, double *gemm_flop_per_s);
#endif

#endif /* SMLA_TOOLS_BENCH_H */
