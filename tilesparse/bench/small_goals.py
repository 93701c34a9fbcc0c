"""Check a small-batch suite CSV (``tilesparse bench --suite small``) against the small-batch issue's goals,
point by point.

The issue's goals (H200; each fraction against the copy bandwidth measured in the same run):

- for M 1-64, every block size, density 0.5 down to 0.03: fprop and bprop move the weight's bytes (values +
  indices) and the activations at >= 75 % of the copy bandwidth (``bw_fraction``); b 16 at >= 60 %;
- for M 1-512 at density <= 0.5: block-sparse is never slower than dense (``speedup_vs_dense`` >= 1).

Every weight shape in the CSV is checked. The suite's ``read`` rows (a kernel only reading the same bytes)
are the ceiling a point's bandwidth check is measured against in practice; :func:`read_ceiling` gives it. A
tilesparse row without a time (the kernel failed) is a goal not met.
"""

from __future__ import annotations

from . import large_goals
from .large_goals import Check, load

__all__ = ["BANDWIDTH_AT_LEAST", "B16_BANDWIDTH_AT_LEAST", "MAX_ROWS_BANDWIDTH", "MAX_ROWS_DENSE", "check_rows",
           "read_ceiling", "load", "format_table"]

BANDWIDTH_AT_LEAST = 0.75
B16_BANDWIDTH_AT_LEAST = 0.60
MAX_ROWS_BANDWIDTH = 64
MAX_ROWS_DENSE = 512
MAX_DENSITY = 0.5
OPS = ("fprop", "bprop")


def _point(r: dict) -> tuple:
    return f"{r['M']}x{r['N']}x{r['K']}", r["dtype"], r["op"], int(r["block"]), float(r["density"])


def check_rows(rows: list[dict]) -> list[Check]:
    """Every goal at every point of ``rows`` (a small-suite CSV's rows) where it applies."""
    checks = []
    for r in rows:
        if r["method"] != "tilesparse" or r["op"] not in OPS:
            continue
        shape, dtype, op, block, density = _point(r)
        m = int(r["M"])
        if density > MAX_DENSITY:
            continue
        if not r.get("ms"):  # the kernel failed at this point (the note says why): a goal not met, not a gap
            checks.append(Check(f"{op} ran, M {m}", shape, dtype, block, density, 0.0, 1.0, False))
            continue
        if m <= MAX_ROWS_BANDWIDTH and r.get("bw_fraction") not in (None, ""):
            wanted = B16_BANDWIDTH_AT_LEAST if block == 16 else BANDWIDTH_AT_LEAST
            measured = float(r["bw_fraction"])
            checks.append(Check(f"{op} bandwidth, M {m}", shape, dtype, block, density, measured, wanted,
                                measured >= wanted))
        if m <= MAX_ROWS_DENSE and r.get("speedup_vs_dense") not in (None, ""):
            measured = float(r["speedup_vs_dense"])
            checks.append(Check(f"{op} not slower than dense, M {m}", shape, dtype, block, density, measured, 1.0,
                                measured >= 1.0))
    return checks


def read_ceiling(rows: list[dict]) -> dict:
    """{(shape, dtype, op, block, density): bw_fraction of the suite's ``read`` row} (the same bytes only
    read, same run): what a kernel moving those bytes can reach at best."""
    return {_point(r): float(r["bw_fraction"]) for r in rows
            if r["method"] == "read" and r.get("bw_fraction") not in (None, "")}



def format_table(checks: list[Check], failed_only: bool = False, ceiling: dict | None = None) -> str:
    """:func:`large_goals.format_table` with the bare read's share at each bandwidth check's point (from
    ``ceiling``: :func:`read_ceiling`) and a count per goal kind."""
    def read(c: Check) -> str:
        share = (ceiling or {}).get((c.shape, c.dtype, c.goal.split()[0], c.block, c.density)) \
            if "bandwidth" in c.goal else None
        return "-" if share is None else f"{share:.2f}"

    return large_goals.format_table(checks, failed_only, ("read", read), ("bandwidth", "not slower than dense"))
