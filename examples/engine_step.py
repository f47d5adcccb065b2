#!/usr/bin/env python3
"""engine_step.py: one decode step of an inference engine's sparse MLA layer, with smla
from Python, captured once in a CUDA graph and replayed with new data every step.

What an engine does per step, and where each piece runs:
  host    smla.build_metadata: from the request view (query_start_loc, seq_lens, padded
          to the graph's batch size) per row: its request, causal context length, and
          how many indices the indexer may pick (limit = min(ctx, K)); plus the slot of
          each new token (the engine's slot_mapping);
  graph   smla.cache_write:     the new tokens' latent + rope rows into the paged cache;
          the indexer:          here a stand-in in torch ops that picks the newest
                                limit[t] positions (a real one scores them all);
          smla.convert_indices: request-local positions -> cache slots (block table);
          smla.forward:         sparse MLA attention over the gathered rows, with lse.
Every step copies new data into the graph's static buffers and replays the graph; the
result of every real row is checked against a float32 torch reference (gather, matmul,
softmax) and padding rows must come out zero.

Needs torch with a CUDA GPU and libsmla built with CUDA; without them it says so and
exits 0 (so CI can run it harmlessly). Run from the repository root after `make`:

    SMLA_LIBRARY=build/libsmla.so PYTHONPATH=python python3 examples/engine_step.py \
        [--format bf16|fp8_ds] [--heads 16] [--topk 2048] [--steps 5]
"""

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

BLOCK_SIZE = 64          # slots per cache block (vLLM, SGLang)
NUM_BLOCKS = 1024        # the whole cache: 65536 slots
BLOCKS_PER_REQ = 64      # block-table width: up to 4096 tokens per request
MAX_REQS = 8             # request slots of the captured graph
GRAPH_TOKENS = 8         # rows of the captured graph (decode: one per request, padded)
DC, DR = 512, 64


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="bf16", choices=["bf16", "fp8_ds"])
    ap.add_argument("--heads", type=int, default=16, help="N (16: DeepSeek-V3.2 at TP8)")
    ap.add_argument("--topk", type=int, default=2048, help="K")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="check the example's logic without a "
                    "GPU: every step runs eagerly on smla's CPU backend, no CUDA graph")
    a = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("engine_step.py: torch is not installed; this example needs torch with a CUDA "
              "GPU. Skipped.")
        return 0
    if not a.cpu and not torch.cuda.is_available():
        print("engine_step.py: no CUDA GPU visible to torch (torch.cuda.is_available() is "
              "False). Skipped.")
        return 0
    import smla
    if not smla.HAVE_TORCH:
        print("engine_step.py: smla was imported without torch support (SMLA_NO_TORCH=1?). "
              "Skipped.")
        return 0
    if not a.cpu and not smla.has_cuda():
        print("engine_step.py: %s was built without CUDA (%s). Skipped."
              % (smla.library_path, smla.build_features()))
        return 0

    cuda = not a.cpu
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if not cuda:
        global NUM_BLOCKS
        NUM_BLOCKS = 600                               # the CPU run: a smaller cache
    N, K, fmt = a.heads, a.topk, a.format
    S = NUM_BLOCKS * BLOCK_SIZE
    row = smla.cache_row_size(fmt, DR)
    bf16 = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    print("device: %s; smla %s (%s); torch %s" % (
          torch.cuda.get_device_name(dev) if cuda else "cpu (eager, no graph)",
          smla.version(), smla.build_features(), torch.__version__))

    # ---- the engine's state: a paged cache and a block table per request slot -----------
    cache = torch.zeros((NUM_BLOCKS, BLOCK_SIZE, row), dtype=torch.uint8, device=dev)
    kv = smla.KVCache(cache, format=fmt, dr=DR)        # layout worked out once
    perm = torch.randperm(NUM_BLOCKS, generator=gen)[:MAX_REQS * BLOCKS_PER_REQ]
    block_table_host = perm.view(MAX_REQS, BLOCKS_PER_REQ).to(torch.int32)
    block_table = block_table_host.to(dev)
    seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32)    # tokens cached per request

    def slot_of(r, p):
        return int(block_table_host[r, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE

    # Earlier steps (prefill) left history in the cache: written eagerly, in chunks.
    history = [3000, 150, 2048, 17, 900, 4000, 64, 1]
    for r, n in enumerate(history):
        kv_c = torch.randn((n, DC + DR), generator=gen).to(bf16).to(dev)
        slot = torch.tensor([slot_of(r, p) for p in range(n)], dtype=torch.int64, device=dev)
        smla.cache_write(kv_c, None, slot, kv)         # [T, 576]: latent and rope together
        seq_lens[r] = n

    # ---- the graph's static buffers (inputs copied in each step, outputs read out) -------
    T = GRAPH_TOKENS
    st = dict(
        q=torch.zeros((T, N, DC + DR), dtype=bf16, device=dev),
        kv_c=torch.zeros((T, DC), dtype=bf16, device=dev),
        k_pe=torch.zeros((T, DR), dtype=bf16, device=dev),
        slot_mapping=torch.full((T,), -1, dtype=torch.int64, device=dev),
        req_id=torch.zeros(T, dtype=torch.int32, device=dev),
        ctx_len=torch.zeros(T, dtype=torch.int32, device=dev),
        limit=torch.zeros(T, dtype=torch.int32, device=dev),
        local=torch.empty((T, K), dtype=torch.int32, device=dev),
        slots=torch.empty((T, K), dtype=torch.int32, device=dev),
        out=torch.empty((T, N, DC), dtype=bf16, device=dev),
        lse=torch.empty((T, N), dtype=torch.float32, device=dev),
    )
    arange_k = torch.arange(K, dtype=torch.int32, device=dev)
    sm_scale = 1.0 / math.sqrt(DC + DR)

    def layer():
        """What the graph holds: cache write, indexer, conversion, attention."""
        smla.cache_write(st["kv_c"], st["k_pe"], st["slot_mapping"], kv)
        # stand-in indexer: the newest limit[t] positions, -1 after them
        pos = st["ctx_len"][:, None] - 1 - arange_k[None, :]
        st["local"].copy_(torch.where(arange_k[None, :] < st["limit"][:, None], pos, -1))
        smla.convert_indices(st["req_id"], block_table, st["local"], block_size=BLOCK_SIZE,
                             slots=st["slots"])
        smla.forward(st["q"], None, kv, st["slots"], sm_scale=sm_scale, lengths=st["limit"],
                     out=st["out"], lse=st["lse"])

    # Plans are made outside capture: one eager run on a side stream (torch's recipe),
    # with the padding-only batch (every slot -1: nothing is written).
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer()
        print("captured: cache_write + indexer + convert_indices + forward, T=%d (padded), "
              "N=%d, K=%d, %s cache of %d slots" % (T, N, K, fmt, S))
    else:
        layer()
    print("plan: %s" % smla.prepare_plans(dev, N, K, DR, fmt, T).describe)

    # Pinned host buffers for the metadata, copied to the device without a sync.
    pin = (lambda x: x.pin_memory()) if cuda else (lambda x: x)
    pinned = {k: pin(torch.zeros(T, dtype=torch.int32)) for k in ("req_id", "ctx_len", "limit")}
    slot_pinned = pin(torch.full((T,), -1, dtype=torch.int64))

    ok = True
    for step in range(a.steps):
        # This step's batch: the first R request slots decode one token each; the graph's
        # other rows are padding, and its other request slots repeat the last start.
        R = [3, 8, 1, 5, 7][step % 5]
        qsl = torch.tensor([min(i, R) for i in range(MAX_REQS + 1)], dtype=torch.int32)
        lens = seq_lens.clone()
        lens[:R] += 1                                  # the new token of each real request
        t0 = time.perf_counter()
        smla.build_metadata(qsl, lens, num_tokens=T, topk=K, req_id=pinned["req_id"],
                            ctx_len=pinned["ctx_len"], limit=pinned["limit"])
        slot_pinned.fill_(-1)
        for t in range(R):                             # the engine's slot_mapping
            slot_pinned[t] = slot_of(int(pinned["req_id"][t]), int(pinned["ctx_len"][t]) - 1)
        host_us = (time.perf_counter() - t0) * 1e6
        for k in pinned:
            st[k].copy_(pinned[k], non_blocking=True)
        st["slot_mapping"].copy_(slot_pinned, non_blocking=True)
        st["q"].copy_(torch.randn((T, N, DC + DR), generator=gen).to(bf16), non_blocking=True)
        new_kv = torch.randn((T, DC + DR), generator=gen).to(bf16)
        st["kv_c"].copy_(new_kv[:, :DC], non_blocking=True)
        st["k_pe"].copy_(new_kv[:, DC:], non_blocking=True)
        st["out"].fill_(float("nan"))
        if cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            ev0.record()
            graph.replay()
            ev1.record()
            torch.cuda.synchronize()
            run = "graph replay %.1f µs on the GPU" % (ev0.elapsed_time(ev1) * 1e3)
        else:
            t1 = time.perf_counter()
            layer()
            run = "eager on the CPU %.1f ms" % ((time.perf_counter() - t1) * 1e3)
        seq_lens = lens

        good = check(torch, st, cache, fmt, slot_of, R, K, sm_scale, new_kv)
        ok &= good
        print("step %d: %d real rows of %d, metadata + slot_mapping on the host %.0f µs, "
              "%s: %s" % (step, R, T, host_us, run, "ok" if good else "MISMATCH"))
    print("engine_step: %s" % ("all steps match the reference" if ok else "FAILED"))
    return 0 if ok else 1


def dequant_rows(torch, rows_u8, fmt):
    """Cache rows (uint8 [n, row]) -> float32 [n, 576]."""
    if fmt == "bf16":
        return rows_u8[:, :2 * (DC + DR)].contiguous().view(torch.bfloat16).float()
    lat = rows_u8[:, :DC].contiguous().view(torch.float8_e4m3fn).float()
    scales = rows_u8[:, DC:DC + 16].contiguous().view(torch.float32)
    rope = rows_u8[:, DC + 16:DC + 16 + 2 * DR].contiguous().view(torch.bfloat16).float()
    return torch.cat([lat * scales.repeat_interleave(128, dim=1), rope], dim=1)


def check(torch, st, cache, fmt, slot_of, R, K, sm_scale, new_kv):
    """Every real row against a float32 reference built from the engine's own view (its
    block table and positions), padding rows zero; the new tokens' rows hold new_kv
    (bf16: exactly; fp8_ds: within e4m3 rounding)."""
    flat = cache.view(-1, cache.shape[-1])
    good = True
    req_id, ctx_len = st["req_id"].cpu(), st["ctx_len"].cpu()
    for t in range(st["q"].shape[0]):
        if t >= R:
            good &= bool((st["out"][t].float() == 0).all())
            continue
        r, ctx = int(req_id[t]), int(ctx_len[t])
        n = min(ctx, K)
        positions = range(ctx - 1, ctx - 1 - n, -1)
        slots = torch.tensor([slot_of(r, p) for p in positions], device=flat.device)
        rows = dequant_rows(torch, flat[slots], fmt)                       # [n, 576]
        want = new_kv[t].float().to(rows.device)                           # slots[0]: new
        tol = 0 if fmt == "bf16" else want.abs() / 16 + 1e-3
        good &= bool(((rows[0] - want).abs() <= tol).all())
        logits = sm_scale * st["q"][t].float() @ rows.T                    # [N, n]
        p = torch.softmax(logits, dim=-1)
        ref = p @ rows[:, :DC]
        lse = torch.logsumexp(logits, dim=-1)
        err = (st["out"][t].float() - ref).abs()
        good &= bool((err <= 3e-3 + 1.6e-2 * ref.abs()).all())
        good &= bool(((st["lse"][t] - lse).abs() <= 2e-3).all())
        good &= bool(torch.equal(st["slots"][t, :n].cpu().long(), slots.cpu()))
    return good


if __name__ == "__main__":
    sys.exit(main())
