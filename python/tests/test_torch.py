"""torch tensors: every op against a torch float32 reference (gather, matmul, softmax) on
the CPU and on the GPU; the custom ops (opcheck, torch.compile fullgraph); CUDA graph
capture and replay; streams. Skips without torch; the CUDA cases skip without a GPU."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch tests need torch (CI installs only "
                            "numpy and pytest)")

import smla  # noqa: E402

if not smla.HAVE_TORCH:
    pytest.skip("smla was imported without torch (SMLA_NO_TORCH=1)", allow_module_level=True)

from conftest import DEVICES, cuda_available  # noqa: E402
from refs import (DC, TOL_LSE, check_unbiased, make_cache, out_model,  # noqa: E402
                  ref_convert, ref_merge, ref_metadata)

needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs torch with a GPU "
                                "(torch.cuda.is_available() is False)")
needs_custom_op = pytest.mark.skipif(not hasattr(torch.library, "custom_op"),
                                     reason="torch.library.custom_op needs torch >= 2.4")


def torch_ref_forward(q, rows, slots, sm_scale, lengths=None, softcap=0.0, sink=None,
                      abs_mean=False):
    """float32 torch reference: gather, matmul, softmax. q [T, N, D], rows [S, D] (NaN in
    rows nobody may read), slots [T, K]. -> out [T, N, 512], lse, max_logit [T, N]; with
    abs_mean=True also sum_j p_j |v_j| [T, N, 512] (for out_atol)."""
    q = q.float()
    T, N, D = q.shape
    S, K = rows.shape[0], slots.shape[1]
    idx = slots.long()
    used = (idx >= 0) & (idx < S)
    if lengths is not None:
        used &= torch.arange(K, device=q.device)[None, :] < lengths.long().clamp(0, K)[:, None]
    g = rows.float()[idx.clamp(0, S - 1)]                               # [T, K, D]
    g = torch.where(used[..., None], g, torch.zeros((), device=q.device))
    logits = sm_scale * torch.matmul(q, g.transpose(1, 2))              # [T, N, K]
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits.masked_fill(~used[:, None, :], -math.inf)
    m = logits.amax(-1)
    lse = torch.logsumexp(logits, -1)
    empty = ~used.any(-1)                                               # [T]
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(logits - m_safe[..., None])
    den = w.sum(-1)
    if sink is not None:
        den = den + torch.exp(sink.float()[None, :] - m_safe)
    out = torch.matmul(w, g[..., :DC]) / den[..., None]
    out[empty] = 0
    if abs_mean:
        pabs = torch.matmul(w, g[..., :DC].abs()) / den[..., None]
        pabs[empty] = 0
        return out, lse, m, pabs
    return out, lse, m


def out_atol(device, pabs):
    """The absolute part of the bound on forward's out (see tests/fwd.c, TOL_OUT): 3e-3,
    and on CUDA, whose kernels round each probability p_j to bf16 before P.V (round to
    nearest: relative error <= 2^-8, bf16's unit roundoff; the denominator sums the
    unrounded p_j) also 2^-8 sum_j p_j |v_j|: the most that rounding can move out by.
    These values reach |v| ~ 16, where 3e-3 alone is below that worst case."""
    return 3e-3 + (2.0 ** -8) * pabs if device == "cuda" else 3e-3


def check_close(got, ref, atol, rtol, what):
    got, ref = got.float().cpu(), ref.float().cpu()
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), what
    inf = torch.isinf(ref)
    assert torch.equal(got[inf], ref[inf]), what + ": inf positions"
    fin = ~(inf | torch.isnan(ref))
    err = (got[fin] - ref[fin]).abs()
    if isinstance(atol, torch.Tensor):  # an elementwise bound
        atol = atol.float().cpu()[fin]
    tol = atol + rtol * ref[fin].abs()
    assert bool((err <= tol).all()), "%s: worst err/tol %.3g" % (what, float((err / tol).max()))


def same(a, b):
    """Bitwise on the CPU backend; within one bf16/fp32 rounding on CUDA, where a different
    launch (other strides, another stream, a compiled graph) need not promise the same
    bits."""
    if a.device.type == "cpu":
        assert torch.equal(a, b)
    else:
        tol = 1e-2 if a.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(a, b, rtol=tol, atol=tol / 10)


def to_dev(a, device):
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def make_case(device, fmt, dr, T, N, K, S, seed, lengths=True, sink=True):
    rng = np.random.default_rng(seed)
    used = set(rng.choice(S, size=max(1, S * 3 // 4), replace=False).tolist())
    cache_np, rows_np, scale = make_cache(fmt, dr, S, rng, used)
    cache = to_dev(cache_np, device)
    rows = torch.from_numpy(rows_np).float().to(device)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((T, N, DC + dr), generator=gen).to(torch.bfloat16).to(device)
    ul = torch.tensor(sorted(used), dtype=torch.int32)
    slots = ul[torch.randint(0, len(used), (T, K), generator=gen)]
    junk = torch.tensor([-1, -1, S, S + 9, -5], dtype=torch.int32)
    bad = torch.rand((T, K), generator=gen) < 0.2
    slots = torch.where(bad, junk[torch.randint(0, 5, (T, K), generator=gen)], slots).to(device)
    ln = torch.randint(-1, K + 2, (T,), generator=gen, dtype=torch.int32).to(device) \
        if lengths else None
    sk = torch.randn(N, generator=gen).to(device) if sink else None
    return q, smla.KVCache(cache, format=fmt, dr=dr, scale=scale), rows, slots, ln, sk


# ---- each op against the reference, on every device ---------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,dr", [("bf16", 64), ("bf16", 0), ("fp8_tensor", 64),
                                    ("fp8_ds", 64), ("fp8_ds", 0)])
@pytest.mark.parametrize("shape", [(1, 16, 2048, 2500), (4, 128, 64, 300), (7, 8, 33, 50),
                                   (2, 64, 512, 700)])
def test_forward(device, fmt, dr, shape):
    T, N, K, S = shape
    q, kv, rows, slots, lengths, sink = make_case(device, fmt, dr, T, N, K, S,
                                                  seed=T * 131 + N + K + dr)
    softcap = 15.0 if N == 8 else 0.0
    sm_scale = 1.0 / math.sqrt(DC + dr)
    out, lse, mx = smla.forward(q, None, kv, slots, sm_scale=sm_scale, lengths=lengths,
                                sink=sink, softcap=softcap, return_lse=True,
                                return_max_logit=True)
    assert out.device == q.device and out.dtype == torch.bfloat16
    r_out, r_lse, r_mx, pabs = torch_ref_forward(q, rows, slots, sm_scale, lengths, softcap,
                                                 sink, abs_mean=True)
    check_close(out, r_out, out_atol(device, pabs), 1.6e-2, "out")
    check_unbiased(out.float().cpu().numpy(), r_out.cpu().numpy(), "out", out_model(device))
    check_close(lse, r_lse, *TOL_LSE, "lse")
    check_close(mx, r_mx, *TOL_LSE, "max_logit")
    # separate q_nope / q_pe views of the same buffer: the same bits
    if dr:
        out2 = smla.forward(q[..., :DC], q[..., DC:], kv, slots, sm_scale=sm_scale,
                            lengths=lengths, sink=sink, softcap=softcap)
        same(out, out2)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_preallocated_outputs_and_counter(device):
    q, kv, rows, slots, lengths, sink = make_case(device, "bf16", 64, 3, 16, 40, 80, seed=9)
    out = torch.full((3, 16, DC), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((3, 16), float("nan"), device=device)
    bad = torch.zeros(1, dtype=torch.int64, device=device)
    got = smla.forward(q, None, kv, slots, lengths=lengths, out=out, lse=lse, bad_inputs=bad)
    assert got[0] is out and got[1] is lse
    r_out, r_lse, _, pabs = torch_ref_forward(q, rows, slots, 1 / math.sqrt(576), lengths,
                                              abs_mean=True)
    check_close(out, r_out, out_atol(device, pabs), 1.6e-2, "out")
    check_unbiased(out.float().cpu().numpy(), r_out.cpu().numpy(), "out", out_model(device))
    check_close(lse, r_lse, *TOL_LSE, "lse")
    K = slots.shape[1]
    inside = torch.arange(K, device=device)[None] < lengths.long().clamp(0, K)[:, None]
    want_bad = int((((slots >= 80) | (slots < -1)) & inside).sum())
    assert int(bad.item()) == want_bad


@pytest.mark.parametrize("device", DEVICES)
def test_convert_indices(device):
    rng = np.random.default_rng(3)
    T, K, R, B, bs = 5, 40, 3, 6, 64
    bt = rng.integers(-1, 50, (R, B)).astype(np.int32)
    req = np.array([0, 2, 1, 3, 0], np.int32)
    loc = rng.integers(-2, B * bs + 5, (T, K)).astype(np.int32)
    for compact in (False, True):
        r_s, r_v = ref_convert(req, bt, loc, bs, compact)
        s, v = smla.convert_indices(to_dev(req, device), to_dev(bt, device), to_dev(loc, device),
                                    block_size=bs, compact=compact, return_valid=True)
        assert torch.equal(s.cpu(), torch.from_numpy(r_s))
        assert torch.equal(v.cpu(), torch.from_numpy(r_v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bf16", "fp8_tensor", "fp8_ds"])
def test_cache_write_then_forward(device, fmt):
    """Rows written by cache_write read back by forward equal the torch reference over
    the dequantized inputs (bf16 exactly; fp8 within its rounding)."""
    T, S, N, K = 12, 40, 16, 12
    gen = torch.Generator().manual_seed(5)
    kv_c = torch.randn((T, DC), generator=gen).to(torch.bfloat16).to(device)
    k_pe = torch.randn((T, 64), generator=gen).to(torch.bfloat16).to(device)
    slot = torch.randperm(S, generator=gen)[:T].to(torch.int64).to(device)
    row = smla.cache_row_size(fmt, 64)
    cache = torch.zeros((S, row), dtype=torch.uint8, device=device)
    kv = smla.KVCache(cache, format=fmt, scale=0.01 if fmt == "fp8_tensor" else None)
    smla.cache_write(kv_c, k_pe, slot, kv)
    rows = torch.full((S, DC + 64), float("nan"), device=device)
    inputs = torch.cat([kv_c, k_pe], 1).float()
    if fmt == "bf16":
        rows[slot] = inputs
    else:  # the written bytes, dequantized, are the inputs within e4m3's rounding (2^-4)
        from refs import decode_row
        c = cache.cpu().numpy()
        dec = torch.from_numpy(np.stack([decode_row(fmt, 64, c[s], kv.scale or 1.0)
                                         for s in slot.cpu().tolist()])).float().to(device)
        assert bool(((dec - inputs).abs() <= inputs.abs() / 16 + 0.01).all())
        rows[slot] = dec
    q = torch.randn((2, N, DC + 64), generator=gen).to(torch.bfloat16).to(device)
    slots = slot[torch.randint(0, T, (2, K), generator=gen).to(device)].to(torch.int32)
    out, lse = smla.forward(q, None, kv, slots, return_lse=True)
    r_out, r_lse, _ = torch_ref_forward(q, rows, slots, 1 / math.sqrt(576))
    tol = (3e-3, 1.6e-2, 2e-3)
    check_close(out, r_out, tol[0], tol[1], "out")
    check_close(lse, r_lse, tol[2], 1e-3, "lse")


@pytest.mark.parametrize("device", DEVICES)
def test_merge_states(device):
    gen = torch.Generator().manual_seed(6)
    P, T, N, dv = 4, 3, 16, 512
    out_p = torch.randn((P, T, N, dv), generator=gen)
    lse_p = torch.randn((P, T, N), generator=gen) * 4
    lse_p[1, 0, 3] = -math.inf
    lse_p[:, 2, 0] = -math.inf
    r_out, r_lse = ref_merge(out_p.numpy(), lse_p.numpy())
    for dt in (torch.float32, torch.bfloat16):
        o, lse = smla.merge_states(out_p.to(dt).to(device), lse_p.to(device), return_lse=True)
        assert o.dtype == dt
        r = ref_merge(out_p.to(dt).float().numpy(), lse_p.numpy())[0]
        tol = (1e-5, 1e-5) if dt == torch.float32 else (2e-3, 8e-3)
        check_close(o, torch.from_numpy(r), tol[0], tol[1], "out %s" % dt)
        check_close(lse, torch.from_numpy(r_lse), 1e-5, 1e-6, "lse")
    o32 = smla.merge_states(out_p.to(torch.bfloat16).to(device), lse_p.to(device),
                            out_dtype=torch.float32)
    assert o32.dtype == torch.float32
    assert r_out.shape == tuple(o32.shape)


def test_build_metadata_tensors():
    qsl = torch.tensor([0, 1, 2, 12, 15], dtype=torch.int32)
    seq = torch.tensor([40, 2, 10, 3], dtype=torch.int32)
    r, c, lim = smla.build_metadata(qsl, seq, num_tokens=16, topk=8)
    want = ref_metadata(qsl.numpy(), seq.numpy(), 16, 8)
    for g, w in zip((r, c, lim), want):
        assert isinstance(g, torch.Tensor) and torch.equal(g, torch.from_numpy(w))
    if cuda_available():
        with pytest.raises(ValueError, match="host"):
            smla.build_metadata(qsl.cuda(), seq, num_tokens=16, topk=8)


def test_mixed_kinds_are_an_error():
    q, kv, rows, slots, lengths, sink = make_case("cpu", "bf16", 64, 2, 16, 8, 20, seed=1)
    with pytest.raises(TypeError, match="slots: expected a torch.Tensor"):
        smla.forward(q, None, kv, slots.numpy())
    with pytest.raises(TypeError, match="q_nope: expected dtype bfloat16, got float32"):
        smla.forward(q.float(), None, kv, slots)


@needs_cuda
def test_device_mismatch_is_an_error():
    q, kv, rows, slots, lengths, sink = make_case("cuda", "bf16", 64, 2, 16, 8, 20, seed=1)
    with pytest.raises(ValueError, match="slots: is on cpu, the other arguments on cuda:0"):
        smla.forward(q, None, kv, slots.cpu())


# ---- torch.library custom ops ------------------------------------------------------------------------
@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    q, kv, rows, slots, lengths, sink = make_case(device, "bf16", 64, 3, 16, 24, 40, seed=2)
    bad = torch.zeros(1, dtype=torch.int64, device=device)
    args = (q, None, kv.data, slots, lengths, sink, bad, 0, 64, 0.0, 0.04, 0.0, True, True, 0)
    smla.forward(q, None, kv, slots)     # the plan exists before opcheck's traced runs
    torch.library.opcheck(torch.ops.smla.forward.default, args)
    out = torch.empty((3, 16, DC), dtype=torch.bfloat16, device=device)
    lse = torch.empty((3, 16), device=device)
    torch.library.opcheck(torch.ops.smla.forward_out.default,
                          (q, None, kv.data, slots, lengths, sink, bad, out, lse, None, 0, 64,
                           0.0, 0.04, 0.0, 0))
    req = torch.zeros(3, dtype=torch.int32, device=device)
    bt = torch.arange(4, dtype=torch.int32, device=device)[None]
    loc = torch.randint(-1, 300, (3, 24), dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.smla.convert_indices.default,
                          (req, bt, loc, 64, True, True))  # cp_* default to off
    torch.library.opcheck(torch.ops.smla.convert_indices.default,
                          (req, bt, loc, 64, True, True, 2, 1, 4))
    kv_c = torch.randn((3, DC), device=device).to(torch.bfloat16)
    k_pe = torch.randn((3, 64), device=device).to(torch.bfloat16)
    slot = torch.tensor([1, -1, 7], dtype=torch.int64, device=device)
    cache = torch.zeros((16, 656), dtype=torch.uint8, device=device)
    torch.library.opcheck(torch.ops.smla.cache_write.default,
                          (kv_c, k_pe, slot, cache, None, 2, 64, 0.0))
    out_p = torch.randn((2, 3, 4, 512), device=device)
    lse_p = torch.randn((2, 3, 4), device=device)
    torch.library.opcheck(torch.ops.smla.merge_states.default, (out_p, lse_p, True, True))


def layer_step(q, kv_c, k_pe, slot, cache, req_id, block_table, local, lengths):
    """An engine's sparse MLA layer: cache write, index conversion, attention."""
    smla.cache_write(kv_c, k_pe, slot, cache, format="bf16")
    slots = smla.convert_indices(req_id, block_table, local, block_size=16)
    out, lse = smla.forward(q * 1.0, None, cache, slots, lengths=lengths, format="bf16",
                            return_lse=True)
    return out.float().sum(-1), lse


def layer_inputs(device, T=3, N=16, K=32, nblocks=8):
    gen = torch.Generator().manual_seed(11)
    bf = torch.bfloat16
    S = nblocks * 16
    cache = torch.zeros((nblocks, 16, 576), dtype=bf).to(device)
    cache.view(S, 576)[:] = torch.randn((S, 576), generator=gen).to(bf).to(device)
    return dict(
        q=torch.randn((T, N, 576), generator=gen).to(bf).to(device),
        kv_c=torch.randn((T, DC), generator=gen).to(bf).to(device),
        k_pe=torch.randn((T, 64), generator=gen).to(bf).to(device),
        slot=torch.tensor([5, 40, -1], dtype=torch.int64)[:T].to(device),
        cache=cache,
        req_id=torch.tensor([0, 1, 1], dtype=torch.int32)[:T].to(device),
        block_table=torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4]], dtype=torch.int32).to(device),
        local=torch.randint(-1, 64, (T, K), generator=gen, dtype=torch.int32).to(device),
        lengths=torch.tensor([K, 10, 0], dtype=torch.int32)[:T].to(device),
    )


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(device, backend):
    """torch.compile(fullgraph=True) of a function calling cache_write, convert_indices
    and forward: no graph break, same results as eager."""
    torch._dynamo.reset()
    a = layer_inputs(device)
    b = {k: v.clone() for k, v in a.items()}
    want_sum, want_lse = layer_step(**a)
    fn = torch.compile(layer_step, fullgraph=True, backend=backend)
    got_sum, got_lse = fn(**b)
    assert torch.equal(a["cache"], b["cache"])          # the in-place write happened
    same(got_lse, want_lse)
    same(got_sum, want_sum)


@needs_custom_op
def test_compile_graph_contains_the_custom_ops():
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    fn = torch.compile(layer_step, fullgraph=True, backend=backend)
    fn(**layer_inputs("cpu"))
    assert any("smla.forward" in s for s in seen), seen
    assert any("smla.cache_write" in s for s in seen), seen
    assert any("smla.convert_indices" in s for s in seen), seen


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_compile_compat_and_plan(device):
    torch._dynamo.reset()
    q, kv, rows, slots, lengths, sink = make_case(device, "bf16", 64, 2, 64, 128, 300, seed=4)
    plan = smla.Plan(64, 128, dr=64, format="bf16", max_tokens=8, device=device)

    def f(q, kv_data, slots, sink):
        o1 = plan.forward(q, None, kv_data, slots, sink=sink)
        o2, m, l = smla.compat.flash_mla_sparse_fwd(q, kv_data.view(torch.bfloat16).view(-1, 1, 576),
                                                    slots.view(2, 1, -1), 0.04,
                                                    attn_sink=sink)
        return o1, o2, l

    eager = f(q, kv.data, slots, sink)
    comp = torch.compile(f, fullgraph=True, backend="aot_eager")(q, kv.data, slots, sink)
    for e, c in zip(eager, comp):
        same(e, c)


# ---- CUDA graphs and streams --------------------------------------------------------------------------------
@needs_cuda
def test_cuda_graph_capture_and_replay():
    """One decode step (cache write, conversion, forward) captured once and replayed with
    new data in the static buffers; each replay matches the reference."""
    dev = "cuda"
    st = layer_inputs(dev)
    T, N, K = st["q"].shape[0], st["q"].shape[1], st["local"].shape[1]
    slots = torch.empty((T, K), dtype=torch.int32, device=dev)
    out = torch.empty((T, N, DC), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((T, N), device=dev)

    def step():
        smla.cache_write(st["kv_c"], st["k_pe"], st["slot"], st["cache"])
        smla.convert_indices(st["req_id"], st["block_table"], st["local"], block_size=16,
                             slots=slots)
        smla.forward(st["q"], None, st["cache"], slots, lengths=st["lengths"], out=out,
                     lse=lse)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                                   # eager warm-up: makes the plan
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    gen = torch.Generator().manual_seed(21)
    for it in range(3):
        st["q"].copy_(torch.randn(st["q"].shape, generator=gen).to(torch.bfloat16))
        st["kv_c"].copy_(torch.randn(st["kv_c"].shape, generator=gen).to(torch.bfloat16))
        st["local"].copy_(torch.randint(-1, 64, st["local"].shape, generator=gen,
                                        dtype=torch.int32))
        st["slot"].copy_(torch.tensor([3 + it, 60 - it, 100 + it]))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        rows = st["cache"].view(-1, 576).float()
        ref_slots = torch.from_numpy(ref_convert(st["req_id"].cpu().numpy(),
                                                 st["block_table"].cpu().numpy(),
                                                 st["local"].cpu().numpy(), 16)[0]).cuda()
        assert torch.equal(slots, ref_slots)
        assert torch.equal(st["cache"].view(-1, 576)[st["slot"][0]], torch.cat(
            [st["kv_c"][0], st["k_pe"][0]]))
        r_out, r_lse, _, pabs = torch_ref_forward(st["q"], rows, ref_slots, 1 / math.sqrt(576),
                                                  st["lengths"], abs_mean=True)
        check_close(out, r_out, out_atol("cuda", pabs), 1.6e-2, "out replay %d" % it)
        check_close(lse, r_lse, 2e-3, 1e-4, "lse replay %d" % it)


@needs_cuda
def test_plan_creation_during_capture_is_refused():
    q, kv, rows, slots, lengths, sink = make_case("cuda", "bf16", 64, 2, 24, 40, 64, seed=8)
    g = torch.cuda.CUDAGraph()
    err = None
    with torch.cuda.graph(g):
        try:
            smla.forward(q, None, kv, slots)      # N=24, K=40: no plan made before
        except smla.SmlaError as e:
            err = e
    assert err is not None, "forward made a plan during capture"
    assert err.status_name == "SMLA_ERR_CAPTURING"
    assert "Before capturing" in err.message and "prepare_plans" in err.message
    smla.forward(q, None, kv, slots)              # after capture: made eagerly, works


@needs_cuda
def test_forward_on_a_side_stream():
    q, kv, rows, slots, lengths, sink = make_case("cuda", "bf16", 64, 4, 16, 64, 128, seed=12)
    ref = smla.forward(q, None, kv, slots, lengths=lengths)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = smla.forward(q, None, kv, slots, lengths=lengths)
    got2 = smla.forward(q, None, kv, slots, lengths=lengths, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    same(ref, got)
    same(ref, got2)


@needs_cuda
def test_pooled_eager_outputs_never_alias():
    """Small eager CUDA outputs come from pooled slabs (_ops._pooled): across more calls than
    one slab holds, on two streams, and with lse, every result stays its own."""
    from smla import _ops
    cases = [make_case("cuda", "bf16", 64, 1, 16, 256, 600, seed=s) for s in (31, 32)]
    want = []
    for q, kv, rows, slots, lengths, sink in cases:
        o = torch.empty((1, 16, DC), dtype=torch.bfloat16, device="cuda")
        e = torch.empty((1, 16), dtype=torch.float32, device="cuda")
        smla.forward(q, None, kv, slots, lengths=lengths, sink=sink, out=o, lse=e)
        want.append((o, e))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = []
    with torch.inference_mode():  # the pool's condition (engines run so)
        for i in range(150):  # a slab holds 64 of these outs (2 MB / 16 KB, capped at 64)
            q, kv, rows, slots, lengths, sink = cases[i % 2]
            if i % 3 == 2:
                with torch.cuda.stream(side):
                    got.append((i,) + smla.forward(q, None, kv, slots, lengths=lengths,
                                                   sink=sink, return_lse=True))
            else:
                got.append((i, smla.forward(q, None, kv, slots, lengths=lengths, sink=sink),
                            None))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert len({o.data_ptr() for _, o, _ in got}) == len(got)
    assert _ops._pool_ok, "torch lacks a function the pool needs: outputs are not pooled"
    # Views made under inference mode record no _base: a slab is seen as a storage bigger
    # than the output, shared by the outputs cut from it.
    def slab(o):
        return o.untyped_storage().data_ptr(), o.untyped_storage().nbytes()

    assert all(slab(o)[1] > o.nbytes for _, o, _ in got), "an output not from a slab"
    side_slabs = {slab(o) for i, o, _ in got if i % 3 == 2}
    main_slabs = {slab(o) for i, o, _ in got if i % 3 != 2}
    assert not side_slabs & main_slabs, "a slab was used on two streams"
    assert len(main_slabs) <= 3 and len(side_slabs) <= 2, "outputs were not pooled"
    # outside inference mode: one allocation per output
    q, kv, rows, slots, lengths, sink = cases[0]
    o = smla.forward(q, None, kv, slots, lengths=lengths)
    assert slab(o)[1] == o.nbytes
    for i, o, e in got:
        same(o, want[i % 2][0])
        if e is not None:
            same(e, want[i % 2][1])


@needs_cuda
@needs_custom_op
def test_compile_reduce_overhead_cuda_graphs():
    """torch.compile(mode="reduce-overhead"): inductor's CUDA graphs around the ops."""
    torch._dynamo.reset()
    a = layer_inputs("cuda")
    want = layer_step(**{k: v.clone() for k, v in a.items()})
    fn = torch.compile(layer_step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        got = fn(**{k: v.clone() for k, v in a.items()})
    torch.cuda.synchronize()
    same(got[1], want[1])


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_compile_with_kvcache_and_merge(device):
    """A KVCache (fp8_ds) closed over by the compiled function; merge_states in the graph."""
    torch._dynamo.reset()
    q, kv, rows, slots, lengths, sink = make_case(device, "fp8_ds", 64, 3, 16, 40, 90, seed=14)

    def f(q, slots, lengths):
        o1, l1 = smla.forward(q, None, kv, slots, lengths=lengths, return_lse=True)
        o2, l2 = smla.forward(q, None, kv, slots.flip(1), return_lse=True)
        out, lse = smla.merge_states(torch.stack([o1, o2]), torch.stack([l1, l2]),
                                     return_lse=True)
        return out, lse

    want = f(q, slots, lengths)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, slots, lengths)
    for w, g in zip(want, got):
        same(w, g)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N", [16, 64])
def test_forward_head_major_q_and_out(device, N):
    """The head-major q an absorbed-q batched matmul leaves (q.transpose(0, 1).contiguous()
    .transpose(0, 1): stride_t = 576 < stride_h = T * 576) and a head-major out are valid
    layouts (SPEC: any non-overlapping strides) and give the token-major results."""
    T, K, S = 5, 96, 300
    q, kv, rows, slots, lengths, sink = make_case(device, "bf16", 64, T, N, K, S, seed=31 + N)
    qh = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert qh.stride() == (576, T * 576, 1)
    out, lse = smla.forward(q, None, kv, slots, lengths=lengths, sink=sink, return_lse=True)
    outh = torch.empty((N, T, DC), dtype=torch.bfloat16, device=device).transpose(0, 1)
    got, lseh = smla.forward(qh, None, kv, slots, lengths=lengths, sink=sink, out=outh,
                             return_lse=True)
    assert got is outh
    same(out, outh)
    same(lse, lseh)
    r_out, r_lse, _, pabs = torch_ref_forward(q, rows, slots, 1 / math.sqrt(576), lengths,
                                              sink=sink, abs_mean=True)
    check_close(outh, r_out, out_atol(device, pabs), 1.6e-2, "out (head-major)")
    check_unbiased(outh.float().cpu().numpy(), r_out.cpu().numpy(), "out", out_model(device))


@pytest.mark.parametrize("device", DEVICES)
def test_cache_write_nope_takes_a_zero_width_k_pe(device):
    """A NoPE engine passes k_pe as a [T, 0] view: accepted like None, same bytes."""
    T, S = 6, 16
    kv_c = torch.randn((T, DC)).to(torch.bfloat16).to(device)
    slot = torch.arange(T, dtype=torch.int64, device=device) * 2
    a = torch.zeros((S, 1024), dtype=torch.uint8, device=device)
    b = torch.zeros_like(a)
    smla.cache_write(kv_c, None, slot, smla.KVCache(a, format="bf16", dr=0))
    smla.cache_write(kv_c, kv_c[:, :0], slot, smla.KVCache(b, format="bf16", dr=0))
    assert torch.equal(a, b) and a.any()
    with pytest.raises(ValueError, match=r"k_pe: a NoPE \(dr=0\) cache takes None or a zero-width"):
        smla.cache_write(kv_c, kv_c[:, :8], slot, smla.KVCache(b, format="bf16", dr=0))


# ---- forward_indices: the conversion inside the forward ------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,cp", [(16, (0, 0, 1)), (64, (2, 1, 4))])
def test_forward_indices_is_convert_then_forward(device, N, cp):
    """forward_indices == convert_indices (same cp filter) then forward on those slots,
    bitwise (same plan, same kernel), with invalid entries of every kind."""
    a = layer_inputs(device, N=N, K=96)
    gen = torch.Generator().manual_seed(5)
    a["local"] = torch.randint(-3, 150, a["local"].shape, generator=gen,
                               dtype=torch.int32).to(device)
    a["req_id"] = torch.tensor([0, 2, 1], dtype=torch.int32).to(device)  # 2: out of range
    a["block_table"][1, 2] = -1
    sink = torch.randn(N, generator=gen).to(device)
    plan = smla.Plan(N, 96, 64, "bf16", max_tokens=3, device=device)
    bad1 = torch.zeros(1, dtype=torch.int64, device=device)
    bad2 = torch.zeros(1, dtype=torch.int64, device=device)
    kw = dict(lengths=a["lengths"], sink=sink, format="bf16", return_lse=True,
              return_max_logit=True, plan=plan)
    got = smla.forward_indices(a["q"], None, a["cache"], a["req_id"], a["block_table"],
                               a["local"], block_size=16, cp_size=cp[0], cp_rank=cp[1],
                               cp_interleave=cp[2], bad_inputs=bad1, **kw)
    slots = smla.convert_indices(a["req_id"], a["block_table"], a["local"], block_size=16,
                                 cp_size=cp[0], cp_rank=cp[1], cp_interleave=cp[2])
    want = smla.forward(a["q"], None, a["cache"], slots, bad_inputs=bad2, **kw)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(bad1, bad2)
    r_s = ref_convert(a["req_id"].cpu().numpy(), a["block_table"].cpu().numpy(),
                      a["local"].cpu().numpy(), 16, False, cp=cp if cp[0] >= 2 else None)[0]
    assert torch.equal(slots.cpu(), torch.from_numpy(r_s))
    assert (slots == -1).any() and (slots >= 0).any()


def test_forward_indices_errors():
    a = layer_inputs("cpu")
    with pytest.raises(ValueError, match="req_id"):
        smla.forward_indices(a["q"], None, a["cache"], a["req_id"][:2], a["block_table"],
                             a["local"], block_size=16, format="bf16")
    with pytest.raises(smla.SmlaError, match="block_size"):
        smla.forward_indices(a["q"], None, a["cache"], a["req_id"], a["block_table"],
                             a["local"], block_size=0, format="bf16")


@needs_custom_op
@pytest.mark.parametrize("device", DEVICES)
def test_forward_indices_compiles_fullgraph(device):
    torch._dynamo.reset()
    a = layer_inputs(device)

    def step(q, cache, req_id, block_table, local, lengths):
        return smla.forward_indices(q * 1.0, None, cache, req_id, block_table, local,
                                    block_size=16, lengths=lengths, format="bf16",
                                    return_lse=True)
    args = (a["q"], a["cache"], a["req_id"], a["block_table"], a["local"], a["lengths"])
    want = step(*args)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    same(got[0], want[0])
    same(got[1], want[1])


@needs_cuda
def test_forward_indices_cuda_graph_rewritten_in_place():
    """The fused step captured once; request ids, block table, positions and lengths
    rewritten in place between replays; each replay equals convert + forward."""
    dev = "cuda"
    st = layer_inputs(dev, N=16, K=64)
    T, N = st["q"].shape[0], st["q"].shape[1]
    out = torch.empty((T, N, DC), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((T, N), device=dev)

    def step():
        smla.forward_indices(st["q"], None, st["cache"], st["req_id"], st["block_table"],
                             st["local"], block_size=16, lengths=st["lengths"], out=out,
                             lse=lse, format="bf16")

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    gen = torch.Generator().manual_seed(8)
    for it in range(3):
        st["local"].copy_(torch.randint(-2, 70, st["local"].shape, generator=gen,
                                        dtype=torch.int32))
        st["req_id"].copy_(torch.randint(0, 2, (T,), generator=gen, dtype=torch.int32))
        st["block_table"].copy_(torch.randint(-1, 8, st["block_table"].shape, generator=gen,
                                              dtype=torch.int32))
        st["lengths"].copy_(torch.randint(0, 65, (T,), generator=gen, dtype=torch.int32))
        out.fill_(float("nan"))
        g.replay()
        slots = smla.convert_indices(st["req_id"], st["block_table"], st["local"],
                                     block_size=16)
        w_out, w_lse = smla.forward(st["q"], None, st["cache"], slots, lengths=st["lengths"],
                                    format="bf16", return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, w_out), "replay %d" % it
        assert torch.equal(lse, w_lse), "replay %d" % it
