"""The C library: finding it, loading it, and its structs as ctypes declares them.

Everything here mirrors include/smla.h one to one (same names, same field order). The
struct sizes are checked against the C compiler's in python/tests/test_lib.py.

Where the library comes from, first match wins:
  1. the SMLA_LIBRARY environment variable (a path to libsmla.so);
  2. the in-tree build, python/smla/../../build/libsmla.so (after `make` at the root);
  3. a copy packaged next to this module (smla/libsmla.so, e.g. a wheel that bundles it);
  4. ctypes.util.find_library("smla") (an installed libsmla, `make install`).
"""

import ctypes
import ctypes.util
import os
import struct

__all__ = ["lib", "library_path", "SmlaError", "check"]

c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_uint32 = ctypes.c_uint32
c_float = ctypes.c_float
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p

# ---- status codes (pinned values, smla_status) ------------------------------------------
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_MISALIGNED = 2
ERR_UNSUPPORTED = 3
ERR_NO_CUDA = 4
ERR_NO_DEVICE = 5
ERR_CUDA = 6
ERR_OUT_OF_MEMORY = 7
ERR_WORKSPACE = 8
ERR_CAPTURING = 9
ERR_PLAN_MISMATCH = 10
ERR_MALFORMED = 11
ERR_INTERNAL = 12

STATUS_NAMES = {
    0: "SMLA_OK", 1: "SMLA_ERR_INVALID_ARGUMENT", 2: "SMLA_ERR_MISALIGNED",
    3: "SMLA_ERR_UNSUPPORTED", 4: "SMLA_ERR_NO_CUDA", 5: "SMLA_ERR_NO_DEVICE",
    6: "SMLA_ERR_CUDA", 7: "SMLA_ERR_OUT_OF_MEMORY", 8: "SMLA_ERR_WORKSPACE",
    9: "SMLA_ERR_CAPTURING", 10: "SMLA_ERR_PLAN_MISMATCH", 11: "SMLA_ERR_MALFORMED",
    12: "SMLA_ERR_INTERNAL",
}

# ---- cache formats, dtypes, plan flags, devices -------------------------------------------
CACHE_BF16 = 0
CACHE_FP8_TENSOR = 1
CACHE_FP8_DS = 2
DTYPE_BF16 = 0
DTYPE_F32 = 1
PLAN_BATCH_INVARIANT = 1
PLAN_PORTABLE = 2
PLAN_SEPARATE_MERGE = 4
DEVICE_CPU = -1
DC = 512          # SMLA_DC: latent width, also the value width
MAX_HEADS = 128   # SMLA_MAX_HEADS


class SmlaError(RuntimeError):
    """A call into libsmla failed. `status` is the smla_status value, `status_name` its
    enum name, `message` the context's detail message (names the bad argument)."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "status %d" % self.status)
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


# ---- structs -------------------------------------------------------------------------------
class smla_cache(ctypes.Structure):
    _fields_ = [
        ("format", c_int),
        ("dr", c_int),
        ("num_slots", c_int64),
        ("row_bytes", c_int64),
        ("data", c_void_p),
        ("scale", c_float),
    ]


class smla_convert_params(ctypes.Structure):
    _fields_ = [
        ("num_tokens", c_int64),
        ("topk", c_int),
        ("req_id", c_void_p),
        ("block_table", c_void_p),
        ("num_requests", c_int),
        ("blocks_per_request", c_int),
        ("block_table_stride", c_int64),
        ("block_size", c_int),
        ("local", c_void_p),
        ("local_stride", c_int64),
        ("slots", c_void_p),
        ("slots_stride", c_int64),
        ("valid", c_void_p),
        ("compact", c_int),
        ("cp_size", c_int),
        ("cp_rank", c_int),
        ("cp_interleave", c_int),
    ]


class smla_cache_write_params(ctypes.Structure):
    _fields_ = [
        ("num_tokens", c_int64),
        ("kv_c", c_void_p),
        ("kv_c_stride", c_int64),
        ("k_pe", c_void_p),
        ("k_pe_stride", c_int64),
        ("slot", c_void_p),
        ("cache", smla_cache),
        ("bad_inputs", c_void_p),
    ]


class smla_plan_desc(ctypes.Structure):
    _fields_ = [
        ("max_tokens", c_int64),
        ("num_heads", c_int),
        ("topk", c_int),
        ("dr", c_int),
        ("format", c_int),
        ("flags", c_uint32),
        ("num_splits", c_int),
        ("heads_per_block", c_int),
    ]


class smla_forward_params(ctypes.Structure):
    _fields_ = [
        ("num_tokens", c_int64),
        ("num_heads", c_int),
        ("topk", c_int),
        ("q_nope", c_void_p),
        ("q_nope_stride_t", c_int64),
        ("q_nope_stride_h", c_int64),
        ("q_pe", c_void_p),
        ("q_pe_stride_t", c_int64),
        ("q_pe_stride_h", c_int64),
        ("cache", smla_cache),
        ("slots", c_void_p),
        ("slots_stride", c_int64),
        ("lengths", c_void_p),
        ("sm_scale", c_float),
        ("softcap", c_float),
        ("sink", c_void_p),
        ("out", c_void_p),
        ("out_stride_t", c_int64),
        ("out_stride_h", c_int64),
        ("lse", c_void_p),
        ("lse_stride_t", c_int64),
        ("max_logit", c_void_p),
        ("max_logit_stride_t", c_int64),
        ("bad_inputs", c_void_p),
    ]


class smla_merge_params(ctypes.Structure):
    _fields_ = [
        ("num_partials", c_int),
        ("num_tokens", c_int64),
        ("num_heads", c_int),
        ("dv", c_int),
        ("out_p", c_void_p),
        ("out_p_dtype", c_int),
        ("out_p_stride_p", c_int64),
        ("out_p_stride_t", c_int64),
        ("out_p_stride_h", c_int64),
        ("lse_p", c_void_p),
        ("lse_p_stride_p", c_int64),
        ("lse_p_stride_t", c_int64),
        ("out", c_void_p),
        ("out_dtype", c_int),
        ("out_stride_t", c_int64),
        ("out_stride_h", c_int64),
        ("lse", c_void_p),
        ("lse_stride_t", c_int64),
        ("sink", c_void_p),
    ]


class smla_metadata_params(ctypes.Structure):
    _fields_ = [
        ("num_tokens", c_int64),
        ("num_requests", c_int),
        ("topk", c_int),
        ("query_start_loc", c_void_p),
        ("seq_lens", c_void_p),
        ("req_id", c_void_p),
        ("ctx_len", c_void_p),
        ("limit", c_void_p),
    ]


# The sizes on LP64 (Linux x86_64 / aarch64), as the C compiler lays them out.
EXPECTED_SIZES = {
    "smla_cache": 40, "smla_convert_params": 112, "smla_cache_write_params": 96,
    "smla_plan_desc": 40, "smla_forward_params": 208, "smla_merge_params": 144,
    "smla_metadata_params": 56,
}


def packer(struct_type):
    """A struct.Struct that writes every field of `struct_type` (nested structs
    flattened, in declaration order) at its ctypes offset, in one pack_into call: about
    ten times faster than setting 30 ctypes fields one by one (the forward fast path)."""
    codes = {c_int: "i", c_int32: "i", c_int64: "q", c_uint32: "I", c_float: "f",
             c_void_p: "Q" if ctypes.sizeof(c_void_p) == 8 else "I"}
    fmt = ["="]
    pos = 0

    def walk(t, base):
        nonlocal pos
        for name, ft in t._fields_:
            off = base + getattr(t, name).offset
            if issubclass(ft, ctypes.Structure):
                walk(ft, off)
                continue
            if off > pos:
                fmt.append("%dx" % (off - pos))
            fmt.append(codes[ft])
            pos = off + ctypes.sizeof(ft)

    walk(struct_type, 0)
    if ctypes.sizeof(struct_type) > pos:
        fmt.append("%dx" % (ctypes.sizeof(struct_type) - pos))
    s = struct.Struct("".join(fmt))
    assert s.size == ctypes.sizeof(struct_type), (struct_type, s.size)
    return s


# ---- loading ---------------------------------------------------------------------------------
def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("SMLA_LIBRARY")
    if env:
        yield "SMLA_LIBRARY=" + env, env
        return  # an explicit choice is never silently replaced by another library
    yield "in-tree build", os.path.normpath(os.path.join(here, "..", "..", "build", "libsmla.so"))
    yield "packaged copy", os.path.join(here, "libsmla.so")
    found = ctypes.util.find_library("smla")
    yield "ctypes.util.find_library('smla')", found


def _load():
    tried = []
    for what, path in _candidates():
        if not path:
            tried.append("%s: not found" % what)
            continue
        if os.path.sep in path and not os.path.exists(path):
            tried.append("%s: %s does not exist" % (what, path))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s: %s: %s" % (what, path, e))
    raise ImportError(
        "smla: cannot load libsmla. Tried, in order:\n  " + "\n  ".join(tried) +
        "\nBuild it with `make lib` at the repository root, or set SMLA_LIBRARY to the "
        "path of libsmla.so.")


lib, library_path = _load()

_P = c_void_p
_proto = {
    "smla_version": (ctypes.c_uint, []),
    "smla_version_string": (c_char_p, []),
    "smla_build_features": (c_char_p, []),
    "smla_status_string": (c_char_p, [c_int]),
    "smla_cache_row_size": (c_size_t, [c_int, c_int]),
    "smla_context_create": (c_int, [ctypes.POINTER(c_void_p), c_int]),
    "smla_context_destroy": (None, [_P]),
    "smla_context_device": (c_int, [_P]),
    "smla_context_message": (c_char_p, [_P]),
    "smla_context_set_num_threads": (c_int, [_P, c_int]),
    "smla_cuda_device_count": (c_int, []),
    "smla_cuda_device_name": (c_int, [c_int, c_char_p, c_size_t]),
    "smla_convert_indices": (c_int, [_P, _P, _P]),
    "smla_cache_write": (c_int, [_P, _P, _P]),
    "smla_plan_workspace_size": (c_int, [_P, _P, ctypes.POINTER(c_size_t)]),
    "smla_plan_create": (c_int, [_P, _P, _P, c_size_t, ctypes.POINTER(c_void_p)]),
    "smla_plan_destroy": (None, [_P]),
    "smla_plan_describe": (c_char_p, [_P]),
    "smla_forward": (c_int, [_P, _P, _P]),
    "smla_forward_indices": (c_int, [_P, _P, _P, _P]),
    "smla_merge_states": (c_int, [_P, _P, _P]),
    "smla_build_metadata": (c_int, [_P, _P]),
}
for _name, (_res, _args) in _proto.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


def message(ctx):
    m = lib.smla_context_message(ctx)
    return m.decode("utf-8", "replace") if m else ""


def check(status, ctx, what=None):
    """Raises SmlaError for a failed status, with the context's message."""
    if status != OK:
        msg = message(ctx) if ctx else ""
        if not msg:
            msg = (lib.smla_status_string(status) or b"").decode()
            if what:
                msg = "%s: %s" % (what, msg)
        raise SmlaError(status, msg)


def version_string():
    return lib.smla_version_string().decode()


def build_features():
    return lib.smla_build_features().decode()
