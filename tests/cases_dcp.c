/*
 * cases_dcp.c: decode context parallelism on one device (issue 6's single-GPU and CPU
 * part): a request's tokens are sharded over W simulated ranks (convert indices' cp_*
 * filter, vLLM's DCP layout: runs of I tokens dealt round robin); each rank gathers its own
 * cache through its own block table, runs forward with lse over its shard, and the W
 * partial (out as bf16, as an all-gather would carry it, lse) are merged with
 * smla_merge_states. The merge must equal forward over the union of the shards.
 *
 * Every backend runs every step; checked against the double-precision reference over the
 * union, and against the same backend's forward over the union. Includes a row that only
 * rank 0 sees (the other ranks' shards have no used entry: lse -inf, never read) and a row
 * that no rank sees (out 0, lse -inf). Unreferenced cache rows are NaN; outputs poisoned.
 */
#include "harness.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define D_DR 64
#define D_DQK (REF_DC + D_DR)
#define D_BS 16

typedef struct {
  int64_t num_slots;
  int blocks;          /* blocks of the table */
  int32_t *table;      /* [blocks] */
  uint8_t *cache;      /* [num_slots][row] bf16 rows; NaN where no token lives */
} d_shard;

typedef struct {
  int64_t T;
  int N, K, L, W, I;
  uint16_t *q;         /* [T][N][576] */
  uint16_t *kvc, *kpe; /* [L][512], [L][64]: the request's token rows */
  int32_t *pos;        /* [T][K] request positions (the indexer's top-k), -1 = none */
  int32_t *req;        /* [T] all 0: one request */
  d_shard all;         /* the union: every token, one "rank" */
  d_shard *rank;       /* [W] */
} d_problem;

static int owner(const d_problem *d, int64_t p) { return (int)((p / d->I) % d->W); }

/* A cache holding `count` tokens at local positions 0..count-1 (token ids from `ids`),
 * through a random block table over twice the blocks it needs. */
static void shard_build(const d_problem *d, d_shard *s, const int64_t *ids, int64_t count) {
  const size_t row = ref_row_size(SMLA_CACHE_BF16, D_DR);
  s->blocks = (int)((count + D_BS - 1) / D_BS);
  if (s->blocks < 1) s->blocks = 1;
  s->num_slots = (int64_t)s->blocks * 2 * D_BS;
  int64_t *perm = t_xmalloc((size_t)s->blocks * 2 * 8);
  t_permutation(perm, (int64_t)s->blocks * 2);
  s->table = t_xmalloc((size_t)s->blocks * 4);
  for (int b = 0; b < s->blocks; b++) s->table[b] = (int32_t)perm[b];
  free(perm);
  s->cache = t_xmalloc((size_t)s->num_slots * row);
  uint16_t *nan_row = (uint16_t *)s->cache;
  for (size_t i = 0; i < (size_t)s->num_slots * row / 2; i++) nan_row[i] = T_BF16_NAN;
  for (int64_t q = 0; q < count; q++) {
    const int64_t slot = (int64_t)s->table[q / D_BS] * D_BS + q % D_BS;
    ref_write_row(SMLA_CACHE_BF16, D_DR, 1.0f, d->kvc + ids[q] * REF_DC, d->kpe + ids[q] * D_DR,
                  s->cache + (size_t)slot * row);
  }
}

static void d_init(d_problem *d, int64_t T, int N, int K, int L, int W, int I) {
  memset(d, 0, sizeof *d);
  d->T = T, d->N = N, d->K = K, d->L = L, d->W = W, d->I = I;
  d->q = t_xmalloc((size_t)T * N * D_DQK * 2);
  t_fill_bf16(d->q, (size_t)T * N * D_DQK, -1.0, 1.0);
  d->kvc = t_xmalloc((size_t)L * REF_DC * 2);
  d->kpe = t_xmalloc((size_t)L * D_DR * 2);
  t_fill_bf16(d->kvc, (size_t)L * REF_DC, -1.0, 1.0);
  t_fill_bf16(d->kpe, (size_t)L * D_DR, -1.0, 1.0);
  d->req = t_xcalloc((size_t)T, 4);
  d->pos = t_xmalloc((size_t)T * K * 4);
  for (int64_t t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      int64_t p = t_rng_int(-L / 8, L - 1); /* ~1 in 9 entries invalid (negative) */
      if (t == 0) /* only rank 0's positions: the other shards see nothing of row 0 */
        p = (t_rng_int(0, (L - 1) / (I * W)) * W) * I + t_rng_int(0, I - 1);
      if (t == T - 1) p = -1; /* nobody sees row T-1 */
      d->pos[t * K + k] = (int32_t)(p < 0 ? -1 : p < L ? p : -1);
    }
  int64_t *ids = t_xmalloc((size_t)L * 8);
  for (int64_t p = 0; p < L; p++) ids[p] = p;
  shard_build(d, &d->all, ids, L);
  d->rank = t_xcalloc((size_t)W, sizeof *d->rank);
  for (int r = 0; r < W; r++) {
    int64_t n = 0;
    for (int64_t p = 0; p < L; p++)
      if (owner(d, p) == r) ids[n++] = p; /* in order: local position = rank among them */
    shard_build(d, &d->rank[r], ids, n);
  }
  free(ids);
}

static void d_free(d_problem *d) {
  free(d->q);
  free(d->kvc);
  free(d->kpe);
  free(d->req);
  free(d->pos);
  free(d->all.table);
  free(d->all.cache);
  for (int r = 0; r < d->W; r++) {
    free(d->rank[r].table);
    free(d->rank[r].cache);
  }
  free(d->rank);
}

static smla_convert_params d_convert_params(const d_problem *d, const d_shard *s, int rank,
                                            const int32_t *req, const int32_t *table,
                                            const int32_t *pos, int32_t *slots, int32_t *valid) {
  smla_convert_params c;
  memset(&c, 0, sizeof c);
  c.num_tokens = d->T;
  c.topk = d->K;
  c.req_id = req;
  c.block_table = table;
  c.num_requests = 1;
  c.blocks_per_request = s->blocks;
  c.block_table_stride = s->blocks;
  c.block_size = D_BS;
  c.local = pos;
  c.local_stride = d->K;
  c.slots = slots;
  c.slots_stride = d->K;
  c.valid = valid;
  c.compact = 1;
  if (rank >= 0) {
    c.cp_size = d->W;
    c.cp_rank = rank;
    c.cp_interleave = d->I;
  }
  return c;
}

static smla_forward_params d_forward_params(const d_problem *d, const d_shard *s,
                                            const void *q, void *cache, const int32_t *slots,
                                            const int32_t *lengths, void *out, float *lse) {
  smla_forward_params f;
  memset(&f, 0, sizeof f);
  f.num_tokens = d->T;
  f.num_heads = d->N;
  f.topk = d->K;
  f.q_nope = q;
  f.q_nope_stride_t = (int64_t)d->N * D_DQK;
  f.q_nope_stride_h = D_DQK;
  f.q_pe = (const uint16_t *)q + REF_DC;
  f.q_pe_stride_t = (int64_t)d->N * D_DQK;
  f.q_pe_stride_h = D_DQK;
  f.cache.format = SMLA_CACHE_BF16;
  f.cache.dr = D_DR;
  f.cache.num_slots = s->num_slots;
  f.cache.row_bytes = (int64_t)ref_row_size(SMLA_CACHE_BF16, D_DR);
  f.cache.data = cache;
  f.slots = slots;
  f.slots_stride = d->K;
  f.lengths = lengths;
  f.sm_scale = 1.0f / sqrtf((float)D_DQK);
  f.out = out;
  f.out_stride_t = (int64_t)d->N * REF_DC;
  f.out_stride_h = REF_DC;
  f.lse = lse;
  f.lse_stride_t = d->N;
  return f;
}

/* Convert (rank < 0: the union) and forward with lse on backend ctx, into device out/lse. */
static int d_shard_forward(t_case *tc, smla_context *ctx, const d_problem *d, const d_shard *s,
                           int rank, const void *d_q, const void *d_req, const void *d_pos,
                           void *d_out, float *d_lse) {
  const size_t row = ref_row_size(SMLA_CACHE_BF16, D_DR);
  int ok = 0;
  void *d_cache = t_upload(tc, s->cache, (size_t)s->num_slots * row);
  void *d_table = t_upload(tc, s->table, (size_t)s->blocks * 4);
  int32_t *d_slots = t_alloc(tc, (size_t)d->T * d->K * 4);
  int32_t *d_len = t_alloc(tc, (size_t)d->T * 4);
  smla_plan *plan = NULL;
  smla_plan_desc pd;
  memset(&pd, 0, sizeof pd);
  pd.max_tokens = d->T;
  pd.num_heads = d->N;
  pd.topk = d->K;
  pd.dr = D_DR;
  pd.format = SMLA_CACHE_BF16;
  if (d_cache && d_table && d_slots && d_len &&
      t_expect_ok(tc, smla_plan_create(ctx, &pd, NULL, 0, &plan), ctx, "smla_plan_create")) {
    const smla_convert_params c =
        d_convert_params(d, s, rank, d_req, d_table, d_pos, d_slots, d_len);
    const smla_forward_params f =
        d_forward_params(d, s, d_q, d_cache, d_slots, d_len, d_out, d_lse);
    ok = t_expect_ok(tc, smla_convert_indices(ctx, &c, NULL), ctx, "smla_convert_indices (cp)") &&
         t_expect_ok(tc, smla_forward(plan, &f, NULL), ctx, "smla_forward (shard)") &&
         t_sync(tc) == 0;
  }
  smla_plan_destroy(plan);
  t_free(tc, d_cache);
  t_free(tc, d_table);
  t_free(tc, d_slots);
  t_free(tc, d_len);
  return ok;
}

/* Reference over the union: convert with the reference, forward in double. */
static void d_reference(const d_problem *d, double *out, double *lse) {
  int32_t *slots = t_xmalloc((size_t)d->T * d->K * 4), *len = t_xmalloc((size_t)d->T * 4);
  const smla_convert_params c =
      d_convert_params(d, &d->all, -1, d->req, d->all.table, d->pos, NULL, NULL);
  ref_convert(&c, slots, len);
  const smla_forward_params f =
      d_forward_params(d, &d->all, d->q, d->all.cache, slots, len, NULL, NULL);
  double *ml = t_xmalloc((size_t)d->T * d->N * 8);
  uint64_t bad = 0;
  ref_forward(&f, out, lse, ml, &bad, NULL);
  free(ml);
  free(slots);
  free(len);
}

/* out (bf16 partials then merged) within bf16 rounding of the union: the forward's own
 * bound (tests/fwd.c TOL_OUT: 2e-3 + 1e-2 |ref|) plus one bf16 rounding of each partial
 * (2^-8 of |out_p|, weights summing to 1: <= 2^-8 max |out_p|, and |out_p| is a mean of
 * values in [-1, 1], ~0.05 here), covered by 2e-3 more. lse: float arithmetic only. */
static const t_tol D_TOL_OUT = {4e-3, 1e-2};
static const t_tol D_TOL_LSE = {2e-4, 1e-5};

static void d_run(t_case *tc, d_problem *d) {
  const int64_t TN = d->T * d->N;
  double *r_out = t_xmalloc((size_t)TN * REF_DC * 8), *r_lse = t_xmalloc((size_t)TN * 8);
  d_reference(d, r_out, r_lse);
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    void *d_q = t_upload(tc, d->q, (size_t)TN * D_DQK * 2);
    void *d_req = t_upload(tc, d->req, (size_t)d->T * 4);
    void *d_pos = t_upload(tc, d->pos, (size_t)d->T * d->K * 4);
    uint16_t *d_outp = t_alloc(tc, (size_t)d->W * TN * REF_DC * 2); /* [W][T][N][512] */
    float *d_lsep = t_alloc(tc, (size_t)d->W * TN * 4);
    uint16_t *d_out = t_alloc(tc, (size_t)TN * REF_DC * 2);
    uint16_t *d_all = t_alloc(tc, (size_t)TN * REF_DC * 2);
    float *d_lse = t_alloc(tc, (size_t)TN * 4), *d_all_lse = t_alloc(tc, (size_t)TN * 4);
    uint16_t *out = t_xmalloc((size_t)TN * REF_DC * 2), *all = t_xmalloc((size_t)TN * REF_DC * 2);
    float *lse = t_xmalloc((size_t)TN * 4), *all_lse = t_xmalloc((size_t)TN * 4);
    float *lsep = t_xmalloc((size_t)d->W * TN * 4);
    int ok = d_q && d_req && d_pos && d_outp && d_lsep && d_out && d_all && d_lse && d_all_lse &&
             !t_memset(tc, d_outp, T_POISON, (size_t)d->W * TN * REF_DC * 2) &&
             !t_memset(tc, d_lsep, T_POISON, (size_t)d->W * TN * 4) &&
             !t_memset(tc, d_out, T_POISON, (size_t)TN * REF_DC * 2) &&
             !t_memset(tc, d_lse, T_POISON, (size_t)TN * 4) &&
             !t_memset(tc, d_all, T_POISON, (size_t)TN * REF_DC * 2) &&
             !t_memset(tc, d_all_lse, T_POISON, (size_t)TN * 4);
    for (int r = 0; ok && r < d->W; r++)
      ok = d_shard_forward(tc, ctx, d, &d->rank[r], r, d_q, d_req, d_pos,
                           d_outp + (size_t)r * TN * REF_DC, d_lsep + (size_t)r * TN);
    ok = ok && d_shard_forward(tc, ctx, d, &d->all, -1, d_q, d_req, d_pos, d_all, d_all_lse);
    if (ok) {
      smla_merge_params m;
      memset(&m, 0, sizeof m);
      m.num_partials = d->W;
      m.num_tokens = d->T;
      m.num_heads = d->N;
      m.dv = REF_DC;
      m.out_p = d_outp;
      m.out_p_dtype = SMLA_DTYPE_BF16;
      m.out_p_stride_p = TN * REF_DC;
      m.out_p_stride_t = (int64_t)d->N * REF_DC;
      m.out_p_stride_h = REF_DC;
      m.lse_p = d_lsep;
      m.lse_p_stride_p = TN;
      m.lse_p_stride_t = d->N;
      m.out = d_out;
      m.out_dtype = SMLA_DTYPE_BF16;
      m.out_stride_t = (int64_t)d->N * REF_DC;
      m.out_stride_h = REF_DC;
      m.lse = d_lse;
      m.lse_stride_t = d->N;
      ok = t_expect_ok(tc, smla_merge_states(ctx, &m, NULL), ctx, "smla_merge_states") &&
           t_sync(tc) == 0 && !t_download(tc, out, d_out, (size_t)TN * REF_DC * 2) &&
           !t_download(tc, lse, d_lse, (size_t)TN * 4) &&
           !t_download(tc, all, d_all, (size_t)TN * REF_DC * 2) &&
           !t_download(tc, all_lse, d_all_lse, (size_t)TN * 4) &&
           !t_download(tc, lsep, d_lsep, (size_t)d->W * TN * 4);
    }
    if (ok) {
      t_check_bf16(tc, "merged out vs reference over the union", out, r_out,
                   t_shape3(d->T, d->N, REF_DC), D_TOL_OUT);
      t_check_f32(tc, "merged lse vs reference over the union", lse, r_lse,
                  t_shape2(d->T, d->N), D_TOL_LSE);
      double *own = t_xmalloc((size_t)TN * REF_DC * 8), *own_lse = t_xmalloc((size_t)TN * 8);
      t_bf16_to_double(all, own, TN * REF_DC);
      t_f32_to_double(all_lse, own_lse, TN);
      t_check_bf16(tc, "merged out vs this backend's forward over the union", out, own,
                   t_shape3(d->T, d->N, REF_DC), D_TOL_OUT);
      t_check_f32(tc, "merged lse vs this backend's forward over the union", lse, own_lse,
                  t_shape2(d->T, d->N), D_TOL_LSE);
      free(own);
      free(own_lse);
      /* Row 0 lives on rank 0 only; row T-1 nowhere: those shards' lse is -inf. */
      for (int r = 0; r < d->W; r++)
        for (int h = 0; h < d->N; h++) {
          const float l0 = lsep[(size_t)r * TN + h];
          const float l1 = lsep[(size_t)r * TN + (d->T - 1) * d->N + h];
          t_expect(tc, (r == 0 ? isfinite(l0) : isinf(l0) && l0 < 0) && isinf(l1) && l1 < 0,
                   "rank %d head %d: shard lse of row 0 = %g, of row T-1 = %g (want %s, -inf)",
                   r, h, l0, l1, r == 0 ? "finite" : "-inf");
        }
    }
    free(out);
    free(all);
    free(lse);
    free(all_lse);
    free(lsep);
    t_free(tc, d_q);
    t_free(tc, d_req);
    t_free(tc, d_pos);
    t_free(tc, d_outp);
    t_free(tc, d_lsep);
    t_free(tc, d_out);
    t_free(tc, d_all);
    t_free(tc, d_lse);
    t_free(tc, d_all_lse);
  }
  free(r_out);
  free(r_lse);
}

static void c_dcp_2_ranks(t_case *tc) { /* vLLM's default: interleave 1 */
  d_problem d;
  d_init(&d, 5, 16, 64, 300, 2, 1);
  d_run(tc, &d);
  d_free(&d);
}

static void c_dcp_4_ranks_runs_of_16(t_case *tc) { /* interleave = block size */
  d_problem d;
  d_init(&d, 6, 128, 96, 700, 4, 16);
  d_run(tc, &d);
  d_free(&d);
}

static void c_dcp_3_ranks_k2048(t_case *tc) { /* DeepSeek's K, runs of 8, 8 heads */
  d_problem d;
  d_init(&d, 4, 8, 2048, 3000, 3, 8);
  d_run(tc, &d);
  d_free(&d);
}

void t_register_dcp_cases(void) {
  t_register("dcp_2_ranks", c_dcp_2_ranks);
  t_register("dcp_4_ranks_runs_of_16", c_dcp_4_ranks_runs_of_16);
  t_register("dcp_3_ranks_k2048", c_dcp_3_ranks_k2048);
}
