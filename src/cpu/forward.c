/*
 * forward.c: the CPU forward (SPEC §3), the oracle of every GPU kernel.
 *
 * Work item = (row t, group of heads). An item walks row t's slots once, gathers up to
 * CHUNK used rows, widens them to float (bf16 / e4m3 * scale) and then, for every head
 * of its group, runs one step of the online softmax over the chunk:
 *   scores s_j = sm_scale * q_h . kv_j (softcapped), m' = max(m, s_j), a = exp(m - m'),
 *   z = a z + sum_j exp(s_j - m'),  acc = a acc + sum_j exp(s_j - m') ckv_j.
 * So each gathered row is read from memory once per item and reused by all its heads.
 *
 * Napkin math (one core, AVX2 + FMA): a (token, head, entry) costs Dqk + Dv = 1088 FMAs;
 * T=1, N=16, K=2048 is 36 M FMAs, ~3 ms at ~12 GFMA/s. Inner loops use GCC vector
 * extensions (8 floats) with 4 rows per q load in the dot products; the file is built for
 * x86-64-v3 (AVX2, FMA) as a second clone when the compiler supports it.
 */
#include "cpu.h"
#include "numerics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define DQK_MAX (SMLA_DC + 64)
#define CHUNK 64 /* rows gathered per step: 64 * 576 floats = 144 KiB, stays in L2 */

typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT
#endif

static inline v8f ld8(const float *p) {
  v8f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }
static inline float hsum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* Per-worker scratch, carved from the plan's workspace. */
typedef struct {
  float *kv;     /* [CHUNK][DQK_MAX] gathered rows as float */
  float *q;      /* [heads][DQK_MAX] this item's q rows as float */
  float *acc;    /* [heads][Dc] running numerators */
  float *m, *z;  /* [heads] running max and denominator */
  float *s;      /* [CHUNK] one head's scores */
} scratch;

static size_t scratch_floats(int heads) {
  return (size_t)CHUNK * DQK_MAX + (size_t)heads * (DQK_MAX + SMLA_DC + 2) + CHUNK;
}

static scratch carve(float *base, int heads) {
  scratch s;
  s.kv = base;
  s.q = s.kv + (size_t)CHUNK * DQK_MAX;
  s.acc = s.q + (size_t)heads * DQK_MAX;
  s.m = s.acc + (size_t)heads * SMLA_DC;
  s.z = s.m + heads;
  s.s = s.z + heads;
  return s;
}

/* Widens one cache row to floats: Dc latent then Dr rope. */
static void widen_row(const smla_cache *c, const uint8_t *row, float *dst) {
  const int dqk = SMLA_DC + c->dr;
  switch (c->format) {
  case SMLA_CACHE_BF16: {
    const uint16_t *h = (const uint16_t *)row;
    for (int d = 0; d < dqk; d++) dst[d] = smla_bf16_to_f32(h[d]);
    break;
  }
  case SMLA_CACHE_FP8_TENSOR:
    for (int d = 0; d < dqk; d++) dst[d] = smla_e4m3_to_f32(row[d]) * c->scale;
    break;
  case SMLA_CACHE_FP8_DS: {
    float scales[SMLA_DS_GROUPS];
    memcpy(scales, row + SMLA_DC, sizeof scales);
    for (int d = 0; d < SMLA_DC; d++) dst[d] = smla_e4m3_to_f32(row[d]) * scales[d / SMLA_DS_GROUP];
    const uint16_t *pe = (const uint16_t *)(row + SMLA_DC + sizeof scales);
    for (int d = 0; d < c->dr; d++) dst[SMLA_DC + d] = smla_bf16_to_f32(pe[d]);
    break;
  }
  }
}

/* s[j] = q . kv[j] over dqk (a multiple of 64) for j < n; 4 rows share each q load. */
HOT static void dots(const float *q, const float *kv, int n, int dqk, float *s) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = kv + (size_t)j * DQK_MAX;
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int d = 0; d < dqk; d += 8) {
      const v8f qv = ld8(q + d);
      a0 += qv * ld8(k0 + d);
      a1 += qv * ld8(k0 + DQK_MAX + d);
      a2 += qv * ld8(k0 + 2 * DQK_MAX + d);
      a3 += qv * ld8(k0 + 3 * DQK_MAX + d);
    }
    s[j] = hsum8(a0);
    s[j + 1] = hsum8(a1);
    s[j + 2] = hsum8(a2);
    s[j + 3] = hsum8(a3);
  }
  for (; j < n; j++) {
    const float *k0 = kv + (size_t)j * DQK_MAX;
    v8f a0 = {0};
    for (int d = 0; d < dqk; d += 8) a0 += ld8(q + d) * ld8(k0 + d);
    s[j] = hsum8(a0);
  }
}

/* acc = a * acc + sum_j p[j] * kv[j][0..Dc), one 8-float slice of acc in a register. */
HOT static void accumulate(float *acc, float a, const float *p, const float *kv, int n) {
  for (int d = 0; d < SMLA_DC; d += 8) {
    v8f v = ld8(acc + d) * a;
    for (int j = 0; j < n; j++) v += p[j] * ld8(kv + (size_t)j * DQK_MAX + d);
    st8(acc + d, v);
  }
}

typedef struct {
  const smla_plan *plan;
  const smla_forward_params *p;
  const smla_convert_params *indices; /* smla_forward_indices: converted as read; else NULL */
  int groups;      /* head groups per row */
  int heads;       /* heads per group */
  size_t scratch_floats;
  uint64_t bad;
} fwd_job;

/* Folds one chunk of n gathered rows into the running state of heads [h0, h0 + nh). */
static void fold_chunk(const smla_forward_params *p, scratch *w, int nh, int n, int dqk) {
  const float c = p->softcap;
  for (int h = 0; h < nh; h++) {
    dots(w->q + (size_t)h * DQK_MAX, w->kv, n, dqk, w->s);
    float mx = w->m[h];
    for (int j = 0; j < n; j++) {
      float l = p->sm_scale * w->s[j];
      if (c > 0.0f) l = c * tanhf(l / c);
      w->s[j] = l;
      mx = (l != l || mx != mx) ? NAN : fmaxf(mx, l); /* a NaN logit makes m NaN */
    }
    const float a = mx == w->m[h] ? 1.0f : expf(w->m[h] - mx);
    float zsum = 0.0f;
    for (int j = 0; j < n; j++) {
      w->s[j] = expf(w->s[j] - mx);
      zsum += w->s[j];
    }
    w->z[h] = w->z[h] * a + zsum;
    w->m[h] = mx;
    accumulate(w->acc + (size_t)h * SMLA_DC, a, w->s, w->kv, n);
  }
}

static void forward_item(void *arg, int64_t item, int worker) {
  fwd_job *job = arg;
  const smla_forward_params *p = job->p;
  const smla_cache *c = &p->cache;
  const int64_t t = item / job->groups;
  const int h0 = (int)(item % job->groups) * job->heads;
  const int nh = h0 + job->heads <= p->num_heads ? job->heads : p->num_heads - h0;
  if (nh <= 0) return;
  const int dqk = SMLA_DC + c->dr;
  scratch w = carve((float *)job->plan->workspace + (size_t)worker * job->scratch_floats,
                    job->heads);

  for (int h = 0; h < nh; h++) {
    const uint16_t *qn = (const uint16_t *)p->q_nope + t * p->q_nope_stride_t +
                         (int64_t)(h0 + h) * p->q_nope_stride_h;
    float *qf = w.q + (size_t)h * DQK_MAX;
    for (int d = 0; d < SMLA_DC; d++) qf[d] = smla_bf16_to_f32(qn[d]);
    if (c->dr) {
      const uint16_t *qp = (const uint16_t *)p->q_pe + t * p->q_pe_stride_t +
                           (int64_t)(h0 + h) * p->q_pe_stride_h;
      for (int d = 0; d < c->dr; d++) qf[SMLA_DC + d] = smla_bf16_to_f32(qp[d]);
    }
    w.m[h] = -INFINITY;
    w.z[h] = 0.0f;
    memset(w.acc + (size_t)h * SMLA_DC, 0, SMLA_DC * sizeof(float));
  }

  int64_t len = p->topk;
  if (p->lengths) {
    const int32_t l = p->lengths[t];
    len = l < 0 ? 0 : (l > p->topk ? p->topk : l);
  }
  /* Slots, or (smla_forward_indices) request-local positions converted one by one: the
   * same used entries in the same order as convert + forward, so the same result. */
  const smla_convert_params *ix = job->indices;
  const int32_t *slots = ix ? ix->local + t * ix->local_stride : p->slots + t * p->slots_stride;
  const int32_t req = ix ? ix->req_id[t] : 0;
  uint64_t bad = 0;
  int n = 0;
  for (int64_t i = 0; i < len; i++) {
    const int32_t s = ix ? smla_cpu_convert_one(ix, req, slots[i]) : slots[i];
    if (s >= 0 && s < c->num_slots) {
      widen_row(c, (const uint8_t *)c->data + (int64_t)s * c->row_bytes, w.kv + (size_t)n * DQK_MAX);
      if (++n == CHUNK) {
        fold_chunk(p, &w, nh, n, dqk);
        n = 0;
      }
    } else if (s < -1 || s >= c->num_slots) {
      bad++;
    }
  }
  if (n) fold_chunk(p, &w, nh, n, dqk);
  if (h0 == 0 && bad) __atomic_fetch_add(&job->bad, bad, __ATOMIC_RELAXED);

  for (int h = 0; h < nh; h++) {
    uint16_t *o = (uint16_t *)p->out + t * p->out_stride_t + (int64_t)(h0 + h) * p->out_stride_h;
    const float m = w.m[h], z = w.z[h];
    const int empty = z == 0.0f && m == -INFINITY;
    float denom = z;
    if (p->sink && !empty) denom += expf(p->sink[h0 + h] - m);
    const float *acc = w.acc + (size_t)h * SMLA_DC;
    for (int d = 0; d < SMLA_DC; d++) o[d] = smla_f32_to_bf16(empty ? 0.0f : acc[d] / denom);
    if (p->lse) p->lse[t * p->lse_stride_t + h0 + h] = empty ? -INFINITY : m + logf(z);
    if (p->max_logit) p->max_logit[t * p->max_logit_stride_t + h0 + h] = m;
  }
}

/* Splits rows into head groups only when there are fewer rows than workers. */
static void choose_groups(const smla_plan *plan, int64_t T, int *groups, int *heads) {
  const int N = plan->desc.num_heads;
  int g = 1;
  if (T < plan->num_threads) g = (int)((plan->num_threads + T - 1) / T);
  if (g > N) g = N;
  *heads = (N + g - 1) / g;
  *groups = (N + *heads - 1) / *heads;
}

smla_status smla_cpu_plan_init(smla_plan *plan, size_t *workspace_bytes) {
  const smla_plan_desc *d = &plan->desc;
  if (plan->num_threads < 1) plan->num_threads = 1;
  plan->num_splits = 1;
  plan->heads_per_block = d->num_heads; /* the widest group any T can ask for */
  plan->kernel = 0;
  *workspace_bytes = (size_t)plan->num_threads * scratch_floats(d->num_heads) * sizeof(float);
  snprintf(plan->describe, sizeof plan->describe,
           "cpu: %d threads, one item per (row, head group), %d rows gathered per step, "
           "heads grouped only when T < threads%s%s",
           plan->num_threads, CHUNK, d->num_splits > 1 ? "; num_splits ignored (no KV split on CPU)" : "",
           d->heads_per_block > 0 ? "; heads_per_block ignored" : "");
  return SMLA_OK;
}

smla_status smla_cpu_forward(smla_plan *plan, const smla_forward_params *p,
                             const smla_convert_params *indices, void *stream) {
  (void)stream;
  fwd_job job = {.plan = plan, .p = p, .indices = indices, .bad = 0};
  choose_groups(plan, p->num_tokens, &job.groups, &job.heads);
  /* Every worker's scratch is sized for the plan's full head count; a group is smaller. */
  job.scratch_floats = scratch_floats(plan->desc.num_heads);
  smla_cpu_parallel(plan->num_threads, p->num_tokens * job.groups, forward_item, &job);
  if (p->bad_inputs && job.bad) __atomic_fetch_add(p->bad_inputs, job.bad, __ATOMIC_RELAXED);
  return SMLA_OK;
}
