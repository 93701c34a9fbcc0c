"""Measured speedups of block-sparse layers over dense at few activation rows, one
generated module per weight shape measured (``w<N>x<K>.py``, by
scripts/gen_small_speedups.py from the small suite or a ``small_threshold.py --auto``
sweep). :mod:`tilesparse.ops.dense_dispatch` reads the table of the measured weight
nearest to a layer's (on a log scale of elements; from a factor of ``REACH`` below it up): the
calls' cost at few rows is latency as much as bytes, so a 4096² weight does not behave
like a 12288² one."""

from __future__ import annotations

import math

from . import w4096x4096, w12288x12288

__all__ = ["REACH", "TABLES", "nearest_table"]

REACH = 4  # a table speaks for weights within this factor of its own elements

# weight 'NxK' -> its module (SOURCE, UPDATES, WEIGHT, SMALL_SPEEDUPS: GPU -> op -> block -> M -> points)
TABLES = {module.WEIGHT: module for module in (w12288x12288, w4096x4096)}


def _elements(weight: str) -> int:
    return math.prod(map(int, weight.split("x")))


def nearest_table(weight_elements: int | None):
    """The module of the measured weight nearest to ``weight_elements`` (log scale), or
    None where it is not known or smaller than every table's elements / REACH (weights
    past the largest measured one take its table: larger weights stream longer, and
    block-sparse gains with that)."""
    if weight_elements is None or weight_elements < 1:
        return None
    ratio = {w: abs(math.log(weight_elements / _elements(w))) for w in TABLES}
    best = min(ratio, key=ratio.get)
    return TABLES[best] if weight_elements * REACH >= _elements(best) else None
