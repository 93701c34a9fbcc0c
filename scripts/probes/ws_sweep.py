"""The warp-specialized persistent kernels (``tilesparse.kernels.bsmm_ws``) against the
shipped choice, the Triton tile kernel and dense cuBLAS, kernel time by CUDA-graph
replay, one process.

For each shape, block size, density and op (fprop: Y = X W^T, bprop: dX = dY W, both
dds; updat: dW = dY^T X on the layout, sdd) it times dense (the same product with a
dense W), the library's default choice, the Triton tile kernel at its heuristic config,
and each WsConfig variant; checks every variant's output against the tile kernel's
(relative error) and prints the best. Writes JSON.

    python scripts/probes/ws_sweep.py --out ws_sweep.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import bsmm as K
from tilesparse.kernels import bsmm_sdd_group as G
from tilesparse.kernels import bsmm_small as S
from tilesparse.kernels import bsmm_ws as W
from tilesparse.kernels import bsmm_ws_group as WG
from tilesparse.kernels import bsmm_ws_sdd_group as WSG
from tilesparse.kernels import bsmm_ws_sdd_rows as WSR
from tilesparse.layout import block_counts

# updat (sdd): block_m is the M step
SDD_VARIANTS = {
    "sdd-m64w8st5": W.WsConfig(64, 64, 8, 5),
    "sdd-m64w4st4": W.WsConfig(64, 64, 4, 4),
    "sdd-m128w8st3": W.WsConfig(128, 64, 8, 3),
    "sdd-m64w8st4": W.WsConfig(64, 64, 8, 4),
    # grouped (kernels/bsmm_sdd_group.py): G blocks of a block-row per program; "sw": the
    # panel as the MMA's M side
    "grp-b128-g2w8": G.SddGroupConfig(2, 64, 8, 3),
    "grp-b64-g4w8": G.SddGroupConfig(4, 64, 8, 3),
    "grp-b64-g4w8sw": G.SddGroupConfig(4, 64, 8, 3, swap=True),
    "grp-b64-g2w4": G.SddGroupConfig(2, 64, 4, 4),
    "grp-b32-g8w8sw": G.SddGroupConfig(8, 64, 8, 3, swap=True),
    "grp-b32-g4w4sw": G.SddGroupConfig(4, 64, 4, 4, swap=True),
    "grp-b16-g16w8sw": G.SddGroupConfig(16, 64, 8, 3, swap=True),
    "grp-b16-g8w4sw": G.SddGroupConfig(8, 64, 4, 4, swap=True),
    # grouped warp-specialized (kernels/bsmm_ws_sdd_group.py, b 64): two block-rows x G
    # block-columns per tile; "o": a slice's wgmma in flight under the next slice's
    "wsg-g4k64st3": WSG.WsSddGroupConfig(4, 64, 3),
    "wsg-g4k32st6": WSG.WsSddGroupConfig(4, 32, 6),
    "wsg-g2k64st4": WSG.WsSddGroupConfig(2, 64, 4),
    "wsg-g2k64st4o": WSG.WsSddGroupConfig(2, 64, 4, overlap=True),
    "wsg-g2k32st8o": WSG.WsSddGroupConfig(2, 32, 8, overlap=True),
    "wsg-g1k64st4o": WSG.WsSddGroupConfig(1, 64, 4, overlap=True),
    # ... the tile order's group (row pairs per group): L2 reuse between concurrent tiles
    "wsg-g4k64st3m2": WSG.WsSddGroupConfig(4, 64, 3, group_m=2),
    "wsg-g4k64st3m4": WSG.WsSddGroupConfig(4, 64, 3, group_m=4),
    "wsg-g4k64st3m16": WSG.WsSddGroupConfig(4, 64, 3, group_m=16),
    "wsg-g4k64st3m32": WSG.WsSddGroupConfig(4, 64, 3, group_m=32),
    # row runs (kernels/bsmm_ws_sdd_rows.py, b 64): 2G blocks of one block-row per unit, every
    # full unit the same work; "r": the dY tile from registers, "o": overlap
    "wsr-g4k32st4": WSR.WsSddRowsConfig(4, 32, 4),
    "wsr-g4k32st4r": WSR.WsSddRowsConfig(4, 32, 4, a_from_registers=True),
    "wsr-g4k64st2": WSR.WsSddRowsConfig(4, 64, 2),
    "wsr-g2k64st3o": WSR.WsSddRowsConfig(2, 64, 3, overlap=True),
    "wsr-g2k64st3r": WSR.WsSddRowsConfig(2, 64, 3, a_from_registers=True),
}

DEFAULT = None  # dds's own choice (the ws kernel where shipped, else tuned table or heuristic)

# name -> WsConfig(block_m, block_k, num_warps, stages[, group_m])
VARIANTS = {
    "m128k64w8st4": W.WsConfig(128, 64, 8, 4),
    "m128k64w8st5": W.WsConfig(128, 64, 8, 5),
    "m128k64w4st4": W.WsConfig(128, 64, 4, 4),
    "m256k64w8st3": W.WsConfig(256, 64, 8, 3),
    "m128k128w8st3": W.WsConfig(128, 128, 8, 3),
    "m256k64w8st3g4": W.WsConfig(256, 64, 8, 3, group_m=4),
    "m128k64w4st4pp": W.WsConfig(128, 64, 4, 4, pingpong=True),
    "m128k64w4st3pp": W.WsConfig(128, 64, 4, 3, pingpong=True),
    "m64k64w4st6pp": W.WsConfig(64, 64, 4, 6, pingpong=True),
    # tiles from the balanced schedule (kernels/ws_schedule.py) instead of round-robin
    "m128k64w8st5bal": W.WsConfig(128, 64, 8, 5, balanced=True),
    "m128k64w4st4ppbal": W.WsConfig(128, 64, 4, 4, pingpong=True, balanced=True),
    # around the b 128 default (m128k64w4st4ppbal): a 5th stage (230 KB of shared memory),
    # tile-order groups of 4 and 16 (L2 reuse of the activation rows against the W blocks)
    "m128k64w4st5ppbal": W.WsConfig(128, 64, 4, 5, pingpong=True, balanced=True),
    "m128k64w4st4ppbalg4": W.WsConfig(128, 64, 4, 4, group_m=4, pingpong=True, balanced=True),
    "m128k64w4st4ppbalg16": W.WsConfig(128, 64, 4, 4, group_m=16, pingpong=True, balanced=True),
    # fp32 as TF32 (32-deep steps: 128-byte rows)
    "tf32-m128k32w8st4": W.WsConfig(128, 32, 8, 4),
    "tf32-m128k32w8st3": W.WsConfig(128, 32, 8, 3),
    "tf32-m64k32w4st5": W.WsConfig(64, 32, 4, 5),
    "tf32-m128k32w8st4bal": W.WsConfig(128, 32, 8, 4, balanced=True),
    # small blocks: one K step per block, so deep rings (a stage is one block's tiles)
    "b32-m128k32w8st12": W.WsConfig(128, 32, 8, 12),
    "b32-m128k32w8st16": W.WsConfig(128, 32, 8, 16),
    "b32-m256k32w8st10": W.WsConfig(256, 32, 8, 10),
    "b16-m128k16w8st16": W.WsConfig(128, 16, 8, 16),
    "b16-m256k16w8st16": W.WsConfig(256, 16, 8, 16),
    # feature-major tiles (the streaming kernel, bsmm_small, at large M): a W block slice
    # is the MMA's M side and 128-256 activation rows its N side, so each W slice read
    # from shared memory serves N = 128-256 columns instead of b (the small-block limit,
    # docs/performance.md, twelfth session); block_k past b gathers several blocks per step
    "fm-b64-m256w8st3": S.SmallConfig(64, 64, 256, 8, 3),
    "fm-b64-m256w8st4": S.SmallConfig(64, 64, 256, 8, 4),
    "fm-b64-m128w4st4": S.SmallConfig(64, 64, 128, 4, 4),
    "fm-b32-m256w4st4": S.SmallConfig(32, 64, 256, 4, 4),
    "fm-b32-m256w8st3": S.SmallConfig(32, 64, 256, 8, 3),
    "fm-b32-m128w4st4": S.SmallConfig(32, 32, 128, 4, 4),
    "fm-b16-m256w4st4": S.SmallConfig(16, 64, 256, 4, 4),
    "fm-b16-m128w4st4": S.SmallConfig(16, 64, 128, 4, 4),
    # column-grouped (kernels/bsmm_ws_group.py): G output block-columns per 128-row tile,
    # each activation tile loaded once into registers for all their stored blocks
    "cg-g8st8": WG.WsGroupConfig(8, 8),
    "cg-g8st12": WG.WsGroupConfig(8, 12),
    "cg-g4st6": WG.WsGroupConfig(4, 6),
    "cg-g4st8": WG.WsGroupConfig(4, 8),
    "cg-g8st4": WG.WsGroupConfig(8, 4),
    "cg-g2st8": WG.WsGroupConfig(2, 8),
    "cg-g2st4": WG.WsGroupConfig(2, 4),
    "cg-g4st3": WG.WsGroupConfig(4, 3),
    # ... with the activation read by the wgmma from shared memory, one entry's wgmma in
    # flight while the next entry's are issued
    "cg-g8st8s": WG.WsGroupConfig(8, 8, a_from_registers=False),
    "cg-g8st4s": WG.WsGroupConfig(8, 4, a_from_registers=False),
    "cg-g4st6s": WG.WsGroupConfig(4, 6, a_from_registers=False),
    "cg-g4st3s": WG.WsGroupConfig(4, 3, a_from_registers=False),
    "cg-g2st8s": WG.WsGroupConfig(2, 8, a_from_registers=False),
    "cg-g2st4s": WG.WsGroupConfig(2, 4, a_from_registers=False),
    "cg-g1st8s": WG.WsGroupConfig(1, 8, a_from_registers=False),
    # ... two union entries per ring stage (one wait, sync and release per two entries)
    "cg-g8st3e2": WG.WsGroupConfig(8, 3, load_regs=56, entries_per_stage=2),
    "cg-g4st4e2": WG.WsGroupConfig(4, 4, load_regs=56, entries_per_stage=2),
    "cg-g8st4e2": WG.WsGroupConfig(8, 4, load_regs=56, entries_per_stage=2),
    "cg-g2st2e2": WG.WsGroupConfig(2, 2, load_regs=56, entries_per_stage=2),
    "cg-g8st6": WG.WsGroupConfig(8, 6),
    "cg-g8st2e2": WG.WsGroupConfig(8, 2, load_regs=56, entries_per_stage=2),
    "cg-g4st3e2": WG.WsGroupConfig(4, 3, load_regs=56, entries_per_stage=2),
    "cg-g4st2e2": WG.WsGroupConfig(4, 2, load_regs=56, entries_per_stage=2),
    "cg-g2st3e2": WG.WsGroupConfig(2, 3, load_regs=56, entries_per_stage=2),
    # ... three or four entries per stage (one wait, sync and release per E entries)
    "cg-g4st3e4": WG.WsGroupConfig(4, 3, load_regs=72, entries_per_stage=4),
    "cg-g8st2e3": WG.WsGroupConfig(8, 2, load_regs=72, entries_per_stage=3),
    "cg-g4st4e3": WG.WsGroupConfig(4, 4, load_regs=72, entries_per_stage=3),
    "cg-g8st3e4": WG.WsGroupConfig(8, 3, load_regs=96, entries_per_stage=4),
    "cg-g8st4e3": WG.WsGroupConfig(8, 4, load_regs=88, entries_per_stage=3),
    # ... b 16 around G 8 / E 4 (the twentieth session's winner there): ring depth
    "cg-g8st2e4": WG.WsGroupConfig(8, 2, load_regs=96, entries_per_stage=4),
    "cg-g8st4e4": WG.WsGroupConfig(8, 4, load_regs=96, entries_per_stage=4),
    "cg-g8st5e4": WG.WsGroupConfig(8, 5, load_regs=96, entries_per_stage=4),
    "cg-g8st3e4m4": WG.WsGroupConfig(8, 3, group_m=4, load_regs=96, entries_per_stage=4),
}


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def sweep(shapes, blocks, densities, ops, variants, dtype, log=print) -> list[dict]:
    rows = []
    for m, n, k in shapes:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        w_dense = torch.randn(n, k, device="cuda", dtype=dtype)
        dense = {"fprop": lambda: F.linear(x, w_dense), "bprop": lambda: dy @ w_dense, "updat": lambda: dy.t() @ x}
        dense_ms = {op: bench_ms(dense[op], cuda=True, graph=True) for op in ops}
        for b in blocks:
            for d in densities:
                layout = ts.layouts.random(n, k, b, d, seed=0, device="cuda")
                values = torch.randn(layout.nnz, b, b, device="cuda", dtype=dtype) * b ** -0.5
                meta = layout.meta_on("cuda")
                if block_counts(meta) is None:  # the 'bal' variants would silently run round-robin
                    log(f"  note: {m}x{n}x{k} b{b} d{d}: block counts unknown, balanced variants run round-robin")
                for op in ops:
                    trans = op == "fprop"
                    a = x if trans else dy
                    r, c = layout.block_rows, layout.block_cols
                    if op == "updat":
                        tile_cfg = K.sdd_config(m, b, layout.nnz, dtype, x.device)
                        names = [v for v in variants if v in SDD_VARIANTS]

                        def call(cfg=DEFAULT):
                            return K.sdd(dy.t(), x, meta, b, r, c, config=cfg)
                    else:
                        tile_cfg = K.dds_config(m, b, dtype)
                        names = [v for v in variants if v in VARIANTS]

                        def call(cfg=DEFAULT):
                            return K.dds(a, values, meta, None, r, c, trans, config=cfg)

                    expected = call(tile_cfg)  # the Triton tile kernel
                    tile_ms = bench_ms(lambda: call(tile_cfg), cuda=True, graph=True)
                    base = bench_ms(call, cuda=True, graph=True)
                    row = {"shape": f"{m}x{n}x{k}", "block": b, "density": d, "op": op, "dense_ms": dense_ms[op],
                           "default_ms": base, "tile_kernel_ms": tile_ms, "variants": {}}
                    for name in names:
                        cfg = VARIANTS.get(name) or SDD_VARIANTS[name]
                        try:
                            err = _rel(call(cfg), expected)
                            ms = bench_ms(lambda: call(cfg), cuda=True, graph=True)
                        except Exception as exc:  # noqa: BLE001 (a config the GPU cannot hold)
                            row["variants"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                            continue
                        row["variants"][name] = {"ms": ms, "rel_err": err}
                    ok = {k_: v for k_, v in row["variants"].items() if "ms" in v and v["rel_err"] < 2e-2}
                    best = min(ok, key=lambda k_: ok[k_]["ms"]) if ok else None
                    row["best"] = best
                    nnz_frac = layout.nnz / (layout.block_rows * layout.block_cols)
                    fmt = (f"{row['shape']:>16} b{b:<3} d{d:<5} {op}: dense {dense_ms[op]:.4f} "
                           f"default {base:.4f} ({dense_ms[op] / base / (1 / nnz_frac):.0%} of dense rate) "
                           f"tile kernel {tile_ms:.4f}")
                    if best:
                        bms = ok[best]["ms"]
                        fmt += f" | best ws {best} {bms:.4f} ({dense_ms[op] / bms / (1 / nnz_frac):.0%}, " \
                               f"{base / bms:.2f}x default)"
                    log(fmt)
                    for name, v in row["variants"].items():
                        log(f"      {name:16} " + (f"{v['ms']:.4f} ms err {v['rel_err']:.1e}" if "ms" in v
                                                  else v["error"]))
                    rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["8192x4096x4096", "16384x8192x8192"], help="MxNxK")
    p.add_argument("--blocks", nargs="+", type=int, default=[128])
    p.add_argument("--densities", nargs="+", type=float, default=[0.5, 0.25, 0.1, 0.05])
    p.add_argument("--ops", nargs="+", default=["fprop", "bprop"], choices=["fprop", "bprop", "updat"])
    p.add_argument("--variants", nargs="+", default=[*VARIANTS, *SDD_VARIANTS], choices=[*VARIANTS, *SDD_VARIANTS])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="fp32 runs every method as TF32 (torch.set_float32_matmul_precision('high'))")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    start = time.time()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if dtype == torch.float32:
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = sweep(shapes, args.blocks, args.densities, args.ops, args.variants, dtype)
    print(f"{time.time() - start:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
