"""Write tilesparse/ops/small_speedups/w<N>x<K>.py from a small-suite CSV (``tilesparse bench
--suite small``) or a ``scripts/probes/small_threshold.py --auto`` sweep (JSON): the measured
speedup over dense of fprop and bprop per block size, batch rows (M) and density, for the GPU
and weight shape in the file (one module per weight; ``small_speedups/__init__.py`` lists them).

    python scripts/gen_small_speedups.py bench/results/2026-11-30-nvidia-h200-small-m1-512-ca2277b.csv \
        --update-from bench/results/2026-11-30-nvidia-h200-small-mid-a-fe39cf4.json ...
    (an --update-from ending in .csv is a later small-suite run: its points replace the base's)
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.util
import json
from collections import defaultdict
from pathlib import Path

from tilesparse.kernels.tuned import gpu_slug

TARGETS = Path(__file__).resolve().parents[1] / "tilesparse" / "ops" / "small_speedups"


def target(weight: str) -> Path:
    """The generated module of weight 'NxK'."""
    return TARGETS / f"w{weight}.py"


def table_from_csv(path: Path) -> tuple[str, str, dict]:
    """(gpu slug, weight 'NxK', {op: {block: {M: ((density, speedup), ...)}}}) of the
    tilesparse rows of one small-suite CSV (one GPU, one weight shape, bf16)."""
    rows = [r for r in csv.DictReader(path.open()) if r["method"] == "tilesparse" and r["dtype"] == "bf16"]
    gpus = {gpu_slug(r["gpu"]) for r in rows}
    weights = {f"{r['N']}x{r['K']}" for r in rows}
    if len(gpus) != 1 or len(weights) != 1:
        raise SystemExit(f"{path}: expected one GPU and one weight shape, got {sorted(gpus)} {sorted(weights)}")
    return gpus.pop(), weights.pop(), _table((r["op"], int(r["block"]), int(r["M"]), float(r["density"]),
                                               float(r["speedup_vs_dense"])) for r in rows)


def _table(points) -> dict:
    """{op: {block: {M: ((density, speedup), ...)}}} of (op, block, M, density, speedup)
    points, sorted, speedups to 3 decimals; a point measured more than once (runs joined in
    one file) keeps its lower speedup."""
    table: dict = defaultdict(lambda: defaultdict(dict))
    for op, block, m, density, speedup in points:
        by_density = table[op][block].setdefault(m, {})
        by_density[density] = min(round(speedup, 3), by_density.get(density, float("inf")))
    return {op: {b: {m: tuple(sorted(p.items())) for m, p in sorted(ms.items())} for b, ms in sorted(blocks.items())}
            for op, blocks in table.items()}


def _dispatched_ms(r: dict) -> float:
    """A sweep row's time of the dispatcher's choice after its winners were adopted: the
    faster of its choice before (``auto``) and the sweep's configs, its ``default`` (the
    heuristic's) among them (an adopted one beat ``auto`` by > 3 %; where none did, this
    understates the time by at most 3 %)."""
    return min([r["auto"]] + [v for k, v in r.items()
                              if (k == "default" or k in _probe_variants()) and isinstance(v, float)])


def table_from_probe(path: Path) -> tuple[str, str, dict]:
    """(gpu slug, weight 'NxK', table) of a ``small_threshold.py --auto`` sweep, as
    :func:`table_from_csv` (its rows whose ``auto`` ran right; speedup = dense / the
    dispatcher's time, :func:`_dispatched_ms`)."""
    data = json.loads(path.read_text())
    return gpu_slug(data["gpu"]), data["weight"], _table(
        (r["op"], r["block"], r["M"], r["density"], r["dense_ms"] / _dispatched_ms(r))
        for r in data["rows"] if "auto" in r and r.get("auto_err", 1.0) < 1e-2)


# How far a sweep's dense time may be from the base's at the same (op, M) for its speedups to replace the
# base's: the sweep and the suite time dense alike at 12288² (75-80 µs both), but at 4096² the sweep's read
# 9.9-10.3 µs against the suite's 12.5-14.2 (its operand copies leave part of the 34 MB weight in L2), and
# speedups over differently timed dense runs do not mix.
DENSE_TOLERANCE = 0.10


def dense_ms(path: Path) -> dict:
    """{(op, M): dense ms} of a small-suite CSV (its ``dense`` rows) or a ``small_threshold.py`` sweep."""
    if path.suffix == ".csv":
        return {(r["op"], int(r["M"])): float(r["ms"]) for r in csv.DictReader(path.open()) if r["method"] == "dense"}
    return {(r["op"], r["M"]): r["dense_ms"] for r in json.loads(path.read_text())["rows"]}


def update_from_probe(table: dict, gpu: str, weight: str, path: Path, base_dense: dict | None = None) -> int:
    """Replace the points a later sweep (``scripts/probes/small_threshold.py --auto``, the
    same GPU and weight) timed, at the dispatcher's time after its winners were adopted
    (``measure_small_crossover.py --adopt``; :func:`_dispatched_ms`). Returns the points replaced.
    With ``base_dense`` (:func:`dense_ms` of the base), a sweep whose dense time at a point is more than
    ``DENSE_TOLERANCE`` from the base's is refused."""
    data = json.loads(path.read_text())
    if gpu_slug(data["gpu"]) != gpu or data["weight"] != weight:
        raise SystemExit(f"{path}: {data['gpu']} W {data['weight']}, not {gpu} W {weight}")
    replaced = 0
    for r in data["rows"]:
        points = table.get(r["op"], {}).get(r["block"], {}).get(r["M"])
        if points is None or "auto" not in r or not r.get("auto_err", 1.0) < 1e-2:
            continue
        base = (base_dense or {}).get((r["op"], r["M"]))
        if base is not None and abs(r["dense_ms"] / base - 1) > DENSE_TOLERANCE:
            raise SystemExit(f"{path}: dense {r['op']} at M {r['M']} timed {r['dense_ms'] * 1e3:.1f} µs against the "
                             f"base's {base * 1e3:.1f}: speedups over differently timed dense runs do not mix")
        speedup = round(r["dense_ms"] / _dispatched_ms(r), 3)
        new = tuple((d, speedup if d == r["density"] else s) for d, s in points)
        replaced += new != points
        table[r["op"]][r["block"]][r["M"]] = new
    return replaced


def update_from_csv(table: dict, gpu: str, weight: str, path: Path) -> int:
    """Replace the points a later small-suite CSV (the same GPU and weight; e.g. one block size
    re-run after a kernel change) timed. Returns the points replaced."""
    csv_gpu, csv_weight, later = table_from_csv(path)
    if csv_gpu != gpu or csv_weight != weight:
        raise SystemExit(f"{path}: {csv_gpu} W {csv_weight}, not {gpu} W {weight}")
    replaced = 0
    for op, blocks in later.items():
        for b, ms in blocks.items():
            for m, points in ms.items():
                old = table.get(op, {}).get(b, {}).get(m)
                if old is None:
                    continue
                measured = dict(points)
                new = tuple((d, measured.get(d, s)) for d, s in old)
                replaced += sum(a != c for a, c in zip(old, new))
                table[op][b][m] = new
    return replaced


@functools.lru_cache(maxsize=None)
def _probe_variants() -> dict:
    spec = importlib.util.spec_from_file_location("small_variants", Path(__file__).parent / "probes" /
                                                  "small_variants.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe.ALL_VARIANTS


def render(source: str, gpu: str, weight: str, table: dict, updates: tuple = ()) -> str:
    lines = [
        f'"""Measured speedups of block-sparse layers over dense at few activation rows, W {weight}.',
        "",
        f"Generated by scripts/gen_small_speedups.py from ``{source}``",
        f"({gpu}, bf16, W [{weight.replace('x', ', ')}], CUDA-graph kernel time, weights streamed",
        "from HBM), with the points later sweeps timed replaced (``UPDATES``).",
        ":mod:`tilesparse.ops.dense_dispatch` warns where these are below 1, and runs such calls",
        "as dense only where its model of the dense path (which scatters the whole weight on",
        "every call) says that is faster.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        f"SOURCE = {source!r}",
        f"UPDATES = {tuple(updates)!r}",
        f"WEIGHT = {weight!r}",
        "",
        "# GPU -> op -> block size -> M -> ((density, speedup over dense), ...)",
        "SMALL_SPEEDUPS = {",
        f"    {gpu!r}: {{",
    ]
    for op, blocks in sorted(table.items()):
        lines.append(f"        {op!r}: {{")
        for b, ms in blocks.items():
            lines.append(f"            {b}: {{")
            for m, points in ms.items():
                lines.append(f"                {m}: {points!r},")
            lines.append("            },")
        lines.append("        },")
    lines += ["    },", "}", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path, help="a small-suite CSV or a small_threshold.py --auto sweep (JSON)")
    p.add_argument("--update-from", type=Path, nargs="*", default=[],
                   help="small_threshold.py sweeps (--auto) or small-suite CSVs whose points replace the "
                        "base's, in order")
    args = p.parse_args()
    gpu, weight, table = (table_from_csv if args.base.suffix == ".csv" else table_from_probe)(args.base)
    root = TARGETS.parents[2]
    updates = []
    base_dense = dense_ms(args.base)
    for path in args.update_from:
        if path.suffix == ".csv":
            n = update_from_csv(table, gpu, weight, path)
        else:
            n = update_from_probe(table, gpu, weight, path, base_dense)
        updates.append(path.resolve().relative_to(root).as_posix())
        print(f"{path}: {n} points replaced")
    source = args.base.resolve().relative_to(root).as_posix()
    path = target(weight)
    path.write_text(render(source, gpu, weight, table, updates))
    print(f"wrote {path} ({gpu}, W {weight}); a new weight's module is listed in {TARGETS / '__init__.py'}")


if __name__ == "__main__":
    main()
