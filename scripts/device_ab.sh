#!/usr/bin/env bash
# device_ab.sh: one GPU call for a kernel experiment switched on at build time.
#   AB_FLAGS="-DSMLA_FWD90_SEESAW=1" bash scripts/device_ab.sh
# Builds the default tree (build/) and the experiment (build-ab/) side by side, runs the
# whole test driver on the experiment (and on the default when AB_TEST_BASE=1), times the
# shapes of AB_BENCH (default: N = 64, 128 at T = 16, 64, 1024, 4096; both timings) with
# the two builds interleaved twice (the spread between a build's two runs is the noise a
# difference is held against), then runs compute-sanitizer (AB_SAN_TOOLS, default
# racecheck synccheck memcheck) over the experiment's Hopper cases (AB_SAN_FILTER).
# Logs: $OUT/ab.tgz. Prints a summary table last.
set -u
O=${OUT:-.out}
mkdir -p "$O"
L=$(mktemp -d)
trap 'tar czf "$O/ab.tgz" -C "$L" . 2>/dev/null' EXIT
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
: "${AB_FLAGS:?set AB_FLAGS, e.g. -DSMLA_FWD90_SEESAW=1}"
{ nvidia-smi -L; nvcc --version | tail -1; echo "commit ${SMLA_GIT_COMMIT:-unknown}"; echo "AB_FLAGS $AB_FLAGS"; } >"$L/env.txt" 2>&1
cat "$L/env.txt"
make -j8 all NCCL=0 >"$L/build.log" 2>&1 & b0=$!
make -j8 all NCCL=0 BUILD=build-ab NVCC_EXTRA="$AB_FLAGS" >"$L/build_ab.log" 2>&1 & b1=$!
wait $b0 || { tail -20 "$L/build.log"; exit 1; }
wait $b1 || { grep -m5 -E "error" "$L/build_ab.log"; tail -5 "$L/build_ab.log"; exit 1; }
stamp "builds ok"
fail=0
timeout ${AB_TEST_TIMEOUT:-200} build-ab/test_smla >"$L/test_ab.log" 2>&1 || fail=1
stamp "test (A/B build): $(tail -1 "$L/test_ab.log")"
grep -E "^FAIL" "$L/test_ab.log" | head -20
if [ "${AB_TEST_BASE:-0}" = 1 ]; then
  timeout 200 build/test_smla >"$L/test.log" 2>&1 || fail=1
  stamp "test (default): $(tail -1 "$L/test.log")"
fi
read -r -a bench_args <<<"${AB_BENCH:--N 64,128 -T 16,64,1024,4096}"
for r in 1 2; do
  for b in build build-ab; do
    timeout 120 $b/smla bench "${bench_args[@]}" --timing both >"$L/bench_${b}_$r.txt" 2>&1
  done
done
stamp "benches done"
if [ -n "${AB_SAN_FILTER-wide,forward_N_64,forward_N_96,forward_T_64,forward_sink,indices_n128,indices_n64,forward_K_2048,forward_nan}" ]; then
  mkdir -p "$L/san"
  SANITIZER_TOOLS="${AB_SAN_TOOLS:-racecheck synccheck memcheck}" SANITIZER_PARALLEL=1 \
    SANITIZER_LOG_DIR="$L/san" timeout ${AB_SAN_TIMEOUT:-240} scripts/sanitize_gpu.sh build-ab/test_smla \
    --filter "${AB_SAN_FILTER-wide,forward_N_64,forward_N_96,forward_T_64,forward_sink,indices_n128,indices_n64,forward_K_2048,forward_nan}" \
    >"$L/sanitize_ab.log" 2>&1 || fail=1
  stamp "sanitize (A/B build): $(grep -E 'sanitize_gpu: ' "$L/sanitize_ab.log" | tr '\n' ';')"
fi
echo "us, amortized | cold: default run 1, run 2 | A/B run 1, run 2"
paste <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build_1.txt" | awk '{printf "T=%-5s N=%-4s\n", $1, $2}') \
      <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build_1.txt" | awk '{printf "%9s %9s\n", $3, $4}') \
      <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build_2.txt" | awk '{printf "%9s %9s |\n", $3, $4}') \
      <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build-ab_1.txt" | awk '{printf "%9s %9s\n", $3, $4}') \
      <(grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build-ab_2.txt" | awk '{printf "%9s %9s\n", $3, $4}')
exit $fail
