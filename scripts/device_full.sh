#!/usr/bin/env bash
# Everything a change needs on the GPU machine in one call, logs in one tarball:
#   SMLA_GIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/device_full.sh [extra bench args]
#   STEPS="test bench" ... runs only those of: test checks overhead bench baseline fp8 mutants
#   pyquick sanlite install gather fused paths dcp ab absan sweep profile (the build always runs; default: all but fp8, mutants (the
#   GPU mutation check, ~6 min alone), absan, the A/B build under the sanitizer, and
#   sweep, the split counts of T = 16, 32 at N = 128)
# 1. make all; build/test_smla (CPU + GPU cases);
# 2. compute-sanitizer (memcheck, racecheck, initcheck, synccheck, in parallel) over the
#    test driver, while the Python GPU checks run (python/run_gpu_checks.sh: pytest, the
#    example); neither is timed;
# 3. then, alone on the GPU: the binding's host overhead (T=1, N=16 and 128), the decode
#    and prefill presets, the fp8 decode shapes, and the DCP example (build/dcp_nccl, one
#    rank per GPU, and 4 ranks simulated on GPU 0) with its merge benchmark.
# Writes $OUT/logs.tgz (every log, also when a step fails or the call runs out of time)
# and prints a summary. Exit status: 0 when the tests, the sanitizer, the Python checks and
# the DCP example passed. Typical time on the H200: ~6-7 min (349 s at dd397b9, before the
# DCP steps); the per-step timeouts add up to more than one 600 s call, so a slow run is
# cut short rather than lost. The overhead figures inside run_gpu_checks.sh's logs are
# taken while the sanitizer runs: use the ones of step 3.
set -u
O=${OUT:-.out}
mkdir -p "$O"
L=$(mktemp -d)
# Whatever happens (a step past its time, a failed build), the logs so far come back.
trap 'tar czf "$O/logs.tgz" -C "$L" . 2>/dev/null' EXIT
export SMLA_GIT_COMMIT=${SMLA_GIT_COMMIT:-unknown} PYTHONUNBUFFERED=1
fail=0
STEPS=${STEPS:-test checks overhead bench baseline dcp ab profile}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
{ nvidia-smi -L; nvcc --version | tail -1; echo "commit $SMLA_GIT_COMMIT"; } >"$L/env.txt" 2>&1
# NCCL for the DCP example: beside CUDA, or the nvidia-nccl wheel of the machine's Python.
if [ -z "${NCCL_HOME:-}" ] && ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h >/dev/null 2>&1; then
  NCCL_HOME=$(${PYTHON:-python3} -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  [ -n "$NCCL_HOME" ] && export NCCL_HOME
fi
echo "NCCL_HOME=${NCCL_HOME:-(beside CUDA)}" >>"$L/env.txt"
if ! make -j16 all >"$L/build.log" 2>&1; then
  # The DCP example is the only optional piece: without it the rest still runs (and fails the call).
  tail -5 "$L/build.log"
  make -j16 all NCCL=0 >>"$L/build.log" 2>&1 || { tail -30 "$L/build.log"; exit 1; }
  fail=1; echo "build: failed with NCCL, built without the DCP example"
fi
stamp "build ok"
if has test; then
  timeout 200 build/test_smla >"$L/test.log" 2>&1 || fail=1
  stamp "test_smla: $(tail -1 "$L/test.log")"
  grep -E "^FAIL" "$L/test.log" | head -20
fi

if has checks; then
  mkdir -p "$L/san" "$L/py"
  (SANITIZER_PARALLEL=1 SANITIZER_LOG_DIR="$L/san" timeout 300 scripts/sanitize_gpu.sh \
     build/test_smla >"$L/sanitize.log" 2>&1; echo "rc $?" >>"$L/sanitize.log") &
  san=$!
  PYTHON=${PYTHON:-python3} timeout 300 bash python/run_gpu_checks.sh "$L/py" >"$L/pyrun.log" 2>&1 || fail=1
  wait $san
  grep -q "all tools clean" "$L/sanitize.log" || fail=1
  stamp "sanitize: $(grep -E 'sanitize_gpu: ' "$L/sanitize.log" | tr '\n' ';')"
  stamp "python: $(tr '\n' ';' <"$L/py/summary.txt")"
fi
if has overhead; then
  for n in 16 128; do
    timeout 60 ${PYTHON:-python3} python/bench_overhead.py --heads "$n" --json "$L/overhead_n$n.json" \
      >"$L/overhead_n$n.log" 2>&1
    stamp "$(grep -E '^binding overhead' "$L/overhead_n$n.log") N=$n"
  done
fi
if has bench || has ab; then
  timeout 90 build/smla bench --preset decode "$@" --json "$L/decode.json" >"$L/bench_decode.txt" 2>&1
fi
if has bench; then
  timeout 120 build/smla bench --preset prefill "$@" --json "$L/prefill.json" >"$L/bench_prefill.txt" 2>&1
  timeout 60 build/smla bench --preset decode --format fp8_ds -N 16,128 -T 1,16,64 >"$L/bench_fp8ds.txt" 2>&1
  stamp "benches done"
  grep -E "^ceilings|^commit" "$L/bench_decode.txt"
  grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_decode.txt" "$L/bench_prefill.txt" | cut -c1-90
fi
# The plain PyTorch forward of issue 3 (gather, einsum, softmax, einsum) on the same shapes,
# graph-replayed and eager, with smla's speed-up over each (python/bench_torch_baseline.py).
if has baseline && [ -f "$L/decode.json" ] && [ -f "$L/prefill.json" ]; then
  timeout 120 ${PYTHON:-python3} python/bench_torch_baseline.py --smla "$L/decode.json" \
    "$L/prefill.json" --json "$L/torch_baseline.json" >"$L/torch_baseline.txt" 2>&1
  stamp "$(grep -E '^bench_torch_baseline' "$L/torch_baseline.txt" | tr '\n' ';')"
fi
# The fp8 caches (the generic kernel at every N): decode shapes and one prefill shape.
if has fp8; then
  for f in fp8_ds fp8_tensor; do
    timeout 90 build/smla bench --format $f -N 16,64,128 -T 1,16,64,1024 >"$L/bench_$f.txt" 2>&1
    echo "$f:"; grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_$f.txt" | cut -c1-90
  done
fi
# The mutation check of the CUDA kernels (scripts/mutants.py --target gpu): every mutant
# must fail the test driver.
if has mutants; then
  # Default: what is left of a 570 s call (at least 120 s).
  left=$(( 570 - ($(date +%s) - t0) )); [ $left -lt 120 ] && left=120
  timeout ${MUTANTS_TIMEOUT:-$left} python3 scripts/mutants.py --target gpu --jobs 16 --from-build build \
    ${MUTANTS_ONLY:+--only "$MUTANTS_ONLY"} \
    --md "$L/mutants_gpu.md" >"$L/mutants_gpu.log" 2>&1 || fail=1
  grep -E '^(killed|SURVIVED|ERROR) |^mutants' "$L/mutants_gpu.log"
  cp "$L/mutants_gpu.md" "$O/" 2>/dev/null
fi
# Short checks for a tight lease: the Python tests of the CUDA paths (no overhead benches),
# and memcheck + racecheck over the fp8 forward cases.
if has pyquick; then
  SMLA_LIBRARY="$PWD/build/libsmla.so" PYTHONPATH="$PWD/python" timeout 200 ${PYTHON:-python3} -m pytest \
    -q -x python/tests -k "cuda or graph" >"$L/pyquick.log" 2>&1 || fail=1
  stamp "pyquick: $(tail -1 "$L/pyquick.log")"
fi
if has sanlite; then
  SANITIZER_TOOLS="memcheck racecheck" SANITIZER_PARALLEL=1 SANITIZER_LOG_DIR="$L/sanlite" \
    timeout 200 scripts/sanitize_gpu.sh build/test_smla --filter "${SANLITE_FILTER:-fp8,head_major}" >"$L/sanlite.log" 2>&1 || fail=1
  stamp "sanitize (${SANLITE_FILTER:-fp8,head_major} cases): $(grep -E 'sanitize_gpu: ' "$L/sanlite.log" | tr '\n' ';')"
fi
# The package as a user installs it, offline (no network on the GPU machine): a venv over
# the system's packages, `pip install ./python` (which builds libsmla again, with CUDA),
# then a forward on the CPU and on the GPU from outside the repository.
if has install; then
  SMLA_INSTALL_OFFLINE=1 SMLA_MAKE_JOBS=16 timeout 300 bash scripts/check_install.sh \
    >"$L/install.log" 2>&1 || fail=1
  stamp "install: $(grep -E '^check_install' "$L/install.log" || tail -3 "$L/install.log")"
fi
# The gather-only microbenchmark (bench/gather.cu): cp.async, per-row bulk copies and 2-block
# multicast into shared memory, on 1 / 16 / 66 / all SMs.
if has gather && [ -x build/gather_bench ]; then
  timeout 60 build/gather_bench >"$L/gather.txt" 2>&1 || fail=1
  cat "$L/gather.txt"
fi
# The fused decode step (smla_forward_indices) against convert + forward, decode shapes.
if has fused; then
  timeout 90 build/smla bench -N 16,128 -T 1,4,16,64 --indices 64 >"$L/bench_fused.txt" 2>&1 || fail=1
  timeout 90 build/smla bench -N 16,128 -T 1,4,16,64 --indices 64 --two-call >"$L/bench_twocall.txt" 2>&1 || fail=1
  echo "decode step us (amortized, cold): smla_forward_indices | convert + forward"
  paste <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_fused.txt" | awk '{printf "T=%-3s N=%-4s %8s %8s |\n", $1, $2, $3, $4}') \
        <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_twocall.txt" | awk '{print $3, $4}')
fi
# Every path of the decode shapes against the plan's choice (smla bench --paths).
if has paths; then
  timeout 240 build/smla bench --paths --timing amortized --json "$L/paths.json" >"$L/paths.txt" 2>&1 || fail=1
  grep -E '^ +[0-9]+ +[0-9]+ ' "$L/paths.txt" | cut -c1-150
fi
# Decode context parallelism: one rank per GPU over NCCL, then 4 ranks simulated on GPU 0
# with the merge benchmark (docs/dcp.md).
if has dcp && [ -x build/dcp_nccl ]; then
  timeout 120 build/dcp_nccl --bench >"$L/dcp_nccl.txt" 2>&1 || fail=1
  timeout 120 build/dcp_nccl --simulate --ranks 4 --interleave 16 --bench >"$L/dcp_sim.txt" 2>&1 || fail=1
  stamp "dcp_nccl: $(tail -1 "$L/dcp_nccl.txt"); simulated: $(tail -1 "$L/dcp_sim.txt")"
elif has dcp; then
  stamp "dcp_nccl: not built (no NCCL found)"; fail=1
fi
# A/B of a kernel experiment switched on at build time (AB_FLAGS="-DSMLA_FWD90_SMALL=2"): its
# own build, the whole test driver (a failure fails the run), then the decode shapes side
# by side with the default build's.
if has ab && [ -n "${AB_FLAGS:-}" ]; then
  if make -j16 all BUILD=build-ab NVCC_EXTRA="$AB_FLAGS" >"$L/build_ab.log" 2>&1 &&
     timeout 200 build-ab/test_smla >"$L/test_ab.log" 2>&1; then
    ab_ok=1
    stamp "A/B build ($AB_FLAGS): $(tail -1 "$L/test_ab.log")"
    timeout 90 build-ab/smla bench --preset decode "$@" >"$L/bench_decode_ab.txt" 2>&1
    # Prefill, both builds twice, interleaved (the spread between a build's two runs is the
    # noise the difference is held against).
    for r in 1 2; do
      for b in build build-ab; do
        timeout 60 $b/smla bench -N 16,64,128 -T 1024 "$@" >"$L/bench_prefill_${b}_$r.txt" 2>&1
      done
    done
    echo "prefill, us (amortized | cold): default run 1, default run 2 | A/B run 1, A/B run 2"
    paste <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_prefill_build_1.txt" | awk '{printf "T=%-5s N=%-4s %9s %9s\n", $1, $2, $3, $4}') \
          <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_prefill_build_2.txt" | awk '{printf "%9s %9s |", $3, $4}') \
          <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_prefill_build-ab_1.txt" | awk '{printf "%9s %9s", $3, $4}') \
          <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_prefill_build-ab_2.txt" | awk '{printf "%9s %9s\n", $3, $4}')
    echo "decode us (amortized, cold): default | $AB_FLAGS"
    paste <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_decode.txt" | awk '{printf "T=%-3s N=%-4s %8s %8s |\n", $1, $2, $3, $4}') \
          <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_decode_ab.txt" | awk '{print $3, $4}')
  else
    stamp "A/B ($AB_FLAGS): build or tests FAILED ($(tail -1 "$L/test_ab.log" 2>/dev/null))"; fail=1
  fi
fi
# The A/B build under compute-sanitizer too (memcheck, racecheck, initcheck, synccheck), so
# that an experiment can be adopted from one call (only when its tests passed).
if has absan && [ "${ab_ok:-0}" = 1 ]; then
  mkdir -p "$L/san_ab"
  SANITIZER_PARALLEL=1 SANITIZER_LOG_DIR="$L/san_ab" timeout 300 scripts/sanitize_gpu.sh \
    build-ab/test_smla >"$L/sanitize_ab.log" 2>&1
  grep -q "all tools clean" "$L/sanitize_ab.log" || fail=1
  stamp "sanitize A/B: $(grep -E 'sanitize_gpu: ' "$L/sanitize_ab.log" | tr '\n' ';')"
fi
# The KV split count of T = 16 and 32, N = 128, forced from 1 to 8, in each build present
# (the plan's pick is the row without --splits in the decode tables).
if has sweep; then
  for b in build build-ab; do
    [ -x $b/smla ] || continue
    for sp in 1 2 3 4 6 8; do
      timeout 30 $b/smla bench -N 128 -T 16,32 --splits $sp >"$L/bench_splits${sp}_$b.txt" 2>&1
      echo "$b splits=$sp: $(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_splits${sp}_$b.txt" | awk '{printf "T=%s %s us  ", $1, $3}')"
    done
  done
fi
# Profile of the Hopper forward at T=16 N=128 (one launch, eager) with Nsight Compute, for
# each build present, and the same shape over an L2-resident pool (16384 slots, 19 MB):
# how much of the time is the gathers'.
if has profile; then
  for b in build build-ab; do
    [ -x $b/smla ] || continue
    timeout 150 ncu --kernel-name regex:fwd90 --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section Occupancy \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      $b/smla bench -N 128 -T 16 --reps 3 --no-graph >"$L/ncu_$b.txt" 2>&1
    timeout 60 $b/smla bench -N 128 -T 1,16,64 --slots 16384 >"$L/bench_l2pool_$b.txt" 2>&1
    stamp "profile $b: $(grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput' "$L/ncu_$b.txt" | tr -s ' ' | tr '\n' ';')"
    grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_l2pool_$b.txt" | cut -c1-40
  done
fi
exit $fail
