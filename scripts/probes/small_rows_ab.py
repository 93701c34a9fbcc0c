"""Does streaming groups of whole block-rows per program (``kernels/bsmm_small_rows.py``) beat the
small kernel's one program per row slice on random layouts at few rows?

Kernel time by CUDA-graph replay (weights rotated past L2, as the small suite times), W 12288², bf16:
the dispatcher's own choice (``auto``), the row-group kernel at a few configs, the dispatcher on a
*balanced* layout of the same density (every block-row the same count: the target the groups aim
at), and a bare read of the same bytes (``stream_reference.read_call``). Interleaved over rounds;
medians. Prints one line per point and writes JSON.

    python scripts/probes/small_rows_ab.py --out small_rows_ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import tilesparse as ts
from tilesparse.bench import stream_reference
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.kernels.bsmm_small import rows_per_program
from tilesparse.kernels.bsmm_small_rows import RowsConfig, dds_rows


def variants(b: int, m: int) -> dict[str, RowsConfig]:
    """name -> config: 32- and 16-wide slices, whole-block steps, 1-2 programs per SM at the stages
    shared memory holds (12 KB a stage at b 128 with 32-wide slices and 16 rows)."""
    bm = rows_per_program(m)
    tile = min(b, 128)
    out = {}
    for sub in (32, 16) if tile == 128 else (32,):
        if sub > tile:
            continue
        for pps, stages in ((1, 12), (2, 8)):
            for warps in (2, 4):
                out[f"s{sub}p{pps}st{stages}w{warps}"] = RowsConfig(sub, tile, bm, warps, stages, programs_per_sm=pps)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--weight", type=int, default=12288)
    p.add_argument("--blocks", type=int, nargs="+", default=[128, 32])
    p.add_argument("--densities", type=float, nargs="+", default=[0.1, 0.25])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
    p.add_argument("--ops", nargs="+", default=["fprop", "bprop"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="small_rows_ab.json")
    args = p.parse_args()
    n = k = args.weight
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for b in args.blocks:
        for d in args.densities:
            layouts = {kind: getattr(ts.layouts, kind)(n, k, b, d, seed=0, device=dev) for kind in ("random", "balanced")}
            layout = layouts["random"]
            R, C, meta = layout.block_rows, layout.block_cols, layout.meta
            nbytes = layout.nnz * b * b * 2
            copies = rotation_copies(nbytes, l2_cache_bytes())
            values = {kind: [torch.randn(lay.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
                      for kind, lay in layouts.items()}
            reads = [stream_reference.read_call(nbytes, dev) for _ in range(copies)]
            for m in args.ms:
                x = torch.randn(m, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                for op in args.ops:
                    trans, a = (True, x) if op == "fprop" else (False, dy)
                    vs = values["random"]
                    ref = K.dds(a, vs[0], meta, None, R, C, trans).float()
                    calls = {"auto": lambda: [K.dds(a, v, meta, None, R, C, trans) for v in vs],
                             "read": lambda: [r() for r in reads]}
                    bal = layouts["balanced"]
                    calls["balanced_auto"] = lambda: [K.dds(a, v, bal.meta, None, bal.block_rows, bal.block_cols,
                                                            trans) for v in values["balanced"]]
                    errors = {}
                    for name, cfg in variants(b, m).items():
                        try:
                            out = dds_rows(a, vs[0], meta, None, R, C, trans, cfg, sms).float()
                        except Exception as exc:  # a config shared memory cannot hold: skipped
                            print("SKIP", b, d, m, op, name, type(exc).__name__, str(exc).splitlines()[0][:120])
                            continue
                        errors[name] = ((out - ref).norm() / ref.norm().clamp(min=1e-30)).item()
                        if not errors[name] < 1e-2:
                            print("WRONG", b, d, m, op, name, errors[name])
                            continue
                        calls[name] = (lambda c: lambda: [dds_rows(a, v, meta, None, R, C, trans, c, sms)
                                                          for v in vs])(cfg)
                    samples = {name: [] for name in calls}
                    for rnd in range(args.rounds):
                        names = list(calls)
                        names = names[rnd % len(names):] + names[:rnd % len(names)]
                        for name in names:
                            samples[name].append(bench_ms(calls[name], cuda=True, graph=True, rep_ms=20) / copies)
                    us = {name: statistics.median(v) * 1e3 for name, v in samples.items()}
                    best = min((nm for nm in us if nm not in ("auto", "read", "balanced_auto")), key=us.get,
                               default=None)
                    row = {"op": op, "block": b, "density": d, "M": m, "weight_bytes": nbytes, "copies": copies,
                           "us": us, "errors": errors, "best_rows": best}
                    rows.append(row)
                    line = (f"{op} b{b:3} d{d:<5} M{m:<3} auto {us['auto']:6.2f} balanced {us['balanced_auto']:6.2f} "
                            f"read {us['read']:6.2f}")
                    if best:
                        line += f" | rows best {best} {us[best]:6.2f} ({us['auto'] / us[best]:.2f}x auto)"
                    print(line, flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "weight": n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
