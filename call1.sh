#!/bin/bash
set -u
export SMLA_GIT_COMMIT=$(cat .commit)
t0=$(date +%s); st() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L
make -j10 all NCCL=0 > $OUT/build.log 2>&1 &
p1=$!
make -j6 all NCCL=0 BUILD=b1 NVCC_EXTRA=-DSMLA_FWD_WARM_PARAMS=1 > $OUT/build_b1.log 2>&1 &
p2=$!
wait $p1 || { tail -20 $OUT/build.log; exit 1; }
st built
timeout 120 build/test_smla > $OUT/test.log 2>&1; st "tests rc=$?: $(tail -1 $OUT/test.log)"
grep -E '^FAIL' $OUT/test.log | head
grep -E 'heads_per_block' $OUT/test.log
timeout 170 build/smla bench --paths --timing amortized -N 16,64,128 -T 1,2,4,8,16 --json $OUT/paths.json > $OUT/paths.txt 2>&1; st "paths rc=$?"
grep -v '^ *$' $OUT/paths.txt | tail -22
wait $p2 || { tail -20 $OUT/build_b1.log; exit 1; }
for r in 1 2; do for b in build b1; do
  timeout 40 $b/smla bench -N 8,16,64,128 -T 1,16 --timing both > $OUT/ab_${b}_$r.txt 2>&1
done; done
st "ab done"
for b in build b1; do echo "== $b"; for r in 1 2; do grep -E '^ +[0-9]+ +[0-9]+ ' $OUT/ab_${b}_$r.txt | awk '{printf "%s/%s %s %s | ", $1, $2, $3, $4} END {print ""}'; done; done
timeout 60 b1/test_smla --filter forward_N_,wide_n64_two_tiles,small_t,heads_per_block,generic_merges_n16 > $OUT/test_b1.log 2>&1; st "b1 tests rc=$?: $(tail -1 $OUT/test_b1.log)"
SANITIZER_TOOLS="memcheck racecheck" SANITIZER_PARALLEL=1 timeout 70 scripts/sanitize_gpu.sh build/test_smla --filter heads_per_block > $OUT/san.log 2>&1; st "san rc=$?"; grep 'sanitize_gpu:' $OUT/san.log
cd $OUT && tar czf logs.tgz *.log *.txt && rm -f *.log ab_*.txt
