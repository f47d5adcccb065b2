"""Array arguments: torch tensors (CPU or CUDA) and numpy arrays (CPU), seen the same way.

Each argument becomes (data pointer, shape, strides in elements, keep-alive object) after
its kind, dtype, rank, device and last-dimension contiguity are checked; errors name the
function and the argument. Everything else (alignment, stride rules, overlap) the C
library checks itself and names in its message.

numpy has no bfloat16: where smla wants bf16, a numpy argument may be
  - uint16 holding bf16 bit patterns (used as is: no copy),
  - ml_dtypes.bfloat16 (used as is), or
  - float32 / float64 (converted to bf16, round to nearest even: a copy).
bf16 outputs come back as uint16 arrays of bf16 bits; smla.f32_from_bf16 widens them.
"""

import numpy as np

try:  # torch is optional: numpy on the CPU needs none of it
    import os as _os

    if _os.environ.get("SMLA_NO_TORCH") == "1":
        raise ImportError("SMLA_NO_TORCH=1")
    import torch
except ImportError:  # pragma: no cover - exercised in CI, which has no torch
    torch = None

TORCH = 1
NUMPY = 2

# dtype codes: short names used in checks and messages
_NP_CODES = {
    np.dtype(np.float32): "f32", np.dtype(np.float64): "f64", np.dtype(np.float16): "f16",
    np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.uint64): "u64",
    np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8", np.dtype(np.uint16): "u16",
}
_CODE_NAMES = {
    "bf16": "bfloat16", "f32": "float32", "f64": "float64", "f16": "float16",
    "i32": "int32", "i64": "int64", "u64": "uint64", "u8": "uint8", "i8": "int8",
    "u16": "uint16", "f8": "float8_e4m3fn",
}
_ITEMSIZE = {"bf16": 2, "f32": 4, "f64": 8, "f16": 2, "i32": 4, "i64": 8, "u64": 8,
             "u8": 1, "i8": 1, "u16": 2, "f8": 1}

if torch is not None:
    Tensor = torch.Tensor
    _T_CODES = {
        torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
        torch.float16: "f16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
        torch.int8: "i8",
    }
    for _n, _c in (("float8_e4m3fn", "f8"), ("uint64", "u64"), ("uint16", "u16")):
        if hasattr(torch, _n):
            _T_CODES[getattr(torch, _n)] = _c
else:
    Tensor = ()  # isinstance(x, ()) is always False
    _T_CODES = {}


def np_code(dt):
    c = _NP_CODES.get(dt)
    if c is None:
        name = dt.name
        if name == "bfloat16":
            return "bf16"
        if name == "float8_e4m3fn":
            return "f8"
    return c


def code_of(x):
    """dtype code of a tensor or array (None when smla has no use for its dtype)."""
    if isinstance(x, Tensor):
        return _T_CODES.get(x.dtype)
    return np_code(x.dtype)


def itemsize(code):
    return _ITEMSIZE[code]


def dtype_name(x):
    d = x.dtype
    return str(d).replace("torch.", "") if isinstance(x, Tensor) else d.name


def names(codes):
    return " or ".join(sorted(_CODE_NAMES.get(c, c) for c in codes))


def fail(fn, name, what, exc=ValueError):
    raise exc("smla.%s: %s: %s" % (fn, name, what))


def kind_of(x, fn, name):
    if isinstance(x, Tensor):
        return TORCH
    if isinstance(x, np.ndarray):
        return NUMPY
    fail(fn, name, "expected a torch.Tensor or numpy.ndarray, got %s" % type(x).__name__,
         TypeError)


def device_of(x):
    """-1 for host memory, the CUDA ordinal for a CUDA tensor."""
    if isinstance(x, Tensor):
        d = x.get_device()
        if d < 0 and x.device.type != "cpu":
            return None  # meta, mps, ...: not a device smla can read
        return d
    return -1


def dev_name(d):
    return "cpu" if d < 0 else "cuda:%d" % d


# ---- bf16 for numpy ---------------------------------------------------------------------------
def bf16_from_f32(a):
    """float32 (or anything numpy converts to it) -> uint16 array of bf16 bits, rounded to
    nearest even; NaN stays NaN (a quiet NaN of the same sign), +-inf stays +-inf."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def f32_from_bf16(a):
    """uint16 array of bf16 bits (or an ml_dtypes.bfloat16 array) -> float32 array (exact)."""
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    if a.dtype != np.uint16:
        raise TypeError("smla.f32_from_bf16: expected uint16 bf16 bits, got %s" % a.dtype)
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- host allocations that meet smla's alignment rule -------------------------------------------
def np_empty(shape, dtype, align=64):
    """An uninitialized numpy array whose data starts `align`-byte aligned (numpy's own
    allocator promises 16 bytes at most)."""
    dtype = np.dtype(dtype)
    count = 1
    for s in shape:
        count *= int(s)
    nbytes = count * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def np_aligned_copy(a, dtype=None):
    out = np_empty(a.shape, a.dtype if dtype is None else dtype)
    out[...] = a
    return out


# ---- the argument checks ----------------------------------------------------------------------------
def arg(x, fn, name, codes, ndim, kind, dev):
    """Checks one array argument; returns (pointer, shape, strides in elements, keep).

    `codes`: the accepted dtype codes ("bf16" accepts numpy uint16/float per the module
    doc). `ndim`: the rank, or None for any. `kind`/`dev`: what every argument of the call
    must be (the first array argument decides)."""
    if kind == TORCH:
        if not isinstance(x, Tensor):
            fail(fn, name, "expected a torch.Tensor like the other arguments, got %s"
                 % type(x).__name__, TypeError)
        c = _T_CODES.get(x.dtype)
        if c not in codes:
            fail(fn, name, "expected dtype %s, got %s" % (names(codes), dtype_name(x)),
                 TypeError)
        shape = x.shape
        if ndim is not None and len(shape) != ndim:
            fail(fn, name, "expected %d dimensions, got shape %s" % (ndim, tuple(shape)))
        st = x.stride()
        if shape and shape[-1] > 1 and st[-1] != 1 and x.numel():
            fail(fn, name, "the last dimension must be contiguous (stride 1), strides are %s"
                 % (tuple(st),))
        d = x.get_device()
        if d != dev:
            dd = device_of(x)
            fail(fn, name, "is on %s, the other arguments on %s"
                 % ("device " + str(x.device) if dd is None else dev_name(dd), dev_name(dev)))
        return x.data_ptr(), shape, st, x
    if not isinstance(x, np.ndarray):
        fail(fn, name, "expected a numpy.ndarray like the other arguments, got %s"
             % type(x).__name__, TypeError)
    c = np_code(x.dtype)
    if c not in codes:
        if "bf16" in codes and c == "u16":
            pass  # bf16 bits
        elif "bf16" in codes and c in ("f32", "f64"):
            x = bf16_from_f32(x)
            x = np_aligned_copy(x) if x.ctypes.data % 16 else x
        else:
            extra = " (numpy: uint16 bf16 bits, ml_dtypes.bfloat16 or float32)" \
                if "bf16" in codes else ""
            fail(fn, name, "expected dtype %s%s, got %s" % (names(codes), extra, x.dtype),
                 TypeError)
    shape = x.shape
    if ndim is not None and len(shape) != ndim:
        fail(fn, name, "expected %d dimensions, got shape %s" % (ndim, shape))
    isz = x.itemsize
    bst = x.strides
    if any(s % isz for s in bst):
        fail(fn, name, "strides %s (bytes) are not multiples of the element size %d"
             % (bst, isz))
    st = tuple(s // isz for s in bst)
    if shape and shape[-1] > 1 and st[-1] != 1 and x.size:
        fail(fn, name, "the last dimension must be contiguous (stride 1), strides are %s"
             % (st,))
    if not x.flags.writeable and name in ("out", "lse", "max_logit", "slots", "valid",
                                           "cache", "bad_inputs", "req_id", "ctx_len",
                                           "limit"):
        fail(fn, name, "is read-only")
    return x.ctypes.data, shape, st, x


def new(kind, dev, shape, code):
    """An output of `shape` and dtype code on the argument's device."""
    if kind == TORCH:
        dt = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32,
              "i64": torch.int64}[code]
        return torch.empty(shape, dtype=dt, device="cpu" if dev < 0 else "cuda:%d" % dev)
    npdt = {"bf16": np.uint16, "f32": np.float32, "i32": np.int32, "i64": np.int64}[code]
    return np_empty(shape, npdt)
