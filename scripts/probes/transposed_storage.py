"""Is the small-batch fprop / bprop gap a property of the value storage order?

A block-sparse W [N, K] is stored block-row by block-row. fprop (Y = X Wᵀ) groups output
block-rows, whose blocks lie in G separate streams; bprop (dX = dY W) groups block-columns,
whose blocks at one reduction step lie side by side in one block-row. Storing Wᵀ instead
(``layout.transpose()``, values ``layout.transposed_values(values)``) turns fprop into the
bprop-shaped product ``X @ S`` on Wᵀ and bprop into the fprop-shaped one. If the time
follows the shape of the product on the stored order, the transposed store is the fast
one for decoding (fprop only). Times the dispatcher's own choice (CUDA-graph replay, L2
defeated by rotating copies) for both stores and dense, W 12288² bf16.
``python scripts/probes/transposed_storage.py --out ts.json``"""

from __future__ import annotations

import argparse
import json

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import rotation_copies
from tilesparse.kernels import bsmm as K

from small_threshold import kernel_ms  # (this folder's): CUDA-graph replay, per call of ``copies``

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weight", default="12288x12288", help="NxK")
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    p.add_argument("--ms", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    p.add_argument("--out", default="transposed_storage.json")
    args = p.parse_args()
    n, k = map(int, args.weight.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    w_dense = torch.randn(n, k, device=dev, dtype=dt)
    rows = []
    for b in args.blocks:
        for d in args.densities:
            layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
            flipped = layout.transpose()
            meta, meta_t = layout.meta_on(dev), flipped.meta_on(dev)
            copies = rotation_copies(layout.nnz * b * b * 2, l2_cache_bytes())
            stored = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
            stored_t = [layout.transposed_values(v) for v in stored]
            R, C = layout.block_rows, layout.block_cols
            for m in args.ms:
                x = torch.randn(m, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                cases = {
                    "fprop": (lambda v: K.dds(x, v, meta, None, R, C, True), stored,
                              lambda v: K.dds(x, v, meta_t, None, C, R, False), stored_t, x @ w_dense.t()),
                    "bprop": (lambda v: K.dds(dy, v, meta, None, R, C, False), stored,
                              lambda v: K.dds(dy, v, meta_t, None, C, R, True), stored_t, dy @ w_dense),
                }
                for op, (rowwise, vals, flipped_call, vals_t, _) in cases.items():
                    err = ((rowwise(vals[0]).float() - flipped_call(vals_t[0]).float()).norm()
                           / rowwise(vals[0]).float().norm()).item()
                    row = {"op": op, "block": b, "density": d, "M": m, "agree": err,
                           "dense_ms": kernel_ms(lambda: x @ w_dense.t() if op == "fprop" else dy @ w_dense, 1),
                           "rows_ms": kernel_ms(lambda: [rowwise(v) for v in vals], copies),
                           "transposed_ms": kernel_ms(lambda: [flipped_call(v) for v in vals_t], copies)}
                    rows.append(row)
                    print(f"b{b} d{d} M{m:<4} {op}: stored by rows {row['rows_ms'] * 1e3:6.1f} us, "
                          f"stored transposed {row['transposed_ms'] * 1e3:6.1f} us, dense {row['dense_ms'] * 1e3:6.1f} us"
                          f"  (agree {err:.1e})", flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
