"""Where the attention forward's time goes per query tile: causal sliding windows of
256-8192 tokens (B 4, H 16, S 8192, D 128, blocks of 128, bf16) give rows of 2-64 key
blocks at the same number of query tiles. A least-squares fit of each kernel's time,
ms = per_tile * tiles / SMs + per_pair * pairs / SMs, splits a query tile's fixed cost
(Q load, row lookups, the O / lse epilogue, the pipeline's fill and drain) from each
key block's (two 128x128x128 products and the softmax); per_pair is compared with the
tensor cores' time for those products at dense cuBLAS's rate measured in the same run.

    python scripts/probes/attention_row_length.py --out attention-row-length.json
"""

from __future__ import annotations

import argparse
import json

import torch

from tilesparse.attention import layouts
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import FwdWsConfig

VARIANTS = {
    "triton": None,
    "persistent": FwdWsConfig(128, 128, 2, persistent=True),
    "overlap": FwdWsConfig(128, 128, 2, persistent=True, overlap=True),
    "two-overlap": FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2),
}


def _time(fn) -> float:
    return bench_ms(fn, cuda=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    B, H, S, D, block = 4, 16, 8192, 128, 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    dense_tflops = 2 * 8192 ** 3 / _time(lambda: a @ a) / 1e9
    pair_flops = 4 * block * block * D  # Q K^T and P V for one 128 x 128 block pair
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = []
    for window in args.windows:
        layout = layouts.local(S, block, window, causal=True)
        meta = layout.meta_on(q.device, True)
        row = {"window": window, "tiles": B * H * (S // block), "pairs": B * H * layout.nnz, "density": layout.density}
        for name, cfg in VARIANTS.items():
            def fwd(cfg=cfg):
                return K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, True, D ** -0.5,
                                           config=cfg)
            row[f"{name}_ms"] = _time(fwd)
        rows.append(row)
        print(json.dumps(row), flush=True)
    fits = {}
    design = torch.tensor([[r["tiles"] / sms, r["pairs"] / sms] for r in rows], dtype=torch.float64)
    for name in VARIANTS:
        ms = torch.tensor([r[f"{name}_ms"] for r in rows], dtype=torch.float64)
        coef = torch.linalg.lstsq(design, ms[:, None]).solution[:, 0]
        per_tile_us, per_pair_us = coef[0].item() * 1e3, coef[1].item() * 1e3
        mma_us = pair_flops / (dense_tflops * 1e12 / sms) * 1e6
        fits[name] = {"per_tile_us": per_tile_us, "per_pair_us": per_pair_us, "pair_at_dense_rate_us": mma_us,
                      "residual_ms": (design @ coef - ms).abs().max().item()}
        print(f"{name:10} per query tile {per_tile_us:.2f} µs, per key block {per_pair_us:.3f} µs "
              f"(tensor cores at dense's {dense_tflops:.0f} TF/s: {mma_us:.3f} µs), worst residual "
              f"{fits[name]['residual_ms']:.3f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": sms,
                       "dense_tflops": dense_tflops, "rows": rows, "fits": fits}, f, indent=1)


if __name__ == "__main__":
    main()
