#!/usr/bin/env bash
# Nsight Compute over the forward at a few bench shapes (device machine; logs under $OUT).
#   scripts/profile_gpu.sh [T:N ...]      default: 1024:128 16:128 1:16
# One full-section report of one fwd_kernel launch per shape, plus the duration of every
# kernel of one forward (forward + merge) so the launch split shows. Clocks are left alone.
set -u
O=${OUT:-.out}; mkdir -p "$O"
shapes=${*:-1024:128 16:128 1:16}
for s in $shapes; do
  T=${s%%:*}; N=${s##*:}
  ncu --clock-control none --kernel-name regex:fwd_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section SchedulerStats --section InstructionStats \
      build/smla bench --no-graph --reps 5 -T "$T" -N "$N" >"$O/ncu_T${T}_N${N}.txt" 2>&1
  ncu --clock-control none --kernel-name regex:'fwd_kernel|merge' --launch-skip 6 \
      --launch-count 4 --metrics gpu__time_duration.sum \
      build/smla bench --no-graph --reps 5 -T "$T" -N "$N" >"$O/ncu_time_T${T}_N${N}.txt" 2>&1
done
