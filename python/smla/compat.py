"""Drop-in entry points with the signatures of other libraries' sparse MLA functions.

    from smla.compat import flash_mla_sparse_fwd     # instead of: from flash_mla import ...
"""

import math

from . import _ops
from ._arrays import Tensor, torch

_LOG2E = 1.0 / math.log(2.0)


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                         *, log2_units=False):
    """FlashMLA's sparse prefill (`flash_mla.flash_mla_sparse_fwd`), computed by smla.

    Args (FlashMLA's shapes):
        q: [s_q, h_q, d_qk] bfloat16; d_qk 576 (rope 64, DeepSeek-V3.2) or 512 (NoPE).
        kv: [s_kv, h_kv, d_qk] bfloat16, h_kv = 1 (MLA shares one latent row per token).
        indices: [s_q, h_kv, topk] int32; -1 or any value >= s_kv (or < -1) is invalid
            (masked), wherever it sits in the row.
        sm_scale: float.
        d_v: 512 (the only value FlashMLA allows too).
        attn_sink: optional [h_q] float32: out is multiplied by exp(lse) / (exp(lse) +
            exp(attn_sink)); -inf has no effect, +inf zeroes the output; no effect on lse
            and max_logits.
        topk_length: optional [s_q] int32: row i uses only indices[i, :, :topk_length[i]]
            (clamped to [0, topk]).
        log2_units: keyword-only, smla's addition, default False. True returns max_logits
            and lse in base-2 units (times log2(e)), as FlashMLA's first sparse release
            (2025-09, whose README defines lse with exp2/log2) did; False gives the natural
            log of the current FlashMLA reference (tests/ref.py: torch.logsumexp).

    Returns (out, max_logits, lse), as FlashMLA:
        out: [s_q, h_q, d_v] bfloat16.
        max_logits: [s_q, h_q] float32, the largest sm_scale * q.k over the used entries.
        lse: [s_q, h_q] float32, log-sum-exp of sm_scale * q.k over the used entries
            (natural log; the sink is not included).
        A row with no valid index: out = 0, max_logits = -inf, lse = +inf (FlashMLA's
        convention; smla.forward itself returns lse = -inf there).

    Differences from FlashMLA:
      - Any h_q in 1..128 and any topk >= 1 are accepted (FlashMLA: h_q 64 or 128, topk a
        multiple of its block); any GPU smla runs on (sm_80+) and the CPU too.
      - Indices past topk_length[i] are never read, so a NaN row there cannot leak into
        the output (FlashMLA warns that it can).
      - Numerics: bf16 products with float32 accumulation; results agree with FlashMLA's
        reference within bf16 rounding, not bit for bit.
      - Plans: the first call for a shape makes an smla plan (not during CUDA graph
        capture: call it once eagerly first, or see smla.prepare_plans).
      - Under torch.compile this is smla's custom op plus one masked_fill (the -inf ->
        +inf of empty rows).
    """
    if d_v != _ops.DC:
        _ops.fail("compat.flash_mla_sparse_fwd", "d_v", "must be 512, got %r" % (d_v,))
    if not isinstance(q, Tensor):
        _ops.fail("compat.flash_mla_sparse_fwd", "q", "expected a torch.Tensor, got %s"
                  % type(q).__name__, TypeError)
    if q.dim() != 3:
        _ops.fail("compat.flash_mla_sparse_fwd", "q", "expected [s_q, h_q, d_qk], got shape "
                  "%s" % (tuple(q.shape),))
    d_qk = q.shape[2]
    if d_qk not in (512, 576):
        _ops.fail("compat.flash_mla_sparse_fwd", "q", "d_qk must be 576 or 512, got %d" % d_qk)
    if kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != d_qk:
        _ops.fail("compat.flash_mla_sparse_fwd", "kv", "expected [s_kv, 1, %d], got shape %s"
                  % (d_qk, tuple(kv.shape)))
    if indices.dim() != 3 or indices.shape[1] != 1 or indices.shape[0] != q.shape[0]:
        _ops.fail("compat.flash_mla_sparse_fwd", "indices", "expected [s_q=%d, 1, topk], got "
                  "shape %s" % (q.shape[0], tuple(indices.shape)))
    if kv.dtype != torch.bfloat16:
        _ops.fail("compat.flash_mla_sparse_fwd", "kv", "expected dtype bfloat16, got %s"
                  % kv.dtype, TypeError)
    out, lse, max_logits = _ops.forward(
        q, None, kv, indices[:, 0, :], sm_scale=float(sm_scale), lengths=topk_length,
        sink=attn_sink, format="bf16", dr=d_qk - _ops.DC, return_lse=True,
        return_max_logit=True)
    if log2_units:
        lse = lse * _LOG2E
        max_logits = max_logits * _LOG2E
    lse.masked_fill_(lse == -math.inf, math.inf)
    return out, max_logits, lse
