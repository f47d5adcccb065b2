"""Independent references for the binding's tests, written from SPEC.md (not from smla's
code): bf16 and e4m3 by hand, cache rows built byte by byte, and float64 attention,
conversion, merge and metadata in plain numpy."""

import math

import numpy as np

DC = 512
BF16_NAN = 0x7FC0
ROW_SIZE = {("bf16", 64): 1152, ("bf16", 0): 1024, ("fp8_tensor", 64): 576,
            ("fp8_tensor", 0): 512, ("fp8_ds", 64): 656, ("fp8_ds", 0): 528}


# ---- bf16 -------------------------------------------------------------------------------------
def to_bf16_bits(x):
    """float -> bf16 bits, nearest even (finite inputs)."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    return from_bf16_bits(to_bf16_bits(x))


# ---- e4m3 (OCP E4M3FN) ----------------------------------------------------------------------------
def _e4m3_value(code):
    s = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * (m / 8.0) * 2.0 ** -6
    return s * (1 + m / 8.0) * 2.0 ** (e - 7)


E4M3 = np.array([_e4m3_value(c) for c in range(256)])   # code -> value
_POS = E4M3[:127]                                        # codes 0..126, increasing


def e4m3_encode(x):
    """float -> e4m3 codes: nearest, ties to even, saturating at +-448, NaN -> 0x7F|sign."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), 448.0)
    a = np.where(np.isnan(a), 0.0, a)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a == 0, 0, pick)
    code = pick.astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), 0x7F | np.where(np.signbit(x), 0x80, 0), code).astype(np.uint8)


def ds_scale(group):
    """FP8_DS group scale: 2^ceil(log2(max(amax/448, 1e-4))), NaN left out of amax."""
    g = np.abs(np.asarray(group, dtype=np.float64))
    g = g[~np.isnan(g)]
    amax = g.max() if g.size else 0.0
    if math.isinf(amax):
        return 2.0 ** 127
    return 2.0 ** math.ceil(math.log2(max(amax / 448.0, 1e-4)))


# ---- caches ------------------------------------------------------------------------------------------
def encode_row(fmt, dr, latent, rope, scale=1.0):
    """One cache row's bytes for latent [512] and rope [dr] (floats, bf16-representable)."""
    lat_b = to_bf16_bits(latent)
    rope_b = to_bf16_bits(rope)
    if fmt == "bf16":
        return np.concatenate([lat_b, rope_b]).view(np.uint8)
    if fmt == "fp8_tensor":
        v = np.concatenate([from_bf16_bits(lat_b), from_bf16_bits(rope_b)])
        return e4m3_encode(v.astype(np.float32) / np.float32(scale))
    lat = from_bf16_bits(lat_b)
    scales = np.array([ds_scale(lat[g * 128:(g + 1) * 128]) for g in range(4)], np.float32)
    codes = np.concatenate([e4m3_encode(lat[g * 128:(g + 1) * 128] / scales[g])
                            for g in range(4)])
    return np.concatenate([codes, scales.view(np.uint8), rope_b.view(np.uint8)])


def decode_row(fmt, dr, row, scale=1.0):
    """A cache row's bytes -> float64 [512 + dr] values (what forward reads)."""
    row = np.asarray(row, dtype=np.uint8)
    if fmt == "bf16":
        return from_bf16_bits(row[:2 * (DC + dr)].view(np.uint16)).astype(np.float64)
    if fmt == "fp8_tensor":
        return E4M3[row[:DC + dr]] * np.float64(np.float32(scale))
    scales = row[DC:DC + 16].view(np.float32).astype(np.float64)
    lat = E4M3[row[:DC]] * np.repeat(scales, 128)
    rope = from_bf16_bits(row[DC + 16:DC + 16 + 2 * dr].view(np.uint16)).astype(np.float64)
    return np.concatenate([lat, rope])


def aligned_zeros(shape, dtype, align=64):
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dtype).reshape(shape)


def make_cache(fmt, dr, num_slots, rng, used, row_pad=0, scale=None):
    """A cache of `num_slots` rows of which `used` (a set of slots) hold random rows; every
    other row is NaN. -> (bytes [S, row_bytes] uint8, values [S, 512 + dr] float64, scale)."""
    row = ROW_SIZE[(fmt, dr)]
    rb = row + row_pad
    cache = aligned_zeros((num_slots, rb), np.uint8)
    vals = np.full((num_slots, DC + dr), np.nan)
    if scale is None:
        scale = 0.0125 if fmt == "fp8_tensor" else 1.0
    nan_row = _nan_row(fmt, dr)
    for s in range(num_slots):
        if s in used:
            latent = rng.standard_normal(DC) * (1.0 + 3.0 * rng.random())
            rope = rng.standard_normal(dr)
            cache[s, :row] = encode_row(fmt, dr, latent, rope, scale)
            vals[s] = decode_row(fmt, dr, cache[s], scale)
        else:
            cache[s, :row] = nan_row
    return cache, vals, scale


def _nan_row(fmt, dr):
    if fmt == "bf16":
        return np.full(DC + dr, BF16_NAN, np.uint16).view(np.uint8)
    if fmt == "fp8_tensor":
        return np.full(DC + dr, 0x7F, np.uint8)
    return np.concatenate([np.full(DC, 0x7F, np.uint8),
                           np.full(4, np.nan, np.float32).view(np.uint8),
                           np.full(dr, BF16_NAN, np.uint16).view(np.uint8)])


# ---- the operations ------------------------------------------------------------------------------------
def ref_forward(q, rows, slots, sm_scale, lengths=None, softcap=0.0, sink=None,
                abs_mean=False):
    """q [T, N, 512 + dr] float, rows [S, 512 + dr] float64 -> out [T, N, 512], lse,
    max_logit [T, N] (float64), bad (entries >= S or < -1 inside the lengths); with
    abs_mean=True also sum_j p_j |v_j| [T, N, 512] (the scale of out's rounding errors)."""
    T, N, _ = q.shape
    S = rows.shape[0]
    K = slots.shape[1]
    out = np.zeros((T, N, DC))
    pabs = np.zeros((T, N, DC))
    lse = np.full((T, N), -np.inf)
    mx = np.full((T, N), -np.inf)
    bad = 0
    for t in range(T):
        n = K if lengths is None else int(np.clip(lengths[t], 0, K))
        idx = slots[t, :n].astype(np.int64)
        bad += int(((idx >= S) | (idx < -1)).sum())
        used = idx[(idx >= 0) & (idx < S)]
        if used.size == 0:
            continue
        g = rows[used]
        lg = sm_scale * (q[t].astype(np.float64) @ g.T)      # [N, u]
        if softcap > 0:
            lg = softcap * np.tanh(lg / softcap)
        m = lg.max(axis=1)
        e = np.exp(lg - m[:, None])
        z = e.sum(axis=1)
        den = z + (np.exp(np.asarray(sink, np.float64) - m) if sink is not None else 0.0)
        out[t] = (e @ g[:, :DC]) / den[:, None]
        if abs_mean:
            pabs[t] = (e @ np.abs(g[:, :DC])) / den[:, None]
        lse[t] = m + np.log(z)
        mx[t] = m
    if abs_mean:
        return out, lse, mx, bad, pabs
    return out, lse, mx, bad


def ref_convert(req_id, block_table, local, block_size, compact=False, cp=None):
    """cp: (size, rank, interleave) or None; a kept position is renumbered by counting the
    rank's positions before it."""
    T, K = local.shape
    R, B = block_table.shape
    slots = np.full((T, K), -1, np.int64)
    for t in range(T):
        r = int(req_id[t])
        for k in range(K):
            p = int(local[t, k])
            if cp is not None and p >= 0:
                W, rank, il = cp
                if (p // il) % W != rank:
                    continue
                p = sum(1 for x in range(p) if (x // il) % W == rank)
            if p < 0 or not (0 <= r < R) or p // block_size >= B:
                continue
            blk = int(block_table[r, p // block_size])
            if blk < 0:
                continue
            s = blk * block_size + p % block_size
            if s <= 2 ** 31 - 1:
                slots[t, k] = s
    valid = (slots >= 0).sum(axis=1)
    if compact:
        c = np.full_like(slots, -1)
        for t in range(T):
            v = slots[t][slots[t] >= 0]
            c[t, :v.size] = v
        slots = c
    return slots.astype(np.int32), valid.astype(np.int32)


def ref_merge(out_p, lse_p):
    """out_p [P, T, N, dv], lse_p [P, T, N] -> out [T, N, dv], lse [T, N] (float64)."""
    out_p = np.asarray(out_p, np.float64)
    lse_p = np.asarray(lse_p, np.float64)
    P, T, N, dv = out_p.shape
    out = np.zeros((T, N, dv))
    lse = np.full((T, N), -np.inf)
    for t in range(T):
        for h in range(N):
            ls = lse_p[:, t, h]
            ok = ls > -np.inf
            if not ok.any():
                continue
            m = ls[ok].max()
            w = np.exp(ls[ok] - m)
            lse[t, h] = m + np.log(w.sum())
            out[t, h] = (w[:, None] * out_p[ok, t, h]).sum(axis=0) / w.sum()
    return out, lse


def ref_metadata(query_start_loc, seq_lens, T, K):
    req_id = np.zeros(T, np.int32)
    ctx = np.zeros(T, np.int32)
    for r in range(len(seq_lens)):
        a, b = query_start_loc[r], query_start_loc[r + 1]
        q_len = b - a
        for j in range(q_len):
            req_id[a + j] = r
            ctx[a + j] = seq_lens[r] - q_len + j + 1
    return req_id, ctx, np.minimum(ctx, K).astype(np.int32)


# ---- error metrics a wrong kernel cannot pass --------------------------------------------------------
# The elementwise bounds (assert_close) admit a full bf16 ulp of error per element, so a
# kernel that rounds its bf16 output by truncation (a bias of about -0.7 u on every element)
# or loses a little everywhere passes them. check_unbiased adds two statistics, the same as
# the C suite's t_check_bf16_unbiased (tests/harness.c; constants in tests/fwd.c OUT_MODEL,
# tests/cases_ops.c MERGE_BF16_MODEL), over the elements where got and ref are finite and
# ref != 0:
#  - bias  b = sum (g - r) sgn(r) / sum |r|, which must lie in
#      [min(0, b0) - bound, max(0, b0) + bound], with
#      bound = sigmas * sqrt(elem_var sum r^2 + row_var sum_rows (sum_row |r|)^2) / sum |r|
#              + abs_slack
#    and b0 the same statistic of r rounded to nearest bf16: rounding to nearest is
#    unbiased only when the values sit evenly between bf16 numbers; where they do not (a
#    merge dominated by one bf16 partial gives 0.999 v, just below the bf16 number v) a
#    correct result's bias lies between b0 (an exact result rounded once) and 0 (noise of
#    an ulp or more spreads the positions), as tests/harness.h says;
#  - relative Frobenius error ||g - r|| / ||r|| <= frob.
# Error model, u = 2^-8 (bf16 unit roundoff: 8 significant bits, round to nearest):
#  - the output's one rounding to bf16: r in [2^e, 2^(e+1)) lands within half an ulp,
#    |g - r| <= u 2^e <= u |r|; over the fraction bits it is uniform and zero-mean, with
#    variance (u 2^e)^2 / 3 <= u^2 r^2 / 3, independent between elements: elem_var = u^2/3.
#    (Against a float64 reference there is one such rounding; the C suite, which also
#    compares two backends, takes two: 2 u^2 / 3.)
#  - the CUDA kernels also round each probability p_j to bf16 before P.V (to nearest,
#    relative <= u, zero-mean); with one dominant p_j that error is shared by all 512 values
#    of the (t, h) row: row_var = u^2 / 3 for one kernel against the reference (the CPU
#    backend keeps p in float: row_var = 0).
#  - float softmax and accumulation: ~1e-6 relative, covered by abs_slack = 1e-5.
# sigmas = 6: a correct kernel fails once in ~5e8 runs. frob: the expected relative error
# is sqrt(elem_var + row_var) <= 0.82 u and one rounding to nearest can never exceed u; 2 u
# (as in C) leaves room for float error where out nearly cancels. What they catch: a
# truncating store gives b ~ -0.7 u = -2.7e-3 (measured by test_ops' self-test), while the
# CPU bias bound for n normal-like elements is 6 u sqrt(E r^2 / (3 n E^2 |r|)) = 7.6 u /
# sqrt(3 n) (7.6e-4 at n = 512, one (t, h) row); a wrong scale, a
# skipped tile or a dropped rope part gives relative errors of 1e-2 and more (> frob).
U_BF16 = 2.0 ** -8


class RoundModel:
    """Parameters of check_unbiased (see the derivation above)."""

    def __init__(self, elem_var, row_var, sigmas=6.0, abs_slack=1e-5, frob=2 * U_BF16):
        self.elem_var, self.row_var = elem_var, row_var
        self.sigmas, self.abs_slack, self.frob = sigmas, abs_slack, frob


# forward's out against the float64 reference, per backend (see above)
OUT_MODEL_CPU = RoundModel(U_BF16 ** 2 / 3, 0.0)
OUT_MODEL_CUDA = RoundModel(U_BF16 ** 2 / 3, U_BF16 ** 2 / 3)
# merge_states' bf16 out: one rounding of a float result, nothing shared by a row
MERGE_MODEL = RoundModel(U_BF16 ** 2 / 3, 0.0)


def out_model(device="cpu"):
    """The forward out model of a backend: "cpu"/"numpy" or "cuda" (or a torch.device)."""
    return OUT_MODEL_CUDA if str(device).startswith("cuda") else OUT_MODEL_CPU


def unbiased_stats(got, ref, row_len=DC, model=OUT_MODEL_CPU, rounded_ref=None):
    """-> (b, lo, hi, frob, n) of check_unbiased, or None when nothing is measurable.
    rounded_ref: what an exact computation of the algorithm gives with its roundings (its
    bias is b0); default: ref rounded to nearest bf16 once."""
    g = np.asarray(got, np.float64).reshape(-1, row_len)
    r = np.asarray(ref, np.float64).reshape(-1, row_len)
    ok = np.isfinite(g) & np.isfinite(r) & (r != 0)
    n = int(ok.sum())
    if n == 0:
        return None
    d = np.where(ok, g - r, 0.0)
    a = np.where(ok, np.abs(r), 0.0)
    sum_abs = a.sum()
    b = (d * np.sign(r)).sum() / sum_abs
    if rounded_ref is None:
        rr = bf16_round(np.where(ok, r, 1.0)).astype(np.float64)  # refs' own, not smla's
    else:
        rr = np.asarray(rounded_ref, np.float64).reshape(-1, row_len)
    rn = np.where(ok, rr - r, 0.0)
    b0 = (rn * np.sign(r)).sum() / sum_abs
    row_abs = a.sum(axis=1)
    bound = (model.sigmas * math.sqrt(model.elem_var * (a * a).sum() +
                                      model.row_var * (row_abs * row_abs).sum()) / sum_abs
             + model.abs_slack)
    frob = math.sqrt((d * d).sum() / (a * a).sum())
    return b, min(0.0, b0) - bound, max(0.0, b0) + bound, frob, n


def check_unbiased(got, ref, what, model=OUT_MODEL_CPU, row_len=DC, rounded_ref=None):
    """The bias and relative-Frobenius checks of a bf16 result (values, any float dtype)
    whose only errors should be roundings to nearest; rows of `row_len` elements (the
    (t, h) rows of forward's out). NaN/inf positions are assert_close's business."""
    st = unbiased_stats(got, ref, row_len, model, rounded_ref)
    if st is None:
        return
    b, lo, hi, frob, n = st
    assert lo <= b <= hi, ("%s: biased: mean signed error %.3g of |ref| over %d elements, "
                           "outside [%.3g, %.3g]" % (what, b, n, lo, hi))
    assert frob <= model.frob, ("%s: relative Frobenius error %.3g over %d elements, bound %.3g"
                                % (what, frob, n, model.frob))


def bf16_truncate(x):
    """float -> bf16 values by truncation (the low 16 bits of the float32 dropped): the
    wrong rounding check_unbiased must reject."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    return (f.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


# lse and max_logit (float32) against the float64 reference: the C suite's TOL_LSE
# (tests/fwd.c): a logit is sm_scale times a float dot of <= 576 exact products, ~1e-5
# after the scale; log Z adds a few float ulps of |lse|. 1e-4 + 1e-5 |ref| is ~10x that.
TOL_LSE = (1e-4, 1e-5)


def assert_close(got, ref, atol, rtol, what):
    """|got - ref| <= atol + rtol |ref| everywhere, with NaN and inf in the same places;
    atol may be an array of ref's shape (an elementwise bound)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    assert (nan_g == nan_r).all(), "%s: NaN at %s vs %s" % (what, np.argwhere(nan_g != nan_r)[:5],
                                                            "reference")
    inf_r = np.isinf(ref)
    assert (got[inf_r] == ref[inf_r]).all(), "%s: inf mismatch" % what
    fin = ~(nan_r | inf_r)
    err = np.abs(got[fin] - ref[fin])
    if np.ndim(atol):
        atol = np.broadcast_to(np.asarray(atol, np.float64), ref.shape)[fin]
    tol = atol + rtol * np.abs(ref[fin])
    if not (err <= tol).all():
        bad = np.argwhere(~(err <= tol))[:5].ravel()
        raise AssertionError("%s: %d mismatches, first: got %s ref %s (worst err/tol %.3g)"
                             % (what, int((err > tol).sum()), got[fin][bad], ref[fin][bad],
                                float((err / tol).max())))


def check_out(got, ref, atol, rtol, what, model=OUT_MODEL_CPU, row_len=DC):
    """A bf16 result (values) against its float64 reference: the elementwise bound, then
    the bias and Frobenius checks (check_unbiased)."""
    assert_close(got, ref, atol, rtol, what)
    check_unbiased(got, ref, what, model, row_len)
