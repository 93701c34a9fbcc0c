"""Is the small-batch kernel limited by uneven block-rows? Kernel time (CUDA-graph
replay, weights rotated over enough copies to stream from HBM) of the small-batch fprop
and bprop on a random layout (block-rows hold binomially many blocks) against a
balanced one (every block-row the same count) at the same density, next to a plain copy
of the same number of bytes (what this transfer size can reach).

    python scripts/probes/small_balance.py [--blocks 128 32] [--densities 0.25 0.1 0.03]
"""
import argparse
import json

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies

p = argparse.ArgumentParser()
p.add_argument("--weight", type=int, default=12288)
p.add_argument("--blocks", type=int, nargs="+", default=[128, 32])
p.add_argument("--densities", type=float, nargs="+", default=[0.25, 0.1, 0.03])
p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
p.add_argument("--out", default=None)
args = p.parse_args()
n = k = args.weight
dev, dt = torch.device("cuda"), torch.bfloat16


def graph_ms(fn, copies: int) -> float:
    return bench_ms(fn, cuda=True, graph=True, rep_ms=30) / copies


rows = []
for b in args.blocks:
    for d in args.densities:
        for kind in ("random", "balanced"):
            layout = getattr(ts.layouts, kind)(n, k, b, d, seed=0, device=dev)
            counts = layout.mask.sum(1).float()
            imbalance = float(counts.mean() / counts.max()) if counts.max() > 0 else 1.0
            nbytes = layout.nnz * b * b * 2
            copies = rotation_copies(nbytes, l2_cache_bytes())
            values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
            src = [torch.empty(nbytes // 2, device=dev, dtype=dt) for _ in range(copies)]
            dst = torch.empty_like(src[0])
            copy_ms = graph_ms(lambda: [dst.copy_(s) for s in src], copies)
            for m in args.ms:
                x = torch.randn(m, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                fprop = graph_ms(lambda: [ts.dds(x, v, layout, trans_b=True) for v in values], copies)
                bprop = graph_ms(lambda: [ts.dds(dy, v, layout) for v in values], copies)
                row = {"block": b, "density": d, "layout": kind, "M": m, "mean_over_max_row": round(imbalance, 3),
                       "weight_mb": nbytes / 1e6, "copy_us": copy_ms * 1e3, "fprop_us": fprop * 1e3,
                       "bprop_us": bprop * 1e3,
                       "fprop_tbs": nbytes / fprop / 1e9, "bprop_tbs": nbytes / bprop / 1e9,
                       "copy_tbs": 2 * nbytes / copy_ms / 1e9}
                rows.append(row)
                print(f"b{b:3} d{d:<5} {kind:8} M{m:<3} rows mean/max {imbalance:.2f}  weight {nbytes / 1e6:6.1f} MB: "
                      f"fprop {fprop * 1e3:6.1f} us ({row['fprop_tbs']:.2f} TB/s), bprop {bprop * 1e3:6.1f} us "
                      f"({row['bprop_tbs']:.2f} TB/s); copy of the same bytes {copy_ms * 1e3:6.1f} us "
                      f"(read+write {row['copy_tbs']:.2f} TB/s)", flush=True)
if args.out:
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "weight": n, "rows": rows}, f, indent=1)
