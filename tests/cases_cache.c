/*
 * cases_cache.c: cache write (SPEC §2). Every case compares the whole cache, byte for byte,
 * with the reference writer (tests/ref.c) on every backend (and CUDA with the CPU): the
 * cache starts as 0xFF bytes, so rows that must be skipped, and row padding, must still be
 * 0xFF. Property checks then restate the format's rules on each backend's bytes without
 * the reference: the FP8_DS scale rule, the e4m3 rounding bound, saturation.
 */
#include "harness.h"

#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t T;
  int dr;
  smla_cache_format format;
  int64_t S, row_bytes;
  float scale;
  int64_t kv_stride, pe_stride;
  uint16_t *kv;   /* span(T, kv_stride, 512) */
  uint16_t *pe;   /* span(T, pe_stride, dr), NULL when dr == 0 */
  int64_t *slot;  /* [T] */
} cw_problem;

/* Checks on one backend's cache bytes, beyond equality with the reference. */
typedef void (*cw_property)(t_case *tc, const cw_problem *cw, const uint8_t *cache);

/* T rows into distinct random slots of S = 2T + 11 rows (duplicates have an unspecified
 * winner, so none here); padded input strides and padded rows. */
static void cw_init(cw_problem *cw, int64_t T, int dr, smla_cache_format f) {
  memset(cw, 0, sizeof *cw);
  cw->T = T;
  cw->dr = dr;
  cw->format = f;
  cw->S = 2 * T + 11;
  cw->row_bytes = (int64_t)smla_cache_row_size(f, dr) + 32;
  cw->scale = 1.0f / 300.0f;
  cw->kv_stride = SMLA_DC + 8;
  cw->pe_stride = dr + 8;
  const int64_t kv_elems = t_span(T, cw->kv_stride, SMLA_DC);
  cw->kv = t_xaligned((size_t)kv_elems * 2);
  for (int64_t i = 0; i < kv_elems; i++) cw->kv[i] = T_BF16_NAN; /* gaps: never read */
  for (int64_t t = 0; t < T; t++) t_fill_bf16(cw->kv + t * cw->kv_stride, SMLA_DC, -1.0, 1.0);
  if (dr) {
    const int64_t pe_elems = t_span(T, cw->pe_stride, dr);
    cw->pe = t_xaligned((size_t)pe_elems * 2);
    for (int64_t i = 0; i < pe_elems; i++) cw->pe[i] = T_BF16_NAN;
    for (int64_t t = 0; t < T; t++) t_fill_bf16(cw->pe + t * cw->pe_stride, (size_t)dr, -1.0, 1.0);
  }
  int64_t *perm = t_xmalloc((size_t)cw->S * 8);
  t_permutation(perm, cw->S);
  cw->slot = t_xmalloc((size_t)T * 8);
  for (int64_t t = 0; t < T; t++) cw->slot[t] = perm[t];
  free(perm);
}

static void cw_free(cw_problem *cw) {
  free(cw->kv);
  free(cw->pe);
  free(cw->slot);
}

static uint16_t *kv_row(cw_problem *cw, int64_t t) { return cw->kv + t * cw->kv_stride; }

static smla_cache_write_params cw_params(const cw_problem *cw, const void *kv, const void *pe,
                                         const int64_t *slot, void *cache, uint64_t *bad) {
  smla_cache_write_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = cw->T;
  p.kv_c = kv;
  p.kv_c_stride = cw->kv_stride;
  p.k_pe = cw->dr ? pe : NULL;
  p.k_pe_stride = cw->pe_stride;
  p.slot = slot;
  p.cache = (smla_cache){cw->format, cw->dr, cw->S, cw->row_bytes, cache, cw->scale};
  p.bad_inputs = bad;
  return p;
}

static void cw_run(t_case *tc, cw_problem *cw, cw_property prop) {
  const size_t cache_bytes = (size_t)(cw->S * cw->row_bytes);
  uint8_t *want = t_xaligned(cache_bytes);
  memset(want, T_POISON, cache_bytes);
  uint64_t want_bad = 0;
  const smla_cache_write_params hp = cw_params(cw, cw->kv, cw->pe, cw->slot, want, NULL);
  ref_cache_write(&hp, &want_bad);
  uint8_t *cpu = NULL;
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    const size_t kv_bytes = (size_t)t_span(cw->T, cw->kv_stride, SMLA_DC) * 2;
    const size_t pe_bytes = cw->dr ? (size_t)t_span(cw->T, cw->pe_stride, cw->dr) * 2 : 0;
    const uint64_t zero = 0;
    void *d_kv = t_upload(tc, cw->kv, kv_bytes);
    void *d_pe = cw->dr ? t_upload(tc, cw->pe, pe_bytes) : NULL;
    void *d_slot = t_upload(tc, cw->slot, (size_t)cw->T * 8);
    void *d_bad = t_upload(tc, &zero, 8);
    void *d_cache = t_alloc(tc, cache_bytes);
    uint8_t *got = t_xaligned(cache_bytes);
    uint64_t bad = 0;
    if (d_kv && (d_pe || !cw->dr) && d_slot && d_bad && d_cache &&
        t_memset(tc, d_cache, T_POISON, cache_bytes) == 0) {
      const smla_cache_write_params p = cw_params(cw, d_kv, d_pe, d_slot, d_cache, d_bad);
      if (t_expect_ok(tc, smla_cache_write(ctx, &p, NULL), ctx, "smla_cache_write") &&
          t_sync(tc) == 0 && t_download(tc, got, d_cache, cache_bytes) == 0 &&
          t_download(tc, &bad, d_bad, 8) == 0) {
        t_check_bytes(tc, "cache bytes vs reference writer", got, want, cw->S, cw->row_bytes);
        t_expect(tc, bad == want_bad, "bad_inputs: got %llu, want %llu",
                 (unsigned long long)bad, (unsigned long long)want_bad);
        if (cpu) t_check_bytes(tc, "cache bytes vs cpu backend", got, cpu, cw->S, cw->row_bytes);
        if (prop) prop(tc, cw, got);
        if (b == T_CPU) {
          cpu = got;
          got = NULL;
        }
      }
    }
    free(got);
    t_free(tc, d_kv);
    t_free(tc, d_pe);
    t_free(tc, d_slot);
    t_free(tc, d_bad);
    t_free(tc, d_cache);
  }
  free(cpu);
  free(want);
}

/* ---- properties -------------------------------------------------------------------------- */

/* Largest error of rounding q (|q| <= 448) to e4m3: half the spacing of its binade,
 * 2^(e-4) <= |q| * 2^-4 for normals, 2^-10 below 2^-6 (subnormal spacing 2^-9). */
static double e4m3_half_step(double q) {
  const double a = fabs(q) * 0x1.0p-4;
  return a > 0x1.0p-10 ? a : 0x1.0p-10;
}

/* Every written latent (and FP8_TENSOR rope) value dequantizes to within e4m3 rounding of
 * its bf16 input; BF16-kept parts are exact. */
static void prop_rounding(t_case *tc, const cw_problem *cw, const uint8_t *cache) {
  double vals[SMLA_DC + 64];
  int64_t bad = 0;
  for (int64_t t = 0; t < cw->T; t++) {
    if (cw->slot[t] < 0 || cw->slot[t] >= cw->S) continue;
    const uint8_t *row = cache + cw->slot[t] * cw->row_bytes;
    ref_decode_row(cw->format, cw->dr, cw->scale, row, vals);
    float scales[4];
    memcpy(scales, row + SMLA_DC, 16);
    for (int d = 0; d < SMLA_DC + cw->dr; d++) {
      const uint16_t h = d < SMLA_DC ? cw->kv[t * cw->kv_stride + d] : cw->pe[t * cw->pe_stride + d - SMLA_DC];
      const double x = ref_bf16_to_double(h);
      double s = 0.0; /* 0: stored exactly (bf16) */
      if (cw->format == SMLA_CACHE_FP8_TENSOR) s = cw->scale;
      if (cw->format == SMLA_CACHE_FP8_DS && d < SMLA_DC) s = scales[d / 128];
      const double tol = s > 0.0 ? s * e4m3_half_step(x / s) : 0.0;
      if (!(fabs(vals[d] - x) <= tol)) {
        if (bad++ < 4)
          t_fail(tc, "row %lld value %d: input %.9g stored as %.9g (scale %g): error %.3g > "
                 "e4m3 rounding %.3g", (long long)t, d, x, vals[d], s, fabs(vals[d] - x), tol);
      }
    }
  }
  t_expect(tc, bad == 0, "%lld values outside e4m3 rounding of their input", (long long)bad);
}

/* FP8_DS scales, restated: s = 2^ceil(log2(max(amax/448, 1e-4))) found here by stepping
 * powers of two (not ref_ds_scale); so s is a power of two, amax/s <= 448, and s is the
 * smallest such power of two unless the 1e-4 floor (2^-13) decides. */
static void prop_scale_rule(t_case *tc, const cw_problem *cw, const uint8_t *cache) {
  int64_t bad = 0;
  for (int64_t t = 0; t < cw->T; t++) {
    if (cw->slot[t] < 0 || cw->slot[t] >= cw->S) continue;
    const uint8_t *row = cache + cw->slot[t] * cw->row_bytes;
    for (int g = 0; g < 4; g++) {
      double amax = 0.0;
      for (int i = 0; i < 128; i++) {
        const double v = fabs(ref_bf16_to_double(cw->kv[t * cw->kv_stride + g * 128 + i]));
        if (v > amax) amax = v; /* NaN compares false: left out */
      }
      double x = amax / 448.0;
      if (x < 1e-4) x = 1e-4;
      double want = 0x1.0p-20;
      while (want < x) want *= 2.0;
      float s;
      memcpy(&s, row + SMLA_DC + 4 * g, 4);
      int e;
      const int pow2 = frexp((double)s, &e) == 0.5;
      const int ok = (double)s == want && pow2 && amax / s <= 448.0 &&
                     (s == 0x1.0p-13f || amax / s > 224.0);
      if (!ok && bad++ < 4)
        t_fail(tc, "row %lld group %d: amax %.9g, scale %.9g (power of two: %s), want %.9g",
               (long long)t, g, amax, (double)s, pow2 ? "yes" : "no", want);
    }
  }
  t_expect(tc, bad == 0, "%lld FP8_DS group scales break the rule", (long long)bad);
}

/* ---- cases --------------------------------------------------------------------------------- */

static void simple(t_case *tc, int64_t T, int dr, smla_cache_format f, cw_property prop) {
  cw_problem cw;
  cw_init(&cw, T, dr, f);
  cw_run(tc, &cw, prop);
  cw_free(&cw);
}

static void c_bf16(t_case *tc) { simple(tc, 37, 64, SMLA_CACHE_BF16, prop_rounding); }
static void c_bf16_dr0(t_case *tc) { simple(tc, 20, 0, SMLA_CACHE_BF16, prop_rounding); }
static void c_fp8_tensor(t_case *tc) { simple(tc, 37, 64, SMLA_CACHE_FP8_TENSOR, prop_rounding); }
static void c_fp8_tensor_dr0(t_case *tc) { simple(tc, 20, 0, SMLA_CACHE_FP8_TENSOR, prop_rounding); }
static void c_fp8_ds_dr0(t_case *tc) { simple(tc, 20, 0, SMLA_CACHE_FP8_DS, prop_rounding); }

/* Each group scaled by its own random factor 10^U(-6, 2), so the scales range from the
 * 1e-4 floor to 2^-2; bit-exact with the reference writer. */
static void scaled_groups(cw_problem *cw) {
  for (int64_t t = 0; t < cw->T; t++)
    for (int g = 0; g < 4; g++) {
      const double f = pow(10.0, t_rng_uniform(-6.0, 2.0));
      t_fill_bf16(kv_row(cw, t) + g * 128, 128, -f, f);
    }
}

static void c_fp8_ds(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 40, 64, SMLA_CACHE_FP8_DS);
  scaled_groups(&cw);
  cw_run(tc, &cw, NULL);
  cw_free(&cw);
}

static void c_fp8_ds_rounding(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 40, 64, SMLA_CACHE_FP8_DS);
  scaled_groups(&cw);
  cw_run(tc, &cw, prop_rounding);
  cw_free(&cw);
}

/* Random groups plus the boundaries of the rule: amax exactly 448 * 2^-5 = 14 (scale 2^-5,
 * the log is an integer), amax 14.0625 (just above: 2^-4), amax 448 (scale 1), and a tiny
 * group (amax ~1e-6: the floor 2^-13). The group's max sits at a random position. */
static void c_fp8_ds_scale_rule(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 40, 64, SMLA_CACHE_FP8_DS);
  scaled_groups(&cw);
  static const float edge[4] = {14.0f, 14.0625f, 448.0f, 1e-6f};
  for (int64_t t = 0; t < 8; t++) {
    const int g = (int)(t % 4);
    const float a = edge[t / 2 % 4];
    uint16_t *grp = kv_row(&cw, t) + g * 128;
    t_fill_bf16(grp, 128, -a * 0.9, a * 0.9);
    grp[t_rng_int(0, 127)] = ref_double_to_bf16(t % 2 ? -a : a);
  }
  cw_run(tc, &cw, prop_scale_rule);
  cw_free(&cw);
}

/* An all-zero group gets the floor scale 2^ceil(log2(1e-4)) = 2^-13 and 128 zero bytes. */
static void prop_zero_group(t_case *tc, const cw_problem *cw, const uint8_t *cache) {
  for (int64_t t = 0; t < 3; t++) {
    const uint8_t *row = cache + cw->slot[t] * cw->row_bytes;
    const int g = (int)t + 1;
    float s;
    memcpy(&s, row + SMLA_DC + 4 * g, 4);
    t_expect(tc, s == 0x1.0p-13f, "row %lld zero group %d: scale %.9g, want 2^-13 = %.9g",
             (long long)t, g, (double)s, 0x1.0p-13);
    int nonzero = 0;
    for (int i = 0; i < 128; i++) nonzero += row[g * 128 + i] != 0;
    t_expect(tc, nonzero == 0, "row %lld zero group %d: %d of 128 bytes are not 0",
             (long long)t, g, nonzero);
  }
}

static void c_fp8_ds_zero_group(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 12, 64, SMLA_CACHE_FP8_DS);
  for (int64_t t = 0; t < 3; t++) memset(kv_row(&cw, t) + (t + 1) * 128, 0, 256);
  cw_run(tc, &cw, prop_zero_group);
  cw_free(&cw);
}

/* FP8_TENSOR with scale 1/256: inputs in [-4, 4] go up to 1024 > 448 in e4m3 units and must
 * saturate to +-448 (0x7E / 0xFE); +-Inf too; NaN is stored as e4m3 NaN. */
static void prop_tensor_saturation(t_case *tc, const cw_problem *cw, const uint8_t *cache) {
  int64_t bad = 0, saturated = 0;
  for (int64_t t = 0; t < cw->T; t++) {
    const uint8_t *row = cache + cw->slot[t] * cw->row_bytes;
    for (int d = 0; d < SMLA_DC; d++) {
      const uint16_t h = cw->kv[t * cw->kv_stride + d];
      const double q = ref_bf16_to_double(h) / cw->scale;
      const uint8_t sign = (h & 0x8000u) ? 0x80 : 0;
      uint8_t want;
      if (isnan(q)) want = (uint8_t)(sign | T_E4M3_NAN);
      else if (fabs(q) >= 448.0) want = (uint8_t)(sign | 0x7e);
      else continue;
      saturated++;
      if (row[d] != want && bad++ < 4)
        t_fail(tc, "row %lld value %d: %.9g / scale = %.9g stored as 0x%02x, want 0x%02x",
               (long long)t, d, ref_bf16_to_double(h), q, row[d], want);
    }
  }
  t_expect(tc, saturated > 100, "test self-check: only %lld values to saturate", (long long)saturated);
  t_expect(tc, bad == 0, "%lld values beyond 448 * scale did not saturate", (long long)bad);
}

static void c_fp8_saturation_tensor(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 16, 64, SMLA_CACHE_FP8_TENSOR);
  cw.scale = 1.0f / 256.0f;
  for (int64_t t = 0; t < cw.T; t++) t_fill_bf16(kv_row(&cw, t), SMLA_DC, -4.0, 4.0);
  kv_row(&cw, 0)[1] = 0x7f80u;  /* +Inf */
  kv_row(&cw, 0)[2] = 0xff80u;  /* -Inf */
  kv_row(&cw, 1)[3] = T_BF16_NAN;
  kv_row(&cw, 1)[4] = 0xffc0u;  /* -NaN */
  cw_run(tc, &cw, prop_tensor_saturation);
  cw_free(&cw);
}

/* FP8_DS: +-Inf in group 0 make its scale 2^127 (docs/spec-choices.md) and saturate to
 * +-448 while its finite values flush to +-0; NaN in group 2 is stored as e4m3 NaN with its
 * sign and left out of that group's amax (its scale is what the finite values give). */
static void prop_ds_inf_nan(t_case *tc, const cw_problem *cw, const uint8_t *cache) {
  const uint8_t *row = cache + cw->slot[0] * cw->row_bytes;
  float s0, s2;
  memcpy(&s0, row + SMLA_DC, 4);
  memcpy(&s2, row + SMLA_DC + 8, 4);
  t_expect(tc, s0 == 0x1.0p127f, "Inf group scale %.9g, want 2^127", (double)s0);
  t_expect(tc, row[3] == 0x7e && row[9] == 0xfe, "+Inf, -Inf stored as 0x%02x, 0x%02x, want "
           "0x7e, 0xfe", row[3], row[9]);
  int nonzero = 0;
  for (int i = 0; i < 128; i++)
    if (i != 3 && i != 9) nonzero += (row[i] & 0x7f) != 0;
  t_expect(tc, nonzero == 0, "finite values of the Inf group: %d of 126 not flushed to 0", nonzero);
  t_expect(tc, row[256 + 5] == 0x7f && row[256 + 6] == 0xff, "NaN, -NaN stored as 0x%02x, "
           "0x%02x, want 0x7f, 0xff", row[261], row[262]);
  double amax = 0.0;
  for (int i = 0; i < 128; i++)
    if (i != 5 && i != 6) {
      const double v = fabs(ref_bf16_to_double(cw->kv[256 + i]));
      if (v > amax) amax = v;
    }
  t_expect(tc, (double)s2 == ref_ds_scale(amax), "NaN group scale %.9g, want %.9g (amax %.9g "
           "of its finite values)", (double)s2, ref_ds_scale(amax), amax);
}

static void c_fp8_saturation_ds_inf_nan(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 8, 64, SMLA_CACHE_FP8_DS);
  uint16_t *r = kv_row(&cw, 0);
  r[3] = 0x7f80u;
  r[9] = 0xff80u;
  r[256 + 5] = T_BF16_NAN;
  r[256 + 6] = 0xffc0u;
  cw_run(tc, &cw, prop_ds_inf_nan);
  cw_free(&cw);
}

/* slot < 0 (-1, -5, -2^63) is padding: skipped. slot >= S (S, S + 100, 2^63 - 1) is skipped
 * and counted: bad_inputs must be 3 (the reference's count is checked to be 3 too). The
 * skipped rows' bytes stay 0xFF: cw_run compares the whole cache. */
static void c_skip(t_case *tc) {
  cw_problem cw;
  cw_init(&cw, 30, 64, SMLA_CACHE_FP8_DS);
  const int64_t planted[6] = {-1, -5, INT64_MIN, cw.S, cw.S + 100, INT64_MAX};
  for (int i = 0; i < 6; i++) cw.slot[3 + 4 * i] = planted[i];
  uint64_t want_bad = 0;
  uint8_t *scratch = t_xaligned((size_t)(cw.S * cw.row_bytes));
  const smla_cache_write_params hp = cw_params(&cw, cw.kv, cw.pe, cw.slot, scratch, NULL);
  ref_cache_write(&hp, &want_bad);
  free(scratch);
  t_on(tc, T_CPU);
  t_expect(tc, want_bad == 3, "test self-check: reference counts %llu, 3 planted",
           (unsigned long long)want_bad);
  cw_run(tc, &cw, NULL);
  cw_free(&cw);
}

void t_register_cache_cases(void) {
  t_register("cache_write_bf16", c_bf16);
  t_register("cache_write_bf16_dr0", c_bf16_dr0);
  t_register("cache_write_fp8_tensor", c_fp8_tensor);
  t_register("cache_write_fp8_tensor_dr0", c_fp8_tensor_dr0);
  t_register("cache_write_fp8_ds_bit_exact", c_fp8_ds);
  t_register("cache_write_fp8_ds_dr0", c_fp8_ds_dr0);
  t_register("cache_write_fp8_ds_rounding_error", c_fp8_ds_rounding);
  t_register("cache_write_fp8_ds_scale_rule", c_fp8_ds_scale_rule);
  t_register("cache_write_fp8_ds_zero_group", c_fp8_ds_zero_group);
  t_register("cache_write_fp8_saturation_tensor", c_fp8_saturation_tensor);
  t_register("cache_write_fp8_saturation_ds_inf_nan", c_fp8_saturation_ds_inf_nan);
  t_register("cache_write_skip", c_skip);
}
