/*
 * metadata.c: SPEC §5, the host-side per-row view of a batch (no device work).
 * One pass over the requests; O(R + T). Inputs are validated completely before any output
 * is written, so a malformed batch leaves the outputs untouched.
 */
#include "internal.h"

#include <string.h>

smla_status smla_build_metadata(smla_context *ctx, const smla_metadata_params *p) {
  const char *fn = "smla_build_metadata";
  if (!p) return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
  const int64_t T = p->num_tokens;
  const int R = p->num_requests;
  if (T < 0 || T > INT32_MAX)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT,
                          "%s: num_tokens = %lld, must be 0..2^31-1", fn, (long long)T);
  if (R < 0)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: num_requests = %d, must be >= 0",
                          fn, R);
  if (p->topk < 1)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: topk = %d, must be >= 1", fn,
                          p->topk);
  if (!p->query_start_loc)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: query_start_loc is NULL", fn);
  if (R > 0 && !p->seq_lens)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: seq_lens is NULL", fn);
  if (T > 0 && !p->req_id)
    return smla_set_error(ctx, SMLA_ERR_INVALID_ARGUMENT, "%s: req_id is NULL", fn);

  const int32_t *qsl = p->query_start_loc;
  if (qsl[0] != 0)
    return smla_set_error(ctx, SMLA_ERR_MALFORMED, "%s: query_start_loc[0] = %d, must be 0", fn,
                          qsl[0]);
  for (int r = 0; r < R; r++) {
    if (qsl[r + 1] < qsl[r])
      return smla_set_error(ctx, SMLA_ERR_MALFORMED,
                            "%s: query_start_loc decreases at request %d (%d -> %d)", fn, r,
                            qsl[r], qsl[r + 1]);
    const int32_t q_len = qsl[r + 1] - qsl[r];
    if (q_len > 0 && p->seq_lens[r] < q_len)
      return smla_set_error(ctx, SMLA_ERR_MALFORMED,
                            "%s: request %d has seq_len %d < q_len %d", fn, r, p->seq_lens[r],
                            q_len);
  }
  if (qsl[R] > T)
    return smla_set_error(ctx, SMLA_ERR_MALFORMED,
                          "%s: last query start %d exceeds num_tokens = %lld", fn, qsl[R],
                          (long long)T);

  for (int r = 0; r < R; r++) {
    const int32_t q_len = qsl[r + 1] - qsl[r];
    for (int32_t j = 0; j < q_len; j++) {
      const int64_t t = qsl[r] + j;
      const int32_t c = p->seq_lens[r] - q_len + j + 1;
      p->req_id[t] = r;
      if (p->ctx_len) p->ctx_len[t] = c;
      if (p->limit) p->limit[t] = c < p->topk ? c : p->topk;
    }
  }
  for (int64_t t = qsl[R]; t < T; t++) { /* padding rows */
    p->req_id[t] = 0;
    if (p->ctx_len) p->ctx_len[t] = 0;
    if (p->limit) p->limit[t] = 0;
  }
  return SMLA_OK;
}
