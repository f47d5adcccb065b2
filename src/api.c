/*
 * api.c: the public entry points. Each one checks every argument on the host (shapes,
 * strides, alignment, pointers, formats) and names the bad one in the context message,
 * then hands the validated params to the context's backend.
 */
#include "internal.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

unsigned smla_version(void) { return SMLA_VERSION_NUMBER; }
const char *smla_version_string(void) { return SMLA_VERSION_STRING; }

const char *smla_build_features(void) {
#ifdef SMLA_HAVE_CUDA
  return "cpu threads cuda sm_80 sm_90";
#else
  return "cpu threads";
#endif
}

const char *smla_status_string(smla_status s) {
  switch (s) {
  case SMLA_OK: return "ok";
  case SMLA_ERR_INVALID_ARGUMENT: return "invalid argument";
  case SMLA_ERR_MISALIGNED: return "misaligned pointer, stride or row size";
  case SMLA_ERR_UNSUPPORTED: return "unsupported by this backend";
  case SMLA_ERR_NO_CUDA: return "library built without CUDA";
  case SMLA_ERR_NO_DEVICE: return "no such CUDA device";
  case SMLA_ERR_CUDA: return "CUDA runtime error";
  case SMLA_ERR_OUT_OF_MEMORY: return "out of memory";
  case SMLA_ERR_WORKSPACE: return "workspace too small";
  case SMLA_ERR_CAPTURING: return "not allowed during CUDA graph capture";
  case SMLA_ERR_PLAN_MISMATCH: return "params do not match the plan";
  case SMLA_ERR_MALFORMED: return "malformed metadata";
  case SMLA_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

smla_status smla_set_error(smla_context *ctx, smla_status status, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->message, sizeof ctx->message, fmt, ap);
    va_end(ap);
  }
  return status;
}

size_t smla_cache_row_size(smla_cache_format format, int dr) {
  if (dr != 0 && dr != 64) return 0;
  switch (format) {
  case SMLA_CACHE_BF16: return (size_t)(SMLA_DC + dr) * 2;
  case SMLA_CACHE_FP8_TENSOR: return (size_t)(SMLA_DC + dr);
  case SMLA_CACHE_FP8_DS: return (size_t)SMLA_DC + SMLA_DS_GROUPS * 4 + (size_t)dr * 2;
  }
  return 0;
}

/* ---- contexts ---------------------------------------------------------------------- */

int smla_cuda_device_count(void) {
#ifdef SMLA_HAVE_CUDA
  return smla_cuda_count();
#else
  return 0;
#endif
}

smla_status smla_cuda_device_name(int device, char *buf, size_t buf_bytes) {
  if (!buf || buf_bytes == 0) return SMLA_ERR_INVALID_ARGUMENT;
  buf[0] = '\0';
#ifdef SMLA_HAVE_CUDA
  return smla_cuda_name(device, buf, buf_bytes);
#else
  (void)device;
  snprintf(buf, buf_bytes, "none (built without CUDA)");
  return SMLA_ERR_NO_CUDA;
#endif
}

static int online_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > 256 ? 256 : (int)n);
}

smla_status smla_context_create(smla_context **out, int device) {
  if (!out) return SMLA_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (device < SMLA_DEVICE_CPU) return SMLA_ERR_INVALID_ARGUMENT;
#ifndef SMLA_HAVE_CUDA
  if (device >= 0) return SMLA_ERR_NO_CUDA;
#endif
  smla_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return SMLA_ERR_OUT_OF_MEMORY;
  ctx->device = device;
  ctx->num_threads = online_cores();
  ctx->backend = &smla_cpu_backend;
#ifdef SMLA_HAVE_CUDA
  if (device >= 0) ctx->backend = &smla_cuda_backend;
#endif
  if (ctx->backend->init) {
    smla_status s = ctx->backend->init(ctx);
    if (s != SMLA_OK) {
      free(ctx);
      return s;
    }
  }
  *out = ctx;
  return SMLA_OK;
}

void smla_context_destroy(smla_context *ctx) {
  if (!ctx) return;
  if (ctx->backend->fini) ctx->backend->fini(ctx);
  free(ctx);
}

int smla_context_device(const smla_context *ctx) { return ctx ? ctx->device : SMLA_DEVICE_CPU; }

const char *smla_context_message(const smla_context *ctx) {
  return ctx ? ctx->message : "no context (NULL)";
}

smla_status smla_context_set_num_threads(smla_context *ctx, int num_threads) {
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  if (num_threads < 0 || num_threads > 256)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT,
                          "smla_context_set_num_threads: num_threads = %d, must be 0..256",
                          num_threads);
  ctx->num_threads = num_threads == 0 ? online_cores() : num_threads;
  return SMLA_OK;
}

/* ---- argument checks ---------------------------------------------------------------- */

/* Each check returns SMLA_OK or sets the message (prefixed with the function name). */
#define FAIL(status, ...) return smla_set_error(ctx, status, __VA_ARGS__)

static smla_status need_ptr(smla_context *ctx, const char *fn, const char *name, const void *ptr,
                            size_t align) {
  if (!ptr) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
  if ((uintptr_t)ptr % align)
    FAIL(SMLA_ERR_MISALIGNED, "%s: %s = %p is not %zu-byte aligned", fn, name, ptr, align);
  return SMLA_OK;
}

/* A row is at most 1 MiB: with S < 2^31 slots, slot * row_bytes stays below 2^51. */
#define ROW_BYTES_MAX (1LL << 20)

/* No tensor is 2^40 elements apart, nor spans 2^48: larger is garbage, and the index
 * arithmetic (int64, times an element size) must not overflow. */
#define STRIDE_MAX (1LL << 40)
#define SPAN_MAX (1LL << 48)

/* One outer dimension of a strided tensor: the name of its stride argument, its number of
 * elements and its stride. */
typedef struct {
  const char *name;
  int64_t count, stride;
} layout_dim;

#define LAYOUT_MAX_DIMS 3 /* merge's out_p: p, t, h */

/* A tensor of outer dimensions dims[0..nd) over a contiguous innermost run of `inner`
 * elements is valid when distinct indices address distinct elements, whatever the order of
 * the strides (a head-major q, stride_t < stride_h, is as good as a token-major one): taken
 * by increasing stride, each dimension must step over all that the smaller ones span.
 * Dimensions of one element are free. Strides must also be >= 0, <= 2^40 and multiples of
 * `multiple` elements, and the tensor must span at most 2^48 elements. The kernels index
 * every element as sum of index * stride, so this is all they need. */
static smla_status need_layout(smla_context *ctx, const char *fn, const layout_dim *dims,
                               int nd, int64_t inner, int64_t multiple) {
  const layout_dim *by_stride[LAYOUT_MAX_DIMS];
  int n = 0;
  for (int i = 0; i < nd; i++) {
    const layout_dim *d = &dims[i];
    if (d->count <= 1) continue;
    if (d->stride < 0)
      FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is negative; strides must be >= 0", fn,
           d->name, (long long)d->stride);
    if (d->stride > STRIDE_MAX)
      FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is beyond 2^40 elements", fn, d->name,
           (long long)d->stride);
    int j = n++;
    for (; j > 0 && by_stride[j - 1]->stride > d->stride; j--) by_stride[j] = by_stride[j - 1];
    by_stride[j] = d;
  }
  int64_t extent = inner; /* elements spanned by the dimensions taken so far */
  for (int k = 0; k < n; k++) {
    const layout_dim *d = by_stride[k];
    if (d->stride < extent) {
      if (k == 0)
        FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is smaller than the %lld elements it "
             "must step over (one row; rows would overlap)", fn, d->name,
             (long long)d->stride, (long long)extent);
      const layout_dim *e = by_stride[k - 1];
      FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is smaller than the %lld elements it "
           "must step over (%s: %lld rows %lld apart; rows would overlap)", fn, d->name,
           (long long)d->stride, (long long)extent, e->name, (long long)e->count,
           (long long)e->stride);
    }
    if (d->stride > (SPAN_MAX - extent) / (d->count - 1))
      FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s = %lld over %lld rows spans beyond 2^48 "
           "elements", fn, d->name, (long long)d->stride, (long long)d->count);
    extent += (d->count - 1) * d->stride;
  }
  for (int i = 0; i < nd; i++)
    if (dims[i].count > 1 && dims[i].stride % multiple)
      FAIL(SMLA_ERR_MISALIGNED, "%s: %s = %lld is not a multiple of %lld elements (16 bytes)",
           fn, dims[i].name, (long long)dims[i].stride, (long long)multiple);
  return SMLA_OK;
}

/* The common cases: rows of `inner` elements, one stride (a [count][inner] tensor), and
 * [count0][count1][inner] tensors with two. */
static smla_status need_rows(smla_context *ctx, const char *fn, const char *name,
                             int64_t stride, int64_t count, int64_t inner, int64_t multiple) {
  const layout_dim d = {name, count, stride};
  return need_layout(ctx, fn, &d, 1, inner, multiple);
}

static smla_status need_rows2(smla_context *ctx, const char *fn, const char *name0,
                              int64_t stride0, int64_t count0, const char *name1,
                              int64_t stride1, int64_t count1, int64_t inner,
                              int64_t multiple) {
  const layout_dim d[2] = {{name0, count0, stride0}, {name1, count1, stride1}};
  return need_layout(ctx, fn, d, 2, inner, multiple);
}

/* Elements spanned by `count` rows of `inner` elements, `stride` apart. */
static int64_t span(int64_t count, int64_t stride, int64_t inner) {
  return count <= 1 ? inner : (count - 1) * stride + inner;
}

#define CHECK(expr)                                                                          \
  do {                                                                                       \
    smla_status s_ = (expr);                                                                 \
    if (s_ != SMLA_OK) return s_;                                                            \
  } while (0)

/* bf16 tensors: 16-byte aligned, strides in multiples of 8 elements. */
#define BF16_ALIGN 16
#define BF16_MULT 8

static smla_status check_cache(smla_context *ctx, const char *fn, const smla_cache *c) {
  if (c->format != SMLA_CACHE_BF16 && c->format != SMLA_CACHE_FP8_TENSOR &&
      c->format != SMLA_CACHE_FP8_DS)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.format = %d is not an smla_cache_format", fn,
         (int)c->format);
  if (c->dr != 0 && c->dr != 64)
    FAIL(SMLA_ERR_UNSUPPORTED, "%s: cache.dr = %d, supported rope dims are 64 and 0", fn, c->dr);
  if (c->num_slots == 0)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.num_slots = 0: the cache is empty (S must be "
         "1..2^31-1)", fn);
  if (c->num_slots < 1 || c->num_slots > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.num_slots = %lld, must be 1..2^31-1", fn,
         (long long)c->num_slots);
  const int64_t need = (int64_t)smla_cache_row_size(c->format, c->dr);
  if (c->row_bytes < need)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.row_bytes = %lld is smaller than the %lld bytes "
         "of a row of this format", fn, (long long)c->row_bytes, (long long)need);
  if (c->row_bytes > ROW_BYTES_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.row_bytes = %lld is beyond 1 MiB", fn,
         (long long)c->row_bytes);
  if (c->row_bytes % 16)
    FAIL(SMLA_ERR_MISALIGNED, "%s: cache.row_bytes = %lld is not a multiple of 16", fn,
         (long long)c->row_bytes);
  CHECK(need_ptr(ctx, fn, "cache.data", c->data, 16));
  if (c->format == SMLA_CACHE_FP8_TENSOR && !(c->scale > 0.0f && c->scale <= FLT_MAX))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cache.scale = %g, FP8_TENSOR needs a finite scale > 0",
         fn, (double)c->scale);
  return SMLA_OK;
}

/* ---- 1. convert indices ---------------------------------------------------------------- */

/* fused (smla_forward_indices): the conversion feeds the forward directly, so there is no
 * slots or valid array and no compaction. */
static smla_status check_convert(smla_context *ctx, const char *fn, const smla_convert_params *p,
                                 int fused) {
  if (!p) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, fused ? "indices" : "params");
  if (fused && (p->slots || p->valid || p->compact))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: indices->slots and ->valid must be NULL and "
         "->compact 0 (the converted slots go straight into the forward; to compact, call "
         "smla_convert_indices and pass its valid counts as lengths)", fn);
  if (p->num_tokens < 0 || p->num_tokens > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_tokens = %lld, must be 0..2^31-1", fn,
         (long long)p->num_tokens);
  if (p->topk < 1) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: topk = %d, must be >= 1", fn, p->topk);
  if (p->num_requests < 1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_requests = %d, must be >= 1", fn, p->num_requests);
  if (p->blocks_per_request < 1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: blocks_per_request = %d, must be >= 1", fn,
         p->blocks_per_request);
  if (p->block_size < 1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: block_size = %d, must be >= 1", fn, p->block_size);
  if (p->compact != 0 && p->compact != 1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: compact = %d, must be 0 or 1", fn, p->compact);
  if (p->cp_size < 0)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cp_size = %d, must be 0 or 1 (off) or >= 2", fn,
         p->cp_size);
  if (p->cp_size >= 2 && (p->cp_rank < 0 || p->cp_rank >= p->cp_size))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cp_rank = %d, must be 0..%d (cp_size = %d)", fn,
         p->cp_rank, p->cp_size - 1, p->cp_size);
  if (p->cp_size >= 2 && p->cp_interleave < 0)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: cp_interleave = %d, must be >= 1 (0 means 1)", fn,
         p->cp_interleave);
  if (p->num_tokens == 0) return SMLA_OK;
  CHECK(need_ptr(ctx, fn, "req_id", p->req_id, 4));
  CHECK(need_ptr(ctx, fn, "block_table", p->block_table, 4));
  CHECK(need_ptr(ctx, fn, "local", p->local, 4));
  CHECK(need_rows(ctx, fn, "block_table_stride", p->block_table_stride, p->num_requests,
                  p->blocks_per_request, 1));
  CHECK(need_rows(ctx, fn, "local_stride", p->local_stride, p->num_tokens, p->topk, 1));
  if (fused) return SMLA_OK;
  CHECK(need_ptr(ctx, fn, "slots", p->slots, 4));
  if (p->valid) CHECK(need_ptr(ctx, fn, "valid", p->valid, 4));
  CHECK(need_rows(ctx, fn, "slots_stride", p->slots_stride, p->num_tokens, p->topk, 1));
  /* In place is fine entry by entry (same pointer, same stride, no compaction); any other
   * overlap would overwrite entries not read yet. */
  const int same = (const void *)p->slots == (const void *)p->local &&
                   p->slots_stride == p->local_stride && !p->compact;
  const int32_t *s0 = p->slots, *s1 = p->slots + span(p->num_tokens, p->slots_stride, p->topk);
  const int32_t *l0 = p->local, *l1 = p->local + span(p->num_tokens, p->local_stride, p->topk);
  if (!same && s0 < l1 && l0 < s1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: slots aliases (overlaps) local; in place is allowed only with "
         "the same pointer, equal strides and compact = 0", fn);
  return SMLA_OK;
}

smla_status smla_convert_indices(smla_context *ctx, const smla_convert_params *p, void *stream) {
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  CHECK(check_convert(ctx, "smla_convert_indices", p, 0));
  if (p->num_tokens == 0) return SMLA_OK;
  return ctx->backend->convert(ctx, p, stream);
}

/* ---- 2. cache write ---------------------------------------------------------------------- */

static smla_status check_cache_write(smla_context *ctx, const smla_cache_write_params *p) {
  const char *fn = "smla_cache_write";
  if (!p) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
  CHECK(check_cache(ctx, fn, &p->cache));
  if (p->num_tokens < 0 || p->num_tokens > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_tokens = %lld, must be 0..2^31-1", fn,
         (long long)p->num_tokens);
  if (p->num_tokens == 0) return SMLA_OK;
  CHECK(need_ptr(ctx, fn, "kv_c", p->kv_c, BF16_ALIGN));
  CHECK(need_rows(ctx, fn, "kv_c_stride", p->kv_c_stride, p->num_tokens, SMLA_DC, BF16_MULT));
  if (p->cache.dr > 0) {
    CHECK(need_ptr(ctx, fn, "k_pe", p->k_pe, BF16_ALIGN));
    CHECK(need_rows(ctx, fn, "k_pe_stride", p->k_pe_stride, p->num_tokens, p->cache.dr,
                    BF16_MULT));
  }
  CHECK(need_ptr(ctx, fn, "slot", p->slot, 8));
  if (p->bad_inputs) CHECK(need_ptr(ctx, fn, "bad_inputs", p->bad_inputs, 8));
  return SMLA_OK;
}

smla_status smla_cache_write(smla_context *ctx, const smla_cache_write_params *p, void *stream) {
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  CHECK(check_cache_write(ctx, p));
  if (p->num_tokens == 0) return SMLA_OK;
  return ctx->backend->cache_write(ctx, p, stream);
}

/* ---- 4. merge ------------------------------------------------------------------------ */

static smla_status check_merge(smla_context *ctx, const smla_merge_params *p) {
  const char *fn = "smla_merge_states";
  if (!p) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
  if (p->num_partials < 1)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_partials = %d, must be >= 1", fn, p->num_partials);
  if (p->num_tokens < 0 || p->num_tokens > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_tokens = %lld, must be 0..2^31-1", fn,
         (long long)p->num_tokens);
  if (p->num_heads < 1 || p->num_heads > 65535)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_heads = %d, must be 1..65535", fn, p->num_heads);
  if (p->dv < 1 || p->dv > SMLA_DC)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: dv = %d, must be 1..%d", fn, p->dv, SMLA_DC);
  if ((p->out_p_dtype != SMLA_DTYPE_BF16 && p->out_p_dtype != SMLA_DTYPE_F32) ||
      (p->out_dtype != SMLA_DTYPE_BF16 && p->out_dtype != SMLA_DTYPE_F32))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: out_p_dtype = %d / out_dtype = %d, must be "
         "SMLA_DTYPE_BF16 or SMLA_DTYPE_F32", fn, (int)p->out_p_dtype, (int)p->out_dtype);
  if (p->num_tokens * p->num_heads > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_tokens * num_heads = %lld, must be < 2^31", fn,
         (long long)(p->num_tokens * p->num_heads));
  if (p->num_tokens == 0) return SMLA_OK;
  const size_t in_es = p->out_p_dtype == SMLA_DTYPE_F32 ? 4 : 2;
  const size_t out_es = p->out_dtype == SMLA_DTYPE_F32 ? 4 : 2;
  CHECK(need_ptr(ctx, fn, "out_p", p->out_p, in_es));
  CHECK(need_ptr(ctx, fn, "lse_p", p->lse_p, 4));
  CHECK(need_ptr(ctx, fn, "out", p->out, out_es));
  if (p->lse) CHECK(need_ptr(ctx, fn, "lse", p->lse, 4));
  const int64_t T = p->num_tokens, N = p->num_heads;
  const layout_dim out_p[3] = {{"out_p_stride_p", p->num_partials, p->out_p_stride_p},
                               {"out_p_stride_t", T, p->out_p_stride_t},
                               {"out_p_stride_h", N, p->out_p_stride_h}};
  CHECK(need_layout(ctx, fn, out_p, 3, p->dv, 1));
  CHECK(need_rows2(ctx, fn, "lse_p_stride_p", p->lse_p_stride_p, p->num_partials,
                   "lse_p_stride_t", p->lse_p_stride_t, T, N, 1));
  CHECK(need_rows2(ctx, fn, "out_stride_t", p->out_stride_t, T, "out_stride_h",
                   p->out_stride_h, N, p->dv, 1));
  if (p->lse) CHECK(need_rows(ctx, fn, "lse_stride_t", p->lse_stride_t, T, N, 1));
  if (p->sink) CHECK(need_ptr(ctx, fn, "sink", p->sink, 4));
  return SMLA_OK;
}

smla_status smla_merge_states(smla_context *ctx, const smla_merge_params *p, void *stream) {
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  CHECK(check_merge(ctx, p));
  if (p->num_tokens == 0) return SMLA_OK;
  return ctx->backend->merge(ctx, p, stream);
}

/* ---- 6. plan ------------------------------------------------------------------------- */

static smla_status check_desc(smla_context *ctx, const char *fn, const smla_plan_desc *d) {
  if (!d) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
  if (d->max_tokens < 1 || d->max_tokens > INT32_MAX)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.max_tokens = %lld, must be 1..2^31-1", fn,
         (long long)d->max_tokens);
  if (d->num_heads < 1 || d->num_heads > SMLA_MAX_HEADS)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.num_heads = %d, must be 1..%d", fn, d->num_heads,
         SMLA_MAX_HEADS);
  if (d->topk < 1 || d->topk > (1 << 24))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.topk = %d, must be 1..2^24", fn, d->topk);
  if (d->dr != 0 && d->dr != 64)
    FAIL(SMLA_ERR_UNSUPPORTED, "%s: desc.dr = %d, supported rope dims are 64 and 0", fn, d->dr);
  if (d->format != SMLA_CACHE_BF16 && d->format != SMLA_CACHE_FP8_TENSOR &&
      d->format != SMLA_CACHE_FP8_DS)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.format = %d is not an smla_cache_format", fn,
         (int)d->format);
  if (d->flags & ~(SMLA_PLAN_BATCH_INVARIANT | SMLA_PLAN_PORTABLE | SMLA_PLAN_SEPARATE_MERGE))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.flags = 0x%x has unknown bits", fn, d->flags);
  if (d->num_splits < 0 || d->num_splits > 1024)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.num_splits = %d, must be 0..1024", fn,
         d->num_splits);
  if (d->heads_per_block != 0 && d->heads_per_block != 8 && d->heads_per_block != 16 &&
      d->heads_per_block != 32 && d->heads_per_block != 64)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: desc.heads_per_block = %d, must be 0 (the plan "
         "chooses), 8, 16, 32 or 64", fn, d->heads_per_block);
  return SMLA_OK;
}

/* What the backend's plan_init allocated in a plan (the split table, its few-rows chain). */
static void plan_free_parts(smla_plan *plan) {
  free(plan->split_table);
  smla_plan_free_host(plan->small_t);
}

void smla_plan_free_host(smla_plan *plan) { /* NULL: nothing, as free */
  if (!plan) return;
  plan_free_parts(plan);
  free(plan);
}

/* Runs the backend's shape-only choice on a scratch plan. */
static smla_status plan_choose(smla_context *ctx, const smla_plan_desc *d, smla_plan *plan,
                               size_t *bytes) {
  memset(plan, 0, sizeof *plan);
  plan->ctx = ctx;
  plan->desc = *d;
  plan->num_threads = ctx->num_threads;
  return ctx->backend->plan_init(plan, bytes);
}

smla_status smla_plan_workspace_size(smla_context *ctx, const smla_plan_desc *desc,
                                     size_t *bytes) {
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  if (!bytes) FAIL(SMLA_ERR_INVALID_ARGUMENT, "smla_plan_workspace_size: bytes is NULL");
  CHECK(check_desc(ctx, "smla_plan_workspace_size", desc));
  smla_plan scratch;
  const smla_status s = plan_choose(ctx, desc, &scratch, bytes);
  plan_free_parts(&scratch);
  return s;
}

/* Caller-provided workspaces must be this aligned (vector loads, float atomics). */
#define WORKSPACE_ALIGN 256

smla_status smla_plan_create(smla_context *ctx, const smla_plan_desc *desc, void *workspace,
                             size_t workspace_bytes, smla_plan **out) {
  const char *fn = "smla_plan_create";
  if (!ctx) return SMLA_ERR_INVALID_ARGUMENT;
  if (!out) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
  *out = NULL;
  CHECK(check_desc(ctx, fn, desc));
  if (ctx->backend->check_not_capturing) CHECK(ctx->backend->check_not_capturing(ctx));
  smla_plan *plan = malloc(sizeof *plan);
  if (!plan) FAIL(SMLA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  size_t need = 0;
  smla_status s = plan_choose(ctx, desc, plan, &need);
  if (s != SMLA_OK) {
    smla_plan_free_host(plan);
    return s;
  }
  if (workspace) {
    if (workspace_bytes < need) {
      smla_plan_free_host(plan);
      FAIL(SMLA_ERR_WORKSPACE, "%s: workspace_bytes = %zu, the plan needs %zu", fn,
           workspace_bytes, need);
    }
    if ((uintptr_t)workspace % WORKSPACE_ALIGN) {
      smla_plan_free_host(plan);
      FAIL(SMLA_ERR_MISALIGNED, "%s: workspace = %p is not %d-byte aligned", fn, workspace,
           WORKSPACE_ALIGN);
    }
    plan->workspace = workspace;
    plan->workspace_bytes = workspace_bytes;
  } else if (need > 0) {
    s = ctx->backend->alloc(ctx, need, &plan->workspace);
    if (s != SMLA_OK) {
      smla_plan_free_host(plan);
      return s;
    }
    plan->workspace_bytes = need;
    plan->owns_workspace = 1;
  }
  if (ctx->backend->plan_ready && (s = ctx->backend->plan_ready(plan)) != SMLA_OK) {
    smla_plan_destroy(plan);
    return s;
  }
  *out = plan;
  return SMLA_OK;
}

void smla_plan_destroy(smla_plan *plan) {
  if (!plan) return;
  if (plan->owns_workspace) plan->ctx->backend->free(plan->ctx, plan->workspace);
  smla_plan_free_host(plan);
}

const char *smla_plan_describe(const smla_plan *plan) {
  return plan ? plan->describe : "no plan (NULL)";
}

/* ---- 3. forward ---------------------------------------------------------------------- */

/* fused (smla_forward_indices): slots come from the conversion, so p->slots must be NULL. */
static smla_status check_forward(smla_plan *plan, const char *fn, const smla_forward_params *p,
                                 int fused) {
  smla_context *ctx = plan->ctx;
  const smla_plan_desc *d = &plan->desc;
  if (!p) FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
  if (p->num_tokens < 0)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: num_tokens = %lld, must be >= 0", fn,
         (long long)p->num_tokens);
  if (p->num_tokens > d->max_tokens)
    FAIL(SMLA_ERR_PLAN_MISMATCH, "%s: num_tokens = %lld exceeds the plan's max_tokens = %lld",
         fn, (long long)p->num_tokens, (long long)d->max_tokens);
  if (p->num_heads != d->num_heads)
    FAIL(SMLA_ERR_PLAN_MISMATCH, "%s: num_heads = %d, the plan was made for %d", fn,
         p->num_heads, d->num_heads);
  if (p->topk != d->topk)
    FAIL(SMLA_ERR_PLAN_MISMATCH, "%s: topk = %d, the plan was made for %d", fn, p->topk,
         d->topk);
  CHECK(check_cache(ctx, fn, &p->cache));
  if (p->cache.format != d->format)
    FAIL(SMLA_ERR_PLAN_MISMATCH, "%s: cache.format = %d, the plan was made for %d", fn,
         (int)p->cache.format, (int)d->format);
  if (p->cache.dr != d->dr)
    FAIL(SMLA_ERR_PLAN_MISMATCH, "%s: cache.dr = %d, the plan was made for %d", fn,
         p->cache.dr, d->dr);
  /* 0 would be uniform attention (a forgotten field of a zeroed params struct), a negative
   * scale attention to the least similar rows: neither is what anyone asks for. */
  if (!(p->sm_scale > 0.0f && p->sm_scale <= FLT_MAX))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: sm_scale = %g, must be finite and > 0 (usually "
         "1/sqrt(512 + dr))", fn, (double)p->sm_scale);
  if (!(p->softcap >= 0.0f && p->softcap <= FLT_MAX))
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: softcap = %g, must be 0 (off) or finite and > 0", fn,
         (double)p->softcap);
  if (p->num_tokens == 0) return SMLA_OK;
  const int64_t T = p->num_tokens, N = p->num_heads, K = p->topk, dr = p->cache.dr;
  CHECK(need_ptr(ctx, fn, "q_nope", p->q_nope, BF16_ALIGN));
  CHECK(need_rows2(ctx, fn, "q_nope_stride_t", p->q_nope_stride_t, T, "q_nope_stride_h",
                   p->q_nope_stride_h, N, SMLA_DC, BF16_MULT));
  if (dr > 0) {
    CHECK(need_ptr(ctx, fn, "q_pe", p->q_pe, BF16_ALIGN));
    CHECK(need_rows2(ctx, fn, "q_pe_stride_t", p->q_pe_stride_t, T, "q_pe_stride_h",
                     p->q_pe_stride_h, N, dr, BF16_MULT));
  }
  if (fused && p->slots)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: slots must be NULL (the slots are converted from "
         "indices->local inside the call)", fn);
  if (!fused) {
    CHECK(need_ptr(ctx, fn, "slots", p->slots, 4));
    CHECK(need_rows(ctx, fn, "slots_stride", p->slots_stride, T, K, 1));
  }
  if (p->lengths) CHECK(need_ptr(ctx, fn, "lengths", p->lengths, 4));
  if (p->sink) CHECK(need_ptr(ctx, fn, "sink", p->sink, 4));
  CHECK(need_ptr(ctx, fn, "out", p->out, BF16_ALIGN));
  CHECK(need_rows2(ctx, fn, "out_stride_t", p->out_stride_t, T, "out_stride_h",
                   p->out_stride_h, N, SMLA_DC, BF16_MULT));
  if (p->lse) {
    CHECK(need_ptr(ctx, fn, "lse", p->lse, 4));
    CHECK(need_rows(ctx, fn, "lse_stride_t", p->lse_stride_t, T, N, 1));
  }
  if (p->max_logit) {
    CHECK(need_ptr(ctx, fn, "max_logit", p->max_logit, 4));
    CHECK(need_rows(ctx, fn, "max_logit_stride_t", p->max_logit_stride_t, T, N, 1));
  }
  if (p->bad_inputs) CHECK(need_ptr(ctx, fn, "bad_inputs", p->bad_inputs, 8));
  return SMLA_OK;
}

smla_status smla_forward(smla_plan *plan, const smla_forward_params *p, void *stream) {
  if (!plan) return SMLA_ERR_INVALID_ARGUMENT;
  CHECK(check_forward(plan, "smla_forward", p, 0));
  if (p->num_tokens == 0) return SMLA_OK;
  return plan->ctx->backend->forward(plan, p, NULL, stream);
}

smla_status smla_forward_indices(smla_plan *plan, const smla_forward_params *p,
                                 const smla_convert_params *indices, void *stream) {
  const char *fn = "smla_forward_indices";
  if (!plan) return SMLA_ERR_INVALID_ARGUMENT;
  smla_context *ctx = plan->ctx;
  CHECK(check_forward(plan, fn, p, 1));
  CHECK(check_convert(ctx, fn, indices, 1));
  if (indices->num_tokens != p->num_tokens)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: indices->num_tokens = %lld, params num_tokens = %lld",
         fn, (long long)indices->num_tokens, (long long)p->num_tokens);
  if (indices->topk != p->topk)
    FAIL(SMLA_ERR_INVALID_ARGUMENT, "%s: indices->topk = %d, params topk = %d", fn,
         indices->topk, p->topk);
  if (p->num_tokens == 0) return SMLA_OK;
  return ctx->backend->forward(plan, p, indices, stream);
}
