#!/usr/bin/env bash
# The Python package as a user installs it: a fresh venv, `pip install ./python` (which
# builds libsmla with the Makefile and bundles it), then a forward from outside the
# repository with no SMLA_LIBRARY or PYTHONPATH. SMLA_CUDA=0 builds the CPU library only
# (what a machine without nvcc gets). Needs PyPI (numpy, setuptools for the build).
set -euo pipefail
cd "$(dirname "$0")/.."
v=$(mktemp -d)
trap 'rm -rf "$v"' EXIT
python3 -m venv "$v/venv"
"$v/venv/bin/pip" install -q ./python
cd "$v"
env -u SMLA_LIBRARY -u PYTHONPATH "$v/venv/bin/python" - <<'PY'
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
assert "site-packages" in smla.library_path, smla.library_path
print("check_install: ok: %s (%s), forward on the CPU from %s"
      % (smla.version(), smla.build_features(), smla.library_path))
PY
