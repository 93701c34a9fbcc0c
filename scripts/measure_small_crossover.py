"""Measure, per (op, block, density, M bucket), whether dds's small-batch kernel or its
large-batch kernel is faster, and record the winner as a tuned-config entry: the
measured thresholds the dispatcher uses for M 16..512 (issue: "the dispatcher picks the
faster of the small-batch and large-batch kernels ... with thresholds it has measured").

Both kernels run with their heuristic configs (``bsmm_small.small_config`` and
``bsmm.dds_config``) on a random layout of W [N, K], bf16, timed by CUDA-graph replay
with the block values rotated over enough copies to stream from HBM (not L2). M is
each bucket's largest value (the small kernel's worst case in the bucket).

    python scripts/measure_small_crossover.py --record tuned-crossover.json
    # then merge: python scripts/measure_small_crossover.py --merge tuned-crossover.json
    # adopt a variant sweep's winners (scripts/probes/small_threshold.py) where they beat
    # the heuristic's config by > 3 % in the same run:
    python scripts/measure_small_crossover.py --adopt small-variants.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import time
from pathlib import Path

import torch

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.kernels import bsmm_small as S
from tilesparse.kernels import tuned

SHIPPED = Path(tuned.__file__).parent / "tuned"
MIN_STREAMED_BYTES = 128 << 20  # --adopt: a timed pass must have read at least this (2x the H200's L2)


def measure(args) -> list[dict]:
    n, k = map(int, args.weight.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    rows = []
    for b in args.blocks:
        for d in args.densities:
            layout = ts.layouts.random(n, k, b, d, seed=0, device=dev)
            meta, R, C = layout.meta, layout.block_rows, layout.block_cols
            weight_bytes = layout.nnz * b * b * 2
            copies = rotation_copies(weight_bytes, l2_cache_bytes())  # a pass streams past L2
            values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
            for m in args.ms:
                x = torch.randn(m, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                for op, a, trans in (("fprop", x, True), ("bprop", dy, False)):
                    configs = {"small": S.small_config(m, b, dt, K.shared_memory_bytes(dev)),
                               "large": K.dds_config(m, b, dt)}
                    outs = {name: K.dds(a, values[0], meta, None, R, C, trans, cfg).float()
                            for name, cfg in configs.items()}
                    err = ((outs["small"] - outs["large"]).norm() / outs["large"].norm().clamp_min(1e-30)).item()
                    times = {name: bench_ms(lambda cfg=cfg: [K.dds(a, v, meta, None, R, C, trans, cfg) for v in values],
                                            cuda=True, graph=True, rep_ms=15) / copies
                             for name, cfg in configs.items()}
                    winner = min(times, key=times.get)
                    row = {"op": op, "block": b, "density": d, "M": m, "small_ms": times["small"],
                           "large_ms": times["large"], "winner": winner, "rel_diff": err,
                           "config": tuned.to_json(configs[winner]), "weight_bytes": weight_bytes}
                    rows.append(row)
                    print(f"{op} b{b:<3} d{d:<5} M{m:<4} small {times['small'] * 1e3:7.1f} us  "
                          f"large {times['large'] * 1e3:7.1f} us  -> {winner}  (outputs differ by {err:.1e})",
                          flush=True)
    return rows


def record(rows: list[dict], path: Path, gpu: str, weight: str) -> None:
    """Tuned entries (kept only where both kernels agree on the product), in a new file."""
    path.unlink(missing_ok=True)
    entries, notes = {}, {}
    for r in rows:
        if not r["rel_diff"] < 1e-2:
            print(f"not recorded (kernels disagree): {r}")
            continue
        key = tuned.key(gpu, r["op"], torch.bfloat16, r["block"], r["M"], r["density"])
        entries[key] = tuned.from_json(r["config"])
        notes[key] = {"small_ms": round(r["small_ms"], 5), "large_ms": round(r["large_ms"], 5),
                      "density": r["density"], "shape": f"{r['M']}x{weight}", "source": "small-crossover"}
    tuned.record(entries, path, notes)


def adopt(path: Path, per_shape: bool = False) -> None:
    """Write a variant sweep's winners into the shipped table of its GPU where they beat, in the same run,
    the variant that equals the heuristic config and the dispatcher's own choice (where timed) by
    more than 3 %, and the large-batch kernel; rows whose timed pass read under MIN_STREAMED_BYTES (weights possibly in L2) are
    skipped. The sweep's variant names are looked up in its own table (ALL_VARIANTS of
    scripts/probes/small_variants.py), or, for its per-problem variants (the dispatcher's or
    the heuristic's config with a change, e.g. autoL16), read from the config it recorded;
    where no variant equals the heuristic, the dispatcher's own choice (--auto) is the one
    to beat. per_shape: keyed by the sweep's weight shape too (the entries then apply to that
    weight only)."""
    data = json.loads(path.read_text())
    gpu = tuned.gpu_slug(data["gpu"])
    weight = tuple(map(int, data["weight"].split("x"))) if per_shape else None
    entries, notes = {}, {}
    for r in data["rows"]:
        if r.get("copies", 0) * r["weight_bytes"] < MIN_STREAMED_BYTES:
            print(f"skipped (its weights may have been read from L2): {r['op']} b{r['block']} d{r['density']} "
                  f"M{r['M']}")
            continue
        dt = torch.bfloat16
        heuristic = S.small_config(r["M"], r["block"], dt, 227 << 10)  # the H200's shared memory per block
        times = {}
        for name, ms in r.items():
            if name + "_config" in r:  # resolved by the sweep for this problem (its auto / heuristic variants)
                try:
                    times[name] = (tuned.from_json(r[name + "_config"]), ms)
                except ValueError:  # a config of a field since removed (a reverted experiment's)
                    pass
            elif name in _variants().ALL_VARIANTS:
                try:
                    times[name] = (_config(name, r["M"], r["block"]), ms)
                except ValueError:  # not a valid config (e.g. splits with chunks)
                    pass
        current = next((n for n, (cfg, _) in times.items() if cfg == heuristic), None)
        if current is None and "default" in r:  # the sweep's own "default" variant: the heuristic config
            times["default"] = (heuristic, r["default"])
            current = "default"
        if current is None and "auto" in r and r.get("auto_err", 1.0) < 1e-2:
            times["auto"] = (None, r["auto"])  # the dispatcher's own choice is what a winner must beat
            current = "auto"
        best = min(times, key=lambda n: times[n][1], default=None)
        if current is None or best is None:
            continue
        # adopted only if clearly ahead of the heuristic and of the dispatcher's own choice (a
        # tuned entry, where the sweep timed it (--auto) right), and ahead of the large-batch kernel;
        # the heuristic itself is adopted where it beats the dispatcher's entry (which it then
        # shadows), which needs that entry timed
        auto = r["auto"] if "auto" in r and r.get("auto_err", 1.0) < 1e-2 else float("inf")
        best_is_heuristic = times[best][0] == heuristic  # by config: default and defaultS may be one
        if best_is_heuristic and auto == float("inf"):
            continue
        rival = auto if best_is_heuristic else min(times[current][1], auto)
        if times[best][1] > 0.97 * rival or times[best][1] >= r["large_ms"]:
            continue
        best_config = times[best][0]
        times = {n: ms for n, (_, ms) in times.items()}
        if best_is_heuristic:  # the heuristic beat the table's entry
            current, times["auto"] = "auto", auto
        beaten = "dispatched" if current == "auto" else "heuristic"
        key = tuned.key(gpu, r["op"], dt, r["block"], r["M"], r["density"], weight)
        entries[key] = best_config
        notes[key] = {"small_ms": round(times[best], 5), f"{beaten}_ms": round(times[current], 5),
                      "density": r["density"], "shape": f"{r['M']}x{data['weight']}",
                      "source": f"small-variants ({path.name})"}
        print(f"{key}: {best} {times[best] * 1e3:.1f} us ({beaten} {current} {times[current] * 1e3:.1f} us)")
    tuned.record(entries, SHIPPED / f"{gpu}.json", notes)


@functools.lru_cache(maxsize=None)
def _variants():
    """scripts/probes/small_variants.py, the sweep's table of the variant names adopt() reads."""
    spec = importlib.util.spec_from_file_location("small_variants", Path(__file__).parent / "probes" /
                                                  "small_variants.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def _config(name: str, m: int, block: int):
    """The config a variant sweep's name stood for at M rows and block size ``block``, from
    the sweep's own table (ALL_VARIANTS, with the sweep's own rows-per-program rule)."""
    probe = _variants()
    return probe.variant_config(probe.ALL_VARIANTS[name], probe.variant_block_m(m), block)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weight", default="12288x12288", help="NxK")
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1, 0.05, 0.03])
    p.add_argument("--ms", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    p.add_argument("--record", type=Path, help="write the winners as tuned entries (and the raw rows beside)")
    p.add_argument("--merge", type=Path, help="merge a recorded file into the shipped table of its GPU, then exit")
    p.add_argument("--adopt", type=Path, help="a variant sweep's JSON: write its clear winners into the shipped "
                                              "table of its GPU, then exit")
    p.add_argument("--per-shape", action="store_true", help="--adopt: key the entries by the sweep's weight shape too")
    args = p.parse_args()
    if args.adopt:
        adopt(args.adopt, args.per_shape)
        return
    if args.merge:
        data = json.loads(args.merge.read_text())
        if data.get("format") != tuned.FORMAT:
            raise SystemExit(f"{args.merge}: unknown tuned-config format {data.get('format')!r}")
        by_gpu: dict[str, dict] = {}
        for key, entry in data.get("entries", {}).items():
            by_gpu.setdefault(key.split("|")[0], {})[key] = entry
        for gpu, entries in by_gpu.items():  # each GPU's entries into its own shipped table
            target = SHIPPED / f"{gpu}.json"
            notes = {k: {f: v for f, v in e.items() if f != "config"} for k, e in entries.items()}
            tuned.record({k: tuned.from_json(e["config"]) for k, e in entries.items()}, target, notes)
            print(f"merged {len(entries)} entries into {target}")
        if not by_gpu:
            print(f"{args.merge}: no entries")
        return
    t0 = time.time()
    rows = measure(args)
    gpu = tuned._gpu_slug(torch.cuda.current_device())
    if args.record:
        record(rows, args.record, gpu, args.weight)
        args.record.with_suffix(".rows.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "weight": args.weight, "rows": rows}, indent=1))
    print(f"\n{time.time() - t0:.0f} s. largest measured M where the small kernel wins:")
    for b in args.blocks:
        for d in args.densities:
            for op in ("fprop", "bprop"):
                wins = [r["M"] for r in rows if (r["block"], r["density"], r["op"]) == (b, d, op)
                        and r["winner"] == "small"]
                print(f"  b{b:<3} d{d:<5} {op}: {max(wins) if wins else 'none'}")


if __name__ == "__main__":
    main()
