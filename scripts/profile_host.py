"""Measure the host (CPU) cost of one block-sparse training step on a GPU.

do_bench times back-to-back launches, so when the host takes longer to enqueue a step
than the GPU takes to run it, the host is what gets measured. This prints wall time per
call with the GPU synchronised only at the end, next to the kernel time from a CUDA
graph replay, and a cProfile of the step's Python frames.

    python scripts/profile_host.py --block 128 --density 0.1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import triton.testing

import tilesparse as ts


def host_us(fn, n: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x4096x4096")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--density", type=float, default=0.1)
    args = p.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    layout = ts.layouts.random(n, k, args.block, args.density, device=dev)
    w = torch.randn(layout.nnz, args.block, args.block, device=dev, dtype=dt, requires_grad=True)
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=dt)

    def fprop():
        return ts.block_sparse_linear(x.detach(), w.detach(), layout)

    def step():
        y = ts.block_sparse_linear(x, w, layout)
        return torch.autograd.grad(y, (x, w), dy)

    for name, fn in (("fprop", fprop), ("step", step)):
        gpu_ms = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
        print(f"{name}: host {host_us(fn):8.1f} us/call, graph-replayed GPU time {gpu_ms * 1e3:8.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        step()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
