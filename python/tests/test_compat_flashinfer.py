"""smla.compat.BatchMLAPagedAttentionWrapper (FlashInfer's plan / run) against a float64
reference written from FlashInfer's documented semantics: request r's KV tokens are pages
kv_indices[kv_indptr[r]:] expanded to page_size tokens each, kv_len_arr[r] of them; every
query row of the request attends them (causal: row i of q_len rows sees kv_len - q_len + i
+ 1); lse [T, H] in base 2 (natural with return_lse_base_on_e), -inf for a row with no
token. And: plan reads no device tensor on the host."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the compat tests need torch")

import smla  # noqa: E402

if not smla.HAVE_TORCH:
    pytest.skip("smla was imported without torch (SMLA_NO_TORCH=1)", allow_module_level=True)

from smla.compat import BatchMLAPagedAttentionWrapper  # noqa: E402
from conftest import DEVICES, cuda_available  # noqa: E402
from refs import (DC, ROW_SIZE, TOL_LSE, U_BF16, assert_close, check_unbiased,  # noqa: E402
                  make_cache, out_model, ref_forward)


def case(device, fmt, dr, H, q_lens, kv_lens, page, seed, causal=False):
    """A paged cache of one buffer ([pages, page, 512 + dr] rows), its ckv / kpe views,
    shuffled page lists per request, q, and the reference."""
    rng = np.random.default_rng(seed)
    R = len(kv_lens)
    pages_per = [max(1, -(-n // page)) for n in kv_lens]
    num_pages = sum(pages_per) + 3
    S = num_pages * page
    scale = 0.02 if fmt == "fp8_tensor" else None
    cache, vals, scale = make_cache(fmt, dr, S, rng, set(range(S)), scale=scale)
    perm = rng.permutation(num_pages)
    kv_indices, kv_indptr, at = [], [0], 0
    for n in pages_per:
        kv_indices += perm[at:at + n].tolist()
        at += n
        kv_indptr.append(len(kv_indices))
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qo_indptr[-1])
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((T, H, DC + dr), generator=g).to(torch.bfloat16)
    # reference slots per query row
    K = max(max(kv_lens), 1)
    slots = np.full((T, K), -1, np.int32)
    for r in range(R):
        for i in range(q_lens[r]):
            t = qo_indptr[r] + i
            n = kv_lens[r] - q_lens[r] + i + 1 if causal else kv_lens[r]
            for k in range(max(0, min(n, kv_lens[r]))):
                slots[t, k] = kv_indices[kv_indptr[r] + k // page] * page + k % page
    sm_scale = 1.0 / math.sqrt(DC + dr)
    r_out, r_lse, _, _, pabs = ref_forward(q.float().numpy(), vals, slots, sm_scale,
                                           abs_mean=True)
    buf = torch.from_numpy(cache.copy()).to(device)
    if fmt == "bf16":
        buf = buf.view(torch.bfloat16)
    else:
        buf = buf.view(torch.float8_e4m3fn)
    buf = buf.view(num_pages, page, DC + dr)
    plan_args = dict(
        qo_indptr=torch.from_numpy(qo_indptr), kv_indptr=torch.tensor(kv_indptr, dtype=torch.int32),
        kv_indices=torch.tensor(kv_indices, dtype=torch.int32, device=device),
        kv_len_arr=torch.tensor(kv_lens, dtype=torch.int32), num_heads=H, head_dim_ckv=DC,
        head_dim_kpe=dr, page_size=page, causal=causal, sm_scale=sm_scale,
        q_data_type=torch.bfloat16, kv_data_type=buf.dtype)
    return dict(q=q.to(device), buf=buf, plan=plan_args, scale=scale, r_out=r_out,
                r_lse=r_lse, pabs=pabs)


def run(c, base_e=False, **plan_kw):
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8))
    w.plan(**dict(c["plan"], **plan_kw))
    q, buf = c["q"], c["buf"]
    dr = buf.shape[-1] - DC
    kw = {}
    if buf.dtype == torch.float8_e4m3fn:
        kw = dict(ckv_scale=c["scale"], kpe_scale=c["scale"])
    return w.run(q[..., :DC], q[..., DC:], buf[..., :DC], buf[..., DC:], return_lse=True,
                 return_lse_base_on_e=base_e, **kw)


def check(c, out, lse, device, base_e, what):
    got = out.float().cpu().numpy()
    atol = 3e-3 + (U_BF16 * c["pabs"] if device == "cuda" else 0.0)
    assert_close(got, c["r_out"], atol, 1.6e-2, what + ": out")
    check_unbiased(got, c["r_out"], what + ": out", out_model(device))
    want = c["r_lse"] if base_e else c["r_lse"] / math.log(2.0)
    assert_close(lse.cpu().numpy(), want, *TOL_LSE, what + ": lse")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,dr", [("bf16", 64), ("fp8_tensor", 64), ("bf16", 0)])
@pytest.mark.parametrize("H", [8, 16, 128])
def test_sparse_page_size_1(device, fmt, dr, H):
    """vLLM's sparse use: page_size 1, each query row its own request, kv_indices the
    selected slots, kv_len the valid count (one row with none: lse -inf, out 0)."""
    kv_lens = [64, 17, 0, 40]
    c = case(device, fmt, dr, H, [1, 1, 1, 1], kv_lens, 1, seed=H + dr + len(fmt))
    out, lse = run(c)
    check(c, out, lse, device, False, "%s dr %d H %d" % (fmt, dr, H))
    assert torch.isneginf(lse[2]).all() and (out[2].float() == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_paged_multi_row_requests(device, causal):
    c = case(device, "bf16", 64, 16, [3, 1, 2], [70, 9, 33], 8, seed=7, causal=causal)
    out, lse = run(c, base_e=True)
    check(c, out, lse, device, True, "page 8, causal %s" % causal)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_never_reads_device_tensors(device):
    """With the index arrays on the device, plan needs max_kv_len and reads nothing."""
    c = case(device, "bf16", 64, 16, [1, 1], [30, 12], 1, seed=3)
    if device == "cuda":
        dev_args = {k: c["plan"][k].to(device) for k in ("qo_indptr", "kv_indptr", "kv_len_arr")}
        with pytest.raises(ValueError, match="max_kv_len: qo_indptr / kv_len_arr are on cuda"):
            run(c, **dev_args)
        out, lse = run(c, max_kv_len=32, **dev_args)
        check(c, out, lse, device, False, "device plan")
    out, lse = run(c, max_kv_len=64)
    check(c, out, lse, device, False, "host plan with max_kv_len")
    with pytest.raises(ValueError, match="max_kv_len: = 16, but kv_len_arr holds 30"):
        run(c, max_kv_len=16)   # host data below the bound: an error, not a silent cut


def test_refused_layouts():
    c = case("cpu", "bf16", 64, 8, [1], [5], 1, seed=1)
    w = BatchMLAPagedAttentionWrapper(None)
    w.plan(**c["plan"])
    buf, q = c["buf"], c["q"]
    with pytest.raises(ValueError, match="kpe_cache: must be the rope part"):
        w.run(q[..., :DC], q[..., DC:], buf[..., :DC], buf[..., DC:].clone())
    with pytest.raises(ValueError, match="page_table: is not supported"):
        w.run(q[..., :DC], q[..., DC:], buf[..., :DC], buf[..., DC:], page_table=torch.zeros(1))


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a GPU")
def test_run_in_a_cuda_graph_with_kv_indices_rewritten():
    c = case("cuda", "bf16", 64, 16, [1, 1, 1], [64, 64, 64], 1, seed=9)
    w = BatchMLAPagedAttentionWrapper(None, use_cuda_graph=True)
    w.plan(**c["plan"])
    q, buf = c["q"], c["buf"]
    idx = c["plan"]["kv_indices"]
    f = lambda: w.run(q[..., :DC], q[..., DC:], buf[..., :DC], buf[..., DC:],  # noqa: E731
                      return_lse=True)
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = f()
    rng = np.random.default_rng(2)
    for step in range(3):
        new = rng.permutation(idx.numel()).astype(np.int32)
        idx.copy_(torch.from_numpy(new))
        g.replay()
        torch.cuda.synchronize()
        slots = new.reshape(3, 64)  # page_size 1: the new lists are the slots
        cache = buf.view(-1, DC + 64).float().cpu().numpy().astype(np.float64)
        r_out, r_lse, _, _ = ref_forward(q.float().cpu().numpy(), cache, slots,
                                         1.0 / math.sqrt(576.0))
        assert_close(out.float().cpu().numpy(), r_out, 3e-3 + 2 ** -8, 1.6e-2, "replay out")
        assert_close(lse.cpu().numpy(), r_lse / math.log(2.0), *TOL_LSE, "replay lse")
