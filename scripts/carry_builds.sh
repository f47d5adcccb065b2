#!/usr/bin/env bash
# carry_builds.sh: builds the default tree (build/) and the experiments of device_ab.sh
# (build-ab/ with AB_FLAGS, build-ab2/ with AB2_FLAGS) on this machine, and packs each
# build's smla and test_smla into carry/<build>.tgz (~12 MB each, gzip), so that a device
# call can run them without building there (`run` with carry: ["carry", ...], then
# AB_PREBUILT=1 scripts/device_ab.sh). Only where this machine's nvcc is the device
# machine's (13.0 both, session 25) and its processor x86-64; the device then times
# exactly the code built here. Needs `carry/` in .git/info/exclude (it is made here).
#   AB_FLAGS="-DSMLA_FWD90_X=1" [AB2_FLAGS=...] bash scripts/carry_builds.sh
set -eu
cd "$(dirname "$0")/.."
[ "$(uname -m)" = x86_64 ] || { echo "carry_builds: not x86-64: build on the device instead"; exit 1; }
grep -qx 'carry/' .git/info/exclude 2>/dev/null || echo 'carry/' >>.git/info/exclude
mkdir -p carry
builds="build"
[ -n "${AB_FLAGS:-}" ] && builds="$builds build-ab"
[ -n "${AB2_FLAGS:-}" ] && builds="$builds build-ab2"
for b in $builds; do
  case $b in build) f="";; build-ab) f="$AB_FLAGS";; build-ab2) f="$AB2_FLAGS";; esac
  make -j"$(nproc)" all NCCL=0 BUILD=$b NVCC_EXTRA="$f" >"carry/$b.log" 2>&1 ||
    { tail -5 "carry/$b.log"; exit 1; }
  tar czf "carry/$b.tgz" -C "$b" smla test_smla
  echo "carry_builds: carry/$b.tgz ($f)"
done
