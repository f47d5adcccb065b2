/*
 * smla.h: sparse MLA attention (DeepSeek Sparse Attention) for inference engines.
 *
 * This header is the manual. It is the only public header of the library; everything
 * under src/ is private. The contract every backend implements is the project SPEC as
 * summarized op by op below; docs/spec-choices.md lists what smla does where it is silent.
 *
 * Quick start (one decode step, from C):
 *
 *     smla_context *ctx;  smla_plan *plan;
 *     smla_context_create(&ctx, 0);                  // CUDA device 0 (SMLA_DEVICE_CPU: CPU)
 *     smla_plan_desc d = { .max_tokens = 64, .num_heads = 16, .topk = 2048,
 *                          .dr = 64, .format = SMLA_CACHE_BF16 };
 *     smla_plan_create(ctx, &d, NULL, 0, &plan);     // the plan allocates its workspace
 *     smla_convert_indices(ctx, &conv, stream);      // request-local -> cache slots
 *     smla_forward(plan, &fwd, stream);              // attention over the gathered rows
 *     ...
 *     smla_plan_destroy(plan);  smla_context_destroy(ctx);
 *
 * examples/decode_step.c is that step in full.
 *
 * Conventions (apply to every call):
 * - Every call returns an smla_status. Library code never prints, exits or aborts. On
 *   failure, smla_context_message() says which argument was wrong and why.
 * - Memory: data pointers are device pointers for a CUDA context and host pointers for a
 *   CPU context (smla_build_metadata is host-only on both). The caller owns all memory
 *   except a plan's own workspace when the plan was asked to allocate it.
 * - Streams: every call that launches work takes `stream` (a cudaStream_t, NULL = the
 *   legacy default stream). It is ignored on the CPU, where calls run to completion
 *   before they return. On a CUDA context, launching calls never synchronize, never
 *   allocate and never read device data on the host, so they can be captured in a CUDA
 *   graph. (The CPU backend allocates no memory either, but starts its worker threads per
 *   call.)
 * - Strides are in elements of the tensor's own type, one per outer dimension; the last
 *   dimension is contiguous. Any layout in which distinct indices address distinct
 *   elements is accepted, whatever the order of the strides: a head-major q (stride_t = Dc,
 *   stride_h = T * Dc, what torch's q.transpose(0, 1).contiguous().transpose(0, 1) gives)
 *   is as good as a token-major one. The check: taken by increasing stride, each stride
 *   must step over all that the dimensions of smaller stride span (the innermost run of
 *   the last dimension included; span = (count - 1) * stride + the inner span). A
 *   dimension of one element is free (its stride is not looked at). Strides must be >= 0
 *   and <= 2^40, and a tensor must span at most 2^48 elements (address arithmetic stays
 *   in int64). Anything else: SMLA_ERR_INVALID_ARGUMENT naming the stride. Distinct
 *   tensors are not checked against each other (except convert's slots and local); an
 *   output that overlaps an input gives unspecified results.
 * - Alignment: bf16 tensors of forward and cache write (q_nope, q_pe, out, kv_c, k_pe)
 *   must start 16-byte aligned and have strides that are multiples of 8 elements; cache
 *   data must be 16-byte aligned with row_bytes a multiple of 16; int32/int64/float arrays
 *   naturally aligned. Else SMLA_ERR_MISALIGNED naming the pointer or stride.
 * - Params structs: zero-initialize them ({0} or memset) and set what you use. Fields may
 *   be appended in minor versions; a zeroed new field keeps the old behaviour.
 * - Bad-input counters (`bad_inputs`, may be NULL) are uint64 in the same memory space as
 *   the data; calls add to them atomically and never reset them (the caller zeroes them).
 * - Statuses: each op's comment lists what it returns. A NULL ctx or plan returns
 *   SMLA_ERR_INVALID_ARGUMENT with no message (there is no context to hold one). With
 *   T = 0 an op only checks its scalar arguments and does nothing (pointers may be NULL).
 *   On a CUDA context every launching op may also return SMLA_ERR_CUDA (a launch or
 *   runtime failure; the message has the runtime's text).
 */
#ifndef SMLA_H
#define SMLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Version. Since v0.1.
 * ------------------------------------------------------------------------------------- */
/* Before 1.0 a minor version may change the ABI (a params struct may grow, as
 * smla_convert_params did in 0.2.0 and smla_merge_params in 0.3.0; 0.4.0 added
 * smla_forward_indices): rebuild against the header of the library you link. */
#define SMLA_VERSION_MAJOR 0
#define SMLA_VERSION_MINOR 4
#define SMLA_VERSION_PATCH 0
#define SMLA_VERSION_NUMBER \
  (SMLA_VERSION_MAJOR * 10000 + SMLA_VERSION_MINOR * 100 + SMLA_VERSION_PATCH)
#define SMLA_VERSION_STRING "0.4.0"

/* The version the library was built as (SMLA_VERSION_NUMBER of its header). */
unsigned smla_version(void);
const char *smla_version_string(void);
/* Build features, e.g. "cpu threads cuda sm_80 sm_90" or "cpu threads". Static string. */
const char *smla_build_features(void);

/* ---------------------------------------------------------------------------------------
 * Status codes. Values are pinned: they never change and are never reused.
 * ------------------------------------------------------------------------------------- */
typedef enum smla_status {
  SMLA_OK = 0,
  SMLA_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, shape, stride or value out of range */
  SMLA_ERR_MISALIGNED = 2,       /* a pointer, stride or row_bytes breaks the alignment rule */
  SMLA_ERR_UNSUPPORTED = 3,      /* a valid combination this backend does not implement */
  SMLA_ERR_NO_CUDA = 4,          /* a CUDA device was asked for; the library has no CUDA */
  SMLA_ERR_NO_DEVICE = 5,        /* no such CUDA device (or no GPU / driver) */
  SMLA_ERR_CUDA = 6,             /* a CUDA runtime call failed; the message has its text */
  SMLA_ERR_OUT_OF_MEMORY = 7,    /* host or device allocation failed */
  SMLA_ERR_WORKSPACE = 8,        /* caller's workspace is smaller than the plan needs */
  SMLA_ERR_CAPTURING = 9,        /* called during CUDA graph capture where not allowed */
  SMLA_ERR_PLAN_MISMATCH = 10,   /* forward params do not fit the plan (T, N, K, Dr, format) */
  SMLA_ERR_MALFORMED = 11,       /* malformed host metadata (decreasing starts, ...) */
  SMLA_ERR_INTERNAL = 12         /* a bug in smla: please report it */
} smla_status;

/* A static, readable name for a status ("invalid argument"). Never NULL. */
const char *smla_status_string(smla_status s);

/* ---------------------------------------------------------------------------------------
 * Cache formats. One row per slot, rows `row_bytes` apart (>= smla_cache_row_size()).
 *   BF16        Dc bf16 latent, then Dr bf16 rope                       1152 / 1024 bytes
 *   FP8_TENSOR  Dc+Dr e4m3; value = e4m3 * scale (one scale per cache)   576 /  512 bytes
 *   FP8_DS      Dc e4m3 in 4 groups of 128, 4 float32 group scales,
 *               then Dr bf16 rope (FlashMLA's V3.2 layout)               656 /  528 bytes
 * (sizes for Dr = 64 / Dr = 0). e4m3 is OCP FP8 E4M3FN (max 448, no infinities).
 * ------------------------------------------------------------------------------------- */
typedef enum smla_cache_format {
  SMLA_CACHE_BF16 = 0,
  SMLA_CACHE_FP8_TENSOR = 1,
  SMLA_CACHE_FP8_DS = 2
} smla_cache_format;

#define SMLA_DC 512         /* latent width Dc, also the value width Dv */
#define SMLA_MAX_HEADS 128  /* N is 1..128 */

/* Bytes of one row of `format` with `dr` rope dims (0 or 64); 0 if the pair is invalid. */
size_t smla_cache_row_size(smla_cache_format format, int dr);

/* A KV cache: S = num_slots rows of one format. */
/* Checked by every op that takes one (statuses as listed there): format one of the three
 * (else SMLA_ERR_INVALID_ARGUMENT), dr 0 or 64 (else SMLA_ERR_UNSUPPORTED), num_slots
 * 1..2^31-1 (slots are int32; 0 is an empty cache), row_bytes from the format's row size
 * up to 1 MiB and a multiple of 16 (else SMLA_ERR_MISALIGNED), data non-NULL and 16-byte
 * aligned, FP8_TENSOR scale finite and > 0. */
typedef struct smla_cache {
  smla_cache_format format;
  int dr;              /* rope dims: 64, or 0 for NoPE models */
  int64_t num_slots;   /* S = num_blocks * block_size, 1..2^31-1 */
  int64_t row_bytes;   /* bytes from one row to the next: smla_cache_row_size()..2^20,
                          a multiple of 16 */
  void *data;          /* [S][row_bytes], 16-byte aligned; read-only for forward */
  float scale;         /* FP8_TENSOR only: value = e4m3 * scale (finite, > 0) */
} smla_cache;

typedef enum smla_dtype { SMLA_DTYPE_BF16 = 0, SMLA_DTYPE_F32 = 1 } smla_dtype;

/* ---------------------------------------------------------------------------------------
 * Context: one per device. Caches the device's properties and holds the message of the
 * last failed call. A context is not thread-safe: use one context per thread, or
 * serialize the calls on it. Distinct contexts (also of one device) are independent.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_context smla_context;

#define SMLA_DEVICE_CPU (-1)

/* Creates a context for the CPU (device = SMLA_DEVICE_CPU) or CUDA device `device`
 * (an ordinal >= 0). Statuses: OK; INVALID_ARGUMENT (ctx NULL, device < -1); NO_CUDA
 * (library built without CUDA); NO_DEVICE (no such GPU); UNSUPPORTED (a GPU older than
 * sm_80); OUT_OF_MEMORY; CUDA. *ctx is NULL on failure, so there is no context message:
 * smla_cuda_device_name(device, ...) then says why (e.g. the CUDA runtime's answer: no
 * driver, driver too old). */
smla_status smla_context_create(smla_context **ctx, int device);
/* Frees the context; NULL is a no-op. Destroy its plans first. */
void smla_context_destroy(smla_context *ctx);
/* The device the context was created for (SMLA_DEVICE_CPU or an ordinal). */
int smla_context_device(const smla_context *ctx);
/* What went wrong in the last call that failed on this context ("" if none). The string
 * lives in the context until the next failing call. NULL ctx gives a static message. */
const char *smla_context_message(const smla_context *ctx);
/* CPU contexts: worker threads per call, 0..256 (0 = one per online core, at most 256:
 * the default). Plans made afterwards use it; existing plans keep theirs. Statuses: OK,
 * INVALID_ARGUMENT (NULL ctx, num_threads outside 0..256). Ignored by CUDA contexts. */
smla_status smla_context_set_num_threads(smla_context *ctx, int num_threads);
/* Number of CUDA devices visible (0 when built without CUDA or with no GPU). */
int smla_cuda_device_count(void);
/* Name of CUDA device `device` into buf (e.g. "NVIDIA H200, sm_90, 132 SMs"), or why
 * there is none. Statuses: OK; INVALID_ARGUMENT (buf NULL or buf_bytes 0); NO_CUDA;
 * NO_DEVICE; CUDA. */
smla_status smla_cuda_device_name(int device, char *buf, size_t buf_bytes);

/* ---------------------------------------------------------------------------------------
 * 1. Convert indices: request-local token positions -> cache slots.
 *   slots[t][k] = block_table[r][p / bs] * bs + p % bs   with r = req_id[t], p = local[t][k]
 * or -1 where the entry is invalid: p < 0, p / bs >= B, block_table entry < 0, or r outside
 * [0, R). A slot that would not fit in int32 is also invalid (-1).
 * compact != 0 moves the valid entries of each row to the front, in their order, -1 after.
 * Statuses: OK; INVALID_ARGUMENT (NULL ctx, params or array, a count or cp field out of
 * its range below, a stride that makes rows overlap (< K, < B), slots overlapping local
 * other than exactly in place); MISALIGNED (an int32 array not 4-byte aligned); CUDA.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_convert_params {
  int64_t num_tokens;            /* T, 0..2^31-1 */
  int topk;                      /* K >= 1: entries per row */
  const int32_t *req_id;         /* [T] request of each row */
  const int32_t *block_table;    /* [R][B] block ids, row stride block_table_stride */
  int num_requests;              /* R >= 1 */
  int blocks_per_request;        /* B >= 1 */
  int64_t block_table_stride;    /* >= B when R > 1 */
  int block_size;                /* bs >= 1 */
  const int32_t *local;          /* [T][K] request-local positions, row stride local_stride */
  int64_t local_stride;          /* >= K when T > 1 */
  int32_t *slots;                /* [T][K] out, row stride slots_stride; may alias local
                                    only when compact == 0 and the strides are equal */
  int64_t slots_stride;          /* >= K when T > 1 */
  int32_t *valid;                /* [T] out: valid entries per row; may be NULL */
  int compact;                   /* 0 or 1 */
  /* Decode context parallelism (0 or 1: off; zero-initialized params leave it off): the
   * request's tokens are spread over cp_size ranks in runs of cp_interleave (0 means 1):
   * position p lives on rank (p / I) % cp_size, at position (p / (I * cp_size)) * I + p % I
   * of that rank's own sequence (its block_table). This call is rank cp_rank's: entries
   * owned by another rank are invalid (-1; with compact = 1 they leave no holes and valid
   * counts this rank's entries, the row's local length for forward), owned ones are
   * converted at their local position. The same split as vLLM's DCP KV cache. */
  int cp_size;                   /* 0/1 off, else >= 2 ranks */
  int cp_rank;                   /* 0 <= cp_rank < cp_size */
  int cp_interleave;             /* I >= 1 (0: 1) tokens per run */
} smla_convert_params;

smla_status smla_convert_indices(smla_context *ctx, const smla_convert_params *p, void *stream);

/* ---------------------------------------------------------------------------------------
 * 2. Cache write (concat and cache): row slot[t] of the cache := (kv_c[t], k_pe[t]) in the
 * cache's format. slot < 0 is padding (skipped); slot >= S is skipped and counted in
 * bad_inputs. FP8_DS: each group of 128 gets scale 2^ceil(log2(max(amax/448, 1e-4))),
 * values rounded to nearest-even and saturated at +-448 (NaN stays NaN and is left out of
 * amax; +-Inf saturates). FP8_TENSOR: values / cache.scale, rounded and saturated alike.
 * Duplicate slots in one call: one of the writers wins, which one is unspecified.
 * Statuses: OK; INVALID_ARGUMENT (NULL ctx, params or array, T out of range, a bad cache
 * (see smla_cache), a stride that makes rows overlap); UNSUPPORTED (cache.dr not 0 or
 * 64); MISALIGNED (kv_c / k_pe not 16-byte aligned or a stride not a multiple of 8, slot
 * or bad_inputs not 8-byte aligned, cache data or row_bytes); CUDA.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_cache_write_params {
  int64_t num_tokens;            /* T, 0..2^31-1 */
  const void *kv_c;              /* [T][Dc] bf16, row stride kv_c_stride */
  int64_t kv_c_stride;           /* >= 512 when T > 1, a multiple of 8 */
  const void *k_pe;              /* [T][Dr] bf16, row stride k_pe_stride. Dr == 0 (NoPE):
                                    not read, may be NULL (or a zero-width [T][0] view) */
  int64_t k_pe_stride;           /* Dr == 64: >= 64 when T > 1, a multiple of 8; Dr == 0:
                                    ignored */
  const int64_t *slot;           /* [T] destination slot per row */
  smla_cache cache;              /* written */
  uint64_t *bad_inputs;          /* [1] += rows with slot >= S; may be NULL */
} smla_cache_write_params;

smla_status smla_cache_write(smla_context *ctx, const smla_cache_write_params *p, void *stream);

/* ---------------------------------------------------------------------------------------
 * 6. Plan: pick kernels and size the workspace from shapes alone (no device data, no sync).
 * A plan serves every forward whose T <= max_tokens and whose N, K, Dr, format match.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_plan smla_plan;

#define SMLA_PLAN_BATCH_INVARIANT 1u /* a row's result does not depend on T or other rows */
/* Use the portable kernels (CUDA: the sm_80 mma.sync ones) even where an architecture-
 * specific kernel exists (CUDA: the sm_90a wgmma one on H100/H200): for A/B comparisons
 * and tests. Same results within rounding; smla_plan_describe names the kernel chosen. */
#define SMLA_PLAN_PORTABLE 2u
/* Merge KV splits only with the separate combine kernel, never inside the forward (CUDA,
 * sm_90 devices: the wgmma kernel's cluster merge of 2..8 splits, and the generic kernel's
 * clusters of up to 8 splits merged over distributed shared memory, R of them a row merged
 * by the last to finish): for A/B comparisons and tests. Same results within rounding;
 * smla_plan_describe says which merge a plan uses. */
#define SMLA_PLAN_SEPARATE_MERGE 4u

typedef struct smla_plan_desc {
  int64_t max_tokens;            /* largest T the plan serves, 1..2^31-1 */
  int num_heads;                 /* N, 1..128 (SMLA_MAX_HEADS) */
  int topk;                      /* K, 1..2^24 */
  int dr;                        /* 64 or 0 (else SMLA_ERR_UNSUPPORTED) */
  smla_cache_format format;
  uint32_t flags;                /* SMLA_PLAN_* (other bits: SMLA_ERR_INVALID_ARGUMENT) */
  int num_splits;                /* KV splits per row, 0..1024: 0 = the plan chooses; > 0
                                    forces it (capped at what K allows; the CPU backend
                                    runs unsplit whatever it is) */
  int heads_per_block;           /* heads a block computes: 0 = the plan chooses (per T);
                                    8, 16, 32 or 64 forces at most that many, N running
                                    as ceil(N / it) head groups (CUDA; the generic kernel's
                                    narrowest block is 16 heads; the CPU backend ignores
                                    it): for A/B comparisons and tests. smla_plan_describe
                                    says what was chosen */
} smla_plan_desc;

/* Statuses of smla_plan_workspace_size and smla_plan_create: OK; INVALID_ARGUMENT (NULL
 * ctx, desc, bytes or plan, a desc field out of its range above); UNSUPPORTED (dr not 0
 * or 64; a GPU with too little shared memory for any kernel; max_tokens so large that one
 * launch would need more than 2^31-1 blocks); and for smla_plan_create also WORKSPACE
 * (workspace_bytes below the size), MISALIGNED (workspace not 256-byte aligned),
 * OUT_OF_MEMORY, CAPTURING, CUDA. The message names the desc field ("desc.topk"). */

/* Workspace bytes a plan of `desc` needs on ctx's device (may be 0). */
smla_status smla_plan_workspace_size(smla_context *ctx, const smla_plan_desc *desc,
                                     size_t *bytes);
/* Creates a plan. workspace == NULL: the plan allocates (and later frees) its own.
 * Else workspace must hold workspace_bytes >= smla_plan_workspace_size() bytes of device
 * memory (host memory for a CPU context), 256-byte aligned, owned by the caller and not
 * used by anything else while the plan lives. Plan creation may allocate and query the
 * device, so it is not allowed during CUDA graph capture. It returns SMLA_ERR_CAPTURING when
 * it sees a capture: one on a blocking stream (found by probing the legacy stream), or one
 * in global mode that makes its allocation fail. A capture on a non-blocking stream with a
 * caller-supplied workspace is not detected (then nothing is allocated or launched, so no
 * harm is done). Make plans before capture; forward is what gets captured. */
smla_status smla_plan_create(smla_context *ctx, const smla_plan_desc *desc, void *workspace,
                             size_t workspace_bytes, smla_plan **plan);
/* A plan's workspace holds the split-KV partials of the forward in flight: forwards on
 * one plan must be ordered (one stream, or events between streams). To overlap two
 * batches on two streams, make one plan for each. Where the CUDA forward merges its splits
 * inside the kernel across clusters (smla_plan_describe: "merged in-kernel (R clusters of
 * C)" with R > 1), the workspace also holds merge counters: smla_plan_create zeroes them
 * (a memset on the legacy stream, waited for) and every forward leaves them at zero, so
 * graph replays need nothing. A forward stopped by a device fault can leave them set:
 * destroy the plan and create it again (after a sticky CUDA error the context must be
 * re-created anyway). */
/* Frees the plan (and its own workspace); NULL is a no-op. */
void smla_plan_destroy(smla_plan *plan);
/* Which path the plan chose and why, e.g.
 * "cuda-generic: 16 heads per block, splits 32 (T*groups = 1 blocks < 2 waves of 132 SMs)".
 * The string lives as long as the plan; with its NUL it is at most SMLA_DESCRIBE_MAX bytes
 * (a buffer of that size holds any copy of it). */
#define SMLA_DESCRIBE_MAX 384
const char *smla_plan_describe(const smla_plan *plan);

/* ---------------------------------------------------------------------------------------
 * 3. Forward: sparse MLA attention. For every row t and head h, over the used entries i of
 * row t (0 <= slots[t][i] < S and i < lengths[t]):
 *   l_i = sm_scale * (q_nope[t][h] . ckv_i + q_pe[t][h] . kpe_i)   (then c*tanh(l_i/c) if
 *   softcap c > 0); m = max l_i; Z = sum exp(l_i - m);
 *   out[t][h] = sum exp(l_i - m) ckv_i / (Z + exp(sink[h] - m))     (sink term only if given)
 *   lse[t][h] = m + log Z (natural log, sink excluded); max_logit[t][h] = m.
 * A row with no used entry: out = 0, lse = max_logit = -inf. Duplicates count each time.
 * Entries >= S or < -1 inside lengths[t] are masked and counted in bad_inputs; entries
 * past lengths[t] are not read. A NaN logit (NaN in q or in a used cache row) makes that
 * (t, h)'s out, lse and max_logit NaN; nothing reads out of bounds.
 * Statuses: OK; INVALID_ARGUMENT (NULL plan, params or required pointer, T < 0, a bad
 * cache (see smla_cache), sm_scale not finite and > 0, softcap < 0 or not finite, a layout
 * whose rows overlap); PLAN_MISMATCH (T above the plan's max_tokens; N, K, cache.format or
 * cache.dr not the plan's); UNSUPPORTED (cache.dr not 0 or 64); MISALIGNED (a bf16
 * pointer not 16-byte aligned or bf16 stride not a multiple of 8, an int32/float array
 * not 4-byte, bad_inputs not 8-byte, cache data or row_bytes); INTERNAL; CUDA. A failed
 * call has written nothing.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_forward_params {
  int64_t num_tokens;            /* T, 0..the plan's max_tokens (T == 0: nothing to do) */
  int num_heads;                 /* N, must equal the plan's */
  int topk;                      /* K, must equal the plan's */
  const void *q_nope;            /* [T][N][Dc] bf16, strides q_nope_stride_t, _h in any
                                    order (token- or head-major), multiples of 8 */
  int64_t q_nope_stride_t, q_nope_stride_h;
  const void *q_pe;              /* [T][N][Dr] bf16; ignored (may be NULL) when Dr == 0.
                                    May point into q_nope's buffer ([T][N][576] q). */
  int64_t q_pe_stride_t, q_pe_stride_h;
  smla_cache cache;              /* read only */
  const int32_t *slots;          /* [T][K] cache slots, row stride slots_stride (>= K) */
  int64_t slots_stride;
  const int32_t *lengths;        /* [T] used prefix of each row, clamped to [0, K];
                                    may be NULL (all K) */
  float sm_scale;                /* finite and > 0, usually 1/sqrt(Dqk) */
  float softcap;                 /* > 0 and finite: logit = c * tanh(logit / c); 0: off */
  const float *sink;             /* [N] per-head logit in the denominator only; may be NULL */
  void *out;                     /* [T][N][Dv] bf16 out, strides out_stride_t, _h in any
                                    order, multiples of 8 */
  int64_t out_stride_t, out_stride_h;
  float *lse;                    /* [T][N] out, row stride lse_stride_t (>= N: heads are
                                    contiguous); may be NULL */
  int64_t lse_stride_t;
  float *max_logit;              /* [T][N] out, row stride max_logit_stride_t (>= N);
                                    may be NULL */
  int64_t max_logit_stride_t;
  uint64_t *bad_inputs;          /* [1] += entries >= S or < -1; may be NULL */
} smla_forward_params;

smla_status smla_forward(smla_plan *plan, const smla_forward_params *p, void *stream);

/* Forward from request-local indices (since v0.4): a decode step's index conversion and
 * forward in one call, one launch on a GPU (the kernel converts each entry as it reads it;
 * the CPU backend does the same, and neither allocates).
 * Computes exactly smla_convert_indices(indices with compact = 0, its context-parallel
 * filter included) followed by smla_forward on those slots, without the slots array:
 * p->slots must be NULL (p->slots_stride is ignored), indices->num_tokens must equal
 * p->num_tokens and indices->topk p->topk, indices->slots and ->valid must be NULL and
 * ->compact 0 (compaction moves entries, which only the separate convert does; its valid
 * counts are then the forward's lengths). An entry that converts to -1 is masked, not
 * counted; one that converts to a slot >= cache.num_slots is masked and counted in
 * bad_inputs, as in the two calls. req_id, block_table and local are read on the device
 * when the call runs, so a captured graph replays with them rewritten in place.
 * Statuses: smla_forward's and smla_convert_indices's, for the same causes. */
smla_status smla_forward_indices(smla_plan *plan, const smla_forward_params *p,
                                 const smla_convert_params *indices, void *stream);

/* ---------------------------------------------------------------------------------------
 * 4. Merge partial states (split-KV combine; decode context parallelism across GPUs).
 *   out[t][h] = sum_p w_p out_p[p][t][h],  w_p = exp(lse_p - lse),  lse = log sum exp lse_p
 * A partial with lse_p = -inf contributes nothing (its out_p is not read); all -inf:
 * out = 0, lse = -inf. A NaN or +inf lse_p makes that (t, h) NaN in out and lse.
 *
 * Sink (since v0.3). smla_forward with a sink returns out normalized with the sink in the
 * denominator and lse without it. Partials of such forwards (KV splits done by the
 * caller, context-parallel shards) are merged exactly by passing the same sink here:
 *   out[t][h] = sum_p w_p out_p[p][t][h],
 *   w_p = (exp(lse_p) + exp(sink[h])) / (exp(lse) + exp(sink[h]))
 * (computed as exp(logaddexp(lse_p, s) - logaddexp(lse, s)), which never overflows), so
 * that merging the parts of a sinked forward gives the sinked forward over the union:
 * out = sum exp(l_i - m) v_i / (Z + exp(sink - m)) over all parts' entries. lse is still
 * log sum exp lse_p (sink excluded), as forward's. Merging sinked partials without the
 * sink (sink = NULL) counts the sink once per part: wrong. Partials made without a sink
 * are merged with sink = NULL.
 * Statuses: OK; INVALID_ARGUMENT (NULL ctx, params or required pointer, a count out of
 * its range below, T * N >= 2^31, an unknown dtype, a layout whose rows overlap);
 * MISALIGNED (an array not aligned to its element size); CUDA.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_merge_params {
  int num_partials;              /* P >= 1 */
  int64_t num_tokens;            /* T, 0..2^31-1, with T * N < 2^31 */
  int num_heads;                 /* N, 1..65535 */
  int dv;                        /* value width, 1..512 (SMLA_DC for attention) */
  const void *out_p;             /* [P][T][N][dv] of out_p_dtype; the three strides in
                                    any order */
  smla_dtype out_p_dtype;
  int64_t out_p_stride_p, out_p_stride_t, out_p_stride_h;
  const float *lse_p;            /* [P][T][N], heads contiguous; the two strides in any
                                    order */
  int64_t lse_p_stride_p, lse_p_stride_t;
  void *out;                     /* [T][N][dv] of out_dtype; strides in any order */
  smla_dtype out_dtype;
  int64_t out_stride_t, out_stride_h;
  float *lse;                    /* [T][N], row stride lse_stride_t; may be NULL */
  int64_t lse_stride_t;
  const float *sink;             /* [N] the sink the partials' forwards were given (see
                                    above); NULL: partials without a sink. Since v0.3 */
} smla_merge_params;

smla_status smla_merge_states(smla_context *ctx, const smla_merge_params *p, void *stream);

/* ---------------------------------------------------------------------------------------
 * 5. Metadata (host only, no device work; ctx may be NULL). From the engine's request view
 * builds per row t < T: req_id[t], ctx_len[t] = seq_len - q_len + j + 1 for the j-th query
 * token of its request, and limit[t] = min(ctx_len[t], K). Rows past the last real token
 * are padding: req_id 0, ctx_len 0, limit 0. Requests with q_len 0 (padding requests,
 * whose start repeats the previous one) are skipped, whatever their seq_len.
 * Errors (SMLA_ERR_MALFORMED): query_start_loc[0] != 0, decreasing starts, last start > T,
 * seq_len < q_len for a request with q_len > 0. Statuses: OK; INVALID_ARGUMENT (NULL
 * params or required array, T outside 0..2^31-1, R < 0, K < 1); MALFORMED. Outputs are untouched on error.
 * ------------------------------------------------------------------------------------- */
typedef struct smla_metadata_params {
  int64_t num_tokens;            /* T (padded), 0..2^31-1 */
  int num_requests;              /* R >= 0 (may include padding requests) */
  int topk;                      /* K >= 1 */
  const int32_t *query_start_loc;/* [R+1] host */
  const int32_t *seq_lens;       /* [R] host; may be NULL when R == 0 */
  int32_t *req_id;               /* [T] host out */
  int32_t *ctx_len;              /* [T] host out; may be NULL */
  int32_t *limit;                /* [T] host out; may be NULL */
} smla_metadata_params;

smla_status smla_build_metadata(smla_context *ctx, const smla_metadata_params *p);

#ifdef __cplusplus
}
#endif
#endif /* SMLA_H */
