"""Run the shipped choice of kernel for one product a few times, for a profiler (ncu) to
catch: whatever the dispatcher picks (tuned entry, default or heuristic), no config
forced (``--gemv SUB,BLOCK_K,WARPS``: the FMA kernel of 1-8 rows instead; ``--variant NAME``:
one of ``small_variants.py``'s variants; either to profile a candidate). ``python scripts/probes/dispatch_one.py --op updat --block 32 --density 0.25``."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

import tilesparse as ts
from tilesparse.bench.tune import product
from tilesparse.kernels.bsmm_gemv import GemvConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK: X [M, K], W [N, K]")
    p.add_argument("--op", choices=["fprop", "bprop", "updat"], default="fprop")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--density", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gemv", default=None, metavar="SUB,BLOCK_K,WARPS",
                   help="force the FMA kernel (fprop / bprop at 1-8 rows) with this config")
    p.add_argument("--variant", default=None, help="force a variant of scripts/probes/small_variants.py")
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    layout = ts.layouts.random(n, k, args.block, args.density, seed=0, device="cuda")
    values = torch.randn(layout.nnz, args.block, args.block, device="cuda", dtype=torch.bfloat16)
    meta = layout.meta_on("cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    call = product(args.op, x, dy, values, meta, args.block, layout.block_rows, layout.block_cols)
    cfg = None
    if args.gemv:
        sub, block_k, warps = (int(v) for v in args.gemv.split(","))
        cfg = GemvConfig(sub=sub, block_k=block_k, num_warps=warps)
    if args.variant:
        spec = importlib.util.spec_from_file_location("small_variants", Path(__file__).with_name("small_variants.py"))
        probe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe)
        cfg = probe.variant_config(probe.ALL_VARIANTS[args.variant], probe.variant_block_m(m), args.block)
    for _ in range(args.repeats):
        call(cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
