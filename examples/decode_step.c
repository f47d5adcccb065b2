/*
 * decode_step.c: one decode step of sparse MLA attention with smla, on the CPU.
 *
 * Two requests share a paged KV cache (blocks of 64 slots). Each request decodes one new
 * token this step:
 *   1. smla_build_metadata: per query row, its request and causal context length;
 *   2. smla_cache_write:    the new tokens' latent + rope rows go into their cache slots;
 *   3. an indexer picks up to K request-local positions per row (here: the newest ones);
 *   4. smla_convert_indices: request-local positions -> cache slots via the block table;
 *   5. smla_forward:        attention over the gathered rows, with lse.
 * Then it checks one head against a small reference written inline.
 *
 * On a GPU the same calls run as they are, with three changes: create the context with
 * smla_context_create(&ctx, 0) (CUDA device 0); put every array that the calls read or
 * write in device memory (cudaMalloc + cudaMemcpy; smla_build_metadata alone stays on the
 * host, so copy its outputs over); and pass your cudaStream_t as `stream`. Nothing below
 * the plan synchronizes or allocates, so steps 2, 4 and 5 can be captured in a CUDA graph.
 *
 * Build: make build/decode_step (it links build/libsmla.a); run: build/decode_step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smla.h"

#define BLOCK_SIZE 64    /* slots per cache block, as vLLM and SGLang use */
#define NUM_BLOCKS 8     /* the whole (tiny) cache: 512 slots */
#define BLOCKS_PER_REQ 4 /* block-table width: up to 256 tokens per request */
#define NUM_REQS 2
#define NUM_HEADS 16     /* DeepSeek-V3.2 at TP8 */
#define DR 64            /* rope dims */
#define DQK (SMLA_DC + DR)
#define TOPK 32          /* K; DeepSeek-V3.2 uses 2048 */

/* bf16 <-> float (round to nearest-even; the values here are finite). */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Deterministic test values in [-1, 1): what the model would have produced. */
static float value(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t x = a * 0x9E3779B1u ^ b * 0x85EBCA77u ^ c * 0xC2B2AE3Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return (float)(x & 0xffffu) / 32768.0f - 1.0f;
}

/* The token rows of request r at position p: latent [Dc] and rope [Dr], as bf16. */
static void token_rows(int r, int p, uint16_t *kv_c, uint16_t *k_pe) {
  for (int i = 0; i < SMLA_DC; i++) kv_c[i] = to_bf16(value(1 + r, p, i));
  for (int i = 0; i < DR; i++) k_pe[i] = to_bf16(value(1 + r, p, SMLA_DC + i));
}

/* 16-byte aligned (smla's rule for bf16 tensors and cache data); sizes rounded up. */
static void *alloc16(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

#define CHECK(call)                                                                   \
  do {                                                                                \
    const smla_status s_ = (call);                                                    \
    if (s_ != SMLA_OK) {                                                              \
      fprintf(stderr, "%s failed: %s: %s\n", #call, smla_status_string(s_),           \
              smla_context_message(ctx));                                             \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

int main(void) {
  int exit_code = 1;
  smla_context *ctx = NULL;
  smla_plan *plan = NULL;

  /* The engine's view: request 0 has 150 cached tokens, request 1 has 20; each decodes
   * one token now, so T = 2 query rows and the new tokens sit at positions 150 and 20. */
  const int history[NUM_REQS] = {150, 20};
  const int32_t block_table[NUM_REQS][BLOCKS_PER_REQ] = {{5, 2, 7, -1}, {0, 3, -1, -1}};
  const int32_t query_start_loc[NUM_REQS + 1] = {0, 1, 2};
  const int32_t seq_lens[NUM_REQS] = {history[0] + 1, history[1] + 1};
  enum { T = NUM_REQS };

  smla_cache cache = {0};
  cache.format = SMLA_CACHE_BF16;
  cache.dr = DR;
  cache.num_slots = NUM_BLOCKS * BLOCK_SIZE;
  cache.row_bytes = (int64_t)smla_cache_row_size(SMLA_CACHE_BF16, DR); /* 1152 */
  cache.data = alloc16((size_t)cache.num_slots * cache.row_bytes);

  const int max_rows = history[0] + history[1] + T;
  uint16_t *kv_c = alloc16((size_t)max_rows * SMLA_DC * 2); /* [rows][Dc] */
  uint16_t *k_pe = alloc16((size_t)max_rows * DR * 2);      /* [rows][Dr] */
  int64_t *slot = malloc((size_t)max_rows * sizeof *slot);  /* [rows] */
  uint16_t *q = alloc16((size_t)T * NUM_HEADS * DQK * 2);   /* [T][N][576]: nope, then pe */
  uint16_t *out = alloc16((size_t)T * NUM_HEADS * SMLA_DC * 2);
  float lse[T][NUM_HEADS];
  int32_t req_id[T], ctx_len[T], limit[T], valid[T];
  int32_t local[T][TOPK], slots[T][TOPK];
  if (!cache.data || !kv_c || !k_pe || !slot || !q || !out) {
    fprintf(stderr, "out of memory\n");
    goto done;
  }
  memset(cache.data, 0, (size_t)cache.num_slots * cache.row_bytes);

  CHECK(smla_context_create(&ctx, SMLA_DEVICE_CPU));

  /* The plan: made once for the largest batch, reused by every step. */
  smla_plan_desc desc = {0};
  desc.max_tokens = T;
  desc.num_heads = NUM_HEADS;
  desc.topk = TOPK;
  desc.dr = DR;
  desc.format = SMLA_CACHE_BF16;
  CHECK(smla_plan_create(ctx, &desc, NULL, 0, &plan));
  printf("plan: %s\n", smla_plan_describe(plan));

  /* What earlier steps left in the cache: every history token in its slot. The slot of
   * position p of request r is block_table[r][p / 64] * 64 + p % 64. */
  int rows = 0;
  for (int r = 0; r < NUM_REQS; r++)
    for (int p = 0; p < history[r]; p++, rows++) {
      token_rows(r, p, kv_c + (size_t)rows * SMLA_DC, k_pe + (size_t)rows * DR);
      slot[rows] = (int64_t)block_table[r][p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE;
    }
  smla_cache_write_params hist = {0};
  hist.num_tokens = rows;
  hist.kv_c = kv_c;
  hist.kv_c_stride = SMLA_DC;
  hist.k_pe = k_pe;
  hist.k_pe_stride = DR;
  hist.slot = slot;
  hist.cache = cache;
  CHECK(smla_cache_write(ctx, &hist, NULL));

  /* 1. Metadata: row t belongs to request req_id[t]; its causal context is ctx_len[t]
   * tokens (the new one included) and the indexer may pick limit[t] = min(ctx, K). */
  smla_metadata_params meta = {0};
  meta.num_tokens = T;
  meta.num_requests = NUM_REQS;
  meta.topk = TOPK;
  meta.query_start_loc = query_start_loc;
  meta.seq_lens = seq_lens;
  meta.req_id = req_id;
  meta.ctx_len = ctx_len;
  meta.limit = limit;
  CHECK(smla_build_metadata(ctx, &meta));

  /* 2. This step's new tokens go into the cache first, so that attention can see them. */
  for (int t = 0; t < T; t++) {
    const int r = req_id[t], p = ctx_len[t] - 1;
    token_rows(r, p, kv_c + (size_t)t * SMLA_DC, k_pe + (size_t)t * DR);
    slot[t] = (int64_t)block_table[r][p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE;
  }
  smla_cache_write_params step = hist;
  step.num_tokens = T;
  CHECK(smla_cache_write(ctx, &step, NULL));

  /* 3. A stand-in indexer: the newest limit[t] positions (a real one scores them all
   * and keeps the top K). Unused entries are -1. */
  for (int t = 0; t < T; t++)
    for (int k = 0; k < TOPK; k++) local[t][k] = k < limit[t] ? ctx_len[t] - 1 - k : -1;

  /* 4. Request-local positions -> cache slots (-1 stays -1: invalid entries are masked). */
  smla_convert_params conv = {0};
  conv.num_tokens = T;
  conv.topk = TOPK;
  conv.req_id = req_id;
  conv.block_table = &block_table[0][0];
  conv.num_requests = NUM_REQS;
  conv.blocks_per_request = BLOCKS_PER_REQ;
  conv.block_table_stride = BLOCKS_PER_REQ;
  conv.block_size = BLOCK_SIZE;
  conv.local = &local[0][0];
  conv.local_stride = TOPK;
  conv.slots = &slots[0][0];
  conv.slots_stride = TOPK;
  conv.valid = valid;
  CHECK(smla_convert_indices(ctx, &conv, NULL));

  /* 5. Attention. q is one [T][N][576] buffer: q_nope is its first 512 columns, q_pe the
   * last 64, so both share the strides. */
  for (int i = 0; i < T * NUM_HEADS * DQK; i++) q[i] = to_bf16(value(99, (uint32_t)i, 7));
  smla_forward_params fwd = {0};
  fwd.num_tokens = T;
  fwd.num_heads = NUM_HEADS;
  fwd.topk = TOPK;
  fwd.q_nope = q;
  fwd.q_nope_stride_t = NUM_HEADS * DQK;
  fwd.q_nope_stride_h = DQK;
  fwd.q_pe = q + SMLA_DC;
  fwd.q_pe_stride_t = NUM_HEADS * DQK;
  fwd.q_pe_stride_h = DQK;
  fwd.cache = cache;
  fwd.slots = &slots[0][0];
  fwd.slots_stride = TOPK;
  fwd.lengths = limit; /* only the first limit[t] entries of row t count */
  fwd.sm_scale = 1.0f / sqrtf((float)DQK);
  fwd.out = out;
  fwd.out_stride_t = NUM_HEADS * SMLA_DC;
  fwd.out_stride_h = SMLA_DC;
  fwd.lse = &lse[0][0];
  fwd.lse_stride_t = NUM_HEADS;
  CHECK(smla_forward(plan, &fwd, NULL));

  for (int t = 0; t < T; t++) {
    printf("row %d: request %d, context %d, %d valid slots (first: %d %d %d), head 0: "
           "out[0..3] = %.4f %.4f %.4f %.4f, lse = %.4f\n",
           t, req_id[t], ctx_len[t], valid[t], slots[t][0], slots[t][1], slots[t][2],
           from_bf16(out[(size_t)t * NUM_HEADS * SMLA_DC + 0]),
           from_bf16(out[(size_t)t * NUM_HEADS * SMLA_DC + 1]),
           from_bf16(out[(size_t)t * NUM_HEADS * SMLA_DC + 2]),
           from_bf16(out[(size_t)t * NUM_HEADS * SMLA_DC + 3]), lse[t][0]);
  }

  /* The check: head 3 of each row, recomputed in double from the token values
   * themselves (not from the cache). Row 0 reads across two blocks; row 1 has masked
   * entries past its limit. */
  exit_code = 0;
  for (int t = 0; t < T; t++) {
    const int h = 3, r = req_id[t];
    const uint16_t *qh = q + ((size_t)t * NUM_HEADS + h) * DQK;
    uint16_t kv[SMLA_DC], pe[DR];
    double logit[TOPK], m = -INFINITY, z = 0, acc[SMLA_DC] = {0}, worst = 0;
    for (int k = 0; k < limit[t]; k++) {
      token_rows(r, local[t][k], kv, pe);
      double dot = 0;
      for (int i = 0; i < SMLA_DC; i++) dot += (double)from_bf16(qh[i]) * from_bf16(kv[i]);
      for (int i = 0; i < DR; i++) dot += (double)from_bf16(qh[SMLA_DC + i]) * from_bf16(pe[i]);
      logit[k] = fwd.sm_scale * dot;
      m = fmax(m, logit[k]);
    }
    for (int k = 0; k < limit[t]; k++) {
      const double w = exp(logit[k] - m);
      z += w;
      token_rows(r, local[t][k], kv, pe);
      for (int i = 0; i < SMLA_DC; i++) acc[i] += w * from_bf16(kv[i]);
    }
    for (int i = 0; i < SMLA_DC; i++) {
      const double ref = acc[i] / z;
      const double got = from_bf16(out[((size_t)t * NUM_HEADS + h) * SMLA_DC + i]);
      const double ratio = fabs(got - ref) / (2e-3 + 1e-2 * fabs(ref)); /* bf16 output */
      if (!(ratio <= worst)) worst = ratio; /* a NaN makes it fail */
    }
    const double lse_err = fabs(lse[t][h] - (m + log(z)));
    const int ok = worst <= 1.0 && lse_err <= 1e-3;
    printf("check row %d head %d against the inline reference: worst err/tol %.3f, "
           "lse err %.2g: %s\n",
           t, h, worst, lse_err, ok ? "ok" : "MISMATCH");
    if (!ok) exit_code = 1;
  }

done:
  smla_plan_destroy(plan);
  smla_context_destroy(ctx);
  free(cache.data);
  free(kv_c);
  free(k_pe);
  free(slot);
  free(q);
  free(out);
  return exit_code;
}
