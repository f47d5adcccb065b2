/*
 * ops.c: the CPU backend of convert indices, cache write and merge (SPEC §1, §2, §4).
 * Straight loops over rows, one row per work item; the GPU kernels are checked against
 * these, so each is the spec written out.
 */
#include "cpu.h"
#include "numerics.h"

#include <math.h>
#include <string.h>

/* ---- 1. convert indices ---------------------------------------------------------------- */

typedef struct {
  const smla_convert_params *p;
} convert_job;

int32_t smla_cpu_convert_one(const smla_convert_params *p, int32_t r, int32_t pos) {
  if (r < 0 || r >= p->num_requests || pos < 0) return -1;
  if (p->cp_size >= 2) { /* this rank's entries only, at their local position */
    const int64_t il = p->cp_interleave > 0 ? p->cp_interleave : 1;
    if ((pos / il) % p->cp_size != p->cp_rank) return -1;
    pos = (int32_t)((pos / (il * p->cp_size)) * il + pos % il);
  }
  const int32_t block = pos / p->block_size;
  if (block >= p->blocks_per_request) return -1;
  const int32_t id = p->block_table[(int64_t)r * p->block_table_stride + block];
  if (id < 0) return -1;
  const int64_t slot = (int64_t)id * p->block_size + pos % p->block_size;
  return slot > INT32_MAX ? -1 : (int32_t)slot;
}

static void convert_row(void *arg, int64_t t, int worker) {
  (void)worker;
  const smla_convert_params *p = ((convert_job *)arg)->p;
  const int32_t r = p->req_id[t];
  const int32_t *local = p->local + t * p->local_stride;
  int32_t *slots = p->slots + t * p->slots_stride;
  int32_t n = 0;
  for (int k = 0; k < p->topk; k++) {
    const int32_t s = smla_cpu_convert_one(p, r, local[k]);
    if (p->compact) {
      if (s >= 0) slots[n] = s; /* n <= k: never overwrites an unread entry of local */
    } else {
      slots[k] = s;
    }
    n += s >= 0;
  }
  if (p->compact)
    for (int k = n; k < p->topk; k++) slots[k] = -1;
  if (p->valid) p->valid[t] = n;
}

smla_status smla_cpu_convert(smla_context *ctx, const smla_convert_params *p, void *stream) {
  (void)stream;
  convert_job job = {p};
  smla_cpu_parallel(ctx->num_threads, p->num_tokens, convert_row, &job);
  return SMLA_OK;
}

/* ---- 2. cache write ------------------------------------------------------------------- */

typedef struct {
  const smla_cache_write_params *p;
  uint64_t bad;
} write_job;

static void write_row(void *arg, int64_t t, int worker) {
  (void)worker;
  write_job *job = arg;
  const smla_cache_write_params *p = job->p;
  const smla_cache *c = &p->cache;
  const int64_t slot = p->slot[t];
  if (slot < 0) return; /* padding */
  if (slot >= c->num_slots) {
    __atomic_fetch_add(&job->bad, 1, __ATOMIC_RELAXED);
    return;
  }
  const uint16_t *kv = (const uint16_t *)p->kv_c + t * p->kv_c_stride;
  const uint16_t *pe = c->dr ? (const uint16_t *)p->k_pe + t * p->k_pe_stride : NULL;
  uint8_t *row = (uint8_t *)c->data + slot * c->row_bytes;
  switch (c->format) {
  case SMLA_CACHE_BF16:
    memcpy(row, kv, SMLA_DC * 2);
    if (pe) memcpy(row + SMLA_DC * 2, pe, (size_t)c->dr * 2);
    break;
  case SMLA_CACHE_FP8_TENSOR:
    for (int i = 0; i < SMLA_DC; i++) row[i] = smla_f32_to_e4m3(smla_bf16_to_f32(kv[i]) / c->scale);
    for (int i = 0; i < c->dr; i++)
      row[SMLA_DC + i] = smla_f32_to_e4m3(smla_bf16_to_f32(pe[i]) / c->scale);
    break;
  case SMLA_CACHE_FP8_DS: {
    float scales[SMLA_DS_GROUPS];
    for (int g = 0; g < SMLA_DS_GROUPS; g++) {
      float amax = 0.0f;
      for (int i = 0; i < SMLA_DS_GROUP; i++)
        amax = fmaxf(amax, fabsf(smla_bf16_to_f32(kv[g * SMLA_DS_GROUP + i]))); /* skips NaN */
      const float scale = smla_ds_scale(amax);
      scales[g] = scale;
      for (int i = 0; i < SMLA_DS_GROUP; i++) {
        const int d = g * SMLA_DS_GROUP + i;
        row[d] = smla_f32_to_e4m3(smla_bf16_to_f32(kv[d]) / scale);
      }
    }
    memcpy(row + SMLA_DC, scales, sizeof scales);
    if (pe) memcpy(row + SMLA_DC + sizeof scales, pe, (size_t)c->dr * 2);
    break;
  }
  }
}

smla_status smla_cpu_cache_write(smla_context *ctx, const smla_cache_write_params *p,
                                 void *stream) {
  (void)stream;
  write_job job = {p, 0};
  smla_cpu_parallel(ctx->num_threads, p->num_tokens, write_row, &job);
  if (p->bad_inputs && job.bad) __atomic_fetch_add(p->bad_inputs, job.bad, __ATOMIC_RELAXED);
  return SMLA_OK;
}

/* ---- 4. merge ---------------------------------------------------------------------------- */

typedef struct {
  const smla_merge_params *p;
} merge_job;

static float load_elem(const void *base, smla_dtype dt, int64_t i) {
  return dt == SMLA_DTYPE_F32 ? ((const float *)base)[i]
                              : smla_bf16_to_f32(((const uint16_t *)base)[i]);
}

static void store_elem(void *base, smla_dtype dt, int64_t i, float v) {
  if (dt == SMLA_DTYPE_F32)
    ((float *)base)[i] = v;
  else
    ((uint16_t *)base)[i] = smla_f32_to_bf16(v);
}

/* One work item = one row t, all heads. */
static void merge_row(void *arg, int64_t t, int worker) {
  (void)worker;
  const smla_merge_params *p = ((merge_job *)arg)->p;
  float acc[SMLA_DC];
  for (int h = 0; h < p->num_heads; h++) {
    float m = -INFINITY;
    int any_nan = 0;
    for (int q = 0; q < p->num_partials; q++) {
      const float l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
      any_nan |= l != l;
      m = fmaxf(m, l);
    }
    const int64_t o = t * p->out_stride_t + h * p->out_stride_h;
    float lse;
    if (any_nan || m == INFINITY) { /* undefined weights: say so with NaN, never garbage */
      for (int d = 0; d < p->dv; d++) store_elem(p->out, p->out_dtype, o + d, NAN);
      lse = NAN;
    } else if (m == -INFINITY) { /* every partial empty */
      for (int d = 0; d < p->dv; d++) store_elem(p->out, p->out_dtype, o + d, 0.0f);
      lse = -INFINITY;
    } else {
      float z = 0.0f;
      for (int q = 0; q < p->num_partials; q++) {
        const float l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
        if (l != -INFINITY) z += expf(l - m);
      }
      lse = m + logf(z);
      /* Sinked partials (header): w_p = exp(lae(lse_p, s) - lae(lse, s)). */
      const float s = p->sink ? p->sink[h] : 0.0f;
      const float lae_all = p->sink ? smla_logaddexpf(lse, s) : lse;
      for (int d = 0; d < p->dv; d++) acc[d] = 0.0f;
      for (int q = 0; q < p->num_partials; q++) {
        const float l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
        if (l == -INFINITY) continue; /* contributes nothing, its out_p is not read */
        const float w = expf((p->sink ? smla_logaddexpf(l, s) : l) - lae_all);
        const int64_t i = q * p->out_p_stride_p + t * p->out_p_stride_t + h * p->out_p_stride_h;
        for (int d = 0; d < p->dv; d++) acc[d] += w * load_elem(p->out_p, p->out_p_dtype, i + d);
      }
      for (int d = 0; d < p->dv; d++) store_elem(p->out, p->out_dtype, o + d, acc[d]);
    }
    if (p->lse) p->lse[t * p->lse_stride_t + h] = lse;
  }
}

smla_status smla_cpu_merge(smla_context *ctx, const smla_merge_params *p, void *stream) {
  (void)stream;
  merge_job job = {p};
  smla_cpu_parallel(ctx->num_threads, p->num_tokens, merge_row, &job);
  return SMLA_OK;
}
