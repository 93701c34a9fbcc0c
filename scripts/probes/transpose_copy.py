"""TF32 updat's activation copies: PyTorch's copy of a transposed view against the tiled
Triton kernel (``tilesparse.kernels.transpose``), alone and inside TF32 updat
(``bsmm.TILED_TF32_COPIES`` off / on), in one process, by CUDA-graph replay; outputs
compared bitwise (the copies) and against each other (updat).

On the H200 (eleventh session) PyTorch's copy of a transposed fp32 [8192, 4096] took
0.243 ms (~1.1 TB/s), two of them 0.49 of TF32 updat's 0.61 ms at density 0.05.

    python scripts/probes/transpose_copy.py --out transpose-copy.json
"""

from __future__ import annotations

import argparse
import json

import torch

import tilesparse as ts
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import bsmm as K
from tilesparse.kernels.transpose import transpose_contiguous


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK")
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.1, 0.05])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_float32_matmul_precision("high")
    m, n, k = (int(v) for v in args.shape.split("x"))
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        assert torch.equal(transpose_contiguous(x), x.t().contiguous())
        row = {"op": "copy", "dtype": str(dtype), "shape": [m, k],
               "torch_ms": bench_ms(lambda: x.t().contiguous(), cuda=True, graph=True),
               "tiled_ms": bench_ms(lambda: transpose_contiguous(x), cuda=True, graph=True)}
        row["tiled_tb_s"] = 2 * x.numel() * x.element_size() / row["tiled_ms"] / 1e9
        rows.append(row)
        print(f"copy {dtype}: torch {row['torch_ms']:.4f} ms, tiled {row['tiled_ms']:.4f} ms "
              f"({row['tiled_tb_s']:.2f} TB/s)")
    x = torch.randn(m, k, device="cuda")
    dy = torch.randn(m, n, device="cuda")
    for d in args.densities:
        layout = ts.layouts.random(n, k, 128, d, seed=0, device="cuda")
        meta = layout.meta_on("cuda")
        r, c = layout.block_rows, layout.block_cols
        call = lambda: K.sdd(dy.t(), x, meta, 128, r, c)  # noqa: E731
        row = {"op": "updat tf32", "density": d}
        shipped = K.TILED_TF32_COPIES
        try:
            for tiled in (False, True):
                K.TILED_TF32_COPIES = tiled
                row[f"tiled={tiled}"] = {"ms": bench_ms(call, cuda=True, graph=True), "out": call()}
        finally:
            K.TILED_TF32_COPIES = shipped
        same = torch.equal(row["tiled=False"].pop("out"), row["tiled=True"].pop("out"))
        row["bitwise_equal"] = same
        rows.append(row)
        print(f"updat tf32 d{d}: torch copies {row['tiled=False']['ms']:.4f} ms, "
              f"tiled {row['tiled=True']['ms']:.4f} ms, "
              f"bitwise equal {same}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
