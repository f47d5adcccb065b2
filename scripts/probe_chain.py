#!/usr/bin/env python3
"""probe_chain.py: lines up the phase stamps of a probe build (src/cuda/probe.cuh).

    build-probe/smla bench -N 16 -T 1 --timing amortized 2> probe.txt
    python3 scripts/probe_chain.py probe.txt

Each `probe kind block blocks extra t0..t7` line is thread 0 of the first or last block
of one launch: kind 0 / 1 the generic forward (combine after it / merged in the kernel),
2 the merge4 combine, 3 merge3, 11 the sm90 forward (v11; 10 was v3 / v7's, before
a8812ff, kept here for older logs). Stamps (ns, %globaltimer):
- generic forward: t0 entry, t1 after the dependency wait, t7 the slots' loads and Q's
  copies issued (from session 14 on), t2 tile 0's gathers issued (thread 0's slot arrived;
  BF16 only, else 0), t3 tile 0 landed, t4 tile loop done, t5 row sums exchanged, t6
  epilogue's stores issued;
- combine: t0 entry, t1 after the dependency wait, t6 done;
- sm90 forward, kind 13 (session 24, SMLA_PROBE_G=1): t0 entry, t7 end; over compute thread
  0's own tiles, t1 the sum of (full wait done - the gather warp's refill start), t2 of (wait
  start - refill start, where >= 0), t3 the count, t4 the full waits, t5 of (refill start -
  wait start, where > 0).
- sm90 forward, kind 12 (session 23 on): t0 entry, t1..t6 compute thread 0's phases summed
  over its tiles (own tiles: the wait for the other warpgroup's cross PV before S; the full
  wait; S; the logits, max, exponentials and P published; the other's tiles: the wait for
  the own PV before and on pready; both: the rescale and PV issued), t7 done;
- sm90 forward, kind 11: t0 entry, t1..t6 compute thread 0's phases summed over its tiles
  (the wait for the PV before, and on the other warpgroup's tiles the pready wait; the
  full wait of its own tiles (before session 14: full or pready); S; the logits, max and
  exponentials; P and m stored and published; the rescale and PV issued), t7 done;
- sm90 forward, kind 10 (v3 / v7): t0 entry, t1 tile 0 landed, t2 tile loop done, t3..t6
  per-tile phases (softmax to the row-max rendezvous, to the P rendezvous, PV issued and
  waited for, the rest), t7 done.
Prints the median of every phase and of the gaps along the step's chain: forward end ->
combine start -> combine end -> next forward.
"""
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ev = []
    for line in open(sys.argv[1]):
        f = line.split()
        if len(f) != 13 or f[0] != "probe":
            continue
        kind, block, blocks, extra = map(int, f[1:5])
        t = list(map(int, f[5:]))
        ev.append((kind, block, blocks, extra, t))
    if not ev:
        sys.exit("no probe lines")
    # Launches: events of one kind whose entries lie within 20 us of each other, in order
    # of entry, at most two events (first and last block) a launch.
    ev.sort(key=lambda e: e[4][0])
    launches = []
    for e in ev:
        last = launches[-1] if launches else None
        if (last and last["kind"] == e[0] and len(last["ev"]) < 2 and
                e[4][0] - last["ev"][0][4][0] < 20000 and
                all(x[1] != e[1] for x in last["ev"])):
            last["ev"].append(e)
        else:
            launches.append({"kind": e[0], "ev": [e]})
    for L in launches:
        L["start"] = min(x[4][0] for x in L["ev"])
        L["end"] = max(x[4][7 if L["kind"] in (10, 11, 12, 13) else 6] for x in L["ev"])
    names = {0: "forward", 1: "forward+merge", 2: "merge4", 3: "merge3", 10: "sm90 forward",
             11: "sm90 v11 forward", 12: "sm90 v11 forward", 13: "sm90 v11 forward, gathers"}
    print(f"{len(ev)} events, {len(launches)} launches")
    for k in sorted({L["kind"] for L in launches}):
        ls = [L for L in launches if L["kind"] == k]
        es = [x for L in ls for x in L["ev"]]
        span = [L["end"] - L["start"] for L in ls]
        print(f"{names.get(k, k)}: {len(ls)} launches, span (first entry to last end) "
              f"median {med(span) / 1e3:.2f} us")
        if k in (11, 12):  # v11: t1..t6 are phase sums over the tiles
            tiles = med([x[3] for x in es])
            print(f"  tiles a block (median) {tiles}")
            print(f"  entry -> end               {med([x[4][7] - x[4][0] for x in es]) / 1e3:6.2f} us")
            whats = (("PV before; cross: + pready", "full wait (own tiles)",
                      "S issued, waited (own)", "logits, max, exp (own)",
                      "P, m stored, published (own)", "rescale, PV issued") if k == 11 else
                     ("own: the cross PV before", "full wait (own tiles)",
                      "S issued, waited (own)", "softmax, P published (own)",
                      "cross: own PV before, pready", "rescale, PV issued"))
            for i, what in enumerate(whats):
                per = med([x[4][1 + i] / max(x[3], 1) for x in es])
                print(f"  per tile: {what:30s} {per / 1e3:6.3f} us")
        elif k == 13:  # t1..t5: sums over the own tiles of the gather-stamp differences
            for i, what in ((1, "refill start -> full wait done"),
                            (2, "refill start -> S wants them"), (4, "full wait"),
                            (5, "S wanted them before refill")):
                per = med([x[4][i] / max(x[4][3], 1) for x in es])
                print(f"  per own tile: {what:32s} {per / 1e3:6.3f} us")
        elif k == 10:
            tiles = med([x[3] for x in es])
            print(f"  tiles a block (median) {tiles}")
            for a, b, what in ((0, 1, "entry -> tile 0 landed"), (1, 2, "-> tile loop done"),
                               (2, 7, "-> epilogue done")):
                print(f"  {what:26s} {med([x[4][b] - x[4][a] for x in es]) / 1e3:6.2f} us")
            for i, what in enumerate(("softmax -> row-max rendezvous", "-> P rendezvous",
                                      "PV issued, waited", "rest (full wait, S)")):
                per = med([x[4][3 + i] / max(x[3], 1) for x in es])
                print(f"  per tile: {what:30s} {per / 1e3:6.3f} us")
        elif k in (0, 1):
            issued = all(x[4][2] for x in es)  # t2 is stamped for BF16 only
            split7 = issued and all(x[4][7] for x in es)  # t7: from session 14 on
            steps = ((0, 1, "entry -> dependency met"),) + (
                ((1, 7, "-> slots, Q issued"), (7, 2, "-> tile 0 issued")) if split7 else
                ((1, 2, "-> tile 0 issued"),) if issued else ()) + (
                ((2, 3, "-> tile 0 landed"),) if issued else
                ((1, 3, "-> tile 0 landed"),)) + (
                (3, 4, "-> tile loop done"), (4, 5, "-> row sums exchanged"),
                (5, 6, "-> epilogue done"))
            for a, b, what in steps:
                print(f"  {what:26s} {med([x[4][b] - x[4][a] for x in es]) / 1e3:6.2f} us")
        else:
            print(f"  entry -> dependency met    {med([x[4][1] - x[4][0] for x in es if x[4][1]]) / 1e3:6.2f} us")
            print(f"  -> done                    {med([x[4][6] - max(x[4][0], x[4][1]) for x in es]) / 1e3:6.2f} us")
    # The chain: consecutive launches.
    gaps = {}
    for a, b in zip(launches, launches[1:]):
        key = f"{names.get(a['kind'])} end -> {names.get(b['kind'])} entry"
        gaps.setdefault(key, []).append(b["start"] - a["end"])
    for key, xs in gaps.items():
        print(f"{key:40s} median {med(xs) / 1e3:6.2f} us ({len(xs)})")
    fw = [L["start"] for L in launches if L["kind"] in (0, 1, 10, 11)]
    per = [b - a for a, b in zip(fw, fw[1:]) if b - a < 200000]
    print(f"forward entry to next forward entry: median {med(per) / 1e3:.2f} us ({len(per)})")


if __name__ == "__main__":
    main()
