/*
 * ref.h: an independent, naive double-precision reference of every smla operation, for the
 * tests only. It follows the project SPEC, docs/spec-choices.md and the header's choices, and shares no
 * code with the library: its bf16 and e4m3 codecs are written from the bit fields here
 * (src/numerics.h is deliberately not used), and it favours being obviously right over
 * being fast.
 *
 * All pointers are host pointers. Params structs are the public ones (include/smla.h),
 * read for their data and strides only.
 */
#ifndef SMLA_TEST_REF_H
#define SMLA_TEST_REF_H

#include "smla.h"

#include <stddef.h>
#include <stdint.h>

#define REF_DC 512       /* latent width Dc (= Dv) */
#define REF_DS_GROUP 128 /* FP8_DS: values per scale group */
#define REF_E4M3_MAX 448.0

/* ---- number formats ------------------------------------------------------------------ */
/* bf16 bits -> value (exact). */
double ref_bf16_to_double(uint16_t h);
/* value -> bf16 bits: round to nearest, ties to even; overflow -> +-Inf; NaN -> 0x7FC0|sign. */
uint16_t ref_double_to_bf16(double x);
/* e4m3 (OCP E4M3FN) bits -> value (exact); S.1111.111 is NaN. */
double ref_e4m3_to_double(uint8_t b);
/* value -> e4m3 bits, by search of the table of finite values: the nearest one, ties to
 * the even code; |x| >= 448 (Inf too) saturates to +-448; NaN -> 0x7F|sign. The sign of
 * x is kept (a negative value that rounds to 0 gives 0x80). */
uint8_t ref_double_to_e4m3(double x);
/* FP8_DS group scale 2^ceil(log2(max(amax / 448, 1e-4))) (NaN amax counts as 0; an Inf
 * amax gives 2^127, docs/spec-choices.md). */
double ref_ds_scale(double amax);

/* Bytes of one row (0 for an invalid pair), and the byte offsets inside it. */
size_t ref_row_size(smla_cache_format format, int dr);

/* Encodes one row (ref_row_size bytes, padding beyond it untouched) from Dc bf16 latent
 * values and dr bf16 rope values (k_pe may be NULL when dr == 0). FP8_TENSOR divides by
 * `scale`; FP8_DS picks each group's scale by ref_ds_scale(amax of its non-NaN values).
 * The division is one float32 IEEE division, as docs/spec-choices.md pins it. */
void ref_write_row(smla_cache_format format, int dr, float scale, const uint16_t *kv_c,
                   const uint16_t *k_pe, uint8_t *row);
/* Decodes one row into vals[Dc + dr]: the float values the SPEC says the products use. */
void ref_decode_row(smla_cache_format format, int dr, float scale, const uint8_t *row,
                    double *vals);

/* ---- operations ---------------------------------------------------------------------- */
/* 1. Convert indices. slots is dense [T][K]; valid [T] may be NULL. p's out pointers are
 * not used. */
void ref_convert(const smla_convert_params *p, int32_t *slots, int32_t *valid);

/* 2. Cache write into p->cache.data (host). Later rows win over earlier ones with the same
 * slot. *bad += rows with slot >= S. */
void ref_cache_write(const smla_cache_write_params *p, uint64_t *bad);

/* 3. Forward. out is dense [T][N][Dc], lse and max_logit dense [T][N] (all required);
 * p's out pointers are not used. *bad += entries inside lengths that are >= S or < -1.
 * NaN in a used logit makes that (t, h)'s out, lse and max_logit NaN. pabs (may be NULL):
 * dense [T][N][Dc] sum_j p_j |v_j| (p normalized like out): how far out can move when
 * each p_j is rounded by a relative 1 (the GPU kernels round P to bf16: 2^-8 of it). */
void ref_forward(const smla_forward_params *p, double *out, double *lse, double *max_logit,
                 uint64_t *bad, double *pabs);

/* 4. Merge partial states. out is dense [T][N][dv], lse dense [T][N]. Partials with
 * lse = -inf are not read at all. With p->sink the partials are sinked forwards' outputs
 * (the header's rule, in plain exp form: the tests keep sink - lse_p moderate). A NaN or +inf lse_p makes that (t, h)'s out and lse NaN
 * (then no out_p of it is read either). */
void ref_merge(const smla_merge_params *p, double *out, double *lse);

/* 5. Metadata: validates like the header says and fills p->req_id, ctx_len, limit (those
 * not NULL). Returns SMLA_OK, SMLA_ERR_MALFORMED or SMLA_ERR_INVALID_ARGUMENT (negative
 * T or R, K < 1, NULL arrays). Writes nothing on error. */
smla_status ref_metadata(const smla_metadata_params *p);

#endif /* SMLA_TEST_REF_H */
