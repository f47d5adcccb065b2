#!/usr/bin/env bash
# Nsight Compute's per-instruction view of one forward launch (device machine; logs under
# $OUT): where its warps stall, instruction by instruction.
#   scripts/profile_source.sh T N [kernel-regex]     e.g. 1 16 fwd_kernel
# Writes $OUT/src_T<T>_N<N>.csv (SASS with warp-stall samples a line) and
# $OUT/ncu_src_T<T>_N<N>.txt (the warp-state and source-counter sections). Clocks are left
# alone. The binary is build/smla (a -lineinfo build, as the Makefile's default).
set -u
O=${OUT:-.out}; mkdir -p "$O"
T=${1:-1}; N=${2:-16}; K=${3:-fwd}
rep="$O/src_T${T}_N${N}"
ncu --clock-control none --kernel-name "regex:$K" --launch-skip 5 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SchedulerStats \
    --section LaunchStats --import-source yes -f -o "$rep" \
    build/smla bench --no-graph --reps 8 -T "$T" -N "$N" >"$O/ncu_run_T${T}_N${N}.txt" 2>&1
ncu -i "$rep.ncu-rep" --page details >"$O/ncu_src_T${T}_N${N}.txt" 2>&1
ncu -i "$rep.ncu-rep" --page source --print-source sass --csv >"$rep.csv" 2>&1
rm -f "$rep.ncu-rep"
head -c 400 "$rep.csv"; echo
