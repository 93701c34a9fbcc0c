"""The dense dispatch (``tilesparse.ops.dense_dispatch``) against the kernels and plain
dense, per block size and density, in one process: the training step (autograd forward +
backward of ``block_sparse_linear``) and the forward, eager (do_bench), so that the switch
can be turned on by default where the dispatched path (scatter, cuBLAS, gather) wins.

    python scripts/probes/dense_dispatch_ab.py --out dense-dispatch-ab.json
    # few rows (where dispatch is off): the dense path timed directly
    python scripts/probes/dense_dispatch_ab.py --shape 128x12288x12288 --ms 128 256 512 --blocks 16 32
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.ops import bsmm as ops
from tilesparse.ops import dense_dispatch as dd


def _step(fn, leaves, grad):
    def run():
        y = fn()
        return torch.autograd.grad(y, leaves, grad)
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK")
    p.add_argument("--ms", type=int, nargs="+", default=None, help="several row counts (override the shape's M)")
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--densities", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    m0, n, k = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16
    w_dense = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
    rows, dense = [], {}
    for m in args.ms or [m0]:
        x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn(m, n, device="cuda", dtype=dtype)
        dense[m] = {"fwd": bench_ms(lambda: F.linear(x, w_dense), cuda=True),
                    "step": bench_ms(_step(lambda: F.linear(x, w_dense), (x, w_dense), grad), cuda=True)}
        print(f"M {m} dense: fwd {dense[m]['fwd']:.4f} ms, step {dense[m]['step']:.4f} ms")
        for b in args.blocks:
            for d in args.densities:
                layout = ts.layouts.random(n, k, b, d, seed=0, device="cuda")
                w = torch.randn(layout.nnz, b, b, device="cuda", dtype=dtype, requires_grad=True)
                row = {"M": m, "block": b, "density": d, "dense_fwd": dense[m]["fwd"], "dense_step": dense[m]["step"]}
                # the kernels (whatever the measurements say), and the layer as dense (scatter,
                # cuBLAS, gather: what dense dispatch runs), called directly at any M
                paths = {"kernels": lambda: ops.block_sparse_linear(x, w, layout),
                         "dispatch": lambda: dd.dense_linear(x, w, layout.meta, None, layout.block_rows,
                                                             layout.block_cols)}
                for mode, fwd in paths.items():
                    with dd.kernels_only():
                        with torch.no_grad():
                            row[f"{mode}_fwd"] = bench_ms(fwd, cuda=True)
                        row[f"{mode}_step"] = bench_ms(_step(fwd, (x, w), grad), cuda=True)
                for what in ("fwd", "step"):
                    row[f"predicted_{what}"] = dd.measured_speedup("nvidia-h200", dtype, m, b, d, what == "step",
                                                                   n * k)
                rows.append(row)
                print(f"M {m} b{b:<3} d{d:<5} fwd: kernels {row['kernels_fwd']:.4f} dispatch {row['dispatch_fwd']:.4f}"
                      f" dense {dense[m]['fwd']:.4f} | step: kernels {row['kernels_step']:.4f} dispatch "
                      f"{row['dispatch_step']:.4f} dense {dense[m]['step']:.4f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "ms": args.ms, "gpu": torch.cuda.get_device_name(), "dense": dense,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
