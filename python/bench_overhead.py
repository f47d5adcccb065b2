#!/usr/bin/env python3
"""Host overhead of the Python binding per forward call, against the bare C call.

    python3 python/bench_overhead.py [--heads 16] [--topk 2048] [--batches 200] [--json F]

On CUDA (torch with a GPU) it times T=1 decode forwards; else the CPU backend with tiny
shapes (1 thread). Every variant runs in batches of --calls calls whose host time is
measured (on CUDA the GPU is synchronized between batches, outside the timed part, so the
launch queue never fills and blocks); the figure is the median over batches of the time
per call. Variants, interleaved round by round:

  c            smla_forward() through ctypes with a params struct filled once: the floor
               (what a C++ engine would pay, plus ctypes' ~0.5 µs call)
  eager        smla.forward(q, None, kv, slots, lengths=lengths) with kv an smla.KVCache
               (made once, as an engine does at start-up): checks, cached plan lookup,
               out from torch's allocator, launch on the current stream. The bar.
  eager_lse    the same with return_lse=True (a second allocation)
  eager_raw    the same with the bare cache tensor instead of a KVCache (its layout is
               looked up by shape and strides on every call)
  plan_out     plan.forward(..., out=, lse=) on preallocated outputs (no allocation)
  custom_op    torch.ops.smla.forward(...) through the torch dispatcher (what a compiled
               graph calls; shown for reference, not on the eager path)
  compat_flashmla    smla.compat.flash_mla_with_kvcache on a paged view of the same cache
  compat_flashinfer  smla.compat.BatchMLAPagedAttentionWrapper.run (page_size 1, planned once)

overhead = variant - c. The issue's bar: eager - c < 10 µs at T=1.
"""

import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import smla  # noqa: E402
from smla import _lib, _ops  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=None, help="N (default 16 on CUDA, 1 on CPU)")
    ap.add_argument("--topk", type=int, default=None, help="K (default 2048 on CUDA, 8 on CPU)")
    ap.add_argument("--tokens", type=int, default=1, help="T (default 1)")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed batch")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--cpu", action="store_true", help="the CPU even when a GPU is there")
    ap.add_argument("--no-inference-mode", action="store_true", help="time outside "
                    "torch.inference_mode (default: inside, as engines run)")
    ap.add_argument("--gc", action="store_true", help="leave Python's garbage collector on "
                    "while timing (default: off, for steadier medians)")
    a = ap.parse_args()

    cuda = torch is not None and torch.cuda.is_available() and not a.cpu
    N = a.heads or (16 if cuda else 1)
    K = a.topk or (2048 if cuda else 8)
    T = a.tokens
    S = 65536 if cuda else 64
    if torch is None:
        print("torch is not installed: timing the numpy path on the CPU")
    if not cuda:
        smla.set_num_threads(1)
    dev = "cuda" if cuda else "cpu"

    if torch is not None:
        g = torch.Generator().manual_seed(0)
        q = torch.randn((T, N, 576), generator=g).to(torch.bfloat16).to(dev)
        cache = torch.randn((S, 576), generator=g).to(torch.bfloat16).to(dev)
        slots = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32).to(dev)
        lengths = torch.full((T,), K, dtype=torch.int32, device=dev)
        ptr = lambda x: x.data_ptr()  # noqa: E731
        sync = torch.cuda.synchronize if cuda else (lambda: None)
    else:
        import numpy as np
        rng = np.random.default_rng(0)
        q = smla.bf16_from_f32(rng.standard_normal((T, N, 576)))
        cache = smla.bf16_from_f32(rng.standard_normal((S, 576)))
        slots = rng.integers(0, S, (T, K)).astype(np.int32)
        lengths = np.full(T, K, np.int32)
        ptr = lambda x: x.ctypes.data  # noqa: E731
        sync = lambda: None  # noqa: E731

    kv = smla.KVCache(cache)
    out0, lse0 = smla.forward(q, None, cache, slots, lengths=lengths, return_lse=True)  # plan
    plan = _ops.auto_plan(_ops.device_index(dev), N, K, 64, 0, T)
    print("inference_mode: %s" % ("off" if a.no_inference_mode or torch is None else "on"))
    print("device: %s; torch %s; python %s; gc %s" % (
        torch.cuda.get_device_name() if cuda else "cpu (1 thread)",
        torch.__version__ if torch is not None else "none", sys.version.split()[0],
        "on" if a.gc else "off"))
    print("shape: T=%d N=%d K=%d bf16 cache, S=%d; plan: %s" % (T, N, K, S, plan.describe))
    out_pre = smla.forward(q, None, kv, slots, lengths=lengths, plan=plan)
    lse_pre = lse0.clone() if torch is not None else lse0.copy()

    if not a.gc:
        gc.disable()  # steadier medians; --gc keeps the collector's pauses in
    # The floor: one params struct, filled once, handed to smla_forward as is.
    p = _lib.smla_forward_params()
    p.num_tokens, p.num_heads, p.topk = T, N, K
    p.q_nope, p.q_nope_stride_t, p.q_nope_stride_h = ptr(q), N * 576, 576
    p.q_pe, p.q_pe_stride_t, p.q_pe_stride_h = ptr(q) + 1024, N * 576, 576
    p.cache = _lib.smla_cache(0, 64, S, 1152, ptr(cache), 0.0)
    p.slots, p.slots_stride, p.lengths = ptr(slots), K, ptr(lengths)
    p.sm_scale = 1 / math.sqrt(576)
    p.out, p.out_stride_t, p.out_stride_h = ptr(out_pre), N * 512, 512
    p.lse, p.lse_stride_t = ptr(lse_pre), N
    addr = _lib.ctypes.addressof(p)
    handle = plan._handle
    fwd_c = _lib.lib.smla_forward
    stream = (torch.cuda.current_stream().cuda_stream if cuda else None)

    def c_call():
        return fwd_c(handle, addr, stream)

    def eager():
        return smla.forward(q, None, kv, slots, lengths=lengths)

    def eager_lse():
        return smla.forward(q, None, kv, slots, lengths=lengths, return_lse=True)

    def eager_raw():
        return smla.forward(q, None, cache, slots, lengths=lengths, return_lse=True)

    def plan_out():
        return plan.forward(q, None, kv, slots, lengths=lengths, out=out_pre, lse=lse_pre)

    variants = [("c", c_call), ("eager", eager), ("eager_lse", eager_lse),
                ("eager_raw", eager_raw), ("plan_out", plan_out)]
    if torch is not None:
        # The engines' calls through smla.compat on the same data: FlashMLA's sparse decode
        # (a paged [S/64, 64, 1, 576] view of the cache, indices [1, T, K]) and FlashInfer's
        # wrapper (page_size 1, one request per row; planned once, as per step).
        from smla import compat
        paged = cache.view(S // 64, 64, 1, 576)
        idx3 = slots.view(1, T, K)
        sched = compat.get_mla_metadata()[0]

        def compat_flashmla():
            return compat.flash_mla_with_kvcache(q.view(1, T, N, 576), paged, None, None, 512,
                                                 sched, softmax_scale=p.sm_scale,
                                                 indices=idx3)
        wrapper = compat.BatchMLAPagedAttentionWrapper(None)
        wrapper.plan(torch.arange(T + 1, dtype=torch.int32),
                     torch.arange(T + 1, dtype=torch.int32) * K, slots.view(-1),
                     torch.full((T,), K, dtype=torch.int32), N, 512, 64, 1, False, p.sm_scale,
                     torch.bfloat16, torch.bfloat16)
        flat = cache.view(S, 1, 576)

        def compat_flashinfer():
            return wrapper.run(q[..., :512], q[..., 512:], flat[..., :512], flat[..., 512:])
        variants += [("compat_flashmla", compat_flashmla),
                     ("compat_flashinfer", compat_flashinfer)]
    if torch is not None and hasattr(torch.ops, "smla") and hasattr(torch.library, "custom_op"):
        def custom_op():
            return torch.ops.smla.forward(q, None, cache, slots, lengths, None, None, 0, 64,
                                          0.0, p.sm_scale, 0.0, True, False, 0)
        variants.append(("custom_op", custom_op))

    assert c_call() == 0
    # Timed under torch.inference_mode, as an engine runs its model (and the condition of
    # the binding's output pool); --no-inference-mode times plain eager mode.
    mode = torch.inference_mode() if torch is not None and not a.no_inference_mode \
        else contextlib.nullcontext()
    with mode:
        for _, f in variants:  # warm-up
            for _ in range(50):
                f()
        sync()
        per = {name: [] for name, _ in variants}
        clock = time.perf_counter_ns
        for _ in range(a.batches):
            for name, f in variants:
                sync()
                t0 = clock()
                for _ in range(a.calls):
                    f()
                t1 = clock()
                per[name].append((t1 - t0) / a.calls / 1000.0)
        sync()

    med = {k: statistics.median(v) for k, v in per.items()}
    print("\nhost time per forward call (median of %d batches of %d calls), µs:"
          % (a.batches, a.calls))
    for name, _ in variants:
        extra = "" if name == "c" else "   overhead vs c: %+.2f" % (med[name] - med["c"])
        print("  %-17s %7.2f%s" % (name, med[name], extra))
    if torch is not None:
        try:
            parts = breakdown(q, slots, lengths, plan, clock)
            print("\npieces of the eager path, host µs each (median of 200 x 200):")
            for k, v in parts.items():
                print("  %-28s %6.3f" % (k, v))
        except Exception as e:  # informative only: never hide the verdict below
            print("\nbreakdown failed: %r" % (e,))
    over = med["eager"] - med["c"]
    verdict = "PASS" if over < 10.0 else "FAIL"
    print("\nbinding overhead, eager smla.forward at T=%d: %.2f µs (%s: bar < 10 µs)"
          % (T, over, verdict))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu",
                       "T": T, "N": N, "K": K, "median_us": med,
                       "overhead_eager_us": over, "verdict": verdict,
                       "torch": torch.__version__ if torch is not None else None,
                       "smla": smla.version(), "library": smla.library_path}, fh, indent=1)
    return 0 if verdict == "PASS" else 1


def breakdown(q, slots, lengths, plan, clock):
    """Times the torch calls the eager fast path makes, one by one: where the overhead
    goes (for whoever makes it smaller)."""
    from smla import _ops as o
    T, N = q.shape[0], q.shape[1]
    f32 = torch.float32
    di = q.get_device()
    qdev = q.device
    # Only host-side pieces: anything that launches would fill the GPU's queue in these
    # unsynchronized loops and time the GPU instead (the variants above sync per batch).
    pieces = {
        "torch.empty(device=q.device)": lambda: torch.empty((T, N, 512), dtype=torch.bfloat16,
                                                            device=qdev),
        "_is_compiling()": (lambda: o._is_compiling()) if o._is_compiling else (lambda: 0),
        "q.get_device()": lambda: q.get_device(),
        "q.shape": lambda: q.shape,
        "q.stride()": lambda: q.stride(),
        "q.dtype is bf16": lambda: q.dtype is torch.bfloat16,
        "slots.data_ptr()": lambda: slots.data_ptr(),
        "lengths.shape != (T,)": lambda: lengths.shape != (T,),
        "q.new_empty out [T,N,512]": lambda: q.new_empty((T, N, 512)),
        "q.new_empty lse f32": lambda: q.new_empty((T, N), dtype=f32),
        "raw current stream": (lambda: o._raw_stream(di)) if di >= 0 and
        o._raw_stream is not None else (lambda: None),
        "pack params (_FWD.pack_into)": lambda: o._FWD.pack_into(
            plan._params, 0, T, N, 2048, 0, 0, 0, 0, 0, 0, 0, 64, 1, 1152, 0, 0.0, 0, 0, 0,
            0.1, 0.0, 0, 0, 0, 0, 0, 0, 0, N, 0),
        "empty python call f(*18)": lambda: _nop(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                14, 15, 16, 17, 18),
    }
    res = {}
    for name, f in pieces.items():
        samples = []
        for _ in range(200):
            t0 = clock()
            for _ in range(200):
                f()
            samples.append((clock() - t0) / 200 / 1000.0)
        res[name] = statistics.median(samples)
    return res


def _nop(*a):
    return a


if __name__ == "__main__":
    sys.exit(main())
