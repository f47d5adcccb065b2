#!/usr/bin/env bash
# carry_builds.sh: builds the default tree (build-carry/) and experiments on this machine,
# and packs each build's smla and test_smla (with flags.txt: its flags and commit) into
# carry/<build>.tgz, so that a device call can run them without building there (`run`
# with carry: ["carry", ...], then AB_PREBUILT=1 scripts/device_ab.sh). Only where this
# machine's nvcc is the device machine's (13.0 both, session 25) and its processor x86-64;
# the device then times exactly the code built here. Needs `carry/` in .git/info/exclude
# (it is made here).
#   AB_FLAGS="-DSMLA_FWD90_X=1" [AB2_FLAGS=...] bash scripts/carry_builds.sh
#   CARRY_BUILDS="build-ab=-DSMLA_FWD90_X=1;build-v2=-DSMLA_FWD90_X=2 -DY=1" bash scripts/carry_builds.sh
# (then AB_BUILDS="build-ab build-v2" for device_ab.sh). The lent cards are H100 / H200,
# so the generic kernels are built for sm_90 only (CARRY_GENCODE; ~6 MB a build, gzip).
# The experiments differ from the default in the sm90 kernel file alone (their flags are
# read nowhere else: checked below), so each is the default's objects with that one file
# compiled again, and relinked.
set -eu
cd "$(dirname "$0")/.."
[ "$(uname -m)" = x86_64 ] || { echo "carry_builds: not x86-64: build on the device instead"; exit 1; }
grep -qx 'carry/' .git/info/exclude 2>/dev/null || echo 'carry/' >>.git/info/exclude
grep -qxF 'build-carry*/' .git/info/exclude 2>/dev/null || echo 'build-carry*/' >>.git/info/exclude
mkdir -p carry
gencode=${CARRY_GENCODE:--gencode arch=compute_90,code=sm_90}
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tests || echo "+dirty")
specs=${CARRY_BUILDS:-}
[ -n "${AB_FLAGS:-}" ] && specs="build-ab=$AB_FLAGS;$specs"
[ -n "${AB2_FLAGS:-}" ] && specs="build-ab2=$AB2_FLAGS;$specs"
pack() { # build dir, carry name, flags
  printf 'flags: %s\ncommit: %s\ngencode: %s\n' "$3" "$commit" "$gencode" >"$1/flags.txt"
  tar czf "carry/$2.tgz" -C "$1" smla test_smla flags.txt
  echo "carry_builds: carry/$2.tgz ($3) $(du -h "carry/$2.tgz" | cut -f1)"
}
base=build-carry
make -j"$(nproc)" all NCCL=0 BUILD=$base NVCC_GENCODE="$gencode" >"carry/build.log" 2>&1 ||
  { tail -5 "carry/build.log"; exit 1; }
pack $base build ""
IFS=';' read -r -a list <<<"$specs"
for spec in "${list[@]}"; do
  [ -n "$spec" ] || continue
  name=${spec%%=*} flags=${spec#*=}
  for m in $(grep -o -- '-D[A-Z0-9_]*' <<<"$flags" | cut -c3-); do
    hits=$(grep -rl -- "$m" src include | grep -v 'src/cuda/sm90/forward_wgmma.cu' |
           grep -v 'src/cuda/probe.cuh' || true)
    [ -z "$hits" ] || { echo "carry_builds: $m is read outside the sm90 kernel ($hits): a full build"; exit 1; }
  done
  d=$base-$name
  rm -rf "$d" && cp -a $base "$d"
  rm -f "$d/obj/src/cuda/sm90/forward_wgmma.o"
  make -j"$(nproc)" all NCCL=0 BUILD="$d" NVCC_GENCODE="$gencode" NVCC_EXTRA="$flags" \
    >"carry/$name.log" 2>&1 || { tail -5 "carry/$name.log"; exit 1; }
  pack "$d" "$name" "$flags"
done
