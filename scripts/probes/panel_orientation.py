"""Is the deep panel's fprop / bprop gap the blocks' order or their inner orientation?

The deep panel (``kernels/bsmm_panel.py``) runs fprop 17-39 % slower than bprop with the
same main loop. The thirty-seventh session put it on the storage order (Wᵀ stored made
fprop fast and bprop slow), but storing Wᵀ changes two things at once: which blocks a step
reads (``trans``: the grouping) and how each block is read (``trans_v``: rows or columns
of the stored 16 x 16 block, i.e. the MMA operand's major order in shared memory). And a
plain read of 256 B - 16 KB runs in random order reaches the same HBM rate
(``chunk_read.py``), so run length alone does not explain it. This probe keeps the
grouping and flips the orientation: the same product computed from the stored blocks
(``trans_v`` as shipped) and from each block transposed (``values.transpose(1, 2)``, the
other ``trans_v``), timed side by side (CUDA-graph replay, values rotated past L2), and
checks that both give the same result.

    python scripts/probes/panel_orientation.py [--ms 8 16 32 64] [--densities 0.5 0.25] [--out F]
"""
import argparse
import json

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import bsmm_panel as P


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weight", default="12288x12288")
    p.add_argument("--ms", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25])
    p.add_argument("--stages", type=int, default=6)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    n, k = (int(v) for v in args.weight.split("x"))
    b = 16
    rows = []
    for density in args.densities:
        layout = ts.layouts.random(n, k, b, density, seed=0, device="cuda")
        meta = layout.meta_on("cuda")
        sets = rotation_copies(layout.nnz * b * b * 2, l2_cache_bytes())
        vals = [torch.randn(layout.nnz, b, b, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        vals_t = [v.transpose(1, 2).contiguous() for v in vals]
        for m in args.ms:
            block_m = min(64, max(16, m))
            cfg = P.PanelConfig(8, block_m, 4, args.stages, 8, 4, 4, True, True)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            for op, trans, a, n_out in (("fprop", True, x, n), ("bprop", False, dy, k)):
                c = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
                results, times = {}, {}
                for form, values, trans_v in (("stored", vals, trans), ("blocks_transposed", vals_t, not trans)):
                    def call(v, trans_v=trans_v):
                        P.launch_dds_panel(a, v, c, None, meta, layout.block_rows, layout.block_cols, trans,
                                           trans_v, "ieee", cfg)
                    call(values[0])
                    results[form] = c.clone()
                    times[form] = bench_ms(lambda: [call(v) for v in values], cuda=True, graph=True) / sets * 1e3
                same = torch.equal(results["stored"], results["blocks_transposed"])
                row = {"op": op, "density": density, "M": m, "config": str(cfg), "stored_us": times["stored"],
                       "blocks_transposed_us": times["blocks_transposed"], "bitwise_equal": same,
                       "max_abs_diff": (results["stored"].float() - results["blocks_transposed"].float()).abs().max().item()}
                rows.append(row)
                print(f"{op} d{density} M{m}: stored {times['stored']:6.1f} us  blocks transposed "
                      f"{times['blocks_transposed']:6.1f} us  equal {same}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
