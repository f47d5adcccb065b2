"""smla: sparse MLA attention (DeepSeek Sparse Attention) from Python.

A ctypes binding over libsmla (no C++ extension). Every operation of the SPEC takes torch
tensors (CPU or CUDA) or numpy arrays (CPU) with keyword arguments:

    smla.convert_indices(req_id, block_table, local, block_size=64)   -> slots
    smla.cache_write(kv_c, k_pe, slot, cache)                          -> None (in place)
    smla.forward(q_nope, q_pe, cache, slots, sm_scale=..., return_lse=True) -> out, lse
    smla.forward_indices(q_nope, q_pe, cache, req_id, block_table, local, block_size=64)
                                      -> out (the two above in one call, one launch on a GPU)
    smla.merge_states(out_p, lse_p)                                    -> out
    smla.build_metadata(query_start_loc, seq_lens, num_tokens=T, topk=K)
                                                                       -> req_id, ctx_len, limit
    smla.Plan(num_heads, topk, dr, format, max_tokens, device)         (repeated forwards)
    smla.compat.flash_mla_sparse_fwd(q, kv, indices, sm_scale, ...)    (FlashMLA's signature)

With torch installed the operations are also torch.library custom ops (torch.ops.smla.*,
with fake implementations), so they trace under torch.compile(fullgraph=True) and can be
captured in CUDA graphs; CUDA calls launch on torch's current stream. docs/python.md is
the guide.
"""

from . import _lib
from ._arrays import bf16_from_f32, f32_from_bf16, np_empty as empty_aligned, torch as _torch
from ._lib import SmlaError, library_path
from ._ops import (KVCache, Plan, build_metadata, cache_write, convert_indices, forward,
                   forward_indices, merge_states, prepare_plans, set_num_threads)

__version__ = "0.4.0"

# The header's constants, defined once in _lib (which mirrors include/smla.h).
from ._lib import (CACHE_BF16, CACHE_FP8_DS, CACHE_FP8_TENSOR, DC, MAX_HEADS,  # noqa: E402
                   PLAN_BATCH_INVARIANT, PLAN_PORTABLE, PLAN_SEPARATE_MERGE)
# True when torch was importable (and SMLA_NO_TORCH is not 1): torch tensors and the
# torch.ops.smla custom ops are then available.
HAVE_TORCH = _torch is not None


def version():
    """The library's version string (smla_version_string), e.g. "0.4.0"."""
    return _lib.version_string()


def build_features():
    """The library's build features, e.g. "cpu threads cuda sm_80 sm_90"."""
    return _lib.build_features()


def has_cuda():
    """True when libsmla was built with its CUDA backend (not whether a GPU is present)."""
    return "cuda" in build_features().split()


def cache_row_size(format, dr):
    """Bytes of one cache row of `format` ("bf16", "fp8_tensor", "fp8_ds") with dr 64/0."""
    from ._ops import format_code
    return int(_lib.lib.smla_cache_row_size(format_code(format, "cache_row_size"), int(dr)))


if _torch is not None:
    from . import _torch_ops  # noqa: F401  (registers torch.ops.smla.*)

from . import compat  # noqa: E402,F401

__all__ = [
    "KVCache", "Plan", "SmlaError", "bf16_from_f32", "build_features", "build_metadata",
    "cache_row_size", "cache_write", "compat", "convert_indices", "empty_aligned",
    "f32_from_bf16", "forward", "forward_indices", "has_cuda", "library_path", "merge_states", "prepare_plans",
    "set_num_threads", "version", "CACHE_BF16", "CACHE_FP8_TENSOR", "CACHE_FP8_DS",
    "PLAN_BATCH_INVARIANT", "PLAN_PORTABLE", "PLAN_SEPARATE_MERGE", "DC", "MAX_HEADS", "HAVE_TORCH",
]
