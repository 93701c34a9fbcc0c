"""updat (sdd: dW = dY^T X on W's blocks) with its M reduction split several ways, against
the heuristic config, by CUDA-graph replay; fp32 (TF32) and bf16; plus the cost of the
two activation copies that TF32 sdd makes (its operands must be M-contiguous).

On the H200 (eleventh session, graph replay, 8192x4096², b 128) TF32 updat stayed at
~0.61 ms from density 0.1 down to 0.05 while fprop fell to 0.09 ms: the layout has
fewer blocks than the GPU has SMs (51 at density 0.05) and the heuristic splits only
below a quarter of that. This measures where splitting pays.

    python scripts/probes/sdd_splits.py --dtype fp32 bf16 --out sdd-splits.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

import tilesparse as ts
from tilesparse.kernels import bsmm as K
from tilesparse.bench.timing import bench_ms

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1, 0.05])
    p.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_float32_matmul_precision("high")
    m, n, k = (int(v) for v in args.shape.split("x"))
    rows = []
    for name in args.dtype:
        dtype = DTYPES[name]
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        copies = {"dy.t().contiguous()": bench_ms(lambda: dy.t().contiguous(), cuda=True, graph=True),
                  "x.t().contiguous()": bench_ms(lambda: x.t().contiguous(), cuda=True, graph=True)}
        print(f"{name}: activation copies {json.dumps({c: round(v, 4) for c, v in copies.items()})}")
        for d in args.densities:
            layout = ts.layouts.random(n, k, args.block, d, seed=0, device="cuda")
            meta = layout.meta_on("cuda")
            r, c = layout.block_rows, layout.block_cols
            base_cfg = K.sdd_config(m, args.block, layout.nnz, dtype, x.device)
            expected = K.sdd(dy.t(), x, meta, args.block, r, c, config=base_cfg)
            row = {"dtype": name, "density": d, "nnz": layout.nnz, "heuristic": str(base_cfg),
                   "default_ms": bench_ms(lambda: K.sdd(dy.t(), x, meta, args.block, r, c), cuda=True, graph=True),
                   "copies_ms": copies, "splits": {}}
            for s in args.splits:
                cfg = dataclasses.replace(base_cfg, splits=s)
                got = K.sdd(dy.t(), x, meta, args.block, r, c, config=cfg)
                err = ((got.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-30)).item()
                ms = bench_ms(lambda: K.sdd(dy.t(), x, meta, args.block, r, c, config=cfg), cuda=True, graph=True)
                row["splits"][s] = {"ms": ms, "rel_err": err}
            rows.append(row)
            best = min(row["splits"], key=lambda s_: row["splits"][s_]["ms"])
            print(f"{name} d{d:<5} nnz {layout.nnz:5}: default {row['default_ms']:.4f} | "
                  + " ".join(f"s{s_} {v['ms']:.4f}" for s_, v in row["splits"].items()) + f" | best s{best}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "block": args.block, "gpu": torch.cuda.get_device_name(), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
