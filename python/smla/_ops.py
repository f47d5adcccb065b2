"""The operations of SPEC.md over torch tensors and numpy arrays, on libsmla via ctypes.

Layout: contexts (one per device, cached) -> caches (KVCache, the cache tensor's format
worked out once) -> plans (Plan, and the cache of plans forward() makes by itself) -> the
six operations. Each operation checks its arguments in Python (kind, dtype, rank, shape,
device, last-dimension contiguity), fills the C params struct and calls the library, which
checks the rest (alignment, stride rules, overlap) and names the argument it rejects.
"""

import ctypes
import math
import threading
import weakref

import numpy as np

from . import _lib
from ._arrays import NUMPY, TORCH, Tensor, arg, dev_name, fail, new, torch
from ._arrays import code_of, device_of, kind_of
from ._arrays import _T_CODES as _T_CODES_FAST

L = _lib.lib
DC = _lib.DC

_BF16 = frozenset(("bf16",))
_F32 = frozenset(("f32",))
_I32 = frozenset(("i32",))
_I64 = frozenset(("i64",))
_COUNTER = frozenset(("i64", "u64"))
_BF16_F32 = frozenset(("bf16", "f32"))
_f32 = torch.float32 if torch is not None else None
_ANY_BYTES = frozenset(("bf16", "f32", "f64", "f16", "i32", "i64", "u64", "u8", "i8",
                        "u16", "f8"))

if torch is not None:
    _is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if _is_compiling is None:  # torch < 2.3
        try:
            from torch._dynamo import is_compiling as _is_compiling
        except ImportError:  # pragma: no cover
            _is_compiling = None
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if _raw_stream is None:  # pragma: no cover - old torch
        def _raw_stream(d):
            return torch.cuda.current_stream(d).cuda_stream
else:
    _is_compiling = None
    _raw_stream = None


def _compiling():
    return _is_compiling is not None and _is_compiling()


# The traced (torch.compile) forms of the ops: smla._torch_ops registers itself here when
# torch is present (register_traced), so that this module never imports it (one direction:
# _torch_ops -> _ops).
_traced_ops = None


def register_traced(module):
    global _traced_ops
    _traced_ops = module


def _traced():
    if _traced_ops is None:  # pragma: no cover - smla/__init__ imports _torch_ops with torch
        raise RuntimeError("smla: torch.compile tracing needs smla._torch_ops (import smla)")
    return _traced_ops


_lock = threading.Lock()


# ---- devices and contexts --------------------------------------------------------------------------
def device_index(device):
    """'cpu' / -1 / None-less forms -> -1; 'cuda', 'cuda:N', N >= 0, torch.device -> N."""
    if isinstance(device, int):
        return device if device >= 0 else -1
    if torch is not None and isinstance(device, torch.device):
        if device.type == "cpu":
            return -1
        if device.type == "cuda":
            return device.index if device.index is not None else torch.cuda.current_device()
        raise ValueError("smla: device %s is not supported (cpu or cuda)" % device)
    if isinstance(device, str):
        if device == "cpu":
            return -1
        if device == "cuda":
            return torch.cuda.current_device() if torch is not None else 0
        if device.startswith("cuda:") and device[5:].isdigit():
            return int(device[5:])
    raise ValueError("smla: device %r is not supported: use 'cpu', 'cuda', 'cuda:N', an "
                     "ordinal or a torch.device" % (device,))


_contexts = {}
_cpu_threads = [0]


def context(dev):
    """The smla_context of device `dev` (-1 = CPU), created on first use and kept for the
    life of the process (plans refer to it)."""
    c = _contexts.get(dev)
    if c is not None:
        return c
    with _lock:
        c = _contexts.get(dev)
        if c is not None:
            return c
        h = ctypes.c_void_p()
        s = L.smla_context_create(ctypes.byref(h), dev)
        if s != _lib.OK:
            if s == _lib.ERR_NO_CUDA:
                msg = ("cuda:%d was asked for but %s was built without CUDA (features: %s); "
                       "rebuild it with nvcc on the PATH" % (dev, _lib.library_path,
                                                            _lib.build_features()))
            else:
                buf = ctypes.create_string_buffer(256)
                L.smla_cuda_device_name(dev, buf, 256)
                msg = "smla_context_create(%s): %s" % (dev_name(dev),
                                                      buf.value.decode("utf-8", "replace"))
            raise _lib.SmlaError(s, msg)
        if dev < 0 and _cpu_threads[0]:
            L.smla_context_set_num_threads(h, _cpu_threads[0])
        _contexts[dev] = h.value
        return h.value


def set_num_threads(num_threads):
    """Worker threads of CPU calls (0 = one per online core, the default). Plans made
    before keep the count they were made with; the CPU plan cache is cleared."""
    n = int(num_threads)
    c = context(-1)
    _lib.check(L.smla_context_set_num_threads(c, n), c)
    _cpu_threads[0] = n
    with _lock:
        for key in [k for k in _auto_plans if k[0] < 0]:
            del _auto_plans[key]


def _stream(stream, dev):
    if dev < 0:
        return None  # the CPU ignores streams
    if stream is None:
        return _raw_stream(dev)
    if isinstance(stream, int):
        return stream
    return stream.cuda_stream  # torch.cuda.Stream / ExternalStream


# ---- caches --------------------------------------------------------------------------------------------
FORMATS = {"bf16": _lib.CACHE_BF16, "fp8_tensor": _lib.CACHE_FP8_TENSOR,
           "fp8_ds": _lib.CACHE_FP8_DS}
FORMAT_NAMES = {v: k for k, v in FORMATS.items()}
# Bytes of a row per (format, dr): smla_cache_row_size().
ROW_SIZE = {(f, d): L.smla_cache_row_size(f, d) for f in (0, 1, 2) for d in (0, 64)}
# A row width (bytes) tells format and dr apart: all six sizes differ.
_FROM_WIDTH = {v: k for k, v in ROW_SIZE.items()}


def format_code(fmt, fn="forward"):
    if isinstance(fmt, str):
        c = FORMATS.get(fmt.lower())
        if c is None:
            fail(fn, "format", "%r is not one of %s" % (fmt, ", ".join(FORMATS)))
        return c
    if isinstance(fmt, int) and fmt in FORMAT_NAMES:
        return fmt
    fail(fn, "format", "%r is not a cache format (%s)" % (fmt, ", ".join(FORMATS)))


def cache_layout(shape, stride, isz, fmt, dr, fn, name="cache"):
    """(format, dr, num_slots, row_bytes) of a cache tensor of `shape`/`stride` (elements of
    `isz` bytes). The last dimension is one row (its bytes tell the format when `fmt` is
    None); every other dimension of size > 1 is a slot dimension, and together they must
    step by one fixed row stride: [S, row], [num_blocks, block_size, row] and FlashMLA's
    [num_blocks, block_size, 1, row] all qualify."""
    if len(shape) < 2:
        fail(fn, name, "expected [num_slots, row] or [num_blocks, block_size, row], got "
             "shape %s" % (tuple(shape),))
    width = shape[-1] * isz
    if shape[-1] > 1 and stride[-1] != 1:
        fail(fn, name, "the row (last) dimension must be contiguous, strides are %s"
             % (tuple(stride),))
    if fmt is None:
        fd = _FROM_WIDTH.get(width)
        if fd is None:
            fail(fn, name, "a row of %d bytes is none of the formats' (bf16 1152/1024, "
                 "fp8_tensor 576/512, fp8_ds 656/528 for dr 64/0): pass format= and dr="
                 % width)
        if dr is not None and dr != fd[1]:
            fail(fn, "dr", "dr=%r, but a row of %d bytes is %s with dr=%d"
                 % (dr, width, FORMAT_NAMES[fd[0]], fd[1]))
        fmt, dr = fd
    else:
        fmt = format_code(fmt, fn)
        if dr is None:
            if width == ROW_SIZE[(fmt, 64)]:
                dr = 64
            elif width == ROW_SIZE[(fmt, 0)]:
                dr = 0
            else:
                fail(fn, name, "a row of %d bytes: pass dr= (64 or 0) with format=%s"
                     % (width, FORMAT_NAMES[fmt]))
        need = ROW_SIZE.get((fmt, dr))
        if need is None:
            fail(fn, "dr", "dr=%r, supported rope dims are 64 and 0" % (dr,))
        if width < need:
            fail(fn, name, "a row of %d bytes is smaller than the %d of %s with dr=%d"
                 % (width, need, FORMAT_NAMES[fmt], dr))
    num_slots = 1
    for s in shape[:-1]:
        num_slots *= s
    dims = [(s, st) for s, st in zip(shape[:-1], stride[:-1]) if s != 1]
    row_stride = dims[-1][1] if dims else shape[-1]
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != s1 * st1:
            fail(fn, name, "its slot dimensions (shape %s, strides %s) do not flatten into "
                 "one dimension with one row stride" % (tuple(shape), tuple(stride)))
    return fmt, dr, num_slots, row_stride * isz


def _scale_value(fmt, scale, fn):
    if fmt != _lib.CACHE_FP8_TENSOR:
        return 0.0
    if scale is None:
        fail(fn, "scale", "the fp8_tensor format needs the cache's scale (a float)")
    if isinstance(scale, Tensor):
        if scale.device.type != "cpu":
            fail(fn, "scale", "is a %s tensor; pass a Python float (reading a device scale "
                 "would synchronize)" % scale.device.type)
        scale = scale.item()
    elif isinstance(scale, np.ndarray):
        scale = scale.item()
    return float(scale)


class KVCache:
    """A KV cache tensor (or numpy array) and its format, worked out once.

    data: [num_slots, row] or [num_blocks, block_size, (1,) row] of any dtype; the row is
      the last dimension, contiguous; rows may be padded (row stride > row size).
    format: "bf16", "fp8_tensor" or "fp8_ds" (None: from the row's bytes, which tell all
      six (format, dr) pairs apart). dr: 64 or 0 (None: from the row's bytes).
    scale: fp8_tensor only: value = e4m3 * scale (a Python float).

    Every operation that takes `cache` accepts a KVCache or the bare tensor (with the same
    format/dr/scale keywords); a KVCache saves the layout checks on every call."""

    __slots__ = ("data", "format", "dr", "scale", "num_slots", "row_bytes", "device",
                 "__weakref__")

    def __init__(self, data, format=None, dr=None, scale=None):
        kind = kind_of(data, "KVCache", "data")
        if kind == TORCH:
            isz, shape, stride = data.element_size(), data.shape, data.stride()
        else:
            isz, shape = data.itemsize, data.shape
            stride = tuple(s // isz for s in data.strides)
        dev = device_of(data)
        if dev is None:
            fail("KVCache", "data", "is on %s; smla reads cpu and cuda memory" % data.device)
        self.data = data
        self.format, self.dr, self.num_slots, self.row_bytes = cache_layout(
            shape, stride, isz, format, dr, "KVCache", "data")
        self.scale = _scale_value(self.format, scale, "KVCache")
        self.device = dev

    def __repr__(self):
        return "smla.KVCache(%s, dr=%d, num_slots=%d, row_bytes=%d, device=%s)" % (
            FORMAT_NAMES[self.format], self.dr, self.num_slots, self.row_bytes,
            dev_name(self.device))


def _resolve_cache(cache, fmt, dr, scale, fn, kind, dev):
    """-> (data pointer, format, dr, num_slots, row_bytes, scale, the data object)."""
    if isinstance(cache, KVCache):
        x = cache.data
        if cache.device != dev:
            fail(fn, "cache", "is on %s, the other arguments on %s"
                 % (dev_name(cache.device), dev_name(dev)))
        if kind == TORCH:
            if not isinstance(x, Tensor):
                fail(fn, "cache", "holds a numpy array, the other arguments are torch "
                     "tensors", TypeError)
            ptr = x.data_ptr()
        else:
            if not isinstance(x, np.ndarray):
                fail(fn, "cache", "holds a torch tensor, the other arguments are numpy "
                     "arrays", TypeError)
            ptr = x.ctypes.data
        return ptr, cache.format, cache.dr, cache.num_slots, cache.row_bytes, cache.scale, x
    ptr, shape, stride, keep = arg(cache, fn, "cache", _ANY_BYTES, None, kind, dev)
    isz = cache.element_size() if kind == TORCH else cache.itemsize
    f, d, s, rb = cache_layout(shape, stride, isz, fmt, dr, fn)
    return ptr, f, d, s, rb, _scale_value(f, scale, fn), keep


# ---- plans ------------------------------------------------------------------------------------------------
_FWD = _lib.packer(_lib.smla_forward_params)
_auto_plans = {}                        # (dev, N, K, dr, format) -> [Plan], max_tokens ascending
_plans_by_id = weakref.WeakValueDictionary()   # Plan.id -> Plan (for the torch custom ops)
_next_id = [1]


def _capturing(dev):
    return dev >= 0 and torch is not None and torch.cuda.is_current_stream_capturing()


class Plan:
    """A forward plan: kernels and workspace chosen once, from shapes alone, for every
    forward with T <= max_tokens of one (device, num_heads, topk, dr, format).

    Plan(num_heads, topk, dr=64, format="bf16", max_tokens=1, device="cpu", flags=0,
         num_splits=0, heads_per_block=0)
      num_heads: N, 1..128.  topk: K >= 1 (index width per row).  dr: 64 or 0.
      format: "bf16", "fp8_tensor", "fp8_ds" (or smla.CACHE_*).
      max_tokens: the largest T it serves.  device: "cpu", "cuda", "cuda:N", an ordinal
      or a torch.device.  flags: smla.PLAN_BATCH_INVARIANT | smla.PLAN_PORTABLE |
      smla.PLAN_SEPARATE_MERGE.
      num_splits: KV splits per row (0 = the plan chooses per T).
      heads_per_block: 0 (the plan chooses), or 8, 16, 32, 64 to force a block's head
      group (CUDA; for A/B comparisons and tests).

    Make plans before CUDA graph capture (creation allocates and queries the device);
    forward() on a plan may then be captured and replayed. A CUDA plan's workspace comes
    from torch's caching allocator. Forwards on one plan must be ordered (one stream, or
    events between streams), and a plan is not for concurrent use from two threads.

    plan.forward(...) takes forward()'s arguments; plan.describe says which kernel path
    was chosen and why; plan.close() (or `with`) frees it early."""

    def __init__(self, num_heads, topk, dr=64, format="bf16", max_tokens=1, device="cpu",
                 flags=0, num_splits=0, heads_per_block=0):
        dev = device_index(device)
        fmt = format_code(format, "Plan")
        ctx = context(dev)
        desc = _lib.smla_plan_desc(int(max_tokens), int(num_heads), int(topk), int(dr), fmt,
                                   int(flags), int(num_splits), int(heads_per_block))
        if _capturing(dev):
            raise _lib.SmlaError(_lib.ERR_CAPTURING, (
                "smla.Plan: cannot create a plan on %s during CUDA graph capture (plan "
                "creation allocates and queries the device). Create it before capture: "
                "make an smla.Plan, call smla.prepare_plans(), or run the forward once "
                "eagerly with the same shapes." % dev_name(dev)))
        self._workspace = None
        ws_ptr, ws_bytes = None, 0
        if dev >= 0 and torch is not None:
            nbytes = ctypes.c_size_t()
            _lib.check(L.smla_plan_workspace_size(ctx, ctypes.byref(desc),
                                                  ctypes.byref(nbytes)), ctx)
            if nbytes.value:
                # torch's blocks are 512-byte aligned; the extra 256 bytes make sure.
                ws = torch.empty(nbytes.value + 256, dtype=torch.uint8, device="cuda:%d" % dev)
                ws_ptr = ws.data_ptr()
                ws_ptr += (-ws_ptr) % 256
                ws_bytes = nbytes.value
                self._workspace = ws
        h = ctypes.c_void_p()
        _lib.check(L.smla_plan_create(ctx, ctypes.byref(desc), ws_ptr, ws_bytes,
                                      ctypes.byref(h)), ctx)
        self._handle = h.value
        self._ctx = ctx
        self.device = dev
        self.num_heads = desc.num_heads
        self.topk = desc.topk
        self.dr = desc.dr
        self.format = fmt
        self.max_tokens = desc.max_tokens
        self.flags = desc.flags
        self.num_splits = desc.num_splits
        self.heads_per_block = desc.heads_per_block
        self._params = _lib.smla_forward_params()
        self._addr = ctypes.addressof(self._params)
        with _lock:
            self.id = _next_id[0]
            _next_id[0] += 1
            _plans_by_id[self.id] = self

    @property
    def describe(self):
        """Which path the plan chose and why (smla_plan_describe)."""
        if not self._handle:
            return "closed plan"
        return L.smla_plan_describe(self._handle).decode("utf-8", "replace")

    def close(self):
        """Frees the plan now. A plan that forward() cached (prepare_plans' result) leaves
        the cache too. Never close a plan a captured CUDA graph still uses."""
        h, self._handle = getattr(self, "_handle", None), None
        if h and L is not None:
            with _lock:
                for plans in _auto_plans.values():
                    if self in plans:
                        plans.remove(self)
            for key in [k for k, v in _auto_plans.items() if not v]:
                del _auto_plans[key]
            L.smla_plan_destroy(h)
        self._workspace = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "smla.Plan(N=%d, K=%d, dr=%d, %s, max_tokens=%d, %s): %s" % (
            self.num_heads, self.topk, self.dr, FORMAT_NAMES[self.format], self.max_tokens,
            dev_name(self.device), self.describe)

    def forward(self, q_nope, q_pe=None, cache=None, slots=None, **kwargs):
        """forward() on this plan; same arguments (see smla.forward)."""
        return forward(q_nope, q_pe, cache, slots, plan=self, **kwargs)


def _bucket(t):
    return 1 if t <= 1 else 1 << (int(t) - 1).bit_length()


def auto_plan(dev, N, K, dr, fmt, T):
    """The cached plan for these shapes (the smallest one made with max_tokens >= T), made
    on first use with max_tokens = T rounded up to a power of two. Never freed: a captured
    CUDA graph may hold on to its workspace."""
    key = (dev, N, K, dr, fmt)
    plans = _auto_plans.get(key)
    if plans is not None:
        for p in plans:
            if p.max_tokens >= T:
                return p
    if _capturing(dev):
        raise _lib.SmlaError(_lib.ERR_CAPTURING, (
            "smla.forward: no plan for N=%d, K=%d, dr=%d, %s, T=%d on %s, and plans cannot "
            "be made during CUDA graph capture. Before capturing, run the same forward "
            "once eagerly (with T >= %d), or call smla.prepare_plans(device, num_heads=%d, "
            "topk=%d, dr=%d, format=%r, max_tokens=%d), or pass plan=smla.Plan(...)."
            % (N, K, dr, FORMAT_NAMES[fmt], T, dev_name(dev), T, N, K, dr,
               FORMAT_NAMES[fmt], T)))
    p = Plan(N, K, dr, fmt, max_tokens=_bucket(T), device=dev)
    with _lock:
        plans = _auto_plans.setdefault(key, [])
        plans.append(p)
        plans.sort(key=lambda q: q.max_tokens)
    return p


def prepare_plans(device, num_heads, topk, dr=64, format="bf16", max_tokens=1):
    """Makes (and caches) the plan that forward() without plan= uses for T <= max_tokens
    on `device`, so that later forwards, also inside CUDA graph capture, find it. Returns
    the Plan."""
    return auto_plan(device_index(device), int(num_heads), int(topk), int(dr),
                     format_code(format, "prepare_plans"), int(max_tokens))


def plan_by_id(pid):
    p = _plans_by_id.get(pid)
    if p is None:
        raise _lib.SmlaError(_lib.ERR_INVALID_ARGUMENT,
                             "smla: plan %d was closed or garbage-collected" % pid)
    return p


# ---- 3. forward -------------------------------------------------------------------------------------------
def forward(q_nope, q_pe=None, cache=None, slots=None, *, sm_scale=None, lengths=None,
            softcap=0.0, sink=None, format=None, dr=None, scale=None, return_lse=False,
            return_max_logit=False, out=None, lse=None, max_logit=None, bad_inputs=None,
            plan=None, stream=None):
    """Sparse MLA attention (SPEC op 3): for every row t and head h, softmax over the used
    entries i of slots[t] (0 <= slot < S, i < lengths[t]) of
    l_i = sm_scale * (q_nope[t,h] . ckv_i + q_pe[t,h] . kpe_i), times the latent rows.

    q_nope: [T, N, 512] bf16; or [T, N, 512 + dr] (the concatenated q) with q_pe=None.
    q_pe: [T, N, dr] bf16 (may view q_nope's buffer), or None.
    cache: the KV cache: a KVCache, or a tensor/array with format=/dr=/scale= (see KVCache;
      by default the format is read from the row's bytes).
    slots: [T, K] int32 cache slots (-1, or anything outside [0, S), is masked).
    sm_scale: float (default 1/sqrt(512 + dr)).
    lengths: [T] int32 or None: only the first lengths[t] entries of row t count.
    softcap: 0 (off) or c > 0: logit = c * tanh(logit / c).
    sink: [N] float32 or None: a per-head logit in the softmax denominator only.
    return_lse / return_max_logit: also return lse [T, N] float32 (natural log, sink left
      out) / max_logit [T, N] float32. Rows with no used entry: out 0, lse = max_logit =
      -inf.
    out / lse / max_logit: preallocated outputs (any strides with a contiguous last
      dimension); giving lse or max_logit implies returning it.
    bad_inputs: [1] int64/uint64 counter, += entries >= S or < -1 (or None).
    plan: an smla.Plan; None uses a cached plan for these shapes, made on first use
      (not possible during CUDA graph capture: see prepare_plans).
    stream: CUDA only: a torch.cuda.Stream or raw cudaStream_t int; None = torch's current
      stream of the tensors' device.

    Returns out [T, N, 512] bf16 (numpy: uint16 bf16 bits), or (out, lse), or
    (out, lse, max_logit) when return_max_logit, or (out, max_logit) when only
    max_logit is asked for. Torch tensors in, torch tensors out (outputs from torch's
    allocator); numpy in, numpy out. Under torch.compile this is the smla::forward custom
    op (smla::forward_out when outputs are given)."""
    if _is_compiling is not None and _is_compiling() and isinstance(q_nope, Tensor):
        return _traced().forward_traced(
            q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format, dr, scale,
            return_lse, return_max_logit, out, lse, max_logit, bad_inputs, plan)
    want_lse = return_lse or lse is not None
    want_max = return_max_logit or max_logit is not None
    r = _forward_torch_fast(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink,
                            format, dr, want_lse, want_max, out, lse, max_logit, bad_inputs,
                            plan, stream) if isinstance(q_nope, Tensor) else None
    if r is None:
        r = forward_into(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format,
                         dr, scale, want_lse, want_max, out, lse, max_logit, bad_inputs, plan,
                         stream, fast=False)
    out, lse, max_logit = r
    if want_lse:
        return (out, lse, max_logit) if want_max else (out, lse)
    return (out, max_logit) if want_max else out


def forward_indices(q_nope, q_pe, cache, req_id, block_table, local, *, block_size,
                    cp_size=0, cp_rank=0, cp_interleave=1, sm_scale=None, lengths=None,
                    softcap=0.0, sink=None, format=None, dr=None, scale=None,
                    return_lse=False, return_max_logit=False, out=None, lse=None,
                    max_logit=None, bad_inputs=None, plan=None, stream=None):
    """A decode step's index conversion and forward in one call (one launch on a GPU):
    exactly convert_indices(req_id, block_table, local, block_size=..., cp_...) (not
    compacted) followed by forward() on those slots, without the slots tensor.

    req_id: [T] int32; block_table: [R, B] int32 (any row stride); local: [T, K] int32
    request-local positions (any row stride); block_size, cp_size, cp_rank, cp_interleave:
    as in convert_indices. Every other argument and the result: as in forward(). Inside a
    CUDA graph the three index tensors may be rewritten in place between replays. Under
    torch.compile this is the smla::forward_indices custom op."""
    if _is_compiling is not None and _is_compiling() and isinstance(q_nope, Tensor):
        return _traced().forward_indices_traced(
            q_nope, q_pe, cache, req_id, block_table, local, block_size, cp_size, cp_rank,
            cp_interleave, sm_scale, lengths, softcap, sink, format, dr, scale, return_lse,
            return_max_logit, out, lse, max_logit, bad_inputs, plan)
    want_lse = return_lse or lse is not None
    want_max = return_max_logit or max_logit is not None
    out, lse, max_logit = forward_into(
        q_nope, q_pe, cache, local, sm_scale, lengths, softcap, sink, format, dr, scale,
        want_lse, want_max, out, lse, max_logit, bad_inputs, plan, stream,
        fn="forward_indices", fast=False,
        ix=(req_id, block_table, block_size, cp_size, cp_rank, cp_interleave))
    if want_lse:
        return (out, lse, max_logit) if want_max else (out, lse)
    return (out, max_logit) if want_max else out


def _row_stat_out(x, want, like, fn, name, kind, dev, T, N):
    """A [T, N] float32 per-row output (lse, max_logit) of forward: (pointer, row stride,
    array). Allocated like `like` when not given; (0, 0, None) when not wanted."""
    if not want:
        return 0, 0, x
    if x is None:
        if kind == TORCH:
            x = like.new_empty((T, N), dtype=_f32)
            return x.data_ptr(), N, x
        x = new(kind, dev, (T, N), "f32")
        return x.ctypes.data, N, x
    p, shp, st, x = arg(x, fn, name, _F32, 2, kind, dev)
    if shp[0] != T or shp[1] != N:
        fail(fn, name, "expected shape [%d, %d], got %s" % (T, N, tuple(shp)))
    return p, st[0], x


def forward_into(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format, dr,
                 scale, want_lse, want_max, out, lse, max_logit, bad_inputs, plan, stream,
                 fn="forward", fast=True, ix=None):
    """forward()'s eager body: checks, allocates what is missing, launches. -> (out, lse,
    max_logit), None for outputs not asked for. ix = (req_id, block_table, block_size,
    cp_size, cp_rank, cp_interleave): forward_indices (slots are then the request-local
    positions, converted inside the call)."""
    if fast and ix is None and isinstance(q_nope, Tensor):
        r = _forward_torch_fast(q_nope, q_pe, cache, slots, sm_scale, lengths, softcap, sink,
                                format, dr, want_lse, want_max, out, lse, max_logit,
                                bad_inputs, plan, stream)
        if r is not None:
            return r
    kind = kind_of(q_nope, fn, "q_nope")
    dev = -1
    if kind == TORCH:  # q_nope decides the device every other argument must be on
        dev = q_nope.get_device()
        if dev < 0 and q_nope.device.type != "cpu":
            fail(fn, "q_nope", "is on %s; smla runs on cpu and cuda" % q_nope.device)
    qp, qs, qst, qkeep = arg(q_nope, fn, "q_nope", _BF16, 3, kind, dev)
    T, N, W = qs
    cp, fmt, cdr, S, row_bytes, cscale, ckeep = _resolve_cache(cache, format, dr, scale, fn,
                                                               kind, dev)
    if q_pe is None:
        if W == DC + cdr:
            pp = qp + 2 * DC if cdr else 0
            pst = qst
        else:
            fail(fn, "q_nope", "with q_pe=None its last dimension must be %d (512 + dr of "
                 "the cache), got %d" % (DC + cdr, W))
        pkeep = None
    else:
        if W != DC:
            fail(fn, "q_nope", "expected [T, N, 512] with q_pe given, got shape %s"
                 % (tuple(qs),))
        pp, ps, pst, pkeep = arg(q_pe, fn, "q_pe", _BF16, 3, kind, dev)
        if ps[0] != T or ps[1] != N or ps[2] != cdr:
            fail(fn, "q_pe", "expected shape [%d, %d, %d] (T, N, dr of the cache), got %s"
                 % (T, N, cdr, tuple(ps)))
    sname = "slots" if ix is None else "local"
    sp, ss, sst, skeep = arg(slots, fn, sname, _I32, 2, kind, dev)
    if ss[0] != T:
        fail(fn, sname, "expected [T=%d, K], got shape %s" % (T, tuple(ss)))
    K = ss[1]
    if ix is not None:
        req_id, block_table, block_size, cp_size, cp_rank, cp_interleave = ix
        rp, rs, _, _ = arg(req_id, fn, "req_id", _I32, 1, kind, dev)
        if rs[0] != T:
            fail(fn, "req_id", "expected shape [%d] (T), got %s" % (T, tuple(rs)))
        bp, bs_, bst, _ = arg(block_table, fn, "block_table", _I32, 2, kind, dev)
        conv = _lib.smla_convert_params(T, K, rp, bp, bs_[0], bs_[1], bst[0], int(block_size),
                                        sp, sst[0], None, 0, None, 0, int(cp_size),
                                        int(cp_rank), int(cp_interleave))
    if lengths is not None:
        lp, ls, _, _ = arg(lengths, fn, "lengths", _I32, 1, kind, dev)
        if ls[0] != T:
            fail(fn, "lengths", "expected shape [%d] (T), got %s" % (T, tuple(ls)))
    else:
        lp = 0
    if sink is not None:
        kp, ks, _, _ = arg(sink, fn, "sink", _F32, 1, kind, dev)
        if ks[0] != N:
            fail(fn, "sink", "expected shape [%d] (N), got %s" % (N, tuple(ks)))
    else:
        kp = 0
    if out is None:
        if kind == TORCH:
            out = q_nope.new_empty((T, N, DC))
            op = out.data_ptr()
        else:
            out = new(kind, dev, (T, N, DC), "bf16")
            op = out.ctypes.data
        ost = (N * DC, DC)
    else:
        op, os_, ost, out = arg(out, fn, "out", _BF16, 3, kind, dev)
        if os_[0] != T or os_[1] != N or os_[2] != DC:
            fail(fn, "out", "expected shape [%d, %d, 512], got %s" % (T, N, tuple(os_)))
    ep, est, lse = _row_stat_out(lse, want_lse, q_nope, fn, "lse", kind, dev, T, N)
    mp, mst, max_logit = _row_stat_out(max_logit, want_max, q_nope, fn, "max_logit", kind, dev,
                                       T, N)
    if bad_inputs is not None:
        bp, bs, _, _ = arg(bad_inputs, fn, "bad_inputs", _COUNTER, 1, kind, dev)
        if bs[0] < 1:
            fail(fn, "bad_inputs", "expected shape [1], got %s" % (tuple(bs),))
    else:
        bp = 0
    if plan is None:
        plan = auto_plan(dev, N, K, cdr, fmt, T)
    elif plan.device != dev:
        fail(fn, "plan", "was made for %s, the tensors are on %s"
             % (dev_name(plan.device), dev_name(dev)))
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(DC + cdr)
    _FWD.pack_into(plan._params, 0, T, N, K, qp, qst[0], qst[1], pp, pst[0], pst[1],
                   fmt, cdr, S, row_bytes, cp, cscale, 0 if ix is not None else sp, sst[0], lp,
                   sm_scale, softcap, kp, op, ost[0], ost[1], ep, est, mp, mst, bp)
    st = _stream(stream, dev) if dev >= 0 else None
    if ix is not None:
        s = L.smla_forward_indices(plan._handle, plan._addr, ctypes.byref(conv), st)
    else:
        s = L.smla_forward(plan._handle, plan._addr, st)
    if s:
        _lib.check(s, plan._ctx)
    return out, lse, max_logit


# ---- the torch fast path of forward ------------------------------------------------------------------
# The common call (torch tensors, the last dimensions contiguous, shapes that agree) in as
# few tensor attribute reads as possible: each costs ~0.1 µs, and the bar is < 10 µs of host
# time per call over the bare C call. Anything unusual returns None, and the general path
# (forward_into) then checks again and raises the error that names the argument.
if torch is not None:
    _bf16, _i32 = torch.bfloat16, torch.int32
else:
    _bf16 = _i32 = None
_layouts = {}     # (shape, strides, dtype, format, dr) -> (format, dr, num_slots, row_bytes)


def _cache_fast(cache, format, dr, dev):
    """(ptr, format, dr, S, row_bytes, scale) of a torch cache on `dev`, or None."""
    if isinstance(cache, KVCache):
        x = cache.data
        if cache.device != dev or not isinstance(x, Tensor):
            return None
        return x.data_ptr(), cache.format, cache.dr, cache.num_slots, cache.row_bytes, \
            cache.scale
    if not isinstance(cache, Tensor) or cache.get_device() != dev:
        return None
    key = (cache.shape, cache.stride(), cache.dtype, format, dr)
    lay = _layouts.get(key)
    if lay is None:
        if cache.dtype not in _T_CODES_FAST:
            return None
        try:
            lay = cache_layout(key[0], key[1], cache.element_size(), format, dr, "forward")
        except ValueError:
            return None
        if lay[0] == _lib.CACHE_FP8_TENSOR:
            return None  # needs the scale argument: the general path
        if len(_layouts) > 4096:
            _layouts.clear()
        _layouts[key] = lay
    return (cache.data_ptr(),) + lay + (0.0,)


# ---- small eager outputs from a pooled slab ---------------------------------------------------------
# torch's allocator costs ~4-5 µs per tensor (allocation and free) on the H200 machine's host,
# half of the host-overhead bar by itself. Under torch.inference_mode (how engines run a
# model) the fast path takes small eager CUDA outputs (out, lse) from a slab of up to
# _SLAB_BYTES made by one allocation and cut into views by one unbind: each view is handed
# out once and never reused, so results never alias; the slab's memory returns to torch's
# allocator when its last view is dropped (a held output keeps at most one slab alive).
# Inference tensors carry no version counter and no autograd view tracking, so a view
# behaves like its own tensor there; outside inference mode (autograd could see the views
# share a base) outputs are allocated one by one. One pool per (device, stream, shape,
# dtype): a slab is only used on the stream it was allocated on, as torch's allocator
# wants. Not during CUDA graph capture, not for an explicit stream argument, not for outputs
# over _POOL_MAX_BYTES. (A pooled output must not be resize_()d: it shares the slab.)
_SLAB_BYTES = 2 << 20
_POOL_MAX_BYTES = 256 << 10
_pools = {}
if torch is not None and torch.cuda.is_available():
    _capturing_now = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    _cur_device = getattr(torch._C, "_cuda_getDevice", None)
    _inference = getattr(torch, "is_inference_mode_enabled", None)
    _pool_ok = None not in (_capturing_now, _cur_device, _inference)
else:
    _pool_ok = False


def _pool_applies(dev, stream):
    """Whether this call's small outputs may come from the pool (see above); checked once
    per call."""
    return _pool_ok and dev >= 0 and stream is None and _inference() and \
        _cur_device() == dev and not _capturing_now()


def _pooled(like, shape, dtype, elem, dev, st):
    """An uninitialized [shape] tensor of `dtype` on like's CUDA device for the current
    stream `st`, from the pool (the caller checked _pool_applies); None when it is too
    big or empty (the caller allocates)."""
    n = elem
    for d in shape:
        n *= d
    if n > _POOL_MAX_BYTES or not n:
        return None
    key = (dev, st, shape, dtype)
    views = _pools.get(key)
    if views:
        try:
            return views.pop()
        except IndexError:  # another thread took the last one (free-threaded builds)
            pass
    count = max(2, min(64, _SLAB_BYTES // n))
    views = list(like.new_empty((count,) + shape, dtype=dtype).unbind(0))
    views.reverse()  # hand out in address order
    if len(_pools) > 256:
        _pools.clear()
    _pools[key] = views
    return views.pop()


def _forward_torch_fast(q, q_pe, cache, slots, sm_scale, lengths, softcap, sink, format, dr,
                        want_lse, want_max, out, lse, max_logit, bad_inputs, plan, stream):
    dev = q.get_device()
    qs = q.shape
    qst = q.stride()
    if q.dtype is not _bf16 or len(qs) != 3 or qst[2] != 1 or (dev < 0 and not q.is_cpu):
        return None
    T, N, W = qs
    if type(cache) is KVCache:  # the engine's usual argument: no layout work at all
        x = cache.data
        if cache.device != dev or not isinstance(x, Tensor):
            return None
        c = (x.data_ptr(), cache.format, cache.dr, cache.num_slots, cache.row_bytes,
             cache.scale)
    else:
        c = _cache_fast(cache, format, dr, dev)
    if c is None or max_logit is not None or bad_inputs is not None:
        return None
    cdr = c[2]
    qp = q.data_ptr()
    if q_pe is None:
        if W != DC + cdr:
            return None
        pp, pst = (qp + 2 * DC if cdr else 0), qst
    else:
        if not isinstance(q_pe, Tensor):
            return None
        pst = q_pe.stride()
        if W != DC or not cdr or q_pe.dtype is not _bf16 or q_pe.shape != (T, N, cdr) or \
                pst[2] != 1 or q_pe.get_device() != dev:
            return None
        pp = q_pe.data_ptr()
    if not isinstance(slots, Tensor):
        return None
    ss = slots.shape
    sst = slots.stride()
    if slots.dtype is not _i32 or len(ss) != 2 or ss[0] != T or sst[1] != 1 or \
            slots.get_device() != dev:
        return None
    if lengths is not None:
        if not isinstance(lengths, Tensor) or lengths.dtype is not _i32 or lengths.shape != (T,) or lengths.get_device() != dev:
            return None
        lp = lengths.data_ptr()
    else:
        lp = 0
    if sink is not None:
        if not isinstance(sink, Tensor) or sink.dtype is not _f32 or sink.shape != (N,) or sink.get_device() != dev:
            return None
        kp = sink.data_ptr()
    else:
        kp = 0
    if lse is not None:
        if not isinstance(lse, Tensor):
            return None
        es = lse.stride()
        if lse.dtype is not _f32 or lse.shape != (T, N) or es[1] != 1 or \
                lse.get_device() != dev:
            return None
    if out is not None:
        if not isinstance(out, Tensor):
            return None
        ost = out.stride()
        if out.dtype is not _bf16 or out.shape != (T, N, DC) or ost[2] != 1 or \
                out.get_device() != dev:
            return None
    K = ss[1]
    if plan is None:
        plans = _auto_plans.get((dev, N, K, cdr, c[1]))
        if plans is not None and plans[0].max_tokens >= T:
            plan = plans[0]
        else:
            plan = auto_plan(dev, N, K, cdr, c[1], T)
    elif plan.device != dev:
        return None
    st = (_raw_stream(dev) if stream is None else _stream(stream, dev)) if dev >= 0 else None
    pool = (out is None or (want_lse and lse is None)) and _pool_applies(dev, stream)
    if out is None:
        out = _pooled(q, (T, N, DC), _bf16, 2, dev, st) if pool else None
        if out is None:
            out = q.new_empty((T, N, DC))
        ost = (N * DC, DC)
    if want_lse:
        if lse is None:
            lse = _pooled(q, (T, N), _f32, 4, dev, st) if pool else None
            if lse is None:
                lse = q.new_empty((T, N), dtype=_f32)
            est = N
        else:
            est = es[0]
        ep = lse.data_ptr()
    else:
        ep = est = 0
    if want_max:
        max_logit = q.new_empty((T, N), dtype=_f32)
        mp = max_logit.data_ptr()
    else:
        mp = 0
    _FWD.pack_into(plan._params, 0, T, N, K, qp, qst[0], qst[1], pp, pst[0], pst[1], c[1],
                   cdr, c[3], c[4], c[0], c[5], slots.data_ptr(), sst[0], lp,
                   _default_scale[cdr] if sm_scale is None else sm_scale, softcap, kp,
                   out.data_ptr(), ost[0], ost[1], ep, est, mp, N, 0)
    s = _smla_forward(plan._handle, plan._addr, st)
    if s:
        _lib.check(s, plan._ctx)
    return out, lse, max_logit


_smla_forward = L.smla_forward
_default_scale = {64: 1.0 / math.sqrt(DC + 64), 0: 1.0 / math.sqrt(DC)}


# ---- 1. convert indices -------------------------------------------------------------------------------------
def convert_indices(req_id, block_table, local, *, block_size, compact=False,
                    return_valid=False, slots=None, valid=None, stream=None, cp_size=0,
                    cp_rank=0, cp_interleave=1):
    """Request-local token positions -> cache slots (SPEC op 1):
    slots[t, k] = block_table[r, p // bs] * bs + p % bs with r = req_id[t], p = local[t, k],
    or -1 where invalid (p < 0, p // bs >= B, a block-table entry < 0, r outside [0, R),
    or a slot beyond int32).

    req_id: [T] int32.  block_table: [R, B] int32 (any row stride).
    local: [T, K] int32 (any row stride).  block_size: bs >= 1.
    compact: move each row's valid entries to the front (in order), -1 after them.
    slots: [T, K] int32 output (allocated when None; may be `local` itself for in-place
      conversion when compact is False).
    return_valid / valid: also return valid [T] int32, the valid entries per row.
    stream: as in forward().
    cp_size / cp_rank / cp_interleave: decode context parallelism (cp_size 0 or 1: off).
      The request's tokens are dealt to cp_size ranks in runs of cp_interleave (vLLM's DCP
      layout): position p lives on rank (p // I) % cp_size at local position
      (p // (I * cp_size)) * I + p % I of that rank's sequence. This call is rank cp_rank's
      (block_table is its own): other ranks' entries are invalid (-1), its own are
      converted at their local position; with compact=True and return_valid, valid is the
      row's length on this rank (forward's lengths=).
    Returns slots, or (slots, valid)."""
    cp = (int(cp_size), int(cp_rank), int(cp_interleave))
    if _compiling() and isinstance(local, Tensor):
        return _traced().convert_traced(req_id, block_table, local, block_size, compact,
                                        return_valid, slots, valid, cp)
    slots, valid = convert_into(req_id, block_table, local, block_size, compact,
                                return_valid or valid is not None, slots, valid, stream,
                                cp=cp)
    return (slots, valid) if valid is not None else slots


def convert_into(req_id, block_table, local, block_size, compact, want_valid, slots, valid,
                 stream, fn="convert_indices", cp=(0, 0, 1)):
    kind = kind_of(local, fn, "local")
    dev = device_of(local)
    if dev is None:
        fail(fn, "local", "is on %s; smla runs on cpu and cuda" % local.device)
    lp, ls, lst, lkeep = arg(local, fn, "local", _I32, 2, kind, dev)
    T, K = ls
    rp, rs, _, rkeep = arg(req_id, fn, "req_id", _I32, 1, kind, dev)
    if rs[0] != T:
        fail(fn, "req_id", "expected shape [%d] (T), got %s" % (T, tuple(rs)))
    bp, bs_, bst, bkeep = arg(block_table, fn, "block_table", _I32, 2, kind, dev)
    if slots is None:
        slots = new(kind, dev, (T, K), "i32")
        sp, sst = slots.data_ptr() if kind == TORCH else slots.ctypes.data, (K, 1)
    else:
        sp, ss, sst, slots = arg(slots, fn, "slots", _I32, 2, kind, dev)
        if ss[0] != T or ss[1] != K:
            fail(fn, "slots", "expected shape [%d, %d] like local, got %s" % (T, K, tuple(ss)))
    if want_valid:
        if valid is None:
            valid = new(kind, dev, (T,), "i32")
            vp = valid.data_ptr() if kind == TORCH else valid.ctypes.data
        else:
            vp, vs, _, valid = arg(valid, fn, "valid", _I32, 1, kind, dev)
            if vs[0] != T:
                fail(fn, "valid", "expected shape [%d] (T), got %s" % (T, tuple(vs)))
    else:
        vp = None
    p = _lib.smla_convert_params(T, K, rp, bp, bs_[0], bs_[1], bst[0], int(block_size), lp,
                                 lst[0], sp, sst[0], vp, int(bool(compact)), cp[0], cp[1],
                                 cp[2])
    ctx = context(dev)
    _lib.check(L.smla_convert_indices(ctx, ctypes.byref(p), _stream(stream, dev)), ctx)
    return slots, valid


# ---- 2. cache write --------------------------------------------------------------------------------------------
def cache_write(kv_c, k_pe, slot, cache, *, format=None, dr=None, scale=None, bad_inputs=None,
                stream=None):
    """Concat-and-cache (SPEC op 2): row slot[t] of the cache := (kv_c[t], k_pe[t]) in the
    cache's format. slot < 0 is padding (skipped); slot >= S is skipped and counted.

    kv_c: [T, 512] bf16 latent; or [T, 512 + dr] (latent and rope side by side) with
      k_pe=None.  k_pe: [T, dr] bf16, or None (NoPE caches, or the concatenated kv_c).
    slot: [T] int64 (the engine's slot_mapping).
    cache: written in place: a KVCache, or a tensor/array with format=/dr=/scale= as in
      forward(). fp8_ds: per 128 values a power-of-two scale; fp8_tensor: value / scale,
      rounded to nearest even, saturated at +-448.
    bad_inputs: [1] int64/uint64 counter, += rows with slot >= S (or None).
    Returns None."""
    if _compiling() and isinstance(kv_c, Tensor):
        return _traced().cache_write_traced(kv_c, k_pe, slot, cache, format, dr, scale,
                                            bad_inputs)
    cache_write_into(kv_c, k_pe, slot, cache, format, dr, scale, bad_inputs, stream)


def cache_write_into(kv_c, k_pe, slot, cache, format, dr, scale, bad_inputs, stream,
                     fn="cache_write"):
    kind = kind_of(kv_c, fn, "kv_c")
    dev = device_of(kv_c)
    if dev is None:
        fail(fn, "kv_c", "is on %s; smla runs on cpu and cuda" % kv_c.device)
    kp, ks, kst, kkeep = arg(kv_c, fn, "kv_c", _BF16, 2, kind, dev)
    T, W = ks
    cp, fmt, cdr, S, row_bytes, cscale, ckeep = _resolve_cache(cache, format, dr, scale, fn,
                                                               kind, dev)
    if kind == NUMPY and not ckeep.flags.writeable:
        fail(fn, "cache", "is read-only")
    if k_pe is None:
        if W != DC + cdr:
            fail(fn, "kv_c", "with k_pe=None its last dimension must be %d (512 + dr of the "
                 "cache), got %d" % (DC + cdr, W))
        pp, pst = (kp + 2 * DC if cdr else None), kst[0]
        pkeep = None
    else:
        if W != DC:
            fail(fn, "kv_c", "expected [T, 512] with k_pe given, got shape %s" % (tuple(ks),))
        shape = tuple(getattr(k_pe, "shape", ()))
        if cdr == 0:  # NoPE: nothing to read; a zero-width [T, 0] view is what engines pass
            if shape != (T, 0):
                fail(fn, "k_pe", "a NoPE (dr=0) cache takes None or a zero-width [%d, 0] "
                     "k_pe, got shape %s" % (T, shape))
            pp, pst, pkeep = None, 0, None
        else:
            pp, ps, pstt, pkeep = arg(k_pe, fn, "k_pe", _BF16, 2, kind, dev)
            if ps[0] != T or ps[1] != cdr:
                fail(fn, "k_pe", "expected shape [%d, %d] (T, dr), got %s" % (T, cdr, tuple(ps)))
            pst = pstt[0]
    sp, ss, _, skeep = arg(slot, fn, "slot", _I64, 1, kind, dev)
    if ss[0] != T:
        fail(fn, "slot", "expected shape [%d] (T), got %s" % (T, tuple(ss)))
    if bad_inputs is not None:
        bp, bs, _, _ = arg(bad_inputs, fn, "bad_inputs", _COUNTER, 1, kind, dev)
        if bs[0] < 1:
            fail(fn, "bad_inputs", "expected shape [1], got %s" % (tuple(bs),))
    else:
        bp = None
    p = _lib.smla_cache_write_params(T, kp, kst[0], pp, pst, sp,
                                     _lib.smla_cache(fmt, cdr, S, row_bytes, cp, cscale), bp)
    ctx = context(dev)
    _lib.check(L.smla_cache_write(ctx, ctypes.byref(p), _stream(stream, dev)), ctx)


# ---- 4. merge partial states ------------------------------------------------------------------------------------
def _dtype_code(d, fn):
    if d is None:
        return None
    if isinstance(d, str):
        c = {"bf16": "bf16", "bfloat16": "bf16", "f32": "f32", "float32": "f32"}.get(d)
    elif torch is not None and isinstance(d, torch.dtype):
        c = {torch.bfloat16: "bf16", torch.float32: "f32"}.get(d)
    else:
        try:
            dd = np.dtype(d)
        except TypeError:
            dd = None
        c = {np.dtype(np.float32): "f32", np.dtype(np.uint16): "bf16"}.get(dd)
        if dd is not None and dd.name == "bfloat16":
            c = "bf16"
    if c is None:
        fail(fn, "out_dtype", "%r is not bf16 or float32" % (d,))
    return c


def merge_states(out_p, lse_p, *, out_dtype=None, return_lse=False, out=None, lse=None,
                 sink=None, stream=None):
    """Merge P partial attention states (SPEC op 4; split-KV combine, context parallelism):
    lse = log sum_p exp(lse_p), out = sum_p exp(lse_p - lse) out_p. A partial with
    lse_p = -inf contributes nothing (its out_p is not read); all -inf: out 0, lse -inf.
    sink: [N] float32, the sink the partials' forwards were given (forward(sink=...)):
      then w_p = (exp(lse_p) + exp(sink)) / (exp(lse) + exp(sink)), so merging the parts of
      a sinked forward equals the sinked forward over their union (include/smla.h). Without
      it, sinked partials would count the sink once per part.

    out_p: [P, T, N, dv] bf16 or float32 (numpy: uint16 bf16 bits or float32), dv 1..512,
      any outer strides.  lse_p: [P, T, N] float32.
    out_dtype: bf16 or float32 (torch/numpy dtype or "bf16"/"float32"); default out_p's.
    out / lse: preallocated outputs [T, N, dv] / [T, N] float32.
    Returns out, or (out, lse) when return_lse (or lse given)."""
    if _compiling() and isinstance(out_p, Tensor):
        return _traced().merge_traced(out_p, lse_p, out_dtype, return_lse, out, lse, sink)
    want_lse = return_lse or lse is not None
    out, lse = merge_into(out_p, lse_p, out_dtype, want_lse, out, lse, stream, sink=sink)
    return (out, lse) if want_lse else out


def merge_into(out_p, lse_p, out_dtype, want_lse, out, lse, stream, fn="merge_states",
               sink=None):
    kind = kind_of(out_p, fn, "out_p")
    dev = device_of(out_p)
    if dev is None:
        fail(fn, "out_p", "is on %s; smla runs on cpu and cuda" % out_p.device)
    op_, os_, ost, okeep = arg(out_p, fn, "out_p", _BF16_F32, 4, kind, dev)
    in_code = "f32" if code_of(okeep) == "f32" else "bf16"
    P, T, N, dv = os_
    lp, ls, lst, lkeep = arg(lse_p, fn, "lse_p", _F32, 3, kind, dev)
    if tuple(ls) != (P, T, N):
        fail(fn, "lse_p", "expected shape [%d, %d, %d] (P, T, N of out_p), got %s"
             % (P, T, N, tuple(ls)))
    oc = _dtype_code(out_dtype, fn) or in_code
    if out is None:
        out = new(kind, dev, (T, N, dv), oc)
        rp, rst = out.data_ptr() if kind == TORCH else out.ctypes.data, (N * dv, dv)
    else:
        rp, rs, rst, out = arg(out, fn, "out", frozenset((oc,)), 3, kind, dev)
        if tuple(rs) != (T, N, dv):
            fail(fn, "out", "expected shape [%d, %d, %d], got %s" % (T, N, dv, tuple(rs)))
    if want_lse:
        if lse is None:
            lse = new(kind, dev, (T, N), "f32")
            ep, est = lse.data_ptr() if kind == TORCH else lse.ctypes.data, N
        else:
            ep, es, est, lse = arg(lse, fn, "lse", _F32, 2, kind, dev)
            if tuple(es) != (T, N):
                fail(fn, "lse", "expected shape [%d, %d], got %s" % (T, N, tuple(es)))
            est = est[0]
    else:
        ep, est = None, 0
    kp = None
    if sink is not None:
        kp, ks, _, _ = arg(sink, fn, "sink", _F32, 1, kind, dev)
        if tuple(ks) != (N,):
            fail(fn, "sink", "expected shape [%d] (N of out_p), got %s" % (N, tuple(ks)))
    code = {"bf16": _lib.DTYPE_BF16, "f32": _lib.DTYPE_F32}
    p = _lib.smla_merge_params(P, T, N, dv, op_, code[in_code], ost[0], ost[1], ost[2], lp,
                               lst[0], lst[1], rp, code[oc], rst[0], rst[1], ep, est, kp)
    ctx = context(dev)
    _lib.check(L.smla_merge_states(ctx, ctypes.byref(p), _stream(stream, dev)), ctx)
    return out, lse


# ---- 5. metadata -------------------------------------------------------------------------------------------------
def build_metadata(query_start_loc, seq_lens, *, num_tokens, topk, req_id=None, ctx_len=None,
                   limit=None):
    """Per-row metadata from the engine's request view (SPEC op 5; host only, no device).

    query_start_loc: [R + 1] int32, seq_lens: [R] int32, on the host: numpy arrays, CPU
      torch tensors or Python sequences (R may include padding requests whose start
      repeats the previous one).  num_tokens: T, the padded row count.  topk: K.
    req_id / ctx_len / limit: optional [T] int32 host outputs (e.g. pinned tensors).
    Returns (req_id, ctx_len, limit), each [T] int32, of the inputs' kind (CPU tensors for
    tensors, numpy otherwise): req_id[t] the row's request, ctx_len[t] = seq_len - q_len +
    j + 1 for the j-th query token of its request, limit[t] = min(ctx_len[t], K); padding
    rows past the last real token get 0, 0, 0. Malformed input (decreasing starts, last
    start > T, seq_len < q_len, query_start_loc[0] != 0) raises SmlaError
    (SMLA_ERR_MALFORMED)."""
    if _compiling() and isinstance(query_start_loc, Tensor):
        return _traced().metadata_traced(query_start_loc, seq_lens, num_tokens, topk, req_id,
                                         ctx_len, limit)
    return metadata_into(query_start_loc, seq_lens, num_tokens, topk, req_id, ctx_len, limit)


def _host_i32(x, fn, name):
    if isinstance(x, (Tensor, np.ndarray)):
        return x
    return np.ascontiguousarray(np.asarray(x, dtype=np.int64).astype(np.int32))


def metadata_into(query_start_loc, seq_lens, num_tokens, topk, req_id, ctx_len, limit,
                  fn="build_metadata"):
    q = _host_i32(query_start_loc, fn, "query_start_loc")
    s = _host_i32(seq_lens, fn, "seq_lens")
    kind = kind_of(q, fn, "query_start_loc")
    if kind == TORCH and q.device.type != "cpu":
        fail(fn, "query_start_loc", "is on %s: build_metadata runs on the host; pass the "
             "engine's CPU copy" % q.device)
    if kind == TORCH and not isinstance(s, Tensor):
        s = torch.from_numpy(np.asarray(s))
    if kind == NUMPY and isinstance(s, Tensor):
        fail(fn, "seq_lens", "is a torch tensor, query_start_loc a numpy array", TypeError)
    qp, qs, qst, qkeep = arg(q, fn, "query_start_loc", _I32, 1, kind, -1)
    sp, ss, sst, skeep = arg(s, fn, "seq_lens", _I32, 1, kind, -1)
    R = ss[0]
    if qs[0] != R + 1:
        fail(fn, "query_start_loc", "expected [R + 1] = [%d] entries for R = %d seq_lens, "
             "got %d" % (R + 1, R, qs[0]))
    if (qs[0] > 1 and qst[0] != 1) or (R > 1 and sst[0] != 1):
        fail(fn, "query_start_loc" if qst[0] != 1 else "seq_lens", "must be contiguous")
    T = int(num_tokens)
    if T < 0:
        fail(fn, "num_tokens", "must be >= 0, got %d" % T)
    outs = []
    for name, x in (("req_id", req_id), ("ctx_len", ctx_len), ("limit", limit)):
        if x is None:
            x = new(kind, -1, (T,), "i32")
        xp, xs, xst, x = arg(x, fn, name, _I32, 1, kind, -1)
        if xs[0] != T or (T > 1 and xst[0] != 1):
            fail(fn, name, "expected a contiguous [%d] (num_tokens) array, got shape %s"
                 % (T, tuple(xs)))
        outs.append((xp, x))
    p = _lib.smla_metadata_params(T, R, int(topk), qp, sp if R else None, outs[0][0],
                                  outs[1][0], outs[2][0])
    ctx = context(-1)
    _lib.check(L.smla_build_metadata(ctx, ctypes.byref(p)), ctx)
    return outs[0][1], outs[1][1], outs[2][1]
