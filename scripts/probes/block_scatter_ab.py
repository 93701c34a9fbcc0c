"""The dense path's block copies: the Triton scatter / gather (kernels/block_scatter.py)
against PyTorch indexing (their references), bitwise compared and timed in one process
(CUDA-graph replay), with the bandwidth each reaches on the dense matrix's bytes.

    python scripts/probes/block_scatter_ab.py --out block-scatter-ab.json
"""

from __future__ import annotations

import argparse
import json

import torch

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import block_scatter as bs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", nargs="+", default=["12288x12288", "4096x4096"], help="NxK")
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 128])
    p.add_argument("--densities", type=float, nargs="+", default=[0.1, 0.5])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dt = torch.bfloat16
    rows_out = []
    for weight in args.weights:
        n, k = map(int, weight.split("x"))
        for b in args.blocks:
            for d in args.densities:
                layout = ts.layouts.random(n, k, b, d, seed=0, device="cuda")
                meta, r, c = layout.meta, layout.block_rows, layout.block_cols
                values = torch.randn(layout.nnz, b, b, device="cuda", dtype=dt)
                dense = bs.scatter_blocks(values, meta, r, c)
                exact = torch.equal(dense, bs.scatter_reference(values, meta, r, c)) and torch.equal(
                    bs.gather_blocks(dense, meta, r, c, b), bs.gather_reference(dense, meta, r, c, b))
                calls = {"scatter_torch": lambda: bs.scatter_reference(values, meta, r, c),
                         "scatter_triton": lambda: bs.scatter_blocks(values, meta, r, c),
                         "gather_torch": lambda: bs.gather_reference(dense, meta, r, c, b),
                         "gather_triton": lambda: bs.gather_blocks(dense, meta, r, c, b)}
                row = {"weight": weight, "block": b, "density": d, "exact": exact,
                       **{f"{name}_ms": bench_ms(fn, cuda=True, graph=True) for name, fn in calls.items()}}
                # scatter moves the dense bytes out and the stored ones in; gather the stored ones both ways
                moved = {"scatter": (n * k + values.numel()) * 2, "gather": 2 * values.numel() * 2}
                for what in ("scatter", "gather"):
                    row[f"{what}_triton_tbs"] = moved[what] / (row[f"{what}_triton_ms"] * 1e-3) / 1e12
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
