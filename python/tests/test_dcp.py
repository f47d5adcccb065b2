"""Decode context parallelism through torch.distributed on the CPU (gloo): W real
processes, each with its own shard (own cache, own block table), convert_indices' cp
filter, forward into smla.dcp.PartialBuffers, all-gather and merge; every rank's result
must equal forward over the whole cache within bf16 rounding of the partials. The NCCL
path (CUDA) is examples/dcp_nccl.c's; this is the same flow over processes."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

torch = pytest.importorskip("torch", reason="the DCP test needs torch.distributed")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))


# With sink: every rank's forward and the merge take the same sink, and the merged result
# must equal the sinked forward over the union (the sink counted once, not once per rank).
@pytest.mark.parametrize("world,interleave,sink", [(2, 1, 0), (3, 16, 0), (2, 1, 1), (5, 16, 1),
                                                   (8, 1, 1)])
def test_dcp_over_gloo(tmp_path, world, interleave, sink):
    init = str(tmp_path / "rendezvous")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, ".."), HERE,
                                         env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dcp_worker.py"), str(r),
                               str(world), str(interleave), init, "11", str(sink)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            logs.append((p.returncode, out.decode(errors="replace")))
    finally:
        for p in procs:  # a hung rank must not outlive the test
            if p.poll() is None:
                p.kill()
    bad = [(r, log) for r, (rc, log) in enumerate(logs) if rc != 0]
    assert not bad, "\n".join("rank %d:\n%s" % (r, log[-3000:]) for r, log in bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a GPU (NCCL)")
def test_dcp_nccl_one_rank_in_a_cuda_graph(tmp_path):
    """The CUDA path of PartialBuffers (all_gather_into_tensor over NCCL, in place) with one
    rank, the step captured in a CUDA graph and replayed with new positions."""
    import torch.distributed as dist
    import smla
    import smla.dcp
    from dcp_worker import problem, shard_cache
    import numpy as np
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method="file://" + str(tmp_path / "rdv"), rank=0,
                            world_size=1)
    try:
        T, N, K, L, bs = 4, 16, 256, 1500, 16
        q, rows, pos = problem(5, T, N, K, L)
        qt = torch.from_numpy(q).to(torch.bfloat16).cuda()
        post = torch.from_numpy(pos).cuda()
        req = torch.zeros(T, dtype=torch.int32, device="cuda")
        cache, table = shard_cache(torch, rows, list(range(L)), bs, np.random.default_rng(1))
        cache, table = cache.cuda(), table.cuda()
        bufs = smla.dcp.PartialBuffers(T, N, device="cuda")
        smla.prepare_plans("cuda", num_heads=N, topk=K, max_tokens=T)

        def step():
            slots, valid = smla.convert_indices(req, table, post, block_size=bs, compact=True,
                                                return_valid=True, cp_size=1)
            smla.forward(qt, None, cache, slots, lengths=valid, out=bufs.out, lse=bufs.lse)
            return bufs.gather_merge(return_lse=True)

        step()  # eager first: NCCL connects outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, lse = step()
        for it in range(2):
            post.copy_(torch.from_numpy(problem(20 + it, T, N, K, L)[2]).cuda())
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            slots, valid = smla.convert_indices(req, table, post, block_size=bs, compact=True,
                                                return_valid=True)
            r_out, r_lse = smla.forward(qt, None, cache, slots, lengths=valid, return_lse=True)
            # one rank: the merge of one bf16 partial is that partial (weight exp(0) = 1)
            d = (out.float() - r_out.float()).abs()
            assert bool((d <= 4e-3 + 1e-2 * r_out.float().abs()).all()), it
            fin = torch.isfinite(r_lse)
            assert torch.equal(fin, torch.isfinite(lse))
            assert bool(((lse[fin] - r_lse[fin]).abs() <= 2e-4).all())
    finally:
        dist.destroy_process_group()
