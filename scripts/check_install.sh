#!/usr/bin/env bash
# The Python package as a user installs it: a fresh venv, `pip install ./python` (which
# builds libsmla with the Makefile and bundles it), then a forward from outside the
# repository with no SMLA_LIBRARY or PYTHONPATH. SMLA_CUDA=0 builds the CPU library only
# (what a machine without nvcc gets). Needs PyPI (numpy, setuptools for the build).
# SMLA_INSTALL_OFFLINE=1 (a machine with no network, such as the GPU machine, whose
# python3 is itself a venv holding torch and numpy): `pip install --target` of ./python
# into a fresh folder with that interpreter, no index, no build isolation and no
# dependency resolution (numpy and torch are there already), then the same checks with
# only that folder on PYTHONPATH. Where torch sees a GPU, the installed package also runs
# the forward on it and checks it against its own CPU forward.
set -euo pipefail
cd "$(dirname "$0")/.."
v=$(mktemp -d)
trap 'rm -rf "$v"' EXIT
if [ "${SMLA_INSTALL_OFFLINE:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-build-isolation --no-deps --target "$v/site" ./python
  run() { env -u SMLA_LIBRARY PYTHONPATH="$v/site" python3 "$@"; }
else
  python3 -m venv "$v/venv"
  "$v/venv/bin/pip" install -q ./python
  run() { env -u SMLA_LIBRARY -u PYTHONPATH "$v/venv/bin/python" "$@"; }
fi
export SMLA_INSTALL_DIR="$v"
cd "$v"
run - <<'PY'
import numpy as np
import smla
rng = np.random.default_rng(0)
T, N, K, S = 2, 16, 64, 256
cache = np.zeros((S, 1152), np.uint8)
kv_c = smla.bf16_from_f32(rng.standard_normal((S, 512)))
k_pe = smla.bf16_from_f32(rng.standard_normal((S, 64)))
smla.cache_write(kv_c, k_pe, np.arange(S, dtype=np.int64), cache)
q = smla.bf16_from_f32(rng.standard_normal((T, N, 576)))
slots = rng.integers(0, S, (T, K)).astype(np.int32)
out, lse = smla.forward(q, None, cache, slots, return_lse=True)
assert out.shape == (T, N, 512) and np.isfinite(lse).all()
import os
# the installed copy, not a build tree
assert smla.library_path.startswith(os.environ["SMLA_INSTALL_DIR"]), smla.library_path
where = "the CPU"
try:
    import torch
    gpu = torch.cuda.is_available()
except ImportError:
    gpu = False
if gpu:
    d = "cuda"
    tcache = torch.zeros((S, 1152), dtype=torch.uint8, device=d)
    tkv = torch.from_numpy(kv_c.view(np.int16)).view(torch.bfloat16).to(d)
    tpe = torch.from_numpy(k_pe.view(np.int16)).view(torch.bfloat16).to(d)
    smla.cache_write(tkv, tpe, torch.arange(S, dtype=torch.int64, device=d), tcache)
    assert torch.equal(tcache.cpu(), torch.from_numpy(cache)), "GPU cache rows differ"
    tq = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16).to(d)
    gout, glse = smla.forward(tq, None, tcache, torch.from_numpy(slots).to(d), return_lse=True)
    torch.cuda.synchronize()
    ref = torch.from_numpy(smla.f32_from_bf16(out)).double()
    diff = (gout.double().cpu() - ref).abs()
    # Each side rounds out to bf16 (2^-8 relative at most) and the GPU also rounds P to
    # bf16 before P.V (2^-8 sum p|v| <= 2^-8 max|v|); float sums add far less than 1e-5.
    vmax = float(np.abs(smla.f32_from_bf16(kv_c)).max())
    bound = 2.0 ** -8 * (2 * ref.abs() + vmax) + 1e-5
    err = diff.max().item()
    lerr = (glse.double().cpu() - torch.from_numpy(lse).double()).abs().max().item()
    assert bool((diff <= bound).all()) and lerr <= 1e-4 + 1e-5 * float(np.abs(lse).max()), (err, lerr)
    where = "the CPU and on %s (max |out diff| %.2e, |lse diff| %.2e)" % (
        torch.cuda.get_device_name(), err, lerr)
print("check_install: ok: %s (%s), forward on %s from %s"
      % (smla.version(), smla.build_features(), where, smla.library_path))
PY
