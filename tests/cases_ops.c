/*
 * cases_ops.c: convert indices (SPEC §1) and merge partial states (SPEC §4), on every
 * backend against the reference (and CUDA against the CPU).
 */
#include "harness.h"

#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== convert indices ======================================================================= */

typedef struct {
  int64_t T;
  int K, R, B, bs;
  int compact, want_valid, in_place;   /* in_place: slots aliases local (equal strides) */
  int cp_size, cp_rank, cp_interleave; /* context-parallel filter (0: off) */
  int64_t bt_stride, local_stride, slots_stride;
  int32_t *req_id;                     /* [T] */
  int32_t *block_table;                /* span(R, bt_stride, B) */
  int32_t *local;                      /* span(T, local_stride, K) */
} cv_problem;

/* Distinct block ids per (request, block) from a pool twice that size, every position
 * valid (p in [0, B * bs)); padded strides with garbage in the gaps. */
static void cv_init(cv_problem *cv, int64_t T, int K, int R, int B, int bs) {
  memset(cv, 0, sizeof *cv);
  cv->T = T;
  cv->K = K;
  cv->R = R;
  cv->B = B;
  cv->bs = bs;
  cv->want_valid = 1;
  cv->bt_stride = B + 3;
  cv->local_stride = K + 2;
  cv->slots_stride = K + 5;
  cv->req_id = t_xmalloc((size_t)T * 4);
  for (int64_t t = 0; t < T; t++) cv->req_id[t] = (int32_t)t_rng_int(0, R - 1);
  const int64_t bt_elems = t_span(R, cv->bt_stride, B);
  cv->block_table = t_xmalloc((size_t)bt_elems * 4);
  for (int64_t i = 0; i < bt_elems; i++) cv->block_table[i] = -7; /* gaps */
  int64_t *pool = t_xmalloc((size_t)R * B * 2 * 8);
  t_permutation(pool, (int64_t)R * B * 2);
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) cv->block_table[r * cv->bt_stride + b] = (int32_t)pool[r * B + b];
  free(pool);
  const int64_t local_elems = t_span(T, cv->local_stride, K);
  cv->local = t_xmalloc((size_t)local_elems * 4);
  for (int64_t i = 0; i < local_elems; i++) cv->local[i] = INT32_MIN; /* gaps */
  for (int64_t t = 0; t < T; t++)
    for (int k = 0; k < K; k++)
      cv->local[t * cv->local_stride + k] = (int32_t)t_rng_int(0, (int64_t)B * bs - 1);
}

static void cv_free(cv_problem *cv) {
  free(cv->req_id);
  free(cv->block_table);
  free(cv->local);
}

static int32_t *cv_row(cv_problem *cv, int64_t t) { return cv->local + t * cv->local_stride; }

static smla_convert_params cv_params(const cv_problem *cv, const int32_t *req, const int32_t *bt,
                                     const int32_t *local, int32_t *slots, int32_t *valid) {
  smla_convert_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = cv->T;
  p.topk = cv->K;
  p.req_id = req;
  p.block_table = bt;
  p.num_requests = cv->R;
  p.blocks_per_request = cv->B;
  p.block_table_stride = cv->bt_stride;
  p.block_size = cv->bs;
  p.local = local;
  p.local_stride = cv->local_stride;
  p.slots = slots;
  p.slots_stride = cv->in_place ? cv->local_stride : cv->slots_stride;
  p.valid = cv->want_valid ? valid : NULL;
  p.compact = cv->compact;
  p.cp_size = cv->cp_size;
  p.cp_rank = cv->cp_rank;
  p.cp_interleave = cv->cp_interleave;
  return p;
}

/* One run with the outputs pre-filled with `poison` bytes; dense results into slots/valid. */
static int cv_once(t_case *tc, smla_context *ctx, const cv_problem *cv, int poison,
                   int32_t *slots, int32_t *valid) {
  const int64_t local_elems = t_span(cv->T, cv->local_stride, cv->K);
  const int64_t slot_elems = cv->in_place ? local_elems : t_span(cv->T, cv->slots_stride, cv->K);
  const int64_t sst = cv->in_place ? cv->local_stride : cv->slots_stride;
  int ok = 0;
  void *d_req = t_upload(tc, cv->req_id, (size_t)cv->T * 4);
  void *d_bt = t_upload(tc, cv->block_table, (size_t)t_span(cv->R, cv->bt_stride, cv->B) * 4);
  void *d_local = t_upload(tc, cv->local, (size_t)local_elems * 4);
  void *d_slots = cv->in_place ? d_local : t_alloc(tc, (size_t)slot_elems * 4);
  void *d_valid = t_alloc(tc, (size_t)cv->T * 4);
  int32_t *raw = t_xmalloc((size_t)slot_elems * 4);
  if (d_req && d_bt && d_local && d_slots && d_valid &&
      (cv->in_place || t_memset(tc, d_slots, poison, (size_t)slot_elems * 4) == 0) &&
      t_memset(tc, d_valid, poison, (size_t)cv->T * 4) == 0) {
    const smla_convert_params p = cv_params(cv, d_req, d_bt, d_local, d_slots, d_valid);
    if (t_expect_ok(tc, smla_convert_indices(ctx, &p, NULL), ctx, "smla_convert_indices") &&
        t_sync(tc) == 0 && t_download(tc, raw, d_slots, (size_t)slot_elems * 4) == 0 &&
        t_download(tc, valid, d_valid, (size_t)cv->T * 4) == 0) {
      t_gather(slots, raw, 4, cv->T, 1, cv->K, sst, 0);
      if (!cv->in_place && poison == T_POISON)
        t_check_gaps(tc, "slots", raw, 4, cv->T, 1, cv->K, cv->slots_stride, 0);
      ok = 1;
    }
  }
  free(raw);
  t_free(tc, d_req);
  t_free(tc, d_bt);
  t_free(tc, d_local);
  if (!cv->in_place) t_free(tc, d_slots);
  t_free(tc, d_valid);
  return ok;
}

static void cv_run(t_case *tc, cv_problem *cv) {
  const size_t TK = (size_t)cv->T * (size_t)cv->K;
  int32_t *want = t_xmalloc(TK * 4), *want_valid = t_xmalloc((size_t)cv->T * 4);
  const smla_convert_params hp = cv_params(cv, cv->req_id, cv->block_table, cv->local, NULL, NULL);
  ref_convert(&hp, want, want_valid);
  int32_t *cpu = NULL, *cpu_valid = NULL;
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    /* -1 is a legal slot, so 0xFF poison alone cannot show an unwritten entry: a second
     * run with 0xA5 poison (-1515870811, never legal) must give the same. */
    const int passes = cv->in_place ? 1 : 2;
    for (int pass = 0; pass < passes; pass++) {
      int32_t *got = t_xmalloc(TK * 4), *got_valid = t_xmalloc((size_t)cv->T * 4);
      const int poison = pass == 0 ? T_POISON : T_POISON2;
      char what[64];
      if (cv_once(tc, ctx, cv, poison, got, got_valid)) {
        snprintf(what, sizeof what, "slots (poison 0x%02x)", poison);
        t_check_i32(tc, what, got, want, t_shape2(cv->T, cv->K));
        if (cv->want_valid) {
          snprintf(what, sizeof what, "valid (poison 0x%02x)", poison);
          t_check_i32(tc, what, got_valid, want_valid, t_shape1(cv->T));
        } else {
          int untouched = 1;
          for (int64_t t = 0; t < cv->T; t++)
            untouched &= (uint32_t)got_valid[t] == (poison == T_POISON ? 0xffffffffu : 0xa5a5a5a5u);
          t_expect(tc, untouched, "valid == NULL, but the valid buffer was written");
        }
        if (cpu && pass == 0) {
          t_check_i32(tc, "slots vs cpu backend", got, cpu, t_shape2(cv->T, cv->K));
          if (cv->want_valid) t_check_i32(tc, "valid vs cpu backend", got_valid, cpu_valid, t_shape1(cv->T));
        }
      }
      if (b == T_CPU && pass == 0) {
        cpu = got;
        cpu_valid = got_valid;
      } else {
        free(got);
        free(got_valid);
      }
    }
  }
  free(cpu);
  free(cpu_valid);
  free(want);
  free(want_valid);
}

static void c_convert_plain(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 20, 100, 4, 8, 16);
  cv_run(tc, &cv);
  cv.want_valid = 0; /* valid is optional */
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* Sprinkles every invalid class over the rows: about a third of the entries. */
static void sprinkle_invalid(cv_problem *cv) {
  cv->block_table[1 * cv->bt_stride + 2] = -1;
  const int32_t bad_p[4] = {-1, INT32_MIN, cv->B * cv->bs, INT32_MAX};
  for (int64_t t = 0; t < cv->T; t++)
    for (int k = 0; k < cv->K; k++)
      if (t_rng_int(0, 2) == 0) cv_row(cv, t)[k] = bad_p[t_rng_int(0, 3)];
  cv->req_id[0] = -1;
  cv->req_id[cv->T - 1] = cv->R;
}

/* compact: each row's valid entries first, in their order, -1 after; valid counts. */
static void c_convert_compact(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 24, 130, 4, 8, 16);
  sprinkle_invalid(&cv);
  cv.compact = 1;
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* Context parallel: every rank of 2 and 3, runs of 1 and 4 (and 0 = 1), plain and compact,
 * with every invalid class sprinkled in (positions past the global block table can be
 * valid local ones: this test gives every rank the same table). That the ranks' entries
 * add up to the whole row is checked end to end by the dcp_* cases. */
static void c_convert_context_parallel(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 9, 150, 3, 8, 16);
  sprinkle_invalid(&cv);
  const int sizes[2] = {2, 3}, runs[3] = {1, 4, 0};
  for (int si = 0; si < 2; si++)
    for (int ri = 0; ri < 3; ri++)
      for (int compact = 0; compact < 2; compact++)
        for (int rank = 0; rank < sizes[si]; rank++) {
          cv.cp_size = sizes[si];
          cv.cp_rank = rank;
          cv.cp_interleave = runs[ri];
          cv.compact = compact;
          cv_run(tc, &cv);
        }
  cv_free(&cv);
}

static void c_invalid_negative_pos(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 12, 64, 3, 8, 16);
  for (int64_t t = 0; t < cv.T; t++)
    for (int k = t % 3; k < cv.K; k += 3) cv_row(&cv, t)[k] = k % 2 ? -1 : (k % 4 ? INT32_MIN : -1000);
  cv_run(tc, &cv);
  cv_free(&cv);
}

static void c_invalid_past_block_table(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 12, 64, 3, 8, 16);
  const int32_t past[3] = {8 * 16, 8 * 16 + 5, INT32_MAX}; /* p / bs >= B */
  for (int64_t t = 0; t < cv.T; t++)
    for (int k = (int)(t % 4); k < cv.K; k += 4) cv_row(&cv, t)[k] = past[k % 3];
  cv_run(tc, &cv);
  cv_free(&cv);
}

static void c_invalid_negative_block(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 16, 64, 3, 8, 16);
  for (int r = 0; r < cv.R; r++) {
    cv.block_table[r * cv.bt_stride + (r + 1) % cv.B] = -1;
    cv.block_table[r * cv.bt_stride + (r + 4) % cv.B] = INT32_MIN;
  }
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* req_id outside [0, R): the whole row is -1 and its valid count 0. */
static void c_invalid_req_id(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 10, 64, 3, 8, 16);
  const int32_t bad_r[4] = {-1, 3, INT32_MAX, INT32_MIN};
  for (int i = 0; i < 4; i++) cv.req_id[2 * i + 1] = bad_r[i];
  cv_run(tc, &cv);
  cv.compact = 1;
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* block * bs + p % bs must fit in int32: block 2^25 - 1 with bs 64 reaches exactly
 * 2^31 - 1 (valid), block 2^25 overflows (-1). */
static void c_invalid_slot_overflow(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 6, 64, 2, 4, 64);
  cv.block_table[0 * cv.bt_stride + 1] = (1 << 25) - 1;
  cv.block_table[1 * cv.bt_stride + 2] = 1 << 25;
  for (int64_t t = 0; t < cv.T; t++) {
    cv.req_id[t] = (int32_t)(t % 2);
    for (int k = 0; k < 16; k++) cv_row(&cv, t)[k] = (t % 2 ? 2 * 64 : 64) + 63 - k;
  }
  cv_run(tc, &cv);
  cv_free(&cv);
}

static void c_block_size_1(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 16, 64, 3, 300, 1);
  sprinkle_invalid(&cv);
  cv_run(tc, &cv);
  cv_free(&cv);
}

static void c_block_size_64(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 16, 200, 3, 40, 64);
  sprinkle_invalid(&cv);
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* A block size that is not a power of two (the kernels divide; 64 and 16 shift). */
static void c_block_size_48(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 16, 200, 3, 40, 48);
  sprinkle_invalid(&cv);
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* slots may alias local without compaction and with equal strides. */
static void c_convert_in_place(t_case *tc) {
  cv_problem cv;
  cv_init(&cv, 16, 96, 3, 8, 16);
  sprinkle_invalid(&cv);
  cv.in_place = 1;
  cv_run(tc, &cv);
  cv_free(&cv);
}

/* ==== merge partial states ================================================================== */

/* out f32: weights are expf(lse_p - max) in float (~1e-6 relative for |lse_p - max| <~ 20),
 * so |got - ref| <= 1e-5 + 1e-5 |ref|. out bf16 adds the rounding to bf16, up to 2^-8
 * relative: 1e-5 + 4e-3 |ref|; two backends may differ by one bf16 ulp (2^-7): 8e-3.
 * lse = max + logf(sum): a few float ulps: 1e-5 + 1e-6 |ref|. */
static const t_tol TOL_MERGE_F32 = {1e-5, 1e-5};
static const t_tol TOL_MERGE_BF16 = {1e-5, 4e-3};
static const t_tol TOL_MERGE_BF16_XBACKEND = {1e-5, 8e-3};
static const t_tol TOL_MERGE_LSE = {1e-5, 1e-6};
/* bf16 merged out, statistically (harness.h): its only error is the final rounding to
 * bf16 (to nearest, sd <= u |r| / sqrt(3), u = 2^-8; two such against another backend), no
 * rounding shared by a row; the float sums add ~1e-6. A truncating store fails the bias. */
static const t_round_model MERGE_BF16_MODEL = {2.0 / 3.0 / 65536.0, 0.0, 6.0, 1e-5, 2.0 / 256.0};

typedef struct {
  int P;
  int64_t T;
  int N, dv;
  smla_dtype in_dt, out_dt;
  int want_lse;
  int64_t sp, st, sh, lsp, lst, ost, osh, lse_st;
  void *out_p;    /* span(P, sp, ...) elements of in_dt */
  int64_t out_p_elems;
  float *lse_p;   /* span(P, lsp, span(T, lst, N)) */
  int64_t lse_p_elems;
  float *sink;    /* [N] or NULL: the partials are sinked forwards' outputs */
} mg_problem;

static size_t dt_size(smla_dtype d) { return d == SMLA_DTYPE_F32 ? 4 : 2; }

static void set_val(void *base, smla_dtype d, int64_t i, double v) {
  if (d == SMLA_DTYPE_F32) ((float *)base)[i] = (float)v;
  else ((uint16_t *)base)[i] = isnan(v) ? T_BF16_NAN : ref_double_to_bf16(v);
}

static int64_t mg_out_index(const mg_problem *m, int p, int64_t t, int h) {
  return p * m->sp + t * m->st + (int64_t)h * m->sh;
}

static float *mg_lse(mg_problem *m, int p, int64_t t, int h) {
  return m->lse_p + p * m->lsp + t * m->lst + h;
}

/* Partials in [-1, 1], lse_p in [-5, 15]; padded strides everywhere with NaN in the gaps. */
static void mg_init(mg_problem *m, int P, int64_t T, int N, int dv, smla_dtype in_dt,
                    smla_dtype out_dt) {
  memset(m, 0, sizeof *m);
  m->P = P;
  m->T = T;
  m->N = N;
  m->dv = dv;
  m->in_dt = in_dt;
  m->out_dt = out_dt;
  m->want_lse = 1;
  m->sh = dv + 4;
  m->st = N * m->sh + 8;
  m->sp = T * m->st + 16;
  m->lst = N + 3;
  m->lsp = T * m->lst + 5;
  m->osh = dv + 2;
  m->ost = N * m->osh + 4;
  m->lse_st = N + 1;
  m->out_p_elems = t_span(P, m->sp, t_span(T, m->st, t_span(N, m->sh, dv)));
  m->out_p = t_xaligned((size_t)m->out_p_elems * dt_size(in_dt));
  for (int64_t i = 0; i < m->out_p_elems; i++) set_val(m->out_p, in_dt, i, NAN);
  m->lse_p_elems = t_span(P, m->lsp, t_span(T, m->lst, N));
  m->lse_p = t_xmalloc((size_t)m->lse_p_elems * 4);
  for (int64_t i = 0; i < m->lse_p_elems; i++) m->lse_p[i] = NAN;
  for (int p = 0; p < P; p++)
    for (int64_t t = 0; t < T; t++)
      for (int h = 0; h < N; h++) {
        for (int d = 0; d < dv; d++) set_val(m->out_p, in_dt, mg_out_index(m, p, t, h) + d, t_rng_uniform(-1, 1));
        *mg_lse(m, p, t, h) = (float)t_rng_uniform(-5.0, 15.0);
      }
}

static void mg_free(mg_problem *m) {
  free(m->sink);
  free(m->out_p);
  free(m->lse_p);
}

/* Marks partial p of (t, h) empty: lse -inf and its out_p NaN, which must not leak. */
static void mg_empty(mg_problem *m, int p, int64_t t, int h) {
  *mg_lse(m, p, t, h) = -INFINITY;
  for (int d = 0; d < m->dv; d++) set_val(m->out_p, m->in_dt, mg_out_index(m, p, t, h) + d, NAN);
}

static smla_merge_params mg_params(const mg_problem *m, const void *out_p, const float *lse_p,
                                   void *out, float *lse, const float *sink) {
  smla_merge_params p;
  memset(&p, 0, sizeof p);
  p.num_partials = m->P;
  p.num_tokens = m->T;
  p.num_heads = m->N;
  p.dv = m->dv;
  p.out_p = out_p;
  p.out_p_dtype = m->in_dt;
  p.out_p_stride_p = m->sp;
  p.out_p_stride_t = m->st;
  p.out_p_stride_h = m->sh;
  p.lse_p = lse_p;
  p.lse_p_stride_p = m->lsp;
  p.lse_p_stride_t = m->lst;
  p.out = out;
  p.out_dtype = m->out_dt;
  p.out_stride_t = m->ost;
  p.out_stride_h = m->osh;
  p.lse = m->want_lse ? lse : NULL;
  p.sink = sink;
  p.lse_stride_t = m->lse_st;
  return p;
}

static void mg_check(t_case *tc, const mg_problem *m, const void *dense_out, const float *dense_lse,
                     const double *want, const double *want_lse, const char *against, int xbackend) {
  char what[96];
  const t_shape so = t_shape3(m->T, m->N, m->dv);
  snprintf(what, sizeof what, "out vs %s", against);
  if (m->out_dt == SMLA_DTYPE_F32) t_check_f32(tc, what, dense_out, want, so, TOL_MERGE_F32);
  else {
    t_check_bf16(tc, what, dense_out, want, so, xbackend ? TOL_MERGE_BF16_XBACKEND : TOL_MERGE_BF16);
    t_check_bf16_unbiased(tc, what, dense_out, want, m->T * m->N, m->dv, MERGE_BF16_MODEL);
  }
  if (m->want_lse) {
    snprintf(what, sizeof what, "lse vs %s", against);
    t_check_f32(tc, what, dense_lse, want_lse, t_shape2(m->T, m->N), TOL_MERGE_LSE);
  }
}

static void mg_run(t_case *tc, const mg_problem *m) {
  const int64_t TN = m->T * m->N, ND = TN * m->dv;
  const size_t es = dt_size(m->out_dt);
  double *want = t_xmalloc((size_t)ND * 8), *want_lse = t_xmalloc((size_t)TN * 8);
  const smla_merge_params hp = mg_params(m, m->out_p, m->lse_p, NULL, NULL, m->sink);
  ref_merge(&hp, want, want_lse);
  double *cpu = NULL, *cpu_lse = NULL;
  const int64_t out_elems = t_span(m->T, m->ost, t_span(m->N, m->osh, m->dv));
  const int64_t lse_elems = t_span(m->T, m->lse_st, m->N);
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    void *d_in = t_upload(tc, m->out_p, (size_t)m->out_p_elems * dt_size(m->in_dt));
    void *d_lse_p = t_upload(tc, m->lse_p, (size_t)m->lse_p_elems * 4);
    void *d_out = t_alloc(tc, (size_t)out_elems * es);
    void *d_lse = t_alloc(tc, (size_t)lse_elems * 4);
    float *d_sink = m->sink ? t_upload(tc, m->sink, (size_t)m->N * 4) : NULL;
    void *raw = t_xmalloc((size_t)out_elems * es), *dense = t_xmalloc((size_t)ND * es);
    float *raw_lse = t_xmalloc((size_t)lse_elems * 4), *dense_lse = t_xmalloc((size_t)TN * 4);
    if (d_in && d_lse_p && d_out && d_lse && (d_sink || !m->sink) && t_memset(tc, d_out, T_POISON, (size_t)out_elems * es) == 0 &&
        t_memset(tc, d_lse, T_POISON, (size_t)lse_elems * 4) == 0) {
      const smla_merge_params p = mg_params(m, d_in, d_lse_p, d_out, d_lse, d_sink);
      if (t_expect_ok(tc, smla_merge_states(ctx, &p, NULL), ctx, "smla_merge_states") &&
          t_sync(tc) == 0 && t_download(tc, raw, d_out, (size_t)out_elems * es) == 0 &&
          t_download(tc, raw_lse, d_lse, (size_t)lse_elems * 4) == 0) {
        t_gather(dense, raw, es, m->T, m->N, m->dv, m->ost, m->osh);
        t_gather(dense_lse, raw_lse, 4, m->T, 1, m->N, m->lse_st, 0);
        t_check_gaps(tc, "out", raw, es, m->T, m->N, m->dv, m->ost, m->osh);
        if (m->want_lse) t_check_gaps(tc, "lse", raw_lse, 4, m->T, 1, m->N, m->lse_st, 0);
        mg_check(tc, m, dense, dense_lse, want, want_lse, "reference", 0);
        if (cpu) mg_check(tc, m, dense, dense_lse, cpu, cpu_lse, "cpu backend", 1);
        if (b == T_CPU) {
          cpu = t_xmalloc((size_t)ND * 8);
          cpu_lse = t_xmalloc((size_t)TN * 8);
          if (m->out_dt == SMLA_DTYPE_F32) t_f32_to_double(dense, cpu, ND);
          else t_bf16_to_double(dense, cpu, ND);
          t_f32_to_double(dense_lse, cpu_lse, TN);
        }
      }
    }
    free(raw);
    free(dense);
    free(raw_lse);
    free(dense_lse);
    t_free(tc, d_in);
    t_free(tc, d_lse_p);
    t_free(tc, d_out);
    t_free(tc, d_lse);
    t_free(tc, d_sink);
  }
  free(cpu);
  free(cpu_lse);
  free(want);
  free(want_lse);
}

static void merge_simple(t_case *tc, int P, int64_t T, int N, int dv, smla_dtype in,
                         smla_dtype out, int want_lse) {
  mg_problem m;
  mg_init(&m, P, T, N, dv, in, out);
  m.want_lse = want_lse;
  mg_run(tc, &m);
  mg_free(&m);
}

static void c_merge_f32(t_case *tc) { merge_simple(tc, 4, 5, 16, 512, SMLA_DTYPE_F32, SMLA_DTYPE_F32, 1); }
static void c_merge_bf16(t_case *tc) { merge_simple(tc, 3, 5, 16, 512, SMLA_DTYPE_BF16, SMLA_DTYPE_BF16, 1); }
static void c_merge_bf16_to_f32(t_case *tc) { merge_simple(tc, 5, 3, 8, 512, SMLA_DTYPE_BF16, SMLA_DTYPE_F32, 1); }
static void c_merge_f32_to_bf16(t_case *tc) { merge_simple(tc, 2, 3, 8, 512, SMLA_DTYPE_F32, SMLA_DTYPE_BF16, 1); }
static void c_merge_dv_small(t_case *tc) { merge_simple(tc, 3, 4, 8, 40, SMLA_DTYPE_F32, SMLA_DTYPE_F32, 1); }
static void c_merge_p1(t_case *tc) { merge_simple(tc, 1, 6, 16, 512, SMLA_DTYPE_F32, SMLA_DTYPE_F32, 1); }
static void c_merge_no_lse(t_case *tc) { merge_simple(tc, 3, 3, 8, 512, SMLA_DTYPE_F32, SMLA_DTYPE_F32, 0); }
/* More partials than a warp's lanes (each lane folds several) and than the GPU kernel's
 * staged chunk of 128 weights; dv 36 and 17 take the 4-wide and the scalar paths. */
static void c_merge_p40(t_case *tc) { merge_simple(tc, 40, 3, 4, 36, SMLA_DTYPE_F32, SMLA_DTYPE_BF16, 1); }
static void c_merge_p150(t_case *tc) { merge_simple(tc, 150, 2, 3, 17, SMLA_DTYPE_BF16, SMLA_DTYPE_F32, 1); }

/* About 40% of the partials are -inf (out_p NaN: must not leak); (0, 0) has a single
 * live partial, whose weight must be exactly 1. */
static void c_merge_neg_inf(t_case *tc) {
  mg_problem m;
  mg_init(&m, 4, 5, 16, 512, SMLA_DTYPE_BF16, SMLA_DTYPE_F32);
  for (int p = 0; p < m.P; p++)
    for (int64_t t = 0; t < m.T; t++)
      for (int h = 0; h < m.N; h++)
        if (t_rng_int(0, 4) < 2) mg_empty(&m, p, t, h);
  for (int p = 1; p < m.P; p++) mg_empty(&m, p, 0, 0);
  *mg_lse(&m, 0, 0, 0) = 3.0f;
  mg_run(tc, &m);
  mg_free(&m);
}

/* Every partial empty: row 1 entirely, and (3, 5): out 0, lse -inf. */
static void c_merge_all_empty(t_case *tc) {
  mg_problem m;
  mg_init(&m, 3, 4, 8, 512, SMLA_DTYPE_F32, SMLA_DTYPE_BF16);
  for (int p = 0; p < m.P; p++) {
    for (int h = 0; h < m.N; h++) mg_empty(&m, p, 1, h);
    mg_empty(&m, p, 3, 5);
  }
  mg_run(tc, &m);
  mg_free(&m);
}

/* NaN or +inf lse_p makes that (t, h) NaN in out and lse: (0, 1) NaN among finite ones,
 * (2, 3) +inf, (1, 6) NaN with every other partial -inf. */
static void c_merge_nan(t_case *tc) {
  mg_problem m;
  mg_init(&m, 3, 3, 8, 512, SMLA_DTYPE_F32, SMLA_DTYPE_F32);
  *mg_lse(&m, 2, 0, 1) = NAN;
  *mg_lse(&m, 0, 2, 3) = INFINITY;
  mg_empty(&m, 0, 1, 6);
  mg_empty(&m, 2, 1, 6);
  *mg_lse(&m, 1, 1, 6) = NAN;
  mg_run(tc, &m);
  mg_free(&m);
}

/* Sinked partials (smla.h, merge): sinks from far below to far above the partials' lse
 * (-10..20 against lse_p in -5..15), a third of the partials -inf, and one (t, h) whose
 * partials are all -inf (out 0, lse -inf, whatever the sink). bf16 partials, bf16 out. */
static void merge_sink(t_case *tc, int P, smla_dtype in, smla_dtype out) {
  mg_problem m;
  mg_init(&m, P, 5, 16, 512, in, out);
  m.sink = t_xmalloc((size_t)m.N * 4);
  for (int h = 0; h < m.N; h++) m.sink[h] = (float)t_rng_uniform(-10.0, 20.0);
  for (int p = 0; p < m.P; p++)
    for (int64_t t = 0; t < m.T; t++)
      for (int h = 0; h < m.N; h++)
        if (t_rng_int(0, 2) == 0) mg_empty(&m, p, t, h);
  for (int p = 0; p < m.P; p++) mg_empty(&m, p, 2, 7);
  mg_run(tc, &m);
  mg_free(&m);
}
static void c_merge_sink(t_case *tc) { merge_sink(tc, 4, SMLA_DTYPE_BF16, SMLA_DTYPE_BF16); }
static void c_merge_sink_p40_f32(t_case *tc) { merge_sink(tc, 40, SMLA_DTYPE_F32, SMLA_DTYPE_F32); }

void t_register_ops_cases(void) {
  t_register("convert_plain", c_convert_plain);
  t_register("convert_compact", c_convert_compact);
  t_register("convert_context_parallel", c_convert_context_parallel);
  t_register("convert_invalid_negative_position", c_invalid_negative_pos);
  t_register("convert_invalid_past_block_table", c_invalid_past_block_table);
  t_register("convert_invalid_negative_block", c_invalid_negative_block);
  t_register("convert_invalid_req_id", c_invalid_req_id);
  t_register("convert_invalid_slot_overflow", c_invalid_slot_overflow);
  t_register("convert_block_size_1", c_block_size_1);
  t_register("convert_block_size_64", c_block_size_64);
  t_register("convert_block_size_48", c_block_size_48);
  t_register("convert_in_place", c_convert_in_place);
  t_register("merge_f32", c_merge_f32);
  t_register("merge_bf16", c_merge_bf16);
  t_register("merge_bf16_in_f32_out", c_merge_bf16_to_f32);
  t_register("merge_f32_in_bf16_out", c_merge_f32_to_bf16);
  t_register("merge_dv_40", c_merge_dv_small);
  t_register("merge_P_1", c_merge_p1);
  t_register("merge_sink", c_merge_sink);
  t_register("merge_sink_p40_f32", c_merge_sink_p40_f32);
  t_register("merge_lse_null", c_merge_no_lse);
  t_register("merge_p40", c_merge_p40);
  t_register("merge_p150", c_merge_p150);
  t_register("merge_neg_inf", c_merge_neg_inf);
  t_register("merge_all_empty", c_merge_all_empty);
  t_register("merge_nan", c_merge_nan);
}
