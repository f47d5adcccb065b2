/*
 * cases_validate.c: argument validation (docs/errors.md), on every backend. Each check
 * starts from params that succeed (the baseline is run first), breaks one thing, and wants
 * the documented status and a context message that names the argument; a failed forward
 * must leave out untouched (still poison).
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VT 2   /* T */
#define VN 16  /* N */
#define VK 64  /* K */
#define VS 64  /* cache slots */
#define SLACK 4096

/* Valid device buffers for every op; contents zero (validation never reads them). */
typedef struct {
  smla_context *ctx;
  smla_plan *plan;
  char *q;      /* [VT][VN][576] bf16, q_pe at +512 */
  char *cache;  /* [VS][1152] BF16 rows */
  char *out;    /* [VT][VN][512] bf16 */
  char *ints;   /* int32 / int64 / float scratch, zero */
  char *big;    /* f32 partials [1][VT][VN][512] */
  size_t out_bytes;
  smla_forward_params p;
} vfix;

static int vfix_init(t_case *tc, int b, vfix *f) {
  memset(f, 0, sizeof *f);
  f->ctx = t_on(tc, b);
  if (!f->ctx) return 0;
  const size_t q_bytes = (size_t)VT * VN * 576 * 2 + SLACK, c_bytes = (size_t)VS * 1152 + SLACK;
  f->out_bytes = (size_t)VT * VN * 512 * 2;
  f->q = t_alloc(tc, q_bytes);
  f->cache = t_alloc(tc, c_bytes);
  f->out = t_alloc(tc, f->out_bytes + SLACK);
  f->ints = t_alloc(tc, 65536);
  f->big = t_alloc(tc, (size_t)VT * VN * 512 * 4 + SLACK);
  if (!f->q || !f->cache || !f->out || !f->ints || !f->big || t_memset(tc, f->q, 0, q_bytes) ||
      t_memset(tc, f->cache, 0, c_bytes) || t_memset(tc, f->ints, 0, 65536) ||
      t_memset(tc, f->big, 0, (size_t)VT * VN * 512 * 4 + SLACK))
    return 0;
  smla_plan_desc d = {.max_tokens = VT, .num_heads = VN, .topk = VK, .dr = 64,
                      .format = SMLA_CACHE_BF16};
  if (!t_expect_ok(tc, smla_plan_create(f->ctx, &d, NULL, 0, &f->plan), f->ctx,
                   "baseline smla_plan_create"))
    return 0;
  smla_forward_params *p = &f->p;
  memset(p, 0, sizeof *p);
  p->num_tokens = VT;
  p->num_heads = VN;
  p->topk = VK;
  p->q_nope = f->q;
  p->q_nope_stride_t = VN * 576;
  p->q_nope_stride_h = 576;
  p->q_pe = f->q + 1024;
  p->q_pe_stride_t = VN * 576;
  p->q_pe_stride_h = 576;
  p->cache = (smla_cache){SMLA_CACHE_BF16, 64, VS, 1152, f->cache, 0.0f};
  p->slots = (const int32_t *)f->ints;
  p->slots_stride = VK;
  p->sm_scale = 0.04f;
  p->out = f->out;
  p->out_stride_t = VN * 512;
  p->out_stride_h = 512;
  p->lse = (float *)(f->ints + 8192);
  p->lse_stride_t = VN;
  return t_expect_ok(tc, smla_forward(f->plan, p, NULL), f->ctx, "baseline smla_forward") &&
         t_sync(tc) == 0;
}

static void vfix_free(t_case *tc, vfix *f) {
  smla_plan_destroy(f->plan);
  t_free(tc, f->q);
  t_free(tc, f->cache);
  t_free(tc, f->out);
  t_free(tc, f->ints);
  t_free(tc, f->big);
}

/* Runs smla_forward on p (plan NULL: f->plan) with out poisoned; wants `want` + needle. */
static void expect_forward(t_case *tc, vfix *f, smla_plan *plan, const smla_forward_params *p,
                           smla_status want, const char *needle, const char *what) {
  if (t_memset(tc, f->out, T_POISON, f->out_bytes)) return;
  const smla_status s = smla_forward(plan, p, NULL);
  t_expect_status(tc, s, want, plan ? f->ctx : NULL, needle, what);
  unsigned char *h = t_xmalloc(f->out_bytes);
  if (t_sync(tc) == 0 && t_download(tc, h, f->out, f->out_bytes) == 0) {
    size_t written = 0;
    for (size_t i = 0; i < f->out_bytes; i++) written += h[i] != T_POISON;
    t_expect(tc, written == 0, "%s: failed forward wrote %zu bytes of out", what, written);
  }
  free(h);
}

/* ---- forward mutations: (category, what breaks, named argument, the change) ------------ */

typedef enum { V_NULL, V_ALIGN, V_STRIDE, V_SHAPE, V_MISMATCH } vcat;

/* Applies mutation i to p. Returns 0 past the last one. Status: INVALID_ARGUMENT unless the
 * change sets another. */
static int mutate(int i, vfix *f, smla_forward_params *p, vcat *cat, smla_status *want,
                  const char **arg, const char **what) {
  const int64_t q_span_h = (int64_t)(VN - 1) * 576 + 512; /* what stride_t must step over */
  *want = SMLA_ERR_INVALID_ARGUMENT;
#define M(n, c, w, a, change) \
  case n: *cat = c; *what = w; *arg = a; change; return 1;
  switch (i) {
    M(0, V_NULL, "q_nope NULL", "q_nope", p->q_nope = NULL)
    M(1, V_NULL, "q_pe NULL with Dr = 64", "q_pe", p->q_pe = NULL)
    M(2, V_NULL, "out NULL", "out", p->out = NULL)
    M(3, V_NULL, "slots NULL", "slots", p->slots = NULL)
    M(4, V_NULL, "cache.data NULL", "cache.data", p->cache.data = NULL)
    M(5, V_ALIGN, "q_nope 2 bytes off", "q_nope", (p->q_nope = f->q + 2, *want = SMLA_ERR_MISALIGNED))
    M(6, V_ALIGN, "q_pe 8 bytes off", "q_pe", (p->q_pe = f->q + 1032, *want = SMLA_ERR_MISALIGNED))
    M(7, V_ALIGN, "out 8 bytes off", "out", (p->out = f->out + 8, *want = SMLA_ERR_MISALIGNED))
    M(8, V_ALIGN, "lse 2 bytes off", "lse", (p->lse = (float *)(f->ints + 8194), *want = SMLA_ERR_MISALIGNED))
    M(9, V_ALIGN, "slots 2 bytes off", "slots", (p->slots = (const int32_t *)(f->ints + 2), *want = SMLA_ERR_MISALIGNED))
    M(10, V_ALIGN, "cache.data 8 bytes off", "cache.data", (p->cache.data = f->cache + 8, *want = SMLA_ERR_MISALIGNED))
    M(11, V_ALIGN, "row_bytes 1160 (not a multiple of 16)", "row_bytes", (p->cache.row_bytes = 1160, *want = SMLA_ERR_MISALIGNED))
    M(12, V_ALIGN, "q_nope_stride_h 580 (not a multiple of 8)", "q_nope_stride_h", (p->q_nope_stride_h = 580, p->q_nope_stride_t = VN * 580, *want = SMLA_ERR_MISALIGNED))
    M(13, V_ALIGN, "out_stride_t 8196 (not a multiple of 8)", "out_stride_t", (p->out_stride_t = VN * 512 + 4, *want = SMLA_ERR_MISALIGNED))
    M(14, V_STRIDE, "q_nope_stride_h 504 < 512", "q_nope_stride_h", p->q_nope_stride_h = 504)
    M(15, V_STRIDE, "q_nope_stride_t one row short", "q_nope_stride_t", p->q_nope_stride_t = q_span_h - 8)
    M(16, V_STRIDE, "q_pe_stride_h 56 < 64", "q_pe_stride_h", p->q_pe_stride_h = 56)
    M(17, V_STRIDE, "out_stride_h 504 < 512", "out_stride_h", p->out_stride_h = 504)
    M(18, V_STRIDE, "out_stride_t < N * 512", "out_stride_t", p->out_stride_t = VN * 512 - 8)
    M(19, V_STRIDE, "slots_stride K - 1", "slots_stride", p->slots_stride = VK - 1)
    M(20, V_STRIDE, "lse_stride_t N - 1", "lse_stride_t", p->lse_stride_t = VN - 1)
    M(21, V_SHAPE, "row_bytes 1136 < 1152", "row_bytes", p->cache.row_bytes = 1136)
    M(22, V_SHAPE, "num_slots 0", "num_slots", p->cache.num_slots = 0)
    M(23, V_SHAPE, "num_slots 2^31", "num_slots", p->cache.num_slots = 1ll << 31)
    M(24, V_SHAPE, "num_tokens -1", "num_tokens", p->num_tokens = -1)
    M(25, V_SHAPE, "sm_scale NaN", "sm_scale", p->sm_scale = NAN)
    M(26, V_SHAPE, "softcap -1", "softcap", p->softcap = -1.0f)
    M(27, V_SHAPE, "cache.format 7", "format", p->cache.format = (smla_cache_format)7)
    M(28, V_SHAPE, "cache.dr 32", "dr", (p->cache.dr = 32, *want = SMLA_ERR_UNSUPPORTED))
    M(29, V_MISMATCH, "T = 3 > max_tokens = 2", "num_tokens", (p->num_tokens = 3, *want = SMLA_ERR_PLAN_MISMATCH))
    M(30, V_MISMATCH, "num_heads 8, plan 16", "num_heads", (p->num_heads = 8, *want = SMLA_ERR_PLAN_MISMATCH))
    M(31, V_MISMATCH, "topk 32, plan 64", "topk", (p->topk = 32, *want = SMLA_ERR_PLAN_MISMATCH))
    M(32, V_MISMATCH, "FP8_DS cache, plan BF16", "format", (p->cache.format = SMLA_CACHE_FP8_DS, p->cache.row_bytes = 656, *want = SMLA_ERR_PLAN_MISMATCH))
    M(33, V_MISMATCH, "Dr 0 cache, plan Dr 64", "dr", (p->cache.dr = 0, *want = SMLA_ERR_PLAN_MISMATCH))
    /* 0: uniform attention (a forgotten field of a zeroed struct); < 0: the least similar rows */
    M(34, V_SHAPE, "sm_scale 0", "sm_scale", p->sm_scale = 0.0f)
    M(35, V_SHAPE, "sm_scale -0.04", "sm_scale", p->sm_scale = -0.04f)
    M(36, V_SHAPE, "sm_scale inf", "sm_scale", p->sm_scale = INFINITY)
    M(37, V_SHAPE, "softcap inf", "softcap", p->softcap = INFINITY)
    /* strides in either order, but distinct (t, h) must not share elements */
    M(38, V_STRIDE, "q_nope_stride_t == q_nope_stride_h (rows overlap)", "q_nope_stride", p->q_nope_stride_t = p->q_nope_stride_h)
    M(39, V_STRIDE, "head-major out with stride_h one row short of T rows", "out_stride_h", (p->out_stride_t = 512, p->out_stride_h = VT * 512 - 8))
  }
#undef M
  return 0;
}

static void forward_checks(t_case *tc, vcat which) {
  for (int b = 0; b < g_num_backends; b++) {
    vfix f;
    if (vfix_init(tc, b, &f)) {
      if (which == V_NULL) {
        expect_forward(tc, &f, f.plan, NULL, SMLA_ERR_INVALID_ARGUMENT, "params", "params NULL");
        expect_forward(tc, &f, NULL, &f.p, SMLA_ERR_INVALID_ARGUMENT, NULL, "plan NULL");
      }
      for (int i = 0;; i++) {
        smla_forward_params p = f.p;
        vcat cat;
        smla_status want;
        const char *arg, *what;
        if (!mutate(i, &f, &p, &cat, &want, &arg, &what)) break;
        if (cat == which) expect_forward(tc, &f, f.plan, &p, want, arg, what);
      }
    }
    vfix_free(tc, &f);
  }
}

/* smla_forward_indices: the forward checks apply as to smla_forward (one spot check), plus
 * its own: slots must be NULL, indices present, uncompacted, without outputs, and the
 * same T and K; the convert's own checks on indices, named by the fused call. */
static void expect_fused(t_case *tc, vfix *f, const smla_forward_params *p,
                         const smla_convert_params *ix, smla_status want, const char *needle,
                         const char *what) {
  if (t_memset(tc, f->out, T_POISON, f->out_bytes)) return;
  const smla_status s = smla_forward_indices(f->plan, p, ix, NULL);
  t_expect_status(tc, s, want, f->ctx, needle, what);
  if (s == SMLA_OK) return;
  unsigned char *h = t_xmalloc(f->out_bytes);
  if (t_sync(tc) == 0 && t_download(tc, h, f->out, f->out_bytes) == 0) {
    size_t written = 0;
    for (size_t i = 0; i < f->out_bytes; i++) written += h[i] != T_POISON;
    t_expect(tc, written == 0, "%s: failed forward wrote %zu bytes of out", what, written);
  }
  free(h);
}

static void c_validate_forward_indices(t_case *tc) {
  for (int b = 0; b < g_num_backends; b++) {
    vfix f;
    if (vfix_init(tc, b, &f)) {
      smla_forward_params p0 = f.p;
      p0.slots = NULL;
      smla_convert_params x0;
      memset(&x0, 0, sizeof x0);
      x0.num_tokens = VT;
      x0.topk = VK;
      x0.req_id = (const int32_t *)(f.ints + 16384); /* zeros: request 0, block 0, slot 0 */
      x0.block_table = (const int32_t *)(f.ints + 16384);
      x0.num_requests = 1;
      x0.blocks_per_request = 4;
      x0.block_table_stride = 4;
      x0.block_size = 16;
      x0.local = (const int32_t *)(f.ints + 16384);
      x0.local_stride = VK;
      expect_fused(tc, &f, &p0, &x0, SMLA_OK, NULL, "baseline smla_forward_indices");
      smla_forward_params p;
      smla_convert_params x;
      p = p0; p.slots = (const int32_t *)f.ints;
      expect_fused(tc, &f, &p, &x0, SMLA_ERR_INVALID_ARGUMENT, "slots", "slots given");
      expect_fused(tc, &f, &p0, NULL, SMLA_ERR_INVALID_ARGUMENT, "indices", "indices NULL");
      x = x0; x.compact = 1;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "compact", "compact = 1");
      x = x0; x.valid = (int32_t *)(f.ints + 32768);
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "valid", "valid given");
      x = x0; x.slots = (int32_t *)(f.ints + 32768);
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "slots", "indices->slots given");
      x = x0; x.num_tokens = VT - 1;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "num_tokens", "indices T != T");
      x = x0; x.topk = VK - 1;
      x.local_stride = VK;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "topk", "indices K != K");
      x = x0; x.local = NULL;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "local", "local NULL");
      x = x0; x.block_size = 0;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "block_size", "block_size 0");
      x = x0; x.local_stride = VK - 1;
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_INVALID_ARGUMENT, "local_stride", "local_stride K - 1");
      x = x0; x.req_id = (const int32_t *)(f.ints + 16386);
      expect_fused(tc, &f, &p0, &x, SMLA_ERR_MISALIGNED, "req_id", "req_id 2 bytes off");
      p = p0; p.num_heads = 8;
      expect_fused(tc, &f, &p, &x0, SMLA_ERR_PLAN_MISMATCH, "num_heads", "num_heads 8, plan 16");
      p = p0; p.q_nope = NULL;
      expect_fused(tc, &f, &p, &x0, SMLA_ERR_INVALID_ARGUMENT, "q_nope", "q_nope NULL");
    }
    vfix_free(tc, &f);
  }
}

static void c_validate_null(t_case *tc) { forward_checks(tc, V_NULL); }
static void c_validate_alignment(t_case *tc) { forward_checks(tc, V_ALIGN); }
static void c_validate_strides(t_case *tc) { forward_checks(tc, V_STRIDE); }
static void c_validate_plan_mismatch(t_case *tc) { forward_checks(tc, V_MISMATCH); }
static void c_validate_forward_shapes(t_case *tc) { forward_checks(tc, V_SHAPE); }

/* ---- plan descriptors ------------------------------------------------------------------- */

static void expect_plan(t_case *tc, smla_context *ctx, const smla_plan_desc *d, smla_status want,
                        const char *arg, const char *what) {
  smla_plan *plan = (smla_plan *)&plan;
  t_expect_status(tc, smla_plan_create(ctx, d, NULL, 0, &plan), want, ctx, arg, what);
  t_expect(tc, plan == NULL, "%s: *plan not NULL after a failed smla_plan_create", what);
  size_t bytes = 0;
  char w[96];
  snprintf(w, sizeof w, "%s (smla_plan_workspace_size)", what);
  t_expect_status(tc, smla_plan_workspace_size(ctx, d, &bytes), want, ctx, arg, w);
}

static void c_validate_plan_shapes(t_case *tc) {
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    const smla_plan_desc ok = {.max_tokens = 4, .num_heads = 16, .topk = 2048, .dr = 64,
                               .format = SMLA_CACHE_FP8_DS};
    smla_plan_desc d;
    d = ok; d.num_heads = 0;   expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "num_heads", "N = 0");
    d = ok; d.num_heads = 129; expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "num_heads", "N = 129");
    d = ok; d.topk = 0;        expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "topk", "K = 0");
    d = ok; d.dr = 32;         expect_plan(tc, ctx, &d, SMLA_ERR_UNSUPPORTED, "dr", "Dr = 32");
    d = ok; d.max_tokens = 0;  expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "max_tokens", "max_tokens = 0");
    d = ok; d.format = (smla_cache_format)3; expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "format", "format 3");
    d = ok; d.flags = 0x80;    expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "flags", "unknown flag bit");
    d = ok; d.num_splits = -1; expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "num_splits", "num_splits = -1");
    d = ok; d.heads_per_block = 24; expect_plan(tc, ctx, &d, SMLA_ERR_INVALID_ARGUMENT, "heads_per_block", "heads_per_block = 24");
    expect_plan(tc, ctx, NULL, SMLA_ERR_INVALID_ARGUMENT, "desc", "desc NULL");
    t_expect_status(tc, smla_plan_create(ctx, &ok, NULL, 0, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx,
                    "plan", "plan out-pointer NULL");
    t_expect_status(tc, smla_plan_workspace_size(ctx, &ok, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx,
                    "bytes", "workspace_size bytes NULL");
    smla_plan *plan = NULL;
    if (t_expect_ok(tc, smla_plan_create(ctx, &ok, NULL, 0, &plan), ctx, "valid plan (K = 2048, N = 16)"))
      t_expect(tc, smla_plan_describe(plan)[0] != '\0', "smla_plan_describe is empty");
    smla_plan_destroy(plan);
    smla_plan_destroy(NULL);
  }
}

/* ---- the other ops ------------------------------------------------------------------------ */

static void c_validate_ops(t_case *tc) {
  for (int b = 0; b < g_num_backends; b++) {
    vfix f;
    if (vfix_init(tc, b, &f)) {
      smla_context *ctx = f.ctx;
      int32_t *ints = (int32_t *)f.ints;
      /* convert: T = 2, K = 64, R = 1, B = 1, bs = 64 */
      const smla_convert_params cv = {.num_tokens = VT, .topk = VK, .req_id = ints,
          .block_table = ints + 64, .num_requests = 1, .blocks_per_request = 1,
          .block_table_stride = 1, .block_size = 64, .local = ints + 128, .local_stride = VK,
          .slots = ints + 512, .slots_stride = VK, .valid = ints + 1024, .compact = 0};
      smla_convert_params c;
      t_expect_ok(tc, smla_convert_indices(ctx, &cv, NULL), ctx, "baseline smla_convert_indices");
      t_expect_status(tc, smla_convert_indices(ctx, NULL, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "params", "convert params NULL");
      c = cv; c.req_id = NULL;     t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "req_id", "convert req_id NULL");
      c = cv; c.topk = 0;          t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "topk", "convert K = 0");
      c = cv; c.block_size = 0;    t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "block_size", "convert block_size 0");
      c = cv; c.num_requests = 0;  t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "num_requests", "convert R = 0");
      c = cv; c.local_stride = VK - 1; t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "local_stride", "convert local_stride K - 1");
      c = cv; c.compact = 2;       t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "compact", "convert compact 2");
      c = cv; c.cp_size = -1;      t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "cp_size", "convert cp_size -1");
      c = cv; c.cp_size = 2; c.cp_rank = 2;  t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "cp_rank", "convert cp_rank 2 of 2");
      c = cv; c.cp_size = 3; c.cp_rank = -1; t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "cp_rank", "convert cp_rank -1");
      c = cv; c.cp_size = 2; c.cp_interleave = -4; t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "cp_interleave", "convert cp_interleave -4");
      c = cv; c.cp_size = 1; c.cp_rank = 5; t_expect_ok(tc, smla_convert_indices(ctx, &c, NULL), ctx, "convert cp_size 1 is off (cp_rank ignored)");
      c = cv; c.slots = ints + 128; c.compact = 1;
      t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "alias", "convert in place with compact");
      c = cv; c.local = (const int32_t *)(f.ints + 2);
      t_expect_status(tc, smla_convert_indices(ctx, &c, NULL), SMLA_ERR_MISALIGNED, ctx, "local", "convert local 2 bytes off");
      /* cache write: T = 2 rows into the BF16 cache, slot 0 */
      const smla_cache_write_params cwv = {.num_tokens = VT, .kv_c = f.q, .kv_c_stride = 576,
          .k_pe = f.q + 1024, .k_pe_stride = 576, .slot = (const int64_t *)(f.ints + 16384),
          .cache = f.p.cache, .bad_inputs = NULL};
      smla_cache_write_params w;
      t_expect_ok(tc, smla_cache_write(ctx, &cwv, NULL), ctx, "baseline smla_cache_write");
      t_expect_status(tc, smla_cache_write(ctx, NULL, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "params", "cache_write params NULL");
      w = cwv; w.kv_c = NULL;      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "kv_c", "cache_write kv_c NULL");
      w = cwv; w.k_pe = NULL;      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "k_pe", "cache_write k_pe NULL (Dr 64)");
      w = cwv; w.slot = NULL;      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "slot", "cache_write slot NULL");
      w = cwv; w.kv_c = f.q + 2;   t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_MISALIGNED, ctx, "kv_c", "cache_write kv_c 2 bytes off");
      w = cwv; w.slot = (const int64_t *)(f.ints + 16388);
      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_MISALIGNED, ctx, "slot", "cache_write slot 4 bytes off");
      w = cwv; w.kv_c_stride = 504; t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "kv_c_stride", "cache_write kv_c_stride 504");
      /* NoPE (Dr 0): k_pe is not read, NULL or a zero-width [T][0] view (stride 0) */
      w = cwv; w.cache.dr = 0; w.k_pe = NULL; w.k_pe_stride = 0;
      t_expect_ok(tc, smla_cache_write(ctx, &w, NULL), ctx, "cache_write Dr 0, k_pe NULL");
      w.k_pe = f.q + 1024;
      t_expect_ok(tc, smla_cache_write(ctx, &w, NULL), ctx, "cache_write Dr 0, zero-width k_pe (stride 0)");
      w = cwv; w.cache.format = SMLA_CACHE_FP8_TENSOR; w.cache.row_bytes = 576; w.cache.scale = 0.0f;
      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "scale", "FP8_TENSOR scale 0");
      w.cache.scale = NAN;
      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "scale", "FP8_TENSOR scale NaN");
      w.cache.scale = INFINITY;
      t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "scale", "FP8_TENSOR scale Inf");
      w = cwv; w.cache.dr = 32;    t_expect_status(tc, smla_cache_write(ctx, &w, NULL), SMLA_ERR_UNSUPPORTED, ctx, "dr", "cache_write Dr 32");
      /* merge: P = 1 f32 partial -> bf16 out */
      const smla_merge_params mv = {.num_partials = 1, .num_tokens = VT, .num_heads = VN, .dv = 512,
          .out_p = f.big, .out_p_dtype = SMLA_DTYPE_F32, .out_p_stride_p = VT * VN * 512,
          .out_p_stride_t = VN * 512, .out_p_stride_h = 512, .lse_p = (const float *)(f.ints + 4096),
          .lse_p_stride_p = VT * VN, .lse_p_stride_t = VN, .out = f.out, .out_dtype = SMLA_DTYPE_BF16,
          .out_stride_t = VN * 512, .out_stride_h = 512};
      smla_merge_params m;
      t_expect_ok(tc, smla_merge_states(ctx, &mv, NULL), ctx, "baseline smla_merge_states");
      t_expect_status(tc, smla_merge_states(ctx, NULL, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "params", "merge params NULL");
      m = mv; m.num_partials = 0;  t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "num_partials", "merge P = 0");
      m = mv; m.dv = 513;          t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "dv", "merge dv 513");
      m = mv; m.out_p = NULL;      t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "out_p", "merge out_p NULL");
      m = mv; m.out_p_stride_h = 511; t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "out_p_stride_h", "merge out_p_stride_h 511");
      m = mv; m.out_dtype = (smla_dtype)5; t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "dtype", "merge out dtype 5");
      m = mv; m.lse_p = (const float *)(f.ints + 4098);
      t_expect_status(tc, smla_merge_states(ctx, &m, NULL), SMLA_ERR_MISALIGNED, ctx, "lse_p", "merge lse_p 2 bytes off");
      t_expect(tc, smla_convert_indices(NULL, &cv, NULL) == SMLA_ERR_INVALID_ARGUMENT &&
                   smla_cache_write(NULL, &cwv, NULL) == SMLA_ERR_INVALID_ARGUMENT &&
                   smla_merge_states(NULL, &mv, NULL) == SMLA_ERR_INVALID_ARGUMENT,
               "a NULL context is not INVALID_ARGUMENT");
      t_sync(tc);
    }
    vfix_free(tc, &f);
  }
}

/* Metadata argument errors (host; ctx given so there is a message). */
static void c_validate_metadata(t_case *tc) {
  smla_context *ctx = t_on(tc, T_CPU);
  if (!ctx) return;
  int32_t qsl[3] = {0, 1, 2}, seq[2] = {5, 5}, req[4];
  const smla_metadata_params ok = {.num_tokens = 4, .num_requests = 2, .topk = 64,
      .query_start_loc = qsl, .seq_lens = seq, .req_id = req};
  smla_metadata_params p;
  t_expect_ok(tc, smla_build_metadata(ctx, &ok), ctx, "baseline smla_build_metadata");
  t_expect_status(tc, smla_build_metadata(ctx, NULL), SMLA_ERR_INVALID_ARGUMENT, ctx, "params", "params NULL");
  p = ok; p.topk = 0;              t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "topk", "K = 0");
  p = ok; p.query_start_loc = NULL; t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "query_start_loc", "query_start_loc NULL");
  p = ok; p.seq_lens = NULL;       t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "seq_lens", "seq_lens NULL with R = 2");
  p = ok; p.req_id = NULL;         t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "req_id", "req_id NULL");
  p = ok; p.num_tokens = -1;       t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "num_tokens", "T = -1");
  p = ok; p.num_requests = -1;     t_expect_status(tc, smla_build_metadata(ctx, &p), SMLA_ERR_INVALID_ARGUMENT, ctx, "num_requests", "R = -1");
}

/* T = 0 is valid everywhere and does nothing: every pointer may be NULL, out untouched. */
static void c_validate_t0(t_case *tc) {
  for (int b = 0; b < g_num_backends; b++) {
    vfix f;
    if (vfix_init(tc, b, &f)) {
      smla_forward_params p = f.p;
      p.num_tokens = 0;
      p.q_nope = p.q_pe = NULL;
      p.slots = NULL;
      p.out = NULL;
      p.lse = NULL;
      p.out_stride_t = p.q_nope_stride_t = 0;
      expect_forward(tc, &f, f.plan, &p, SMLA_OK, NULL, "forward T = 0");
      const smla_convert_params cv = {.num_tokens = 0, .topk = VK, .num_requests = 1,
                                      .blocks_per_request = 1, .block_size = 64};
      t_expect_ok(tc, smla_convert_indices(f.ctx, &cv, NULL), f.ctx, "convert T = 0, NULL arrays");
      smla_cache_write_params w = {.num_tokens = 0, .cache = f.p.cache};
      t_expect_ok(tc, smla_cache_write(f.ctx, &w, NULL), f.ctx, "cache_write T = 0, NULL arrays");
      const smla_merge_params m = {.num_partials = 2, .num_tokens = 0, .num_heads = VN, .dv = 512};
      t_expect_ok(tc, smla_merge_states(f.ctx, &m, NULL), f.ctx, "merge T = 0, NULL arrays");
    }
    vfix_free(tc, &f);
  }
}

void t_register_validate_cases(void) {
  t_register("validate_null", c_validate_null);
  t_register("validate_alignment", c_validate_alignment);
  t_register("validate_strides", c_validate_strides);
  t_register("validate_plan_mismatch", c_validate_plan_mismatch);
  t_register("validate_shapes_forward", c_validate_forward_shapes);
  t_register("validate_shapes_plan", c_validate_plan_shapes);
  t_register("validate_ops", c_validate_ops);
  t_register("validate_forward_indices", c_validate_forward_indices);
  t_register("validate_metadata", c_validate_metadata);
  t_register("validate_t0", c_validate_t0);
}
