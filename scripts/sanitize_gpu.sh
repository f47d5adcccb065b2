#!/usr/bin/env bash
# sanitize_gpu.sh: runs a GPU test program (default build/test_smla) under each
# compute-sanitizer tool (memcheck, racecheck, initcheck, synccheck) and fails on any
# error it reports, or on the program's own failure.
#
#   scripts/sanitize_gpu.sh [program [args...]]
#
# Environment: SANITIZER (path of compute-sanitizer, default: PATH, then CUDA's bin),
# SANITIZER_TOOLS (default "memcheck racecheck initcheck synccheck"), SANITIZER_LOG_DIR
# (a folder for one log per tool; default a temporary one, removed on success),
# SANITIZER_PARALLEL=1 (run the tools concurrently). The program sees
# SMLA_TEST_UNDER_SANITIZER=1 (the GPU stress test then skips its timing loops).
# With no GPU or no compute-sanitizer it prints SKIPPED and exits 0, unless
# SMLA_REQUIRE_GPU=1 (then exit 1). Build first: make.
set -u

prog=${1:-build/test_smla}
[ $# -gt 0 ] && shift
tools=${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}

skip() {
  if [ "${SMLA_REQUIRE_GPU:-0}" = 1 ]; then
    echo "sanitize_gpu: FAILED ($1; SMLA_REQUIRE_GPU=1)"
    exit 1
  fi
  echo "sanitize_gpu: SKIPPED ($1)"
  exit 0
}

san=${SANITIZER:-$(command -v compute-sanitizer || true)}
if [ -z "$san" ]; then
  for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/compute-sanitizer" ]; then
      san=$d/bin/compute-sanitizer
      break
    fi
  done
fi
[ -n "$san" ] || skip "compute-sanitizer not found"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || skip "no GPU visible"
[ -x "$prog" ] || { echo "sanitize_gpu: FAILED ($prog not built; run make)"; exit 1; }

logdir=${SANITIZER_LOG_DIR:-}
keep=1
if [ -z "$logdir" ]; then logdir=$(mktemp -d); keep=0; fi
mkdir -p "$logdir"
rm -f "$logdir"/*.verdict  # a reused folder must not answer for this run

# One tool's run; its verdict goes to $logdir/$tool.verdict ("ok" or the failure line).
run_tool() {
  local tool=$1 extra=() log rc secs errs start
  shift  # the rest: the program's arguments
  [ "$tool" = racecheck ] && extra=(--racecheck-detect-level error)
  log=$logdir/$tool.log
  start=$(date +%s)
  # --report-api-errors no: the library probes the capture state on purpose
  # (cudaStreamIsCapturing answers cudaErrorStreamCaptureImplicit during capture); the
  # programs check every API result themselves.
  SMLA_TEST_UNDER_SANITIZER=1 "$san" --tool "$tool" "${extra[@]}" --report-api-errors no \
    --error-exitcode 97 --print-limit 20 "$prog" "$@" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  # "ERROR SUMMARY: n errors" (racecheck: "RACECHECK SUMMARY: h hazards displayed (n
  # errors, w warnings)") with n > 0 fails even when the exit code would hide it.
  errs=$( { grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | grep -Eo '[0-9]+$';
            grep -Eo '\([0-9]+ errors' "$log" | grep -Eo '[0-9]+'; } | sort -n | tail -1)
  if [ "$rc" -ne 0 ] || [ "${errs:-0}" -ne 0 ]; then
    echo "sanitize_gpu: $tool FAILED (exit $rc, ${errs:-?} errors, ${secs}s); log: $log" >"$logdir/$tool.verdict"
  else
    echo "sanitize_gpu: $tool ok (${secs}s)" >"$logdir/$tool.verdict"
  fi
}

# SANITIZER_PARALLEL=1 runs the tools at the same time (one process each, sharing the GPU):
# the wall time is the slowest tool's rather than the sum.
if [ "${SANITIZER_PARALLEL:-0}" = 1 ]; then
  for tool in $tools; do run_tool "$tool" "$@" & done
  wait
else
  for tool in $tools; do run_tool "$tool" "$@"; done
fi
status=0
for tool in $tools; do
  cat "$logdir/$tool.verdict"
  if ! grep -q " ok (" "$logdir/$tool.verdict"; then
    grep -E '=========' "$logdir/$tool.log" | head -40
    status=1
    keep=1
  fi
done

if [ "$keep" = 0 ]; then rm -rf "$logdir"; fi
[ "$status" = 0 ] && echo "sanitize_gpu: all tools clean" || echo "sanitize_gpu: FAILED"
exit $status
