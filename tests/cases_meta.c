/*
 * cases_meta.c: the host metadata builder (SPEC §5), one named case per padding shape of
 * the SPEC, and the malformed inputs; plus context creation per device. Metadata is host
 * only, so these run on the CPU context (and once with ctx = NULL, which is allowed).
 */
#include "harness.h"

#include "ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MD_K 64   /* topk: seq_lens range past it, so limit = min(ctx, K) clamps sometimes */
#define MD_OVER 3 /* outputs get 3 extra poisoned elements: writes past T show */

typedef struct {
  int64_t T;
  int R;
  int32_t qsl[1100];
  int32_t seq[1100];
} md_batch;

/* Appends a request of q_len tokens and seq_len context (q_len 0: a padding request). */
static void md_add(md_batch *b, int32_t q_len, int32_t seq_len) {
  b->qsl[b->R + 1] = b->qsl[b->R] + q_len;
  b->seq[b->R] = seq_len;
  b->R++;
}

/* A real request with a context of q_len .. q_len + 150 tokens (often past K). */
static void md_add_real(md_batch *b, int32_t q_len) {
  md_add(b, q_len, q_len + (int32_t)t_rng_int(0, 150));
}

/* A padding request: q_len 0, a stale seq_len (negative, 0 or large), never looked at. */
static void md_add_pad(md_batch *b) {
  static const int32_t stale[4] = {-5, 0, 999999, INT32_MIN};
  md_add(b, 0, stale[t_rng_int(0, 3)]);
}

static void md_begin(md_batch *b, int64_t T) {
  memset(b, 0, sizeof *b);
  b->T = T;
}

static int all_poison(const int32_t *a, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if ((uint32_t)a[i] != 0xffffffffu) return 0;
  return 1;
}

/* One call of the library (ctx may be NULL); outputs poisoned first. */
static smla_status md_call(smla_context *ctx, const md_batch *b, int with_optional,
                           int32_t *req, int32_t *cl, int32_t *lim) {
  const size_t n = (size_t)(b->T + MD_OVER) * 4;
  memset(req, T_POISON, n);
  memset(cl, T_POISON, n);
  memset(lim, T_POISON, n);
  smla_metadata_params p;
  memset(&p, 0, sizeof p);
  p.num_tokens = b->T;
  p.num_requests = b->R;
  p.topk = MD_K;
  p.query_start_loc = b->qsl;
  p.seq_lens = b->seq;
  p.req_id = req;
  p.ctx_len = with_optional ? cl : NULL;
  p.limit = with_optional ? lim : NULL;
  return smla_build_metadata(ctx, &p);
}

/* The reference decides the expected status (and must agree with `want`, the case's own
 * statement of it); the library must return it, write exactly rows [0, T) on success and
 * nothing at all on error. */
static void md_run(t_case *tc, const md_batch *b, smla_status want) {
  smla_context *ctx = t_on(tc, T_CPU);
  const size_t n = (size_t)(b->T + MD_OVER);
  int32_t *rr = t_xmalloc(n * 4), *rc = t_xmalloc(n * 4), *rl = t_xmalloc(n * 4);
  int32_t *gr = t_xmalloc(n * 4), *gc = t_xmalloc(n * 4), *gl = t_xmalloc(n * 4);
  memset(rr, 0, n * 4);
  memset(rc, 0, n * 4);
  memset(rl, 0, n * 4);
  smla_metadata_params rp;
  memset(&rp, 0, sizeof rp);
  rp.num_tokens = b->T;
  rp.num_requests = b->R;
  rp.topk = MD_K;
  rp.query_start_loc = b->qsl;
  rp.seq_lens = b->seq;
  rp.req_id = rr;
  rp.ctx_len = rc;
  rp.limit = rl;
  const smla_status rs = ref_metadata(&rp);
  t_expect(tc, rs == want, "test self-check: the reference says %s, the case expects %s",
           smla_status_string(rs), smla_status_string(want));
  for (int pass = 0; pass < 3; pass++) {
    /* pass 0: CPU context; 1: ctx NULL; 2: ctx_len and limit NULL */
    smla_context *c = pass == 1 ? NULL : ctx;
    const smla_status s = md_call(c, b, pass != 2, gr, gc, gl);
    const char *how = pass == 0 ? "cpu context" : pass == 1 ? "ctx NULL" : "ctx_len, limit NULL";
    char what[96];
    snprintf(what, sizeof what, "smla_build_metadata (%s)", how);
    if (want != SMLA_OK) {
      t_expect_status(tc, s, want, c, NULL, what);
      t_expect(tc, all_poison(gr, (int64_t)n) && all_poison(gc, (int64_t)n) &&
                   all_poison(gl, (int64_t)n), "%s: outputs written on error", what);
      continue;
    }
    if (!t_expect_ok(tc, s, c, what)) continue;
    snprintf(what, sizeof what, "req_id (%s)", how);
    t_check_i32(tc, what, gr, rr, t_shape1(b->T));
    if (pass != 2) {
      snprintf(what, sizeof what, "ctx_len (%s)", how);
      t_check_i32(tc, what, gc, rc, t_shape1(b->T));
      snprintf(what, sizeof what, "limit (%s)", how);
      t_check_i32(tc, what, gl, rl, t_shape1(b->T));
    }
    t_expect(tc, all_poison(gr + b->T, MD_OVER) && all_poison(gc + b->T, MD_OVER) &&
                 all_poison(gl + b->T, MD_OVER), "%s: wrote past T = %lld", how, (long long)b->T);
    if (pass == 2)
      t_expect(tc, all_poison(gc, (int64_t)n) && all_poison(gl, (int64_t)n),
               "ctx_len / limit NULL, but their buffers were written");
  }
  free(rr);
  free(rc);
  free(rl);
  free(gr);
  free(gc);
  free(gl);
}

/* `real` decode rows (q_len 1 each; 100 < 104 mixes in prefill) in a batch padded to T,
 * plus a few padding requests whose starts repeat the last one. */
static void padded(t_case *tc, int real, int64_t T) {
  md_batch b;
  md_begin(&b, T);
  if (real == 100) {
    static const int32_t q[7] = {1, 30, 1, 1, 50, 16, 1};
    for (int i = 0; i < 7; i++) md_add_real(&b, q[i]);
  } else {
    for (int i = 0; i < real; i++) md_add_real(&b, 1);
  }
  for (int i = 0; i < 2; i++) md_add_pad(&b);
  md_run(tc, &b, SMLA_OK);
}

static void c_pad_1_2(t_case *tc) { padded(tc, 1, 2); }
static void c_pad_3_32(t_case *tc) { padded(tc, 3, 32); }
static void c_pad_7_8(t_case *tc) { padded(tc, 7, 8); }
static void c_pad_15_16(t_case *tc) { padded(tc, 15, 16); }
static void c_pad_31_32(t_case *tc) { padded(tc, 31, 32); }
static void c_pad_100_104(t_case *tc) { padded(tc, 100, 104); }

/* No real token: no request at all (R = 0), only padding requests, and T = 0. */
static void c_zero_real(t_case *tc) {
  md_batch b;
  md_begin(&b, 8);
  md_run(tc, &b, SMLA_OK);
  md_begin(&b, 4);
  for (int i = 0; i < 3; i++) md_add_pad(&b);
  md_run(tc, &b, SMLA_OK);
  md_begin(&b, 0);
  md_run(tc, &b, SMLA_OK);
}

/* Decode rows next to prefill chunks, one a fresh prompt (seq_len == q_len: ctx 1..q_len),
 * one with a context beyond K (limit clamps), and a padding request in the middle. */
static void c_mixed(t_case *tc) {
  md_batch b;
  md_begin(&b, 72);
  md_add_real(&b, 1);
  md_add(&b, 17, 17);
  md_add_real(&b, 1);
  md_add_pad(&b);
  md_add(&b, 5, 500);
  md_add_real(&b, 1);
  md_add_real(&b, 40);
  md_run(tc, &b, SMLA_OK);
}

/* Speculative decoding: 2..4 query tokens per request (MTP drafts), T padded by 2. */
static void c_speculative(t_case *tc) {
  md_batch b;
  md_begin(&b, 0);
  for (int i = 0; i < 6; i++) md_add_real(&b, (int32_t)t_rng_int(2, 4));
  b.T = b.qsl[b.R] + 2;
  md_run(tc, &b, SMLA_OK);
}

static void c_malformed_decreasing(t_case *tc) {
  md_batch b;
  md_begin(&b, 8);
  md_add(&b, 3, 10);
  md_add(&b, 2, 10);
  b.qsl[2] = 2; /* 0, 3, 2: decreasing */
  md_add(&b, 3, 10);
  md_run(tc, &b, SMLA_ERR_MALFORMED);
}

static void c_malformed_past_t(t_case *tc) {
  md_batch b;
  md_begin(&b, 8);
  md_add(&b, 2, 10);
  md_add(&b, 7, 10); /* last start 9 > T = 8 */
  md_run(tc, &b, SMLA_ERR_MALFORMED);
}

static void c_malformed_seq_lt_q(t_case *tc) {
  md_batch b;
  md_begin(&b, 8);
  md_add(&b, 1, 10);
  md_add(&b, 3, 2); /* seq_len 2 < q_len 3 */
  md_run(tc, &b, SMLA_ERR_MALFORMED);
}

static void c_malformed_first_start(t_case *tc) {
  md_batch b;
  md_begin(&b, 8);
  md_add(&b, 2, 10);
  for (int r = 0; r <= b.R; r++) b.qsl[r] += 1; /* query_start_loc[0] = 1 */
  md_run(tc, &b, SMLA_ERR_MALFORMED);
}

/* ---- contexts ------------------------------------------------------------------------------ */

/* The CPU context always exists; CUDA ordinals give NO_CUDA without CUDA, NO_DEVICE past the
 * last GPU; a bad ordinal or NULL out is INVALID_ARGUMENT; *ctx is NULL on failure. */
static void c_context_devices(t_case *tc) {
  t_on(tc, T_CPU);
  smla_context *c = (smla_context *)&c;
  t_expect_ok(tc, smla_context_create(&c, SMLA_DEVICE_CPU), NULL, "smla_context_create(CPU)");
  t_expect(tc, c && smla_context_device(c) == SMLA_DEVICE_CPU, "CPU context reports device %d",
           c ? smla_context_device(c) : -99);
  t_expect(tc, c && smla_context_message(c)[0] == '\0', "a fresh context's message is not empty");
  smla_context_destroy(c);
  smla_context_destroy(NULL);
  t_expect(tc, smla_context_create(NULL, SMLA_DEVICE_CPU) == SMLA_ERR_INVALID_ARGUMENT,
           "smla_context_create(NULL, CPU) is not INVALID_ARGUMENT");
  c = (smla_context *)&c;
  t_expect(tc, smla_context_create(&c, -2) == SMLA_ERR_INVALID_ARGUMENT && c == NULL,
           "device -2: not INVALID_ARGUMENT with *ctx NULL");
  const int has_cuda = strstr(smla_build_features(), "cuda") != NULL;
  const int n = smla_cuda_device_count();
  c = (smla_context *)&c;
  const smla_status s = smla_context_create(&c, n + 7);
  t_expect(tc, s == (has_cuda ? SMLA_ERR_NO_DEVICE : SMLA_ERR_NO_CUDA) && c == NULL,
           "device %d (of %d, built with CUDA: %s): got %s, want %s with *ctx NULL", n + 7, n,
           has_cuda ? "yes" : "no", smla_status_string(s),
           smla_status_string(has_cuda ? SMLA_ERR_NO_DEVICE : SMLA_ERR_NO_CUDA));
  if (s == SMLA_OK) smla_context_destroy(c);
  t_expect(tc, has_cuda || n == 0, "built without CUDA but %d CUDA devices", n);
  char name[128];
  const smla_status ns = smla_cuda_device_name(0, name, sizeof name);
  t_expect(tc, n > 0 ? ns == SMLA_OK && name[0] : ns != SMLA_OK,
           "smla_cuda_device_name(0): %s \"%s\" with %d devices", smla_status_string(ns), name, n);
  t_expect(tc, smla_version() == SMLA_VERSION_NUMBER &&
                   strcmp(smla_version_string(), SMLA_VERSION_STRING) == 0,
           "version %u \"%s\" vs header %d \"%s\"", smla_version(), smla_version_string(),
           SMLA_VERSION_NUMBER, SMLA_VERSION_STRING);
  for (int st = 0; st <= 12; st++)
    t_expect(tc, smla_status_string((smla_status)st)[0] != '\0', "status %d has no string", st);
}

void t_register_meta_cases(void) {
  t_register("metadata_padding_1_of_2", c_pad_1_2);
  t_register("metadata_padding_3_of_32", c_pad_3_32);
  t_register("metadata_padding_7_of_8", c_pad_7_8);
  t_register("metadata_padding_15_of_16", c_pad_15_16);
  t_register("metadata_padding_31_of_32", c_pad_31_32);
  t_register("metadata_padding_100_of_104", c_pad_100_104);
  t_register("metadata_zero_real_tokens", c_zero_real);
  t_register("metadata_mixed_decode_prefill", c_mixed);
  t_register("metadata_speculative", c_speculative);
  t_register("metadata_malformed_decreasing_starts", c_malformed_decreasing);
  t_register("metadata_malformed_last_start_past_T", c_malformed_past_t);
  t_register("metadata_malformed_seq_len_below_q_len", c_malformed_seq_lt_q);
  t_register("metadata_malformed_first_start_not_0", c_malformed_first_start);
  t_register("context_devices", c_context_devices);
}
