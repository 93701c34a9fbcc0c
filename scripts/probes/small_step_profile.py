"""Where does a block-sparse layer's training step go at few rows? (M 128-512, W 12288²)

The dense-dispatch probe (fourteenth session) timed the eager step (forward + both
gradients) of ``block_sparse_linear`` at M 128 at 0.6-0.9 ms whatever the density, against
0.08 ms for the forward alone and 0.27 ms for dense's step. This times the three products
separately (eager and CUDA-graph replay) and prints the profiler's per-kernel and host
summary of a few steps, to tell a slow kernel from host-side cost.

    python scripts/probes/small_step_profile.py --m 128 --block 32 --density 0.1
"""

from __future__ import annotations

import argparse

import torch

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import bsmm as K
from tilesparse.ops import bsmm as ops
from tilesparse.ops import dense_dispatch as dd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[128])
    p.add_argument("--block", type=int, nargs="+", default=[32])
    p.add_argument("--density", type=float, nargs="+", default=[0.1])
    p.add_argument("--weight", default="12288x12288", help="NxK")
    args = p.parse_args()
    n, k = map(int, args.weight.split("x"))
    dt = torch.bfloat16
    for m in args.m:
        for b in args.block:
            for d in args.density:
                layout = ts.layouts.random(n, k, b, d, seed=0, device="cuda")
                meta, r, c = layout.meta, layout.block_rows, layout.block_cols
                w = torch.randn(layout.nnz, b, b, device="cuda", dtype=dt, requires_grad=True)
                x = torch.randn(m, k, device="cuda", dtype=dt, requires_grad=True)
                dy = torch.randn(m, n, device="cuda", dtype=dt)
                calls = {
                    "fprop": lambda: K.dds(x.detach(), w.detach(), meta, None, r, c, True),
                    "bprop": lambda: K.dds(dy, w.detach(), meta, None, r, c, False),
                    "updat": lambda: K.sdd(dy.t(), x.detach(), meta, b, r, c),
                }

                def step():
                    y = ops.block_sparse_linear(x, w, layout)
                    return torch.autograd.grad(y, (x, w), dy)

                line = [f"M {m} b{b} d{d} nnz {layout.nnz}:"]
                with dd.kernels_only():
                    for name, fn in calls.items():
                        line.append(f"{name} eager {bench_ms(fn, cuda=True):.4f} graph "
                                    f"{bench_ms(fn, cuda=True, graph=True):.4f}")
                    line.append(f"step eager {bench_ms(step, cuda=True):.4f} ms")
                    print(" | ".join(line), flush=True)
                    for _ in range(3):
                        step()
                    torch.cuda.synchronize()
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            step()
                        torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
                print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
