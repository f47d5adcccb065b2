/* harness.c: see harness.h. */
#include "harness.h"

#include "devmem.h"
#include "numerics.h" /* bf16 encoding of random test inputs only; ref.c never uses it */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

t_backend g_backends[T_MAX_BACKENDS];
int g_num_backends;

/* Failure lines printed per case, then only counted: a broken kernel fails thousands of
 * elements and the first few say everything. */
#define MAX_PRINTED 40
/* Mismatching elements printed per check. */
#define MAX_SHOWN 6

/* ---- case state ------------------------------------------------------------------------ */

smla_context *t_on(t_case *tc, int b) {
  tc->cur = b;
  tc->ran[b] = 1;
  if (!g_backends[b].ctx) {
    t_fail(tc, "no context for %s: smla_context_create returned %s", g_backends[b].name,
           smla_status_string(g_backends[b].create_status));
    return NULL;
  }
  return g_backends[b].ctx;
}

void t_skip(t_case *tc, const char *why) { tc->skip_why[tc->cur] = why; }

int t_device(const t_case *tc) { return g_backends[tc->cur].device; }

static void vfail(t_case *tc, const char *fmt, va_list ap) {
  tc->fails[tc->cur]++;
  if (tc->printed++ >= MAX_PRINTED) {
    if (tc->printed == MAX_PRINTED + 1) printf("  ... (further failures of %s not shown)\n", tc->name);
    return;
  }
  printf("  FAIL [%s] %s: ", g_backends[tc->cur].name, tc->name);
  vprintf(fmt, ap);
  printf("\n");
}

int t_fail(t_case *tc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tc->checks++;
  vfail(tc, fmt, ap);
  va_end(ap);
  return 0;
}

int t_expect(t_case *tc, int cond, const char *fmt, ...) {
  tc->checks++;
  if (cond) return 1;
  va_list ap;
  va_start(ap, fmt);
  vfail(tc, fmt, ap);
  va_end(ap);
  return 0;
}

int t_expect_ok(t_case *tc, smla_status s, const smla_context *ctx, const char *call) {
  return t_expect(tc, s == SMLA_OK, "%s returned %s (%s)", call, smla_status_string(s),
                  ctx ? smla_context_message(ctx) : "no context");
}

int t_expect_status(t_case *tc, smla_status s, smla_status want, const smla_context *ctx,
                    const char *needle, const char *what) {
  if (!t_expect(tc, s == want, "%s: returned %s, want %s (message: \"%s\")", what,
                smla_status_string(s), smla_status_string(want),
                ctx ? smla_context_message(ctx) : ""))
    return 0;
  if (!ctx || want == SMLA_OK) return 1; /* success leaves the last message as it was */
  const char *msg = smla_context_message(ctx);
  if (!t_expect(tc, msg && msg[0], "%s: %s but the context message is empty", what,
                smla_status_string(s)))
    return 0;
  return t_expect(tc, !needle || strstr(msg, needle), "%s: message \"%s\" does not name \"%s\"",
                  what, msg, needle);
}

/* ---- random numbers: splitmix64 (small, full period, good enough for test data) ------- */

static uint64_t rng_state;

void t_rng_seed(uint64_t seed) { rng_state = seed; }

uint64_t t_rng_u64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double t_rng_uniform(double lo, double hi) {
  return lo + (hi - lo) * ((double)(t_rng_u64() >> 11) * 0x1.0p-53);
}

int64_t t_rng_int(int64_t lo, int64_t hi) {
  const uint64_t range = (uint64_t)(hi - lo) + 1u;
  return range == 0 ? (int64_t)t_rng_u64() : lo + (int64_t)(t_rng_u64() % range);
}

uint16_t t_rand_bf16(double lo, double hi) {
  return smla_f32_to_bf16((float)t_rng_uniform(lo, hi));
}

void t_fill_bf16(uint16_t *dst, size_t n, double lo, double hi) {
  for (size_t i = 0; i < n; i++) dst[i] = t_rand_bf16(lo, hi);
}

void t_permutation(int64_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    const int64_t j = t_rng_int(0, i), x = dst[i];
    dst[i] = dst[j];
    dst[j] = x;
  }
}

/* ---- memory ---------------------------------------------------------------------------- */

void *t_xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test_smla: out of host memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}

void *t_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "test_smla: out of host memory (%zu x %zu bytes)\n", n, size);
    exit(2);
  }
  return p;
}

void *t_xaligned(size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, rounded ? rounded : 256);
  if (!p) {
    fprintf(stderr, "test_smla: out of host memory (%zu aligned bytes)\n", bytes);
    exit(2);
  }
  return p;
}

void *t_alloc(t_case *tc, size_t bytes) {
  void *p = dm_alloc(t_device(tc), bytes);
  if (!p) t_fail(tc, "test harness: dm_alloc(%zu bytes) failed: %s", bytes, dm_error());
  return p;
}

void *t_upload(t_case *tc, const void *host, size_t bytes) {
  void *p = t_alloc(tc, bytes);
  if (p && dm_upload(t_device(tc), p, host, bytes) != 0) {
    t_fail(tc, "test harness: upload of %zu bytes failed: %s", bytes, dm_error());
    dm_free(t_device(tc), p);
    return NULL;
  }
  return p;
}

int t_download(t_case *tc, void *host, const void *dev, size_t bytes) {
  if (dm_download(t_device(tc), host, dev, bytes) == 0) return 0;
  t_fail(tc, "test harness: download of %zu bytes failed: %s", bytes, dm_error());
  return -1;
}

int t_memset(t_case *tc, void *dev, int value, size_t bytes) {
  if (dm_memset(t_device(tc), dev, value, bytes) == 0) return 0;
  t_fail(tc, "test harness: memset of %zu bytes failed: %s", bytes, dm_error());
  return -1;
}

int t_sync(t_case *tc) {
  if (dm_sync(t_device(tc)) == 0) return 0;
  t_fail(tc, "device error after the call: %s", dm_error());
  return -1;
}

void t_free(t_case *tc, void *dev) { dm_free(t_device(tc), dev); }

/* ---- layout ---------------------------------------------------------------------------- */

int64_t t_span(int64_t n, int64_t stride, int64_t inner) {
  return n <= 1 ? inner : (n - 1) * stride + inner;
}

void t_gather(void *dense, const void *src, size_t elem, int64_t n0, int64_t n1, int64_t n2,
              int64_t s0, int64_t s1) {
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++)
      memcpy((char *)dense + ((size_t)(i * n1 + j) * (size_t)n2) * elem,
             (const char *)src + (size_t)(i * s0 + j * s1) * elem, (size_t)n2 * elem);
}

int t_check_gaps(t_case *tc, const char *what, const void *buf, size_t elem, int64_t n0,
                 int64_t n1, int64_t n2, int64_t s0, int64_t s1) {
  const int64_t total = t_span(n0, s0, t_span(n1, s1, n2));
  unsigned char *inside = t_xcalloc((size_t)total, 1);
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++) memset(inside + i * s0 + j * s1, 1, (size_t)n2);
  int64_t bad = 0, first = -1;
  const unsigned char *b = buf;
  for (int64_t e = 0; e < total; e++) {
    if (inside[e]) continue;
    for (size_t k = 0; k < elem; k++)
      if (b[(size_t)e * elem + k] != T_POISON) {
        if (first < 0) first = e;
        bad++;
        break;
      }
  }
  free(inside);
  return t_expect(tc, bad == 0,
                  "%s: %lld elements between the tensor's rows were written (first at element "
                  "offset %lld)", what, (long long)bad, (long long)first);
}

/* ---- comparisons ----------------------------------------------------------------------- */

t_shape t_shape1(int64_t a) { return (t_shape){1, {a, 1, 1}}; }
t_shape t_shape2(int64_t a, int64_t b) { return (t_shape){2, {a, b, 1}}; }
t_shape t_shape3(int64_t a, int64_t b, int64_t c) { return (t_shape){3, {a, b, c}}; }
int64_t t_shape_count(t_shape s) {
  int64_t n = 1;
  for (int i = 0; i < s.nd; i++) n *= s.dim[i];
  return n;
}

static void index_str(char *buf, size_t n, t_shape s, int64_t flat) {
  int64_t idx[3];
  for (int i = s.nd - 1; i >= 0; i--) {
    idx[i] = flat % s.dim[i];
    flat /= s.dim[i];
  }
  size_t off = 0;
  for (int i = 0; i < s.nd && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, "[%lld]", (long long)idx[i]);
}

/* 0 finite, 1 NaN, 2 +inf, 3 -inf */
static int fclass(double v) { return isnan(v) ? 1 : isinf(v) ? (v > 0 ? 2 : 3) : 0; }

/* got_bits_poison: the element still holds the poison pattern. */
static int check_one(double got, int got_poison, double ref, t_tol tol, const char **why) {
  if (got_poison) return *why = "unwritten (still poison)", 0;
  const int cg = fclass(got), cr = fclass(ref);
  if (cg != cr) return *why = "NaN/inf position differs", 0;
  if (cr) return 1;
  if (fabs(got - ref) <= tol.atol + tol.rtol * fabs(ref)) return 1;
  return *why = "outside tolerance", 0;
}

typedef double (*load_fn)(const void *got, int64_t i, int *poison);

static double load_bf16(const void *got, int64_t i, int *poison) {
  const uint16_t h = ((const uint16_t *)got)[i];
  *poison = h == 0xffffu;
  return (double)smla_bf16_to_f32(h);
}

static double load_f32(const void *got, int64_t i, int *poison) {
  uint32_t u;
  memcpy(&u, (const float *)got + i, 4);
  *poison = u == 0xffffffffu;
  return (double)((const float *)got)[i];
}

static int check_generic_extra(t_case *tc, const char *what, const void *got, load_fn load,
                               const double *ref, t_shape shape, t_tol tol0,
                               const double *extra, double k) {
  const int64_t n = t_shape_count(shape);
  int64_t bad = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    int poison;
    const double g = load(got, i, &poison);
    const char *why = "";
    t_tol tol = tol0;
    if (extra && isfinite(extra[i])) tol.atol += k * extra[i];
    if (check_one(g, poison, ref[i], tol, &why)) continue;
    if (bad < MAX_SHOWN && tc->printed < MAX_PRINTED) {
      char ix[64];
      index_str(ix, sizeof ix, shape, i);
      printf("    [%s] %s%s: got %.9g, want %.9g (|diff| %.3g, tol %.3g): %s\n",
             g_backends[tc->cur].name, what, ix, g, ref[i], fabs(g - ref[i]),
             tol.atol + tol.rtol * fabs(ref[i]), why);
    }
    if (isfinite(g) && isfinite(ref[i]) && fabs(g - ref[i]) > worst) worst = fabs(g - ref[i]);
    bad++;
  }
  return t_expect(tc, bad == 0,
                  "%s: %lld of %lld elements wrong (tol %.3g + %.3g*|ref|%s, worst finite "
                  "|diff| %.3g)", what, (long long)bad, (long long)n, tol0.atol, tol0.rtol,
                  extra ? " + 2^-8 sum_j p_j |v_j|" : "", worst);
}

static int check_generic(t_case *tc, const char *what, const void *got, load_fn load,
                         const double *ref, t_shape shape, t_tol tol) {
  return check_generic_extra(tc, what, got, load, ref, shape, tol, NULL, 0.0);
}

int t_check_bf16(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                 t_shape shape, t_tol tol) {
  return check_generic(tc, what, got, load_bf16, ref, shape, tol);
}

int t_check_bf16_extra(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                       t_shape shape, t_tol tol, const double *extra, double k) {
  return check_generic_extra(tc, what, got, load_bf16, ref, shape, tol, extra, k);
}

int t_check_f32(t_case *tc, const char *what, const float *got, const double *ref,
                t_shape shape, t_tol tol) {
  return check_generic(tc, what, got, load_f32, ref, shape, tol);
}

/* x rounded to the nearest bf16 (8 significant bits, ties to even), independently of the
 * library's numerics.h, which a mutant may break. Normal range only (|x| >= 2^-126). */
static double round_bf16(double x) {
  int e;
  (void)frexp(x, &e); /* |x| = f 2^e, f in [0.5, 1) */
  return ldexp(nearbyint(ldexp(x, 8 - e)), e - 8);
}

int t_check_bf16_unbiased(t_case *tc, const char *what, const uint16_t *got, const double *ref,
                          int64_t rows, int64_t row_len, t_round_model m) {
  double bias = 0.0, bias0 = 0.0, sum_abs = 0.0, sum_sq = 0.0, err_sq = 0.0, row_terms = 0.0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; r++) {
    double row_abs = 0.0;
    for (int64_t d = 0; d < row_len; d++) {
      const int64_t i = r * row_len + d;
      const double g = (double)smla_bf16_to_f32(got[i]), x = ref[i];
      if (!isfinite(g) || !isfinite(x) || x == 0.0) continue;
      const double rn = round_bf16(x);
      bias += (g - x) * (x > 0 ? 1.0 : -1.0);
      bias0 += (rn - x) * (x > 0 ? 1.0 : -1.0);
      row_abs += fabs(x);
      sum_sq += x * x;
      err_sq += (g - x) * (g - x);
      n++;
    }
    sum_abs += row_abs;
    row_terms += row_abs * row_abs;
  }
  if (n == 0) return 1; /* all zero or non-finite: nothing to measure */
  const double b = bias / sum_abs, b0 = bias0 / sum_abs;
  const double bound = m.sigmas * sqrt(m.elem_var * sum_sq + m.row_var * row_terms) / sum_abs +
                       m.abs_slack;
  const double lo = fmin(0.0, b0) - bound, hi = fmax(0.0, b0) + bound;
  const double frob = sqrt(err_sq / sum_sq);
  const int ok_b = t_expect(tc, b >= lo && b <= hi,
                            "%s: biased: mean signed error %.3g of |ref| over %lld elements, "
                            "outside [%.3g, %.3g] (the exactly rounded reference's %.3g, 0, "
                            "+- %.3g)", what, b, (long long)n, lo, hi, b0, bound);
  const int ok_f = t_expect(tc, frob <= m.frob,
                            "%s: relative Frobenius error %.3g over %lld elements, bound %.3g",
                            what, frob, (long long)n, m.frob);
  return ok_b && ok_f;
}

int t_check_i32(t_case *tc, const char *what, const int32_t *got, const int32_t *ref,
                t_shape shape) {
  const int64_t n = t_shape_count(shape);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] == ref[i]) continue;
    if (bad < MAX_SHOWN && tc->printed < MAX_PRINTED) {
      char ix[64];
      index_str(ix, sizeof ix, shape, i);
      printf("    [%s] %s%s: got %d, want %d%s\n", g_backends[tc->cur].name, what, ix, got[i],
             ref[i], (uint32_t)got[i] == 0xffffffffu || (uint32_t)got[i] == 0xa5a5a5a5u
                         ? " (poison: unwritten?)" : "");
    }
    bad++;
  }
  return t_expect(tc, bad == 0, "%s: %lld of %lld elements wrong", what, (long long)bad,
                  (long long)n);
}

int t_check_bytes(t_case *tc, const char *what, const uint8_t *got, const uint8_t *ref,
                  int64_t rows, int64_t row_bytes) {
  int64_t bad = 0;
  for (int64_t i = 0; i < rows * row_bytes; i++) {
    if (got[i] == ref[i]) continue;
    if (bad < MAX_SHOWN && tc->printed < MAX_PRINTED)
      printf("    [%s] %s: row %lld byte %lld: got 0x%02x, want 0x%02x\n",
             g_backends[tc->cur].name, what, (long long)(i / row_bytes),
             (long long)(i % row_bytes), got[i], ref[i]);
    bad++;
  }
  return t_expect(tc, bad == 0, "%s: %lld of %lld bytes differ", what, (long long)bad,
                  (long long)(rows * row_bytes));
}

int t_check_same(t_case *tc, const char *what, const void *a, const void *b, size_t bytes) {
  const unsigned char *x = a, *y = b;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < bytes; i++)
    if (x[i] != y[i] && bad++ == 0) first = i;
  return t_expect(tc, bad == 0, "%s: %zu of %zu bytes differ (first at byte %zu)", what, bad,
                  bytes, first);
}

void t_bf16_to_double(const uint16_t *src, double *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = (double)smla_bf16_to_f32(src[i]);
}

void t_f32_to_double(const float *src, double *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = (double)src[i];
}

/* ---- registry -------------------------------------------------------------------------- */

#define MAX_CASES 512

static struct {
  const char *name;
  t_case_fn fn;
} cases[MAX_CASES];
static int num_cases;

void t_register(const char *name, t_case_fn fn) {
  if (num_cases == MAX_CASES) {
    fprintf(stderr, "test_smla: more than %d cases; raise MAX_CASES\n", MAX_CASES);
    exit(2);
  }
  for (int i = 0; i < num_cases; i++)
    if (strcmp(cases[i].name, name) == 0) {
      fprintf(stderr, "test_smla: case %s registered twice\n", name);
      exit(2);
    }
  cases[num_cases].name = name;
  cases[num_cases].fn = fn;
  num_cases++;
}

double t_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* FNV-1a: a case's seed depends on its name, not on which cases ran before it. */
static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* `filter`: comma-separated substrings; a name matches when it contains any of them. */
int t_filter_match(const char *filter, const char *name) {
  if (!filter) return 1;
  for (const char *f = filter;;) {
    const char *comma = strchr(f, ',');
    const size_t n = comma ? (size_t)(comma - f) : strlen(f);
    for (const char *s = name; n && strlen(s) >= n; s++)
      if (!strncmp(s, f, n)) return 1;
    if (!comma) return 0;
    f = comma + 1;
  }
}

int t_run_cases(const char *filter, uint64_t seed, int list, int fail_fast, int *passed,
                int *failed, int *skipped) {
  int matched = 0;
  for (int i = 0; i < num_cases; i++) {
    if (!t_filter_match(filter, cases[i].name)) continue;
    if (fail_fast && *failed) break;
    matched++;
    if (list) {
      printf("%s\n", cases[i].name);
      continue;
    }
    t_case tc;
    memset(&tc, 0, sizeof tc);
    tc.name = cases[i].name;
    t_rng_seed(seed ^ name_hash(cases[i].name));
    const double t0 = t_now_ms();
    cases[i].fn(&tc);
    const double ms = t_now_ms() - t0;
    int any = 0;
    for (int b = 0; b < g_num_backends; b++) {
      if (!tc.ran[b]) continue;
      any = 1;
      const int skip = !tc.fails[b] && tc.skip_why[b];
      if (tc.fails[b]) (*failed)++;
      else if (skip) (*skipped)++;
      else (*passed)++;
      printf("%s %s [%s]", tc.fails[b] ? "FAIL" : skip ? "skip" : "ok  ", tc.name,
             g_backends[b].name);
      if (tc.fails[b]) printf(" (%d failed checks)", tc.fails[b]);
      if (skip) printf(" (%s)", tc.skip_why[b]);
      printf(" %.0f ms\n", ms);
    }
    if (!any) { /* a case that checks nothing is a broken test */
      printf("FAIL %s: the case ran on no backend\n", tc.name);
      (*failed)++;
    }
    fflush(stdout);
  }
  return matched;
}
