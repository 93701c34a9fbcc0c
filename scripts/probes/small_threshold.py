"""Where does dds's small-batch kernel stop beating the large-batch one?

For W [N, K] block-sparse (bf16) and M rows of activations, times in one process (CUDA
graph replay: kernel time, no host overhead) the large-batch kernel with its default
config, the small-batch kernel at a few configs, and dense cuBLAS, for fprop and bprop.
The block values are rotated over enough copies that each pass reads them from HBM (the
sweeps before 2026-11-30's last one did not: weights under ~60 MB were read from L2).
Prints the crossover M per (op, block, density) and writes everything as JSON: the
numbers behind ``tilesparse.kernels.bsmm.use_small_kernel``. The configs it can time are
named in ``small_variants.py`` (this folder's).

    python scripts/probes/small_threshold.py --out small_threshold.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
from triton.runtime.errors import OutOfResources

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.kernels import bsmm_gemv as GV
from tilesparse.kernels import bsmm_kmajor as KM
from tilesparse.kernels import bsmm_panel as P
from tilesparse.kernels import bsmm_small as S
from tilesparse.kernels import bsmm_resident as RS
from tilesparse.kernels import tuned
from tilesparse.kernels._tiles import tile_for

from small_variants import ALL_VARIANTS, SMALL_VARIANTS, variant_block_m, variant_config  # (this folder's)


def dispatched_small_config(op: str, m: int, b: int, density: float, dev, rows: int,
                            cols: int) -> S.SmallConfig | GV.GemvConfig | P.PanelConfig | None:
    """The small-kernel, FMA-kernel or panel config dds picks by itself for this problem (the
    tuned table's entry, else the heuristic where the small kernel runs), or None where it
    picks another kernel."""
    found = tuned.lookup(op, torch.bfloat16, b, m, density, dev, tuned.weight_shape(rows, cols, b))
    if found is None and K.use_small_kernel(m, b, torch.bfloat16):
        found = S.small_config(m, b, torch.bfloat16, K.shared_memory_bytes(dev))
    return found if isinstance(found, (S.SmallConfig, GV.GemvConfig, P.PanelConfig)) else None


def with_fields(cfg, fields: dict, m: int) -> S.SmallConfig | None:
    """A small-kernel config with ``fields`` replaced, or None where ``cfg`` is another kernel's or
    the row tiles asked for are taller than the M rows (16 at least)."""
    if not isinstance(cfg, S.SmallConfig) or fields.get("block_m", 0) > max(m, 16):
        return None
    return dataclasses.replace(cfg, **fields)


def kernel_ms(fn, copies: int = 1) -> float:
    """Kernel time of one of the ``copies`` calls ``fn`` makes (CUDA-graph replay)."""
    return bench_ms(fn, cuda=True, graph=True, rep_ms=20) / copies


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--weight", default="12288x12288", help="NxK")
    p.add_argument("--ms", type=int, nargs="+", default=[1, 32, 64, 128, 256])
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.03])
    p.add_argument("--variants", nargs="+", default=list(SMALL_VARIANTS), choices=list(ALL_VARIANTS) + ["default"],
                   help="'default': bsmm_small.small_config's heuristic for the block and M (whole runs)")
    p.add_argument("--layout", choices=["random", "barabasi_albert"], default="random",
                   help="barabasi_albert: heavy-tailed block-rows (hubs), where chunks should pay")
    p.add_argument("--auto", action="store_true",
                   help="also time the dispatcher's own choice (config=None: tuned table, heuristic, skew rule)")
    p.add_argument("--ops", nargs="+", choices=["fprop", "bprop"], default=["fprop", "bprop"])
    p.add_argument("--out", default="small_threshold.json")
    args = p.parse_args()
    SMALL_VARIANTS.clear()
    SMALL_VARIANTS.update({k: ALL_VARIANTS.get(k) for k in args.variants})
    n, k = map(int, args.weight.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    t0 = time.time()
    # dense weights rotated past L2 as the sparse ones below (and as the small suite does): one 4096² weight
    # (34 MB) replayed alone stayed partly in the H200's L2 and timed 9.9-10.3 µs against the suite's 12.5-14.2
    dense_copies = rotation_copies(n * k * 2, l2_cache_bytes())
    w_dense = [torch.randn(n, k, device=dev, dtype=dt) for _ in range(dense_copies)]
    rows = []
    dense = {}
    for m in args.ms:
        x = torch.randn(m, k, device=dev, dtype=dt)
        dy = torch.randn(m, n, device=dev, dtype=dt)
        dense[m] = {"fprop": kernel_ms(lambda: [x @ w.t() for w in w_dense], dense_copies),
                    "bprop": kernel_ms(lambda: [dy @ w for w in w_dense], dense_copies)}
    for b in args.blocks:
        for d in args.densities:
            if args.layout == "random":
                layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
            else:
                layout = ts.layouts.barabasi_albert(n, k, b, density=d, seed=0, device=dev)
            meta, R, C = layout.meta, layout.block_rows, layout.block_cols
            weight_bytes = layout.nnz * b * b * 2
            copies = rotation_copies(weight_bytes, l2_cache_bytes())  # graph replay does not flush L2
            all_values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
            values = all_values[0]
            for m in args.ms:
                x = torch.randn(m, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                for op, a, trans in (("fprop", x, True), ("bprop", dy, False)):
                    if op not in args.ops:
                        continue
                    row = {"op": op, "layout": args.layout, "block": b, "density": d, "M": m, "dense_ms": dense[m][op],
                           "weight_bytes": weight_bytes, "copies": copies}
                    large = K.dds_config(m, b, dt)
                    ref = K.dds(a, values, meta, None, R, C, trans, large).float()
                    row["large_ms"] = kernel_ms(lambda: [K.dds(a, v, meta, None, R, C, trans, large)
                                                         for v in all_values], copies)
                    for name, fields in SMALL_VARIANTS.items():
                        if fields is None:  # "default": the heuristic
                            cfg = S.small_config(m, b, dt, K.shared_memory_bytes(dev))
                        elif fields[0] in ("heuristic", "auto"):
                            cfg = S.small_config(m, b, dt, K.shared_memory_bytes(dev)) if fields[0] == "heuristic" \
                                else dispatched_small_config(op, m, b, layout.nnz / (R * C), dev, R, C)
                            if fields[1] == "kwarps":  # the deep panel's / FMA kernel's warps
                                if not isinstance(cfg, (P.PanelConfig, GV.GemvConfig)):
                                    continue  # (the small kernel's: "warps")
                                cfg = dataclasses.replace(cfg, num_warps=fields[2])
                            elif fields[1] in ("stages", "warps"):
                                if not isinstance(cfg, S.SmallConfig):
                                    continue  # another kernel (panels: their own variants; the FMA kernel has no ring)
                                cfg = dataclasses.replace(cfg, **{"num_" + fields[1]: fields[2]})
                            elif fields[1] == "set":  # the heuristic's config with fields replaced, row-major
                                cfg = with_fields(cfg, fields[2], m)
                                if cfg is None:
                                    continue
                            elif fields[1] == "rowmajor":
                                cfg = None  # the dispatcher itself, with KMAJOR_SMALL off
                            elif fields[1] in ("kmajor", "kmajorT", "kmajorTT"):
                                more = fields[2] if len(fields) > 2 else {}  # a stage count, or fields to replace
                                cfg = with_fields(cfg, more if isinstance(more, dict) else {"num_stages": more}, m)
                                if cfg is None:
                                    continue  # (the small kernel's gather only: other kernels read A row-major)
                            elif fields[1] == "spread":
                                if not (isinstance(cfg, S.SmallConfig) and cfg.block_k > tile_for(b)):
                                    continue  # another kernel, or steps within one block: nothing to spread
                                cfg = dataclasses.replace(cfg, spread_index=True)
                            else:
                                takes_no_hints = not trans and (isinstance(cfg, GV.GemvConfig) or (
                                    isinstance(cfg, S.SmallConfig) and cfg.block_k > tile_for(b)))
                                if cfg is None or takes_no_hints:
                                    continue  # another kernel's problem, or a bprop that takes no hints
                                cfg = dataclasses.replace(cfg, l2_ahead=fields[1])
                        elif fields[0] == "panel" and (b > 32 or (len(fields) <= 7 and fields[1] * b > 128)):
                            continue  # panels for small blocks, at most 128 features wide
                        elif fields[0] == "group" and (b > 64 or dt not in (torch.bfloat16, torch.float16)
                                                       or variant_config(fields, 64).accumulator_registers(b) > 128
                                                       or (b > 16 and fields[3] > 2)):
                            continue  # b 16-64 only, at most 128 accumulator registers; E 3-4 at b 16
                        elif fields[0] == "resident" and RS.resident_supported(
                                a, values, torch.empty(m, n, device=dev, dtype=dt), trans,
                                variant_config(fields, 64)) is not None:
                            continue  # what the kernel refuses: bprop, > 64 rows, b > 64, > 128 accumulator
                            # registers, more shared memory than the GPU has, a box past TMA's 256 rows
                        elif fields[0] == "gemv" and (m > GV.MAX_ROWS or fields[1] > max(16, b)):
                            continue  # 1-8 rows; slices at most the tile
                        elif fields[0] not in ("panel", "group", "resident", "gemv", "tma") and fields[0] > max(16, b):
                            continue  # slices wider than the tile
                        else:
                            cfg = variant_config(fields, variant_block_m(m), b)
                        per_problem = fields is not None and fields[0] in ("auto", "heuristic")
                        # ("auto" / "heuristic", "kmajor"): the same values stored K-major (A^T contiguous, so
                        # a block's activation tile is 16 rows of M contiguous elements, not M rows of 32 bytes)
                        kmajor = per_problem and fields[1] in ("kmajor", "kmajorT", "kmajorTT")
                        x_in = KM.as_kmajor(a) if kmajor else a
                        # kmajorT / kmajorTT: each timed call transposes the row-major activations first
                        # (PyTorch's copy / the library's tiled copy)
                        copy_of = {"kmajorT": lambda: a.t().contiguous().t(), "kmajorTT": lambda: KM.as_kmajor(a)}
                        as_called = copy_of.get(fields[1] if kmajor else None, lambda: x_in)
                        kmajor_switch = K.KMAJOR_SMALL  # (TILESPARSE_KMAJOR may have set it off)
                        K.KMAJOR_SMALL = kmajor_switch and not (per_problem and fields[1] == "rowmajor")
                        try:
                            try:
                                out = K.dds(x_in, values, meta, None, R, C, trans, cfg).float()
                            except OutOfResources as exc:  # e.g. a ring deeper than shared memory holds
                                print("SKIP", op, b, d, m, name, str(exc).splitlines()[0], flush=True)
                                continue
                            except Exception as exc:  # a config the compiler refuses: the sweep goes on
                                print("FAIL", op, b, d, m, name, type(exc).__name__,
                                      (str(exc).splitlines() or [""])[0][:200], flush=True)
                                continue
                            err = ((out - ref).norm() / ref.norm()).item()
                            if not err < 1e-2:
                                print("WRONG", op, b, d, m, name, err, flush=True)
                                continue
                            row[name] = kernel_ms(lambda: [K.dds(as_called(), v, meta, None, R, C, trans, cfg)
                                                           for v in all_values], copies)
                        finally:
                            K.KMAJOR_SMALL = kmajor_switch
                        if per_problem and not kmajor and cfg is not None:  # resolved here (kmajor: a change of
                            row[name + "_config"] = tuned.to_json(cfg)  # input, not of config: nothing to adopt)
                    if args.auto:
                        # whether the dispatcher's own run took the K-major path (its config is then not the table's)
                        row["auto_kmajor"] = K.KMAJOR_SMALL and KM.kmajor_pays(op, a, b, layout.nnz / (R * C), n * k)
                        out = K.dds(a, values, meta, None, R, C, trans).float()
                        row["auto_err"] = ((out - ref).norm() / ref.norm()).item()
                        if not row["auto_err"] < 1e-2:
                            print("WRONG", op, b, d, m, "auto", row["auto_err"], flush=True)
                        row["auto"] = kernel_ms(lambda: [K.dds(a, v, meta, None, R, C, trans) for v in all_values],
                                                copies)
                    small = {v: row[v] for v in SMALL_VARIANTS if v in row}
                    if not small:  # every variant skipped here: the dispatcher's choice stands in
                        small = {"auto": row.get("auto", row["large_ms"])}
                    best = min(small, key=small.get)
                    row["small_best"], row["small_ms"] = best, small[best]
                    row["small_bw_tbs"] = weight_bytes / (small[best] * 1e-3) / 1e12
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, f, indent=1)
    print(f"\n{time.time() - t0:.0f} s. crossover (largest M where small <= large):")
    for b in args.blocks:
        for d in args.densities:
            for op in ("fprop", "bprop"):
                sel = [r for r in rows if r["block"] == b and r["density"] == d and r["op"] == op]
                wins = [r["M"] for r in sel if r["small_ms"] <= r["large_ms"]]
                line = " ".join(f"M{r['M']}:{r['small_ms'] * 1e3:.0f}/{r['large_ms'] * 1e3:.0f}/{r['dense_ms'] * 1e3:.0f}us"
                                for r in sel)
                print(f"b{b} d{d} {op}: small wins up to M={max(wins) if wins else None}  [{line}]")


if __name__ == "__main__":
    main()
