"""Run one grouped warp-specialized sdd (updat, ``bsmm_ws_sdd_group``, b 64; with --rows the
row-run one, ``bsmm_ws_sdd_rows``) a few times, for a profiler (ncu) to catch:
``python scripts/probes/ws_sdd_group_one.py --shape 16384x8192x8192``."""

from __future__ import annotations

import argparse

import torch

import tilesparse as ts
from tilesparse.kernels import bsmm as K
from tilesparse.kernels.bsmm_ws_sdd_group import WsSddGroupConfig
from tilesparse.kernels.bsmm_ws_sdd_rows import WsSddRowsConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK: dY [M, N], X [M, K]")
    p.add_argument("--density", type=float, default=0.5)
    p.add_argument("--rows", action="store_true", help="the row-run kernel (its defaults: 32-row slices, 4 stages)")
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--block-k", type=int, default=None)
    p.add_argument("--stages", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    layout = ts.layouts.random(n, k, 64, args.density, seed=0, device="cuda")
    meta = layout.meta_on("cuda")
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    kind, block_k, stages = (WsSddRowsConfig, 32, 4) if args.rows else (WsSddGroupConfig, 64, 3)
    cfg = kind(args.group, args.block_k or block_k, args.stages or stages)
    for _ in range(args.repeats):
        K.sdd(dy.t(), x, meta, 64, layout.block_rows, layout.block_cols, config=cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
