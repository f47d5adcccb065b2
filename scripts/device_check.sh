#!/usr/bin/env bash
# One device call that does everything a GPU change needs, logs under $OUT (or ./.out):
# (8 files at most come back) build, the whole test driver (CPU + GPU), compute-sanitizer over it, and the benchmark
# presets with their JSON records. Prints a short summary last.
#   scripts/device_check.sh [steps...]   (default: build test bench sanitize)
set -u
O=${OUT:-.out}; mkdir -p "$O"
steps=${*:-build test bench sanitize}
has() { case " $steps " in *" $1 "*) return 0;; esac; return 1; }
{ nvidia-smi -L; nvcc --version | tail -1; git rev-parse --short HEAD 2>/dev/null; } >"$O/env.txt" 2>&1
# The device has no git: pass SMLA_GIT_COMMIT=$(git rev-parse --short HEAD) from here.
export SMLA_GIT_COMMIT=${SMLA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
summary=()
if has build; then
  t=$(date +%s); make -j16 all >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  summary+=("build: ok ($(( $(date +%s) - t )) s)")
fi
if has test; then
  t=$(date +%s); timeout 300 build/test_smla >"$O/test.log" 2>&1; rc=$?
  summary+=("test_smla: rc $rc, $(tail -1 "$O/test.log") ($(( $(date +%s) - t )) s)")
  grep -E "^FAIL|stress_cuda|GPU tests" "$O/test.log" | head -30
fi
if has bench; then
  build/smla bench --preset decode --json "$O/decode.json" >"$O/bench_decode.txt" 2>&1
  build/smla bench --preset prefill --json "$O/prefill.json" >"$O/bench_prefill.txt" 2>&1
  build/smla bench --preset decode --format fp8_ds -N 16,128 -T 1,16,64 >"$O/bench_fp8ds.txt" 2>&1
  cut -c1-110 "$O/bench_decode.txt" "$O/bench_prefill.txt" | grep -vE "^\s*$" | head -60
fi
if has sanitize; then
  t=$(date +%s)
  SANITIZER_PARALLEL=${SANITIZER_PARALLEL:-1} SANITIZER_LOG_DIR=/tmp/san timeout ${SAN_TIMEOUT:-240} scripts/sanitize_gpu.sh build/test_smla >"$O/sanitize.log" 2>&1
  rc=$?
  summary+=("sanitize: rc $rc ($(( $(date +%s) - t )) s): $(grep -E 'ok|FAILED|clean' "$O/sanitize.log" | tr '\n' ';')")
fi
printf '%s\n' "${summary[@]}"
