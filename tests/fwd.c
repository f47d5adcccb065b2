/* fwd.c: see fwd.h. */
#include "fwd.h"

#include "devmem.h"
#include "ref.h"
#include "numerics.h" /* bf16 codec of test inputs only */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances of the forward outputs (every backend vs the reference, and CUDA vs CPU).
 *
 * out is bf16 [T][N][512]: rounding the float result to bf16 costs up to 2^-8 relative
 * (3.9e-3); the float softmax and accumulation over <= K rows add ~1e-6 relative. So
 * |got - ref| <= 2e-3 + 1e-2 |ref|, which also admits the one bf16 ulp (2^-7) that two
 * correctly rounding backends can differ by. The CUDA kernel rounds the probabilities P to
 * bf16 before P.V (round to nearest: 2^-8 relative each, bf16's unit roundoff; the
 * denominator sums the unrounded p) and uses ex2.approx: out, a P-weighted mean of values
 * in [-1, 1], moves by at most 2^-8 sum_j p_j |v_j| <= 3.9e-3 from that in the worst case
 * (every rounding the same way), by ~2^-8 sqrt(sum_j p_j^2 v_j^2) typically (independent
 * roundings partly cancel), far inside 2e-3 for the spread-out P of these tests. The CPU
 * backend could pass a tighter bound; one bound keeps GPU-vs-CPU and both-vs-reference
 * comparable. */
static const t_tol TOL_OUT = {2e-3, 1e-2};
/* lse and max_logit are float32. A logit is sm_scale (~0.25) times a dot of 576 products
 * that are exact in float (bf16 x bf16; e4m3 x a power-of-two scale), summed in float with
 * partial sums |s| <~ 30: ~sqrt(576) * 2^-24 * 30 ~ 4e-5 before the scale, ~1e-5 after;
 * log Z adds a few float ulps of |lse| <~ 12. So |got - ref| <= 1e-4 + 1e-5 |ref|: about
 * 10x the expected error, and far below what a wrong scale, log base or mask gives. */
static const t_tol TOL_LSE = {1e-4, 1e-5};

/* The statistical checks of out (t_check_bf16_unbiased), which a biased or too-large
 * error fails where TOL_OUT lets it pass (TOL_OUT admits a full bf16 ulp of bias).
 * Error model, u = 2^-8 (bf16 unit roundoff):
 *  - out: each backend rounds its float result to bf16 once, to nearest: a zero-mean error
 *    of at most u |r|, sd <= u |r| / sqrt(3) (uniform). Against the reference one such
 *    rounding (elem_var = u^2 / 3), against another backend two (2 u^2 / 3).
 *  - P: the GPU kernels round the probabilities to bf16 before P.V (zero-mean, |e| <= u);
 *    with one dominant entry that error is shared by all 512 values of the (t, h) row, so
 *    it is fully correlated inside the row: row_var = u^2 / 3 per CUDA side of the
 *    comparison (0 for the CPU against the reference, 2 u^2 / 3 for a GPU run against
 *    another GPU run with another split). out_model() below picks them.
 *  - float softmax and accumulation over <= K rows: ~1e-6 relative, covered by 1e-5.
 * bias: 6 standard deviations of the sum under that model (a correct kernel fails one
 * check in ~5e8), widened by the bias of the exactly rounded reference where values sit
 * unevenly between bf16 numbers (harness.h). Frobenius: the expected relative error is
 * sqrt(elem_var + row_var) = 1.15 u at most (row term at its worst, a one-hot P); 2 u
 * leaves room for the spread of small samples. Truncating instead of
 * rounding gives a bias of ~-0.69 u (-2.7e-3) on every element; a skipped tile, a wrong
 * scale or a dropped rope part gives relative errors of 1e-2 and more. */
#define U_BF16 (1.0 / 256.0)
/* The model of one comparison: one rounding variance u^2 / 3 per side that rounds out
 * (a backend; the exact reference does not), one per row per side that rounds P (a CUDA
 * backend; the CPU keeps P in float). */
static t_round_model out_model(int res_device, int ref_source) {
  const double v = U_BF16 * U_BF16 / 3.0;
  const int ref_rounds = ref_source != FWD_EXACT;
  const int p_rounds = (res_device >= 0) + (ref_source >= 0);
  const t_round_model m = {v * (1 + ref_rounds), v * p_rounds, 6.0, 1e-5, 2.0 * U_BF16};
  return m;
}

void fwd_defaults(fwd_problem *pb, int64_t T, int N, int K, int dr, smla_cache_format format) {
  memset(pb, 0, sizeof *pb);
  pb->T = T;
  pb->N = N;
  pb->K = K;
  pb->dr = dr;
  pb->format = format;
  pb->S = 2 * (int64_t)K + 61; /* odd: no accidental alignment with block sizes */
  if (pb->S < 128) pb->S = 128;
  pb->row_bytes = (int64_t)smla_cache_row_size(format, dr);
  pb->scale = 1.0f / 300.0f; /* FP8_TENSOR: [-1, 1] -> [-300, 300], inside e4m3's +-448 */
  pb->qn_sh = SMLA_DC;
  pb->qn_st = (int64_t)N * SMLA_DC;
  pb->qp_sh = dr;
  pb->qp_st = (int64_t)N * dr;
  pb->slots_stride = K;
  pb->out_sh = SMLA_DC;
  pb->out_st = (int64_t)N * SMLA_DC;
  pb->lse_st = N;
  pb->ml_st = N;
  /* 6 / sqrt(Dqk): logits have std ~2 for q, latent uniform in [-1, 1] (dot std 8), so the
   * softmax is peaked (max ~3.5 std over 2048 entries) but not one-hot. */
  pb->sm_scale = (float)(6.0 / sqrt((double)(SMLA_DC + dr)));
  pb->want_lse = pb->want_ml = pb->want_bad = 1;
  pb->max_tokens = T < 1 ? 1 : T;
  pb->repeat = 1;
}

uint16_t *fwd_q_nope(fwd_problem *pb, int64_t t, int h) {
  return pb->qn_buf + t * pb->qn_st + (int64_t)h * pb->qn_sh;
}

uint16_t *fwd_q_pe(fwd_problem *pb, int64_t t, int h) {
  if (pb->q_concat) return fwd_q_nope(pb, t, h) + SMLA_DC;
  return pb->qp_buf + t * pb->qp_st + (int64_t)h * pb->qp_sh;
}

int32_t *fwd_slot_row(fwd_problem *pb, int64_t t) { return pb->slots + t * pb->slots_stride; }

static void fill_u16(uint16_t *p, int64_t n, uint16_t v) {
  for (int64_t i = 0; i < n; i++) p[i] = v;
}

void fwd_make_inputs(fwd_problem *pb) {
  const int64_t T = pb->T;
  const int N = pb->N, K = pb->K, dr = pb->dr;
  if (pb->q_concat) {
    pb->qp_st = pb->qn_st;
    pb->qp_sh = pb->qn_sh;
  }
  /* Gaps between the q rows are NaN: reading outside the tensor shows in out. */
  pb->qn_elems = t_span(T, pb->qn_st, t_span(N, pb->qn_sh, pb->q_concat ? SMLA_DC + dr : SMLA_DC));
  pb->qn_buf = t_xaligned((size_t)pb->qn_elems * 2);
  fill_u16(pb->qn_buf, pb->qn_elems, T_BF16_NAN);
  if (dr && !pb->q_concat) {
    pb->qp_elems = t_span(T, pb->qp_st, t_span(N, pb->qp_sh, dr));
    pb->qp_buf = t_xaligned((size_t)pb->qp_elems * 2);
    fill_u16(pb->qp_buf, pb->qp_elems, T_BF16_NAN);
  }
  for (int64_t t = 0; t < T; t++)
    for (int h = 0; h < N; h++) {
      t_fill_bf16(fwd_q_nope(pb, t, h), SMLA_DC, -1.0, 1.0);
      if (dr) t_fill_bf16(fwd_q_pe(pb, t, h), (size_t)dr, -1.0, 1.0);
    }
  /* Slots: uniform in [0, S), so duplicates happen; entries between rows are garbage that
   * would be counted as bad inputs if read. */
  pb->slots_elems = t_span(T, pb->slots_stride, K);
  pb->slots = t_xmalloc((size_t)pb->slots_elems * 4);
  for (int64_t i = 0; i < pb->slots_elems; i++) pb->slots[i] = INT32_MIN;
  for (int64_t t = 0; t < T; t++)
    for (int k = 0; k < K; k++) fwd_slot_row(pb, t)[k] = (int32_t)t_rng_int(0, pb->S - 1);
  pb->lengths = t_xmalloc((size_t)(T > 0 ? T : 1) * 4);
  for (int64_t t = 0; t < T; t++) pb->lengths[t] = K;
  pb->sink = t_xmalloc((size_t)N * 4);
  /* sink vs a row max of ~5..8: from negligible to dominating the denominator */
  for (int h = 0; h < N; h++) pb->sink[h] = (float)t_rng_uniform(2.0, 9.0);
}

/* The smla_convert_params of pb's indices over the given copies (host or device) of its
 * request ids, block table and positions (uncompacted, no outputs). */
static smla_convert_params ix_params(const fwd_problem *pb, const int32_t *req,
                                     const int32_t *bt, const int32_t *local) {
  smla_convert_params c;
  memset(&c, 0, sizeof c);
  c.num_tokens = pb->T;
  c.topk = pb->K;
  c.req_id = req;
  c.block_table = bt;
  c.num_requests = pb->ix_R;
  c.blocks_per_request = pb->ix_B;
  c.block_table_stride = pb->ix_bt_stride;
  c.block_size = pb->ix_bs;
  c.local = local;
  c.local_stride = pb->ix_local_stride;
  c.cp_size = pb->ix_cp_size;
  c.cp_rank = pb->ix_cp_rank;
  c.cp_interleave = pb->ix_cp_interleave;
  return c;
}

void fwd_use_indices(fwd_problem *pb, int bs, int cp_size, int cp_rank, int interleave) {
  const int64_t T = pb->T;
  const int K = pb->K;
  const int cp = cp_size >= 2 ? cp_size : 1;
  pb->use_indices = 1;
  pb->ix_bs = bs;
  pb->ix_cp_size = cp_size;
  pb->ix_cp_rank = cp_rank;
  pb->ix_cp_interleave = interleave;
  pb->ix_R = 3;
  /* Positions up to ~2K per request (cp x that over all ranks): blocks cover them all. */
  pb->ix_B = (int)((2 * (int64_t)K + bs - 1) / bs) + 1;
  pb->ix_bt_stride = pb->ix_B + 5;
  pb->ix_local_stride = K + 3;
  pb->ix_req = t_xmalloc((size_t)(T > 0 ? T : 1) * 4);
  for (int64_t t = 0; t < T; t++) /* one row in ~8 with a request id out of range */
    pb->ix_req[t] = t_rng_int(0, 7) == 0 ? (t_rng_int(0, 1) ? pb->ix_R : -1)
                                        : (int32_t)t_rng_int(0, pb->ix_R - 1);
  const int64_t bt_elems = t_span(pb->ix_R, pb->ix_bt_stride, pb->ix_B);
  pb->ix_bt = t_xmalloc((size_t)bt_elems * 4);
  for (int64_t i = 0; i < bt_elems; i++) pb->ix_bt[i] = INT32_MIN; /* gaps: never read */
  const int64_t full_blocks = pb->S / bs; /* blocks wholly inside the cache */
  for (int r = 0; r < pb->ix_R; r++)
    for (int b = 0; b < pb->ix_B; b++) {
      const int64_t u = t_rng_int(0, 99);
      pb->ix_bt[r * pb->ix_bt_stride + b] =
          u < 4   ? -1                                                  /* unmapped */
          : u < 7 ? (int32_t)(full_blocks + t_rng_int(1, 3))            /* past the cache */
                  : (int32_t)t_rng_int(0, full_blocks > 0 ? full_blocks - 1 : 0);
    }
  const int64_t local_elems = t_span(T, pb->ix_local_stride, K);
  pb->ix_local = t_xmalloc((size_t)local_elems * 4);
  for (int64_t i = 0; i < local_elems; i++) pb->ix_local[i] = INT32_MIN; /* gaps */
  const int64_t npos = (int64_t)pb->ix_B * bs * cp; /* positions over all ranks */
  for (int64_t t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      const int64_t u = t_rng_int(0, 99);
      pb->ix_local[t * pb->ix_local_stride + k] =
          u < 3   ? -1
          : u < 5 ? (int32_t)-t_rng_int(2, 1000)          /* negative: invalid, not bad */
          : u < 7 ? (int32_t)(npos + t_rng_int(0, 500))    /* past the block table */
                  : (int32_t)t_rng_int(0, npos - 1);
    }
  const smla_convert_params c = ix_params(pb, pb->ix_req, pb->ix_bt, pb->ix_local);
  int32_t *dense = t_xmalloc((size_t)(T > 0 ? T : 1) * (size_t)K * 4);
  ref_convert(&c, dense, NULL);
  for (int64_t t = 0; t < T; t++) memcpy(fwd_slot_row(pb, t), dense + t * K, (size_t)K * 4);
  free(dense);
}

/* Rows no used entry points at: NaN in every value (and scale), so reading one shows. */
static void nan_row(const fwd_problem *pb, uint8_t *row) {
  const int dr = pb->dr;
  uint16_t h = T_BF16_NAN;
  const float fnan = NAN;
  switch (pb->format) {
  case SMLA_CACHE_BF16:
    for (int i = 0; i < SMLA_DC + dr; i++) memcpy(row + 2 * i, &h, 2);
    break;
  case SMLA_CACHE_FP8_TENSOR:
    memset(row, T_E4M3_NAN, (size_t)(SMLA_DC + dr));
    break;
  case SMLA_CACHE_FP8_DS:
    memset(row, T_E4M3_NAN, SMLA_DC);
    for (int g = 0; g < 4; g++) memcpy(row + SMLA_DC + 4 * g, &fnan, 4);
    for (int i = 0; i < dr; i++) memcpy(row + SMLA_DC + 16 + 2 * i, &h, 2);
    break;
  }
}

static int64_t clamp_len(const fwd_problem *pb, int64_t t) {
  if (!pb->use_lengths) return pb->K;
  const int64_t l = pb->lengths[t];
  return l < 0 ? 0 : (l > pb->K ? pb->K : l);
}

/* A writer of FP8_DS rows that is not smla's, as another engine's quantizer may be: each
 * group gets a magnitude 2^e (e uniform in -20..8), values uniform in +-2^e, and the plain
 * scale amax / 448 in float (not a power of two). One group in 8 is all zero with scale 0
 * (amax / 448 of a zero group; its codes are 0, its values 0). One in 8 is saturated: its
 * scale is amax / 600, so the largest values clip to the +-448 codes. Codes are rounded
 * to nearest by the reference's encoder; the reference decodes what was written, so the
 * test only asks that every backend read these bytes as e4m3 * scale in float. */
static void foreign_ds_row(int dr, uint8_t *row) {
  float scales[4];
  for (int g = 0; g < 4; g++) {
    const int kind = (int)t_rng_int(0, 7); /* 0: all zero, 1: saturated, else plain */
    const double mag = ldexp(1.0, (int)t_rng_int(-20, 8));
    float v[128];
    double amax = 0.0;
    for (int i = 0; i < 128; i++) {
      v[i] = kind == 0 ? 0.0f : (float)(mag * t_rng_uniform(-1.0, 1.0));
      if (fabs(v[i]) > amax) amax = fabs(v[i]);
    }
    scales[g] = kind == 0 ? 0.0f : (float)amax / (kind == 1 ? 600.0f : 448.0f);
    for (int i = 0; i < 128; i++)
      row[128 * g + i] = kind == 0 ? 0 : ref_double_to_e4m3((double)(v[i] / scales[g]));
  }
  memcpy(row + SMLA_DC, scales, sizeof scales);
  for (int i = 0; i < dr; i++) {
    const uint16_t h = t_rand_bf16(-1.0, 1.0);
    memcpy(row + SMLA_DC + 16 + 2 * i, &h, 2);
  }
}

int fwd_make_cache(t_case *tc, fwd_problem *pb) {
  const int64_t S = pb->S, rb = pb->row_bytes;
  const int dr = pb->dr;
  pb->cache = t_xaligned((size_t)(S * rb));
  memset(pb->cache, 0xff, (size_t)(S * rb)); /* row padding beyond the format's size */
  unsigned char *used = t_xcalloc((size_t)S, 1);
  for (int64_t t = 0; t < pb->T; t++) {
    const int64_t len = clamp_len(pb, t);
    for (int64_t i = 0; i < len; i++) {
      const int32_t s = fwd_slot_row(pb, t)[i];
      if (s >= 0 && s < S) used[s] = 1;
    }
  }
  int64_t U = 0;
  for (int64_t s = 0; s < S; s++) U += used[s];
  int rc = 0;
  if (U > 0 && pb->foreign_ds && pb->format == SMLA_CACHE_FP8_DS) {
    for (int64_t s = 0; s < S; s++)
      if (used[s]) foreign_ds_row(dr, pb->cache + s * rb);
  } else if (U > 0) {
    /* The used rows: random bf16 latent and rope, written in the cache's format by the
     * library's CPU writer; the reference decodes the bytes that were written. */
    uint16_t *kv = t_xaligned((size_t)U * SMLA_DC * 2);
    uint16_t *pe = t_xaligned((size_t)U * (size_t)(dr ? dr : 1) * 2);
    int64_t *slot = t_xmalloc((size_t)U * 8);
    t_fill_bf16(kv, (size_t)U * SMLA_DC, -1.0, 1.0);
    t_fill_bf16(pe, (size_t)U * (size_t)dr, -1.0, 1.0);
    /* FP8_DS: each group of each row its own magnitude (2^0..2^-5), so that the writer
     * picks different power-of-two scales per group and per row: a reader that applies
     * one group's scale to all four, or one row's to another, is wrong by up to 32x. */
    if (pb->format == SMLA_CACHE_FP8_DS)
      for (int64_t i = 0; i < U * (SMLA_DC / 128); i++) {
        const float f = ldexpf(1.0f, -(int)t_rng_int(0, 5));
        for (int j = 0; j < 128; j++) kv[i * 128 + j] = smla_f32_to_bf16(smla_bf16_to_f32(kv[i * 128 + j]) * f);
      }
    int64_t u = 0;
    for (int64_t s = 0; s < S; s++)
      if (used[s]) slot[u++] = s;
    smla_cache_write_params w;
    memset(&w, 0, sizeof w);
    w.num_tokens = U;
    w.kv_c = kv;
    w.kv_c_stride = SMLA_DC;
    w.k_pe = dr ? pe : NULL;
    w.k_pe_stride = dr;
    w.slot = slot;
    w.cache = (smla_cache){pb->format, dr, S, rb, pb->cache, pb->scale};
    smla_context *cpu = g_backends[T_CPU].ctx;
    const smla_status st = cpu ? smla_cache_write(cpu, &w, NULL) : SMLA_ERR_INTERNAL;
    if (!t_expect_ok(tc, st, cpu, "test setup: smla_cache_write (CPU) of the used rows")) rc = -1;
    free(kv);
    free(pe);
    free(slot);
  }
  for (int64_t s = 0; s < S; s++)
    if (!used[s]) nan_row(pb, pb->cache + s * rb);
  free(used);
  return rc;
}

void fwd_free(fwd_problem *pb) {
  free(pb->qn_buf);
  free(pb->qp_buf);
  free(pb->slots);
  free(pb->lengths);
  free(pb->sink);
  free(pb->cache);
  free(pb->ix_req);
  free(pb->ix_bt);
  free(pb->ix_local);
  pb->ix_req = pb->ix_bt = pb->ix_local = NULL;
  pb->qn_buf = pb->qp_buf = NULL;
  pb->slots = pb->lengths = NULL;
  pb->sink = NULL;
  pb->cache = NULL;
}

/* The params of pb over the given copies of its buffers (host or device). */
static smla_forward_params params_for(const fwd_problem *pb, const uint16_t *qn,
                                      const uint16_t *qp, void *cache, const int32_t *slots,
                                      const int32_t *lengths, const float *sink, void *out,
                                      float *lse, float *ml, uint64_t *bad) {
  smla_forward_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = pb->T;
  p.num_heads = pb->N;
  p.topk = pb->K;
  p.q_nope = qn;
  p.q_nope_stride_t = pb->qn_st;
  p.q_nope_stride_h = pb->qn_sh;
  p.q_pe = pb->dr == 0 ? NULL : pb->q_concat ? qn + SMLA_DC : qp;
  p.q_pe_stride_t = pb->qp_st;
  p.q_pe_stride_h = pb->qp_sh;
  p.cache = (smla_cache){pb->format, pb->dr, pb->S, pb->row_bytes, cache, pb->scale};
  p.slots = slots;
  p.slots_stride = pb->slots_stride;
  p.lengths = pb->use_lengths ? lengths : NULL;
  p.sm_scale = pb->sm_scale;
  p.softcap = pb->softcap;
  p.sink = pb->use_sink ? sink : NULL;
  p.out = out;
  p.out_stride_t = pb->out_st;
  p.out_stride_h = pb->out_sh;
  p.lse = pb->want_lse ? lse : NULL;
  p.lse_stride_t = pb->lse_st;
  p.max_logit = pb->want_ml ? ml : NULL;
  p.max_logit_stride_t = pb->ml_st;
  p.bad_inputs = pb->want_bad ? bad : NULL;
  return p;
}

void fwd_reference(const fwd_problem *pb, fwd_ref *r) {
  const size_t TN = (size_t)pb->T * (size_t)pb->N;
  r->out = t_xmalloc(TN * SMLA_DC * sizeof(double));
  r->lse = t_xmalloc(TN * sizeof(double));
  r->ml = t_xmalloc(TN * sizeof(double));
  r->bad = 0;
  r->source = FWD_EXACT;
  r->pabs = t_xmalloc(TN * SMLA_DC * sizeof(double));
  const smla_forward_params p = params_for(pb, pb->qn_buf, pb->qp_buf, pb->cache, pb->slots,
                                           pb->lengths, pb->sink, NULL, NULL, NULL, NULL);
  ref_forward(&p, r->out, r->lse, r->ml, &r->bad, r->pabs);
}

void fwd_ref_free(fwd_ref *r) {
  if (r->source == FWD_EXACT) free(r->pabs);
  r->pabs = NULL;
  free(r->out);
  free(r->lse);
  free(r->ml);
  r->out = r->lse = r->ml = NULL;
}

void fwd_result_free(fwd_result *r) {
  free(r->out);
  free(r->lse);
  free(r->ml);
  free(r->out2);
  free(r->lse2);
  free(r->ml2);
  memset(r, 0, sizeof *r);
}

static smla_status exec_core(smla_context *ctx, int dev, const fwd_problem *pb,
                             fwd_result *res, char *err, size_t err_bytes) {
  memset(res, 0, sizeof *res);
  res->device = dev;
  err[0] = '\0';
  smla_status st = SMLA_ERR_INTERNAL; /* harness failures; err then starts "test harness" */
  void *d_qn = NULL, *d_qp = NULL, *d_cache = NULL, *d_slots = NULL, *d_len = NULL;
  void *d_sink = NULL, *d_out = NULL, *d_lse = NULL, *d_ml = NULL, *d_bad = NULL, *ws = NULL;
  void *d_req = NULL, *d_bt = NULL, *d_local = NULL;
  smla_plan *plan = NULL;
  const int64_t T = pb->T, N = pb->N;
  const uint64_t zero = 0;
  res->out_elems = t_span(T, pb->out_st, t_span(N, pb->out_sh, SMLA_DC));
  res->lse_elems = pb->want_lse ? t_span(T, pb->lse_st, N) : 0;
  res->ml_elems = pb->want_ml ? t_span(T, pb->ml_st, N) : 0;

#define UPLOAD(dst, src, bytes)                                                             \
  do {                                                                                      \
    dst = dm_alloc(dev, (bytes));                                                           \
    if (!dst || dm_upload(dev, dst, (src), (bytes))) {                                      \
      snprintf(err, err_bytes, "test harness: upload of " #src ": %s", dm_error());         \
      goto done;                                                                            \
    }                                                                                       \
  } while (0)
#define POISONED(dst, bytes)                                                                \
  do {                                                                                      \
    dst = dm_alloc(dev, (bytes));                                                           \
    if (!dst || dm_memset(dev, dst, T_POISON, (bytes))) {                                   \
      snprintf(err, err_bytes, "test harness: poisoned output: %s", dm_error());            \
      goto done;                                                                            \
    }                                                                                       \
  } while (0)

  UPLOAD(d_qn, pb->qn_buf, (size_t)pb->qn_elems * 2);
  if (pb->qp_buf) UPLOAD(d_qp, pb->qp_buf, (size_t)pb->qp_elems * 2);
  UPLOAD(d_cache, pb->cache, (size_t)(pb->S * pb->row_bytes));
  UPLOAD(d_slots, pb->slots, (size_t)pb->slots_elems * 4);
  if (pb->use_lengths) UPLOAD(d_len, pb->lengths, (size_t)(T > 0 ? T : 1) * 4);
  if (pb->use_sink) UPLOAD(d_sink, pb->sink, (size_t)N * 4);
  if (pb->use_indices) {
    UPLOAD(d_req, pb->ix_req, (size_t)(T > 0 ? T : 1) * 4);
    UPLOAD(d_bt, pb->ix_bt, (size_t)t_span(pb->ix_R, pb->ix_bt_stride, pb->ix_B) * 4);
    UPLOAD(d_local, pb->ix_local, (size_t)t_span(T, pb->ix_local_stride, pb->K) * 4);
  }
  UPLOAD(d_bad, &zero, 8);
  POISONED(d_out, (size_t)res->out_elems * 2);
  if (pb->want_lse) POISONED(d_lse, (size_t)res->lse_elems * 4);
  if (pb->want_ml) POISONED(d_ml, (size_t)res->ml_elems * 4);
#undef UPLOAD
#undef POISONED

  smla_plan_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.max_tokens = pb->max_tokens;
  desc.num_heads = pb->N;
  desc.topk = pb->K;
  desc.dr = pb->dr;
  desc.format = pb->format;
  desc.flags = pb->flags;
  desc.num_splits = pb->num_splits;
  desc.heads_per_block = pb->heads_per_block;
  smla_status s;
  if (pb->caller_workspace) {
    size_t bytes = 0;
    s = smla_plan_workspace_size(ctx, &desc, &bytes);
    if (s != SMLA_OK) {
      snprintf(err, err_bytes, "smla_plan_workspace_size returned %s (%s)",
               smla_status_string(s), smla_context_message(ctx));
      st = s;
      goto done;
    }
    ws = dm_alloc(dev, bytes);
    if (!ws) {
      snprintf(err, err_bytes, "test harness: workspace of %zu bytes: %s", bytes, dm_error());
      goto done;
    }
    s = smla_plan_create(ctx, &desc, ws, bytes, &plan);
  } else {
    s = smla_plan_create(ctx, &desc, NULL, 0, &plan);
  }
  if (s != SMLA_OK) {
    snprintf(err, err_bytes, "smla_plan_create returned %s (%s)", smla_status_string(s),
             smla_context_message(ctx));
    st = s;
    goto done;
  }
  snprintf(res->describe, sizeof res->describe, "%s", smla_plan_describe(plan));
  smla_forward_params p = params_for(pb, d_qn, d_qp, d_cache, d_slots, d_len, d_sink, d_out,
                                     d_lse, d_ml, d_bad);
  const smla_convert_params ix = ix_params(pb, d_req, d_bt, d_local);
  if (pb->use_indices) p.slots = NULL;
#define RUN()                                                                              \
  (pb->use_indices ? smla_forward_indices(plan, &p, &ix, NULL) : smla_forward(plan, &p, NULL))
  s = RUN();
  if (s != SMLA_OK) {
    snprintf(err, err_bytes, "smla_forward returned %s (%s) [plan: %s]", smla_status_string(s),
             smla_context_message(ctx), res->describe);
    st = s;
    goto done;
  }
  if (dm_sync(dev)) {
    snprintf(err, err_bytes, "device error after smla_forward: %s [plan: %s]", dm_error(),
             res->describe);
    st = SMLA_ERR_CUDA;
    goto done;
  }
  res->out = t_xmalloc((size_t)res->out_elems * 2);
  if (pb->want_lse) res->lse = t_xmalloc((size_t)res->lse_elems * 4);
  if (pb->want_ml) res->ml = t_xmalloc((size_t)res->ml_elems * 4);
  if (dm_download(dev, res->out, d_out, (size_t)res->out_elems * 2) ||
      (pb->want_lse && dm_download(dev, res->lse, d_lse, (size_t)res->lse_elems * 4)) ||
      (pb->want_ml && dm_download(dev, res->ml, d_ml, (size_t)res->ml_elems * 4)) ||
      dm_download(dev, &res->bad, d_bad, 8)) {
    snprintf(err, err_bytes, "test harness: download: %s", dm_error());
    goto done;
  }
  if (pb->repeat >= 2) { /* the same plan again (graph-replay style), fresh poison */
    if (dm_memset(dev, d_out, T_POISON, (size_t)res->out_elems * 2) ||
        (pb->want_lse && dm_memset(dev, d_lse, T_POISON, (size_t)res->lse_elems * 4)) ||
        (pb->want_ml && dm_memset(dev, d_ml, T_POISON, (size_t)res->ml_elems * 4)) ||
        dm_upload(dev, d_bad, &zero, 8)) {
      snprintf(err, err_bytes, "test harness: re-poison: %s", dm_error());
      goto done;
    }
    s = RUN();
    if (s != SMLA_OK) {
      snprintf(err, err_bytes, "second smla_forward on the same plan returned %s (%s)",
               smla_status_string(s), smla_context_message(ctx));
      st = s;
      goto done;
    }
    res->out2 = t_xmalloc((size_t)res->out_elems * 2);
    if (pb->want_lse) res->lse2 = t_xmalloc((size_t)res->lse_elems * 4);
    if (pb->want_ml) res->ml2 = t_xmalloc((size_t)res->ml_elems * 4);
    if (dm_sync(dev) || dm_download(dev, res->out2, d_out, (size_t)res->out_elems * 2) ||
        (pb->want_lse && dm_download(dev, res->lse2, d_lse, (size_t)res->lse_elems * 4)) ||
        (pb->want_ml && dm_download(dev, res->ml2, d_ml, (size_t)res->ml_elems * 4)) ||
        dm_download(dev, &res->bad2, d_bad, 8)) {
      snprintf(err, err_bytes, "second run on the same plan: %s", dm_error());
      goto done;
    }
  }
#undef RUN
  st = SMLA_OK;
done:
  smla_plan_destroy(plan);
  dm_free(dev, d_req);
  dm_free(dev, d_bt);
  dm_free(dev, d_local);
  dm_free(dev, ws);
  dm_free(dev, d_qn);
  dm_free(dev, d_qp);
  dm_free(dev, d_cache);
  dm_free(dev, d_slots);
  dm_free(dev, d_len);
  dm_free(dev, d_sink);
  dm_free(dev, d_out);
  dm_free(dev, d_lse);
  dm_free(dev, d_ml);
  dm_free(dev, d_bad);
  if (st != SMLA_OK) fwd_result_free(res);
  return st;
}

int fwd_exec(t_case *tc, const fwd_problem *pb, fwd_result *res) {
  char err[768];
  smla_context *ctx = g_backends[tc->cur].ctx;
  if (!ctx) return t_fail(tc, "no context");
  const smla_status s = exec_core(ctx, t_device(tc), pb, res, err, sizeof err);
  return t_expect(tc, s == SMLA_OK, "T=%lld N=%d K=%d dr=%d format=%d: %s", (long long)pb->T,
                  pb->N, pb->K, pb->dr, (int)pb->format, err);
}

smla_status fwd_exec_host(smla_context *ctx, const fwd_problem *pb, fwd_result *res,
                          char *err, size_t err_bytes) {
  return exec_core(ctx, SMLA_DEVICE_CPU, pb, res, err, err_bytes);
}

void fwd_as_ref(const fwd_problem *pb, const fwd_result *res, fwd_ref *r) {
  const int64_t T = pb->T, N = pb->N, TN = T * N;
  r->out = t_xmalloc((size_t)TN * SMLA_DC * sizeof(double));
  r->lse = t_xmalloc((size_t)(TN ? TN : 1) * sizeof(double));
  r->ml = t_xmalloc((size_t)(TN ? TN : 1) * sizeof(double));
  r->bad = res->bad;
  r->source = res->device;
  r->pabs = NULL; /* the caller lends the exact reference's */
  uint16_t *o = t_xmalloc((size_t)TN * SMLA_DC * 2);
  t_gather(o, res->out, 2, T, N, SMLA_DC, pb->out_st, pb->out_sh);
  t_bf16_to_double(o, r->out, TN * SMLA_DC);
  free(o);
  float *f = t_xmalloc((size_t)(TN ? TN : 1) * 4);
  if (res->lse) {
    t_gather(f, res->lse, 4, T, 1, N, pb->lse_st, 0);
    t_f32_to_double(f, r->lse, TN);
  }
  if (res->ml) {
    t_gather(f, res->ml, 4, T, 1, N, pb->ml_st, 0);
    t_f32_to_double(f, r->ml, TN);
  }
  free(f);
}

void fwd_check(t_case *tc, const fwd_problem *pb, const fwd_result *res, const fwd_ref *r,
               const char *against) {
  const int64_t T = pb->T, N = pb->N, TN = T * N;
  char what[128];
  uint16_t *o = t_xmalloc((size_t)TN * SMLA_DC * 2);
  t_gather(o, res->out, 2, T, N, SMLA_DC, pb->out_st, pb->out_sh);
  snprintf(what, sizeof what, "out vs %s", against);
  /* A CUDA side rounds P to bf16: out moves by up to 2^-8 sum_j p_j |v_j| (per side), far
   * past TOL_OUT where cache values reach 2^8 (the foreign FP8_DS cases). */
  const int p_rounds = (res->device >= 0) + (r->source >= 0);
  t_check_bf16_extra(tc, what, o, r->out, t_shape3(T, N, SMLA_DC), TOL_OUT,
                     p_rounds ? r->pabs : NULL, p_rounds * U_BF16);
  t_check_bf16_unbiased(tc, what, o, r->out, TN, SMLA_DC, out_model(res->device, r->source));
  free(o);
  t_check_gaps(tc, "out", res->out, 2, T, N, SMLA_DC, pb->out_st, pb->out_sh);
  float *f = t_xmalloc((size_t)(TN ? TN : 1) * 4);
  if (pb->want_lse) {
    t_gather(f, res->lse, 4, T, 1, N, pb->lse_st, 0);
    snprintf(what, sizeof what, "lse vs %s", against);
    t_check_f32(tc, what, f, r->lse, t_shape2(T, N), TOL_LSE);
    t_check_gaps(tc, "lse", res->lse, 4, T, 1, N, pb->lse_st, 0);
  }
  if (pb->want_ml) {
    t_gather(f, res->ml, 4, T, 1, N, pb->ml_st, 0);
    snprintf(what, sizeof what, "max_logit vs %s", against);
    t_check_f32(tc, what, f, r->ml, t_shape2(T, N), TOL_LSE);
    t_check_gaps(tc, "max_logit", res->ml, 4, T, 1, N, pb->ml_st, 0);
  }
  free(f);
  if (pb->want_bad)
    t_expect(tc, res->bad == r->bad, "bad_inputs vs %s: got %llu, want %llu", against,
             (unsigned long long)res->bad, (unsigned long long)r->bad);
}

void fwd_check_same(t_case *tc, const fwd_problem *pb, const fwd_result *a,
                    const fwd_result *b, const char *what) {
  char w[128];
  snprintf(w, sizeof w, "%s: out bits", what);
  t_check_same(tc, w, a->out, b->out, (size_t)a->out_elems * 2);
  if (pb->want_lse) {
    snprintf(w, sizeof w, "%s: lse bits", what);
    t_check_same(tc, w, a->lse, b->lse, (size_t)a->lse_elems * 4);
  }
  if (pb->want_ml) {
    snprintf(w, sizeof w, "%s: max_logit bits", what);
    t_check_same(tc, w, a->ml, b->ml, (size_t)a->ml_elems * 4);
  }
  if (pb->want_bad)
    t_expect(tc, a->bad == b->bad, "%s: bad_inputs %llu vs %llu", what,
             (unsigned long long)a->bad, (unsigned long long)b->bad);
}

void fwd_run(t_case *tc, fwd_problem *pb) {
  fwd_ref ref;
  fwd_reference(pb, &ref);
  fwd_result cpu;
  int have_cpu = 0;
  for (int b = 0; b < g_num_backends; b++) {
    if (!t_on(tc, b)) continue;
    fwd_result res;
    if (!fwd_exec(tc, pb, &res)) continue;
    t_expect(tc, res.describe[0] != '\0', "smla_plan_describe is empty");
    fwd_check(tc, pb, &res, &ref, "reference");
    if (b != T_CPU && have_cpu) {
      fwd_ref cr;
      fwd_as_ref(pb, &cpu, &cr);
      cr.pabs = ref.pabs;
      fwd_check(tc, pb, &res, &cr, "cpu backend");
      fwd_ref_free(&cr);
    }
    if (pb->repeat >= 2) {
      fwd_result same = res; /* the second run on the same plan, viewed as a result */
      same.out = res.out2;
      same.lse = res.lse2;
      same.ml = res.ml2;
      same.bad = res.bad2;
      fwd_check_same(tc, pb, &res, &same, "the same forward again on the same plan");
      fwd_result again;
      if (fwd_exec(tc, pb, &again)) {
        fwd_check_same(tc, pb, &res, &again, "the same forward again on a new plan");
        fwd_result_free(&again);
      }
    }
    /* A plan that chose an architecture-specific kernel (cuda-sm90): the same problem on
     * the portable kernel too, so both stay checked on this device. */
    if (b != T_CPU && strncmp(res.describe, "cuda-generic", 12) != 0 &&
        !(pb->flags & SMLA_PLAN_PORTABLE)) {
      fwd_problem pp = *pb;
      pp.flags |= SMLA_PLAN_PORTABLE;
      pp.repeat = 0;
      fwd_result port;
      if (fwd_exec(tc, &pp, &port)) {
        t_expect(tc, strncmp(port.describe, "cuda-generic", 12) == 0,
                 "SMLA_PLAN_PORTABLE plan is not the generic kernel: %s", port.describe);
        fwd_check(tc, &pp, &port, &ref, "reference (portable kernel)");
        if (have_cpu) {
          fwd_ref cr;
          fwd_as_ref(pb, &cpu, &cr);
          cr.pabs = ref.pabs;
          fwd_check(tc, &pp, &port, &cr, "cpu backend (portable kernel)");
          fwd_ref_free(&cr);
        }
        fwd_result_free(&port);
      }
    }
    /* smla_forward_indices is smla_forward on the converted slots: bitwise the same. */
    if (pb->use_indices) {
      fwd_problem two = *pb;
      two.use_indices = 0;
      two.repeat = 0;
      fwd_result plain;
      if (fwd_exec(tc, &two, &plain)) {
        fwd_check_same(tc, pb, &res, &plain, "smla_forward on the converted slots");
        fwd_result_free(&plain);
      }
    }
    if (b == T_CPU) {
      cpu = res;
      have_cpu = 1;
    } else {
      fwd_result_free(&res);
    }
  }
  if (have_cpu) fwd_result_free(&cpu);
  fwd_ref_free(&ref);
}
