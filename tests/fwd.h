/*
 * fwd.h: one forward problem (shapes, layout, host inputs, plan options), built from
 * random data, and the runner that checks it on every backend against the reference.
 *
 * Life of a forward case:
 *   fwd_problem pb;  fwd_defaults(&pb, T, N, K, dr, format);   // dense layout, all on
 *   ...set strides, use_lengths, softcap, plan options...
 *   fwd_make_inputs(tc, &pb);          // q (gaps NaN), slots in [0, S), lengths = K, sink
 *   ...edit pb.slots / pb.lengths / q...
 *   fwd_make_cache(tc, &pb);           // used rows: random bf16 via smla_cache_write on the
 *                                      // CPU (FP8_DS: each group of each row its own
 *                                      // magnitude, so scales differ; foreign_ds: the
 *                                      // tests' own writer); every other row (and scale) NaN
 *   fwd_run(tc, &pb);                  // ref + every backend, checks, bitwise repeat
 *   fwd_free(&pb);
 */
#ifndef SMLA_TEST_FWD_H
#define SMLA_TEST_FWD_H

#include "harness.h"

#define FWD_DESCRIBE_BYTES SMLA_DESCRIBE_MAX

typedef struct {
  /* shapes */
  int64_t T;
  int N, K, dr;
  smla_cache_format format;
  int64_t S;                 /* cache slots */
  int64_t row_bytes;         /* >= the format's row size */
  float scale;               /* FP8_TENSOR cache scale */
  /* layout, in elements. q_concat: q_pe lives in q_nope's buffer at offset 512 (one
   * [T][N][512 + dr] q); qn_* then describe that buffer and qp_* are set equal. */
  int q_concat;
  int64_t qn_st, qn_sh, qp_st, qp_sh;
  int64_t slots_stride, out_st, out_sh, lse_st, ml_st;
  /* op options */
  float sm_scale, softcap;
  int use_lengths, use_sink;          /* pass lengths / sink (else NULL) */
  /* FP8_DS only: 1 = the used rows are written by the tests' own foreign writer
   * (fwd_make_cache), not by smla_cache_write: plain amax/448 group scales (not powers of
   * two), group magnitudes 2^-20..2^8, saturated groups, all-zero groups with scale 0. */
  int foreign_ds;
  int want_lse, want_ml, want_bad;    /* pass lse / max_logit / bad_inputs (else NULL) */
  /* plan options */
  int64_t max_tokens;                 /* the plan's max T (>= T) */
  int num_splits;                     /* 0: the plan picks */
  int heads_per_block;                /* 0: the plan picks (desc.heads_per_block) */
  uint32_t flags;
  int caller_workspace;               /* 1: workspace from smla_plan_workspace_size */
  int repeat;                         /* >= 2: run again on the same plan and on a new
                                         plan; outputs must be bitwise equal */
  /* host data (fwd_make_inputs, fwd_make_cache) */
  uint16_t *qn_buf;                   /* q_nope (and q_pe when q_concat) */
  int64_t qn_elems;
  uint16_t *qp_buf;                   /* q_pe, own buffer (NULL when concat or dr == 0) */
  int64_t qp_elems;
  int32_t *slots;                     /* span(T, slots_stride, K) */
  int64_t slots_elems;
  int32_t *lengths;                   /* [T] */
  float *sink;                        /* [N] */
  uint8_t *cache;                     /* [S][row_bytes] */
  /* smla_forward_indices (fwd_use_indices): the forward reads request-local indices and a
   * block table instead of slots; pb->slots holds their conversion (what the reference
   * and the bitwise comparison with smla_forward read). */
  int use_indices;
  int ix_R, ix_B, ix_bs, ix_cp_size, ix_cp_rank, ix_cp_interleave;
  int64_t ix_bt_stride, ix_local_stride;
  int32_t *ix_req;                    /* [T] */
  int32_t *ix_bt;                     /* span(R, bt_stride, B) */
  int32_t *ix_local;                  /* span(T, local_stride, K) */
} fwd_problem;

/* Dense layout, BF16-style defaults: S = 2K + 61 (>= 128), sm_scale = 6 / sqrt(Dqk)
 * (peaked, not one-hot, for q and latent uniform in [-1, 1]), lse + max_logit + bad on. */
void fwd_defaults(fwd_problem *pb, int64_t T, int N, int K, int dr, smla_cache_format format);
void fwd_make_inputs(fwd_problem *pb);
/* After fwd_make_inputs, before fwd_make_cache: request-local indices over blocks of bs
 * slots (cp_size >= 2: rank cp_rank's share, runs of `interleave`), with every kind of
 * invalid entry (negative positions, positions past the block table, -1 blocks, request
 * ids out of range, blocks past the cache: bad inputs), and pb->slots := their conversion
 * by the reference convert. */
void fwd_use_indices(fwd_problem *pb, int bs, int cp_size, int cp_rank, int interleave);
/* Returns 0, or -1 after recording a failure (smla_cache_write on the CPU failed). */
int fwd_make_cache(t_case *tc, fwd_problem *pb);
void fwd_free(fwd_problem *pb);

/* Element pointers into the host inputs. */
uint16_t *fwd_q_nope(fwd_problem *pb, int64_t t, int h);
uint16_t *fwd_q_pe(fwd_problem *pb, int64_t t, int h);
int32_t *fwd_slot_row(fwd_problem *pb, int64_t t);

/* Dense reference results. */
typedef struct {
  double *out;       /* [T][N][512] */
  double *lse, *ml;  /* [T][N] */
  uint64_t bad;
  int source; /* FWD_EXACT (fwd_reference), else the device whose result it is (fwd_as_ref) */
  /* [T][N][512] sum_j p_j |v_j| of the exact reference (ref_forward's pabs): owned by an
   * exact reference; a backend's result borrows its exact reference's (set it after
   * fwd_as_ref) so that comparisons involving a CUDA side can bound P's rounding. */
  double *pabs;
} fwd_ref;
#define FWD_EXACT (-2)
void fwd_reference(const fwd_problem *pb, fwd_ref *r);
void fwd_ref_free(fwd_ref *r);

/* What one backend produced: the raw strided output buffers, downloaded. */
typedef struct {
  uint16_t *out;  int64_t out_elems;
  float *lse;     int64_t lse_elems;
  float *ml;      int64_t ml_elems;
  uint64_t bad;
  int device;                        /* SMLA_DEVICE_CPU or the CUDA device it ran on */
  char describe[FWD_DESCRIBE_BYTES]; /* smla_plan_describe of the plan used */
  /* pb->repeat >= 2: the same forward again on the same plan, outputs re-poisoned */
  uint16_t *out2;
  float *lse2, *ml2;
  uint64_t bad2;
} fwd_result;
void fwd_result_free(fwd_result *r);

/* Runs pb once on the backend checks are charged to (plan, upload, poison, forward,
 * download). Returns 1 on success; on failure records it and returns 0. */
int fwd_exec(t_case *tc, const fwd_problem *pb, fwd_result *res);
/* Same on an explicit host (CPU) context without charging a case: for worker threads.
 * Returns SMLA_OK or the failing status (err says what failed). */
smla_status fwd_exec_host(smla_context *ctx, const fwd_problem *pb, fwd_result *res,
                          char *err, size_t err_bytes);
/* Checks a result against a reference (r may come from fwd_reference or fwd_as_ref). */
void fwd_check(t_case *tc, const fwd_problem *pb, const fwd_result *res, const fwd_ref *r,
               const char *against);
/* A backend's result widened into a fwd_ref, to compare one backend with another. */
void fwd_as_ref(const fwd_problem *pb, const fwd_result *res, fwd_ref *r);
/* Bitwise equality of two results (determinism, concurrency). */
void fwd_check_same(t_case *tc, const fwd_problem *pb, const fwd_result *a,
                    const fwd_result *b, const char *what);
/* The whole check on every backend: ref, each backend vs ref, CUDA also vs CPU, repeat. */
void fwd_run(t_case *tc, fwd_problem *pb);

#endif /* SMLA_TEST_FWD_H */
