"""Run one column-grouped dds (``bsmm_ws_group``) a few times, for a profiler (ncu) to
catch: ``python scripts/probes/ws_group_one.py --block 32 --group 4 --stages 6``."""

from __future__ import annotations

import argparse

import torch

import tilesparse as ts
from tilesparse.kernels import bsmm as K
from tilesparse.kernels.bsmm_ws_group import WsGroupConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK")
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--density", type=float, default=0.5)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--stages", type=int, default=6)
    p.add_argument("--bprop", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    layout = ts.layouts.random(n, k, args.block, args.density, seed=0, device="cuda")
    values = torch.randn(layout.nnz, args.block, args.block, device="cuda", dtype=torch.bfloat16)
    meta = layout.meta_on("cuda")
    trans = not args.bprop
    a = torch.randn(m, k if trans else n, device="cuda", dtype=torch.bfloat16)
    cfg = WsGroupConfig(args.group, args.stages)
    for _ in range(args.repeats):
        K.dds(a, values, meta, None, layout.block_rows, layout.block_cols, trans, config=cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
