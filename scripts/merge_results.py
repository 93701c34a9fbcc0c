"""Concatenate suite CSVs that share one header into one file, in the order given: for a
suite run in parts (e.g. the small suite's M 1-64 and M 128-512 in two device steps,
each under its own timeout). ``python scripts/merge_results.py OUT.csv A.csv B.csv``."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path


def merge(out: Path, parts: list[Path]) -> int:
    """Write the rows of ``parts`` to ``out``; returns the row count. Raises ValueError
    naming the first part whose header differs from the first one's."""
    header, rows = None, []
    for part in parts:
        with open(part, newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            if head is None:
                raise ValueError(f"{part}: empty file, no header")
            if header is None:
                header = head
            elif head != header:
                raise ValueError(f"{part}: header differs from {parts[0]}'s")
            rows.extend(reader)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("parts", type=Path, nargs="+")
    args = p.parse_args(argv)
    try:
        n = merge(args.out, args.parts)
    except (OSError, ValueError) as exc:
        print(f"merge_results: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {n} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
