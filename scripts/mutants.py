#!/usr/bin/env python3
"""The mutation check: each mutant below is a deliberate, realistic bug (truncated rounding,
one scale for all FP8_DS groups, an off-by-one in lengths, a skipped tile, ...), applied
alone to a copy of the tree; the test suite must fail on every one. A mutant that passes is
a missing test, and this script then exits 1.

  python3 scripts/mutants.py                  the CPU mutants (what CI runs; ~4 min on 2 cores)
  python3 scripts/mutants.py --target gpu     the CUDA-kernel mutants (needs a GPU; builds
                                              the mutants in parallel, then tests each)
  python3 scripts/mutants.py --list           the list, with what each one breaks
  python3 scripts/mutants.py --only a,b       just these
  --nvcc-extra="-DSMLA_FWD90_X=1"             the tree and every mutant built as that
                                              experiment (NVCC_EXTRA)
  --md FILE                                   also write the result table as markdown

Each mutant names one exact piece of source that must occur exactly once: when the code
it names changes, the script fails with "anchor not found" instead of silently testing
nothing; update the mutant with the code. A mutant that does not compile is an error too.

How a mutant is judged: the C test driver (build/test_smla --fail-fast, with the
mutant's --filter on the GPU, where each run costs device time) must exit non-zero; for
the CPU mutants that survive it, the numpy tests (python/tests/test_ops.py) get a second
try. The unmutated copy must pass the same commands first, so that a kill means the
mutant, not a broken tree. The seed of each run is fresh and printed: a mutant must be
caught on any inputs, not on one lucky draw.
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutant:
    def __init__(self, name, target, path, old, new, what, filt=None):
        self.name, self.target, self.path = name, target, path
        self.old, self.new, self.what, self.filt = old, new, what, filt


M = Mutant
MUTANTS = [
    # ---- the CPU backend (the oracle every GPU kernel is judged against) ----
    M("cpu_bf16_truncate", "cpu", "src/numerics.h",
      "u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */",
      "u += 0u;",
      "float -> bf16 by truncation instead of round-to-nearest-even (out, merge, cache)"),
    M("cpu_ds_one_scale", "cpu", "src/cpu/forward.c",
      "smla_e4m3_to_f32(row[d]) * scales[d / SMLA_DS_GROUP]",
      "smla_e4m3_to_f32(row[d]) * scales[0]",
      "FP8_DS rows dequantized with group 0's scale for all four groups"),
    M("cpu_lengths_off_by_one", "cpu", "src/cpu/forward.c",
      "len = l < 0 ? 0 : (l > p->topk ? p->topk : l);",
      "len = l < 0 ? 0 : (l > p->topk ? p->topk : l - 1);",
      "the last entry inside lengths[t] is dropped"),
    M("cpu_sink_twice", "cpu", "src/cpu/forward.c",
      "denom += expf(p->sink[h0 + h] - m);",
      "denom += 2.0f * expf(p->sink[h0 + h] - m);",
      "the sink counted twice in the denominator"),
    M("cpu_lse_base2", "cpu", "src/cpu/forward.c",
      "empty ? -INFINITY : m + logf(z);",
      "empty ? -INFINITY : m + log2f(z);",
      "lse with a base-2 log"),
    M("cpu_skipped_tile", "cpu", "src/cpu/forward.c",
      "if (n) fold_chunk(p, &w, nh, n, dqk);",
      "if (n && len <= CHUNK) fold_chunk(p, &w, nh, n, dqk);",
      "the last, partial chunk of 64 gathered rows skipped when the row has more"),
    M("cpu_dropped_rope", "cpu", "src/cpu/forward.c",
      "qf[SMLA_DC + d] = smla_bf16_to_f32(qp[d]);",
      "qf[SMLA_DC + d] = 0.0f * smla_bf16_to_f32(qp[d]);",
      "the rope part of q dropped from the logits"),
    M("cpu_mask_minus2", "cpu", "src/cpu/forward.c",
      "} else if (s < -1 || s >= c->num_slots) {",
      "} else if (s < -2 || s >= c->num_slots) {",
      "index -2 treated as padding (-1) instead of a bad input"),
    M("cpu_softcap_unscaled", "cpu", "src/cpu/forward.c",
      "if (c > 0.0f) l = c * tanhf(l / c);",
      "if (c > 0.0f) l = tanhf(l / c);",
      "softcap without the outer c"),
    M("cpu_max_logit_is_lse", "cpu", "src/cpu/forward.c",
      "p->max_logit[t * p->max_logit_stride_t + h0 + h] = m;",
      "p->max_logit[t * p->max_logit_stride_t + h0 + h] = empty ? m : m + logf(z);",
      "max_logit written with the lse"),
    M("cpu_merge_weight_no_max", "cpu", "src/cpu/ops.c",
      "const float lae_all = p->sink ? smla_logaddexpf(lse, s) : lse;",
      "const float lae_all = p->sink ? smla_logaddexpf(lse, s) : m;",
      "merge weights exp(lse_p - max) instead of exp(lse_p - lse) (not normalized)"),
    M("cpu_merge_sink_ignored", "cpu", "src/cpu/ops.c",
      "const float s = p->sink ? p->sink[h] : 0.0f;",
      "const float s = p->sink ? -INFINITY : 0.0f;",
      "merge of sinked partials ignores the sink"),
    M("cpu_convert_block_bound", "cpu", "src/cpu/ops.c",
      "if (block >= p->blocks_per_request) return -1;",
      "if (block > p->blocks_per_request) return -1;",
      "convert lets p / bs == B through (reads past the block table row)"),
    M("cpu_ds_scale_floor", "cpu", "src/numerics.h",
      "if (u & 0x7fffffu) e += 1;              /* not a power of two: round the log up */",
      "",
      "FP8_DS writer's group scale rounded down instead of up (values saturate)"),
    M("cpu_metadata_ctx", "cpu", "src/metadata.c",
      "const int32_t c = p->seq_lens[r] - q_len + j + 1;",
      "const int32_t c = p->seq_lens[r] - q_len + j;",
      "causal context length one short"),

    # ---- the Python binding's engine-compatible calls (judged by their pytest files) ----
    M("py_flashmla_decode_no_sink", "cpu", "python/smla/compat.py",
      "                            sink=attn_sink, format=fmt, dr=d_qk - _ops.DC,",
      "                            sink=None, format=fmt, dr=d_qk - _ops.DC,",
      "FlashMLA decode compat drops attn_sink", "python/tests/test_compat_decode.py"),
    M("py_flashmla_decode_topk_length", "cpu", "python/smla/compat.py",
      "ln = None if lengths is None else lengths.repeat_interleave(s_q)",
      "ln = None",
      "FlashMLA decode compat ignores topk_length", "python/tests/test_compat_decode.py"),
    M("py_flashmla_decode_block_stride", "cpu", "python/smla/compat.py",
      "per_block = page if nb == 1 else s0 // row",
      "per_block = page",
      "FlashMLA decode compat assumes unpadded blocks", "python/tests/test_compat_decode.py"),
    M("py_flashinfer_lse_units", "cpu", "python/smla/compat.py",
      "        if not return_lse_base_on_e:\n            l_ = l_ * _LOG2E",
      "        if return_lse_base_on_e:\n            l_ = l_ * _LOG2E",
      "FlashInfer wrapper returns lse in the wrong base", "python/tests/test_compat_flashinfer.py"),
    M("py_flashinfer_causal", "cpu", "python/smla/compat.py",
      "            lengths = lengths - q_len + row_in_req + 1",
      "            lengths = lengths - q_len + row_in_req",
      "FlashInfer wrapper's causal lengths one short", "python/tests/test_compat_flashinfer.py"),

    # ---- the CUDA kernels (each checked against the CPU backend and the reference) ----
    M("gpu_bf16_truncate", "gpu", "src/cuda/forward_common.cuh",
      "__floats2bfloat162_rn(lo, hi);",
      "__halves2bfloat162(__float2bfloat16_rz(lo), __float2bfloat16_rz(hi));",
      "forward kernels' bf16 packing (out and P) rounds toward zero", "forward"),
    M("gpu_indices_one_request", "gpu", "src/cuda/forward_common.cuh",
      "return a.conv.req_id ? convert_one(a.conv, req, raw) : raw;",
      "return a.conv.req_id ? convert_one(a.conv, 0, raw) : raw;",
      "smla_forward_indices: every row converted through request 0's block table",
      "indices"),
    M("gpu_convert_shift_mask", "gpu", "src/cuda/convert.cuh",
      "p & (a.block_size - 1) : p - bi * a.block_size;",
      "p & a.block_size : p - bi * a.block_size;",
      "GPU conversion of a power-of-two block size keeps the wrong bits of the position",
      "convert,indices"),
    M("gpu_convert_div_remainder", "gpu", "src/cuda/convert.cuh",
      "p & (a.block_size - 1) : p - bi * a.block_size;",
      "p & (a.block_size - 1) : p - bi;",
      "GPU conversion of a block size that is not a power of two: a wrong offset in the block",
      "convert_block_size_48,indices_n128_bs24"),
    M("gpu_ds_one_scale_s", "gpu", "src/cuda/forward_impl.cuh",
      "const float sc_ = (gi) >= 0 ? scale_s[col_ * 4 + (gi)] : 1.0f;",
      "const float sc_ = (gi) >= 0 ? scale_s[col_ * 4] : 1.0f;",
      "generic FP8_DS: group 0's scale for every group of S", "forward"),
    M("gpu_ds_one_scale_p", "gpu", "src/cuda/forward_impl.cuh",
      "pack_bf16x2(p0 * scale_s[col * 4 + gi], p1 * scale_s[(col + 1) * 4 + gi]);",
      "pack_bf16x2(p0 * scale_s[col * 4], p1 * scale_s[(col + 1) * 4]);",
      "generic FP8_DS: group 0's scale for every group of P V", "forward"),
    M("gpu_lengths_off_by_one", "gpu", "src/cuda/forward_common.cuh",
      "if (a.lengths) len = min(max(a.lengths[b.t], 0), a.topk);",
      "if (a.lengths) len = min(max(a.lengths[b.t] - 1, 0), a.topk);",
      "both forward kernels drop the last entry inside lengths[t]", "forward"),
    M("gpu_sink_twice", "gpu", "src/cuda/forward_common.cuh",
      "if (sink) den += expf(sink[head] - M);",
      "if (sink) den += 2.0f * expf(sink[head] - M);",
      "every final row of both forward kernels (unsplit, and both in-kernel merges) counts "
      "the sink twice", "forward"),
    M("gpu_lse_base2", "gpu", "src/cuda/forward_common.cuh",
      "return L == 0.0f ? -INFINITY : M + logf(L);",
      "return L == 0.0f ? -INFINITY : M + log2f(L);",
      "both forward kernels' lse (final rows, the partials', the merged rows') in base 2",
      "forward"),
    M("gpu_skipped_tile", "gpu", "src/cuda/forward_common.cuh",
      "b.ntiles = b.kend > b.ks ? (b.kend - b.ks + FWD_BN - 1) / FWD_BN : 0;",
      "b.ntiles = b.kend > b.ks ? (b.kend - b.ks) / FWD_BN : 0;",
      "both forward kernels skip a split's last, partial tile of 64 entries", "forward"),
    M("gpu_mask_minus2", "gpu", "src/cuda/forward_common.cuh",
      "if (lp == 0 && in_range && (s < -1 || (int64_t)s >= a.num_slots)) (*bad)++;",
      "if (lp == 0 && in_range && (s < -2 || (int64_t)s >= a.num_slots)) (*bad)++;",
      "index -2 not counted as a bad input", "forward"),
    M("gpu_generic_dropped_rope", "gpu", "src/cuda/forward_impl.cuh",
      "for (int kk = 0; kk < DQK / 16; kk++) S_STEP(kk);",
      "for (int kk = 0; kk < 32; kk++) S_STEP(kk);",
      "generic kernel (BF16 and FP8_TENSOR caches) leaves the rope columns out of S",
      "forward"),
    M("gpu_sm90_dropped_rope", "gpu", "src/cuda/sm90/wgmma.cuh",
      "  for (int kb = 0; kb < KB; kb++)\n#pragma unroll\n    for (int k4 = 0; k4 < 4; k4++)\n"
      "      wgmma_m64nNk16_ss<N, 0>(",
      "  for (int kb = 0; kb < (KB == 9 ? 8 : KB); kb++)\n#pragma unroll\n"
      "    for (int k4 = 0; k4 < 4; k4++)\n      wgmma_m64nNk16_ss<N, 0>(",
      "both sm90 kernels (v11, small-head: wg_s_issue) leave the rope block out of S",
      "forward"),
    M("gpu_sm90_no_rescale", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "    alpha[hh] = ex2_approx((m_run[hh] - use) * FWD_LOG2E);",
      "    alpha[hh] = m_run[hh] == NEG_INF ? 0.0f : 1.0f;",
      "sm90 kernel (v11): a tile's own softmax never rescales the running output and sum "
      "when the max grows", "forward,wide"),
    M("gpu_relay_cross_no_rescale", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "  if (__any_sync(0xffffffffu, moved)) w11_scale_o(O, f);\n}",
      "}",
      "sm90 v11: the warpgroup that adds the other's tile keeps its output at the old "
      "reference max", "forward,wide"),
    M("gpu_relay_top_lost", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "    m_top[hh] = xmj[64 + row];",
      "",
      "sm90 v11: the largest logit of the other warpgroup's tiles is not passed on "
      "(max_logit misses half the tiles)", "wide,forward_N_64,forward_N_96"),
    M("gpu_relay_mask_shift", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "const uint64_t um = umask[st] >> (2 * tig);",
      "const uint64_t um = umask[st] >> tig;",
      "sm90 v11: each thread reads the used-entry bits of the wrong columns",
      "forward,wide"),
    # the small-head sm90 kernel (N <= 32, and the fewest rows of N > 32 in groups of 16; swap-AB)
    M("gpu_small_pt_unswizzled", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "*(__nv_bfloat16 *)(pb + h * 128 + (((r >> 3) ^ (h & 7)) << 4) + 2 * (r & 7)) =",
      "*(__nv_bfloat16 *)(pb + h * 128 + ((r >> 3) << 4) + 2 * (r & 7)) =",
      "sm90 small-head kernel: P^T stored without the 128-byte swizzle the PV's descriptor "
      "reads", "forward_N_,forward_indices_n16,wide_n16,wide_n8"),
    M("gpu_small_no_rescale", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "        for (int i = 0; i < HG / 2; i++) O[mt][i] *= alpha[i >> 2][i & 1];",
      "        for (int i = 0; i < HG / 2; i++) O[mt][i] *= 1.0f;",
      "sm90 small-head kernel: the output is not rescaled when a head's max grows",
      "forward_N_,forward_indices_n16,wide_n16,wide_n8"),
    M("gpu_small_sum_one_row", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "l_run[n][c] = (e >> 1) ? l_run[n][c] + p : l_run[n][c] * alpha[n][c] + p;",
      "l_run[n][c] = (e >> 1) ? l_run[n][c] : l_run[n][c] * alpha[n][c] + p;",
      "sm90 small-head kernel: the row sums miss each thread's second entry",
      "forward_N_,forward_indices_n16,wide_n16,wide_n8"),
    M("gpu_small_mask_row", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "const bool u0 = (um >> r0) & 1u, u1 = (um >> (r0 + 8)) & 1u;",
      "const bool u0 = (um >> r0) & 1u, u1 = (um >> r0) & 1u;",
      "sm90 small-head kernel: a thread's second entry takes the first one's used bit",
      "forward_N_,forward_indices_n16,forward_sink,wide_n16,wide_n8"),
    M("gpu_small_top_last_tile", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "          m_top[n][c] = fmax_nan(m_top[n][c], tmax[n][c]);",
      "          m_top[n][c] = tmax[n][c];",
      "sm90 small-head kernel: max_logit is the last tile's largest logit, not the row's",
      "forward_N_,forward_indices_n16,wide_n16,wide_n8"),
    M("gpu_small_sum_three_warps", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "lh[n][c] = red[4 * HG + h] + red[5 * HG + h] + red[6 * HG + h] + red[7 * HG + h];",
      "lh[n][c] = red[4 * HG + h] + red[5 * HG + h] + red[6 * HG + h];",
      "sm90 small-head kernel: a head's sum misses the entries of the fourth warp",
      "forward_N_,forward_indices_n16,wide_n16,wide_n8"),
    M("gpu_cluster_merge_sink", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "return part_weight(m_own, l_own, M) * row_out_factor(a.sink, head, M, L, a.value_scale);",
      "return part_weight(m_own, l_own, M) * row_out_factor(NULL, head, M, L, a.value_scale);",
      "sm90 in-kernel cluster merge of splits drops the sink", "forward,merge"),
    M("gpu_cluster_sum_remote_rank", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "ld_cluster_f32x4(ost_s + 4u * (uint32_t)(row * W_OST_STRIDE + col), (uint32_t)k);",
      "ld_cluster_f32x4(ost_s + 4u * (uint32_t)(row * W_OST_STRIDE + col), (uint32_t)me);",
      "sm90 in-kernel cluster merge: every other split's columns read from this block's own "
      "staged O instead of that split's block", "wide_n128_merges,wide_n128_splits"),
    M("gpu_generic_merge_last_early", "gpu", "src/cuda/forward_common.cuh",
      "const int last = atomicAdd(counter, 1) == R - 1;",
      "const int last = atomicAdd(counter, 1) == R - 2;",
      "in-kernel DSMEM merge: the second-to-last cluster of a row merges before the last "
      "has written its slice", "generic_merges,small_merges,cuda_graph"),
    M("gpu_generic_merge_sink", "gpu", "src/cuda/forward_common.cuh",
      "  const float f = row_out_factor(a.sink, head, M_, L_, a.value_scale);",
      "  const float f = row_out_factor(NULL, head, M_, L_, a.value_scale);",
      "in-kernel DSMEM merge drops the sink", "generic_merges,small_merges"),
    M("gpu_generic_merge_slice_short", "gpu", "src/cuda/forward_common.cuh",
      "const int u0 = 128 * k / C, u1 = 128 * (k + 1) / C;",
      "const int u0 = 128 * k / C, u1 = 128 * (k + 1) / C - 1;",
      "in-kernel DSMEM merge: each block's column slice one float4 short",
      "generic_merges,small_merges"),
    M("gpu_generic_merge_counter_kept", "gpu", "src/cuda/forward_common.cuh",
      "      if (tid == 0) *counter = 0; /* every count of this launch is in */",
      "",
      "in-kernel DSMEM merge: the last cluster leaves its counter at R (the next forward "
      "on the plan never finds its last cluster)", "cuda_graph,generic_merges,small_merges"),
    M("gpu_merge4_weight", "gpu", "src/cuda/merge.cu",
      "const float w = l[p] == NEG_INF ? -1.0f : expf(l[p] - lse);",
      "const float w = l[p] == NEG_INF ? -1.0f : expf(l[p] - mx);",
      "split-KV combine v4 (2..8 splits) weighs partials by exp(lse_p - max)",
      "forward,merge"),
    M("gpu_merge3_weight", "gpu", "src/cuda/merge.cu",
      "w[u] = l[u] == NEG_INF ? -1.0f : expf(l[u] - lse); /* -1: contributes nothing */",
      "w[u] = l[u] == NEG_INF ? -1.0f : expf(l[u] - mx); /* -1: contributes nothing */",
      "split-KV combine v3 (8+ splits, few rows) weighs partials by exp(lse_p - max)",
      "forward,merge"),
    M("gpu_merge1_sink", "gpu", "src/cuda/merge.cu",
      ": a.sinked ? expf(smla_logaddexpf(l, sink_h) - lae_all) : expf(l - lse);",
      ": expf(l - lse);",
      "public merge kernel (v1) ignores the sink of sinked partials", "merge,dcp"),
    M("gpu_lazy_max_logit_ref", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "if (wg == 0) rowmax_s[row] = m_run[hh], rowtop_s[row] = m_top[hh];",
      "if (wg == 0) rowmax_s[row] = m_run[hh], rowtop_s[row] = m_run[hh];",
      "sm90 lazy rescale: max_logit from the lagging reference max, not the row's largest "
      "logit", "wide,forward_N_64,forward_N_96"),
    M("gpu_lazy_tau_huge", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "#define W_TAU (SMLA_FWD90_LAZY_RESCALE ? 5.5451774f : 0.0f)",
      "#define W_TAU (SMLA_FWD90_LAZY_RESCALE ? 200.0f : 0.0f)",
      "sm90 lazy rescale: the reference max allowed to lag by 200 (P overflows fp32 once a "
      "row's logits spread over more than ~88)", "wide,forward_N_64,forward_N_96,scale"),
    M("gpu_persist_q_early", "gpu", "src/cuda/sm90/forward_wgmma.cu",
      "      if (nq > 0) mbar_wait(qfree_b, (nq - 1u) & 1u);\n      w_load_q<KB>(",
      "      if (nq > 0 && nq > 1000000u) mbar_wait(qfree_b, (nq - 1u) & 1u);\n"
      "      w_load_q<KB>(",
      "sm90 persistent grid: the next unit's Q loaded without waiting for the last S of the "
      "unit before (its last tiles' S read the next row's queries)", "wide_persistent"),
    M("gpu_split_rest_7bit", "gpu", "src/cuda/backend.c",
      "    plan->split_rest = s; /* forced: up to 1024, so not in split_table's 8-bit code */",
      "    plan->split_rest = s & 0x7f; /* forced: up to 1024, so not in split_table's 8-bit code */",
      "a forced split count kept in 7 bits (the bug found in session 11: 128 splits launched "
      "nothing, 200 ran 72)", "many_splits"),
    M("gpu_tensor_value_scale", "gpu", "src/cuda/backend.c",
      "a.value_scale = tensor ? p->cache.scale : 1.0f;",
      "a.value_scale = 1.0f;",
      "FP8_TENSOR: the cache scale left out of the output", "forward"),
]


def sh(cmd, cwd, log, timeout=None, env=None):
    """Runs cmd (a list) in cwd, appending its output to log; -> (exit code, seconds)."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write("$ %s\n" % " ".join(cmd))
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            f.write("\n(timed out after %d s)\n" % timeout)
            rc = -999
    return rc, time.time() - t0


def source_files():
    """The working tree's files: tracked and untracked-not-ignored ones from git, or (a copy
    without .git, as on the device machine) every file outside build folders and caches."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                             check=True, capture_output=True).stdout.decode()
        return [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, subdirs, names in os.walk(ROOT):
            subdirs[:] = [x for x in subdirs if not (x.startswith("build") or x.startswith(".")
                                                     or x == "__pycache__")]
            files += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
        return files


def copy_tree(dst):
    """The working tree as it is, without builds (mtimes kept)."""
    for rel in source_files():
        if not rel or not os.path.isfile(os.path.join(ROOT, rel)):
            continue
        os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(dst, rel))


def apply(tree, m):
    path = os.path.join(tree, m.path)
    with open(path) as f:
        src = f.read()
    n = src.count(m.old)
    if n != 1:
        raise RuntimeError("%s: anchor %s in %s (update the mutant with the code)" %
                           (m.name, "not found" if n == 0 else "found %d times" % n, m.path))
    with open(path, "w") as f:
        f.write(src.replace(m.old, m.new))
    return src


def first_failure(log):
    with open(log) as f:
        for line in f:
            if line.startswith("FAIL") or "Segmentation" in line or "timed out" in line:
                return line.strip()[:110]
    return "(exit status)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--md", help="also write the result table here (markdown)")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temp folder)")
    ap.add_argument("--from-build", help="start from this build folder of the working tree "
                    "(made by `make` with the same CUDA setting and NVCC_EXTRA; saves the "
                    "first full build)")
    ap.add_argument("--nvcc-extra", default="",
                    help="build the tree and every mutant with these nvcc flags (an "
                    "experiment build, e.g. -DSMLA_FWD90_PERSIST=0), so that the mutation "
                    "check judges the tests against the kernel that build selects")
    args = ap.parse_args()

    todo = [m for m in MUTANTS if m.target == args.target]
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {m.name for m in MUTANTS}]
        if unknown:
            sys.exit("mutants: unknown mutant(s) %s (--list names them)" % ", ".join(unknown))
        todo = [m for m in MUTANTS if m.name in names]
    if args.list:
        for m in todo:
            print("%-26s %-4s %-34s %s" % (m.name, m.target, m.path, m.what))
        return 0

    # Every mutant's anchor, both targets, checked first: an anchor the code no longer has
    # would otherwise surface only on a GPU run (one did: gpu_sm90_dropped_rope, session 14).
    stale = []
    for m in MUTANTS:
        with open(os.path.join(ROOT, m.path)) as f:
            n = f.read().count(m.old)
        if n != 1:
            stale.append("%s (%s in %s)" % (m.name, "not found" if n == 0 else "%d times" % n,
                                            m.path))
    if stale:
        sys.exit("mutants: stale anchors, update the mutants with the code: " + "; ".join(stale))

    if args.from_build and os.path.normpath(args.from_build) != "build":
        # Its objects' dependency files name their own folder: copied in as build/, no
        # object would see the mutated source and every mutant would survive (session 23).
        sys.exit("mutants: --from-build takes the folder `make` built as BUILD=build, not %s"
                 % args.from_build)
    gpu = args.target == "gpu"
    work = args.keep or tempfile.mkdtemp(prefix="smla-mutants-")
    base = os.path.join(work, "base")
    if os.path.exists(base):
        shutil.rmtree(base)
    os.makedirs(base)
    copy_tree(base)
    if args.from_build:
        shutil.copytree(os.path.join(ROOT, args.from_build), os.path.join(base, "build"),
                        symlinks=True)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    make = ["make", "-s", "BUILD=build"] + ([] if gpu else ["CUDA=0"])
    if args.nvcc_extra:
        make.append("NVCC_EXTRA=" + args.nvcc_extra)
    targets = ["build/test_smla", "lib"]

    print("mutants: %d %s mutant(s), work folder %s" % (len(todo), args.target, work))
    blog = os.path.join(logs, "base.log")
    rc, secs = sh(make + ["-j%d" % args.jobs] + targets, base, blog)
    if rc:
        sys.exit("mutants: the unmutated tree does not build (%s)" % blog)
    filters = sorted({m.filt for m in todo if m.filt}) if gpu else []
    for filt in filters or [None]:
        cmd = ["build/test_smla", "--fail-fast"] + (["--filter", filt] if filt else [])
        rc, secs = sh(cmd, base, blog, timeout=900)
        if rc:
            sys.exit("mutants: the unmutated tree fails its tests (%s): %s" %
                     (blog, first_failure(blog)))
    print("mutants: unmutated tree built and passed (%.0f s)" % secs)
    sys.stdout.flush()

    # Build every mutant in its own copy of the built tree (mtimes kept, so make rebuilds
    # only what the mutant touched), several at once; then test them one at a time.
    def build(m):
        tree = os.path.join(work, m.name)
        if os.path.exists(tree):
            shutil.rmtree(tree)
        shutil.copytree(base, tree, symlinks=True)
        apply(tree, m)
        log = os.path.join(logs, m.name + ".log")
        if os.path.exists(log):
            os.remove(log)
        rc, _ = sh(make + ["-j%d" % max(1, args.jobs // 4)] + targets, tree, log)
        return tree, log, rc

    results = []
    par = max(1, min(len(todo), args.jobs // 4)) if gpu else 1
    with concurrent.futures.ThreadPoolExecutor(par) as ex:
        futs = [ex.submit(build, m) for m in todo]
        for m, fut in zip(todo, futs):
            tree, log, rc = fut.result()
            t0 = time.time()
            if rc:
                with open(log) as f:  # the first compiler error, so a remote run says why
                    err = next((l.strip() for l in f if "error" in l), "(no error line)")
                verdict, how = "ERROR", "does not build: %s" % err[:160]
            else:
                python_only = m.path.endswith(".py")  # the binding: only pytest can see it
                rc = 0
                if not python_only:
                    cmd = ["build/test_smla", "--fail-fast"] + (
                        ["--filter", m.filt] if gpu and m.filt else [])
                    rc, _ = sh(cmd, tree, log, timeout=900)
                if rc:
                    verdict, how = "killed", "C suite: " + first_failure(log)
                elif not gpu:
                    env = dict(os.environ, SMLA_LIBRARY=os.path.join(tree, "build/libsmla.so"),
                               PYTHONPATH=os.path.join(tree, "python"))
                    files = (m.filt or "python/tests/test_ops.py").split(",")
                    rc, _ = sh([sys.executable, "-m", "pytest", "-x", "-q"] + files, tree, log,
                               timeout=900, env=env)
                    what = "pytest " + " ".join(os.path.basename(f) for f in files)
                    verdict, how = (("killed", what + (" (C suite passed)" if not python_only
                                                       else "")) if rc
                                    else ("SURVIVED", "C suite and %s pass" % what))
                else:
                    verdict, how = "SURVIVED", "C suite passes"
            results.append((m, verdict, how, time.time() - t0))
            print("%-8s %-26s %s" % (verdict, m.name, how))
            sys.stdout.flush()
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)

    killed = sum(1 for r in results if r[1] == "killed")
    lines = ["| mutant | file | bug | verdict |", "| --- | --- | --- | --- |"]
    for m, verdict, how, secs in results:
        lines.append("| %s | %s | %s | %s: %s |" % (m.name, m.path, m.what, verdict,
                                                    how.replace("|", "/")))
    table = "\n".join(lines)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    print()
    print(table)
    print()
    print("mutants (%s): %d killed, %d not killed, of %d" % (args.target, killed,
                                                           len(results) - killed, len(results)))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
