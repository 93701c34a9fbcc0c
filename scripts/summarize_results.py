"""Print markdown tables of a benchmark CSV: speedup over dense and the rate on the
nonzero work as a fraction of dense's rate, per op, block and density.

    python scripts/summarize_results.py bench/results/2026-11-29-nvidia-h200-large.csv --shape 8192x4096x4096
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--shape", help="MxNxK; default: every shape")
    p.add_argument("--methods", nargs="+", default=["tilesparse", "stk", "torch_bsr"])
    args = p.parse_args()
    rows = list(csv.DictReader(open(args.csv)))
    dense_rate = {}
    cells = defaultdict(dict)
    for r in rows:
        shape = f"{r['M']}x{r['N']}x{r['K']}"
        if args.shape and shape != args.shape:
            continue
        key = (shape, r["dtype"], r["op"])
        if r["method"] == "dense":
            dense_rate[key] = float(r["tflops_nnz"])
        elif r["method"] in args.methods and r["ms"]:
            cells[(shape, r["dtype"], r["op"], r["method"], int(r["block"]))][float(r["density"])] = r
    densities = sorted({d for v in cells.values() for d in v}, reverse=True)
    header = "| shape | dtype | op | method | b | " + " | ".join(f"d={d:g}" for d in densities) + " |"
    print(header)
    print("|" + "---|" * (5 + len(densities)))
    for (shape, dtype, op, method, block), by_density in sorted(cells.items()):
        out = []
        for d in densities:
            r = by_density.get(d)
            if r is None:
                out.append("-")
                continue
            rate = float(r["tflops_nnz"]) / dense_rate[(shape, dtype, op)]
            out.append(f"{float(r['speedup_vs_dense']):.2f}x ({rate:.0%})")
        print(f"| {shape} | {dtype} | {op} | {method} | {block} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
