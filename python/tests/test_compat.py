"""smla.compat.flash_mla_sparse_fwd on FlashMLA's own test shapes (h_q 64/128, d_qk
512/576, topk 128..2048, out-of-range and -1 indices, attention sink, topk_length), against
a torch float32 reference written from FlashMLA's documented semantics: natural-log lse
(sink excluded), out scaled by exp(lse) / (exp(lse) + exp(sink)), rows with no valid index
give out 0, max_logits -inf, lse +inf."""

import math

import pytest

torch = pytest.importorskip("torch", reason="the compat tests need torch (CI installs only "
                            "numpy and pytest)")

import smla  # noqa: E402

if not smla.HAVE_TORCH:
    pytest.skip("smla was imported without torch (SMLA_NO_TORCH=1)", allow_module_level=True)

from smla.compat import flash_mla_sparse_fwd  # noqa: E402
from conftest import DEVICES, cuda_available  # noqa: E402
from refs import check_unbiased, out_model  # noqa: E402


def flashmla_ref(q, kv, indices, sm_scale, attn_sink=None, topk_length=None):
    s_q, h_q, d_qk = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    idx = indices[:, 0, :].long()
    invalid = (idx < 0) | (idx >= s_kv)
    if topk_length is not None:
        invalid |= torch.arange(topk, device=q.device)[None, :] >= topk_length.long()[:, None]
    g = kv[:, 0, :].float()[idx.masked_fill(invalid, 0)]                 # [s_q, topk, d_qk]
    P = torch.matmul(q.float(), g.transpose(1, 2)) * sm_scale             # [s_q, h_q, topk]
    P = P.masked_fill(invalid[:, None, :], -math.inf)
    lse = torch.logsumexp(P, -1)
    max_logits = P.amax(-1)
    lse_o = lse if attn_sink is None else torch.logsumexp(
        torch.stack([lse, attn_sink.float()[None, :].expand_as(lse)]), 0)
    lse_o = lse_o.masked_fill(lse_o == -math.inf, math.inf)
    out = torch.matmul(torch.exp(P - lse_o[..., None]), g[..., :512])
    return out, max_logits, lse.masked_fill(lse == -math.inf, math.inf)


def make_inputs(device, s_q, s_kv, topk, h_q, d_qk, seed, sink=False, topk_length=False,
                all_invalid=False):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn((s_q, h_q, d_qk), generator=gen) / 10).to(torch.bfloat16)
    kv = (torch.randn((s_kv, 1, d_qk), generator=gen) / 10).to(torch.bfloat16)
    idx = torch.full((s_q, 1, topk), s_kv, dtype=torch.int32)
    for s in range(s_q):
        n = min(topk, s_kv)
        cur = torch.randperm(s_kv, generator=gen)[:n]
        pad = torch.tensor([-1, s_kv, 2147480000, -1], dtype=torch.int64)
        cur = torch.cat([cur, pad[torch.randint(0, 4, (topk - n,), generator=gen)]])
        idx[s, 0] = cur[torch.randperm(topk, generator=gen)].to(torch.int32)
    drop = torch.rand((s_q, 1, topk), generator=gen) < 0.05
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    if all_invalid:
        idx = torch.where(torch.rand((s_q, 1, topk), generator=gen) < 0.5,
                          torch.full_like(idx, -1), torch.full_like(idx, s_kv + 3))
    sk = (torch.randn(h_q, generator=gen) * 2).float() if sink else None
    tl = torch.randint(0, topk + 1, (s_q,), generator=gen, dtype=torch.int32) \
        if topk_length else None
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return to(q), to(kv), to(idx), to(sk), to(tl)


def check(got, ref, atol, rtol, what):
    got, ref = got.float().cpu(), ref.float().cpu()
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), inf) and torch.equal(got[inf], ref[inf]), what
    assert not torch.isnan(got).any(), what
    err = (got[~inf] - ref[~inf]).abs()
    tol = atol + rtol * ref[~inf].abs()
    assert bool((err <= tol).all()), "%s: worst err/tol %.3g" % (what, float((err / tol).max()))


def run_case(device, s_q, s_kv, topk, h_q, d_qk, seed, **kw):
    q, kv, idx, sink, tl = make_inputs(device, s_q, s_kv, topk, h_q, d_qk, seed, **kw)
    sm_scale = 1 / math.sqrt(d_qk)
    out, max_logits, lse = flash_mla_sparse_fwd(q, kv, idx, sm_scale, d_v=512, attn_sink=sink,
                                                topk_length=tl)
    assert out.shape == (s_q, h_q, 512) and out.dtype == torch.bfloat16
    assert max_logits.shape == (s_q, h_q) and max_logits.dtype == torch.float32
    assert lse.shape == (s_q, h_q) and lse.dtype == torch.float32
    r_out, r_max, r_lse = flashmla_ref(q, kv, idx, sm_scale, sink, tl)
    check(out, r_out, 8e-4, 3.01 / 128, "out")         # FlashMLA's own tolerances
    check_unbiased(out.float().cpu().numpy(), r_out.cpu().numpy(), "out", out_model(device))
    check(max_logits, r_max, 1e-5, 2.01 / 65536, "max_logits")
    check(lse, r_lse, 1e-5, 4.01 / 65536, "lse")
    return out, max_logits, lse


SHAPES = [(128, 128), (592, 128), (95, 128), (153, 256), (1521, 512), (114, 384),
          (4096, 2048), (32, 2048)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("s_kv,topk", SHAPES)
def test_flashmla_shapes(device, h_q, d_qk, s_kv, topk):
    s_q = 2 if device == "cpu" else 62
    i = SHAPES.index((s_kv, topk))
    run_case(device, s_q, s_kv, topk, h_q, d_qk, seed=i * 4 + h_q + d_qk,
             sink=bool(i % 2), topk_length=bool(i // 2 % 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("sink,topk_length", [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_flashmla_features(device, h_q, sink, topk_length):
    s_q = 3 if device == "cpu" else 213
    run_case(device, s_q, 1840, 256, h_q, 576, seed=7 + h_q, sink=sink,
             topk_length=topk_length)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1, 256, 256), (4, 2048, 2048)])
def test_flashmla_all_indices_invalid(device, s_q, s_kv, topk):
    out, max_logits, lse = run_case(device, s_q, s_kv, topk, 64, 576, seed=3, sink=True,
                                    topk_length=True, all_invalid=True)
    assert (out.float() == 0).all()
    assert torch.isneginf(max_logits).all() and torch.isposinf(lse).all()


@pytest.mark.parametrize("device", DEVICES)
def test_flashmla_sink_infinities_and_log2_units(device):
    q, kv, idx, _, _ = make_inputs(device, 2, 300, 128, 64, 576, seed=5)
    sink = torch.zeros(64, device=device)
    sink[0], sink[1] = math.inf, -math.inf
    out, mx, lse = flash_mla_sparse_fwd(q, kv, idx, 0.05, attn_sink=sink)
    plain, _, _ = flash_mla_sparse_fwd(q, kv, idx, 0.05)
    assert (out[:, 0].float() == 0).all()               # +inf sink: output all zeros
    torch.testing.assert_close(out[:, 1], plain[:, 1], rtol=1e-2, atol=1e-3)  # -inf: no effect
    _, mx2, lse2 = flash_mla_sparse_fwd(q, kv, idx, 0.05, log2_units=True)
    torch.testing.assert_close(lse2, lse / math.log(2), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mx2, mx / math.log(2), rtol=1e-6, atol=1e-6)


def test_flashmla_argument_errors():
    q, kv, idx, _, _ = make_inputs("cpu", 2, 100, 128, 64, 576, seed=1)
    with pytest.raises(ValueError, match="d_v"):
        flash_mla_sparse_fwd(q, kv, idx, 0.1, d_v=576)
    with pytest.raises(ValueError, match="kv: expected \\[s_kv, 1, 576\\]"):
        flash_mla_sparse_fwd(q, kv.expand(100, 2, 576), idx, 0.1)
    with pytest.raises(ValueError, match="q: d_qk must be 576 or 512"):
        flash_mla_sparse_fwd(q[..., :448], kv, idx, 0.1)
    with pytest.raises(ValueError, match="indices"):
        flash_mla_sparse_fwd(q, kv, idx[:1], 0.1)
    with pytest.raises(TypeError, match="indices|slots"):
        flash_mla_sparse_fwd(q, kv, idx.long(), 0.1)


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a GPU "
                    "(torch.cuda.is_available() is False)")
def test_flashmla_large_prefill_cuda():
    run_case("cuda", 1024, 8192, 2048, 128, 576, seed=99, sink=True, topk_length=True)
