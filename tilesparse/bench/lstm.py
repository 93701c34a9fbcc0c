"""The 'lstm' suite: BlockSparseLSTM against torch.nn.LSTM (cuDNN) on a sequence.

Two ops per case, each timed over a whole sequence of ``steps`` timesteps and ``batch``
sequences (``ms``; ``ms_per_step`` = ms / steps):

* ``lstm_step``: a training step, forward + backward (``torch.autograd.grad`` of the
  output for a fixed random output gradient, w.r.t. the input and every weight, so
  nothing accumulates into ``.grad``);
* ``lstm_fwd``: forward only, under ``torch.no_grad`` (inference).

Baselines (method ``cudnn``, block 0, density 1): nn.LSTM at the same hidden size H
(``baseline`` = equal_hidden; ``speedup_vs_dense`` of every row is measured against it)
and at equal parameters (``baseline`` = equal_params: the dense hidden Hd, rounded to a
multiple of 8, whose 4Hd^2 + 4HdI is closest to the sparse model's stored weights, the
input size I unchanged; a sparse row's ``speedup_vs_equal_params`` compares to it).

Columns: M = batch * steps, N = 4H, K = H (the recurrent weight [4H, H]); extras
``hidden``, ``input_size``, ``batch``, ``steps``, ``params`` (stored weight elements),
``baseline``, ``ms_per_step``, ``speedup_vs_equal_params``, ``time_loops`` (how the sparse model's time
loops ran: its own CUDA graphs by default on a GPU), ``rel_err`` (the sparse
model's forward output against its own dense copy, ``to_dense_lstm``, run by nn.LSTM in
fp32) and ``note``. ``tflops_nnz`` counts 2 flops per stored weight element per row of
M (x3 for a training step: fprop, bprop, updat); the cell's pointwise math is not
counted. fp32 cases run with TF32 for every method.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from .. import layouts
from ..nn import BlockSparseLSTM
from ..ops import lstm as ops_lstm, lstm_graphs
from . import base_row, case_table, register
from .matmul import (DTYPES, SUSPECT_REL_ERR, RunContext, _float32_precision, check_dtypes_ops_densities,
                     positive_int, rel_err, time_call)

__all__ = ["OPS", "BASELINES", "resolve_table", "dense_hidden_for", "run", "prepare"]

OPS = ("lstm_step", "lstm_fwd")
BASELINES = ("equal_hidden", "equal_params")


def resolve_table(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The case table ``name`` of cases/lstm.json with --quick and overrides applied;
    raises ValueError naming the bad entry. Overrides: any table key; ``shapes``
    ([M, N, K] each, as the CLI's --shape gives) sets the hidden sizes (K, with N = 4K)
    and the batch (M / steps, one M for all)."""
    overrides = dict(overrides or {})
    shapes = overrides.pop("shapes", None)
    table = case_table("lstm", name, quick=quick, overrides=overrides)
    steps = positive_int(table["steps"], "steps")
    if shapes:
        shapes = [tuple(int(v) for v in s) for s in shapes]
        for m, n, k in shapes:
            if n != 4 * k:
                raise ValueError(f"shape {m}x{n}x{k}: an LSTM's recurrent weight is [4H, H], so N must be 4K")
        if len({m for m, _, _ in shapes}) != 1 or shapes[0][0] % steps:
            raise ValueError(f"shapes must share one M = batch * steps (steps = {steps}), got {shapes}")
        table["hidden"] = [k for _, _, k in shapes]
        table["batch"] = shapes[0][0] // steps
    batch = positive_int(table["batch"], "batch")
    hidden = [positive_int(h, "hidden") for h in table["hidden"]]
    if not hidden:
        raise ValueError("hidden lists no sizes")
    input_size = table["input_size"]
    if input_size != "hidden":
        positive_int(input_size, "input_size (an int or \"hidden\")")
    check_dtypes_ops_densities(table, OPS, " for the lstm suite")
    for base in table["baselines"]:
        if base not in BASELINES:
            raise ValueError(f"unknown baseline {base!r}; choose from {', '.join(BASELINES)}")
    for b in table["blocks"]:
        positive_int(b, "block")
        for h in hidden:
            if h % b:
                raise ValueError(f"block {b} does not divide hidden size {h}")
            if table["sparse_input"] and input_size != "hidden" and input_size % b:
                raise ValueError(f"block {b} does not divide input_size {input_size} (sparse_input is on)")
    # [M, N, K] per hidden size, for the CLI's summary line and the rows.
    table["shapes"] = [(batch * steps, 4 * h, h) for h in hidden]
    return table


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    return resolve_table(name, quick=quick, overrides=overrides)


def dense_hidden_for(params: int, input_size: int, multiple: int = 8) -> int:
    """The dense hidden Hd (a multiple of ``multiple``, at least that) whose LSTM weights
    4Hd^2 + 4HdI are closest to ``params``: the root of Hd^2 + I Hd - params/4 = 0."""
    exact = (-input_size + math.sqrt(input_size**2 + params)) / 2
    low = max(multiple, int(exact // multiple) * multiple)
    cost = lambda h: abs(4 * h * h + 4 * h * input_size - params)  # noqa: E731
    return min((low, low + multiple), key=cost)


# --------------------------------------------------------------------------- timed calls


def _step_fn(model, x, grad_out):
    """Forward + backward of one sequence, gradients returned (not accumulated)."""
    wrt = [x, *(p for p in model.parameters() if p.requires_grad)]

    def step():
        out, _ = model(x)
        return torch.autograd.grad(out, wrt, grad_out)

    return step


def _fwd_fn(model, x):
    def fwd():
        with torch.no_grad():
            return model(x)[0]

    return fwd


def _measure(method: str, fn, ctx: RunContext, backward: bool = False) -> dict | None:
    """Time one call; tilesparse failures become error rows, cudnn failures a skip."""
    try:
        ms, note = time_call(fn, ctx, backward)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if method != "tilesparse":
            ctx.skipped.setdefault(method, f"failed: {msg}")
            ctx.log(f"  [yellow]skip {method}: {msg}[/]")
            return None
        return {"ms": None, "note": f"error: {msg}"}
    finally:
        if ctx.cuda:
            torch.cuda.synchronize()
    return {"ms": ms, "note": note}


# --------------------------------------------------------------------------- rows


def _row(suite, op, method, dtype_name, batch, steps, hidden, input_size, block, density, params, result,
         dense_ms, ctx, **extra) -> dict:
    ms = result["ms"]
    flops = 2.0 * batch * steps * params * (3 if op == "lstm_step" else 1)
    row = base_row(suite, op, method, dtype_name, batch * steps, 4 * hidden, hidden, block, density, ms, flops,
                   dense_ms, ctx.stamp)
    row.update({"hidden": hidden, "input_size": input_size, "batch": batch, "steps": steps, "params": params,
                "ms_per_step": ms / steps if ms else None, "rel_err": None, "speedup_vs_equal_params": None})
    row.update(extra)
    row["note"] = result["note"]
    return row


def _time_loops(ctx: RunContext) -> str:
    """How the sparse model's time loops ran (the ``time_loops`` column): 'suite graph' (--cuda-graph),
    'loop graphs' (eager, the op's own CUDA graphs: ops/lstm_graphs.py), 'step plans' (eager, each step
    launched by the per-sequence plans), 'per-step dispatch', or 'cpu'."""
    if not ctx.cuda:
        return "cpu"
    if ctx.graph:
        return "suite graph"
    if lstm_graphs.GRAPHS:
        return "loop graphs"
    return "step plans" if ops_lstm.STEP_PLANS else "per-step dispatch"


def _progress(row: dict) -> str:
    what = f"  {row['op']:9} {row['method']:10} H={row['hidden']:<5} b={row['block']:<3} d={row['density']:<5}"
    if row["ms"] is None:
        return f"{what} [red]{row['note']}[/]"
    text = f"{what} {row['ms']:9.3f} ms ({row['ms_per_step']:.4f}/step)"
    if row.get("speedup_vs_dense"):
        text += f" {row['speedup_vs_dense']:6.2f}x vs cuDNN same H"
    if row.get("speedup_vs_equal_params"):
        text += f" {row['speedup_vs_equal_params']:6.2f}x vs cuDNN equal params"
    if row.get("rel_err") is not None:
        text += f" err {row['rel_err']:.1e}"
    return text


def _dense_lstm(input_size, hidden, dtype, device) -> nn.LSTM:
    return nn.LSTM(input_size, hidden, device=device, dtype=dtype)


def _dense_params(input_size: int, hidden: int) -> int:
    return 4 * hidden * hidden + 4 * hidden * input_size


def _time_model(model, method, table, dtype, device, ctx, gen, input_size) -> dict:
    """{op: result} for one model: a fresh input [T, B, I] (requires grad, as in a stack)
    and output gradient per model."""
    steps, batch = table["steps"], table["batch"]
    hidden = model.hidden_size
    x = torch.randn(steps, batch, input_size, generator=gen, device=device).to(dtype).requires_grad_()
    grad_out = torch.randn(steps, batch, hidden, generator=gen, device=device).to(dtype)
    results = {}
    for op in table["ops"]:
        fn = _step_fn(model, x, grad_out) if op == "lstm_step" else _fwd_fn(model, x)
        results[op] = _measure(method, fn, ctx, backward=op == "lstm_step")
    return results


def _check(model: BlockSparseLSTM, dtype, device, gen, table, input_size) -> tuple[float | None, str]:
    """rel_err of the sparse model's forward output against nn.LSTM on its dense fp32 copy."""
    steps, batch = table["steps"], table["batch"]
    try:
        x = torch.randn(steps, batch, input_size, generator=gen, device=device).to(dtype)
        with torch.no_grad():
            out = model(x)[0]
            dense = model.to_dense_lstm().float()
            ref = dense(x.float())[0]
        err = rel_err(out, ref)
        del dense, ref, out
    except Exception as exc:  # an error here is a tilesparse error: reported on its rows
        return None, f"error: check failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if not math.isfinite(err):
        return err, "error: NaN/Inf in the output"
    return err, (f"suspect: rel_err above {SUSPECT_REL_ERR:.0e}" if err > SUSPECT_REL_ERR else "")


def _run_hidden(suite: str, table: dict, dtype_name: str, hidden: int, ctx: RunContext, rows: list) -> None:
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda" if ctx.cuda else "cpu")
    steps, batch = table["steps"], table["batch"]
    input_size = hidden if table["input_size"] == "hidden" else table["input_size"]
    gen = torch.Generator(device=device).manual_seed(table["seed"])
    ctx.log(f"[bold]{suite} {dtype_name} hidden={hidden} input={input_size} batch={batch} steps={steps}[/]")

    dense_ms: dict[str, float] = {}
    if "equal_hidden" in table["baselines"]:
        torch.manual_seed(table["seed"])
        dense = _dense_lstm(input_size, hidden, dtype, device)
        results = _time_model(dense, "cudnn", table, dtype, device, ctx, gen, input_size)
        del dense
        for op, result in results.items():
            if result is None:
                continue
            dense_ms[op] = result["ms"]
            rows.append(_row(suite, op, "cudnn", dtype_name, batch, steps, hidden, input_size, 0, 1.0,
                             _dense_params(input_size, hidden), result, result["ms"], ctx,
                             baseline="equal_hidden"))
            ctx.log(_progress(rows[-1]))
        ctx.checkpoint(rows)

    equal_cache: dict[int, dict] = {}  # dense hidden -> {op: result}
    for block in table["blocks"]:
        for density in table["densities"]:
            torch.manual_seed(table["seed"])
            kwargs = dict(block_size=block, layout=layouts.random(4 * hidden, hidden, block, density,
                                                                  seed=table["seed"]))
            if table["sparse_input"]:
                kwargs.update(sparse_input=True, input_density=density)
            model = BlockSparseLSTM(input_size, hidden, seed=table["seed"], device=device, dtype=dtype, **kwargs)
            params = model.hh.weight.numel() + (
                model.ih.weight.numel() if model.ih is not None else model.weight_ih.numel())
            err, check_note = _check(model, dtype, device, gen, table, input_size)
            results = _time_model(model, "tilesparse", table, dtype, device, ctx, gen, input_size)
            del model
            if ctx.cuda:
                torch.cuda.empty_cache()

            hd, equal = None, {}
            if "equal_params" in table["baselines"]:
                hd = dense_hidden_for(params, input_size)
                if hd not in equal_cache:
                    torch.manual_seed(table["seed"])
                    dense = _dense_lstm(input_size, hd, dtype, device)
                    equal_cache[hd] = _time_model(dense, "cudnn", table, dtype, device, ctx, gen, input_size)
                    del dense
                equal = equal_cache[hd]
            for op, result in results.items():
                note = "; ".join(filter(None, [result["note"], check_note]))
                eq_ms = (equal.get(op) or {}).get("ms")
                row = _row(suite, op, "tilesparse", dtype_name, batch, steps, hidden, input_size, block, density,
                           params, {"ms": result["ms"], "note": note}, dense_ms.get(op), ctx,
                           baseline="", rel_err=err, time_loops=_time_loops(ctx),
                           speedup_vs_equal_params=eq_ms / result["ms"] if eq_ms and result["ms"] else None)
                rows.append(row)
                ctx.log(_progress(row))
            for op, result in equal.items():
                if result is None:
                    continue
                note = "; ".join(filter(None, [result["note"],
                                               f"equal params to tilesparse b{block} d{density} (hidden {hidden})"]))
                rows.append(_row(suite, op, "cudnn", dtype_name, batch, steps, hd, input_size, 0, 1.0,
                                 _dense_params(input_size, hd), {"ms": result["ms"], "note": note},
                                 dense_ms.get(op), ctx, baseline="equal_params"))
                ctx.log(_progress(rows[-1]))
            ctx.checkpoint(rows)


def run(suite: str, table: dict, ctx: RunContext) -> list[dict]:
    """Run every (dtype, hidden) of ``table``; fp32 cases with TF32."""
    rows: list[dict] = []
    for dtype_name in table["dtypes"]:
        for hidden in table["hidden"]:
            start = time.perf_counter()
            with _float32_precision(dtype_name):
                _run_hidden(suite, table, dtype_name, hidden, ctx, rows)
            ctx.log(f"  ({time.perf_counter() - start:.0f} s)")
            if ctx.cuda:
                torch.cuda.empty_cache()
    return rows


def plot_lstm(rows: list[dict], path, title: str = ""):
    """Time per timestep against hidden size (log-log): one panel per (dtype, op);
    cuDNN at each hidden size in black, cuDNN at the sparse models' parameter counts as
    grey points, tilesparse one line per (block, density). Returns None when nothing
    was timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("ms_per_step")]
    if not any(r["method"] == "tilesparse" for r in timed):
        return None
    panels = list(dict.fromkeys((r["dtype"], r["op"]) for r in timed))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False, layout="constrained")
    densities = sorted({r["density"] for r in timed if r["method"] == "tilesparse"}, reverse=True)
    colors = {d: plt.cm.viridis(i / max(1, len(densities) - 1)) for i, d in enumerate(densities)}
    styles = ["-", "--", ":", "-."]
    for ax, (dtype, op) in zip(axes[0], panels):
        mine = [r for r in timed if (r["dtype"], r["op"]) == (dtype, op)]

        def series(select):
            pts = sorted((r["hidden"], r["ms_per_step"]) for r in mine if select(r))
            return [p[0] for p in pts], [p[1] for p in pts]

        xs, ys = series(lambda r: r["method"] == "cudnn" and r.get("baseline") == "equal_hidden")
        if xs:
            ax.plot(xs, ys, color="black", marker="D", label="cuDNN (same hidden)")
        xs, ys = series(lambda r: r["method"] == "cudnn" and r.get("baseline") == "equal_params")
        if xs:
            ax.scatter(xs, ys, color="grey", marker="s", s=18, label="cuDNN (equal parameters)", zorder=3)
        blocks = sorted({r["block"] for r in mine if r["method"] == "tilesparse"})
        for bi, block in enumerate(blocks):
            for density in densities:
                xs, ys = series(lambda r: r["method"] == "tilesparse" and r["block"] == block
                                and r["density"] == density)
                if xs:
                    ax.plot(xs, ys, ls=styles[bi % len(styles)], marker="o", color=colors[density],
                            label=f"tilesparse b{block} d{density:g}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("hidden size")
        ax.set_ylabel("ms per timestep")
        ax.set_title(f"{op} {dtype}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


register("lstm", prepare=prepare, run=run, plot=plot_lstm)
register("lstm-paper", prepare=prepare, run=run, plot=plot_lstm)  # the paper's very wide, ~97 % sparse layer
