"""A/B of the column-major resident fprop's module switches, in one process.

For W 12288² block-sparse (bf16, random layout) and M rows of activations, times each
column-major config (``small_variants.py``'s ``rC`` variants) with each combination of the
switches of ``bsmm_resident_columns`` (SWITCHES: ``SHORT_ACTIVATION_BOXES``, activation
copies of M's rows rounded up to 16 / 32 / 64 rather than 64), checks that every
combination's output is bitwise that of the first correct one and close to the large-batch
kernel's (an independent reference: the dispatcher may pick the kernel under test), and
writes the times with dense cuBLAS's and the dispatcher's (``auto``) as JSON. Configs the
kernel refuses for these operands (shared memory, TMA box rows, M > 64) are left out. (2026-12-02's
first run A/B'd a next-chunk table prefetch and one 3-D copy per chunk's activation tiles:
neither helped, the 3-D copies took twice as long at M 1; both were taken out.)

    python scripts/probes/resident_columns_ab.py --out resident-columns-ab.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.kernels import bsmm_resident as RS
from tilesparse.kernels import bsmm_resident_columns as RC

from small_threshold import kernel_ms  # (this folder's)
from small_variants import ALL_VARIANTS, variant_config

SWITCHES = ("SHORT_ACTIVATION_BOXES",)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weight", default="12288x12288", help="NxK")
    p.add_argument("--blocks", type=int, nargs="+", default=[16])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64])
    p.add_argument("--variants", nargs="+", default=["rC6x1", "rC6x1k4", "rC12x2c8", "rC12x2c8k4", "rC12x2c8k2",
                                                     "rC12x2c4s6"])
    p.add_argument("--out", default="resident-columns-ab.json")
    args = p.parse_args()
    n, k = map(int, args.weight.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    w_dense = torch.randn(n, k, device=dev, dtype=dt)
    rows = []
    for b, d in itertools.product(args.blocks, args.densities):
        layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
        meta, R, C = layout.meta, layout.block_rows, layout.block_cols
        copies = rotation_copies(layout.nnz * b * b * 2, l2_cache_bytes())  # graph replay does not flush L2
        all_values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
        values = all_values[0]
        for m in args.ms:
            x = torch.randn(m, k, device=dev, dtype=dt)
            ref = K.dds(x, values, meta, None, R, C, True, K.dds_config(m, b, dt)).float()
            out_like = torch.empty(m, n, device=dev, dtype=dt)
            row = {"block": b, "density": d, "M": m, "dense_ms": kernel_ms(lambda: x @ w_dense.t()),
                   "auto": kernel_ms(lambda: [K.dds(x, v, meta, None, R, C, True) for v in all_values], copies)}
            for name in args.variants:
                cfg = variant_config(ALL_VARIANTS[name], 64)
                why = RS.resident_supported(x, values, out_like, True, cfg)
                if why is not None:
                    print(f"skipped {name} at b{b} M{m}: the kernel {why}", flush=True)
                    continue
                first = None
                for combo in itertools.product((False, True), repeat=len(SWITCHES)):
                    key = name + _suffix(combo)
                    with _switched(combo):
                        out = K.dds(x, values, meta, None, R, C, True, cfg).float()
                        err = ((out - ref).norm() / ref.norm()).item()
                        if not (err < 1e-2 and (first is None or torch.equal(out, first))):
                            print("WRONG", key, b, d, m, err, flush=True)
                            row[key + "_wrong"] = err
                            continue
                        first = out if first is None else first
                        row[key] = kernel_ms(lambda: [K.dds(x, v, meta, None, R, C, True, cfg) for v in all_values],
                                             copies)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, f, indent=1)
    print("\nµs per call, each switch combination (" + ", ".join(SWITCHES) + "; 0 1 ...), the dispatcher's "
          "and dense:")
    for row in rows:
        for name in args.variants:
            times = [row.get(name + _suffix(combo)) for combo in itertools.product((False, True), repeat=len(SWITCHES))]
            cells = " ".join("--" if t is None else f"{t * 1e3:.0f}" for t in times)
            print(f"b{row['block']} d{row['density']} M{row['M']} {name:<11} {cells}  auto {row['auto'] * 1e3:.0f}"
                  f"  dense {row['dense_ms'] * 1e3:.0f}")


@contextlib.contextmanager
def _switched(combo):
    """SWITCHES set to ``combo`` for the block, then back to what they were."""
    saved = [getattr(RC, switch) for switch in SWITCHES]
    try:
        for switch, on in zip(SWITCHES, combo):
            setattr(RC, switch, on)
        yield
    finally:
        for switch, value in zip(SWITCHES, saved):
            setattr(RC, switch, value)


def _suffix(combo) -> str:
    """A row's key suffix for one combination of SWITCHES: _<first word of the switch><0/1>..."""
    return "".join(f"_{s.split('_')[0].lower()}{int(on)}" for s, on in zip(SWITCHES, combo))


if __name__ == "__main__":
    main()
