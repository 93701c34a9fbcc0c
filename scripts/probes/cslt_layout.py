"""Characterise cuSPARSELt's compressed 2:4 layout on this GPU (through torch._cslt_compress),
as a step toward a Triton kernel that prunes and packs in one pass (2:4 activations, whose
masks change every call, cannot use semi24.value_map's per-mask gather).

Questions, each answered on a [rows, cols] bf16 matrix:
1. Value placement: with value maps learned for two different masks, is the slot of a kept
   value a function of (row, group, k-th kept in the group) alone? If so, print the slot
   formula's strides (the slot of (r, g, j) for small r, g).
2. Buffer shape and sizes: values, metadata, padding.
3. Metadata encoding: compress matrices where every group keeps the same pair (the 6
   patterns) and print the first metadata words; then flip one group's pattern at a time
   and print which metadata element and bits change, for a few (row, group) positions.

Not part of the library; findings go to docs/notes.md.

    python scripts/probes/cslt_layout.py [--rows 64 --cols 128] --out /tmp/cslt-layout.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from tilesparse.semi24 import value_map as value_maps
from tilesparse.semi24.value_map import build_value_map

PAIRS = list(itertools.combinations(range(4), 2))  # the 6 ways to keep 2 of 4


def _mask(rows, cols, pattern_of):
    """A 2:4 mask whose group (r, g) keeps PAIRS[pattern_of(r, g)]."""
    mask = torch.zeros(rows, cols // 4, 4, dtype=torch.bool)
    for r in range(rows):
        for g in range(cols // 4):
            mask[r, g, list(PAIRS[pattern_of(r, g)])] = True
    return mask.view(rows, cols)


def _slots(mask, dtype):
    """{(r, g, j): slot} from a value map: the j-th kept value of group g in row r."""
    value_maps._ROW_MAJOR.clear()  # decode in full (an index per slot), not the one-pass learn
    value_map = build_value_map(mask.cuda(), dtype)
    if value_map is None:
        return None, None
    rows, cols = mask.shape
    slots = {}
    for slot, flat in enumerate(value_map.index.tolist()):
        r, c = divmod(flat, cols)
        g = c // 4
        j = int(mask[r, g * 4:c].sum())  # kept values before it in its group
        slots[(r, g, j)] = slot
    return slots, value_map


def _meta(mask, dtype):
    rows, cols = mask.shape
    dense = torch.where(mask, torch.ones(rows, cols), torch.zeros(())).to(dtype).cuda()
    flat = torch._cslt_compress(dense).reshape(-1)
    return flat[rows * cols // 2:].view(torch.int16).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows, cols, dtype = args.rows, args.cols, torch.bfloat16
    report = {"rows": rows, "cols": cols}

    # 1. value placement under two masks
    a, map_a = _slots(_mask(rows, cols, lambda r, g: (r + g) % 6), dtype)
    b, _ = _slots(_mask(rows, cols, lambda r, g: (3 * r + 5 * g + 1) % 6), dtype)
    if a is None or b is None:
        print("value maps could not be learned: stop")
        return
    same = a == b
    report["placement_mask_independent"] = same
    print(f"1. slot depends only on (row, group, j): {same}")
    sample = {f"{r},{g},{j}": a[(r, g, j)] for r in range(3) for g in range(3) for j in range(2)}
    print("   slots of (r, g, j):", sample)
    report["slot_sample"] = sample
    # 2. sizes
    packed = torch._cslt_compress(torch.ones(rows, cols, dtype=dtype).cuda() * _mask(rows, cols, lambda r, g: 0)
                                  .to(dtype).cuda())
    report.update(shape=list(packed.shape), values=rows * cols // 2, meta_and_padding=packed.numel() - rows * cols // 2,
                  meta_in_map=map_a.meta.numel())
    print(f"2. compressed shape {tuple(packed.shape)}: {rows * cols // 2} values + "
          f"{packed.numel() - rows * cols // 2} metadata/padding elements (16-bit)")
    # 3. metadata: uniform patterns, then single-group flips
    uniform = {}
    for p, pair in enumerate(PAIRS):
        meta = _meta(_mask(rows, cols, lambda r, g, p=p: p), dtype)
        uniform[str(pair)] = [f"{int(x) & 0xFFFF:04x}" for x in meta[:8]]
        print(f"3. every group keeps {pair}: metadata starts {' '.join(uniform[str(pair)])}")
    report["uniform_meta"] = uniform
    base = _meta(_mask(rows, cols, lambda r, g: 0), dtype)
    flips = []
    for r, g in [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (2, 0), (7, 0), (8, 0), (0, 8), (15, 0), (16, 0)]:
        if r >= rows or g >= cols // 4:
            continue
        meta = _meta(_mask(rows, cols, lambda rr, gg, r=r, g=g: 5 if (rr, gg) == (r, g) else 0), dtype)
        changed = (meta != base).nonzero().flatten().tolist()
        detail = [(i, f"{int(base[i]) & 0xFFFF:04x}->{int(meta[i]) & 0xFFFF:04x}") for i in changed[:4]]
        flips.append({"row": r, "group": g, "changed": detail})
        print(f"   group (row {r}, group {g}) keeps (2, 3) instead of (0, 1): metadata elements {detail}")
    report["flips"] = flips
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
