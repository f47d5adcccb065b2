"""Decode context parallelism with torch.distributed (docs/dcp.md).

Each rank of a process group holds a share of every request's tokens (vLLM's DCP layout:
runs of `interleave` tokens dealt round robin). Per decode step, on every rank:

    bufs = smla.dcp.PartialBuffers(T, N, group=group, device=q.device)   # once
    slots, valid = smla.convert_indices(req_id, block_table, topk_positions, block_size=bs,
                                        compact=True, return_valid=True, cp_size=W,
                                        cp_rank=rank, cp_interleave=I)
    smla.forward(q, None, kv, slots, lengths=valid, out=bufs.out, lse=bufs.lse)
    out = bufs.gather_merge()          # all ranks' (out, lse) merged: attention over all

gather_merge is one all-gather (all_gather_into_tensor, e.g. NCCL) of a [W, chunk] byte
buffer whose row r is rank r's [out bf16 T*N*512 | lse f32 T*N], then smla.merge_states
over its W rows. The buffers are allocated once, so the whole step can be captured in a
CUDA graph (NCCL collectives are capturable) and nothing synchronizes with the host.
"""

import torch
import torch.distributed as dist

from . import _ops

DC = _ops.DC


class PartialBuffers:
    """The send / receive buffers of one rank for T rows and N heads.

    out: [T, N, 512] bf16 and lse: [T, N] float32 views into this rank's row of the
    gather buffer: pass them to forward(out=, lse=). gather_merge() all-gathers the rows
    over `group` and merges them; its outputs are preallocated too (merged_out, merged_lse)
    unless given."""

    def __init__(self, num_tokens, num_heads, group=None, device=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("smla.dcp.PartialBuffers: this process is not in `group`")
        self.nccl = dist.get_backend(group) == "nccl"
        T, N = int(num_tokens), int(num_heads)
        self.T, self.N = T, N
        self.out_bytes = T * N * DC * 2
        lse_bytes = T * N * 4
        self.chunk = (self.out_bytes + lse_bytes + 255) // 256 * 256  # rows 256-byte aligned
        self.recv = torch.empty((self.world, self.chunk), dtype=torch.uint8, device=device)
        self.send = self.recv[self.rank]
        row = self.send
        self.out = row[:self.out_bytes].view(torch.bfloat16).view(T, N, DC)
        self.lse = row[self.out_bytes:self.out_bytes + lse_bytes].view(torch.float32).view(T, N)
        ob = self.out_bytes
        self.out_p = self.recv[:, :ob].view(torch.bfloat16).view(self.world, T, N, DC)
        self.lse_p = self.recv[:, ob:ob + lse_bytes].view(torch.float32).view(self.world, T, N)
        self.merged_out = torch.empty((T, N, DC), dtype=torch.bfloat16, device=device)
        self.merged_lse = torch.empty((T, N), dtype=torch.float32, device=device)

    def all_gather(self):
        """Every rank's row of the gather buffer (this rank's row is the input). NCCL: one
        all_gather_into_tensor in place (its input is this rank's slice of the output);
        other backends (gloo): the list form, from a copy of the row."""
        if self.nccl:
            dist.all_gather_into_tensor(self.recv.view(-1), self.send, group=self.group)
        else:
            dist.all_gather(list(self.recv.unbind(0)), self.send.clone(), group=self.group)

    def gather_merge(self, out=None, lse=None, return_lse=False, sink=None):
        """All-gather, then the exact merge of the W partials. -> out [T, N, 512] bf16 (and
        lse [T, N] float32 when return_lse): attention over every rank's tokens.
        sink: the [N] float32 sink every rank's forward was given (forward(sink=...)), so
        that it counts once in the merged result, not once per rank."""
        self.all_gather()
        o = self.merged_out if out is None else out
        e = self.merged_lse if lse is None else lse
        _ops.merge_states(self.out_p, self.lse_p, out=o, lse=e, sink=sink)
        return (o, e) if return_lse else o
