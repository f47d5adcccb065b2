/*
 * fuzz_api.c: libFuzzer target over every host entry point that parses arguments.
 *
 * The first byte picks the entry point; the rest fills its params: shapes, strides,
 * flags, alignment offsets, NULL-or-not pointers, and the device data (hostile slots,
 * indices, lengths, lse values, metadata arrays). Buffers are allocated from what the
 * params claim, so whatever validation lets through must run without an out-of-bounds
 * access (ASan) or undefined behaviour (UBSan) on the CPU backend, and every status must
 * be a pinned value with a message when it is not SMLA_OK.
 *
 *   make fuzz && build/fuzz_api -max_total_time=60 fuzz/corpus
 */
#include "smla.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const uint8_t *p;
  size_t n;
} bytes;

static uint32_t take(bytes *b, int nbytes) {
  uint32_t v = 0;
  for (int i = 0; i < nbytes; i++) {
    v = (v << 8) | (b->n ? *b->p : 0u);
    if (b->n) b->p++, b->n--;
  }
  return v;
}

/* A small int in [lo, hi], with a few out-of-range values now and then. */
static int64_t pick(bytes *b, int64_t lo, int64_t hi) {
  const uint32_t v = take(b, 2);
  switch (v & 15) {
  case 0: return lo - 1;
  case 1: return hi + 1;
  case 2: return -(int64_t)0x80000000LL;
  default: return lo + (int64_t)((v >> 4) % (uint64_t)(hi - lo + 1));
  }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Extent in elements of a [count0][count1][inner] tensor with the given strides. */
static size_t extent(int64_t c0, int64_t s0, int64_t c1, int64_t s1, int64_t inner) {
  if (c0 <= 0 || c1 <= 0 || inner <= 0) return 64;
  return (size_t)((c0 - 1) * max64(s0, 0) + (c1 - 1) * max64(s1, 0) + inner + 64);
}

/* Fills a buffer with fuzz bytes (hostile data) after an offset that may misalign it. */
/* Every set of params validation can accept here needs well under 4 MiB; a larger claim
 * comes from a negative or absurd field that validation must reject, so it gets 64 bytes. */
#define BUFFER_CAP (4u << 20)

static void *buffer(bytes *b, size_t bytes_needed, int misalign, void **to_free) {
  if (bytes_needed > BUFFER_CAP) bytes_needed = 64;
  uint8_t *raw = aligned_alloc(64, (bytes_needed + 64 + 63) & ~(size_t)63);
  *to_free = raw;
  if (!raw) return NULL;
  uint8_t *p = raw + (misalign ? 2 : 0);
  for (size_t i = 0; i < bytes_needed; i++) p[i] = (uint8_t)take(b, 1);
  return p;
}

static void check_status(smla_context *ctx, smla_status s) {
  if ((unsigned)s > SMLA_ERR_INTERNAL) abort();
  if (s != SMLA_OK && smla_context_message(ctx)[0] == '\0') abort();
  if (s == SMLA_ERR_INTERNAL) abort();
}

#define FREE_ALL(arr)                                                                  \
  for (size_t i_ = 0; i_ < sizeof arr / sizeof arr[0]; i_++) free(arr[i_])

static void fuzz_forward(smla_context *ctx, bytes *b) {
  const uint32_t mode = take(b, 1);
  smla_plan_desc d = {0};
  d.max_tokens = pick(b, 1, 4);
  d.num_heads = (int)pick(b, 1, 5);
  d.topk = (int)pick(b, 1, 9);
  d.dr = (mode & 1) ? 64 : ((mode & 2) ? 0 : (int)pick(b, 0, 64));
  d.format = (smla_cache_format)pick(b, 0, 2);
  d.flags = take(b, 1) & 3;
  d.num_splits = (int)pick(b, 0, 4);
  smla_plan *plan = NULL;
  smla_status s = smla_plan_create(ctx, &d, NULL, 0, &plan);
  check_status(ctx, s);
  if (s != SMLA_OK) return;

  smla_forward_params p = {0};
  p.num_tokens = pick(b, 0, 4);
  p.num_heads = (mode & 4) ? (int)pick(b, 1, 5) : d.num_heads;
  p.topk = (mode & 8) ? (int)pick(b, 1, 9) : d.topk;
  const int64_t T = p.num_tokens > 0 ? p.num_tokens : 1, N = p.num_heads > 0 ? p.num_heads : 1;
  const int64_t K = p.topk > 0 ? p.topk : 1;
  p.cache.format = (mode & 16) ? (smla_cache_format)pick(b, 0, 2) : d.format;
  p.cache.dr = (mode & 32) ? (int)pick(b, 0, 64) : d.dr;
  p.cache.num_slots = pick(b, 1, 8);
  const size_t row = smla_cache_row_size(p.cache.format, p.cache.dr);
  p.cache.row_bytes = (int64_t)row + 16 * (int64_t)(take(b, 1) % 3) - ((mode & 64) ? 8 : 0);
  p.cache.scale = (take(b, 1) & 1) ? 0.5f : -1.0f;
  p.q_nope_stride_h = 512 + 8 * (int64_t)(take(b, 1) % 9) - 8 * (take(b, 1) % 2);
  p.q_nope_stride_t = N * p.q_nope_stride_h + 8 * (int64_t)(take(b, 1) % 3);
  p.q_pe_stride_h = p.q_nope_stride_h;
  p.q_pe_stride_t = p.q_nope_stride_t;
  p.slots_stride = K + (int64_t)(take(b, 1) % 3) - 1;
  p.out_stride_h = 512 + 8 * (int64_t)(take(b, 1) % 2);
  p.out_stride_t = N * p.out_stride_h;
  p.lse_stride_t = N;
  p.max_logit_stride_t = N;
  p.sm_scale = 0.04f;
  p.softcap = (take(b, 1) & 1) ? 0.0f : 30.0f;

  void *bufs[10] = {0};
  const int mis = (mode & 128) && (take(b, 1) & 1);
  const size_t qn = extent(T, p.q_nope_stride_t, N, p.q_nope_stride_h, 576);
  uint16_t *q = buffer(b, qn * 2, mis, &bufs[0]);
  p.q_nope = q;
  p.q_pe = q ? q + 512 : NULL;
  const int64_t ncache = p.cache.num_slots * max64(p.cache.row_bytes, (int64_t)row) + 64;
  p.cache.data = buffer(b, (size_t)ncache, 0, &bufs[1]);
  p.slots = buffer(b, extent(1, 0, T, p.slots_stride, K) * 4, 0, &bufs[2]);
  if (take(b, 1) & 1) p.lengths = buffer(b, (size_t)T * 4, 0, &bufs[3]);
  if (take(b, 1) & 1) p.sink = buffer(b, (size_t)N * 4, 0, &bufs[4]);
  p.out = buffer(b, extent(T, p.out_stride_t, N, p.out_stride_h, 512) * 2, 0, &bufs[5]);
  if (take(b, 1) & 1) p.lse = buffer(b, (size_t)(T * N + 8) * 4, 0, &bufs[6]);
  if (take(b, 1) & 1) p.max_logit = buffer(b, (size_t)(T * N + 8) * 4, 0, &bufs[7]);
  uint64_t bad = 0;
  if (take(b, 1) & 1) p.bad_inputs = &bad;
  if ((take(b, 1) & 7) == 0) p.slots = NULL;
  if ((take(b, 1) & 3) == 0) { /* smla_forward_indices: positions through a block table */
    smla_convert_params ix = {0};
    ix.num_tokens = (take(b, 1) & 7) ? p.num_tokens : pick(b, 0, 4);
    ix.topk = (take(b, 1) & 7) ? p.topk : (int)pick(b, 1, 9);
    ix.num_requests = (int)pick(b, 1, 3);
    ix.blocks_per_request = (int)pick(b, 1, 4);
    ix.block_table_stride = ix.blocks_per_request + (int64_t)(take(b, 1) % 3) - 1;
    ix.block_size = (int)pick(b, 1, 64);
    ix.local_stride = K + (int64_t)(take(b, 1) % 3) - 1;
    ix.compact = (take(b, 1) & 7) == 0;
    if (take(b, 1) & 1) {
      ix.cp_size = (int)pick(b, 0, 4);
      ix.cp_rank = (int)pick(b, 0, 3);
      ix.cp_interleave = (int)pick(b, 0, 16);
    }
    const int64_t R = ix.num_requests > 0 ? ix.num_requests : 1;
    void *ib[3] = {0};
    ix.req_id = buffer(b, (size_t)T * 4, 0, &ib[0]);
    ix.block_table = buffer(b, extent(1, 0, R, ix.block_table_stride,
                                      max64(ix.blocks_per_request, 1)) * 4, 0, &ib[1]);
    ix.local = buffer(b, extent(1, 0, T, ix.local_stride, K) * 4, 0, &ib[2]);
    if (take(b, 1) & 3) p.slots = NULL;
    check_status(ctx, smla_forward_indices(plan, &p, (take(b, 1) & 15) ? &ix : NULL, NULL));
    FREE_ALL(ib);
  } else {
    check_status(ctx, smla_forward(plan, &p, NULL));
  }
  FREE_ALL(bufs);
  smla_plan_destroy(plan);
}

static void fuzz_convert(smla_context *ctx, bytes *b) {
  smla_convert_params p = {0};
  p.num_tokens = pick(b, 0, 4);
  p.topk = (int)pick(b, 1, 9);
  p.num_requests = (int)pick(b, 1, 3);
  p.blocks_per_request = (int)pick(b, 1, 4);
  p.block_table_stride = p.blocks_per_request + (int64_t)(take(b, 1) % 3) - 1;
  p.block_size = (int)pick(b, 1, 64);
  p.local_stride = p.topk + (int64_t)(take(b, 1) % 3) - 1;
  p.slots_stride = p.topk + (int64_t)(take(b, 1) % 3) - 1;
  p.compact = (int)(take(b, 1) % 3);
  if (take(b, 1) & 1) { /* the context-parallel filter, also with bad values */
    p.cp_size = (int)pick(b, 0, 4);
    p.cp_rank = (int)pick(b, 0, 3);
    p.cp_interleave = (int)pick(b, 0, 16);
  }
  const int64_t T = p.num_tokens > 0 ? p.num_tokens : 1, K = p.topk > 0 ? p.topk : 1;
  const int64_t R = p.num_requests > 0 ? p.num_requests : 1;
  void *bufs[5] = {0};
  p.req_id = buffer(b, (size_t)T * 4, 0, &bufs[0]);
  p.block_table = buffer(b, extent(1, 0, R, p.block_table_stride, max64(p.blocks_per_request, 1)) * 4, 0, &bufs[1]);
  p.local = buffer(b, extent(1, 0, T, p.local_stride, K) * 4, 0, &bufs[2]);
  p.slots = buffer(b, extent(1, 0, T, p.slots_stride, K) * 4, 0, &bufs[3]);
  if (take(b, 1) & 1) p.valid = buffer(b, (size_t)T * 4, 0, &bufs[4]);
  if ((take(b, 1) & 7) == 0) p.slots = (int32_t *)p.local;
  check_status(ctx, smla_convert_indices(ctx, &p, NULL));
  FREE_ALL(bufs);
}

static void fuzz_cache_write(smla_context *ctx, bytes *b) {
  smla_cache_write_params p = {0};
  p.num_tokens = pick(b, 0, 4);
  p.cache.format = (smla_cache_format)pick(b, 0, 2);
  p.cache.dr = (take(b, 1) & 1) ? 64 : 0;
  p.cache.num_slots = pick(b, 1, 8);
  const size_t row = smla_cache_row_size(p.cache.format, p.cache.dr);
  p.cache.row_bytes = (int64_t)row + 16 * (int64_t)(take(b, 1) % 2);
  p.cache.scale = (take(b, 1) & 1) ? 0.25f : 0.0f;
  p.kv_c_stride = 512 + 8 * (int64_t)(take(b, 1) % 3) - 8;
  p.k_pe_stride = 64 + 8 * (int64_t)(take(b, 1) % 3) - 8;
  const int64_t T = p.num_tokens > 0 ? p.num_tokens : 1;
  void *bufs[4] = {0};
  p.kv_c = buffer(b, extent(1, 0, T, p.kv_c_stride, 512) * 2, 0, &bufs[0]);
  p.k_pe = buffer(b, extent(1, 0, T, p.k_pe_stride, 64) * 2, 0, &bufs[1]);
  p.slot = buffer(b, (size_t)T * 8, 0, &bufs[2]);
  p.cache.data = buffer(b, (size_t)(p.cache.num_slots * max64(p.cache.row_bytes, (int64_t)row)), 0, &bufs[3]);
  uint64_t bad = 0;
  p.bad_inputs = (take(b, 1) & 1) ? &bad : NULL;
  check_status(ctx, smla_cache_write(ctx, &p, NULL));
  FREE_ALL(bufs);
}

static void fuzz_merge(smla_context *ctx, bytes *b) {
  smla_merge_params p = {0};
  p.num_partials = (int)pick(b, 1, 4);
  p.num_tokens = pick(b, 0, 3);
  p.num_heads = (int)pick(b, 1, 3);
  p.dv = (int)pick(b, 1, 16);
  p.out_p_dtype = (smla_dtype)pick(b, 0, 1);
  p.out_dtype = (smla_dtype)pick(b, 0, 1);
  const int64_t P = p.num_partials > 0 ? p.num_partials : 1, T = p.num_tokens > 0 ? p.num_tokens : 1;
  const int64_t N = p.num_heads > 0 ? p.num_heads : 1, dv = p.dv > 0 ? p.dv : 1;
  p.out_p_stride_h = dv + (int64_t)(take(b, 1) % 3) - 1;
  p.out_p_stride_t = N * p.out_p_stride_h;
  p.out_p_stride_p = T * p.out_p_stride_t;
  p.lse_p_stride_t = N;
  p.lse_p_stride_p = T * N + (int64_t)(take(b, 1) % 2);
  p.out_stride_h = dv;
  p.out_stride_t = N * dv + (int64_t)(take(b, 1) % 3) - 1;
  p.lse_stride_t = N;
  void *bufs[4] = {0};
  p.out_p = buffer(b, (size_t)(P * max64(p.out_p_stride_p, 1) + 64) * 4, 0, &bufs[0]);
  p.lse_p = buffer(b, (size_t)(P * max64(p.lse_p_stride_p, 1) + 64) * 4, 0, &bufs[1]);
  p.out = buffer(b, extent(1, 0, T, max64(p.out_stride_t, N * dv), N * dv) * 4, 0, &bufs[2]);
  if (take(b, 1) & 1) p.lse = buffer(b, (size_t)(T * N + 8) * 4, 0, &bufs[3]);
  check_status(ctx, smla_merge_states(ctx, &p, NULL));
  FREE_ALL(bufs);
}

static void fuzz_metadata(smla_context *ctx, bytes *b) {
  smla_metadata_params p = {0};
  p.num_tokens = pick(b, 0, 40);
  p.num_requests = (int)pick(b, 0, 8);
  p.topk = (int)pick(b, 1, 2048);
  const int64_t T = p.num_tokens > 0 ? p.num_tokens : 1, R = p.num_requests > 0 ? p.num_requests : 0;
  int32_t qsl[10], seq[9], req[42], cl[42], lim[42];
  int32_t acc = 0;
  for (int r = 0; r <= R && r < 10; r++) {
    const uint32_t v = take(b, 1);
    if (r > 0) acc += (v & 0x80) ? -(int32_t)(v & 3) : (int32_t)(v % 9);
    qsl[r] = (r == 0 && (v & 0x40)) ? 1 : acc;
  }
  for (int r = 0; r < R && r < 9; r++) seq[r] = (int32_t)take(b, 2) - 100;
  p.query_start_loc = qsl;
  p.seq_lens = (take(b, 1) & 7) ? seq : NULL;
  p.req_id = T <= 42 ? req : NULL;
  p.ctx_len = (take(b, 1) & 1) ? cl : NULL;
  p.limit = (take(b, 1) & 1) ? lim : NULL;
  check_status(ctx, smla_build_metadata(ctx, &p));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bytes b = {data, size};
  smla_context *ctx = NULL;
  if (smla_context_create(&ctx, SMLA_DEVICE_CPU) != SMLA_OK) abort();
  smla_context_set_num_threads(ctx, 1 + (int)(take(&b, 1) & 1));
  switch (take(&b, 1) % 5) {
  case 0: fuzz_forward(ctx, &b); break;
  case 1: fuzz_convert(ctx, &b); break;
  case 2: fuzz_cache_write(ctx, &b); break;
  case 3: fuzz_merge(ctx, &b); break;
  default: fuzz_metadata(ctx, &b); break;
  }
  smla_context_destroy(ctx);
  return 0;
}
