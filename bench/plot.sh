#!/usr/bin/env bash
# bench/plot.sh BENCH.json OUT.png: chart a `smla bench --json` record with gnuplot.
#   left panel:  median time per forward (us, log scale) against T, one line per N
#   right panel: percent of the roofline (the run's measured copy bandwidth and bf16 GEMM
#                rate) against T; a CPU record has no ceilings, so it shows TFLOP/s there
# Needs python3 (stdlib only: it turns the JSON into gnuplot data) and gnuplot
# (Debian: apt-get install gnuplot-nox).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BENCH.json OUT.png" >&2
  exit 2
fi
json=$1
png=$2
for tool in python3 gnuplot; do
  command -v "$tool" >/dev/null || { echo "$0: $tool not found (gnuplot: apt-get install gnuplot-nox)" >&2; exit 1; }
done
[ -r "$json" ] || { echo "$0: cannot read $json" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# JSON -> $tmp/data.dat (one gnuplot data block per N: T, median_us, right-panel value)
#       and $tmp/vars.gp (titles, the list of N, what the right panel shows).
python3 - "$json" "$tmp" <<'PY'
import json, math, sys

path, out = sys.argv[1], sys.argv[2]
with open(path) as f:
    rec = json.load(f)
meta, rows = rec.get("meta", {}), rec.get("rows", [])
if not rows:
    sys.exit(f"plot.sh: {path} has no rows")

def ok(v):
    return isinstance(v, (int, float)) and math.isfinite(v)

has_roof = any(ok(r.get("pct_roofline")) for r in rows)
key = "pct_roofline" if has_roof else "tflop_s"
heads = sorted({r["N"] for r in rows})
with open(f"{out}/data.dat", "w") as f:
    for n in heads:
        f.write(f"# N = {n}\n")
        for r in sorted((r for r in rows if r["N"] == n), key=lambda r: r["T"]):
            y = r.get(key)
            f.write(f'{r["T"]} {r["median_us"]} {y if ok(y) else "NaN"}\n')
        f.write("\n\n")  # two blank lines: the next gnuplot `index`

def gp(s):  # a gnuplot single-quoted string
    return "'" + str(s).replace("'", "''") + "'"

title = (f'smla {meta.get("smla_version", "?")} bench ({meta.get("preset", "?")}): '
         f'{meta.get("device_name", "?")}')
sub = (f'format {meta.get("format", "?")}, Dr {meta.get("dr", "?")}, K {meta.get("topk", "?")}, '
       f'{meta.get("slots", "?")} slots; commit {meta.get("git_commit", "?")}, {meta.get("date", "?")}')
if has_roof:
    c = meta.get("ceilings") or {}
    bw, fl = c.get("copy_bytes_per_s"), c.get("gemm_flop_per_s")
    right = "percent of roofline"
    if ok(bw) and ok(fl):
        right += f" (copy {bw * 1e-12:.2f} TB/s, GEMM {fl * 1e-12:.0f} TFLOP/s)"
    ylabel = "% of roofline: max(FLOP/peak, bytes/peak) / time"
else:
    right = "TFLOP/s (no ceilings on the CPU)"
    ylabel = "TFLOP/s"
with open(f"{out}/vars.gp", "w") as f:
    f.write(f"title = {gp(title)}\nsubtitle = {gp(sub)}\nright_title = {gp(right)}\n")
    f.write(f"right_ylabel = {gp(ylabel)}\nheads = {gp(' '.join(map(str, heads)))}\n")
    f.write(f"nheads = {len(heads)}\nhas_roof = {1 if has_roof else 0}\n")
PY

if gnuplot -e "set terminal pngcairo" >/dev/null 2>&1; then
  term="pngcairo size 1400,560 font 'sans,10'"
else
  term="png size 1400,560"
fi

gnuplot <<GP
load '$tmp/vars.gp'
set terminal $term
set output '$png'
set termoption noenhanced
set multiplot layout 1,2 title title."\n".subtitle
set logscale x 2
set xlabel 'T (query rows)'
set grid
set key top left
set style data linespoints

set title 'median time per forward'
set logscale y
set ylabel 'us (log scale)'
plot for [i=0:nheads-1] '$tmp/data.dat' index i using 1:2 pointtype 7 linewidth 2 title 'N = '.word(heads, i+1)

set title right_title
unset logscale y
set ylabel right_ylabel
set yrange [0:*]
if (has_roof) {
  set yrange [0:110<*]
  plot for [i=0:nheads-1] '$tmp/data.dat' index i using 1:3 pointtype 7 linewidth 2 title 'N = '.word(heads, i+1), \
       100 with lines dashtype 2 linecolor 'gray40' title 'roofline'
} else {
  plot for [i=0:nheads-1] '$tmp/data.dat' index i using 1:3 pointtype 7 linewidth 2 title 'N = '.word(heads, i+1)
}
unset multiplot
GP
echo "wrote $png"
