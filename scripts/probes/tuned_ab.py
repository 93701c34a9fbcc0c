"""The shipped tuned entry against the heuristic (TILESPARSE_TUNED=off) for a few
products, timed the suite's way (bench_ms, eager and CUDA-graph replay) in one process:
checks that an entry `tilesparse tune` kept still wins where the suite runs it.
``python scripts/probes/tuned_ab.py --case updat:32:0.25 --case updat:16:0.1``."""

from __future__ import annotations

import argparse
import json
import os

import torch

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.bench.tune import product
from tilesparse.kernels import tuned


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK: X [M, K], W [N, K]")
    p.add_argument("--case", action="append", required=True, help="op:block:density")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    rows = []
    for case in args.case:
        op, block, density = case.split(":")
        block, density = int(block), float(density)
        for seed in args.seeds:
            layout = ts.layouts.random(n, k, block, density, seed=seed, device="cuda")
            values = torch.randn(layout.nnz, block, block, device="cuda", dtype=torch.bfloat16)
            meta = layout.meta_on("cuda")
            fn = product(op, x, dy, values, meta, block, layout.block_rows, layout.block_cols)
            entry = tuned.lookup(op, torch.bfloat16, block, m, layout.nnz / (layout.block_rows * layout.block_cols),
                                 x.device, tuned.weight_shape(layout.block_rows, layout.block_cols, block))
            row = {"op": op, "block": block, "density": density, "seed": seed, "entry": repr(entry)}
            for name, env in (("shipped", None), ("heuristic", "off"), ("shipped2", None)):
                if env is None:
                    os.environ.pop("TILESPARSE_TUNED", None)
                else:
                    os.environ["TILESPARSE_TUNED"] = env
                ref = fn().float()
                row[f"{name}_eager"] = bench_ms(fn, cuda=True)
                row[f"{name}_graph"] = bench_ms(fn, cuda=True, graph=True)
                row[f"{name}_sum"] = float(ref.sum())
            os.environ.pop("TILESPARSE_TUNED", None)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
