"""Every operation through the binding, with numpy arrays on the CPU backend, against the
float64 references in refs.py. Runs in CI (numpy + pytest only)."""

import numpy as np
import pytest

import smla
from refs import (BF16_NAN, DC, MERGE_MODEL, ROW_SIZE, TOL_LSE, aligned_zeros, assert_close,
                  bf16_round, bf16_truncate, check_out, check_unbiased, decode_row,
                  e4m3_encode, encode_row, from_bf16_bits, make_cache, ref_convert,
                  ref_forward, ref_merge, ref_metadata, to_bf16_bits, unbiased_stats)

FORMATS = ["bf16", "fp8_tensor", "fp8_ds"]


def rand_q(rng, T, N, dr):
    return to_bf16_bits(rng.standard_normal((T, N, DC + dr)))


def nan_bf16(shape):
    return np.full(shape, BF16_NAN, np.uint16)


def make_slots(rng, T, K, S, used, invalid_frac=0.2):
    used = np.array(sorted(used))
    slots = used[rng.integers(0, used.size, (T, K))].astype(np.int64)
    bad = rng.random((T, K)) < invalid_frac
    junk = rng.choice([-1, -1, -7, S, S + 5, 2 ** 31 - 1], size=(T, K))
    return np.where(bad, junk, slots).astype(np.int32)


# ---- forward ----------------------------------------------------------------------------------------
CASES = [  # (T, N, K, S)
    (1, 16, 64, 96),
    (3, 1, 7, 40),
    (5, 64, 33, 128),
    (2, 128, 16, 32),
    (2, 16, 2048, 3000),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dr", [64, 0])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_forward_matches_reference(fmt, dr, case):
    T, N, K, S = CASES[case]
    rng = np.random.default_rng(100 + case + 7 * dr + 13 * FORMATS.index(fmt))
    used = set(rng.choice(S, size=max(1, S * 2 // 3), replace=False).tolist())
    cache, rows, scale = make_cache(fmt, dr, S, rng, used, row_pad=16 * (case % 2))
    q = rand_q(rng, T, N, dr)
    slots = make_slots(rng, T, K, S, used)
    lengths = rng.integers(-2, K + 3, T).astype(np.int32)
    lengths[0] = K
    sink = rng.standard_normal(N).astype(np.float32) if case % 2 == 0 else None
    softcap = 20.0 if case == 2 else 0.0
    sm_scale = 1.0 / np.sqrt(DC + dr)
    out = nan_bf16((T, N, DC))
    lse = np.full((T, N), np.nan, np.float32)
    mx = np.full((T, N), np.nan, np.float32)
    bad = np.zeros(1, np.uint64)
    kv = smla.KVCache(cache, format=fmt, dr=dr, scale=scale)
    got = smla.forward(q, None, kv, slots, sm_scale=sm_scale, lengths=lengths, sink=sink,
                       softcap=softcap, out=out, lse=lse, max_logit=mx, bad_inputs=bad)
    assert got[0] is out and got[1] is lse and got[2] is mx
    r_out, r_lse, r_mx, r_bad = ref_forward(from_bf16_bits(q), rows, slots, sm_scale, lengths,
                                            softcap, sink)
    check_out(from_bf16_bits(out), r_out, 3e-3, 1.6e-2, "out")
    assert_close(lse, r_lse, *TOL_LSE, "lse")
    assert_close(mx, r_mx, *TOL_LSE, "max_logit")
    assert int(bad[0]) == r_bad


def test_forward_return_forms_and_split_q():
    rng = np.random.default_rng(1)
    T, N, K, S, dr = 2, 8, 16, 64, 64
    cache, rows, _ = make_cache("bf16", dr, S, rng, set(range(S)))
    q = rand_q(rng, T, N, dr)
    slots = make_slots(rng, T, K, S, set(range(S)), 0.0)
    out = smla.forward(q, None, cache, slots)
    assert out.shape == (T, N, DC) and out.dtype == np.uint16
    # separate q_nope / q_pe (each its own array) give the same bits
    qn, qp = np.ascontiguousarray(q[..., :DC]), np.ascontiguousarray(q[..., DC:])
    out2, lse2 = smla.forward(qn, qp, cache, slots, return_lse=True)
    assert np.array_equal(out, out2)
    out3, mx3 = smla.forward(qn, qp, cache, slots, return_max_logit=True)
    assert np.array_equal(out, out3) and mx3.shape == (T, N)
    o4, l4, m4 = smla.forward(q, None, cache, slots, return_lse=True, return_max_logit=True)
    assert np.array_equal(l4, lse2) and np.array_equal(m4, mx3)
    # float32 q is rounded to bf16 (same bits as rounding first)
    out5 = smla.forward(from_bf16_bits(q), None, cache, slots)
    assert np.array_equal(out, out5)
    # default sm_scale is 1/sqrt(576)
    out6 = smla.forward(q, None, cache, slots, sm_scale=1 / np.sqrt(576.0))
    assert np.array_equal(out, out6)
    r_out, _, _, _ = ref_forward(from_bf16_bits(q), rows, slots, 1 / np.sqrt(576.0))
    check_out(from_bf16_bits(out), r_out, 3e-3, 1.6e-2, "out")


def test_forward_strided_views():
    """q, out, lse and slots as views into larger buffers (padded strides)."""
    rng = np.random.default_rng(2)
    T, N, K, S, dr = 3, 4, 24, 50, 64
    cache, rows, _ = make_cache("bf16", dr, S, rng, set(range(0, S, 2)))
    qbuf = aligned_zeros((T, N + 1, 640), np.uint16)
    qbuf[...] = to_bf16_bits(rng.standard_normal(qbuf.shape))
    q = qbuf[:, :N, :DC + dr]
    sbuf = aligned_zeros((T, K + 8), np.int32)
    sbuf[:, :K] = make_slots(rng, T, K, S, set(range(0, S, 2)))
    slots = sbuf[:, :K]
    obuf = aligned_zeros((T, N, 2 * DC), np.uint16)
    obuf[...] = BF16_NAN
    out = obuf[:, :, :DC]
    lbuf = np.full((T, N + 3), np.nan, np.float32)
    lse = lbuf[:, :N]
    smla.forward(q, None, cache, slots, sm_scale=0.05, out=out, lse=lse)
    r_out, r_lse, _, _ = ref_forward(from_bf16_bits(q), rows, slots, 0.05)
    check_out(from_bf16_bits(out), r_out, 3e-3, 1.6e-2, "out")
    assert_close(lse, r_lse, *TOL_LSE, "lse")
    assert (obuf[:, :, DC:] == BF16_NAN).all() and np.isnan(lbuf[:, N:]).all()


def test_forward_rows_with_no_used_entry():
    rng = np.random.default_rng(3)
    T, N, K, S = 3, 16, 8, 16
    cache, _, _ = make_cache("bf16", 64, S, rng, set(range(S)))
    q = rand_q(rng, T, N, 64)
    slots = np.full((T, K), -1, np.int32)
    slots[1] = S + 3                 # all out of range
    slots[2, 0] = 5                  # one valid entry, but past lengths[2] = 0
    lengths = np.array([K, K, 0], np.int32)
    sink = np.full(N, 0.5, np.float32)
    out, lse, mx = smla.forward(q, None, cache, slots, lengths=lengths, sink=sink,
                                out=nan_bf16((T, N, DC)), return_lse=True,
                                return_max_logit=True)
    assert (from_bf16_bits(out) == 0).all()
    assert np.isneginf(lse).all() and np.isneginf(mx).all()


def test_out_checks_reject_truncated_rounding():
    """The bias check can fail: the float64 reference rounded to bf16 by truncation passes
    the elementwise bound (a full ulp is inside it) but not check_unbiased; rounded to
    nearest even it passes, as does smla's own out."""
    rng = np.random.default_rng(40)
    T, N, K, S = 4, 16, 64, 128
    cache, rows, _ = make_cache("bf16", 64, S, rng, set(range(S)))
    q = rand_q(rng, T, N, 64)
    slots = make_slots(rng, T, K, S, set(range(S)), 0.0)
    out = smla.forward(q, None, cache, slots, sm_scale=0.05)
    r_out = ref_forward(from_bf16_bits(q), rows, slots, 0.05)[0]
    nearest, truncated = bf16_round(r_out), bf16_truncate(r_out)
    assert not np.array_equal(nearest, truncated)
    for name, got in (("smla", from_bf16_bits(out)), ("nearest", nearest)):
        check_out(got, r_out, 3e-3, 1.6e-2, name)
    assert_close(truncated, r_out, 3e-3, 1.6e-2, "truncated")   # the elementwise bound admits it
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased(truncated, r_out, "truncated")
    b, lo, hi, _, _ = unbiased_stats(truncated, r_out)
    assert b < -0.5 * 2.0 ** -8 and lo > 0.1 * b and hi < 0.1 * abs(b)
    # even one (t, h) row of 512 values tells them apart
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased(truncated[0, :1], r_out[0, :1], "truncated, one row")
    check_unbiased(nearest[0, :1], r_out[0, :1], "nearest, one row")
    # the CUDA model (a rounding shared by each row) still rejects it over these 64 rows
    from refs import OUT_MODEL_CUDA
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased(truncated, r_out, "truncated (cuda model)", OUT_MODEL_CUDA)
    # values just below bf16 numbers (a merge dominated by one bf16 partial: 0.999 v)
    # all round up in magnitude: a correct rounding's bias is then far from 0, and the
    # interval of check_unbiased must take it while still rejecting truncation
    v = bf16_round(rng.uniform(-1, 1, (64, DC)))
    r = v * 0.999
    check_unbiased(bf16_round(r), r, "nearest, structured")
    assert unbiased_stats(bf16_round(r), r)[0] > 0.1 * 2.0 ** -8
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased(bf16_truncate(r), r, "truncated, structured")
    # a small relative error everywhere (a scale off by 1%) fails the Frobenius bound
    with pytest.raises(AssertionError, match="Frobenius"):
        check_unbiased(bf16_round(r_out * (1 + np.sign(rng.standard_normal(r_out.shape))
                                           * 1e-2)), r_out, "scaled")


def test_forward_zero_tokens():
    cache = aligned_zeros((4, 1152), np.uint8)
    out, lse = smla.forward(np.zeros((0, 16, 576), np.uint16), None, cache,
                            np.zeros((0, 8), np.int32), return_lse=True)
    assert out.shape == (0, 16, DC) and lse.shape == (0, 16)


def test_plan_reuse_and_mismatch():
    rng = np.random.default_rng(4)
    T, N, K, S = 4, 16, 32, 64
    cache, rows, _ = make_cache("bf16", 64, S, rng, set(range(S)))
    with smla.Plan(N, K, dr=64, format="bf16", max_tokens=T, device="cpu") as plan:
        assert "cpu" in plan.describe and plan.max_tokens == T
        for t in (1, 3, 4):
            q = rand_q(rng, t, N, 64)
            slots = make_slots(rng, t, K, S, set(range(S)))
            out = plan.forward(q, None, cache, slots, sm_scale=0.04)
            r_out, _, _, _ = ref_forward(from_bf16_bits(q), rows, slots, 0.04)
            check_out(from_bf16_bits(out), r_out, 3e-3, 1.6e-2, "out T=%d" % t)
        q = rand_q(rng, T + 1, N, 64)
        with pytest.raises(smla.SmlaError) as e:
            plan.forward(q, None, cache, make_slots(rng, T + 1, K, S, set(range(S))))
        assert e.value.status_name == "SMLA_ERR_PLAN_MISMATCH" and "max_tokens" in e.value.message
        with pytest.raises(smla.SmlaError, match="topk"):
            plan.forward(q[:1], None, cache, np.zeros((1, K + 1), np.int32))
    assert plan.describe == "closed plan"


def test_prepare_plans_is_what_forward_uses():
    p = smla.prepare_plans("cpu", num_heads=8, topk=12, dr=0, format="fp8_ds", max_tokens=20)
    assert p.max_tokens >= 20
    assert smla.prepare_plans("cpu", 8, 12, 0, "fp8_ds", max_tokens=3) is p


# ---- convert indices ------------------------------------------------------------------------------------
@pytest.mark.parametrize("compact", [False, True])
def test_convert_indices(compact):
    rng = np.random.default_rng(5)
    T, K, R, B, bs = 6, 20, 3, 4, 16
    bt_buf = aligned_zeros((R, B + 2), np.int32)
    bt_buf[:, :B] = rng.integers(0, 40, (R, B))
    bt_buf[1, 2] = -1
    block_table = bt_buf[:, :B]              # row stride B + 2
    req_id = np.array([0, 1, 2, 1, 5, -1], np.int32)   # 5 and -1: no such request
    local = rng.integers(-3, B * bs + 10, (T, K)).astype(np.int32)
    r_slots, r_valid = ref_convert(req_id, block_table, local, bs, compact)
    slots, valid = smla.convert_indices(req_id, block_table, local, block_size=bs,
                                        compact=compact, return_valid=True)
    assert np.array_equal(slots, r_slots) and np.array_equal(valid, r_valid)
    assert smla.convert_indices(req_id, block_table, local, block_size=bs,
                                compact=compact).shape == (T, K)
    if not compact:  # in place
        loc2 = local.copy()
        got = smla.convert_indices(req_id, block_table, loc2, block_size=bs, slots=loc2)
        assert got is loc2 and np.array_equal(loc2, r_slots)


@pytest.mark.parametrize("cp", [(2, 0, 1), (2, 1, 1), (3, 2, 4), (4, 1, 16)])
def test_convert_indices_context_parallel(cp):
    """Rank cp[1]'s entries only, at their position in that rank's own sequence."""
    rng = np.random.default_rng(7 + cp[0] * 10 + cp[1])
    T, K, B, bs = 5, 40, 6, 16
    block_table = rng.permutation(2 * B)[:B].astype(np.int32)[None]
    req_id = np.zeros(T, np.int32)
    local = rng.integers(-2, B * bs * cp[0], (T, K)).astype(np.int32)
    r_slots, r_valid = ref_convert(req_id, block_table, local, bs, True, cp=cp)
    slots, valid = smla.convert_indices(req_id, block_table, local, block_size=bs,
                                        compact=True, return_valid=True, cp_size=cp[0],
                                        cp_rank=cp[1], cp_interleave=cp[2])
    assert np.array_equal(slots, r_slots) and np.array_equal(valid, r_valid)
    assert valid.sum() > 0


# ---- cache write ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dr", [64, 0])
def test_cache_write(fmt, dr):
    rng = np.random.default_rng(6 + dr)
    T, S = 9, 24
    row = ROW_SIZE[(fmt, dr)]
    cache = aligned_zeros((S, row + 32), np.uint8)
    cache[...] = 0xAB                                  # rows not written must stay so
    kv_c = to_bf16_bits(rng.standard_normal((T, DC)) * rng.uniform(0.01, 900, (T, 1)))
    k_pe = to_bf16_bits(rng.standard_normal((T, dr)))
    slot = rng.choice(S, T, replace=False).astype(np.int64)
    slot[2], slot[5], slot[7] = -1, S, S + 100         # padding, then two bad slots
    scale = 0.02
    bad = np.zeros(1, np.int64)
    smla.cache_write(kv_c, k_pe if dr else None, slot, cache, format=fmt, dr=dr,
                     scale=scale, bad_inputs=bad)
    assert int(bad[0]) == 2
    written = set()
    for t in range(T):
        s = int(slot[t])
        if not 0 <= s < S:
            continue
        written.add(s)
        want = encode_row(fmt, dr, from_bf16_bits(kv_c[t]), from_bf16_bits(k_pe[t]), scale)
        got_v = decode_row(fmt, dr, cache[s, :row], scale)
        want_v = decode_row(fmt, dr, want, scale)
        assert np.array_equal(got_v, want_v, equal_nan=True), (fmt, dr, t)
        assert (cache[s, row:] == 0xAB).all()          # the row padding is untouched
    for s in set(range(S)) - written:
        assert (cache[s] == 0xAB).all()


def test_cache_write_concatenated_kv_and_nan():
    rng = np.random.default_rng(7)
    T, S = 3, 8
    cache = aligned_zeros((2, 4, 656), np.uint8)       # [num_blocks, block_size, row]
    kv = rng.standard_normal((T, DC + 64)).astype(np.float32)
    kv[1, 3] = np.nan
    kv[2, 200] = np.inf
    slot = np.array([0, 5, 7], np.int64)
    smla.cache_write(kv, None, slot, cache)            # float32 -> bf16; format from 656
    flat = cache.reshape(S, 656)
    for t in range(T):
        bits = to_bf16_bits(np.nan_to_num(kv[t], nan=0.0, posinf=0.0))
        vals = from_bf16_bits(bits).astype(np.float64)
        vals[~np.isfinite(kv[t])] = kv[t][~np.isfinite(kv[t])]
        scales = [2.0 ** 127 if np.isinf(vals[g * 128:(g + 1) * 128]).any() else None
                  for g in range(4)]
        got = decode_row("fp8_ds", 64, flat[slot[t]])
        if t == 1:
            assert np.isnan(got[3]) and np.isfinite(np.delete(got, 3)).all()
        if t == 2:
            assert scales[1] is not None
            assert got[200] == 448.0 * 2.0 ** 127
        if t == 0:
            want = decode_row("fp8_ds", 64, encode_row("fp8_ds", 64, vals[:DC], vals[DC:]))
            assert np.array_equal(got, want)


# ---- merge -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("out_dtype", ["float32", "bf16"])
def test_merge_states(in_dtype, out_dtype):
    rng = np.random.default_rng(8)
    P, T, N, dv = 3, 4, 5, 96
    out_p = rng.standard_normal((P, T, N, dv)).astype(np.float32)
    lse_p = (rng.standard_normal((P, T, N)) * 3).astype(np.float32)
    lse_p[0, 0, 0] = -np.inf
    lse_p[:, 1, 2] = -np.inf                      # all -inf: out 0, lse -inf
    out_p[0, 0, 0] = np.nan                       # a -inf partial is not read
    if in_dtype == "bf16":
        arg = to_bf16_bits(np.nan_to_num(out_p))
        arg[0, 0, 0] = BF16_NAN
        ref_in = from_bf16_bits(arg)
    else:
        arg = out_p
        ref_in = out_p
    r_out, r_lse = ref_merge(np.where(np.isneginf(lse_p)[..., None], 0, ref_in), lse_p)
    out, lse = smla.merge_states(arg, lse_p, out_dtype=out_dtype, return_lse=True)
    got = out if out_dtype == "float32" else from_bf16_bits(out)
    tol = (1e-5, 1e-5) if out_dtype == "float32" else (2e-3, 8e-3)
    assert_close(got, r_out, tol[0], tol[1], "out")
    if out_dtype == "bf16":
        check_unbiased(got, r_out, "out", MERGE_MODEL, row_len=dv)
    assert_close(lse, r_lse, 1e-5, 1e-6, "lse")


# ---- metadata ------------------------------------------------------------------------------------------------
META_CASES = {
    "decode_1_of_2": ([0, 1], [17], 2),
    "decode_3_of_32": ([0, 1, 2, 3], [5, 3000, 1], 32),
    "decode_7_of_8": ([0, 1, 2, 3, 4, 5, 6, 7], [9] * 7, 8),
    "mixed_decode_prefill": ([0, 1, 2, 12, 15], [40, 2, 10, 3], 16),
    "speculative_31_of_32": ([0, 4, 8, 12, 31], [100, 4, 2050, 19], 32),
    "padding_requests": ([0, 2, 5, 5, 5], [7, 3, -4, 99], 8),
    "prefill_100_of_104": ([0, 100], [130], 104),
    "zero_real_tokens": ([0, 0, 0], [0, 5], 4),
    "no_requests": ([0], [], 3),
}


@pytest.mark.parametrize("name", sorted(META_CASES))
def test_build_metadata(name):
    qsl, seq, T = META_CASES[name]
    K = 2048
    req_id, ctx_len, limit = smla.build_metadata(qsl, seq, num_tokens=T, topk=K)
    r_req, r_ctx, r_lim = ref_metadata(qsl, seq, T, K)
    assert np.array_equal(req_id, r_req) and np.array_equal(ctx_len, r_ctx)
    assert np.array_equal(limit, r_lim)
    # numpy inputs and preallocated outputs
    outs = [np.full(T, 77, np.int32) for _ in range(3)]
    got = smla.build_metadata(np.array(qsl, np.int32), np.array(seq, np.int32), num_tokens=T,
                              topk=16, req_id=outs[0], ctx_len=outs[1], limit=outs[2])
    assert all(g is o for g, o in zip(got, outs))
    assert np.array_equal(outs[2], np.minimum(r_ctx, 16))


@pytest.mark.parametrize("qsl,seq,T", [
    ([0, 3, 2], [5, 5], 4),          # decreasing starts
    ([0, 2, 9], [5, 5], 8),          # last start > T
    ([0, 4], [3], 4),                # seq_len < q_len
    ([1, 2], [5], 4),                # query_start_loc[0] != 0
])
def test_build_metadata_malformed(qsl, seq, T):
    out = np.full(T, 77, np.int32)
    with pytest.raises(smla.SmlaError) as e:
        smla.build_metadata(qsl, seq, num_tokens=T, topk=8, req_id=out)
    assert e.value.status_name == "SMLA_ERR_MALFORMED"
    assert (out == 77).all()          # untouched on error


# ---- helpers ----------------------------------------------------------------------------------------------------
def test_bf16_helpers():
    x = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, -3.3e38, np.inf, -np.inf, 1e-40],
                 np.float32)
    assert np.array_equal(smla.bf16_from_f32(x), to_bf16_bits(x))
    assert np.array_equal(smla.f32_from_bf16(smla.bf16_from_f32(x)), from_bf16_bits(to_bf16_bits(x)))
    n = smla.bf16_from_f32(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(smla.f32_from_bf16(n)).all()
    assert smla.cache_row_size("fp8_ds", 64) == 656 and smla.cache_row_size("bf16", 0) == 1024


def test_e4m3_reference_encoder_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    from refs import E4M3
    assert np.array_equal(E4M3[e4m3_encode(E4M3[codes])], E4M3[codes])


def test_closing_a_cached_plan_removes_it():
    p = smla.prepare_plans("cpu", num_heads=4, topk=5, dr=64, max_tokens=2)
    p.close()
    q2 = smla.prepare_plans("cpu", num_heads=4, topk=5, dr=64, max_tokens=2)
    assert q2 is not p and "closed" not in q2.describe
