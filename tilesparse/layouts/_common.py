"""Argument checks shared by the layout generators."""

from __future__ import annotations

import numbers

from ..layout import check_divisible


def block_grid(rows: int, cols: int, block_size: int) -> tuple[int, int]:
    """(block_rows, block_cols) of a [rows, cols] matrix; the same checks as BlockLayout's
    (non-negative ints, numpy's included, divisible by a positive int block size)."""
    check_divisible(rows, cols, block_size)
    return int(rows) // int(block_size), int(cols) // int(block_size)


def check_density(density: float) -> float:
    if isinstance(density, bool) or not isinstance(density, numbers.Real) or not 0.0 <= float(density) <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density!r}")
    return float(density)


def keep_count(density: float, total: int) -> int:
    """Number of blocks to keep: the nearest whole count to density * total."""
    return int(round(check_density(density) * total))


def check_int(name: str, value, *, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in [low, high] (either end optional); bools are not ints here,
    numpy integers are."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{name} must be in [{lo}, {hi}]{why}, got {value}")
    return value


def check_probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not -(1 << 63) <= seed < (1 << 64):  # what torch.Generator.manual_seed takes
        raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")
    return int(seed)
