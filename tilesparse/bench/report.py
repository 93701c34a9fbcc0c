"""Writing results: the CSV (fixed leading columns), a JSON sidecar with the
environment, a rich summary table and a PNG: speedup against density, or, for suites
whose rows carry bandwidth ('small'), achieved bandwidth against M."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from . import BANDWIDTH_COLUMNS, COLUMNS, EXTRA_COLUMNS

__all__ = ["write_csv", "read_csv", "write_json", "print_table", "plot", "plot_bandwidth"]

PEER_ORDER = ("tilesparse", "tilesparse_t", "tilesparse_kmajor", "torch_bsr", "stk", "flex", "tilesparse_auto", "tilesparse_act24",
              "tilesparse_atomic", "copy", "read")
# Rows of these methods are a suite's dense baseline (the 'dense ms' column), not peers.
BASELINE_METHODS = ("dense", "cudnn", "sdpa", "act_dense")
METHOD_STYLES = {"tilesparse": ("-", "o"), "tilesparse_t": ("-.", "D"), "tilesparse_kmajor": ("-", "v"),
                 "torch_bsr": ("--", "s"),
                 "stk": (":", "^"), "copy": ((0, (1, 3)), "."), "read": ((0, (1, 3)), "x")}  # line, marker; copy / read:
# the small suite's same-traffic streams


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value


def write_csv(rows: list[dict], path: Path) -> Path:
    """COLUMNS first, in order, then EXTRA_COLUMNS, then BANDWIDTH_COLUMNS if any row has
    them, then any other keys sorted; empty cells for missing values."""
    keys = {k for r in rows for k in r}
    known = set(COLUMNS) | set(EXTRA_COLUMNS) | set(BANDWIDTH_COLUMNS)
    bandwidth = list(BANDWIDTH_COLUMNS) if keys & set(BANDWIDTH_COLUMNS) else []
    extras = list(EXTRA_COLUMNS) + bandwidth + sorted(keys - known)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + extras)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in COLUMNS + extras})
    tmp.replace(path)  # a checkpoint never leaves a half-written file behind
    return path


# Columns that hold text even where a value looks like a number (a commit of digits only, say).
TEXT_COLUMNS = frozenset(("suite", "op", "method", "dtype", "gpu", "torch", "triton", "commit", "note", "baseline",
                          "layout"))


def _value(column: str, text: str):
    if text == "":
        return None
    if column in TEXT_COLUMNS:
        return text
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path) -> list[dict]:
    """The rows :func:`write_csv` wrote, typed again (numbers as int / float, empty cells None), e.g. to
    draw the plot of runs merged with ``scripts/merge_results.py``."""
    with Path(path).open(newline="") as f:
        rows = [{k: _value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]
    missing = [c for c in ("suite", "op", "method") if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: not a suite CSV (no {', '.join(missing)} column)")
    return rows


def write_json(info: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2, default=str) + "\n")
    return path


def _fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(rows: list[dict], console, title: str = "") -> None:
    """One line per (shape, dtype, op, block, density): times, and each method's speedup
    over dense cuBLAS in the same run."""
    from rich.table import Table

    present = [m for m in PEER_ORDER if any(r["method"] == m for r in rows)]
    bandwidth = any(r.get("gbps") is not None for r in rows)
    table = Table(title=title, show_lines=False)
    for name in ("dtype", "M x N x K", "op", "block", "density", "dense ms", "tilesparse ms"):
        table.add_column(name, justify="right")
    for method in present:
        table.add_column(f"{method} x", justify="right")
    if bandwidth:
        table.add_column("tilesparse GB/s", justify="right")
        table.add_column("of copy bw", justify="right")
    table.add_column("rel_err", justify="right")
    table.add_column("note")
    groups: dict[tuple, dict] = {}
    dense_ms: dict[tuple, float] = {}
    for r in rows:
        base = (r["dtype"], r["M"], r["N"], r["K"], r["op"])
        if r["method"] in BASELINE_METHODS:
            if r.get("baseline", "equal_hidden") == "equal_hidden":  # lstm: equal-params rows are not the column
                dense_ms.setdefault(base, r["ms"])
            continue
        groups.setdefault(base + (r["block"], r["density"], r.get("layout", "")), {})[r["method"]] = r
    for key, by_method in groups.items():
        dtype, m, n, k, op, block, density, pattern = key
        ts = by_method.get("tilesparse", {})
        cells = [dtype, f"{m}x{n}x{k}", op, str(block), f"{density:.3g}" + (f" {pattern}" if pattern else ""),
                 _fmt(dense_ms.get(key[:5]), ".4f"), _fmt(ts.get("ms"), ".4f")]
        for method in present:
            speedup = by_method.get(method, {}).get("speedup_vs_dense")
            text = _fmt(speedup, ".2f")
            cells.append(f"[bold green]{text}[/]" if method == "tilesparse" and speedup and speedup >= 1 else text)
        if bandwidth:
            cells += [_fmt(ts.get("gbps"), ".0f"), _fmt(ts.get("bw_fraction"), ".0%")]
        cells.append(_fmt(ts.get("rel_err"), ".1e"))
        note = ts.get("note") or ""
        cells.append(f"[red]{note}[/]" if note.startswith("error") else note)
        table.add_row(*cells)
    console.print(table)


def plot(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Speedup over dense against density: one panel per (shape, dtype) x op, one line per
    method and block size. Returns None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sparse = [r for r in rows if r["method"] != "dense" and r.get("speedup_vs_dense")]
    if not sparse:
        return None
    shapes = list(dict.fromkeys((r["dtype"], r["M"], r["N"], r["K"]) for r in sparse))
    ops = list(dict.fromkeys(r["op"] for r in sparse))
    blocks = sorted({r["block"] for r in sparse})
    colors = {b: plt.cm.tab10(i % 10) for i, b in enumerate(blocks)}
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(len(shapes), len(ops), figsize=(4.2 * len(ops), 3.2 * len(shapes) + 0.8),
                             squeeze=False, layout="constrained")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for i, shape in enumerate(shapes):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            ax.axhline(1.0, color="black", lw=1, label="dense (same run)")
            for method in PEER_ORDER:
                for block in blocks:
                    pts = sorted((r["density"], r["speedup_vs_dense"]) for r in sparse
                                 if (r["dtype"], r["M"], r["N"], r["K"]) == shape and r["op"] == op
                                 and r["method"] == method and r["block"] == block)
                    if not pts:
                        continue
                    ls, marker = METHOD_STYLES.get(method, ("-.", "x"))
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker=marker, ms=4,
                            color=colors[block], label=f"{method} b{block}")
            densities = sorted({r["density"] for r in sparse})
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(densities)
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", alpha=0.3)
            dtype, m, n, k = shape
            ax.set_title(f"{op}  {dtype}  M={m} N={n} K={k}", fontsize=9)
            if j == 0:
                ax.set_ylabel("speedup vs dense")
            if i == len(shapes) - 1:
                ax.set_xlabel("density (fraction of blocks)")
    return _save(fig, axes, path, title)


def _save(fig, axes, path: Path, title: str) -> Path:
    """One legend for all panels below them, the title, the PNG; closes the figure."""
    import matplotlib.pyplot as plt

    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center",
               ncol=min(6, len(handles)), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# The goal for weight streaming at small batch, drawn on the bandwidth plot.
BANDWIDTH_GOAL = 0.75


def plot_bandwidth(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Achieved bandwidth against M: one panel per (dtype, W, op) x density, one line per
    method and block size, dense cuBLAS (the same in every density's panel) in black.
    The y axis is bw_fraction (of the copy bandwidth of the same run) with the 75% goal
    marked, or GB/s where no row has a fraction (no copy bandwidth measured). Returns
    None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, PercentFormatter

    key = "bw_fraction" if any(r.get("bw_fraction") for r in rows) else "gbps"
    timed = [r for r in rows if r.get(key)]
    sparse = [r for r in timed if r["method"] != "dense"]
    if not sparse:
        return None
    panels = list(dict.fromkeys((r["dtype"], r["N"], r["K"], r["op"]) for r in sparse))
    densities = sorted({r["density"] for r in sparse}, reverse=True)
    blocks = sorted({r["block"] for r in sparse})
    colors = {b: plt.cm.tab10(i % 10) for i, b in enumerate(blocks)}
    batch_sizes = sorted({r["M"] for r in timed})

    fig, axes = plt.subplots(len(panels), len(densities), figsize=(3.6 * len(densities), 2.9 * len(panels) + 0.8),
                             squeeze=False, sharey=True, layout="constrained")
    for i, panel in enumerate(panels):
        for j, density in enumerate(densities):
            ax = axes[i][j]

            def line(method, block, **style):
                pts = sorted((r["M"], r[key]) for r in timed
                             if (r["dtype"], r["N"], r["K"], r["op"]) == panel and r["method"] == method
                             and r["block"] == block and (method == "dense" or r["density"] == density))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ms=4, **style)

            line("dense", 0, color="black", marker="D", label="dense cuBLAS")
            for method in PEER_ORDER:
                ls, marker = METHOD_STYLES.get(method, ("-.", "x"))
                for block in blocks:
                    line(method, block, ls=ls, marker=marker, color=colors[block], label=f"{method} b{block}")
            if key == "bw_fraction":
                ax.axhline(BANDWIDTH_GOAL, color="grey", ls="--", lw=1, label=f"{BANDWIDTH_GOAL:.0%} of copy bandwidth")
                ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylim(bottom=0)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(batch_sizes))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", alpha=0.3)
            dtype, n, k, op = panel
            ax.set_title(f"{op}  {dtype}  W [{n}, {k}]  density {density:g}", fontsize=9)
            if j == 0:
                ax.set_ylabel("of copy bandwidth" if key == "bw_fraction" else "GB/s")
            if i == len(panels) - 1:
                ax.set_xlabel("M (batch rows)")
    return _save(fig, axes, path, title)
