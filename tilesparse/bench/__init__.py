"""Benchmark suites for tilesparse, registered by name.

A suite is a pair of functions: ``prepare(name, quick=, overrides=)`` returns its case
table (raising ValueError on impossible input, before any GPU time is spent) and
``run(label, table, ctx)`` returns result rows (see :data:`COLUMNS`), plus optionally
``plot(rows, path, title=)`` for its PNG (default: speedup against density). Case tables
(shapes, blocks, densities, ops, dtypes) are data in ``cases/<family>.json``, not code,
so a sweep changes by editing one file. A table's ``"graph": true`` makes CUDA-graph
replay its default timing. The 'lstm' and 'attention' families register themselves the
same way from their modules.
"""

from __future__ import annotations

import importlib
import json
import warnings
from dataclasses import dataclass
from importlib import resources
from typing import Callable

__all__ = [
    "COLUMNS", "EXTRA_COLUMNS", "BANDWIDTH_COLUMNS", "SUITES", "Suite",
    "register", "get_suite", "suite_of_label", "suite_names", "load_cases", "case_table", "base_row",
]

# The CSV's leading columns, in this order; extras follow.
COLUMNS = [
    "suite", "op", "method", "dtype", "M", "N", "K", "block", "density", "ms",
    "tflops_nnz", "speedup_vs_dense", "gpu", "torch", "triton", "commit",
]
EXTRA_COLUMNS = ["rel_err", "note"]
# Written after the extras, only when some row has them (the 'small' suite's rows do):
# achieved GB/s on the op's nominal bytes, and that over the device copy bandwidth.
BANDWIDTH_COLUMNS = ["gbps", "bw_fraction"]


def base_row(suite: str, op: str, method: str, dtype_name: str, m: int, n: int, k: int, block: int,
             density: float, ms: float | None, flops: float | None, ref_ms: float | None, stamp: dict) -> dict:
    """The :data:`COLUMNS` of one result row, in order: ``tflops_nnz`` from the op's
    nominal ``flops`` (None when not counted), ``speedup_vs_dense`` against ``ref_ms``
    (the baseline timed in the same run), then the run's stamp (gpu, versions, commit)."""
    row = {
        "suite": suite, "op": op, "method": method, "dtype": dtype_name, "M": m, "N": n, "K": k,
        "block": block, "density": density, "ms": ms,
        "tflops_nnz": flops / (ms * 1e-3) / 1e12 if ms and flops is not None else None,
        "speedup_vs_dense": ref_ms / ms if ms and ref_ms else None,
    }
    row.update(stamp)
    return row


@dataclass(frozen=True)
class Suite:
    name: str
    prepare: Callable[..., dict]
    run: Callable[..., list]
    plot: Callable[..., object] | None = None  # None: report.plot


SUITES: dict[str, Suite] = {}


def register(name: str, *, prepare: Callable[..., dict], run: Callable[..., list],
             plot: Callable[..., object] | None = None) -> Suite:
    """Make a suite callable as ``tilesparse bench --suite NAME``."""
    SUITES[name] = Suite(name, prepare, run, plot)
    return SUITES[name]


def get_suite(name: str) -> Suite:
    _load_builtin_suites()
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(sorted(SUITES))}")
    return SUITES[name]


def suite_of_label(label: str) -> Suite:
    """The suite a result's ``suite`` column names: its label less the run's suffixes
    (``-quick``, ``-graph``, ``-1thread``)."""
    _load_builtin_suites()
    name = label
    while name not in SUITES and name.rsplit("-", 1)[-1] in ("quick", "graph", "1thread"):
        name = name.rsplit("-", 1)[0]
    return get_suite(name)


def suite_names() -> list[str]:
    _load_builtin_suites()
    return sorted(SUITES)


def load_cases(family: str) -> dict:
    """The case tables of one family: ``cases/<family>.json``, suite name -> table."""
    text = resources.files(__package__).joinpath("cases", f"{family}.json").read_text()
    return json.loads(text)


def case_table(family: str, name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """Table ``name`` of ``cases/<family>.json`` with its ``_``-prefixed notes dropped,
    its ``quick`` subset applied when asked, then the non-empty ``overrides``; ValueError
    for an unknown name. Each suite validates the result."""
    tables = load_cases(family)
    if name not in tables or name.startswith("_"):
        raise ValueError(f"no {family} case table named {name!r}")
    table = {key: value for key, value in tables[name].items() if not key.startswith("_")}
    quick_subset = table.pop("quick", {})
    if quick:
        table.update(quick_subset)
    table.update({key: value for key, value in (overrides or {}).items() if value})
    return table


def _load_builtin_suites() -> None:
    from . import matmul  # noqa: F401  (registers 'large' and 'cpu-reference')
    from . import small  # noqa: F401  (registers 'small')

    # Suites of other capabilities register themselves from their own modules; one that
    # fails to import (e.g. its op's module is missing) warns and the others still load.
    for module in ("lstm", "attention", "semi24"):  # + 'lstm-paper'; 'attention-long', '-cpu'; 'semi24-cpu'
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ImportError as exc:
            warnings.warn(f"benchmark suite module {module!r} not loaded: {type(exc).__name__}: {exc}", stacklevel=2)
