"""Sweep launch configs of the dds/sdd kernels on a GPU and print the best per case.

Used to build the config tables in tilesparse.kernels.bsmm; not part of the library.
Each case times dense cuBLAS in the same process, so ratios are same-run.

    python scripts/tune_bsmm.py --blocks 128 32 --densities 0.5 0.1 --budget 240 --out $OUT/tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton
import triton.testing

import tilesparse as ts
from tilesparse.kernels import bsmm as K
from tilesparse.kernels.bsmm_panel import PanelConfig


def dds_space(tile: int, fp32: bool = False):
    """A short list that covers the choices that matter: tile height (128/256), reduction
    step (64 or the whole block), pipeline depth, warps, and pointer vs TMA (with and
    without warp specialization)."""
    if tile < 64:
        for bm, warps, stages in ((128, 4, 3), (256, 8, 3), (64, 4, 4)):
            yield K.KernelConfig(bm, tile, warps, stages)
        # several output block-columns per program (kernels/bsmm_panel.py)
        for width in (64, 128):
            for bm, warps, stages in ((128, 4, 3), (128, 8, 3), (64, 4, 4)):
                yield PanelConfig(width // tile, bm, warps, stages)
        return
    if fp32:  # 4-byte elements: half the reduction step for the same bytes per stage
        for bm, bk, warps, stages in ((128, 32, 8, 3), (128, 32, 4, 4), (128, 64, 8, 3), (64, 32, 4, 4)):
            for variant in (dict(), dict(tma=True)):
                yield K.KernelConfig(bm, bk, warps, stages, **variant)
        return
    yield K.KernelConfig(128, 64, 4, 4)
    variants = (dict(tma=True), dict(tma=True, warp_specialize=True))  # dds TMA: device descriptors
    shapes = [(128, 64, 4, 4), (128, 64, 8, 3), (256, 64, 8, 3), (128, 128, 4, 3), (128, 128, 8, 2)]
    for bm, bk, warps, stages in shapes:
        for variant in variants:
            yield K.KernelConfig(bm, min(bk, tile), warps, stages, **variant)


def sdd_space(tile: int, nnz: int, sms: int, fp32: bool = False):
    if fp32:
        for bm, warps, stages in ((32, 4, 3), (32, 8, 3), (64, 8, 2), (16, 4, 4)):
            yield K.KernelConfig(bm, tile, warps, stages)
        return
    for bm, warps, stages in ((64, 8, 3), (64, 4, 4), (128, 8, 3)):
        for splits in sorted({1, triton.cdiv(sms, nnz)}):
            for variant in (dict(tma=True), dict(tma=True, device_desc=True),
                            dict(tma=True, device_desc=True, warp_specialize=True)):
                yield K.KernelConfig(bm, tile, warps, stages, splits=splits, **variant)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK: X [M, K], W [N, K]")
    p.add_argument("--blocks", type=int, nargs="+", default=[128, 64, 32, 16])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.1])
    p.add_argument("--ops", nargs="+", default=["fprop", "bprop", "updat"])
    p.add_argument("--budget", type=float, default=240.0, help="seconds in all, shared evenly by the cases")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="fp32 runs with TF32")
    p.add_argument("--out", default="tune.json")
    args = p.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    dev = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    fp32 = dtype == torch.float32
    if fp32:
        torch.set_float32_matmul_precision("high")  # TF32 for cuBLAS and the kernels alike
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.randn(m, k, device=dev, dtype=dtype)
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    w_dense = torch.randn(n, k, device=dev, dtype=dtype)
    dense_ms = {
        "fprop": bench(lambda: x @ w_dense.t()),
        "bprop": bench(lambda: dy @ w_dense),
        "updat": bench(lambda: dy.t() @ x),
    }
    print("dense ms", {k_: round(v, 4) for k_, v in dense_ms.items()}, flush=True)
    results = []
    cases = list(itertools.product(args.blocks, args.densities, args.ops))
    per_case = args.budget / len(cases)
    for b, density, op in cases:
        t0 = time.time()
        layout = ts.layouts.random(n, k, b, density, seed=0, device=dev)
        values = torch.randn(layout.nnz, b, b, device=dev, dtype=dtype)
        meta, R, C = layout.meta, layout.block_rows, layout.block_cols
        tile = max(16, b)
        if op == "fprop":
            space = dds_space(tile, fp32)
            call = lambda cfg: K.dds(x, values, meta, None, R, C, True, cfg)  # noqa: E731
        elif op == "bprop":
            space = dds_space(tile, fp32)
            call = lambda cfg: K.dds(dy, values, meta, None, R, C, False, cfg)  # noqa: E731
        else:
            space = sdd_space(tile, layout.nnz, sms, fp32)
            call = lambda cfg: K.sdd(dy.t(), x, meta, b, R, C, cfg)  # noqa: E731
        expected = call(None).float()
        default_ms = bench(lambda: call(None))
        best = (default_ms, "default")
        tried = []
        for cfg in space:
            if time.time() - t0 > per_case:
                break
            try:
                got = call(cfg).float()
                err = ((got - expected).norm() / expected.norm()).item()
                if not err < 1e-2:  # catches NaN too
                    print("  WRONG", cfg, f"rel_err={err:.3e}", flush=True)
                    continue
                ms = bench(lambda: call(cfg))
            except Exception as exc:  # out of shared memory etc.
                print("  skip", cfg, type(exc).__name__, flush=True)
                continue
            tried.append((round(ms, 5), str(cfg)))
            if ms < best[0]:
                best = (ms, cfg)
        flops = 2.0 * m * layout.nnz * b * b
        row = {
            "op": op, "block": b, "density": density, "default_ms": default_ms, "best_ms": best[0],
            "best_cfg": str(best[1]), "dense_ms": dense_ms[op],
            "speedup_best": dense_ms[op] / best[0],
            "rate_vs_dense_best": (flops / best[0]) / (2.0 * m * n * k / dense_ms[op]),
            "rate_vs_dense_default": (flops / default_ms) / (2.0 * m * n * k / dense_ms[op]),
            "tried": sorted(tried),
        }
        results.append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "tried"}), flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "shape": args.shape, "dtype": args.dtype, "rows": results}, f, indent=1)
    print("\nop     b   dens  default  best    dense   speedup  rate(best)  cfg")
    for r in results:
        print(f"{r['op']:6} {r['block']:3} {r['density']:5.2f} {r['default_ms']:.4f} {r['best_ms']:.4f} "
              f"{r['dense_ms']:.4f} {r['speedup_best']:6.2f}x {r['rate_vs_dense_best']:6.2f}  {r['best_cfg']}")


if __name__ == "__main__":
    main()
