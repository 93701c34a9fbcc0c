"""The dense dispatch (``tilesparse.ops.dense_dispatch``) against the kernels and plain
dense, per block size and density, in one process: the training step (autograd forward +
backward of ``block_sparse_linear``) and the forward, eager (do_bench), so that the switch
can be turned on by default where the dispatched path (scatter, cuBLAS, gather) wins.

    python scripts/probes/dense_dispatch_ab.py --out dense-dispatch-ab.json
"""

from __future__ import annotations

import argparse
import json
import os

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
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--densities", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=dtype)
    w_dense = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
    dense = {"fwd": bench_ms(lambda: F.linear(x, w_dense), cuda=True),
             "step": bench_ms(_step(lambda: F.linear(x, w_dense), (x, w_dense), grad), cuda=True)}
    print(f"dense: fwd {dense['fwd']:.4f} ms, step {dense['step']:.4f} ms")
    rows = []
    for b in args.blocks:
        for d in args.densities:
            layout = ts.layouts.random(n, k, b, d, seed=0, device="cuda")
            w = torch.randn(layout.nnz, b, b, device="cuda", dtype=dtype, requires_grad=True)
            row = {"block": b, "density": d}
            for mode in ("kernels", "dispatch"):
                os.environ["TILESPARSE_DENSE_DISPATCH"] = "1" if mode == "dispatch" else "0"
                fwd = lambda: ops.block_sparse_linear(x, w, layout)  # noqa: E731
                with torch.no_grad():
                    row[f"{mode}_fwd"] = bench_ms(fwd, cuda=True)
                row[f"{mode}_step"] = bench_ms(_step(fwd, (x, w), grad), cuda=True)
            os.environ.pop("TILESPARSE_DENSE_DISPATCH", None)
            for what in ("fwd", "step"):
                row[f"predicted_{what}"] = dd.measured_speedup("nvidia-h200", dtype, m, b, d, what == "step")
            rows.append(row)
            print(f"b{b:<3} d{d:<5} fwd: kernels {row['kernels_fwd']:.4f} dispatch {row['dispatch_fwd']:.4f} | "
                  f"step: kernels {row['kernels_step']:.4f} dispatch {row['dispatch_step']:.4f} ms")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "gpu": torch.cuda.get_device_name(), "dense": dense, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
