/*
 * cases_forward.c: named forward cases (SPEC §3), one property each. Every case builds a
 * fresh random problem (tests/fwd.h), runs it on every backend and compares with the
 * double-precision reference (and CUDA with the CPU backend); tolerances are in fwd.c.
 * Unused cache rows are NaN, so a kernel that reads a masked entry fails loudly.
 */
#include "fwd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void simple(t_case *tc, int64_t T, int N, int K, int dr, smla_cache_format f) {
  fwd_problem pb;
  fwd_defaults(&pb, T, N, K, dr, f);
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

#define SIMPLE(fn, T, N, K, dr, f) \
  static void fn(t_case *tc) { simple(tc, T, N, K, dr, f); }

/* Shapes: K = 2051 is topk + kpool - 1 style (not a multiple of any tile); N covers TP1 and
 * TP8 of DeepSeek-V3.2 (128, 16) and GLM-5 (64, 8). */
SIMPLE(c_k1, 4, 16, 1, 64, SMLA_CACHE_BF16)
SIMPLE(c_k64, 3, 16, 64, 64, SMLA_CACHE_BF16)
SIMPLE(c_k2048, 2, 16, 2048, 64, SMLA_CACHE_BF16)
SIMPLE(c_k2051, 2, 16, 2051, 64, SMLA_CACHE_FP8_DS)
SIMPLE(c_n1, 3, 1, 256, 64, SMLA_CACHE_BF16)
SIMPLE(c_n8, 3, 8, 256, 64, SMLA_CACHE_BF16)
SIMPLE(c_n16, 3, 16, 256, 64, SMLA_CACHE_BF16)
SIMPLE(c_n64, 2, 64, 256, 64, SMLA_CACHE_BF16)
/* N = 24, 32, 96: the 32-heads-per-block kernels and padded head rows past N. */
SIMPLE(c_n24, 3, 24, 256, 64, SMLA_CACHE_BF16)
SIMPLE(c_n32, 3, 32, 256, 64, SMLA_CACHE_FP8_DS)
SIMPLE(c_n96, 2, 96, 256, 0, SMLA_CACHE_BF16)
SIMPLE(c_n128, 2, 128, 128, 64, SMLA_CACHE_FP8_DS)
SIMPLE(c_t1, 1, 16, 1024, 64, SMLA_CACHE_BF16)
/* Production shapes: DeepSeek-V3.2 TP1 decode (N = 128, K = 2048, FlashMLA's FP8 layout),
 * and a decode batch of 64 rows (many blocks on a GPU). */
SIMPLE(c_dsv32_tp1, 2, 128, 2048, 64, SMLA_CACHE_FP8_DS)
SIMPLE(c_t64, 64, 16, 256, 64, SMLA_CACHE_BF16)
SIMPLE(c_dr0_bf16, 3, 16, 256, 0, SMLA_CACHE_BF16)
SIMPLE(c_dr0_fp8_tensor, 3, 16, 256, 0, SMLA_CACHE_FP8_TENSOR)
SIMPLE(c_dr0_fp8_ds, 3, 16, 256, 0, SMLA_CACHE_FP8_DS)
SIMPLE(c_fmt_bf16, 3, 16, 512, 64, SMLA_CACHE_BF16)
SIMPLE(c_fmt_fp8_tensor, 3, 16, 512, 64, SMLA_CACHE_FP8_TENSOR)
SIMPLE(c_fmt_fp8_ds, 3, 16, 512, 64, SMLA_CACHE_FP8_DS)

/* FP8_DS caches written by a foreign writer (fwd.c foreign_ds_row): amax/448 scales that
 * are not powers of two, group magnitudes from 2^-20 to 2^8, saturated groups and all-zero
 * groups with scale 0. Every backend must read each value as e4m3 * its float scale (SPEC
 * §3: "dequantized to their float values"), not rounded to bf16 on the way. sm_scale is
 * smaller than the default so that logits of the 2^8 groups stay ~1..10, not one-hot. */
static void foreign(t_case *tc, int64_t T, int N, int K, int dr, float softcap) {
  fwd_problem pb;
  fwd_defaults(&pb, T, N, K, dr, SMLA_CACHE_FP8_DS);
  pb.foreign_ds = 1;
  pb.sm_scale = (float)(1.0 / (256.0 * sqrt((double)(SMLA_DC + dr))));
  pb.softcap = softcap;
  pb.use_sink = 1;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}
static void c_foreign_ds(t_case *tc) { foreign(tc, 4, 16, 512, 64, 0.0f); }
static void c_foreign_ds_n128(t_case *tc) { foreign(tc, 2, 128, 2048, 64, 0.0f); }
static void c_foreign_ds_dr0_softcap(t_case *tc) { foreign(tc, 3, 64, 700, 0, 8.0f); }

/* Row 0: only -1 (padding, not counted). Row 1: only out-of-range values (each counted).
 * Row 2: both mixed. No entry is used: out 0, lse = max_logit = -inf everywhere, and the
 * whole cache is NaN. */
static void c_all_invalid(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 64, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  const int32_t bad[5] = {INT32_MIN, -2, (int32_t)pb.S, INT32_MAX, -1};
  for (int k = 0; k < pb.K; k++) {
    fwd_slot_row(&pb, 0)[k] = -1;
    fwd_slot_row(&pb, 1)[k] = bad[k % 4];
    fwd_slot_row(&pb, 2)[k] = bad[t_rng_int(0, 4)];
  }
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* Sets lengths and fills the entries past each row's clamped length with values that
 * would be counted (or read NaN rows) if a backend looked at them. */
static void lengths_case(t_case *tc, const int32_t *lengths, int64_t T, int64_t pad) {
  fwd_problem pb;
  fwd_defaults(&pb, T, 16, 128, 64, SMLA_CACHE_BF16);
  pb.slots_stride = pb.K + pad; /* garbage (INT32_MIN) between rows, past K */
  pb.use_lengths = 1;
  fwd_make_inputs(&pb);
  const int32_t junk[4] = {(int32_t)pb.S + 7, INT32_MIN, -3, INT32_MAX};
  for (int64_t t = 0; t < T; t++) {
    pb.lengths[t] = lengths[t];
    const int64_t len = lengths[t] < 0 ? 0 : (lengths[t] > pb.K ? pb.K : lengths[t]);
    for (int64_t k = len; k < pb.K; k++) fwd_slot_row(&pb, t)[k] = junk[k % 4];
  }
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

static void c_lengths_zero(t_case *tc) {
  const int32_t len[4] = {0, 128, 0, 37};
  lengths_case(tc, len, 4, 0);
}

static void c_lengths_negative(t_case *tc) {
  const int32_t len[4] = {-1, INT32_MIN, 17, -100};
  lengths_case(tc, len, 4, 0);
}

static void c_lengths_past_k(t_case *tc) {
  const int32_t len[4] = {129, INT32_MAX, 128, 256};
  lengths_case(tc, len, 4, 8);
}

/* -2^31, -2, S and 2^31-1 are masked and counted; -1 is masked and not counted. The count
 * is also checked against the number planted here (not only against the reference). */
static void c_bad_slots(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 64, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  const int32_t planted[7] = {INT32_MIN, -2, (int32_t)pb.S, INT32_MAX, -1, -1, -1};
  int64_t pos[64];
  for (int64_t t = 0; t < pb.T; t++) {
    t_permutation(pos, pb.K); /* 7 distinct random positions per row */
    for (int i = 0; i < 7; i++) fwd_slot_row(&pb, t)[pos[i]] = planted[i];
  }
  if (fwd_make_cache(tc, &pb) == 0) {
    fwd_ref ref;
    fwd_reference(&pb, &ref);
    t_on(tc, T_CPU);
    t_expect(tc, ref.bad == 4 * (uint64_t)pb.T, "test self-check: the reference counts %llu "
             "bad entries, %llu were planted", (unsigned long long)ref.bad,
             4ull * (unsigned long long)pb.T);
    fwd_ref_free(&ref);
    fwd_run(tc, &pb);
  }
  fwd_free(&pb);
}

/* Row 0: one slot K times. Row 1: every slot three times in a row. Row 2: 5 slots. */
static void c_duplicates(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 256, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  const int32_t one = (int32_t)t_rng_int(0, pb.S - 1);
  int32_t few[5];
  for (int i = 0; i < 5; i++) few[i] = (int32_t)t_rng_int(0, pb.S - 1);
  for (int k = 0; k < pb.K; k++) {
    fwd_slot_row(&pb, 0)[k] = one;
    fwd_slot_row(&pb, 1)[k] = fwd_slot_row(&pb, 1)[k / 3];
    fwd_slot_row(&pb, 2)[k] = few[t_rng_int(0, 4)];
  }
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* q_nope and q_pe inside one [T][N][576] q; padded out, lse, max_logit and slots strides. */
static void c_strided_concat_q(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 256, 64, SMLA_CACHE_FP8_DS);
  pb.q_concat = 1;
  pb.qn_sh = SMLA_DC + 64;
  pb.qn_st = pb.N * pb.qn_sh;
  pb.out_sh = SMLA_DC + 64;
  pb.out_st = pb.N * pb.out_sh + 128;
  pb.lse_st = pb.N + 3;
  pb.ml_st = pb.N + 9;
  pb.slots_stride = pb.K + 5;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* Separate q_nope / q_pe with padded head and token strides; cache rows 128 bytes longer
 * than a BF16 row (the padding holds 0xFF bytes). */
static void c_strided_padded(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 256, 64, SMLA_CACHE_BF16);
  pb.qn_sh = 520;
  pb.qn_st = pb.N * 520 + 24;
  pb.qp_sh = 72;
  pb.qp_st = pb.N * 72 + 16;
  pb.row_bytes = 1152 + 128;
  pb.out_sh = 528;
  pb.out_st = pb.N * 528 + 8;
  pb.slots_stride = pb.K + 3;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* FP8_TENSOR rows padded to 624 bytes, q concatenated with a padded head stride. */
static void c_strided_fp8_tensor_rows(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 8, 300, 64, SMLA_CACHE_FP8_TENSOR);
  pb.row_bytes = 576 + 48;
  pb.q_concat = 1;
  pb.qn_sh = 584;
  pb.qn_st = pb.N * 584 + 40;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* Head-major q and out, as an absorbed-q batched matmul leaves them (torch's
 * q.transpose(0, 1).contiguous().transpose(0, 1): stride_t = 576 < stride_h = T * 576):
 * the strides in the other order are as valid (SPEC: any non-overlapping layout). 64
 * heads of a BF16 cache take the sm90 kernel on an H100/H200; lse head-contiguous. */
static void c_head_major_q_out(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 5, 64, 300, 64, SMLA_CACHE_BF16);
  pb.q_concat = 1;
  pb.qn_st = SMLA_DC + 64;
  pb.qn_sh = pb.T * (SMLA_DC + 64);
  pb.out_st = SMLA_DC;
  pb.out_sh = pb.T * SMLA_DC + 8;
  pb.use_sink = 1;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* The same with separate head-major q_nope / q_pe, 16 heads (the generic kernel), NoPE
 * FP8_DS: q_pe is unused and NULL there. */
static void c_head_major_dr0(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 4, 16, 200, 0, SMLA_CACHE_FP8_DS);
  pb.qn_st = SMLA_DC;
  pb.qn_sh = pb.T * SMLA_DC;
  pb.out_st = SMLA_DC;
  pb.out_sh = pb.T * SMLA_DC;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* softcap 3 against logits of std ~2: many logits are squashed, the maxima strongly. */
static void c_softcap(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 512, 64, SMLA_CACHE_BF16);
  pb.softcap = 3.0f;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

static void c_softcap_fp8_ds(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 2, 16, 300, 64, SMLA_CACHE_FP8_DS);
  pb.softcap = 7.5f;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

static void c_sink(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 512, 64, SMLA_CACHE_BF16);
  pb.use_sink = 1;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* With a sink, a row with no used entry still gives out 0 and lse = max_logit = -inf:
 * row 1 holds only -1, row 2 has length 0; rows 0 and 3 are ordinary. */
static void c_sink_empty_row(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 4, 16, 128, 64, SMLA_CACHE_BF16);
  pb.use_sink = 1;
  pb.use_lengths = 1;
  fwd_make_inputs(&pb);
  for (int k = 0; k < pb.K; k++) fwd_slot_row(&pb, 1)[k] = -1;
  pb.lengths[2] = 0;
  pb.lengths[3] = 50;
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* lse and max_logit in strided rows; rows of length 1 (lse = max_logit = the one logit,
 * out = that row's latent), 2, K and 7, so m and log Z are checked on their own. */
static void c_lse_max_logit(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 4, 16, 256, 64, SMLA_CACHE_FP8_DS);
  pb.use_lengths = 1;
  pb.lse_st = 40;
  pb.ml_st = 17;
  fwd_make_inputs(&pb);
  const int32_t len[4] = {1, 2, 256, 7};
  for (int t = 0; t < 4; t++) pb.lengths[t] = len[t];
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* lse, max_logit and bad_inputs are optional: NULL ones are not written (nothing to
 * crash into) and out is unchanged. */
static void c_no_optional_outputs(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 256, 64, SMLA_CACHE_BF16);
  pb.want_lse = pb.want_ml = pb.want_bad = 0;
  fwd_make_inputs(&pb);
  fwd_slot_row(&pb, 1)[3] = INT32_MAX; /* would be counted, into a NULL counter */
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* One NaN in q of (row 1, head 3): that (row, head)'s out, lse and max_logit are NaN, every
 * other (row, head) is exact (the reference's NaN positions are checked element-wise). */
static void c_nan_q(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 8, 256, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  fwd_q_nope(&pb, 1, 3)[100] = T_BF16_NAN;
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* The same with the NaN in the rope part of q (row 2, head 5), and a concatenated q. */
static void c_nan_q_pe(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 8, 256, 64, SMLA_CACHE_FP8_DS);
  pb.q_concat = 1;
  pb.qn_sh = 576;
  pb.qn_st = 8 * 576;
  fwd_make_inputs(&pb);
  fwd_q_pe(&pb, 2, 5)[7] = T_BF16_NAN;
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

/* A NaN in one latent value of a cache row that only row 1 uses (slot S-1): all heads of
 * row 1 are NaN, rows 0 and 2 are untouched. */
static void c_nan_cache_row(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, 16, 256, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  const int32_t last = (int32_t)pb.S - 1;
  for (int64_t t = 0; t < pb.T; t++)
    for (int k = 0; k < pb.K; k++)
      if (fwd_slot_row(&pb, t)[k] == last) fwd_slot_row(&pb, t)[k] = 0;
  fwd_slot_row(&pb, 1)[17] = last;
  if (fwd_make_cache(tc, &pb) == 0) {
    const uint16_t nan = T_BF16_NAN;
    memcpy(pb.cache + (int64_t)last * pb.row_bytes + 2 * 200, &nan, 2);
    fwd_run(tc, &pb);
  }
  fwd_free(&pb);
}

void t_register_forward_cases(void) {
  t_register("forward_all_invalid", c_all_invalid);
  t_register("forward_lengths_zero", c_lengths_zero);
  t_register("forward_lengths_negative", c_lengths_negative);
  t_register("forward_lengths_past_k", c_lengths_past_k);
  t_register("forward_bad_slots", c_bad_slots);
  t_register("forward_duplicate_slots", c_duplicates);
  t_register("forward_K_1", c_k1);
  t_register("forward_K_64", c_k64);
  t_register("forward_K_2048", c_k2048);
  t_register("forward_K_2051_fp8_ds", c_k2051);
  t_register("forward_N_1", c_n1);
  t_register("forward_N_8", c_n8);
  t_register("forward_N_16", c_n16);
  t_register("forward_N_64", c_n64);
  t_register("forward_N_24", c_n24);
  t_register("forward_N_32_fp8_ds", c_n32);
  t_register("forward_N_96_dr0", c_n96);
  t_register("forward_N_128_fp8_ds", c_n128);
  t_register("forward_T_1", c_t1);
  t_register("forward_T_64", c_t64);
  t_register("forward_dsv32_tp1_decode", c_dsv32_tp1);
  t_register("forward_dr0_bf16", c_dr0_bf16);
  t_register("forward_dr0_fp8_tensor", c_dr0_fp8_tensor);
  t_register("forward_dr0_fp8_ds", c_dr0_fp8_ds);
  t_register("forward_format_bf16", c_fmt_bf16);
  t_register("forward_format_fp8_tensor", c_fmt_fp8_tensor);
  t_register("forward_format_fp8_ds", c_fmt_fp8_ds);
  t_register("forward_fp8_ds_foreign_scales", c_foreign_ds);
  t_register("forward_fp8_ds_foreign_scales_n128", c_foreign_ds_n128);
  t_register("forward_fp8_ds_foreign_scales_dr0_softcap", c_foreign_ds_dr0_softcap);
  t_register("forward_strided_concat_q", c_strided_concat_q);
  t_register("forward_strided_padded", c_strided_padded);
  t_register("forward_strided_fp8_tensor_rows", c_strided_fp8_tensor_rows);
  t_register("forward_head_major_q_out", c_head_major_q_out);
  t_register("forward_head_major_dr0", c_head_major_dr0);
  t_register("forward_softcap", c_softcap);
  t_register("forward_softcap_fp8_ds", c_softcap_fp8_ds);
  t_register("forward_sink", c_sink);
  t_register("forward_sink_empty_row", c_sink_empty_row);
  t_register("forward_lse_max_logit", c_lse_max_logit);
  t_register("forward_no_optional_outputs", c_no_optional_outputs);
  t_register("forward_nan_q", c_nan_q);
  t_register("forward_nan_q_pe", c_nan_q_pe);
  t_register("forward_nan_cache_row", c_nan_cache_row);
}
