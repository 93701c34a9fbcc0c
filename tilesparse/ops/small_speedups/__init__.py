"""Measured speedups of block-sparse layers over dense at few activation rows, one
generated module per weight shape measured (``w<N>x<K>.py``, by
scripts/gen_small_speedups.py from the small suite or a ``small_threshold.py --auto``
sweep). :mod:`tilesparse.ops.dense_dispatch` reads the table of the measured weight
nearest to a layer's (on a log scale of elements; from a factor of ``REACH`` below it up)
among those that measured the call's rows: the
calls' cost at few rows is latency as much as bytes, so a 4096² weight does not behave
like a 12288² one."""

from __future__ import annotations

import math

from . import w4096x4096, w12288x12288

__all__ = ["MOST_ROWS", "REACH", "TABLES", "nearest_table"]

REACH = 4  # a table speaks for weights from this factor below its own elements up

# weight 'NxK' -> its module (SOURCE, UPDATES, WEIGHT, SMALL_SPEEDUPS: GPU -> op -> block -> M -> points)
TABLES = {module.WEIGHT: module for module in (w12288x12288, w4096x4096)}


def _elements(weight: str) -> int:
    return math.prod(map(int, weight.split("x")))


def _most_rows(module) -> int:
    """The most activation rows a table measured (any GPU, op, block size)."""
    return max((m for ops in module.SMALL_SPEEDUPS.values() for blocks in ops.values() for by_m in blocks.values()
                for m in by_m), default=0)


MOST_ROWS = {weight: _most_rows(module) for weight, module in TABLES.items()}


def nearest_table(weight_elements: int | None, rows: int = 1):
    """The module of the measured weight nearest to ``weight_elements`` (log scale) among
    those that measured ``rows`` rows or more and whose elements / REACH the weight reaches
    (weights past the largest measured one take its table: larger weights stream longer,
    and block-sparse gains with that); None where the weight is not known or no table
    qualifies."""
    if weight_elements is None or weight_elements < 1:
        return None
    usable = [w for w in TABLES if MOST_ROWS[w] >= rows and weight_elements * REACH >= _elements(w)]
    if not usable:
        return None
    return TABLES[min(usable, key=lambda w: abs(math.log(weight_elements / _elements(w))))]
