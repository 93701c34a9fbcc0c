"""Adopt fewer warps per program into the shipped table's small-kernel entries, from a warps sweep.

A sweep of ``scripts/probes/small_threshold.py`` with the variants ``autoW1`` / ``autoW2`` times the
dispatcher's own config (``auto``) and the same config at 1 / 2 warps, in one run. For every row where
the dispatcher ran a shipped ``small`` entry on row-major activations (the row's ``autoW*_config`` is
that entry with its warps replaced, and ``auto`` did not take the K-major path), the entry takes the fastest warp count when it beat the entry's
own time by more than ``--margin`` (noise); its ``small_ms`` becomes the measured time and ``source``
names the sweep. Entries the sweep did not reach are left alone.

    python scripts/adopt_small_warps.py bench/results/...-small-warps44-*.json --source warps44
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from tilesparse.kernels import bsmm_kmajor, tuned

TABLE = Path(__file__).resolve().parents[1] / "tilesparse" / "kernels" / "tuned" / "nvidia-h200.json"


def _keys(gpu: str, op: str, block: int, m: int, density: float, weight: str) -> list[str]:
    """The table keys the dispatcher tries for this problem, shape-specific first (bf16)."""
    shape = tuple(int(n) for n in weight.split("x"))
    return tuned.lookup_keys(gpu, op, torch.bfloat16, block, m, density, shape)


def _without_warps(config: dict):
    """The config a JSON object names, its warps set to 1 (so configs differing in warps only compare equal)."""
    return dataclasses.replace(tuned.from_json(config), num_warps=1) if config else None


def adopt(rows: list[dict], weight: str, entries: dict, source: str, margin: float, gpu: str) -> list[str]:
    """Update ``entries`` in place; returns one line per entry changed."""
    changed = []
    for row in rows:
        key = next((k for k in _keys(gpu, row["op"], row["block"], row["M"], row["density"], weight)
                    if k in entries), None)
        if key is None or "auto" not in row:
            continue
        # ``auto`` on K-major activations ran another config than the entry's (sweeps before the row said so:
        # the table of today decides, which skips at least what the sweep's did)
        if row.get("auto_kmajor", bsmm_kmajor.kmajor_wins(row["op"], row["block"], row["M"], row["density"])):
            continue
        entry = entries[key]
        if entry["config"].get("kind") != "small":
            continue
        timed = {w: row[f"autoW{w}"] for w in (1, 2) if f"autoW{w}" in row
                 and _without_warps(row.get(f"autoW{w}_config", {})) == _without_warps(entry["config"])}
        if not timed:  # the dispatcher ran another config than this entry (e.g. a shape-specific one)
            continue
        warps = min(timed, key=timed.get)
        if warps != entry["config"]["num_warps"] and timed[warps] < row["auto"] * (1 - margin):
            old = entry["config"]["num_warps"]
            entry["config"]["num_warps"] = warps
            entry["small_ms"] = round(timed[warps], 5)
            entry["source"] = f"{entry.get('source', '')}+{source}".lstrip("+")
            changed.append(f"{key}: {old} -> {warps} warps, {row['auto'] * 1e3:.1f} -> {timed[warps] * 1e3:.1f} us")
    return changed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweeps", nargs="+", help="small_threshold.py JSON files")
    p.add_argument("--source", required=True, help="the name the changed entries' 'source' gets")
    p.add_argument("--margin", type=float, default=0.03, help="the gain to count as more than noise")
    p.add_argument("--table", default=str(TABLE))
    args = p.parse_args()
    table = json.loads(Path(args.table).read_text())
    gpu = table["device"]["gpu"]
    for path in args.sweeps:
        sweep = json.loads(Path(path).read_text())
        for line in adopt(sweep["rows"], sweep["weight"], table["entries"], args.source, args.margin, gpu):
            print(line)
    Path(args.table).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
