#!/usr/bin/env python3
"""bench/table.py: a `smla bench --json` record -> the markdown table of bench/RESULTS.md.

usage: bench/table.py bench.json [--full-path]"""
import json
import sys
d = json.load(open(sys.argv[1]))
rows = d['rows']
gpu = rows[0].get('pct_roofline') is not None and rows[0]['pct_roofline'] == rows[0]['pct_roofline'] and rows[0]['pct_roofline'] >= 0
hdr = "| T | N | median µs | TFLOP/s | TB/s gathered |" + (" % GEMM | % copy | % roofline |" if gpu else "") + " reps | path |"
print(hdr); print("|" + " --- |" * (hdr.count("|") - 1))
for r in rows:
    s = f"| {r['T']} | {r['N']} | {r['median_us']:.1f} | {r['tflop_s']:.4g} | {r['tb_s']:.4g} |"
    if gpu: s += f" {r['pct_flops']:.1f} | {r['pct_bw']:.1f} | {r['pct_roofline']:.1f} |"
    path = r['path'] if "--full-path" in sys.argv else r['path'].split(':')[0]
    s += f" {r['reps']} | {path} |"
    print(s)
