#!/usr/bin/env python3
"""Fits the forward's cost model (src/cuda/backend.c, split_cost) to `smla bench --paths
--json` runs, and scores it the way issue 22 asks: for every measured shape, the measured time
of the path the plan would choose against the fastest measured path.

    python3 scripts/fit_cost_model.py paths.json [more.json ...] [--peak-gbs 3352] [--fit]
        [--test held-out.json ...] [--per-t=all]

Runs may be gzipped (.json.gz); bench/paths/ keeps the runs measured since session 26 (the
earlier fits' runs were not kept), each named by date, session, call, card and build.

Each row of a --paths run is one path: kernel (sm90 64-head, sm90 small-head, generic), heads
a block, split count, merge (in the kernel or the combine kernel), and its median time. The
model here is the C model line for line (DEFAULT: its constants, by name), and so is the
choice: the few-rows chain (few_rows_chain: the model's cheapest of the plan's own kernel
and the narrower head groups of both kernels at each T <= 32, in at most 3 runs), then the
kernel's splits of equal whole tiles. Each run's shapes are scored apart. --fit moves every
constant by multiplicative steps (coordinate descent, from DEFAULT) to the least regret of
that choice plus half the rms log error of every path's time; the rates are fractions of
the device's peak memory bandwidth, which the plan reads from the device. Prints the
constants to paste into backend.c, a line per shape where the choice is more than 5% slower
than the fastest path, and the chain each N gets for up to 64 rows.
"""
import argparse
import gzip
import json
import math
import re
import sys

BN = 64
DC = 512

# The model's constants (backend.c), the names the C code uses: the C model's values (the
# fit starts from them).
DEFAULT = {
    "SM90_TILE_US": 1.67,             # 64-head wgmma tile alone (SM90_TILE_COMPUTE_US)
    "SM90S_TILE_US_8": 1.00,          # small-head tiles by heads a block (SM90S_TILE_US[])
    "SM90S_TILE_US_16": 1.26,
    "SM90S_TILE_US_32": 1.23,
    "GEN_TILE_US_1": 2.24,            # generic kernel, by m16 tiles a block (TILE_COMPUTE_US[])
    "GEN_TILE_US_2": 2.85,
    "GEN_TILE_US_4": 4.92,
    "TILE_LATENCY_US": 1.03,          # the least a tile costs: one gather round trip
    "GATHER_FRAC": 1.47,              # gathered bytes per us, as a fraction of peak bandwidth
    "BLOCK_FIXED_US": 7.61,           # a wave's fixed cost: the generic kernel's,
    "SM90_BLOCK_FIXED_US": 9.92,      # the 64-head kernel's,
    "SM90S_BLOCK_FIXED_US_8": 3.59,   # the small-head kernel's by heads a block
    "SM90S_BLOCK_FIXED_US_16": 4.64,
    "SM90S_BLOCK_FIXED_US_32": 6.53,
    "GROUP_ROW_SHARE": 0.56,          # the share of its rows that a head group past the first
                                      # of a (row, split) reads at the gather rate
    "COMBINE_FIXED_US": 0.0,
    "COMBINE_FRAC": 1.10,             # partial bytes (written + read) per us / peak
    "CLUSTER_MERGE_US": 3.33,         # the 64-head kernel's in-kernel merge: a fixed cost
    "CLUSTER_MERGE_SPLIT_US": 0.20,   # and a cost a split of the cluster
    "DSMEM_MERGE_US": 0.0,
    "LAST_ARRIVER_US": 0.84,
    "SM90S_MERGE_US": 1.0,            # the small-head kernel's in-kernel merge (one cluster a
                                      # row; SMLA_FWD90S_MERGE builds)
    "FORWARD_FIXED_US": 0.0,          # every path of a shape alike (launch, the graph's
                                      # share): fits the times, never changes a choice; not
                                      # in the C model
}

FEW_ROWS_MAX = 32    # backend.c: the rows the plan may hand narrower head groups or the
FEW_ROWS_LINKS = 3   # generic kernel, and at most this many such plans (runs of T)


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
        return c["SM90S_TILE_US_%d" % hb]
    return c["GEN_TILE_US_%d" % (hb // 16)]


def block_fixed(c, kern, hb):
    if kern == "sm90":
        return c["SM90_BLOCK_FIXED_US"]
    if kern == "sm90s":
        return c["SM90S_BLOCK_FIXED_US_%d" % hb]
    return c["BLOCK_FIXED_US"]


def model_us(c, kern, hb, N, T, K, row_bytes, s, merged, sms, peak, clusters=None):
    """The C model's split_cost, for a path of s splits (merged: in the kernel)."""
    ntiles = -(-K // BN)
    tps = -(-ntiles // s)
    groups = -(-N // hb)
    resident = sms
    if merged and clusters:
        # (the small-head kernel's R > 1 paths, measured before its plans stopped taking
        # them, are priced as the generic kernel's)
        C = s if kern == "sm90" or (kern == "sm90s" and s <= 8) else \
            max(cc for cc in range(2, 9) if s % cc == 0)
        if 0 < clusters.get(C, 0) * C < resident:
            resident = clusters[C] * C
    blocks = T * groups * s
    active = min(blocks, resident)
    waves = -(-blocks // resident)
    tile = max(tile_alone(c, kern, hb), c["TILE_LATENCY_US"])
    share = (1.0 + (groups - 1) * c["GROUP_ROW_SHARE"]) / groups
    mem = BN * row_bytes * active * share / (c["GATHER_FRAC"] * peak)
    tile = max(tile, mem)
    cost = c["FORWARD_FIXED_US"] + waves * (tps * tile + block_fixed(c, kern, hb))
    if merged:
        if kern == "sm90":
            cost += c["CLUSTER_MERGE_US"] + c["CLUSTER_MERGE_SPLIT_US"] * s
        elif kern == "sm90s" and s <= 8:
            cost += c["SM90S_MERGE_US"]
        else:
            C = max(cc for cc in range(2, 9) if s % cc == 0)
            cost += c["DSMEM_MERGE_US"] + (c["LAST_ARRIVER_US"] if s > C else 0.0)
    elif s > 1:
        cost += c["COMBINE_FIXED_US"] + T * N * s * DC * 4.0 * 2.0 / (c["COMBINE_FRAC"] * peak)
    return cost


def load(files):
    shapes = {}  # (N, T, run): each run's shapes apart (runs on other cards differ by %)
    for run, fn in enumerate(files):
        with (gzip.open(fn, "rt") if fn.endswith(".gz") else open(fn)) as f:
            d = json.load(f)
        m = d["meta"]
        sms = int(re.search(r"(\d+) SMs", m["device_name"]).group(1))
        for r in d["rows"]:
            # a plan whose forward of T rows ran on its few-rows plan ("; T <= R: kernel, hb
            # heads/block"): the description names the main kernel and its splits, not the
            # path that ran; that path is measured on its own (forced), so the row is skipped
            if any(r["T"] <= int(x) for x in re.findall(r"; T <= (\d+):", r["path"])):
                continue
            kern, hb, s, merged = parse_path(r["path"])
            key = (r["N"], r["T"], run)
            sh = shapes.setdefault(key, {"K": m["topk"], "row_bytes": m["row_bytes"],
                                         "sms": sms, "paths": {}})
            pm = re.search(r"SMs, ([\d.]+) TB/s\)", r["path"])
            if pm and "peak" not in sh:  # the peak the plan read from the device (2 digits)
                sh["peak"] = float(pm.group(1)) * 1e6
            cm = re.search(r"resident clusters of (\d+)\.\.\d+: ([\d ]+)", r["path"])
            if cm:  # the capacities the plan found, by kernel and heads a block
                lo = int(cm.group(1))
                sh.setdefault("clusters", {})[(kern, hb)] = {
                    i + lo: int(x) for i, x in enumerate(cm.group(2).split())}
            pk = (kern, hb, s, merged)
            # the same path twice (the plan's own choice and its forced twin): the faster
            if pk not in sh["paths"] or r["median_us"] < sh["paths"][pk]:
                sh["paths"][pk] = r["median_us"]
    return shapes


def natural_hb(N):
    return 64 if N > 32 else 32 if N > 16 else 16 if N > 8 else 8


def plan_configs(N):
    """The plan's main (kernel, heads a block), then the few-rows candidates it weighs
    (backend.c, few_rows_chain), in the C code's order: the small-head kernel in groups of
    8, 16, 32 narrower than N's own, the generic kernel in groups of 16, 32, 64 (each at
    most 8 groups; the generic kernel's own group is the widest that N needs)."""
    nat = natural_hb(N)
    main = ("sm90" if N > 32 else "sm90s", nat)
    cands = [("sm90s", hb) for hb in (8, 16, 32) if hb < nat and -(-N // hb) <= 8]
    cands += [("gen", hb) for hb in (16, 32, 64) if hb <= max(nat, 16) and -(-N // hb) <= 8]
    return main, cands


def model_best(c, kern, hb, N, T, sh, peak):
    """auto_splits: the model's least cost over the splits of equal whole tiles (where the
    tile count allows) and, where clusters can be resident, the in-kernel merge."""
    peak = sh.get("peak", peak)
    nt = -(-sh["K"] // BN)
    groups = -(-N // hb)
    if T * groups >= 4 * sh["sms"]:
        splits = [1]
    else:
        composite = any(nt % d == 0 for d in range(2, int(math.isqrt(nt)) + 1))
        splits = [s for s in range(1, min(nt, 64) + 1)
                  if -(-nt // -(-nt // s)) == s and (not composite or nt % s == 0)]
    cl = sh.get("clusters", {}).get((kern, hb)) or {}
    best = None
    for s in splits:
        ms = [False]
        if kern in ("sm90", "sm90s") and 2 <= s <= 8 and cl.get(s, 0) > 0:
            ms.append(True)
        if kern == "gen" and any(s % C == 0 and s // C <= 16 and cl.get(C, 0) > 0
                                 for C in range(2, 9)):
            ms.append(True)
        for m in ms:
            v = model_us(c, kern, hb, N, T, sh["K"], sh["row_bytes"], s, m, sh["sms"], peak,
                         cl or None)
            if best is None or v < best * 0.999:
                best = v
    return best


def chain_picks(c, N, sh, peak):
    """backend.c few_rows_chain: the model's choice at each T <= FEW_ROWS_MAX among the
    plan's own kernel and the candidates (ties to the plan's own, then to the earlier)."""
    main, cands = plan_configs(N)
    picks = []
    for t in range(1, FEW_ROWS_MAX + 1):
        best, pick = model_best(c, main[0], main[1], N, t, sh, peak), main
        for k in cands:
            v = model_best(c, k[0], k[1], N, t, sh, peak)
            if v < best * 0.999:
                best, pick = v, k
        picks.append(pick)
    return picks


def chain_runs(N, picks, R):
    """[(kernel, hb), last row] for a plan of max_tokens R: the runs of T <= min(R,
    FEW_ROWS_MAX), the first FEW_ROWS_LINKS up to the last that the plan does not win, less
    the plan's own at the top."""
    main = plan_configs(N)[0]
    picks = picks[:R]
    last = max((i for i, k in enumerate(picks) if k != main), default=-1)
    runs = []
    for i in range(last + 1):
        if runs and runs[-1][0] == picks[i]:
            runs[-1][1] = i + 1
        elif len(runs) < FEW_ROWS_LINKS:
            runs.append([picks[i], i + 1])
        else:
            break
    while runs and runs[-1][0] == main:
        runs.pop()
    return runs


def plan_config(N, T, picks):
    """The (kernel, heads a block) that a plan made for max_tokens = T (smla bench's) runs
    T rows on."""
    for k, end in chain_runs(N, picks, T):
        if T <= end:
            return k
    return plan_configs(N)[0]


def score(c, shapes, peak, kernels=None, per_t=""):
    """Total regret (chosen / fastest - 1 over shapes), misses > 5%, log error. The choice
    is the C plan's (plan_config, then the config's split by the model); per_t="all": the
    model's cheapest measured path of any kernel and head group."""
    regret, misses, err, n = 0.0, [], 0.0, 0
    picks = {}  # (N, run): the chain's choice per T, the same for every T of a run
    for (N, T, run), sh in sorted(shapes.items()):
        paths = {k: v for k, v in sh["paths"].items() if not kernels or k[0] in kernels}
        if not paths:
            continue
        cl = sh.get("clusters", {})
        pk = sh.get("peak", peak)
        pred = {k: model_us(c, k[0], k[1], N, T, sh["K"], sh["row_bytes"], k[2], k[3],
                            sh["sms"], pk, cl.get((k[0], k[1]))) for k in paths}
        for k in paths:
            err += math.log(pred[k] / paths[k]) ** 2
            n += 1
        nt = -(-sh["K"] // BN)
        composite = any(nt % d == 0 for d in range(2, int(math.isqrt(nt)) + 1))
        cand = [k for k in pred if not composite or nt % k[2] == 0]
        if per_t != "all":
            if (N, run) not in picks:
                picks[(N, run)] = chain_picks(c, N, sh, peak)
            cfg = plan_config(N, T, picks[(N, run)])
            cand = [k for k in cand if (k[0], k[1]) == cfg]
        if not cand:  # the plan's choice was not measured here
            continue
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
                    help="the device's peak memory bandwidth, GB/s, for runs whose plans do not "
                    "print it (H100 SXM 3352, H200 4800)")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--kernels", default="", help="only these kernels (sm90,sm90s,gen)")
    ap.add_argument("--per-t", nargs="?", const="all", default="",
                    help="--per-t=all: score the model's cheapest measured path of every "
                    "kernel and head group (default: the C plan's choice, few-rows chain "
                    "included)")
    ap.add_argument("--only", default="",
                    help="with --fit: fit only these constants (comma-separated), the rest kept")
    ap.add_argument("--test", nargs="*", default=[],
                    help="runs held out of the fit: scored with the fitted constants")
    a = ap.parse_args()
    peak = a.peak_gbs * 1e3  # bytes per microsecond
    shapes = load(a.files)
    kernels = set(a.kernels.split(",")) if a.kernels else None
    c = dict(DEFAULT)
    if a.fit:
        # Coordinate descent on each constant (multiplicative steps, halved when no constant
        # moves) to the least regret of the choice being scored (the plan's, or with
        # --per-t=all the model's cheapest measured path) plus half the rms log error of
        # every path's time (which keeps the constants physical where the choice does not
        # pin them). Several minutes for four runs.
        def objective(cc):
            r, _, e = score(cc, shapes, peak, kernels, a.per_t)
            return r + 0.5 * e
        names = [n for n in c if n != "FORWARD_FIXED_US"]
        if a.only:
            unknown = [n for n in a.only.split(",") if n not in c]
            if unknown:
                sys.exit("fit_cost_model: unknown constant(s) %s" % ", ".join(unknown))
            names = a.only.split(",")
        c["FORWARD_FIXED_US"] = 5.0
        step = 0.4
        cur = objective(c)
        while step > 0.01:
            moved = False
            for name in names:
                for f in (1.0 + step, 1.0 / (1.0 + step)):
                    c2 = dict(c)
                    c2[name] = c[name] * f
                    e = objective(c2)
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
    for N in sorted({k[0] for k in shapes}):
        sh = next(v for k, v in sorted(shapes.items()) if k[0] == N)
        runs = chain_runs(N, chain_picks(c, N, sh, peak), 64)
        print("N=%d, max_tokens 64: %s" % (N, "; ".join(
            "T <= %d: %s, %d heads/block" % (end, "cuda-generic" if k[0] == "gen"
                                              else "cuda-sm90", k[1])
            for k, end in reversed(runs)) or "no few-rows chain"))
    if a.test:
        held = load(a.test)
        reg, misses, err = score(c, held, peak, kernels, a.per_t)
        print("held out: shapes %d; total regret %.3f; rms log error %.3f; misses > 5%%: %d"
              % (len(held), reg, err, len(misses)))
        for N, T, r, pick, t_pick, fastest, best in misses:
            print("  N=%d T=%d: model picks %s (%.2f us), fastest %s (%.2f us), %.3fx"
                  % (N, T, pick, t_pick, fastest, best, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
