"""Drop-in entry points with the signatures of other libraries' sparse MLA functions.

    from smla.compat import flash_mla_sparse_fwd     # instead of: from flash_mla import ...
"""

import math

from . import _lib, _ops
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


# ---- FlashMLA's sparse decode: get_mla_metadata + flash_mla_with_kvcache ---------------------
class FlashMLASchedMeta:
    """What `get_mla_metadata()` returns in FlashMLA (since 2026-01): an object that the first
    `flash_mla_with_kvcache` call fills with that call's configuration, and later calls must
    match. smla needs no schedule on the device (its plan is made on the host from shapes),
    so this only records the configuration and checks that later calls agree, as FlashMLA
    does (an AssertionError there; a ValueError naming the field here)."""

    def __init__(self):
        self.have_initialized = False
        self.config = None

    def _check(self, config):
        if not self.have_initialized:
            self.config, self.have_initialized = config, True
            return
        for k, v in config.items():
            if self.config.get(k) != v:
                _ops.fail("compat.flash_mla_with_kvcache", "tile_scheduler_metadata",
                          "was made for %s = %r, this call has %r (one FlashMLASchedMeta per "
                          "shape: call get_mla_metadata() again)" % (k, self.config.get(k), v))


def get_mla_metadata(*args, **kwargs):
    """FlashMLA's `get_mla_metadata`: returns (FlashMLASchedMeta(), None). Its arguments
    (those of FlashMLA's older releases too: cache_seqlens, num_q_tokens_per_head_k,
    num_heads_k, num_heads_q=, is_fp8_kvcache=, topk=) are accepted and not needed: smla
    plans from shapes on the host, reads nothing from the device and launches nothing."""
    return FlashMLASchedMeta(), None


def _paged_cache(k_cache, fn, name):
    """[num_blocks, page, 1, row] -> (a [rows, row] view of its bytes, page, rows per block).
    Rows inside a block must be contiguous (stride(1) = row, as FlashMLA requires); the
    block stride may be larger, a whole number of rows (indices are then remapped)."""
    if not isinstance(k_cache, Tensor) or k_cache.dim() != 4 or k_cache.shape[2] != 1:
        _ops.fail(fn, name, "expected a [num_blocks, page_block_size, 1, row] tensor, got %s"
                  % (tuple(k_cache.shape) if isinstance(k_cache, Tensor)
                     else type(k_cache).__name__))
    nb, page, _, row = k_cache.shape
    s0, s1 = k_cache.stride(0), k_cache.stride(1)
    if k_cache.stride(3) != 1 or (page > 1 and s1 != row):
        _ops.fail(fn, name, "rows of a block must be contiguous (stride(1) = %d), got strides %s"
                  % (row, tuple(k_cache.stride())))
    per_block = page if nb == 1 else s0 // row
    if nb > 1 and (s0 % row or per_block < page):
        _ops.fail(fn, name, "the block stride %d is not a whole number of %d-element rows >= "
                  "page_block_size" % (s0, row))
    rows = (nb - 1) * per_block + page
    return k_cache.as_strided((rows, row), (row, 1)), page, per_block


def _slots_of(indices, page, per_block, T):
    """[b, s_q, topk] global token indices (block * page + offset; -1 skips) -> [T, topk]
    slots of the flat row view (equal unless blocks are padded). Device ops only."""
    idx = indices.reshape(T, indices.shape[-1])
    if per_block == page:
        return idx
    remapped = (idx // page) * per_block + idx % page
    return torch.where(idx >= 0, remapped, idx).to(torch.int32)


def _cache_format(k_cache, is_fp8_kvcache, d_qk, fn):
    row_bytes = k_cache.shape[-1] * k_cache.element_size()
    fmt = "fp8_ds" if is_fp8_kvcache else "bf16"
    want = int(_lib.lib.smla_cache_row_size(_ops.format_code(fmt, fn), d_qk - _ops.DC))
    if row_bytes != want:
        why = (" (FlashMLA's 584-byte fp8 layout of d_qk 512 models is not one smla reads)"
               if row_bytes == 584 else "")
        _ops.fail(fn, "k_cache", "rows of %d bytes, but is_fp8_kvcache=%s with d_qk %d means "
                  "%s rows of %d bytes%s" % (row_bytes, bool(is_fp8_kvcache), d_qk, fmt,
                                             want, why))
    return fmt


def flash_mla_with_kvcache(q, k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None,
                           topk_length=None, extra_topk_length=None):
    """FlashMLA's decode entry (`flash_mla.flash_mla_with_kvcache`) in its sparse form
    (`indices` given), computed by smla. Positional order and defaults as FlashMLA's.

    Args (FlashMLA's shapes):
        q: [b, s_q, h_q, d_qk] bfloat16, d_qk 576 (rope 64) or 512 (NoPE).
        k_cache: [num_blocks, page_block_size, 1, row]: the 656-byte FP8 layout of
            DeepSeek-V3.2 (uint8 / int8 / float8_e4m3fn, is_fp8_kvcache=True; 528 bytes for
            d_qk 512) or a bf16 cache (1152 / 1024 bytes a row, is_fp8_kvcache=False).
            Rows of a block contiguous; the block stride may be larger (whole rows).
        block_table, cache_seqlens: ignored in sparse mode (as FlashMLA does).
        head_dim_v: 512.
        tile_scheduler_metadata: get_mla_metadata()'s object (or the older releases'
            tensor); num_splits: None (or the older releases' tensor): not needed.
        softmax_scale: default d_qk ** -0.5.
        causal: False (sparse attention has no causal mask; FlashMLA asserts it too).
        indices: [b, s_q, topk] int32 token indices into k_cache, block * page_block_size
            + offset; -1 (or any value outside the cache) is skipped, wherever it sits.
        attn_sink: optional [h_q] float32: out *= exp(lse) / (exp(lse) + exp(attn_sink));
            lse itself is unchanged.
        topk_length: optional [b] int32: batch row i uses indices[i, :, :topk_length[i]].
        extra_k_cache, extra_indices_in_kvcache ([b, s_q, extra_topk]), extra_topk_length
            ([b]): a second cache attended together with the first (one softmax over both
            index lists).

    Returns (out, lse), as FlashMLA:
        out: [b, s_q, h_q, 512] bfloat16.
        lse: [b, h_q, s_q] float32 (a transposed view of a [b, s_q, h_q] buffer), natural
            log of sum exp(softmax_scale * q.k) over the used entries, without the sink.
        A row with no used entry: out 0, lse +inf.

    Differences from FlashMLA: any h_q in 1..128 (FlashMLA: 64 or 128, so 8 or 16 heads per
    GPU are padded); bf16 caches too; topk_length and the extra cache on every GPU (FlashMLA's
    SM90 V3.2 kernel refuses both) and any topk; any GPU smla runs on, and the CPU. No host
    sync; CUDA-graph safe once a first eager call has made the plan (as FlashMLA's schedule
    is made on the first call). With an extra cache the two parts are computed apart and
    merged by log-sum-exp (smla.merge_states), their bf16 outputs rounded once more.
    Dense decode (indices=None) is not smla's: it raises.
    """
    fn = "compat.flash_mla_with_kvcache"
    if indices is None:
        _ops.fail(fn, "indices", "is None: smla computes sparse attention only (FlashMLA's "
                  "dense paged decode is not provided)", NotImplementedError)
    if causal:
        _ops.fail(fn, "causal", "must be False in sparse mode (as FlashMLA asserts)")
    if head_dim_v != _ops.DC:
        _ops.fail(fn, "head_dim_v", "must be 512, got %r" % (head_dim_v,))
    if not isinstance(q, Tensor) or q.dim() != 4:
        _ops.fail(fn, "q", "expected a [b, s_q, h_q, d_qk] torch.Tensor, got %s"
                  % (tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__))
    b, s_q, h_q, d_qk = q.shape
    if d_qk not in (512, 576):
        _ops.fail(fn, "q", "d_qk must be 576 or 512, got %d" % d_qk)
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s_q):
        _ops.fail(fn, "indices", "expected [b=%d, s_q=%d, topk], got shape %s"
                  % (b, s_q, tuple(indices.shape)))
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        tile_scheduler_metadata._check(dict(
            b=b, s_q=s_q, h_q=h_q, page_block_size=k_cache.shape[1], is_fp8_kvcache=bool(
                is_fp8_kvcache), topk=indices.shape[-1],
            extra_topk=None if extra_indices_in_kvcache is None
            else extra_indices_in_kvcache.shape[-1]))
    scale = float(softmax_scale) if softmax_scale is not None else d_qk ** -0.5
    T = b * s_q
    qf = q.reshape(T, h_q, d_qk)

    def part(cache, idx, lengths, cname, out=None, lse=None):
        flat, page, per_block = _paged_cache(cache, fn, cname)
        fmt = _cache_format(cache, is_fp8_kvcache, d_qk, fn)
        slots = _slots_of(idx, page, per_block, T)
        ln = None if lengths is None else lengths.repeat_interleave(s_q)
        return _ops.forward(qf, None, flat, slots, sm_scale=scale, lengths=ln,
                            sink=attn_sink, format=fmt, dr=d_qk - _ops.DC,
                            return_lse=True, out=out, lse=lse)

    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        _ops.fail(fn, "extra_k_cache", "and extra_indices_in_kvcache come together")
    if extra_k_cache is None and extra_topk_length is not None:
        _ops.fail(fn, "extra_topk_length", "given without extra_k_cache")
    if extra_k_cache is None:
        out, lse = part(k_cache, indices, topk_length, "k_cache")
    else:
        if extra_indices_in_kvcache.dim() != 3 or \
                tuple(extra_indices_in_kvcache.shape[:2]) != (b, s_q):
            _ops.fail(fn, "extra_indices_in_kvcache", "expected [b=%d, s_q=%d, extra_topk], "
                      "got shape %s" % (b, s_q, tuple(extra_indices_in_kvcache.shape)))
        # each part's forward writes its slice of the merge's input
        out_p = torch.empty((2, T, h_q, _ops.DC), dtype=torch.bfloat16, device=q.device)
        lse_p = torch.empty((2, T, h_q), dtype=torch.float32, device=q.device)
        part(k_cache, indices, topk_length, "k_cache", out_p[0], lse_p[0])
        part(extra_k_cache, extra_indices_in_kvcache, extra_topk_length, "extra_k_cache",
             out_p[1], lse_p[1])
        out, lse = _ops.merge_states(out_p, lse_p, out_dtype=torch.bfloat16, return_lse=True,
                                     sink=attn_sink)
    lse = lse.nan_to_num_(nan=math.nan, posinf=math.inf, neginf=math.inf)  # empty: +inf
    return out.view(b, s_q, h_q, _ops.DC), lse.view(b, s_q, h_q).transpose(1, 2)


# ---- FlashInfer's MLA wrapper, without the host sync in plan ---------------------------------
class BatchMLAPagedAttentionWrapper:
    """FlashInfer's `flashinfer.mla.BatchMLAPagedAttentionWrapper` (plan / run), computed by
    smla: the use vLLM's FlashInfer sparse MLA backend makes of it (page_size 1: every
    "page" is one token slot, kv_indices the selected slots of each query row) and paged
    use in general (any page_size, causal or not).

    The difference that matters: plan never reads device memory on the host. FlashInfer's
    plan copies qo_indptr, kv_indptr and kv_len_arr to the host (a device sync when they
    live on the GPU); here, given CPU tensors (as vLLM passes them) they are read where they
    are, and given device tensors plan reads nothing and needs `max_kv_len=` (an upper
    bound on kv_len_arr, smla's keyword) instead; a device kv_len above it is cut to it, as
    it cannot be checked without the sync this avoids. run builds the per-row slot lists on the
    device from kv_indices as it is at run time, so it may be captured in a CUDA graph after
    a first eager run, with kv_indices rewritten between replays.

    Caches: ckv_cache [num_pages, page_size, 512] and kpe_cache [num_pages, page_size, dr]
    must be views of one buffer of [.., 512 + dr] rows (kpe right after ckv in each row, as
    vLLM's views of its [slots, 1, 576] cache are), rows evenly spaced; bf16 (smla's BF16
    format) or float8_e4m3fn with one scale for both parts (ckv_scale == kpe_scale:
    FP8_TENSOR). Per-channel-group scales (ckv_scale_arr) and the cutlass backend's
    arguments (kv_len, page_table) are refused with a message.

    lse (return_lse): [T, H] float32, base 2 unless return_lse_base_on_e=True, -inf for a
    row with no KV token (its out is 0), as FlashInfer. Any head count 1..128."""

    def __init__(self, float_workspace_buffer=None, use_cuda_graph=False, qo_indptr=None,
                 kv_indptr=None, kv_indices=None, kv_len_arr=None, backend="auto"):
        """FlashInfer's constructor arguments are accepted and not needed: smla allocates no
        workspace here, and run reads the kv_indices given to plan (any device buffer
        an engine keeps for CUDA graphs works as it is)."""
        self._planned = False

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type,
             use_profiler=False, *, max_kv_len=None):
        fn = "compat.BatchMLAPagedAttentionWrapper.plan"
        if head_dim_ckv != _ops.DC:
            _ops.fail(fn, "head_dim_ckv", "must be 512, got %r" % (head_dim_ckv,))
        if head_dim_kpe not in (0, 64):
            _ops.fail(fn, "head_dim_kpe", "must be 64 or 0, got %r" % (head_dim_kpe,))
        if int(page_size) < 1:
            _ops.fail(fn, "page_size", "must be >= 1, got %r" % (page_size,))
        if kv_data_type not in (torch.bfloat16, torch.float8_e4m3fn):
            _ops.fail(fn, "kv_data_type", "bfloat16 or float8_e4m3fn, got %r" % (kv_data_type,))
        if q_data_type != torch.bfloat16:
            _ops.fail(fn, "q_data_type", "must be bfloat16, got %r" % (q_data_type,))
        R = kv_len_arr.shape[0]
        host = all(t.device.type == "cpu" for t in (qo_indptr, kv_len_arr))
        dev = kv_indices.device
        if host:  # read where they are: no device sync
            qo = qo_indptr.to(torch.int64)
            kvl = kv_len_arr.to(torch.int64)
            q_len = qo[1:R + 1] - qo[:R]
            num_rows = int(qo[R])
            req = torch.repeat_interleave(torch.arange(R), q_len)
            k_max = int(kvl.max()) if R else 0
            if max_kv_len is not None and k_max > int(max_kv_len):
                _ops.fail(fn, "max_kv_len", "= %d, but kv_len_arr holds %d"
                          % (int(max_kv_len), k_max))
            self._req = req.to(dev, non_blocking=True)
            self._row_in_req = (torch.arange(num_rows) - qo[req]).to(dev, non_blocking=True)
            self._q_len = q_len[req].to(dev, non_blocking=True)  # per row
        else:
            if max_kv_len is None:
                _ops.fail(fn, "max_kv_len", "qo_indptr / kv_len_arr are on %s: reading them "
                          "here would sync with the device (what FlashInfer's plan does); pass "
                          "CPU tensors, or max_kv_len= (an upper bound on kv_len_arr)"
                          % qo_indptr.device)
            k_max = int(max_kv_len)
            num_rows = None  # from q_nope at run time
            self._req = None
            self._qo_dev = qo_indptr.to(dev, torch.int64)
        self._kv_indptr = kv_indptr.to(dev, torch.int64, non_blocking=True)
        self._kv_len = kv_len_arr.to(dev, torch.int32, non_blocking=True)
        self._kv_indices = kv_indices
        self._num_rows, self._k = num_rows, max(1, k_max)
        self._heads, self._dr, self._page = int(num_heads), int(head_dim_kpe), int(page_size)
        self._causal, self._scale = bool(causal), float(sm_scale)
        self._kv_dtype = kv_data_type
        self._built = {}
        if num_rows is not None:
            self._index(num_rows)
        self._planned = True

    def _index(self, T):
        """Per plan and row count (made once, device ops only; plan-time work, shared by
        every layer's run): where each row's entries sit in kv_indices (pos [T, K], clamped
        into it), the in-page offsets (None for page_size 1) and the lengths [T]."""
        got = self._built.get(T)
        if got is not None:
            return got
        req, row_in_req, q_len = self._rows(T)
        K, p = self._k, self._page
        dev = self._kv_indices.device
        k = torch.arange(K, device=dev)
        n_idx = self._kv_indices.numel()
        pos = (self._kv_indptr[req][:, None] + (k // p)[None, :]).clamp(0, max(n_idx - 1, 0))
        # nothing to read: run gathers from a dummy entry; every length below is 0
        self._empty_src = (None if n_idx else
                           torch.full((1,), -1, dtype=torch.int32, device=dev))
        off = None if p == 1 else (k % p).to(torch.int32)[None, :]
        lengths = self._kv_len[req].to(torch.int64)
        if self._causal:  # row i of a request of q_len rows sees kv_len - q_len + i + 1 tokens
            lengths = lengths - q_len + row_in_req + 1
        lengths = lengths.clamp(0, K if n_idx else 0).to(torch.int32)
        self._built[T] = (pos, off, lengths)
        return self._built[T]

    def _rows(self, T):
        """Per query row: its request and, causal, its row within the request (device)."""
        if self._req is not None:
            return self._req, self._row_in_req, self._q_len
        t = torch.arange(T, device=self._qo_dev.device)
        qo = self._qo_dev
        req = torch.searchsorted(qo[1:], t, right=True)
        req = torch.clamp(req, max=qo.shape[0] - 2)
        return req, t - qo[req], qo[req + 1] - qo[req]

    def _cache(self, ckv_cache, kpe_cache, ckv_scale, kpe_scale, fn):
        dr, page = self._dr, self._page
        for name, c, w in (("ckv_cache", ckv_cache, _ops.DC), ("kpe_cache", kpe_cache, dr)):
            if not isinstance(c, Tensor) or c.dim() != 3 or c.shape[1] != page or c.shape[2] != w:
                _ops.fail(fn, name, "expected [num_pages, page_size=%d, %d], got %s"
                          % (page, w, tuple(c.shape) if isinstance(c, Tensor) else type(c)))
            if c.dtype != self._kv_dtype:
                _ops.fail(fn, name, "dtype %s, planned kv_data_type %s" % (c.dtype,
                                                                           self._kv_dtype))
        row = ckv_cache.stride(1) if page > 1 else ckv_cache.stride(0)
        es = ckv_cache.element_size()
        if ckv_cache.stride(2) != 1 or (ckv_cache.shape[0] > 1 and
                                        ckv_cache.stride(0) != page * row):
            _ops.fail(fn, "ckv_cache", "rows must be evenly spaced (stride(0) = page_size * "
                      "stride(1)), got strides %s" % (tuple(ckv_cache.stride()),))
        if dr and (kpe_cache.data_ptr() != ckv_cache.data_ptr() + _ops.DC * es or
                   kpe_cache.stride()[:2] != ckv_cache.stride()[:2]):
            _ops.fail(fn, "kpe_cache", "must be the rope part of ckv_cache's rows (one buffer "
                      "of [.., 512 + %d] rows, kpe right after ckv); separate buffers are not a "
                      "layout smla reads" % dr)
        rows = ckv_cache.shape[0] * page
        flat = ckv_cache.as_strided((rows, _ops.DC + dr), (row, 1))
        if self._kv_dtype == torch.bfloat16:
            if ckv_scale is not None or kpe_scale is not None:
                _ops.fail(fn, "ckv_scale", "scales are for an fp8 cache")
            return flat, "bf16", None
        if ckv_scale is None or (dr and kpe_scale is None):
            _ops.fail(fn, "ckv_scale", "an fp8 cache needs ckv_scale (and kpe_scale)")
        s = float(ckv_scale)
        if dr and float(kpe_scale) != s:
            _ops.fail(fn, "kpe_scale", "must equal ckv_scale (%g) for smla's FP8_TENSOR format, "
                      "got %g" % (s, float(kpe_scale)))
        return flat.view(torch.uint8), "fp8_tensor", s

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False,
            o_scale=None, *, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None):
        fn = "compat.BatchMLAPagedAttentionWrapper.run"
        if not self._planned:
            _ops.fail(fn, "plan", "run before plan", RuntimeError)
        for name, v in (("profiler_buffer", profiler_buffer), ("kv_len", kv_len),
                        ("page_table", page_table), ("o_scale", o_scale),
                        ("ckv_scale_arr", ckv_scale_arr)):
            if v is not None:
                _ops.fail(fn, name, "is not supported by smla's wrapper (the fa2/fa3 form of "
                          "run, one scale per cache)")
        T, H = q_nope.shape[0], q_nope.shape[1]
        if H != self._heads:
            _ops.fail(fn, "q_nope", "has %d heads, planned num_heads %d" % (H, self._heads))
        if self._num_rows is not None and T != self._num_rows:
            _ops.fail(fn, "q_nope", "has %d rows, plan's qo_indptr[-1] = %d"
                      % (T, self._num_rows))
        cache, fmt, scale = self._cache(ckv_cache, kpe_cache, ckv_scale, kpe_scale, fn)
        pos, off, lengths = self._index(T)
        src = self._kv_indices.reshape(-1) if self._empty_src is None else self._empty_src
        pages = src[pos]  # the one gather per run: kv_indices as they are now
        if pages.dtype != torch.int32:
            pages = pages.to(torch.int32)
        slots = pages if off is None else pages * self._page + off
        want_lse = return_lse or lse is not None
        res = _ops.forward(q_nope, q_pe if self._dr else None, cache, slots,
                           sm_scale=self._scale, lengths=lengths, format=fmt, dr=self._dr,
                           scale=scale, out=out, return_lse=want_lse)
        if not want_lse:
            return res
        o, l_ = res
        if not return_lse_base_on_e:
            l_ = l_ * _LOG2E
        if lse is not None:
            lse.copy_(l_)
            l_ = lse
        return o, l_
