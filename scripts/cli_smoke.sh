#!/usr/bin/env bash
# cli_smoke.sh: the CLI's commands still run and print what they promise (make test).
# On the CPU only, with a small pool, so it takes a few seconds on any machine:
#   smla info; smla bench (one shape); smla bench --paths (N = 8 and 16: its summary lines).
set -u
cli=${1:-build/smla}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "cli smoke: FAILED: $*"; sed 's/^/  | /' "$out" | tail -20; exit 1; }
"$cli" info >"$out" 2>&1 || fail "smla info exited $?"
"$cli" bench --device cpu -N 16 -T 1 --reps 1 --slots 4096 >"$out" 2>&1 ||
  fail "smla bench exited $?"
grep -qE '^ +1 +16 ' "$out" || fail "smla bench printed no row for T=1 N=16"
"$cli" bench --device cpu --paths -N 8,16 -T 1 --reps 1 --slots 4096 >"$out" 2>&1 ||
  fail "smla bench --paths exited $?"
grep -q '^chosen path within 5% of the fastest at [0-9]* of 2 shapes' "$out" ||
  fail "smla bench --paths printed no summary"
grep -q '^N=8 over N=16 (chosen paths): T=1 ' "$out" || fail "smla bench --paths: no N=8 / N=16 line"
echo "cli smoke: ok (smla info, bench, bench --paths on the CPU)"
