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

import torch
import triton.testing

import tilesparse as ts
from tilesparse.bench.timing import host_us


def breakdown(dev, dt) -> None:
    """Host cost of each layer on a problem too small to keep the GPU busy, so the loop
    time is the host's."""
    from tilesparse.kernels import bsmm as K
    from tilesparse.ops import bsmm as O

    layout = ts.layouts.random(1024, 1024, 128, 0.25, device=dev)
    w = torch.randn(layout.nnz, 128, 128, device=dev, dtype=dt, requires_grad=True)
    x = torch.randn(256, 1024, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(256, 1024, device=dev, dtype=dt)
    wd = torch.randn(1024, 1024, device=dev, dtype=dt, requires_grad=True)
    meta, r, c = layout.meta, layout.block_rows, layout.block_cols
    ptr_cfg = K.KernelConfig(128, 64, 4, 4)
    tma_cfg = K.KernelConfig(128, 64, 4, 4, tma=True)
    xd, wdt = x.detach(), w.detach()
    ptr, idx = K.table_views(meta, r, c, "row_ptr", "row_cols")
    out = torch.empty(256, 1024, device=dev, dtype=dt)

    def bare_launch():
        # the Triton launch alone: arguments prepared, no wrapper
        K._dds_kernel[(2 * r,)](
            xd, wdt, out, out, ptr, idx, ptr, 256, r, xd.stride(0), 1, out.stride(0), 1,
            B=128, TILE_B=128, BLOCK_M=128, BLOCK_K=64, TRANS_V=True, HAS_SLOT=False, HAS_BIAS=False,
            GROUP_M=8, INPUT_PRECISION="ieee", num_warps=4, num_stages=4,
        )

    # the compiled kernel's own launcher, skipping Triton's argument binding and cache key
    # (all parameters in order, constexprs included, as JITFunction.run passes them)
    compiled = K._dds_kernel.warmup(
        xd, wdt, out, out, ptr, idx, ptr, 256, r, xd.stride(0), 1, out.stride(0), 1,
        B=128, TILE_B=128, BLOCK_M=128, BLOCK_K=64, TRANS_V=True, HAS_SLOT=False, HAS_BIAS=False,
        GROUP_M=8, INPUT_PRECISION="ieee", num_warps=4, num_stages=4, grid=(2 * r,),
    )
    runner = compiled[(2 * r, 1, 1)]
    all_args = (xd, wdt, out, out, ptr, idx, ptr, 256, r, xd.stride(0), 1, out.stride(0), 1,
                128, 128, 128, 64, True, False, False, 8, "ieee")

    cases = {
        "bare _dds_kernel launch": bare_launch,
        "compiled kernel runner": lambda: runner(*all_args),
        "empty_like (floor)": lambda: torch.empty_like(xd),
        "dense matmul": lambda: xd @ wd.detach().t(),
        "kernels.dds pointer": lambda: K.dds(xd, wdt, meta, None, r, c, True, ptr_cfg),
        "kernels.dds tma (device descriptors)": lambda: K.dds(xd, wdt, meta, None, r, c, True, tma_cfg),
        "kernels.dds default": lambda: K.dds(xd, wdt, meta, None, r, c, True),
        "kernels.sdd default": lambda: K.sdd(dy.t(), xd, meta, 128, r, c),
        "Function.apply (no grad)": lambda: O._dds_eager(xd, wdt, meta, None, r, c, True),
        "custom op (no grad)": lambda: O._dds_op(xd, wdt, meta, None, r, c, True),
        "block_sparse_linear": lambda: ts.block_sparse_linear(x, w, layout),
        "sparse step": lambda: torch.autograd.grad(ts.block_sparse_linear(x, w, layout), (x, w), dy),
        "dense step": lambda: torch.autograd.grad(torch.nn.functional.linear(x, wd), (x, wd), dy),
    }
    for name, fn in cases.items():
        print(f"  host {name:26s} {host_us(fn, 500):8.1f} us/call")
    torch.autograd.set_multithreading_enabled(False)
    for name in ("sparse step", "dense step"):
        print(f"  host {name + ', 1 thread':26s} {host_us(cases[name], 500):8.1f} us/call")
    torch.autograd.set_multithreading_enabled(True)


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
    breakdown(dev, dt)
    # cProfile sees only the calling thread: run the backward there too
    with torch.autograd.set_multithreading_enabled(False):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            step()
        prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
