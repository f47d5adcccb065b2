#!/usr/bin/env python3
"""Fits the forward's split cost model (src/cuda/backend.c, split_cost) to `smla bench --paths
--json` runs, and scores it the way issue 22 asks: for every measured shape, the measured time
of the path the model would choose against the fastest measured path.

    python3 scripts/fit_cost_model.py paths.json [more.json ...] [--peak-gbs 3352] [--fit]

Each row of a --paths run is one path: kernel (sm90 64-head, sm90 small-head, generic), heads
a block, split count, merge (in the kernel or the combine kernel), and its median time. The
model here is the C model line for line (DEFAULT: its constants, by name; the plan's kernel
per N and T, and its splits of equal whole tiles). --fit moves every constant by
multiplicative steps (coordinate descent) to the least rms log error over every measured
path, then scores the choice; the rates are fractions of the device's peak memory bandwidth,
which the plan reads from the device. Prints the constants to paste into backend.c, and a
line per shape where the model's choice is more than 5% slower than the fastest path.
"""
import argparse
import json
import math
import re
import sys

BN = 64
DC = 512

# The model's constants (backend.c), the names the C code uses.
DEFAULT = {
    "SM90_TILE_US": 2.0,         # 64-head wgmma tile, alone on its SM (SM90_TILE_COMPUTE_US)
    "SM90_SMALL_TILE_US": 1.0,   # small-head tile, alone
    "GEN_TILE_US_1": 1.0,        # generic kernel, by m16 tiles a block (TILE_COMPUTE_US[])
    "GEN_TILE_US_2": 3.1,
    "GEN_TILE_US_4": 5.1,
    "TILE_LATENCY_US": 1.75,     # the least a tile costs: one gather round trip
    "GATHER_FRAC": 1.05,         # gathered bytes per us, as a fraction of peak bandwidth
    "BLOCK_FIXED_US": 7.9,       # a wave's fixed cost (the generic kernel's, and every
                                 # kernel's in the C model)
    # Candidate terms, not in the C model (at these values the replay is the C model's):
    # per-kernel wave costs, and the share of their rows that head groups past the first of
    # a (row, split) read from HBM (0: all from L2). --fit --per-t=all moves them.
    "SM90_BLOCK_FIXED_US": 7.9,
    "SM90S_BLOCK_FIXED_US": 7.9,
    "GROUP_ROW_SHARE": 1.0,
    "COMBINE_FIXED_US": 0.0,
    "COMBINE_FRAC": 1.27,        # partial bytes (written + read) per us / peak
    "CLUSTER_MERGE_US": 8.0,
    "DSMEM_MERGE_US": 3.0,
    "LAST_ARRIVER_US": 2.1,
    "FORWARD_FIXED_US": 0.0,     # every path of a shape alike (launch, the graph's share):
                                 # fits the times, never changes a choice; not in the C model
}


def parse_path(p):
    """(kernel, heads a block, splits, merged) from a plan description."""
    kern = "sm90s" if "small-head" in p else "sm90" if "cuda-sm90" in p else "gen"
    hb = int(re.search(r"(\d+) heads/block", p).group(1))
    ms = re.findall(r"T=\d+: (\d+)( merged)?", p)
    s, merged = ms[-1]
    return kern, hb, int(s), bool(merged)


def tile_alone(c, kern, hb):
    if kern == "sm90":
        return c["SM90_TILE_US"]
    if kern == "sm90s":
        return c["SM90_SMALL_TILE_US"]
    return c["GEN_TILE_US_%d" % (hb // 16)]


def model_us(c, kern, hb, N, T, K, row_bytes, s, merged, sms, peak, clusters=None):
    """The C model's split_cost, for a path of s splits (merged: in the kernel)."""
    ntiles = -(-K // BN)
    tps = -(-ntiles // s)
    groups = -(-N // hb)
    resident = sms
    if merged and clusters and kern != "sm90s":
        C = s if kern == "sm90" else max(cc for cc in range(2, 9) if s % cc == 0)
        if clusters.get(C, 0) * C < resident:
            resident = clusters[C] * C
    blocks = T * groups * s
    active = min(blocks, resident)
    waves = -(-blocks // resident)
    tile = max(tile_alone(c, kern, hb), c["TILE_LATENCY_US"])
    share = (1.0 + (groups - 1) * c["GROUP_ROW_SHARE"]) / groups
    mem = BN * row_bytes * active * share / (c["GATHER_FRAC"] * peak)
    tile = max(tile, mem)
    fixed = c[{"sm90": "SM90_BLOCK_FIXED_US", "sm90s": "SM90S_BLOCK_FIXED_US"}.get(
        kern, "BLOCK_FIXED_US")]
    cost = c["FORWARD_FIXED_US"] + waves * (tps * tile + fixed)
    if merged:
        if kern == "sm90":
            cost += c["CLUSTER_MERGE_US"]
        else:
            C = max(cc for cc in range(2, 9) if s % cc == 0)
            cost += c["DSMEM_MERGE_US"] + (c["LAST_ARRIVER_US"] if s > C else 0.0)
    elif s > 1:
        cost += c["COMBINE_FIXED_US"] + T * N * s * DC * 4.0 * 2.0 / (c["COMBINE_FRAC"] * peak)
    return cost


def load(files):
    shapes = {}
    for fn in files:
        d = json.load(open(fn))
        m = d["meta"]
        sms = int(re.search(r"(\d+) SMs", m["device_name"]).group(1))
        for r in d["rows"]:
            # a plan whose forward of T rows ran on its few-rows plan ("; T <= R: kernel, hb
            # heads/block"): the description names the main kernel and its splits, not the
            # path that ran; that path is measured on its own (forced), so the row is skipped
            if any(r["T"] <= int(x) for x in re.findall(r"; T <= (\d+):", r["path"])):
                continue
            kern, hb, s, merged = parse_path(r["path"])
            key = (r["N"], r["T"])
            sh = shapes.setdefault(key, {"K": m["topk"], "row_bytes": m["row_bytes"],
                                         "sms": sms, "paths": {}})
            cm = re.search(r"resident clusters of 2\.\.8: ([\d ]+)", r["path"])
            if cm:  # the capacities the plan found, by kernel
                sh.setdefault("clusters", {})[kern] = {
                    i + 2: int(x) for i, x in enumerate(cm.group(1).split())}
            pk = (kern, hb, s, merged)
            # the same path twice (the plan's own choice and its forced twin): the faster
            if pk not in sh["paths"] or r["median_us"] < sh["paths"][pk]:
                sh["paths"][pk] = r["median_us"]
    return shapes


def plan_kernels(N, T, per_t):
    """The (kernel, heads a block) pairs the plan chooses from for N heads at T rows (the
    default build; backend.c, few_rows_of): the kernel's own head group, but at the fewest
    rows the second plan's. per_t: both kernels for N <= 32 at their own group, by the
    model; "all": every measured kernel and head group, by the model (None)."""
    if per_t == "all":
        return None
    natural = 64 if N > 32 else 32 if N > 16 else 16 if N > 8 else 8
    own = {("sm90" if N > 32 else "sm90s", natural)}
    if per_t and N <= 32:
        return own | {("gen", max(natural, 16))}
    if 8 < N <= 16 and T <= 16:
        return {("sm90s", 8)}
    if 16 < N <= 32 and T <= 4:
        return {("gen", 32)}
    if 32 < N and T <= (8 if N <= 64 else 4):
        return {("sm90s", 16)}
    return own


def score(c, shapes, peak, kernels=None, per_t=False):
    """Total regret (chosen / fastest - 1 over shapes), misses > 5%, log error."""
    regret, misses, err, n = 0.0, [], 0.0, 0
    for (N, T), sh in sorted(shapes.items()):
        paths = {k: v for k, v in sh["paths"].items() if not kernels or k[0] in kernels}
        if not paths:
            continue
        cl = sh.get("clusters", {})
        pred = {k: model_us(c, k[0], k[1], N, T, sh["K"], sh["row_bytes"], k[2], k[3],
                            sh["sms"], peak, cl.get(k[0])) for k in paths}
        for k in paths:
            err += math.log(pred[k] / paths[k]) ** 2
            n += 1
        allowed = plan_kernels(N, T, per_t)
        nt = -(-sh["K"] // BN)
        composite = any(nt % d == 0 for d in range(2, int(math.isqrt(nt)) + 1))
        cand = [k for k in pred if (allowed is None or (k[0], k[1]) in allowed)
                and (not composite or nt % k[2] == 0)]
        cand = cand or list(pred)  # (auto_splits: equal whole tiles where the count allows)
        pick = min(cand, key=lambda k: (pred[k], k[2], k[3]))
        best = min(paths.values())
        r = paths[pick] / best
        regret += r - 1.0
        if r > 1.05:
            fastest = min(paths, key=paths.get)
            misses.append((N, T, r, pick, paths[pick], fastest, best))
    return regret, misses, math.sqrt(err / max(n, 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--peak-gbs", type=float, default=3352.0,
                    help="the device's peak memory bandwidth, GB/s (H100 SXM 3352, H200 4800)")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--kernels", default="", help="only these kernels (sm90,sm90s,gen)")
    ap.add_argument("--per-t", nargs="?", const="kernel", default="",
                    help="N <= 32: the model also chooses the kernel (small-head or generic) "
                    "per T; --per-t=all: every measured kernel and head group, per T")
    a = ap.parse_args()
    peak = a.peak_gbs * 1e3  # bytes per microsecond
    shapes = load(a.files)
    kernels = set(a.kernels.split(",")) if a.kernels else None
    c = dict(DEFAULT)
    if a.fit:
        # Least rms log error of every measured path, by coordinate descent on each constant
        # (multiplicative steps, halved when no constant moves); then the regret is scored.
        names = list(c)
        c["FORWARD_FIXED_US"] = 5.0
        step = 0.4
        cur = score(c, shapes, peak, kernels, a.per_t)[2]
        while step > 0.01:
            moved = False
            for name in names:
                for f in (1.0 + step, 1.0 / (1.0 + step)):
                    c2 = dict(c)
                    c2[name] = c[name] * f
                    e = score(c2, shapes, peak, kernels, a.per_t)[2]
                    if e < cur - 1e-9:
                        c, cur, moved = c2, e, True
            if not moved:
                step /= 2
    reg, misses, err = score(c, shapes, peak, kernels, a.per_t)
    print("constants:", ", ".join("%s=%g" % kv for kv in c.items()))
    print("shapes: %d; total regret %.3f; rms log error %.3f; misses > 5%%: %d"
          % (len(shapes), reg, err, len(misses)))
    for N, T, r, pick, t_pick, fastest, best in misses:
        print("  N=%d T=%d: model picks %s (%.2f us), fastest %s (%.2f us), %.3fx"
              % (N, T, pick, t_pick, fastest, best, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
