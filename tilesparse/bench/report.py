"""Writing results: the CSV (fixed leading columns), a JSON sidecar with the
environment, a rich summary table and a PNG of speedup against density."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from . import COLUMNS, EXTRA_COLUMNS

__all__ = ["write_csv", "write_json", "print_table", "plot"]

PEER_ORDER = ("tilesparse", "torch_bsr", "stk")


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value


def write_csv(rows: list[dict], path: Path) -> Path:
    """COLUMNS first, in order, then the extras; empty cells for missing values."""
    extras = list(EXTRA_COLUMNS) + sorted({k for r in rows for k in r} - set(COLUMNS) - set(EXTRA_COLUMNS))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + extras)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(row.get(k)) for k in COLUMNS + extras})
    tmp.replace(path)  # a checkpoint never leaves a half-written file behind
    return path


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
    table = Table(title=title, show_lines=False)
    for name in ("dtype", "M x N x K", "op", "block", "density", "dense ms", "tilesparse ms"):
        table.add_column(name, justify="right")
    for method in present:
        table.add_column(f"{method} x", justify="right")
    table.add_column("rel_err", justify="right")
    table.add_column("note")
    groups: dict[tuple, dict] = {}
    dense_ms: dict[tuple, float] = {}
    for r in rows:
        base = (r["dtype"], r["M"], r["N"], r["K"], r["op"])
        if r["method"] == "dense":
            dense_ms[base] = r["ms"]
            continue
        groups.setdefault(base + (r["block"], r["density"]), {})[r["method"]] = r
    for key, by_method in groups.items():
        dtype, m, n, k, op, block, density = key
        ts = by_method.get("tilesparse", {})
        cells = [dtype, f"{m}x{n}x{k}", op, str(block), f"{density:g}",
                 _fmt(dense_ms.get(key[:5]), ".4f"), _fmt(ts.get("ms"), ".4f")]
        for method in present:
            speedup = by_method.get(method, {}).get("speedup_vs_dense")
            text = _fmt(speedup, ".2f")
            cells.append(f"[bold green]{text}[/]" if method == "tilesparse" and speedup and speedup >= 1 else text)
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
    styles = {"tilesparse": ("-", "o"), "torch_bsr": ("--", "s"), "stk": (":", "^")}
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
                    ls, marker = styles.get(method, ("-.", "x"))
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
