/*
 * harness.h: the test driver's plumbing (tests/test_smla.c is main).
 *
 * - Backends: the CPU context always, CUDA device 0 when smla_cuda_device_count() > 0.
 *   A case runs its op on every backend; checks are charged to the backend being run
 *   (t_on), and the case's result is printed once per backend it ran on.
 * - Randomness: one seed per run (printed first, `--seed N` / SMLA_TEST_SEED replays it);
 *   each case reseeds from (seed, its name), so `--filter NAME --seed N` replays exactly the
 *   inputs of that case in the full run.
 * - Checks compare against the double-precision reference (tests/ref.h) with an explicit
 *   tolerance |got - ref| <= atol + rtol * |ref|, require NaN / +inf / -inf at exactly the
 *   reference's positions, flag elements that still hold the 0xFF poison as unwritten, and
 *   print the first mismatches with their indices.
 */
#ifndef SMLA_TEST_HARNESS_H
#define SMLA_TEST_HARNESS_H

#include "smla.h"

#include <stddef.h>
#include <stdint.h>

/* ---- backends -------------------------------------------------------------------------- */
#define T_MAX_BACKENDS 2
#define T_CPU 0  /* index of the CPU backend in g_backends */
#define T_CUDA 1 /* index of CUDA device 0, present when g_num_backends == 2 */

typedef struct {
  const char *name;      /* "cpu", "cuda:0" */
  int device;            /* SMLA_DEVICE_CPU or a CUDA ordinal (devmem.h's device) */
  smla_context *ctx;     /* NULL when creation failed: every run on it then fails */
  smla_status create_status;
} t_backend;

extern t_backend g_backends[T_MAX_BACKENDS];
extern int g_num_backends;

/* ---- per-case state -------------------------------------------------------------------- */
typedef struct {
  const char *name;
  int cur;                         /* backend the checks are charged to */
  int ran[T_MAX_BACKENDS];         /* backends this case ran on */
  int fails[T_MAX_BACKENDS];       /* failed checks per backend */
  const char *skip_why[T_MAX_BACKENDS]; /* t_skip: reported as skipped on that backend */
  int checks;                      /* checks made (all backends) */
  int printed;                     /* failure lines printed so far (capped) */
} t_case;

/* Charge the following checks to backend b and mark it as run. Returns its context, or
 * NULL (after recording a failure) when that backend has no context. */
smla_context *t_on(t_case *tc, int b);
/* Reports this case as skipped, not passed, on the current backend (`why`: a static string
 * saying what the case tests that this backend does not have). The checks it still makes
 * there (e.g. a CPU result kept as the GPU's comparison) count: a failure is a failure. */
void t_skip(t_case *tc, const char *why);
/* The device (devmem.h) of the backend checks are charged to. */
int t_device(const t_case *tc);

/* Records one failed check on the current backend and prints it. Always returns 0. */
int t_fail(t_case *tc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Counts a check; on !cond records a failure with the message. Returns cond != 0. */
int t_expect(t_case *tc, int cond, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* s must be SMLA_OK; else a failure naming `call`, the status and the context message. */
int t_expect_ok(t_case *tc, smla_status s, const smla_context *ctx, const char *call);
/* s must be `want` and, when ctx != NULL and want != SMLA_OK, the context message must be
 * non-empty and contain `needle` (the argument's name; NULL: any non-empty message). */
int t_expect_status(t_case *tc, smla_status s, smla_status want, const smla_context *ctx,
                    const char *needle, const char *what);

/* ---- random numbers -------------------------------------------------------------------- */
void t_rng_seed(uint64_t seed);
uint64_t t_rng_u64(void);
double t_rng_uniform(double lo, double hi); /* [lo, hi) */
int64_t t_rng_int(int64_t lo, int64_t hi);  /* [lo, hi], inclusive */
/* bf16 bits of a uniform value in [lo, hi) (rounded with numerics.h, the library's codec:
 * the inputs only need to be bf16 values, which ones does not matter). */
uint16_t t_rand_bf16(double lo, double hi);
void t_fill_bf16(uint16_t *dst, size_t n, double lo, double hi);
/* Fisher-Yates: dst[0..n) := a random permutation of 0..n-1. */
void t_permutation(int64_t *dst, int64_t n);

#define T_BF16_NAN 0x7fc0u  /* bf16 quiet NaN: unused cache rows, NaN-injected inputs */
#define T_E4M3_NAN 0x7fu    /* OCP E4M3FN NaN (S.1111.111) */
#define T_POISON 0xff       /* output poison byte: bf16 0xFFFF, f32 0xFFFFFFFF are NaNs no
                               backend writes (they write 0x7FC0-style NaNs) */
#define T_POISON2 0xa5      /* second poison for int outputs whose -1 is a legal value */

/* ---- memory (devmem.h on the current backend's device; failures are recorded) ---------- */
void *t_alloc(t_case *tc, size_t bytes);
void *t_upload(t_case *tc, const void *host, size_t bytes); /* alloc + copy; NULL on failure */
int t_download(t_case *tc, void *host, const void *dev, size_t bytes);
int t_memset(t_case *tc, void *dev, int value, size_t bytes);
int t_sync(t_case *tc);
void t_free(t_case *tc, void *dev);
/* Host malloc that aborts the run on failure (tests only; the library never does this). */
void *t_xmalloc(size_t bytes);
void *t_xcalloc(size_t n, size_t size);
/* 256-byte aligned host memory (bf16 inputs need 16; free() it). Aborts on failure. */
void *t_xaligned(size_t bytes);

/* ---- layout helpers -------------------------------------------------------------------- */
/* Elements spanned by n rows of `inner` elements `stride` apart (the header's rule). */
int64_t t_span(int64_t n, int64_t stride, int64_t inner);
/* dense[n0][n1][n2] := src[i0 * s0 + i1 * s1 + i2], elements of `elem` bytes. */
void t_gather(void *dense, const void *src, size_t elem, int64_t n0, int64_t n1, int64_t n2,
              int64_t s0, int64_t s1);
/* The elements of a strided [n0][n1][n2] buffer that are not part of the tensor must still
 * hold T_POISON bytes (nothing was written outside the tensor). */
int t_check_gaps(t_case *tc, const char *what, const void *buf, size_t elem, int64_t n0,
                 int64_t n1, int64_t n2, int64_t s0, int64_t s1);

/* ---- comparisons ----------------------------------------------------------------------- */
typedef struct {
  int nd;          /* 1..3 */
  int64_t dim[3];  /* extents, outermost first (for printing indices) */
} t_shape;
t_shape t_shape1(int64_t a);
t_shape t_shape2(int64_t a, int64_t b);
t_shape t_shape3(int64_t a, int64_t b, int64_t c);
int64_t t_shape_count(t_shape s);

typedef struct {
  double atol, rtol; /* |got - ref| <= atol + rtol * |ref| */
} t_tol;

/* Each compares every element of a dense tensor; returns 1 when all match. NaN, +inf and
 * -inf must sit exactly where ref has them; all-ones bits (the poison) count as unwritten. */
int t_check_bf16(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                 t_shape shape, t_tol tol);
int t_check_f32(t_case *tc, const char *what, const float *got, const double *ref,
                t_shape shape, t_tol tol);
/* t_check_bf16 with element i's atol raised by k * extra[i] (extra may be NULL). */
int t_check_bf16_extra(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                       t_shape shape, t_tol tol, const double *extra, double k);
/* Statistical checks of a bf16 result whose only errors should be roundings to nearest
 * (unbiased), over the elements where both got and ref are finite and ref != 0 (NaN, inf
 * and poison positions are t_check_bf16's business). `rows` rows of `row_len` elements.
 *  - bias  b = sum (got - ref) sgn(ref) / sum |ref|  must lie in
 *          [min(0, b0) - bound, max(0, b0) + bound],
 *          bound = sigmas * sqrt(elem_var sum ref^2 + row_var sum_rows (sum_row |ref|)^2)
 *                  / sum |ref| + abs_slack,
 *    elem_var: variance of independent per-element relative errors; row_var: variance of
 *    a relative error shared by a whole row (fully correlated inside it).
 *    b0 = sum (rn(ref) - ref) sgn(ref) / sum |ref|, rn = round to nearest bf16: the bias
 *    of the exactly rounded reference. Rounding to nearest is unbiased only when the
 *    values' positions between two bf16 numbers are spread evenly; where they are not
 *    (a merge dominated by one bf16 partial gives 0.999 v, just below a bf16 number v,
 *    which rounds up every time) a correct result's bias lies between b0 (an exact float
 *    result, rounded once) and 0 (float noise of an ulp or more smooths the positions).
 *    Truncation is off that interval by ~0.5 ulp either way.
 *  - ||got - ref|| / ||ref|| <= frob.
 * A rounding that is biased (truncation) or an error larger than roundings (a wrong scale,
 * a dropped tile) fails one of them where the elementwise bound may not. */
typedef struct {
  double elem_var, row_var, sigmas, abs_slack, frob;
} t_round_model;
int t_check_bf16_unbiased(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                          int64_t rows, int64_t row_len, t_round_model m);
/* Exact comparisons. */
int t_check_i32(t_case *tc, const char *what, const int32_t *got, const int32_t *ref,
                t_shape shape);
int t_check_bytes(t_case *tc, const char *what, const uint8_t *got, const uint8_t *ref,
                  int64_t rows, int64_t row_bytes);
/* Bitwise equality of two buffers (determinism, concurrency). */
int t_check_same(t_case *tc, const char *what, const void *a, const void *b, size_t bytes);

/* Widening helpers for comparing one backend's output with another's. */
void t_bf16_to_double(const uint16_t *src, double *dst, int64_t n);
void t_f32_to_double(const float *src, double *dst, int64_t n);

/* ---- registry -------------------------------------------------------------------------- */
typedef void (*t_case_fn)(t_case *tc);
void t_register(const char *name, t_case_fn fn);
/* Runs the cases whose name matches filter (t_filter_match; NULL: all), in registration
 * order; adds one pass, fail or skip per (case, backend run). `list` != 0 prints the names
 * only; `fail_fast` != 0 stops before the next case once one has failed (the mutation
 * check's runs). Returns the number of cases that matched and ran. */
int t_run_cases(const char *filter, uint64_t seed, int list, int fail_fast, int *passed,
                int *failed, int *skipped);
/* filter: comma-separated substrings ("forward,merge"); NULL matches every name. */
int t_filter_match(const char *filter, const char *name);
double t_now_ms(void);

/* Each cases file registers its cases. */
void t_register_forward_cases(void);
void t_register_forward_more_cases(void);
void t_register_cache_cases(void);
void t_register_ops_cases(void);
void t_register_meta_cases(void);
void t_register_validate_cases(void);
void t_register_dcp_cases(void);

#endif /* SMLA_TEST_HARNESS_H */
