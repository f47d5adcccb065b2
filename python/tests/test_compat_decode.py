"""smla.compat's FlashMLA sparse decode (get_mla_metadata + flash_mla_with_kvcache) against an
independent float64 reference written from FlashMLA's documented semantics: indices are
global token slots (block * page_block_size + offset) of a paged cache, -1 skips; lse
[b, h_q, s_q] in natural log without the sink; out scaled by exp(lse) / (exp(lse) +
exp(sink)); topk_length per batch row; an extra cache attended in the same softmax; rows
with no used entry give out 0, lse +inf."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the compat tests need torch")

import smla  # noqa: E402

if not smla.HAVE_TORCH:
    pytest.skip("smla was imported without torch (SMLA_NO_TORCH=1)", allow_module_level=True)

from smla.compat import FlashMLASchedMeta, flash_mla_with_kvcache, get_mla_metadata  # noqa: E402
from conftest import DEVICES, cuda_available  # noqa: E402
from refs import (DC, ROW_SIZE, TOL_LSE, U_BF16, RoundModel, assert_close,  # noqa: E402
                  check_unbiased, make_cache, out_model, ref_forward, bf16_round)


def paged_cache(fmt, dr, nb, page, rng, pad_rows=0):
    """A [nb, page, 1, row] cache (blocks pad_rows rows apart beyond page: a padded block
    stride, its padding rows NaN) as torch uint8 / bf16, and the float64 values of every
    token slot (block * page + offset) -> (k_cache, values [nb * page, 512 + dr])."""
    S = nb * page
    per = page + pad_rows
    flat_used = {(s // page) * per + s % page for s in range(S)}
    cache, vals, _ = make_cache(fmt, dr, nb * per, rng, flat_used)
    row = ROW_SIZE[(fmt, dr)]
    t = torch.from_numpy(cache.copy()).view(nb, per, 1, row)[:, :page]
    if fmt == "bf16":
        t = t.view(torch.bfloat16)
    idx = [(s // page) * per + s % page for s in range(S)]
    return t, vals[idx]


def reference(q, vals, indices, scale, topk_length=None, sink=None, extra=None):
    """float64 FlashMLA decode: -> out [b, s_q, h, 512], lse [b, h, s_q] (+inf when empty),
    sum_j p_j |v_j| [b, s_q, h, 512], and (with extra) what smla's algorithm gives exactly
    with its roundings: each list's out rounded to bf16, merged by lse, rounded again."""
    b, s_q, h, d = q.shape
    T = b * s_q
    idx = indices.reshape(T, -1).astype(np.int64)
    rows = vals
    if topk_length is not None:
        k = np.arange(idx.shape[1])[None, :]
        idx = np.where(k < np.repeat(topk_length, s_q)[:, None], idx, -1)
    qt = q.reshape(T, h, d)
    alg = None
    if extra is not None:  # one softmax over both lists: concatenated rows and slots
        evals, eidx, elen = extra
        eidx = eidx.reshape(T, -1).astype(np.int64)
        if elen is not None:
            k = np.arange(eidx.shape[1])[None, :]
            eidx = np.where(k < np.repeat(elen, s_q)[:, None], eidx, -1)
        # the algorithm: each list alone (with the sink), bf16, merged (sink rule), bf16
        o1, l1, _, _ = ref_forward(qt, vals, idx.astype(np.int32), scale, sink=sink)
        o2, l2, _, _ = ref_forward(qt, evals, eidx.astype(np.int32), scale, sink=sink)
        lm = np.logaddexp(l1, l2)
        s_ = np.zeros(h) if sink is None else np.asarray(sink, np.float64)
        lae = (lambda x: np.logaddexp(x, s_)) if sink is not None else (lambda x: x)
        with np.errstate(invalid="ignore"):
            w1 = np.where(np.isneginf(l1), 0.0, np.exp(lae(l1) - lae(lm)))
            w2 = np.where(np.isneginf(l2), 0.0, np.exp(lae(l2) - lae(lm)))
        alg = bf16_round(w1[..., None] * bf16_round(o1) +
                                 w2[..., None] * bf16_round(o2))
        alg = alg.reshape(b, s_q, h, DC)
        eidx = np.where((eidx >= 0) & (eidx < evals.shape[0]), eidx + rows.shape[0], -1)
        rows = np.concatenate([rows, evals])
        idx = np.concatenate([np.where((idx >= 0) & (idx < vals.shape[0]), idx, -1), eidx], 1)
    out, lse, _, _, pabs = ref_forward(qt, rows, idx.astype(np.int32), scale, sink=sink,
                                       abs_mean=True)
    lse = np.where(np.isneginf(lse), np.inf, lse)
    r = (out.reshape(b, s_q, h, DC), lse.reshape(b, s_q, h).transpose(0, 2, 1),
         pabs.reshape(b, s_q, h, DC))
    return r if extra is None else r + (alg,)


def check(out, lse, r_out, r_lse, pabs, device, what, extra_rounding=False, alg=None):
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    got = out.float().cpu().numpy()
    atol = 3e-3 + (U_BF16 * pabs if device == "cuda" else 0.0)
    if extra_rounding:  # two bf16 partials merged: one more rounding per part
        atol = atol + 2 * U_BF16 * pabs
    assert_close(got, r_out, atol, 1.6e-2, what + ": out")
    m = out_model(device)
    if extra_rounding:  # the two partials' roundings, weights <= 1
        m = RoundModel(m.elem_var + 2 * U_BF16 ** 2 / 3, m.row_var)
    check_unbiased(got, r_out, what + ": out", m, rounded_ref=alg)
    assert_close(lse.cpu().numpy(), r_lse, *TOL_LSE, what + ": lse")


def make_q(b, s_q, h, d, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((b, s_q, h, d), generator=g).to(torch.bfloat16).to(device)


def make_indices(rng, b, s_q, topk, S, junk=0.2):
    idx = rng.integers(0, S, (b, s_q, topk))
    bad = rng.random((b, s_q, topk)) < junk
    idx = np.where(bad, rng.choice([-1, -1, -1, S, S + 7], (b, s_q, topk)), idx)
    return idx.astype(np.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,d_qk", [("fp8_ds", 576), ("bf16", 576), ("fp8_ds", 512)])
@pytest.mark.parametrize("h_q", [8, 16, 64, 128])
def test_decode_matches_reference(device, fmt, d_qk, h_q):
    dr = d_qk - DC
    rng = np.random.default_rng(h_q * 7 + d_qk + len(fmt))
    b, s_q, topk, nb, page = 2, 2, 128, 6, 64
    k_cache, vals = paged_cache(fmt, dr, nb, page, rng)
    q = make_q(b, s_q, h_q, d_qk, 3 + h_q, device)
    idx = make_indices(rng, b, s_q, topk, nb * page)
    sched, splits = get_mla_metadata(None, s_q * h_q, 1, num_heads_q=h_q, topk=topk,
                                     is_fp8_kvcache=fmt == "fp8_ds")
    assert splits is None and isinstance(sched, FlashMLASchedMeta)
    scale = d_qk ** -0.5
    out, lse = flash_mla_with_kvcache(
        q, k_cache.to(device), None, None, 512, sched, None, scale, False, fmt == "fp8_ds",
        torch.from_numpy(idx).to(device))
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q)
    assert lse.stride() == (s_q * h_q, 1, h_q)       # FlashMLA's transposed view
    r_out, r_lse, pabs = reference(q.float().cpu().numpy(), vals, idx, scale)
    check(out, lse, r_out, r_lse, pabs, device, "%s h_q %d" % (fmt, h_q))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_sink_topk_length_padded_blocks_and_empty_rows(device):
    """attn_sink, topk_length per batch row, blocks padded to page + 3 rows (the block
    stride is not page * row: indices are remapped), a batch row whose indices are all
    invalid and one whose topk_length is 0 (out 0, lse +inf)."""
    rng = np.random.default_rng(5)
    b, s_q, h, topk, nb, page = 4, 3, 16, 96, 5, 61
    k_cache, vals = paged_cache("fp8_ds", 64, nb, page, rng, pad_rows=3)
    assert k_cache.stride(0) == (page + 3) * 656
    q = make_q(b, s_q, h, 576, 8, device)
    idx = make_indices(rng, b, s_q, topk, nb * page)
    idx[1] = -1                                        # batch row 1: nothing valid
    tl = np.array([topk, 40, 0, 1], np.int32)          # batch row 2: nothing counted
    # sinks near the rows' lse (~log of the used count), so that they move out by ~50%
    sink = (torch.randn(h, generator=torch.Generator().manual_seed(1)) + 4.0).to(device)
    scale = 0.05
    out, lse = flash_mla_with_kvcache(
        q, k_cache.to(device), None, None, 512, get_mla_metadata()[0], softmax_scale=scale,
        is_fp8_kvcache=True, indices=torch.from_numpy(idx).to(device), attn_sink=sink,
        topk_length=torch.from_numpy(tl).to(device))
    r_out, r_lse, pabs = reference(q.float().cpu().numpy(), vals, idx, scale, tl,
                                   sink.double().cpu().numpy())
    check(out, lse, r_out, r_lse, pabs, device, "sink, topk_length, padded blocks")
    assert (out[1:3].float() == 0).all() and torch.isposinf(lse[1:3]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_sink", [False, True])
def test_decode_extra_cache(device, with_sink):
    """A second cache (its own page size, indices and topk_length) in one softmax with the
    first."""
    rng = np.random.default_rng(11 + with_sink)
    b, s_q, h = 2, 2, 64
    k1, v1 = paged_cache("fp8_ds", 64, 4, 64, rng)
    k2, v2 = paged_cache("fp8_ds", 64, 3, 32, rng)
    q = make_q(b, s_q, h, 576, 12, device)
    i1 = make_indices(rng, b, s_q, 128, 256)
    i2 = make_indices(rng, b, s_q, 64, 96)
    l1, l2 = np.array([100, 128], np.int32), np.array([64, 7], np.int32)
    sink = ((torch.randn(h, generator=torch.Generator().manual_seed(2)) + 4.5).to(device)
            if with_sink else None)
    d = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    out, lse = flash_mla_with_kvcache(
        q, k1.to(device), None, None, 512, get_mla_metadata()[0], softmax_scale=0.06,
        is_fp8_kvcache=True, indices=d(i1), attn_sink=sink, extra_k_cache=k2.to(device),
        extra_indices_in_kvcache=d(i2), topk_length=d(l1), extra_topk_length=d(l2))
    r_out, r_lse, pabs, alg = reference(q.float().cpu().numpy(), v1, i1, 0.06, l1,
                                        None if sink is None else sink.double().cpu().numpy(),
                                        extra=(v2, i2, l2))
    check(out, lse, r_out, r_lse, pabs, device, "extra cache", extra_rounding=True, alg=alg)


def test_decode_argument_errors():
    rng = np.random.default_rng(1)
    k_cache, _ = paged_cache("fp8_ds", 64, 2, 64, rng)
    q = make_q(1, 1, 16, 576, 1, "cpu")
    idx = torch.zeros((1, 1, 64), dtype=torch.int32)
    sched = get_mla_metadata()[0]
    flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, is_fp8_kvcache=True,
                           indices=idx)
    with pytest.raises(ValueError, match="tile_scheduler_metadata: was made for h_q = 16"):
        flash_mla_with_kvcache(make_q(1, 1, 32, 576, 1, "cpu"), k_cache, None, None, 512,
                               sched, is_fp8_kvcache=True, indices=idx)
    with pytest.raises(NotImplementedError, match="indices: is None"):
        flash_mla_with_kvcache(q, k_cache, None, None, 512, sched, is_fp8_kvcache=True)
    with pytest.raises(ValueError, match="causal: must be False"):
        flash_mla_with_kvcache(q, k_cache, None, None, 512, None, causal=True,
                               is_fp8_kvcache=True, indices=idx)
    with pytest.raises(ValueError, match="k_cache: rows of 656 bytes, but is_fp8_kvcache=False"):
        flash_mla_with_kvcache(q, k_cache, None, None, 512, None, indices=idx)
    with pytest.raises(ValueError, match="584-byte"):
        flash_mla_with_kvcache(make_q(1, 1, 16, 512, 1, "cpu"),
                               torch.zeros((2, 64, 1, 584), dtype=torch.uint8), None, None,
                               512, None, is_fp8_kvcache=True, indices=idx)


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a GPU")
def test_decode_in_a_cuda_graph_with_indices_rewritten():
    """One eager call makes the plan; a captured call then replays with new indices and
    topk_length written into the same buffers, each replay checked against the reference."""
    rng = np.random.default_rng(21)
    b, s_q, h, topk, nb, page = 3, 1, 16, 128, 8, 64
    k_cache, vals = paged_cache("fp8_ds", 64, nb, page, rng)
    k_cache = k_cache.cuda()
    q = make_q(b, s_q, h, 576, 4, "cuda")
    idx = torch.from_numpy(make_indices(rng, b, s_q, topk, nb * page)).cuda()
    tl = torch.full((b,), topk, dtype=torch.int32, device="cuda")
    sched = get_mla_metadata()[0]
    call = lambda: flash_mla_with_kvcache(  # noqa: E731
        q, k_cache, None, None, 512, sched, softmax_scale=0.05, is_fp8_kvcache=True,
        indices=idx, topk_length=tl)
    call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = call()
    for step in range(3):
        new = make_indices(rng, b, s_q, topk, nb * page)
        new_tl = rng.integers(0, topk + 1, b).astype(np.int32)
        idx.copy_(torch.from_numpy(new))
        tl.copy_(torch.from_numpy(new_tl))
        g.replay()
        torch.cuda.synchronize()
        r_out, r_lse, pabs = reference(q.float().cpu().numpy(), vals, new, 0.05, new_tl)
        check(out, lse, r_out, r_lse, pabs, "cuda", "graph replay %d" % step)
