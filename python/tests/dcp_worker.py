"""One rank of the decode-context-parallel test (test_dcp.py), in its own process."""

import math
import os
import sys
import traceback

import numpy as np


def problem(seed, T, N, K, L):
    """The same request on every rank: q, the token rows, the indexer's positions."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (T, N, 576)).astype(np.float32)
    rows = rng.uniform(-1, 1, (L, 576)).astype(np.float32)
    pos = rng.integers(-L // 8, L, (T, K)).astype(np.int32)
    pos[pos < 0] = -1
    pos[-1] = -1  # a row no rank sees
    return q, rows, pos


def shard_cache(torch, rows, owned, bs, rng):
    """A paged cache holding the rows `owned` (in order) at local positions 0.., through a
    random block table over twice the blocks needed; NaN everywhere else."""
    n = len(owned)
    blocks = max(1, -(-n // bs))
    table = rng.permutation(2 * blocks)[:blocks].astype(np.int32)
    cache = np.full((2 * blocks * bs, 576), np.nan, np.float32)
    for q, t in enumerate(owned):
        cache[table[q // bs] * bs + q % bs] = rows[t]
    return (torch.from_numpy(cache).to(torch.bfloat16), torch.from_numpy(table)[None])


def main(rank, world, interleave, init_file, seed, use_sink=0):
    import torch
    import torch.distributed as dist
    import smla
    import smla.dcp
    import datetime
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    T, N, K, L, bs = 4, 16, 256, 1500, 16
    q, rows, pos = problem(seed, T, N, K, L)
    qt = torch.from_numpy(q).to(torch.bfloat16)
    post = torch.from_numpy(pos)
    req = torch.zeros(T, dtype=torch.int32)
    rng = np.random.default_rng(seed + 1 + rank)
    owned = [t for t in range(L) if (t // interleave) % world == rank]
    cache, table = shard_cache(torch, rows, owned, bs, rng)
    slots, valid = smla.convert_indices(req, table, post, block_size=bs, compact=True,
                                        return_valid=True, cp_size=world, cp_rank=rank,
                                        cp_interleave=interleave)
    # A sink on every rank's forward, given to the merge too: it must count once.
    sink = (torch.from_numpy(np.random.default_rng(seed + 99).uniform(0.0, 4.0, N)
                             .astype(np.float32)) if use_sink else None)
    bufs = smla.dcp.PartialBuffers(T, N)
    smla.forward(qt, None, cache, slots, lengths=valid, out=bufs.out, lse=bufs.lse, sink=sink)
    out, lse = bufs.gather_merge(return_lse=True, sink=sink)
    # The union on one "rank": every token, its own block table.
    ucache, utable = shard_cache(torch, rows, list(range(L)), bs, np.random.default_rng(seed))
    us, uv = smla.convert_indices(req, utable, post, block_size=bs, compact=True,
                                  return_valid=True)
    r_out, r_lse = smla.forward(qt, None, ucache, us, lengths=uv, return_lse=True, sink=sink)
    # bf16 partials, merged: the forward's bound plus one bf16 rounding of each partial
    # (values in [-1, 1]): |d| <= 4e-3 + 1e-2 |ref| (tests/cases_dcp.c).
    d = (out.float() - r_out.float()).abs()
    tol = 4e-3 + 1e-2 * r_out.float().abs()
    assert bool((d <= tol).all()), "rank %d: out off by up to %g" % (rank, float((d / tol).max()))
    fin = torch.isfinite(r_lse)
    assert torch.equal(fin, torch.isfinite(lse)), "rank %d: -inf rows differ" % rank
    assert bool(((lse[fin] - r_lse[fin]).abs() <= 2e-4 + 1e-5 * r_lse[fin].abs()).all()), rank
    assert bool(torch.isinf(lse[-1]).all()) and bool((out[-1] == 0).all()), rank
    assert int(valid[:-1].sum()) > 0, "rank %d saw nothing" % rank
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
             int(sys.argv[5]), int(sys.argv[6]) if len(sys.argv) > 6 else 0)
    except Exception:  # the parent prints this and fails the test
        traceback.print_exc()
        sys.exit(1)
