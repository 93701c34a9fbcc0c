"""Benchmark suites for tilesparse, registered by name.

A suite is a pair of functions: ``prepare(name, quick=, overrides=)`` returns its case
table (raising ValueError on impossible input, before any GPU time is spent) and
``run(label, table, ctx)`` returns result rows (see :data:`COLUMNS`). Case tables
(shapes, blocks, densities, ops, dtypes) are data in ``cases/<family>.json``, not code,
so a sweep changes by editing one file. Later suites ('small', 'attention', 'semi24')
register themselves the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Callable

__all__ = [
    "COLUMNS", "EXTRA_COLUMNS", "SUITES", "Suite", "register", "get_suite", "suite_names", "load_cases",
]

# The CSV's leading columns, in this order; extras follow.
COLUMNS = [
    "suite", "op", "method", "dtype", "M", "N", "K", "block", "density", "ms",
    "tflops_nnz", "speedup_vs_dense", "gpu", "torch", "triton", "commit",
]
EXTRA_COLUMNS = ["rel_err", "note"]


@dataclass(frozen=True)
class Suite:
    name: str
    prepare: Callable[..., dict]
    run: Callable[..., list]


SUITES: dict[str, Suite] = {}


def register(name: str, *, prepare: Callable[..., dict], run: Callable[..., list]) -> Suite:
    """Make a suite callable as ``tilesparse bench --suite NAME``."""
    SUITES[name] = Suite(name, prepare, run)
    return SUITES[name]


def get_suite(name: str) -> Suite:
    _load_builtin_suites()
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(sorted(SUITES))}")
    return SUITES[name]


def suite_names() -> list[str]:
    _load_builtin_suites()
    return sorted(SUITES)


def load_cases(family: str) -> dict:
    """The case tables of one family: ``cases/<family>.json``, suite name -> table."""
    text = resources.files(__package__).joinpath("cases", f"{family}.json").read_text()
    return json.loads(text)


def _load_builtin_suites() -> None:
    from . import matmul  # noqa: F401  (registers 'large' and 'cpu-reference')
