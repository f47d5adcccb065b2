#!/bin/bash
# TEMPORARY: one device call = build, check, bench, sanitize; logs under $OUT.
set -u
O=${OUT:-/tmp/devout}; mkdir -p "$O"
STEPS=${STEPS:-build check bench san sass}
{ nvidia-smi -L; command -v make gcc cuobjdump compute-sanitizer nvcc; nvcc --version | tail -1; nproc; } >"$O/env.txt" 2>&1
LDO="CUDA_LDLIBS=-L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lstdc++"
t0=$(date +%s)
if ! make -j16 lib "$LDO" >"$O/build.log" 2>&1; then tail -40 "$O/build.log"; exit 1; fi
gcc -std=c11 -O2 -g -pthread -Iinclude -Isrc -D_GNU_SOURCE -DSMLA_HAVE_CUDA -I/usr/local/cuda/include \
  scripts/cuda_devcheck.c tests/graph_cuda.c build/libsmla.a -L/usr/local/cuda/lib64 -lcudart -lstdc++ \
  -lm -lpthread -o build/devcheck >>"$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 ))s"
case " $STEPS " in *" check "*)
  t0=$(date +%s); timeout 180 build/devcheck check >"$O/check.log" 2>&1; echo "check rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "MISMATCH|FAIL|TOTAL|worst|graph" "$O/check.log" | head -30 ;; esac
case " $STEPS " in *" bench "*)
  t0=$(date +%s); timeout 120 build/devcheck bench >"$O/bench.log" 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 ))s"
  cut -c1-90 "$O/bench.log" ;; esac
case " $STEPS " in *" sass "*)
  for f in bf16 fp8 ds; do cuobjdump -sass -arch sm_90 build/obj/src/cuda/forward_$f.o | awk -v f=$f '/Function :/{n=$3} /HMMA/{h[n]++} /LDSM/{l[n]++} /LDGSTS/{g[n]++} /LDL|STL/{s[n]++} END{for(k in h) print f, k, "HMMA", h[k], "LDSM", l[k], "LDGSTS", g[k]+0, "local", s[k]+0}'; done >"$O/sass.txt" 2>&1
  sed -E 's/_Z10fwd_kernelILi([0-9])ELi([0-9]+)ELi([0-9])EEv18smla_cuda_fwd_argsi/fmt\1_dr\2_mt\3/' "$O/sass.txt" | sort | head -20 ;; esac
case " $STEPS " in *" san "*)
  compute-sanitizer --help 2>&1 | grep -E "racecheck-detect|track-unused" > "$O/san_help.txt"
  for t in memcheck racecheck initcheck synccheck; do
    t0=$(date +%s)
    ex=""; [ $t = racecheck ] && ex="--racecheck-detect-level error"
    timeout 80 compute-sanitizer --tool $t $ex --error-exitcode 97 --print-limit 10 build/devcheck check quick >"$O/san_$t.log" 2>&1
    echo "san $t rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'SUMMARY|TOTAL' "$O/san_$t.log" | tr '\n' ' ')"
  done ;; esac
