#!/usr/bin/env bash
# device_ab.sh: one GPU call for one or two kernel experiments switched on at build time.
#   AB_FLAGS="-DSMLA_FWD90_SMALL=2" [AB2_FLAGS="-DSMLA_FWD90_SMALL=2 -DSMLA_PROBE=1"] \
#     bash scripts/device_ab.sh
# Builds the default tree (build/) and each experiment (build-ab/, build-ab2/) side by
# side, runs the whole test driver on each experiment (only those of AB_TEST_BUILDS where it
# is set: a diagnosis build's results are wrong; and on the default when AB_TEST_BASE=1),
# times the shapes of AB_BENCH (default: N = 64, 128 at T = 16, 64, 1024, 4096; both
# timings) with the builds interleaved twice (the spread between a build's two
# runs is the noise a difference is held against), then runs compute-sanitizer
# (AB_SAN_TOOLS, default racecheck synccheck memcheck) over each experiment's (or
# AB_SAN_BUILDS's) cases of AB_SAN_FILTER (empty: no sanitizer). Logs: $OUT/ab.tgz.
# Prints a summary table last. AB_SMOKE="filter": those cases first on each experiment;
# one that fails them is left out of the rest of the call. AB_BENCH_RUNS (default 2).
# AB_PREBUILT=1: the builds were made on the calling machine
# by scripts/carry_builds.sh (same flags) and carried as carry/<build>.tgz; they are
# unpacked instead of built (a call then spends no device time compiling); AB_BUILDS="name
# .." then names any number of them (their flags from each build's flags.txt).
set -u
O=${OUT:-.out}
mkdir -p "$O"
L=$(mktemp -d)
trap 'tar czf "$O/ab.tgz" -C "$L" . 2>/dev/null' EXIT
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
if [ -n "${AB_BUILDS:-}" ]; then # prebuilt experiments by name (carry_builds.sh CARRY_BUILDS)
  [ "${AB_PREBUILT:-0}" = 1 ] || { echo "AB_BUILDS needs AB_PREBUILT=1"; exit 1; }
  builds="build $AB_BUILDS"
else
  : "${AB_FLAGS:?set AB_FLAGS, e.g. -DSMLA_FWD90_SMALL=2}"
  builds="build build-ab"
  [ -n "${AB2_FLAGS:-}" ] && builds="$builds build-ab2"
fi
flags_of() {
  if [ -f "$1/flags.txt" ]; then sed -n 's/^flags: //p' "$1/flags.txt"; return; fi
  case $1 in build) echo "";; build-ab) echo "${AB_FLAGS:-}";; build-ab2) echo "${AB2_FLAGS:-}";; esac
}
if [ "${AB_PREBUILT:-0}" = 1 ]; then
  for b in $builds; do
    mkdir -p $b && tar xzf carry/$b.tgz -C $b || { echo "no carry/$b.tgz: scripts/carry_builds.sh"; exit 1; }
  done
else
  pids=""
  for b in $builds; do
    make -j6 all NCCL=0 BUILD=$b NVCC_EXTRA="$(flags_of $b)" >"$L/$b.log" 2>&1 &
    pids="$pids $!"
  done
  set -- $pids
  for b in $builds; do
    wait "$1" || { grep -m5 -E " error" "$L/$b.log"; tail -5 "$L/$b.log"; exit 1; }
    shift
  done
fi
{ nvidia-smi -L; nvcc --version | tail -1; echo "commit ${SMLA_GIT_COMMIT:-unknown}"
  for b in $builds; do echo "$b: $(flags_of $b)"; done; } >"$L/env.txt" 2>&1
cat "$L/env.txt"
stamp "builds ok ($builds)"
fail=0
if [ -n "${AB_SMOKE:-}" ]; then # a few cases first: an experiment that fails them is dropped
  kept=build
  for b in $builds; do
    [ $b = build ] && continue
    timeout ${AB_SMOKE_TIMEOUT:-40} $b/test_smla --filter "$AB_SMOKE" >"$L/smoke_$b.log" 2>&1
    rc=$?
    stamp "smoke ($b) rc=$rc: $(tail -1 "$L/smoke_$b.log")"
    if [ $rc = 0 ]; then kept="$kept $b"; else fail=1; grep -E "^FAIL" "$L/smoke_$b.log" | head -4; fi
  done
  builds=$kept
fi
for b in $builds; do
  [ $b = build ] && [ "${AB_TEST_BASE:-0}" != 1 ] && continue
  case " ${AB_TEST_BUILDS:-$builds} " in *" $b "*) ;; *) continue;; esac
  timeout ${AB_TEST_TIMEOUT:-200} $b/test_smla >"$L/test_$b.log" 2>&1 || fail=1
  stamp "test ($b): $(tail -1 "$L/test_$b.log")"
  grep -E "^FAIL" "$L/test_$b.log" | head -20
done
read -r -a bench_args <<<"${AB_BENCH:--N 64,128 -T 16,64,1024,4096}"
for r in $(seq 1 "${AB_BENCH_RUNS:-2}"); do
  for b in $builds; do
    timeout 120 $b/smla bench "${bench_args[@]}" --timing both >"$L/bench_${b}_$r.txt" 2>&1
  done
done
stamp "benches done"
san_filter=${AB_SAN_FILTER-wide,forward_N_64,forward_N_96,forward_T_64,forward_sink,indices_n128,indices_n64,forward_K_2048,forward_nan}
if [ -n "$san_filter" ]; then
  for b in ${AB_SAN_BUILDS:-$builds}; do
    [ $b = build ] && continue
    mkdir -p "$L/san_$b"
    SANITIZER_TOOLS="${AB_SAN_TOOLS:-racecheck synccheck memcheck}" SANITIZER_PARALLEL=1 \
      SANITIZER_LOG_DIR="$L/san_$b" timeout ${AB_SAN_TIMEOUT:-240} scripts/sanitize_gpu.sh \
      $b/test_smla --filter "$san_filter" >"$L/sanitize_$b.log" 2>&1 || fail=1
    stamp "sanitize ($b): $(grep -E 'sanitize_gpu: ' "$L/sanitize_$b.log" | tr '\n' ';')"
  done
fi
echo "us, amortized cold per build and run: $(for b in $builds; do printf '%s r1, r2 | ' $b; done)"
grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_build_1.txt" | awk '{printf "T=%-5s N=%-4s\n", $1, $2}' >"$L/col_0"
cols="$L/col_0"
for b in $builds; do
  for r in $(seq 1 "${AB_BENCH_RUNS:-2}"); do
    grep -E '^ +[0-9]+ +[0-9]+ ' "$L/bench_${b}_$r.txt" | awk '{printf "%9s %9s\n", $3, $4}' >"$L/col_${b}_$r"
    cols="$cols $L/col_${b}_$r"
  done
done
paste $cols
exit $fail
