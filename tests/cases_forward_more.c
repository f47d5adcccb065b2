/*
 * cases_forward_more.c: forward cases about plans and runs rather than the formula:
 * forced num_splits, caller workspace, T below max_tokens, batch invariance, determinism
 * and concurrent contexts.
 */
#include "fwd.h"

#include "devmem.h"
#include "numerics.h" /* bf16 widening of results */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int setup(t_case *tc, fwd_problem *pb, int64_t T, int N, int K, int dr,
                 smla_cache_format f, int random_lengths) {
  fwd_defaults(pb, T, N, K, dr, f);
  fwd_make_inputs(pb);
  if (random_lengths) { /* row 0 full, the others random in [1, K] */
    pb->use_lengths = 1;
    for (int64_t t = 1; t < T; t++) pb->lengths[t] = (int32_t)t_rng_int(1, K);
  }
  return fwd_make_cache(tc, pb);
}

/* Forced num_splits 1, 3 and 7 (K = 2048: 7 splits of ~293 entries, none a multiple of a
 * tile) each match the reference, and 3 and 7 match 1 within the out/lse tolerance: a
 * split changes the summation order, not the result. The CPU ignores num_splits (its
 * description says so), so the case reports skip there; on CUDA each forced split count
 * is checked against the CPU. */
static void c_num_splits(t_case *tc) {
  fwd_problem pb;
  fwd_defaults(&pb, 2, 16, 2048, 64, SMLA_CACHE_BF16);
  fwd_make_inputs(&pb);
  pb.use_lengths = 1;
  pb.lengths[1] = 1500; /* a row whose last split is partial */
  if (fwd_make_cache(tc, &pb) == 0) {
    fwd_ref ref;
    fwd_reference(&pb, &ref);
    static const int splits[3] = {1, 3, 7};
    fwd_result cpu[3];
    int cpu_ok[3] = {0, 0, 0};
    for (int b = 0; b < g_num_backends; b++) {
      if (!t_on(tc, b)) continue;
      if (b == T_CPU) t_skip(tc, "forced KV splits; the CPU has none, its runs are the GPU's comparison");
      fwd_result res[3];
      int ok[3];
      char what[96];
      for (int i = 0; i < 3; i++) {
        pb.num_splits = splits[i];
        ok[i] = fwd_exec(tc, &pb, &res[i]);
        if (!ok[i]) continue;
        snprintf(what, sizeof what, "reference (num_splits %d)", splits[i]);
        fwd_check(tc, &pb, &res[i], &ref, what);
        if (b != T_CPU && cpu_ok[i]) {
          fwd_ref cr;
          fwd_as_ref(&pb, &cpu[i], &cr);
          cr.pabs = ref.pabs;
          snprintf(what, sizeof what, "cpu backend (num_splits %d)", splits[i]);
          fwd_check(tc, &pb, &res[i], &cr, what);
          fwd_ref_free(&cr);
        }
      }
      if (ok[0]) {
        fwd_ref r1;
        fwd_as_ref(&pb, &res[0], &r1);
        r1.pabs = ref.pabs;
        for (int i = 1; i < 3; i++) {
          if (!ok[i]) continue;
          snprintf(what, sizeof what, "num_splits 1 (this is num_splits %d)", splits[i]);
          fwd_check(tc, &pb, &res[i], &r1, what);
        }
        fwd_ref_free(&r1);
      }
      for (int i = 0; i < 3; i++) {
        if (!ok[i]) continue;
        if (b == T_CPU) {
          cpu[i] = res[i];
          cpu_ok[i] = 1;
        } else {
          fwd_result_free(&res[i]);
        }
      }
    }
    for (int i = 0; i < 3; i++)
      if (cpu_ok[i]) fwd_result_free(&cpu[i]);
    fwd_ref_free(&ref);
  }
  fwd_free(&pb);
}

/* A plan on a caller workspace of exactly smla_plan_workspace_size bytes runs the forward
 * (fwd_run), and the plan refuses a workspace one byte smaller (SMLA_ERR_WORKSPACE) or one
 * that is not 256-byte aligned (SMLA_ERR_MISALIGNED), without creating a plan. */
static void c_caller_workspace(t_case *tc) {
  fwd_problem pb;
  if (setup(tc, &pb, 3, 16, 512, 64, SMLA_CACHE_FP8_DS, 1) == 0) {
    pb.caller_workspace = 1;
    fwd_run(tc, &pb);
    smla_plan_desc d;
    memset(&d, 0, sizeof d);
    d.max_tokens = pb.max_tokens;
    d.num_heads = pb.N;
    d.topk = pb.K;
    d.dr = pb.dr;
    d.format = pb.format;
    for (int b = 0; b < g_num_backends; b++) {
      smla_context *ctx = t_on(tc, b);
      if (!ctx) continue;
      size_t bytes = 0;
      if (!t_expect_ok(tc, smla_plan_workspace_size(ctx, &d, &bytes), ctx,
                       "smla_plan_workspace_size"))
        continue;
      char *ws = t_alloc(tc, bytes + 512);
      if (!ws) continue;
      smla_plan *plan = (smla_plan *)&pb; /* not NULL: must be cleared on failure */
      if (bytes > 0) {
        t_expect_status(tc, smla_plan_create(ctx, &d, ws, bytes - 1, &plan), SMLA_ERR_WORKSPACE,
                        ctx, "workspace", "workspace one byte too small");
        t_expect(tc, plan == NULL, "failed smla_plan_create left *plan non-NULL");
        if (plan && plan != (smla_plan *)&pb) smla_plan_destroy(plan);
      } /* a plan needing no workspace has no "too small" to test */
      plan = (smla_plan *)&pb;
      t_expect_status(tc, smla_plan_create(ctx, &d, ws + 16, bytes + 256, &plan),
                      SMLA_ERR_MISALIGNED, ctx, "workspace", "workspace 16 bytes off alignment");
      t_expect(tc, plan == NULL, "failed smla_plan_create left *plan non-NULL");
      if (plan && plan != (smla_plan *)&pb) smla_plan_destroy(plan);
      t_free(tc, ws);
    }
  }
  fwd_free(&pb);
}

/* A plan made for up to 64 rows serves a forward of 5. */
static void c_t_below_max(t_case *tc) {
  fwd_problem pb;
  if (setup(tc, &pb, 5, 16, 512, 64, SMLA_CACHE_BF16, 1) == 0) {
    pb.max_tokens = 64;
    fwd_run(tc, &pb);
  }
  fwd_free(&pb);
}

/* One plan shape (K = 512, up to 64 rows, on a caller workspace of exactly its size) at T
 * on both sides of the runs of T that an sm_90 plan hands its few-rows chain (backend.c,
 * few_rows_chain; with K = 512 the model's chains on an H100 / H200 reach T = 16..32 in 1
 * to 3 links, e.g. N = 64 in groups of 8, 16, 32 to T = 8, 16, 22 on the H100; the T here
 * straddle their ends), each forward run twice on its plan: the plans' workspace regions
 * must not meet, and each must be right on its own. The describe names every link, so a
 * failure says which kernel ran. */
static smla_plan *plan_for(t_case *tc, smla_context *ctx, int64_t T, int N, int K, int dr,
                           smla_cache_format format, int splits, int hb, uint32_t flags);
static void expect_sm90_describe(t_case *tc, int64_t T, int N, int K, int dr, int splits,
                                 const char *needle, const char *what);

static void c_small_t_plan(t_case *tc) {
  static const int heads[4] = {16, 32, 64, 128};
  static const int64_t rows[7] = {1, 2, 3, 5, 9, 17, 33};
  for (int n = 0; n < 4; n++)
    for (int r = 0; r < 7; r++) {
      fwd_problem pb;
      if (setup(tc, &pb, rows[r], heads[n], 512, 64, SMLA_CACHE_BF16, 1) == 0) {
        pb.max_tokens = 64;
        pb.caller_workspace = 1;
        pb.repeat = 2;
        fwd_run(tc, &pb);
      }
      fwd_free(&pb);
    }
  /* The chain is there to be tested: on an sm_90 device the plan of N = 128 (K = 2048, up
   * to 64 rows) hands its fewest rows to narrower groups (the model's choice, measured
   * 13.5 against 17.6 us at T = 1 on an H100). */
  expect_sm90_describe(tc, 64, 128, 2048, 64, 0, "; T <= ",
                       "N = 128 on sm_90: a few-rows chain");
}

/* SMLA_PLAN_BATCH_INVARIANT: row 0's outputs are bitwise the same whether it runs in a
 * batch of T rows (of different lengths) or alone (T = 1, same plan shape). 64 rows of
 * N = 16: on an H200 the default policy splits T = 1 16 ways and T = 64 far fewer, so a
 * plan that ignored the flag would fail here (T = 6 would not tell: both get 16 splits).
 * 8 rows of N = 32, K = 2048: the fixed split count is above 8, where the combine kernel
 * would pick another summation order for 32 rows (T = 1) than for 256 (T = 8). */
static void batch_invariant(t_case *tc, int64_t T, int N, int K, smla_cache_format format) {
  fwd_problem pb;
  if (setup(tc, &pb, T, N, K, 64, format, 1) == 0) {
    pb.flags = SMLA_PLAN_BATCH_INVARIANT;
    fwd_run(tc, &pb);
    for (int b = 0; b < g_num_backends; b++) {
      if (!t_on(tc, b)) continue;
      fwd_result all, one;
      if (!fwd_exec(tc, &pb, &all)) continue;
      pb.T = 1; /* row 0 is a prefix of every buffer */
      const int ok = fwd_exec(tc, &pb, &one);
      pb.T = T;
      if (ok) {
        char w[64];
        snprintf(w, sizeof w, "row 0 out, T=%lld vs T=1", (long long)T);
        t_check_same(tc, w, all.out, one.out, (size_t)t_span(pb.N, pb.out_sh, SMLA_DC) * 2);
        snprintf(w, sizeof w, "row 0 lse, T=%lld vs T=1", (long long)T);
        t_check_same(tc, w, all.lse, one.lse, (size_t)pb.N * 4);
        snprintf(w, sizeof w, "row 0 max_logit, T=%lld vs T=1", (long long)T);
        t_check_same(tc, w, all.ml, one.ml, (size_t)pb.N * 4);
        fwd_result_free(&one);
      }
      fwd_result_free(&all);
    }
  }
  fwd_free(&pb);
}

static void c_batch_invariant(t_case *tc) { batch_invariant(tc, 64, 16, 1024, SMLA_CACHE_FP8_DS); }
static void c_batch_invariant_many_splits(t_case *tc) {
  batch_invariant(tc, 8, 32, 2048, SMLA_CACHE_BF16);
}

/* The same forward twice (on the same plan, and on a fresh plan) gives bitwise identical
 * out, lse, max_logit and bad_inputs, on every backend. */
static void c_determinism(t_case *tc) {
  fwd_problem pb;
  if (setup(tc, &pb, 4, 16, 2048, 64, SMLA_CACHE_FP8_DS, 1) == 0) {
    pb.repeat = 2;
    pb.use_sink = 1;
    fwd_slot_row(&pb, 2)[5] = -7; /* one bad entry, so the counter is exercised */
    fwd_run(tc, &pb);
  }
  fwd_free(&pb);
}

/* ---- 4 threads, each with its own CPU context and plan, at the same time ---------------- */

#define THREADS 4

typedef struct {
  const fwd_problem *pb;
  pthread_barrier_t *start;
  fwd_result res;
  smla_status status;
  char err[512];
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  smla_context *ctx = NULL;
  w->status = smla_context_create(&ctx, SMLA_DEVICE_CPU);
  pthread_barrier_wait(w->start); /* every thread reaches the forward together */
  if (w->status == SMLA_OK) w->status = fwd_exec_host(ctx, w->pb, &w->res, w->err, sizeof w->err);
  else snprintf(w->err, sizeof w->err, "smla_context_create: %s", smla_status_string(w->status));
  smla_context_destroy(ctx);
  return NULL;
}

static void c_concurrency(t_case *tc) {
  fwd_problem pb;
  if (setup(tc, &pb, 4, 16, 1024, 64, SMLA_CACHE_BF16, 1) == 0) {
    pb.use_sink = 1;
    t_on(tc, T_CPU);
    fwd_result single;
    if (fwd_exec(tc, &pb, &single)) {
      fwd_ref ref;
      fwd_reference(&pb, &ref);
      fwd_check(tc, &pb, &single, &ref, "reference (single run)");
      fwd_ref_free(&ref);
      pthread_barrier_t start;
      pthread_barrier_init(&start, NULL, THREADS);
      worker w[THREADS];
      pthread_t tid[THREADS];
      int started[THREADS];
      for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].pb = &pb;
        w[i].start = &start;
        started[i] = pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0;
        if (!started[i]) { /* the barrier would never open: give up on the case */
          fprintf(stderr, "test_smla: pthread_create failed\n");
          exit(2);
        }
      }
      for (int i = 0; i < THREADS; i++) pthread_join(tid[i], NULL);
      pthread_barrier_destroy(&start);
      for (int i = 0; i < THREADS; i++) {
        char what[64];
        snprintf(what, sizeof what, "thread %d vs the single run", i);
        if (t_expect(tc, w[i].status == SMLA_OK, "thread %d: %s", i, w[i].err))
          fwd_check_same(tc, &pb, &single, &w[i].res, what);
        fwd_result_free(&w[i].res);
      }
      fwd_result_free(&single);
    }
  }
  fwd_free(&pb);
}

/* Wide head counts on a BF16 cache: on an H100/H200 the plan picks the sm_90a wgmma
 * kernel for these (fwd_run then also runs the portable kernel). Each mixes what that
 * kernel must handle: random lengths (partial and empty last tiles), planted bad and -1
 * slots, K not a multiple of 64, Dr 0, softcap, sink, padded heads (N = 100), and splits. */
/* A plan of these shapes on ctx, for the cases that check what it chose (its describe);
 * NULL after a failed expectation. */
static smla_plan *plan_for(t_case *tc, smla_context *ctx, int64_t T, int N, int K, int dr,
                           smla_cache_format format, int splits, int hb, uint32_t flags) {
  smla_plan_desc d;
  memset(&d, 0, sizeof d);
  d.max_tokens = T;
  d.num_heads = N;
  d.topk = K;
  d.dr = dr;
  d.format = format;
  d.num_splits = splits;
  d.heads_per_block = hb;
  d.flags = flags;
  smla_plan *plan = NULL;
  if (!t_expect_ok(tc, smla_plan_create(ctx, &d, NULL, 0, &plan), ctx, "smla_plan_create"))
    return NULL;
  return plan;
}

/* What the describe of a plan on the sm90 64-head kernel says of its tile loop: "tile loop
 * v11 (relay)", or, built with SMLA_FWD90_PAIR, "tile loop v24 (pairs)" (not the small-head
 * kernel's "swap-AB small-head tiles"). */
#define SM90_WIDE_LOOP "tile loop v"

/* On each GPU whose plan of this BF16 shape (splits: 0 the plan's, else forced) runs a
 * cuda-sm90 kernel, the plan's describe must contain `needle`; `what` says why. */
static void expect_sm90_describe(t_case *tc, int64_t T, int N, int K, int dr, int splits,
                                 const char *needle, const char *what) {
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx || b == T_CPU) continue;
    smla_plan *plan = plan_for(tc, ctx, T, N, K, dr, SMLA_CACHE_BF16, splits, 0, 0);
    if (!plan) continue;
    const char *desc = smla_plan_describe(plan);
    if (strncmp(desc, "cuda-sm90", 9) == 0)
      t_expect(tc, strstr(desc, needle) != NULL, "%s: the plan should name \"%s\": %s", what,
               needle, desc);
    smla_plan_destroy(plan);
  }
}

static void wide_flags(t_case *tc, int64_t T, int N, int K, int dr, float softcap, int sink,
                       int splits, int hb, uint32_t flags) {
  fwd_problem pb;
  fwd_defaults(&pb, T, N, K, dr, SMLA_CACHE_BF16);
  pb.flags = flags;
  pb.heads_per_block = hb;
  pb.softcap = softcap;
  pb.use_sink = sink;
  pb.num_splits = splits;
  pb.use_lengths = 1;
  fwd_make_inputs(&pb);
  const int32_t planted[4] = {-1, (int32_t)pb.S, -2, INT32_MAX};
  for (int64_t t = 0; t < T; t++) {
    pb.lengths[t] = t == 0 ? K : t == 1 ? 0 : (int32_t)t_rng_int(1, K);
    for (int i = 0; i < 4 && i < K; i++)
      fwd_slot_row(&pb, t)[t_rng_int(0, K - 1)] = planted[i];
  }
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}

static void wide(t_case *tc, int64_t T, int N, int K, int dr, float softcap, int sink,
                 int splits) {
  wide_flags(tc, T, N, K, dr, softcap, sink, splits, 0, 0);
}

/* Logits 100x the default spread (sm_scale 600 / sqrt(Dqk): a row's logits span a few
 * hundred), so that a row's running max keeps rising by more than the sm90 kernel's lazy
 * rescale lets its reference lag (W_TAU = 8 ln 2) after tile 0: each rise must rescale O,
 * and a reference left to lag by ~88 or more overflows P (at N = 16, the small-head kernel,
 * which rescales at every rise). Unsplit (33 tiles) or 5 splits of 5-6 tiles, both checked
 * against the CPU. */
static void steep(t_case *tc, int N, int K, int splits) {
  fwd_problem pb;
  fwd_defaults(&pb, 3, N, K, 64, SMLA_CACHE_BF16);
  pb.sm_scale = 600.0f / sqrtf((float)(512 + 64));
  pb.num_splits = splits;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}
static void c_wide_n64_steep(t_case *tc) { steep(tc, 64, 2100, 1); }
static void c_wide_n128_steep_splits(t_case *tc) { steep(tc, 128, 1700, 5); }
static void c_wide_n16_steep(t_case *tc) { steep(tc, 16, 2100, 1); }

static void c_wide_n128(t_case *tc) { wide(tc, 5, 128, 2051, 64, 0.0f, 0, 0); }
static void c_wide_n64_dr0(t_case *tc) { wide(tc, 4, 64, 700, 0, 0.0f, 1, 0); }
static void c_wide_n100_softcap(t_case *tc) { wide(tc, 3, 100, 333, 64, 5.0f, 1, 0); }
static void c_wide_n128_splits(t_case *tc) { wide(tc, 6, 128, 1500, 64, 0.0f, 1, 5); }
static void c_wide_n48_k1(t_case *tc) { wide(tc, 3, 48, 1, 64, 0.0f, 0, 0); }
/* One split of exactly 2 tiles: on sm90, warpgroup 1's first own tile, with no stage
 * refilled (v11's shortest exchange both ways). */
static void c_wide_n64_two_tiles(t_case *tc) { wide(tc, 2, 64, 128, 64, 0.0f, 0, 1); }
/* One split of 33 tiles (34 with Dr 0): on an sm90 device the wgmma kernel's tile loop
 * (v11, the relay; at N <= 32 the small-head kernel's) over a long split with an odd tile
 * count, an empty row and a random length each. The case checks that the plan's describe
 * names that loop, so that a plan that fell back to another kernel cannot pass for it (an
 * experiment build of another 64-head loop fails this check, and only this one). */
static void unsplit(t_case *tc, int N, int K, int dr, float softcap, int sink) {
  wide(tc, 3, N, K, dr, softcap, sink, 1);
  char what[96];
  snprintf(what, sizeof what, "K = %d (%d tiles, one split): its tile loop", K, (K + 63) / 64);
  expect_sm90_describe(tc, 3, N, K, dr, 1,
                       N > 32 ? SM90_WIDE_LOOP : "swap-AB small-head tiles", what);
}
/* Forced narrower head groups (desc.heads_per_block): N heads as ceil(N / hb) groups, on
 * the small-head sm90 kernel (hb heads a block) and, through fwd_run, the generic kernel
 * (16-head blocks at hb <= 16, 32 at hb = 32), with the wide cases' planted slots, lengths
 * (an empty row), sink; the last group partial at N = 40 and N = 100; forced splits and
 * the plan's. On a GPU the plan must name hb heads a block and the group count, so that a
 * plan that ignored the field cannot pass. */
static void c_heads_per_block(t_case *tc) {
  static const struct { int64_t T; int N, K, dr, hb, splits; } cfg[6] = {
      {2, 64, 600, 64, 16, 0}, {1, 128, 2048, 64, 32, 0}, {3, 40, 700, 0, 16, 4},
      {2, 16, 500, 64, 8, 0},  {2, 64, 300, 64, 32, 1},   {2, 100, 900, 64, 32, 3}};
  for (int i = 0; i < 6; i++) {
    wide_flags(tc, cfg[i].T, cfg[i].N, cfg[i].K, cfg[i].dr, 0.0f, 1, cfg[i].splits, cfg[i].hb, 0);
    for (int b = 0; b < g_num_backends; b++) {
      smla_context *ctx = t_on(tc, b);
      if (!ctx || b == T_CPU) continue;
      smla_plan *plan = plan_for(tc, ctx, cfg[i].T, cfg[i].N, cfg[i].K, cfg[i].dr,
                                 SMLA_CACHE_BF16, cfg[i].splits, cfg[i].hb, 0);
      if (!plan) continue;
      const char *desc = smla_plan_describe(plan);
      /* the generic kernel's narrowest block is 16 heads */
      const int want = strncmp(desc, "cuda-sm90", 9) == 0 || cfg[i].hb >= 16 ? cfg[i].hb : 16;
      char words[48];
      snprintf(words, sizeof words, " %d heads/block x %d groups", want,
               (cfg[i].N + want - 1) / want);
      t_expect(tc, strstr(desc, words) != NULL, "N = %d, heads_per_block = %d: the plan "
               "should say \"%s\": %s", cfg[i].N, cfg[i].hb, words + 1, desc);
      smla_plan_destroy(plan);
    }
  }
}

static void c_wide_n128_unsplit(t_case *tc) { unsplit(tc, 128, 2051, 64, 0.0f, 1); }
static void c_wide_n8_dr0_unsplit(t_case *tc) { unsplit(tc, 8, 2150, 0, 5.0f, 0); }
static void c_wide_n64_dr0_unsplit(t_case *tc) { unsplit(tc, 64, 2150, 0, 5.0f, 0); }

/* More (t, group) units at one split than the device has SMs, on the sm90 64-head kernel:
 * 300 rows of N = 64 (Dr 64, sink) and 150 of N = 128 (Dr 0, softcap), K = 150 with the wide
 * cases' lengths (an empty row: a unit with no tile; one, two or three tiles a unit) and
 * planted slots, and 200 of N = 100 (Dr 64, sink: a partial second group). In the
 * persistent grid (v14, the default since session 22) a block takes
 * several of these units in turn: the tile counts then move the stage a unit starts in and
 * whether a warpgroup owns a tile of it, and the empty row takes no part in the Q handshake.
 * On an sm90 device the plan must name the persistent grid, so that these rows cannot pass
 * on another kernel or on a build of one block a unit. */
static void c_wide_persistent(t_case *tc) {
  wide(tc, 300, 64, 150, 64, 0.0f, 1, 1);
  wide(tc, 150, 128, 150, 0, 5.0f, 0, 1);
  /* N = 100: the second group's heads 36..63 are past N, in the epilogue that stores rows
   * from the registers (a unit with a next one) and in the staged one. */
  wide(tc, 200, 100, 150, 64, 0.0f, 1, 1);
  expect_sm90_describe(tc, 300, 64, 150, 64, 1, "one split as a persistent grid",
                       "one split of 300 rows at N = 64: the 64-head kernel's persistent grid");
}

/* The sm90 kernel's two merges: forced 2, 3, 4, 6, 7 and 8 splits merge inside the kernel
 * (one cluster per row and head group; 3, 6 and 7 own uneven column ranges), 12 and 4
 * with SMLA_PLAN_SEPARATE_MERGE through the combine kernel (v1, and v4 launched as a
 * programmatic dependent); each against the CPU (and the portable kernel, fwd_run). On
 * an sm90 device each plan must say which merge it uses, so that a lost cluster path
 * cannot pass as the combine kernel. */
static void c_wide_n128_merges(t_case *tc) {
  static const struct { int splits; uint32_t flags; int in_kernel; } cfg[8] = {
      {2, 0, 1}, {3, 0, 1}, {4, 0, 1}, {6, 0, 1}, {7, 0, 1}, {8, 0, 1}, {12, 0, 0},
      {4, SMLA_PLAN_SEPARATE_MERGE, 0}};
  for (int i = 0; i < 8; i++) {
    wide_flags(tc, 4, 128, 1800, 64, 0.0f, 1, cfg[i].splits, 0, cfg[i].flags);
    for (int b = 0; b < g_num_backends; b++) {
      smla_context *ctx = t_on(tc, b);
      if (b == T_CPU) t_skip(tc, "the merges of KV splits; the CPU has no splits, its runs are the GPU's comparison");
      if (!ctx || b == T_CPU) continue;
      smla_plan *plan =
          plan_for(tc, ctx, 4, 128, 1800, 64, SMLA_CACHE_BF16, cfg[i].splits, 0, cfg[i].flags);
      if (!plan) continue;
      const char *desc = smla_plan_describe(plan);
      if (strncmp(desc, "cuda-sm90", 9) == 0)
        t_expect(tc, (strstr(desc, "merged in-kernel") != NULL) == cfg[i].in_kernel,
                 "%d splits (flags 0x%x): the plan should%s merge in-kernel: %s",
                 cfg[i].splits, (unsigned)cfg[i].flags, cfg[i].in_kernel ? "" : " not", desc);
      smla_plan_destroy(plan);
    }
  }
}

/* The in-kernel merge over distributed shared memory (fwd_dsmem_merge; sm_90 devices:
 * clusters of C splits, R clusters a row merged by the last to finish) of the generic
 * kernel and of the small-head sm90 kernel: forced splits 2, 3, 7, 8 (R = 1; 3 and 7 own
 * uneven column ranges), 14 (7 x 2), 16 (8 x 2), 24 (8 x 3), 32 (8 x 4), and 16 with
 * SMLA_PLAN_SEPARATE_MERGE through the combine kernel; every row with a random length
 * (whole clusters empty) and planted bad slots, each against the CPU. The generic cases
 * run with SMLA_PLAN_PORTABLE (on sm_90 devices the plan would otherwise take an sm90
 * kernel): 16 heads (bf16, dr 64, sink), 32 heads (dr 0, softcap) and 64 heads
 * (FP8_TENSOR: the value scale is applied by the merge); the small-head ones without it,
 * at 8, 16 and 32 heads (bf16: what that kernel reads; it merges one cluster a row, so its
 * 14-32 splits go to the combine). Where the plan can merge in the kernel (the generic
 * kernel's describe names programmatic launch, sm_90 code on an sm_90 device; the
 * small-head kernel's names an in-kernel merge, a build with SMLA_FWD90S_MERGE) it must
 * say it does, with the clusters expected, so that a lost merge path cannot pass as the
 * combine kernel. */
static void dsmem_merges(t_case *tc, int N, int dr, smla_cache_format format, float softcap,
                         int sink, uint32_t flags0) {
  static const struct { int splits; uint32_t flags; int C; } cfg[9] = {
      {2, 0, 2}, {3, 0, 3}, {7, 0, 7}, {8, 0, 8}, {14, 0, 7}, {16, 0, 8}, {24, 0, 8},
      {32, 0, 8}, {16, SMLA_PLAN_SEPARATE_MERGE, 0}};
  const int64_t T = 4;
  const int K = 2048;
  for (int i = 0; i < 9; i++) {
    fwd_problem pb;
    fwd_defaults(&pb, T, N, K, dr, format);
    pb.flags = flags0 | cfg[i].flags;
    pb.softcap = softcap;
    pb.use_sink = sink;
    pb.num_splits = cfg[i].splits;
    pb.use_lengths = 1;
    fwd_make_inputs(&pb);
    const int32_t planted[4] = {-1, (int32_t)pb.S, -2, INT32_MAX};
    for (int64_t t = 0; t < T; t++) {
      pb.lengths[t] = t == 0 ? K : t == 1 ? 0 : (int32_t)t_rng_int(1, K / 2);
      for (int j = 0; j < 4; j++) fwd_slot_row(&pb, t)[t_rng_int(0, K - 1)] = planted[j];
    }
    if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
    fwd_free(&pb);
    for (int b = 0; b < g_num_backends; b++) {
      smla_context *ctx = t_on(tc, b);
      if (b == T_CPU) t_skip(tc, "the merges of KV splits; the CPU has no splits, its runs are the GPU's comparison");
      if (!ctx || b == T_CPU) continue;
      const uint32_t flags = flags0 | cfg[i].flags;
      smla_plan *plan = plan_for(tc, ctx, T, N, K, dr, format, cfg[i].splits, 0, flags);
      if (!plan) continue;
      const char *desc = smla_plan_describe(plan);
      const int generic =
          strncmp(desc, "cuda-generic", 12) == 0 && strstr(desc, "programmatic launch");
      const int small = strncmp(desc, "cuda-sm90", 9) == 0 && strstr(desc, "swap-AB") &&
                        strstr(desc, "in-kernel merge for");
      if (generic || small) {
        /* the small-head kernel merges one cluster a row only (backend.c, merge_cluster_of) */
        const int C = small && cfg[i].splits > 8 ? 0 : cfg[i].C;
        char want[64] = "";
        if (C)
          snprintf(want, sizeof want, "merged in-kernel (%d clusters of %d)",
                   cfg[i].splits / C, C);
        t_expect(tc, C ? strstr(desc, want) != NULL : strstr(desc, "merged in-kernel") == NULL,
                 "%d splits (flags 0x%x): the plan should %s: %s", cfg[i].splits,
                 (unsigned)flags, C ? want : "use the combine kernel", desc);
      }
      smla_plan_destroy(plan);
    }
  }
}
static void c_generic_merges_n16(t_case *tc) {
  dsmem_merges(tc, 16, 64, SMLA_CACHE_BF16, 0.0f, 1, SMLA_PLAN_PORTABLE);
}
static void c_generic_merges_n32_dr0(t_case *tc) {
  dsmem_merges(tc, 32, 0, SMLA_CACHE_BF16, 5.0f, 0, SMLA_PLAN_PORTABLE);
}
static void c_generic_merges_n64_fp8(t_case *tc) {
  dsmem_merges(tc, 64, 64, SMLA_CACHE_FP8_TENSOR, 0.0f, 1, SMLA_PLAN_PORTABLE);
}
static void c_small_merges_n16(t_case *tc) {
  dsmem_merges(tc, 16, 64, SMLA_CACHE_BF16, 0.0f, 1, 0);
}
static void c_small_merges_n8_dr0(t_case *tc) {
  dsmem_merges(tc, 8, 0, SMLA_CACHE_BF16, 5.0f, 0, 0);
}
static void c_small_merges_n32(t_case *tc) {
  dsmem_merges(tc, 32, 64, SMLA_CACHE_BF16, 0.0f, 0, 0);
}

/* Forced split counts of 128 and more (up to 1024, what desc.num_splits allows): 128 (a
 * power of two: bit 7 of a byte), 200 (11 entries a split, so 187 splits) and 1024 (2
 * entries a split) at 16 heads on the generic kernel, 150 at 64 heads (the sm90 kernel on
 * sm_90 devices), each against the CPU. Until session 11 the plan kept a forced count in
 * the 8-bit code of its split table, whose bit 7 is the in-kernel-merge flag: 128 splits
 * launched no block at all (the output was never written) and 200 ran 72. */
static void c_many_splits(t_case *tc) {
  static const struct { int N, splits; } cfg[4] = {{16, 128}, {16, 200}, {16, 1024}, {64, 150}};
  for (int i = 0; i < 4; i++) wide(tc, 2, cfg[i].N, 2048, 64, 0.0f, 1, cfg[i].splits);
}

/* A sinked forward split by the caller into P parts (KV splits of its own, or context-
 * parallel shards), each part a forward with the same sink and lse out, then merged with
 * smla_merge_states given that sink: equals the sinked forward over the whole row. Each
 * row's K entries are dealt to the parts in uneven contiguous runs (a part may get none of
 * a row: lse -inf there), P = 2, 3, 5 and 8. The same merge without the sink counts the
 * sink once per part, and must be measurably off (else these inputs could not tell).
 * Tolerance: the forward's out bound plus one bf16 rounding of each partial (weights sum
 * to <= 1): 2e-3 more absolute, as the DCP cases (cases_dcp.c D_TOL_OUT); lse in float. */
static const t_tol PARTS_TOL_OUT = {4e-3, 1e-2};
static const t_tol PARTS_TOL_LSE = {2e-4, 1e-5};

static void parts_merge(t_case *tc, int P) {
  fwd_problem pb;
  fwd_defaults(&pb, 4, 16, 600, 64, SMLA_CACHE_BF16);
  pb.use_sink = 1;
  pb.want_ml = 0;
  pb.want_bad = 0;
  fwd_make_inputs(&pb);
  if (fwd_make_cache(tc, &pb) != 0) {
    fwd_free(&pb);
    return;
  }
  const int64_t T = pb.T, N = pb.N, TN = T * N, K = pb.K;
  /* cut[t][0..P]: part p of row t owns entries [cut[p], cut[p+1]); row 1 all in part 0 */
  int64_t *cut = t_xmalloc((size_t)(T * (P + 1)) * 8);
  for (int64_t t = 0; t < T; t++) {
    int64_t *c = cut + t * (P + 1);
    c[0] = 0;
    c[P] = K;
    for (int p = 1; p < P; p++) c[p] = t == 1 ? K : t_rng_int(c[p - 1], K);
  }
  fwd_ref whole;
  fwd_reference(&pb, &whole);
  uint16_t *out_p = t_xmalloc((size_t)(P * TN * SMLA_DC) * 2);
  float *lse_p = t_xmalloc((size_t)(P * TN) * 4);
  for (int b = 0; b < g_num_backends; b++) {
    smla_context *ctx = t_on(tc, b);
    if (!ctx) continue;
    int ok = 1;
    for (int p = 0; ok && p < P; p++) {
      fwd_problem part = pb;
      part.slots = t_xmalloc((size_t)pb.slots_elems * 4);
      memcpy(part.slots, pb.slots, (size_t)pb.slots_elems * 4);
      for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < K; k++)
          if (k < cut[t * (P + 1) + p] || k >= cut[t * (P + 1) + p + 1]) fwd_slot_row(&part, t)[k] = -1;
      fwd_result r;
      ok = fwd_exec(tc, &part, &r);
      if (ok) {
        t_gather(out_p + (size_t)p * TN * SMLA_DC, r.out, 2, T, N, SMLA_DC, pb.out_st, pb.out_sh);
        t_gather(lse_p + (size_t)p * TN, r.lse, 4, T, 1, N, pb.lse_st, 0);
        fwd_result_free(&r);
      }
      free(part.slots);
    }
    void *d_out_p = ok ? t_upload(tc, out_p, (size_t)(P * TN * SMLA_DC) * 2) : NULL;
    void *d_lse_p = ok ? t_upload(tc, lse_p, (size_t)(P * TN) * 4) : NULL;
    void *d_sink = ok ? t_upload(tc, pb.sink, (size_t)N * 4) : NULL;
    void *d_out = ok ? t_alloc(tc, (size_t)TN * SMLA_DC * 2) : NULL;
    float *d_lse = ok ? t_alloc(tc, (size_t)TN * 4) : NULL;
    uint16_t *out = t_xmalloc((size_t)TN * SMLA_DC * 2);
    float *lse = t_xmalloc((size_t)TN * 4);
    for (int with_sink = 1; ok && d_out_p && d_lse_p && d_sink && d_out && d_lse && with_sink >= 0;
         with_sink--) {
      smla_merge_params m;
      memset(&m, 0, sizeof m);
      m.num_partials = P;
      m.num_tokens = T;
      m.num_heads = (int)N;
      m.dv = SMLA_DC;
      m.out_p = d_out_p;
      m.out_p_dtype = SMLA_DTYPE_BF16;
      m.out_p_stride_p = TN * SMLA_DC;
      m.out_p_stride_t = N * SMLA_DC;
      m.out_p_stride_h = SMLA_DC;
      m.lse_p = d_lse_p;
      m.lse_p_stride_p = TN;
      m.lse_p_stride_t = N;
      m.out = d_out;
      m.out_dtype = SMLA_DTYPE_BF16;
      m.out_stride_t = N * SMLA_DC;
      m.out_stride_h = SMLA_DC;
      m.lse = d_lse;
      m.lse_stride_t = N;
      m.sink = with_sink ? d_sink : NULL;
      if (t_memset(tc, d_out, T_POISON, (size_t)TN * SMLA_DC * 2) ||
          !t_expect_ok(tc, smla_merge_states(ctx, &m, NULL), ctx, "smla_merge_states") ||
          t_sync(tc) || t_download(tc, out, d_out, (size_t)TN * SMLA_DC * 2) ||
          t_download(tc, lse, d_lse, (size_t)TN * 4))
        break;
      char what[96];
      if (with_sink) {
        snprintf(what, sizeof what, "%d sinked parts merged with the sink vs the whole", P);
        t_check_bf16(tc, what, out, whole.out, t_shape3(T, N, SMLA_DC), PARTS_TOL_OUT);
        snprintf(what, sizeof what, "lse of %d sinked parts merged vs the whole", P);
        t_check_f32(tc, what, lse, whole.lse, t_shape2(T, N), PARTS_TOL_LSE);
      } else { /* the sink counted once per part: off by far more than the tolerance */
        double worst = 0.0;
        for (int64_t i = 0; i < TN * SMLA_DC; i++) {
          const double e = fabs(smla_bf16_to_f32(out[i]) - whole.out[i]) /
                           (PARTS_TOL_OUT.atol + PARTS_TOL_OUT.rtol * fabs(whole.out[i]));
          if (e > worst) worst = e;
        }
        t_expect(tc, worst > 4.0, "%d sinked parts merged without the sink are only %.2fx the "
                 "tolerance off the whole: the inputs cannot tell a merge that drops the sink", P, worst);
      }
    }
    free(out);
    free(lse);
    t_free(tc, d_out_p);
    t_free(tc, d_lse_p);
    t_free(tc, d_sink);
    t_free(tc, d_out);
    t_free(tc, d_lse);
  }
  free(out_p);
  free(lse_p);
  free(cut);
  fwd_ref_free(&whole);
  fwd_free(&pb);
}
static void c_parts_2(t_case *tc) { parts_merge(tc, 2); }
static void c_parts_3(t_case *tc) { parts_merge(tc, 3); }
static void c_parts_5(t_case *tc) { parts_merge(tc, 5); }
static void c_parts_8(t_case *tc) { parts_merge(tc, 8); }

/* smla_forward_indices: request-local indices with every kind of invalid entry, converted
 * inside the forward; checked against the reference on their conversion and bitwise against
 * smla_forward on those slots (fwd_run), on every backend. */
static void indices_case(t_case *tc, int64_t T, int N, int K, int dr, smla_cache_format format,
                         int bs, int cp_size, int use_lengths, int num_splits) {
  fwd_problem pb;
  fwd_defaults(&pb, T, N, K, dr, format);
  pb.use_lengths = use_lengths;
  pb.use_sink = 1;
  pb.num_splits = num_splits;
  pb.repeat = 2;
  fwd_make_inputs(&pb);
  if (use_lengths)
    for (int64_t t = 0; t < T; t++) pb.lengths[t] = (int32_t)t_rng_int(0, K + 3);
  fwd_use_indices(&pb, bs, cp_size, cp_size >= 2 ? cp_size - 1 : 0, 4);
  if (fwd_make_cache(tc, &pb) == 0) fwd_run(tc, &pb);
  fwd_free(&pb);
}
static void c_indices_n16(t_case *tc) { indices_case(tc, 5, 16, 300, 64, SMLA_CACHE_BF16, 16, 0, 1, 0); }
static void c_indices_n128(t_case *tc) { indices_case(tc, 3, 128, 2051, 64, SMLA_CACHE_BF16, 64, 0, 0, 0); }
/* Block size 24: not a power of two, so the conversion divides instead of shifting. */
static void c_indices_n128_bs24(t_case *tc) { indices_case(tc, 4, 128, 700, 64, SMLA_CACHE_BF16, 24, 0, 1, 0); }
static void c_indices_n64_split3(t_case *tc) { indices_case(tc, 6, 64, 1000, 0, SMLA_CACHE_BF16, 1, 0, 1, 3); }
static void c_indices_fp8ds_cp(t_case *tc) { indices_case(tc, 4, 64, 700, 64, SMLA_CACHE_FP8_DS, 16, 2, 1, 0); }
static void c_indices_fp8t_n8(t_case *tc) { indices_case(tc, 7, 8, 129, 64, SMLA_CACHE_FP8_TENSOR, 32, 3, 0, 2); }

void t_register_forward_more_cases(void) {
  t_register("forward_indices_n16", c_indices_n16);
  t_register("forward_indices_n128", c_indices_n128);
  t_register("forward_indices_n128_bs24", c_indices_n128_bs24);
  t_register("forward_indices_n64_dr0_splits3", c_indices_n64_split3);
  t_register("forward_indices_fp8ds_cp2", c_indices_fp8ds_cp);
  t_register("forward_indices_fp8tensor_n8_cp3", c_indices_fp8t_n8);
  t_register("forward_sink_parts_merged_2", c_parts_2);
  t_register("forward_sink_parts_merged_3", c_parts_3);
  t_register("forward_sink_parts_merged_5", c_parts_5);
  t_register("forward_sink_parts_merged_8", c_parts_8);
  t_register("forward_num_splits_1_3_7", c_num_splits);
  t_register("forward_wide_n128_k2051", c_wide_n128);
  t_register("forward_wide_n128_unsplit", c_wide_n128_unsplit);
  t_register("forward_wide_persistent", c_wide_persistent);
  t_register("forward_wide_n8_dr0_unsplit", c_wide_n8_dr0_unsplit);
  t_register("forward_wide_n64_dr0_unsplit", c_wide_n64_dr0_unsplit);
  t_register("forward_wide_n64_dr0_sink", c_wide_n64_dr0);
  t_register("forward_wide_n100_softcap_sink", c_wide_n100_softcap);
  t_register("forward_wide_n128_splits5", c_wide_n128_splits);
  t_register("forward_wide_n48_k1", c_wide_n48_k1);
  t_register("forward_wide_n64_two_tiles", c_wide_n64_two_tiles);
  t_register("forward_wide_n64_steep", c_wide_n64_steep);
  t_register("forward_wide_n128_steep_splits", c_wide_n128_steep_splits);
  t_register("forward_wide_n16_steep", c_wide_n16_steep);
  t_register("forward_wide_n128_merges", c_wide_n128_merges);
  t_register("forward_generic_merges_n16", c_generic_merges_n16);
  t_register("forward_many_splits", c_many_splits);
  t_register("forward_generic_merges_n32_dr0", c_generic_merges_n32_dr0);
  t_register("forward_generic_merges_n64_fp8", c_generic_merges_n64_fp8);
  t_register("forward_small_merges_n16", c_small_merges_n16);
  t_register("forward_small_merges_n8_dr0", c_small_merges_n8_dr0);
  t_register("forward_small_merges_n32", c_small_merges_n32);
  t_register("forward_caller_workspace", c_caller_workspace);
  t_register("forward_T_below_max_tokens", c_t_below_max);
  t_register("forward_small_t_plan", c_small_t_plan);
  t_register("forward_heads_per_block", c_heads_per_block);
  t_register("forward_batch_invariant", c_batch_invariant);
  t_register("forward_batch_invariant_many_splits", c_batch_invariant_many_splits);
  t_register("forward_determinism", c_determinism);
  t_register("forward_concurrency_4_threads", c_concurrency);
}
