"""A/B of the column-major resident fprop's producer switches, in one process.

For W 12288² block-sparse (bf16, random layout) and M rows of activations, times each
column-major config (small_threshold's ``rC`` variants) with each combination of
``bsmm_resident_columns.PREFETCH_TABLES`` (the next chunk's table entries loaded a chunk
ahead) and ``ACTIVATION_RUNS`` (a chunk's activation tiles in one copy, not one per tile),
checks that every combination's output is bitwise that of the first and close to dense's,
and writes the times with dense cuBLAS's as JSON.

    python scripts/probes/resident_columns_ab.py --out resident-columns-ab.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.kernels import bsmm_resident_columns as RC

from small_threshold import ALL_VARIANTS, kernel_ms, variant_config  # (this folder's)

SWITCHES = ("PREFETCH_TABLES", "ACTIVATION_RUNS")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weight", default="12288x12288", help="NxK")
    p.add_argument("--blocks", type=int, nargs="+", default=[16])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 64])
    p.add_argument("--variants", nargs="+", default=["rC6x1", "rC12x2c8", "rC6x1c8s4", "rC6x1c4s8", "rC8x1c8s4",
                                                     "rC12x2c4s6"])
    p.add_argument("--out", default="resident-columns-ab.json")
    args = p.parse_args()
    n, k = map(int, args.weight.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    w_dense = torch.randn(n, k, device=dev, dtype=dt)
    rows = []
    for b, d in itertools.product(args.blocks, args.densities):
        layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
        meta, R, C = layout.meta, layout.block_rows, layout.block_cols
        copies = rotation_copies(layout.nnz * b * b * 2, l2_cache_bytes())  # graph replay does not flush L2
        all_values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
        values = all_values[0]
        for m in args.ms:
            x = torch.randn(m, k, device=dev, dtype=dt)
            ref = K.dds(x, values, meta, None, R, C, True).float()
            row = {"block": b, "density": d, "M": m, "dense_ms": kernel_ms(lambda: x @ w_dense.t())}
            for name in args.variants:
                cfg = variant_config(ALL_VARIANTS[name], 64)
                first = None
                for combo in itertools.product((False, True), repeat=len(SWITCHES)):
                    for switch, on in zip(SWITCHES, combo):
                        setattr(RC, switch, on)
                    key = name + "".join(f"_{s.split('_')[0].lower()}{int(on)}" for s, on in zip(SWITCHES, combo))
                    out = K.dds(x, values, meta, None, R, C, True, cfg).float()
                    first = out if first is None else first
                    err = ((out - ref).norm() / ref.norm()).item()
                    if not (err < 1e-2 and torch.equal(out, first)):
                        print("WRONG", key, b, d, m, err, torch.equal(out, first), flush=True)
                        row[key + "_wrong"] = err
                        continue
                    row[key] = kernel_ms(lambda: [K.dds(x, v, meta, None, R, C, True, cfg) for v in all_values],
                                         copies)
            for switch in SWITCHES:
                setattr(RC, switch, True)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, f, indent=1)
    print("\nµs per call (prefetch, runs: 00 01 10 11) and dense:")
    for row in rows:
        for name in args.variants:
            times = [row.get(f"{name}_prefetch{p}_activation{r}") for p in (0, 1) for r in (0, 1)]
            cells = " ".join("--" if t is None else f"{t * 1e3:.0f}" for t in times)
            print(f"b{row['block']} d{row['density']} M{row['M']} {name:<11} {cells}  dense {row['dense_ms'] * 1e3:.0f}")


if __name__ == "__main__":
    main()
