#!/usr/bin/env bash
# One-time set-up of a fresh Debian machine for smla: a C compiler and make (Debian),
# numpy, pytest and torch for the Python tests (PyPI). Idempotent: installs only what is missing.
# CUDA is optional and never installed here: with nvcc on PATH or in /usr/local/cuda the
# build adds the GPU backend by itself.
set -euo pipefail

need_apt=()
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
# venv with pip (scripts/check_install.sh): Debian's python3 keeps it in python3-venv.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi
# clang + its runtime: the libFuzzer target and the sanitizer build (make fuzz, make sanitize).
if [ "${SMLA_SETUP_FUZZ:-1}" = 1 ]; then
  command -v clang >/dev/null 2>&1 || need_apt+=(clang)
  ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
    need_apt+=(libclang-rt-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  echo "setup: installing ${need_apt[*]} from Debian"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
if ! python3 -c 'import numpy, pytest' >/dev/null 2>&1; then
  echo "setup: installing numpy and pytest from PyPI"
  pip_install numpy pytest
fi
# torch (its CPU part is enough) runs the torch custom-op, FlashMLA-compat, DCP and example
# tests; without it they are skipped. SMLA_SETUP_TORCH=0 leaves it out (a ~1 min, ~4 GB
# install from PyPI, whose Linux wheel carries the CUDA libraries).
if [ "${SMLA_SETUP_TORCH:-1}" = 1 ] && ! python3 -c 'import torch' >/dev/null 2>&1; then
  echo "setup: installing torch from PyPI"
  pip_install torch
fi
echo "setup: ok ($(cc --version 2>/dev/null | head -1); nvcc: $(command -v nvcc || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; } || echo none))"
