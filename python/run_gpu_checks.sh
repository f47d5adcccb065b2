#!/usr/bin/env bash
# The Python binding's GPU checks in one call, for the GPU machine:
#   bash python/run_gpu_checks.sh LOGDIR
# 1. builds libsmla (make lib; CUDA is found as for `make`);
# 2. the Python tests (python/tests: numpy, torch CPU + CUDA, custom ops, torch.compile,
#    CUDA graphs, FlashMLA compat on FlashMLA's shapes, the example) -> LOGDIR/pytest.log,
#    LOGDIR/pytest.xml;
# 3. the host-overhead benchmark at T=1 (N=16 and N=128) -> LOGDIR/overhead*.log/.json;
# 4. examples/engine_step.py (CUDA graph replayed with new data) for bf16 and fp8_ds caches
#    -> LOGDIR/engine_step_*.log;
# then LOGDIR/summary.txt. Needs python3 with numpy, pytest and a CUDA build of torch
# (>= 2.4 for the custom ops); PYTHON=/path/to/python picks another interpreter. Exits
# non-zero when any step failed (the others still run).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?usage: bash python/run_gpu_checks.sh LOGDIR}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
export SMLA_LIBRARY="$PWD/build/libsmla.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
fail=0
summary() { echo "$*" | tee -a "$LOG/summary.txt"; }
: > "$LOG/summary.txt"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  "$PY" - <<'EOF'
import sys
print("python:", sys.version.split()[0], sys.executable)
for m in ("numpy", "pytest", "torch"):
    try:
        mod = __import__(m)
        extra = ""
        if m == "torch":
            extra = " cuda=%s available=%s" % (mod.version.cuda, mod.cuda.is_available())
        print("%s: %s%s" % (m, mod.__version__, extra))
    except ImportError as e:
        print("%s: MISSING (%s)" % (m, e))
EOF
} 2>&1 | tee "$LOG/env.txt"

if ! make -j"$(nproc)" lib > "$LOG/build.log" 2>&1; then
  summary "build: FAILED (see build.log)"; exit 1
fi
"$PY" -c 'import smla; print("smla", smla.version(), smla.build_features(), smla.library_path)' \
  2>&1 | tee -a "$LOG/env.txt"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
  summary "WARNING: torch with a GPU is not available: the CUDA tests will be SKIPPED"

"$PY" -m pytest -q -rs python/tests --junitxml="$LOG/pytest.xml" > "$LOG/pytest.log" 2>&1
rc=$?
summary "pytest: rc=$rc: $(tail -1 "$LOG/pytest.log")"
[ $rc -eq 0 ] || fail=1

for n in 16 128; do
  "$PY" python/bench_overhead.py --heads "$n" --json "$LOG/overhead_n$n.json" \
    > "$LOG/overhead_n$n.log" 2>&1
  rc=$?
  summary "overhead N=$n: rc=$rc: $(grep -E '^binding overhead' "$LOG/overhead_n$n.log" || tail -1 "$LOG/overhead_n$n.log")"
  [ $rc -eq 0 ] || fail=1
done

for fmt in bf16 fp8_ds; do
  for n in 16 128; do
    "$PY" examples/engine_step.py --format "$fmt" --heads "$n" --steps 5 \
      > "$LOG/engine_step_${fmt}_n$n.log" 2>&1
    rc=$?
    summary "engine_step $fmt N=$n: rc=$rc: $(tail -1 "$LOG/engine_step_${fmt}_n$n.log")"
    [ $rc -eq 0 ] || fail=1
  done
done

summary "overall: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail
