"""Sweep launch configs of the fused attention kernels on this GPU and print which beat
the heuristic (`tilesparse.kernels.attention_configs.attention_config`).

For each pattern and pass (fwd, dkdv, dq) the heuristic config is timed first, then each
candidate: BLOCK_M x BLOCK_N tiles, warps, stages. A candidate's result must match the
heuristic's (rel. error < 1e-2: NaN-poisoned outputs catch skipped work) before it is
timed. Not part of the library: a diagnostic whose winners go into attention_config
with a measurement in docs/performance.md.

    python scripts/probes/attention_configs.py --out /tmp/attention-configs.json
    python scripts/probes/attention_configs.py --tiny      # CPU smoke run (interpreter)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time

import torch

os.environ.setdefault("TILESPARSE_POISON", "1")

from tilesparse.attention import layouts as attention_layouts  # noqa: E402
from tilesparse.kernels import attention as K  # noqa: E402
from tilesparse.kernels import attention_ws  # noqa: E402
from tilesparse.kernels._device import capability_major  # noqa: E402

HOPPER = capability_major(torch.device("cuda" if torch.cuda.is_available() else "cpu")) == 9


def candidates(kind: str, block: int, head_dim: int):
    """Tile shapes, warps and stages worth trying for one pass (each side divides b);
    first the measured config with tensor-descriptor loads (TMA), when D fills the box
    (and, for the forward, with the split-off last block)."""
    if head_dim & (head_dim - 1) == 0:
        base = K.attention_config(kind, block, head_dim, torch.bfloat16)
        yield K.AttentionConfig(base.block_m, base.block_n, base.num_warps, base.num_stages, tma=True)
        if kind == "fwd":  # the unmasked blocks walked apart from each row's last
            yield K.AttentionConfig(base.block_m, base.block_n, base.num_warps, base.num_stages, tma=True,
                                    split_last=True)
        # 16 warps (4 warpgroups): half the registers per thread for the same tiles; FlexAttention's
        # Hopper backward default at D 128 (64 x 128, 16 warps, 3 stages). At 8 warps the dK/dV
        # kernel has 255 registers and ~780 B of stack, spilled and reloaded outside its loop
        for bm, bn, stages in {"fwd": ((128, 128, 2), (128, 128, 3)),
                               "dkdv": ((64, 128, 3), (64, 128, 2), (32, 128, 3), (128, 128, 2)),
                               "dq": ((128, 64, 2), (128, 128, 2), (128, 32, 2))}[kind]:
            if bm <= block and bn <= block:
                for tma in (True, False):
                    yield K.AttentionConfig(bm, bn, 16, stages, tma=tma)
        for stages in (2, 3, 4):
            if stages != base.num_stages:
                yield K.AttentionConfig(base.block_m, base.block_n, base.num_warps, stages, tma=True)
        if HOPPER and block in (64, 128) and head_dim in (64, 128):
            # the Hopper warp-specialized Gluon kernels (tilesparse.kernels.attention_ws; written
            # 2026-11-30 after the device time ran out, first timed by this sweep), those whose
            # tiles fit in the block
            ws = {"dkdv": [attention_ws.DkdvWsConfig(bm, st) for bm, st in ((64, 2), (64, 3), (32, 4))],
                  "fwd": [attention_ws.FwdWsConfig(bm, bn, st) for bm, bn, st in ((128, 128, 2), (128, 64, 3),
                                                                                   (128, 128, 3))],
                  "dq": [attention_ws.DqWsConfig(bm, bn, st) for bm, bn, st in ((128, 64, 2), (128, 64, 3), (64, 64, 3),
                                                                                 (128, 128, 2))]}[kind]
            yield from (cfg for cfg in ws if block % max(cfg.block_m, getattr(cfg, "block_n", 0)) == 0)
        if kind == "dkdv":
            # the two-pass walk (one fp32 accumulator live at a time; 5 matmuls per block pair
            # instead of 4) and register caps (two CTAs of 8 warps per SM); compiled for sm_90
            # by scripts/probes/attention_spills.py, never timed before this sweep
            for bm, bn, warps, stages, two_pass, maxnreg in (
                    (64, 128, 8, 2, True, None), (64, 128, 8, 3, True, None), (128, 128, 8, 2, True, None),
                    (128, 64, 8, 2, True, None), (64, 64, 8, 2, True, None), (64, 64, 8, 2, False, 128),
                    (64, 64, 8, 2, True, 128), (32, 64, 4, 2, True, 168), (64, 64, 4, 2, True, None)):
                if bm <= block and bn <= block:
                    yield K.AttentionConfig(bm, bn, warps, stages, tma=True, two_pass=two_pass, maxnreg=maxnreg)
    sides = [s for s in (16, 32, 64, 128) if s <= block]
    for bm, bn in itertools.product(sides, sides):
        if bm * bn < 32 * 32 or (kind == "fwd" and bm < 64 <= block):
            continue
        for warps, stages in itertools.product((4, 8), (2, 3, 4)):
            if head_dim > 64 and stages > 3:
                continue
            yield K.AttentionConfig(bm, bn, warps, stages)


def _ms(fn, cuda: bool) -> float:
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def sweep(batch, heads, seq, head_dim, block, patterns, dtype, budget_s, cuda, log=print) -> list[dict]:
    device = "cuda" if cuda else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, generator=gen, device=device, dtype=dtype)
                     for _ in range(4))
    scale = head_dim ** -0.5
    rows = []
    per_case = budget_s / max(1, 3 * len(patterns))
    for name, layout, causal in patterns:
        meta = layout.meta_on(device, causal)
        out, lse = K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)
        cases = {
            "fwd": lambda cfg: K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale,
                                                   config=cfg)[0],
            "dkdv": lambda cfg: K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block,
                                                     causal, scale, configs=(cfg, K.attention_config(
                                                         "dq", block, head_dim, dtype)))[1],
            "dq": lambda cfg: K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block,
                                                   causal, scale, configs=(K.attention_config(
                                                       "dkdv", block, head_dim, dtype), cfg))[0],
        }
        for kind, call in cases.items():
            start = time.time()
            current = K.attention_config(kind, block, head_dim, dtype)
            expected = call(current)
            base_ms = _ms(lambda: call(current), cuda)
            best_ms, best, tried = base_ms, current, 0
            timings = []  # every candidate's time, so a sweep's losers are on record too
            for cfg in candidates(kind, block, head_dim):
                if time.time() - start > per_case:
                    break
                try:
                    err = _rel(call(cfg), expected)
                    if not err < 1e-2:
                        log(f"  WRONG {kind} {cfg} rel_err={err:.2e}")
                        continue
                    ms = _ms(lambda: call(cfg), cuda)
                except Exception as exc:  # noqa: BLE001 (out of shared memory / registers)
                    log(f"  skip {kind} {cfg}: {type(exc).__name__}")
                    continue
                tried += 1
                timings.append([str(cfg), ms])
                if ms < best_ms:
                    best_ms, best = ms, cfg
            row = {"pattern": name, "pass": kind, "block": block, "head_dim": head_dim, "heuristic": str(current),
                   "heuristic_ms": base_ms, "best": str(best), "best_ms": best_ms, "tried": tried,
                   "gain": base_ms / best_ms if best_ms else math.nan, "candidates": timings}
            rows.append(row)
            log(f"{name:10} {kind:5} heuristic {base_ms:8.3f} ms, best {best_ms:8.3f} ms ({tried} tried): {best}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4x16x8192x128", help="BxHxSxD (default: the issue's 4x16x8192x128)")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--budget", type=float, default=240.0, help="seconds in all")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: 1x2x64x32, block 32, fp32")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        batch, heads, seq, head_dim, block, dtype = 1, 2, 64, 32, 32, torch.float32
    else:
        batch, heads, seq, head_dim = (int(v) for v in args.shape.split("x"))
        block, dtype = args.block, torch.bfloat16
    window = max(block, seq // 8)
    patterns = [
        ("causal", attention_layouts.causal(seq, block), True),
        (f"local{window}", attention_layouts.local(seq, block, window=window, causal=True), True),
    ]
    rows = sweep(batch, heads, seq, head_dim, block, patterns, dtype, args.budget, cuda)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": [batch, heads, seq, head_dim], "block": block, "dtype": str(dtype),
                       "gpu": torch.cuda.get_device_name() if cuda else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
