"""Does programmatic dependent launch (tilesparse.kernels._pdl) cut the small-batch
kernel's fixed cost? Kernel time per call in a CUDA graph of back-to-back calls (weights
rotated over enough copies to stream from HBM, as the small suite times them), with
each TILESPARSE_PDL mode (0 off, 1-3: when the next kernel may be scheduled) in the same process, fprop and bprop, W 12288², bf16; outputs
compared bitwise. A chain of tiny kernels (one block of 64 KB) gives the per-call floor.

    python scripts/probes/small_pdl.py [--blocks 128 64 32] [--densities 0.5 0.1 0.03] [--ms 1 32]
"""
import argparse
import json
import os

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import _pdl

p = argparse.ArgumentParser()
p.add_argument("--weight", type=int, default=12288)
p.add_argument("--blocks", type=int, nargs="+", default=[128, 64, 32])
p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.1, 0.03])
p.add_argument("--ops", nargs="+", default=["fprop", "bprop"])
p.add_argument("--ms", type=int, nargs="+", default=[1, 32])
p.add_argument("--out", default=None)
args = p.parse_args()
n = k = args.weight
dev, dt = torch.device("cuda"), torch.bfloat16


MODES = (0, 1, 2, 3)


def per_call_us(fn, calls: int, pdl: int) -> float:
    os.environ["TILESPARSE_PDL"] = str(pdl)
    _pdl.reload()
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    return bench_ms(fn, cuda=True, graph=True, rep_ms=30) / calls * 1e3


rows = []
tiny = ts.layouts.random(2048, 2048, 128, 0.02, seed=0, device=dev)  # a handful of blocks
tiny_values = torch.randn(max(tiny.nnz, 1), 128, 128, device=dev, dtype=dt)
x1 = torch.randn(1, 2048, device=dev, dtype=dt)
for pdl in MODES:
    us = per_call_us(lambda: [ts.dds(x1, tiny_values, tiny, trans_b=True) for _ in range(20)], 20, pdl)
    rows.append({"case": "tiny", "nnz": tiny.nnz, "pdl": pdl, "us": us})
    print(f"tiny dds ({tiny.nnz} blocks) mode {pdl}: {us:.2f} us per call", flush=True)
for b in args.blocks:
    for d in args.densities:
        layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
        nbytes = layout.nnz * b * b * 2
        copies = rotation_copies(nbytes, l2_cache_bytes())
        values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
        for m in args.ms:
            x = torch.randn(m, k, device=dev, dtype=dt)
            dy = torch.randn(m, n, device=dev, dtype=dt)
            calls = {"fprop": lambda v: ts.dds(x, v, layout, trans_b=True), "bprop": lambda v: ts.dds(dy, v, layout)}
            for op in args.ops:
                call = calls[op]
                outs, times = {}, {}
                for pdl in MODES:
                    times[pdl] = per_call_us(lambda: [call(v) for v in values], copies, pdl)
                    outs[pdl] = call(values[0])
                same = all(torch.equal(outs[0], outs[pdl]) for pdl in MODES)
                row = {"block": b, "density": d, "M": m, "op": op, "weight_mb": nbytes / 1e6, "copies": copies,
                       "us": {pdl: times[pdl] for pdl in MODES}, "bitwise_same": same}
                rows.append(row)
                print(f"b{b:3} d{d:<5} M{m:<3} {op}: {nbytes / 1e6:6.1f} MB  " + "  ".join(
                    f"mode {pdl} {times[pdl]:6.2f} us ({nbytes / times[pdl] / 1e6:.2f} TB/s)" for pdl in MODES)
                    + f"  same={same}", flush=True)
os.environ.pop("TILESPARSE_PDL")
_pdl.reload()
if args.out:
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "weight": n, "rows": rows}, f, indent=1)
