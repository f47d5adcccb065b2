"""The operations as torch.library custom ops (torch >= 2.4), for torch.compile.

Registered at `import smla` when torch is present:

  smla::forward(q_nope, q_pe?, cache, slots, lengths?, sink?, bad_inputs?, format, dr,
                scale, sm_scale, softcap, want_lse, want_max_logit, plan_id)
                -> (out, lse, max_logit)          [lse / max_logit are empty when not asked]
  smla::forward_out(..., out, lse?, max_logit?, ...)   mutates out, lse, max_logit
  smla::forward_indices_out(q_nope, q_pe?, cache, req_id, block_table, local, lengths?,
                            sink?, bad_inputs?, out, lse?, max_logit?, block_size, cp_size,
                            cp_rank, cp_interleave, format, dr, scale, sm_scale, softcap,
                            plan_id)   mutates out, lse, max_logit
  smla::convert_indices(req_id, block_table, local, block_size, compact, want_valid,
                        cp_size, cp_rank, cp_interleave) -> (slots, valid)
  smla::convert_indices_out(req_id, block_table, local, slots, valid?, block_size, compact,
                            cp_size, cp_rank, cp_interleave)
  smla::cache_write(kv_c, k_pe?, slot, cache, bad_inputs?, format, dr, scale)   mutates cache
  smla::merge_states(out_p, lse_p, out_bf16, want_lse, sink?) -> (out, lse)
  smla::merge_states_out(out_p, lse_p, out, lse?, sink?)
  smla::build_metadata(query_start_loc, seq_lens, num_tokens, topk) -> (req_id, ctx_len, limit)

Each has a fake (meta) implementation giving output shapes from input shapes, so that
dynamo traces through smla.forward & co. without a graph break. Outputs are allocated with
torch.empty (torch's caching allocator; the graph's pool under CUDA graph capture).

smla.forward() and the others call these ops only while torch.compile traces; in eager
mode they call the library directly (a call through the dispatcher and the op's Python
body costs ~50 µs more; python/bench_overhead.py shows it as `custom_op`).

Plans inside the ops: `plan_id` names an smla.Plan (0 = the cached plan for the shapes,
made on first use). A compiled graph run under CUDA graphs (mode="reduce-overhead") runs
eagerly first, which makes the plans before capture.
"""

import math
import sys
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _ops

DC = _ops.DC
HAVE_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library,
                                                                 "register_fake")

if HAVE_CUSTOM_OP:
    custom_op = torch.library.custom_op
else:  # pragma: no cover - torch < 2.4: eager works, torch.compile of smla calls does not
    custom_op = None


def _need_ops():
    if not HAVE_CUSTOM_OP:
        raise RuntimeError("smla under torch.compile needs torch >= 2.4 (torch.library."
                           "custom_op); this is torch %s" % torch.__version__)


if HAVE_CUSTOM_OP:
    # ---- forward ----------------------------------------------------------------------------
    @custom_op("smla::forward", mutates_args=("bad_inputs",))
    def forward_op(q_nope: Tensor, q_pe: Optional[Tensor], cache: Tensor, slots: Tensor,
                   lengths: Optional[Tensor], sink: Optional[Tensor],
                   bad_inputs: Optional[Tensor], format: int, dr: int, scale: float,
                   sm_scale: float, softcap: float, want_lse: bool, want_max_logit: bool,
                   plan_id: int) -> Tuple[Tensor, Tensor, Tensor]:
        T, N = q_nope.shape[0], q_nope.shape[1]
        dev = q_nope.device
        out = torch.empty((T, N, DC), dtype=torch.bfloat16, device=dev)
        lse = torch.empty((T, N) if want_lse else (0,), dtype=torch.float32, device=dev)
        mx = torch.empty((T, N) if want_max_logit else (0,), dtype=torch.float32, device=dev)
        _ops.forward_into(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format,
                          dr, scale, want_lse, want_max_logit, out, lse if want_lse else None,
                          mx if want_max_logit else None, bad_inputs,
                          _ops.plan_by_id(plan_id) if plan_id else None, None)
        return out, lse, mx

    @forward_op.register_fake
    def _forward_fake(q_nope, q_pe, cache, slots, lengths, sink, bad_inputs, format, dr, scale,
                      sm_scale, softcap, want_lse, want_max_logit, plan_id):
        T, N = q_nope.shape[0], q_nope.shape[1]
        out = q_nope.new_empty((T, N, DC), dtype=torch.bfloat16)
        lse = q_nope.new_empty((T, N) if want_lse else (0,), dtype=torch.float32)
        mx = q_nope.new_empty((T, N) if want_max_logit else (0,), dtype=torch.float32)
        return out, lse, mx

    @custom_op("smla::forward_out", mutates_args=("out", "lse", "max_logit", "bad_inputs"))
    def forward_out_op(q_nope: Tensor, q_pe: Optional[Tensor], cache: Tensor, slots: Tensor,
                       lengths: Optional[Tensor], sink: Optional[Tensor],
                       bad_inputs: Optional[Tensor], out: Tensor, lse: Optional[Tensor],
                       max_logit: Optional[Tensor], format: int, dr: int, scale: float,
                       sm_scale: float, softcap: float, plan_id: int) -> None:
        _ops.forward_into(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format,
                          dr, scale, lse is not None, max_logit is not None, out, lse,
                          max_logit, bad_inputs,
                          _ops.plan_by_id(plan_id) if plan_id else None, None)

    @forward_out_op.register_fake
    def _forward_out_fake(q_nope, q_pe, cache, slots, lengths, sink, bad_inputs, out, lse,
                          max_logit, format, dr, scale, sm_scale, softcap, plan_id):
        return None

    @custom_op("smla::forward_indices_out",
               mutates_args=("out", "lse", "max_logit", "bad_inputs"))
    def forward_indices_out_op(q_nope: Tensor, q_pe: Optional[Tensor], cache: Tensor,
                               req_id: Tensor, block_table: Tensor, local: Tensor,
                               lengths: Optional[Tensor], sink: Optional[Tensor],
                               bad_inputs: Optional[Tensor], out: Tensor, lse: Optional[Tensor],
                               max_logit: Optional[Tensor], block_size: int, cp_size: int,
                               cp_rank: int, cp_interleave: int, format: int, dr: int,
                               scale: float, sm_scale: float, softcap: float,
                               plan_id: int) -> None:
        _ops.forward_into(q_nope, q_pe, cache, local, sm_scale, lengths, softcap, sink, format,
                          dr, scale, lse is not None, max_logit is not None, out, lse,
                          max_logit, bad_inputs,
                          _ops.plan_by_id(plan_id) if plan_id else None, None,
                          fn="forward_indices", fast=False,
                          ix=(req_id, block_table, block_size, cp_size, cp_rank,
                              cp_interleave))

    @forward_indices_out_op.register_fake
    def _forward_indices_out_fake(q_nope, q_pe, cache, req_id, block_table, local, lengths,
                                  sink, bad_inputs, out, lse, max_logit, block_size, cp_size,
                                  cp_rank, cp_interleave, format, dr, scale, sm_scale, softcap,
                                  plan_id):
        return None

    # ---- convert indices --------------------------------------------------------------------
    @custom_op("smla::convert_indices", mutates_args=())
    def convert_op(req_id: Tensor, block_table: Tensor, local: Tensor, block_size: int,
                   compact: bool, want_valid: bool, cp_size: int = 0, cp_rank: int = 0,
                   cp_interleave: int = 1) -> Tuple[Tensor, Tensor]:
        slots = local.new_empty(local.shape)
        valid = local.new_empty((local.shape[0],) if want_valid else (0,))
        _ops.convert_into(req_id, block_table, local, block_size, compact, want_valid, slots,
                          valid if want_valid else None, None,
                          cp=(cp_size, cp_rank, cp_interleave))
        return slots, valid

    @convert_op.register_fake
    def _convert_fake(req_id, block_table, local, block_size, compact, want_valid, cp_size=0,
                      cp_rank=0, cp_interleave=1):
        return (local.new_empty(local.shape),
                local.new_empty((local.shape[0],) if want_valid else (0,)))

    @custom_op("smla::convert_indices_out", mutates_args=("slots", "valid"))
    def convert_out_op(req_id: Tensor, block_table: Tensor, local: Tensor, slots: Tensor,
                       valid: Optional[Tensor], block_size: int, compact: bool,
                       cp_size: int = 0, cp_rank: int = 0, cp_interleave: int = 1) -> None:
        _ops.convert_into(req_id, block_table, local, block_size, compact, valid is not None,
                          slots, valid, None, cp=(cp_size, cp_rank, cp_interleave))

    @convert_out_op.register_fake
    def _convert_out_fake(req_id, block_table, local, slots, valid, block_size, compact,
                          cp_size=0, cp_rank=0, cp_interleave=1):
        return None

    # ---- cache write --------------------------------------------------------------------------
    @custom_op("smla::cache_write", mutates_args=("cache", "bad_inputs"))
    def cache_write_op(kv_c: Tensor, k_pe: Optional[Tensor], slot: Tensor, cache: Tensor,
                       bad_inputs: Optional[Tensor], format: int, dr: int,
                       scale: float) -> None:
        _ops.cache_write_into(kv_c, k_pe, slot, cache, format, dr, scale, bad_inputs, None)

    @cache_write_op.register_fake
    def _cache_write_fake(kv_c, k_pe, slot, cache, bad_inputs, format, dr, scale):
        return None

    # ---- merge ------------------------------------------------------------------------------------
    @custom_op("smla::merge_states", mutates_args=())
    def merge_op(out_p: Tensor, lse_p: Tensor, out_bf16: bool, want_lse: bool,
                 sink: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        P, T, N, dv = out_p.shape
        out = out_p.new_empty((T, N, dv), dtype=torch.bfloat16 if out_bf16 else torch.float32)
        lse = lse_p.new_empty((T, N) if want_lse else (0,))
        _ops.merge_into(out_p, lse_p, out.dtype, want_lse, out, lse if want_lse else None,
                        None, sink=sink)
        return out, lse

    @merge_op.register_fake
    def _merge_fake(out_p, lse_p, out_bf16, want_lse, sink=None):
        P, T, N, dv = out_p.shape
        return (out_p.new_empty((T, N, dv),
                                dtype=torch.bfloat16 if out_bf16 else torch.float32),
                lse_p.new_empty((T, N) if want_lse else (0,)))

    @custom_op("smla::merge_states_out", mutates_args=("out", "lse"))
    def merge_out_op(out_p: Tensor, lse_p: Tensor, out: Tensor, lse: Optional[Tensor],
                     sink: Optional[Tensor] = None) -> None:
        _ops.merge_into(out_p, lse_p, out.dtype, lse is not None, out, lse, None, sink=sink)

    @merge_out_op.register_fake
    def _merge_out_fake(out_p, lse_p, out, lse, sink=None):
        return None

    # ---- metadata (host) ------------------------------------------------------------------------
    @custom_op("smla::build_metadata", mutates_args=())
    def metadata_op(query_start_loc: Tensor, seq_lens: Tensor, num_tokens: int,
                    topk: int) -> Tuple[Tensor, Tensor, Tensor]:
        return _ops.metadata_into(query_start_loc, seq_lens, num_tokens, topk, None, None,
                                  None)

    @metadata_op.register_fake
    def _metadata_fake(query_start_loc, seq_lens, num_tokens, topk):
        return tuple(query_start_loc.new_empty((num_tokens,)) for _ in range(3))


# ---- what smla.forward & co. call while dynamo traces ------------------------------------------
def _cache_args(cache, format, dr, scale, fn):
    if isinstance(cache, _ops.KVCache):
        return cache.data, cache.format, cache.dr, cache.scale
    if not isinstance(cache, Tensor):
        _ops.fail(fn, "cache", "expected a torch.Tensor or smla.KVCache, got %s"
                  % type(cache).__name__, TypeError)
    fmt, d, _, _ = _ops.cache_layout(cache.shape, cache.stride(), cache.element_size(), format,
                                     dr, fn)
    return cache, fmt, d, _ops._scale_value(fmt, scale, fn)


def forward_traced(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format, dr,
                   scale, return_lse, return_max_logit, out, lse, max_logit, bad_inputs, plan):
    _need_ops()
    data, fmt, d, sc = _cache_args(cache, format, dr, scale, "forward")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(DC + d)
    pid = plan.id if plan is not None else 0
    want_lse = return_lse or lse is not None
    want_max = return_max_logit or max_logit is not None
    if out is None and lse is None and max_logit is None:
        out, lse, max_logit = torch.ops.smla.forward(
            q_nope, q_pe, data, slots, lengths, sink, bad_inputs, fmt, d, float(sc),
            float(sm_scale), float(softcap), want_lse, want_max, pid)
    else:
        out, lse, max_logit = _forward_outputs(q_nope, out, lse, max_logit, want_lse, want_max)
        torch.ops.smla.forward_out(q_nope, q_pe, data, slots, lengths, sink, bad_inputs, out,
                                   lse, max_logit, fmt, d, float(sc), float(sm_scale),
                                   float(softcap), pid)
    if want_lse:
        return (out, lse, max_logit) if want_max else (out, lse)
    return (out, max_logit) if want_max else out


def _forward_outputs(q_nope, out, lse, max_logit, want_lse, want_max):
    """The outputs a forward writes: those given, the wanted rest allocated like q_nope."""
    T, N = q_nope.shape[0], q_nope.shape[1]
    if out is None:
        out = q_nope.new_empty((T, N, DC), dtype=torch.bfloat16)
    if want_lse and lse is None:
        lse = q_nope.new_empty((T, N), dtype=torch.float32)
    if want_max and max_logit is None:
        max_logit = q_nope.new_empty((T, N), dtype=torch.float32)
    return out, lse, max_logit


def forward_indices_traced(q_nope, q_pe, cache, req_id, block_table, local, block_size,
                           cp_size, cp_rank, cp_interleave, sm_scale, lengths, softcap, sink,
                           format, dr, scale, return_lse, return_max_logit, out, lse,
                           max_logit, bad_inputs, plan):
    _need_ops()
    data, fmt, d, sc = _cache_args(cache, format, dr, scale, "forward_indices")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(DC + d)
    want_lse = return_lse or lse is not None
    want_max = return_max_logit or max_logit is not None
    out, lse, max_logit = _forward_outputs(q_nope, out, lse, max_logit, want_lse, want_max)
    torch.ops.smla.forward_indices_out(
        q_nope, q_pe, data, req_id, block_table, local, lengths, sink, bad_inputs, out, lse,
        max_logit, int(block_size), int(cp_size), int(cp_rank), int(cp_interleave), fmt, d,
        float(sc), float(sm_scale), float(softcap), plan.id if plan is not None else 0)
    if want_lse:
        return (out, lse, max_logit) if want_max else (out, lse)
    return (out, max_logit) if want_max else out


def convert_traced(req_id, block_table, local, block_size, compact, return_valid, slots,
                   valid, cp=(0, 0, 1)):
    _need_ops()
    want_valid = return_valid or valid is not None
    if slots is None and valid is None:
        slots, valid = torch.ops.smla.convert_indices(req_id, block_table, local,
                                                      int(block_size), bool(compact),
                                                      want_valid, *cp)
    elif slots is local:
        # In place: the functional op, then a copy (an op may not mutate an input that
        # another argument of it aliases).
        s, v = torch.ops.smla.convert_indices(req_id, block_table, local, int(block_size),
                                              bool(compact), want_valid, *cp)
        local.copy_(s)
        if valid is not None:
            valid.copy_(v)
        else:
            valid = v
    else:
        if slots is None:
            slots = local.new_empty(local.shape)
        if want_valid and valid is None:
            valid = local.new_empty((local.shape[0],))
        torch.ops.smla.convert_indices_out(req_id, block_table, local, slots, valid,
                                           int(block_size), bool(compact), *cp)
    return (slots, valid) if want_valid else slots


def cache_write_traced(kv_c, k_pe, slot, cache, format, dr, scale, bad_inputs):
    _need_ops()
    data, fmt, d, sc = _cache_args(cache, format, dr, scale, "cache_write")
    torch.ops.smla.cache_write(kv_c, k_pe, slot, data, bad_inputs, fmt, d, float(sc))


def merge_traced(out_p, lse_p, out_dtype, return_lse, out, lse, sink=None):
    _need_ops()
    want_lse = return_lse or lse is not None
    if out is None and lse is None:
        oc = _ops._dtype_code(out_dtype, "merge_states")
        bf16 = (out_p.dtype == torch.bfloat16) if oc is None else oc == "bf16"
        out, lse = torch.ops.smla.merge_states(out_p, lse_p, bf16, want_lse, sink)
    else:
        if out is None:
            oc = _ops._dtype_code(out_dtype, "merge_states")
            dt = out_p.dtype if oc is None else (torch.bfloat16 if oc == "bf16" else
                                                 torch.float32)
            out = out_p.new_empty(out_p.shape[1:], dtype=dt)
        if want_lse and lse is None:
            lse = lse_p.new_empty(lse_p.shape[1:])
        torch.ops.smla.merge_states_out(out_p, lse_p, out, lse, sink)
    return (out, lse) if want_lse else out


def metadata_traced(query_start_loc, seq_lens, num_tokens, topk, req_id, ctx_len, limit):
    _need_ops()
    r, c, lim = torch.ops.smla.build_metadata(query_start_loc, seq_lens, int(num_tokens),
                                              int(topk))
    outs = []
    for given, made in ((req_id, r), (ctx_len, c), (limit, lim)):
        if given is not None:
            given.copy_(made)
            made = given
        outs.append(made)
    return tuple(outs)


_ops.register_traced(sys.modules[__name__])  # _ops calls the *_traced forms through this
