/*
 * ref.c: the tests' double-precision reference (see ref.h). Naive on purpose: one loop per
 * formula of the SPEC, values decoded from their bit fields with ldexp.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- number formats ------------------------------------------------------------------ */

double ref_bf16_to_double(uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v;
  if (e == 0xff) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -133);           /* subnormal: m * 2^-126 * 2^-7 */
  else v = ldexp((double)(128 + m), e - 127 - 7);        /* 1.m * 2^(e-127) */
  return sign ? -v : v;
}

uint16_t ref_double_to_bf16(double x) {
  const uint16_t sign = signbit(x) ? 0x8000u : 0u;
  const double a = fabs(x);
  if (isnan(x)) return (uint16_t)(sign | 0x7fc0u);
  if (isinf(a)) return (uint16_t)(sign | 0x7f80u);
  if (a == 0.0) return sign;
  int e;
  (void)frexp(a, &e);           /* a in [2^(e-1), 2^e): 8 significant bits -> ulp 2^(e-8) */
  int q = e - 8;
  if (q < -133) q = -133;       /* subnormals have a fixed quantum of 2^-133 */
  const double v = ldexp(nearbyint(ldexp(a, -q)), q); /* nearbyint: ties to even */
  if (v >= ldexp(1.0, 128)) return (uint16_t)(sign | 0x7f80u);
  if (v < ldexp(1.0, -126)) return (uint16_t)(sign | (uint16_t)ldexp(v, 133));
  int e2;
  const double f = frexp(v, &e2); /* v = f * 2^e2, f in [0.5, 1) */
  const int mant = (int)ldexp(f, 8) - 128;
  return (uint16_t)(sign | (uint16_t)((e2 - 1 + 127) << 7) | (uint16_t)mant);
}

double ref_e4m3_to_double(uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = ldexp((double)m, -9);             /* subnormal: m * 2^-6 * 2^-3 */
  else v = ldexp((double)(8 + m), e - 7 - 3);            /* 1.m * 2^(e-7) */
  return sign ? -v : v;
}

/* Magnitudes of codes 0x00..0x7E, increasing. */
static double e4m3_mag[127];
static int e4m3_mag_ready;

uint8_t ref_double_to_e4m3(double x) {
  if (!e4m3_mag_ready) {
    for (int c = 0; c < 127; c++) e4m3_mag[c] = ref_e4m3_to_double((uint8_t)c);
    e4m3_mag_ready = 1;
  }
  const uint8_t sign = signbit(x) ? 0x80u : 0u;
  if (isnan(x)) return (uint8_t)(sign | 0x7fu);
  const double a = fabs(x);
  if (a >= REF_E4M3_MAX) return (uint8_t)(sign | 0x7eu);
  /* largest code lo with mag[lo] <= a (binary search), then pick lo or lo + 1 */
  int lo = 0, hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (e4m3_mag[mid] <= a) lo = mid;
    else hi = mid - 1;
  }
  int c = lo;
  if (lo < 126) {
    const double d0 = a - e4m3_mag[lo], d1 = e4m3_mag[lo + 1] - a;
    if (d1 < d0 || (d1 == d0 && ((lo + 1) & 1) == 0)) c = lo + 1;
  }
  return (uint8_t)(sign | (uint8_t)c);
}

double ref_ds_scale(double amax) {
  double x = amax / REF_E4M3_MAX;
  if (!(x >= 1e-4)) x = 1e-4;
  /* docs/spec-choices.md: an Inf amax gives the scale 2^127 (the largest float power of
   * two), so Inf values saturate to +-448 and finite ones flush to +-0. */
  if (isinf(x)) return ldexp(1.0, 127);
  int e;
  const double f = frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
  return f == 0.5 ? ldexp(1.0, e - 1) : ldexp(1.0, e); /* smallest 2^k >= x */
}

size_t ref_row_size(smla_cache_format format, int dr) {
  if (dr != 0 && dr != 64) return 0;
  switch (format) {
  case SMLA_CACHE_BF16: return (size_t)(REF_DC + dr) * 2;
  case SMLA_CACHE_FP8_TENSOR: return (size_t)(REF_DC + dr);
  case SMLA_CACHE_FP8_DS: return REF_DC + 4 * 4 + (size_t)dr * 2;
  }
  return 0;
}

/* docs/spec-choices.md: "Values are divided by the scale (IEEE division, bit-identical on
 * CPU and GPU)": one float32 division of the (exactly widened) bf16 value, then the
 * rounding to e4m3. Dividing in double instead rounds differently when the float quotient
 * lands on an e4m3 midpoint (FP8_TENSOR scales are arbitrary floats); FP8_DS scales are
 * powers of two, where both are exact. */
static double div_f32(uint16_t bf16, float scale) {
  const float v = (float)ref_bf16_to_double(bf16); /* exact: bf16 is a truncated float */
  const float qf = v / scale;                      /* float / float: one IEEE rounding */
  return (double)qf;
}

void ref_write_row(smla_cache_format format, int dr, float scale, const uint16_t *kv_c,
                   const uint16_t *k_pe, uint8_t *row) {
  switch (format) {
  case SMLA_CACHE_BF16:
    memcpy(row, kv_c, REF_DC * 2);
    if (dr) memcpy(row + REF_DC * 2, k_pe, (size_t)dr * 2);
    break;
  case SMLA_CACHE_FP8_TENSOR:
    for (int i = 0; i < REF_DC; i++) row[i] = ref_double_to_e4m3(div_f32(kv_c[i], scale));
    for (int i = 0; i < dr; i++) row[REF_DC + i] = ref_double_to_e4m3(div_f32(k_pe[i], scale));
    break;
  case SMLA_CACHE_FP8_DS:
    for (int g = 0; g < REF_DC / REF_DS_GROUP; g++) {
      double amax = 0.0;
      for (int i = g * REF_DS_GROUP; i < (g + 1) * REF_DS_GROUP; i++) {
        const double v = fabs(ref_bf16_to_double(kv_c[i]));
        if (!isnan(v) && v > amax) amax = v;
      }
      const double s = ref_ds_scale(amax);
      for (int i = g * REF_DS_GROUP; i < (g + 1) * REF_DS_GROUP; i++)
        row[i] = ref_double_to_e4m3(div_f32(kv_c[i], (float)s));
      const float sf = (float)s; /* a power of two: exact */
      memcpy(row + REF_DC + 4 * g, &sf, 4);
    }
    if (dr) memcpy(row + REF_DC + 16, k_pe, (size_t)dr * 2);
    break;
  }
}

void ref_decode_row(smla_cache_format format, int dr, float scale, const uint8_t *row,
                    double *vals) {
  uint16_t h;
  switch (format) {
  case SMLA_CACHE_BF16:
    for (int i = 0; i < REF_DC + dr; i++) {
      memcpy(&h, row + 2 * i, 2);
      vals[i] = ref_bf16_to_double(h);
    }
    break;
  case SMLA_CACHE_FP8_TENSOR:
    for (int i = 0; i < REF_DC + dr; i++) vals[i] = ref_e4m3_to_double(row[i]) * (double)scale;
    break;
  case SMLA_CACHE_FP8_DS:
    for (int g = 0; g < REF_DC / REF_DS_GROUP; g++) {
      float sf;
      memcpy(&sf, row + REF_DC + 4 * g, 4);
      for (int i = g * REF_DS_GROUP; i < (g + 1) * REF_DS_GROUP; i++)
        vals[i] = ref_e4m3_to_double(row[i]) * (double)sf;
    }
    for (int i = 0; i < dr; i++) {
      memcpy(&h, row + REF_DC + 16 + 2 * i, 2);
      vals[REF_DC + i] = ref_bf16_to_double(h);
    }
    break;
  }
}

/* ---- 1. convert indices -------------------------------------------------------------- */

void ref_convert(const smla_convert_params *p, int32_t *slots, int32_t *valid) {
  const int K = p->topk;
  int32_t *row = malloc(sizeof(int32_t) * (size_t)K);
  for (int64_t t = 0; t < p->num_tokens; t++) {
    const int64_t r = p->req_id[t];
    int32_t count = 0;
    for (int k = 0; k < K; k++) {
      int64_t pos = p->local[t * p->local_stride + k];
      int64_t slot = -1;
      if (p->cp_size >= 2 && pos >= 0) {
        /* Context parallel: keep rank cp_rank's positions, renumbered as that rank's own
         * sequence: the count of its positions before pos. Counted (each whole cycle of
         * I * cp_size positions holds I of every rank, the rest one by one), not by the
         * closed form the backends use. */
        const int64_t il = p->cp_interleave > 0 ? p->cp_interleave : 1;
        const int64_t cycle = il * p->cp_size;
        int64_t before = (pos / cycle) * il;
        for (int64_t q = pos / cycle * cycle; q < pos; q++)
          before += (q / il) % p->cp_size == p->cp_rank;
        pos = (pos / il) % p->cp_size == p->cp_rank ? before : -1;
      }
      if (r >= 0 && r < p->num_requests && pos >= 0) {
        const int64_t blk = pos / p->block_size;
        if (blk < p->blocks_per_request) {
          const int64_t b = p->block_table[r * p->block_table_stride + blk];
          if (b >= 0) {
            const int64_t s = b * p->block_size + pos % p->block_size;
            if (s <= INT32_MAX) slot = s;
          }
        }
      }
      row[k] = (int32_t)slot;
      if (slot >= 0) count++;
    }
    if (p->compact) {
      int j = 0;
      for (int k = 0; k < K; k++)
        if (row[k] >= 0) slots[t * K + j++] = row[k];
      for (; j < K; j++) slots[t * K + j] = -1;
    } else {
      memcpy(slots + t * K, row, sizeof(int32_t) * (size_t)K);
    }
    if (valid) valid[t] = count;
  }
  free(row);
}

/* ---- 2. cache write ------------------------------------------------------------------ */

void ref_cache_write(const smla_cache_write_params *p, uint64_t *bad) {
  const smla_cache *c = &p->cache;
  for (int64_t t = 0; t < p->num_tokens; t++) {
    const int64_t s = p->slot[t];
    if (s < 0) continue;
    if (s >= c->num_slots) {
      (*bad)++;
      continue;
    }
    const uint16_t *kv = (const uint16_t *)p->kv_c + t * p->kv_c_stride;
    const uint16_t *pe = c->dr ? (const uint16_t *)p->k_pe + t * p->k_pe_stride : NULL;
    ref_write_row(c->format, c->dr, c->scale, kv, pe, (uint8_t *)c->data + s * c->row_bytes);
  }
}

/* ---- 3. forward ---------------------------------------------------------------------- */

void ref_forward(const smla_forward_params *p, double *out, double *lse, double *max_logit,
                 uint64_t *bad, double *pabs) {
  const int64_t T = p->num_tokens;
  const int N = p->num_heads, K = p->topk, dr = p->cache.dr, dqk = REF_DC + dr;
  const int64_t S = p->cache.num_slots;
  double *kv = malloc(sizeof(double) * (size_t)K * (size_t)dqk); /* used rows, decoded */
  double *logit = malloc(sizeof(double) * (size_t)K);
  double q[REF_DC + 64], acc[REF_DC], aabs[REF_DC];
  for (int64_t t = 0; t < T; t++) {
    int64_t len = K;
    if (p->lengths) {
      len = p->lengths[t];
      if (len < 0) len = 0;
      if (len > K) len = K;
    }
    int nused = 0;
    for (int64_t i = 0; i < len; i++) {
      const int64_t s = p->slots[t * p->slots_stride + i];
      if (s >= 0 && s < S) {
        ref_decode_row(p->cache.format, dr, p->cache.scale,
                       (const uint8_t *)p->cache.data + s * p->cache.row_bytes,
                       kv + (size_t)nused * dqk);
        nused++;
      } else if (s != -1) {
        (*bad)++;
      }
    }
    for (int h = 0; h < N; h++) {
      double *o = out + ((size_t)t * N + h) * REF_DC;
      const size_t th = (size_t)t * N + h;
      if (nused == 0) {
        for (int d = 0; d < REF_DC; d++) o[d] = 0.0;
        if (pabs)
          for (int d = 0; d < REF_DC; d++) pabs[th * REF_DC + d] = 0.0;
        lse[th] = -INFINITY;
        max_logit[th] = -INFINITY;
        continue;
      }
      const uint16_t *qn = (const uint16_t *)p->q_nope + t * p->q_nope_stride_t +
                           h * p->q_nope_stride_h;
      for (int d = 0; d < REF_DC; d++) q[d] = ref_bf16_to_double(qn[d]);
      if (dr) {
        const uint16_t *qp = (const uint16_t *)p->q_pe + t * p->q_pe_stride_t +
                             h * p->q_pe_stride_h;
        for (int d = 0; d < dr; d++) q[REF_DC + d] = ref_bf16_to_double(qp[d]);
      }
      int any_nan = 0;
      double m = -INFINITY;
      for (int u = 0; u < nused; u++) {
        const double *k = kv + (size_t)u * dqk;
        double dot = 0.0;
        for (int d = 0; d < dqk; d++) dot += q[d] * k[d];
        double l = (double)p->sm_scale * dot;
        if (p->softcap > 0.0f) l = (double)p->softcap * tanh(l / (double)p->softcap);
        logit[u] = l;
        if (isnan(l)) any_nan = 1;
        else if (l > m) m = l;
      }
      if (any_nan) m = NAN;
      double z = 0.0;
      for (int d = 0; d < REF_DC; d++) acc[d] = aabs[d] = 0.0;
      for (int u = 0; u < nused; u++) {
        const double w = exp(logit[u] - m);
        const double *k = kv + (size_t)u * dqk;
        z += w;
        for (int d = 0; d < REF_DC; d++) acc[d] += w * k[d];
        if (pabs)
          for (int d = 0; d < REF_DC; d++) aabs[d] += w * fabs(k[d]);
      }
      const double denom = z + (p->sink ? exp((double)p->sink[h] - m) : 0.0);
      for (int d = 0; d < REF_DC; d++) o[d] = acc[d] / denom;
      if (pabs)
        for (int d = 0; d < REF_DC; d++) pabs[th * REF_DC + d] = aabs[d] / denom;
      lse[th] = m + log(z);
      max_logit[th] = m;
    }
  }
  free(kv);
  free(logit);
}

/* ---- 4. merge ------------------------------------------------------------------------ */

static double read_val(const void *base, smla_dtype dt, int64_t idx) {
  if (dt == SMLA_DTYPE_F32) return (double)((const float *)base)[idx];
  return ref_bf16_to_double(((const uint16_t *)base)[idx]);
}

void ref_merge(const smla_merge_params *p, double *out, double *lse) {
  const int P = p->num_partials, N = p->num_heads, dv = p->dv;
  for (int64_t t = 0; t < p->num_tokens; t++) {
    for (int h = 0; h < N; h++) {
      const size_t th = (size_t)t * N + h;
      double *o = out + th * dv;
      double mx = -INFINITY;
      int undefined = 0; /* a NaN or +inf lse_p: the weights are undefined */
      for (int q = 0; q < P; q++) {
        const double l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
        if (isnan(l) || l == INFINITY) undefined = 1;
        else if (l > mx) mx = l;
      }
      if (undefined) { /* header: "A NaN or +inf lse_p makes that (t, h) NaN in out and lse" */
        for (int d = 0; d < dv; d++) o[d] = NAN;
        lse[th] = NAN;
        continue;
      }
      for (int d = 0; d < dv; d++) o[d] = 0.0;
      if (mx == -INFINITY) {
        lse[th] = -INFINITY;
        continue;
      }
      double wsum = 0.0;
      for (int q = 0; q < P; q++) {
        const double l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
        if (l != -INFINITY) wsum += exp(l - mx);
      }
      /* With a sink the partials are sinked forwards' outputs: out_p = A_p / (e^lse_p + e^s)
       * (in units of the partial's own max), so the whole is
       * sum_p (e^lse_p + e^s) out_p / (e^lse + e^s), each weight taken relative to mx. */
      const double s = p->sink ? (double)p->sink[h] : 0.0;
      const double whole = p->sink ? wsum + exp(s - mx) : wsum;
      for (int q = 0; q < P; q++) {
        const double l = p->lse_p[q * p->lse_p_stride_p + t * p->lse_p_stride_t + h];
        if (l == -INFINITY) continue; /* contributes nothing: its out_p is not read */
        const double w = (exp(l - mx) + (p->sink ? exp(s - mx) : 0.0)) / whole;
        const int64_t base = q * p->out_p_stride_p + t * p->out_p_stride_t + h * p->out_p_stride_h;
        for (int d = 0; d < dv; d++) o[d] += w * read_val(p->out_p, p->out_p_dtype, base + d);
      }
      lse[th] = mx + log(wsum);
    }
  }
}

/* ---- 5. metadata --------------------------------------------------------------------- */

smla_status ref_metadata(const smla_metadata_params *p) {
  const int64_t T = p->num_tokens;
  const int R = p->num_requests;
  if (T < 0 || R < 0 || p->topk < 1 || !p->query_start_loc || (R > 0 && !p->seq_lens) ||
      (T > 0 && !p->req_id))
    return SMLA_ERR_INVALID_ARGUMENT;
  const int32_t *qsl = p->query_start_loc;
  if (qsl[0] != 0) return SMLA_ERR_MALFORMED;
  for (int r = 0; r < R; r++) {
    if (qsl[r + 1] < qsl[r]) return SMLA_ERR_MALFORMED;
    const int32_t q_len = qsl[r + 1] - qsl[r];
    if (q_len > 0 && p->seq_lens[r] < q_len) return SMLA_ERR_MALFORMED;
  }
  if (qsl[R] > T) return SMLA_ERR_MALFORMED;
  for (int64_t t = 0; t < T; t++) {
    p->req_id[t] = 0;
    if (p->ctx_len) p->ctx_len[t] = 0;
    if (p->limit) p->limit[t] = 0;
  }
  for (int r = 0; r < R; r++) {
    const int32_t q_len = qsl[r + 1] - qsl[r];
    for (int32_t j = 0; j < q_len; j++) {
      const int64_t t = qsl[r] + j;
      const int64_t ctx = (int64_t)p->seq_lens[r] - q_len + j + 1;
      p->req_id[t] = r;
      if (p->ctx_len) p->ctx_len[t] = (int32_t)ctx;
      if (p->limit) p->limit[t] = (int32_t)(ctx < p->topk ? ctx : p->topk);
    }
  }
  return SMLA_OK;
}
