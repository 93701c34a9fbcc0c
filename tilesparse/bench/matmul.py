"""The block-sparse matmul suites: 'large' (GPU) and 'cpu-reference' (no GPU).

For every dtype and shape [M, N, K] (X [M, K], W [N, K]) the dense cuBLAS time of each
op is measured first; then for every block size and density a random layout (fixed
seed) is drawn, W's blocks are taken from a fresh random dense weight, and each method
of :mod:`tilesparse.bench.peers` runs each op: once to check its result against an fp32
dense reference (``rel_err``), then timed. Rows report the nominal density of the case
table; flops count the layout's actual blocks.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import layouts
from . import load_cases, register
from .peers import ADAPTERS, Operands
from .timing import bench_ms

__all__ = ["DTYPES", "OPS", "RunContext", "resolve_table", "run"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("fprop", "bprop", "updat", "step")
# rel_err above this marks a row as suspect (bf16 products of this size sit near 2e-3).
SUSPECT_REL_ERR = 5e-2


@dataclass
class RunContext:
    """What a suite needs from its caller: where it runs, how to log, and what to stamp
    on every row."""

    cuda: bool
    stamp: dict  # gpu, torch, triton, commit
    graph: bool = False  # time from CUDA graph replays (kernel time, no host overhead)
    log: Callable[[str], None] = print
    checkpoint: Callable[[list], None] = lambda rows: None  # called after every case
    skipped: dict = field(default_factory=dict)  # "method/op" -> reason


def resolve_table(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The case table of suite ``name`` with --quick's subset and command-line overrides
    applied; raises ValueError on an impossible case."""
    tables = load_cases("matmul")
    if name not in tables or name.startswith("_"):
        raise ValueError(f"no matmul case table named {name!r}")
    table = dict(tables[name])
    quick_subset = table.pop("quick", {})
    if quick:
        table.update(quick_subset)
    for key, value in (overrides or {}).items():
        if value:
            table[key] = value
    table["shapes"] = [tuple(int(v) for v in s) for s in table["shapes"]]
    for d in table["dtypes"]:
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for op in table["ops"]:
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    for d in table["densities"]:
        if not 0.0 < d <= 1.0:
            raise ValueError(f"density {d} is not in (0, 1]")
    for m, n, k in table["shapes"]:
        if min(m, n, k) < 1:
            raise ValueError(f"shape {m}x{n}x{k} has a non-positive dimension")
        for b in table["blocks"]:
            if b < 1 or n % b or k % b:
                raise ValueError(f"block {b} does not divide W [{n}, {k}] of shape {m}x{n}x{k}")
    return table


# --------------------------------------------------------------------------- checks


def _references(ops, x32: torch.Tensor, dy32: torch.Tensor, w32: torch.Tensor, sample) -> dict:
    """fp32 results of each op in ``ops`` (step: the tuple of the three); ``sample`` maps
    a dense dW to the method's form (identity for dense, the layout's blocks for sparse)."""
    base = {}
    needed = {o for op in ops for o in (("fprop", "bprop", "updat") if op == "step" else (op,))}
    if "fprop" in needed:
        base["fprop"] = x32 @ w32.t()
    if "bprop" in needed:
        base["bprop"] = dy32 @ w32
    if "updat" in needed:
        base["updat"] = sample(dy32.t() @ x32)
    if "step" in ops:
        base["step"] = (base["fprop"], base["bprop"], base["updat"])
    return base


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| (Frobenius, fp32); for a step, the worst of its three."""
    if isinstance(ref, tuple):
        errs = [rel_err(o, r) for o, r in zip(out, ref)]
        return math.nan if any(math.isnan(e) for e in errs) else max(errs)
    diff = (out.float() - ref).norm().item()
    scale = ref.norm().item()
    return diff / scale if scale > 0 else diff


# --------------------------------------------------------------------------- one measurement


def _measure(method: str, op: str, operands: Operands, ref, ctx: RunContext) -> dict | None:
    """Check and time one (method, op). Returns {'ms', 'rel_err', 'note'}, or None when a
    peer cannot run it (logged once per reason)."""
    fn, why = ADAPTERS[method](op, operands)
    if fn is None:
        if method == "tilesparse":
            return {"ms": None, "rel_err": None, "note": f"error: {why}"}
        ctx.skipped.setdefault(f"{method}/{op}", why)
        return None
    try:
        out = fn()
        if ctx.cuda:
            torch.cuda.synchronize()
        err = rel_err(out, ref)
        del out
        if not math.isfinite(err):
            return {"ms": None, "rel_err": err, "note": "error: NaN/Inf in the result; not timed"}
        note = ""
        try:
            ms = bench_ms(fn, cuda=ctx.cuda, graph=ctx.graph)
        except Exception as exc:
            if not ctx.graph:
                raise
            note = f"graph capture failed ({type(exc).__name__}); timed with do_bench"
            torch.cuda.synchronize()
            ms = bench_ms(fn, cuda=ctx.cuda)
    except Exception as exc:  # a peer that fails here is skipped, tilesparse gets an error row
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        if method != "tilesparse":
            ctx.skipped.setdefault(f"{method}/{op}", f"failed: {msg}")
            ctx.log(f"  [yellow]skip {method} {op}: {msg}[/]")
            return None
        return {"ms": None, "rel_err": None, "note": f"error: {msg}"}
    if err > SUSPECT_REL_ERR:
        note = "; ".join(filter(None, [note, f"suspect: rel_err above {SUSPECT_REL_ERR:.0e}"]))
    return {"ms": ms, "rel_err": err, "note": note}


def _row(suite, op, method, dtype_name, shape, block, density, flops, dense_ms, result, ctx) -> dict:
    m, n, k = shape
    ms = result["ms"]
    row = {
        "suite": suite, "op": op, "method": method, "dtype": dtype_name, "M": m, "N": n, "K": k,
        "block": block, "density": density, "ms": ms,
        "tflops_nnz": flops / (ms * 1e-3) / 1e12 if ms else None,
        "speedup_vs_dense": dense_ms / ms if ms and dense_ms else None,
    }
    row.update(ctx.stamp)
    row["rel_err"] = result["rel_err"]
    row["note"] = result["note"]
    return row


def _progress(row: dict) -> str:
    if row["ms"] is None:
        return f"  {row['op']:5} {row['method']:10} b={row['block']:<3} d={row['density']:<5} [red]{row['note']}[/]"
    return (
        f"  {row['op']:5} {row['method']:10} b={row['block']:<3} d={row['density']:<5} "
        f"{row['ms']:9.4f} ms {row['tflops_nnz']:7.1f} TFLOP/s {row['speedup_vs_dense']:6.2f}x "
        f"err {row['rel_err']:.1e}"
    )


# --------------------------------------------------------------------------- the suite


def _run_shape(suite: str, table: dict, dtype_name: str, shape, ctx: RunContext, rows: list[dict]) -> None:
    """Append the rows of one (dtype, shape) to ``rows``, checkpointing after every case."""
    m, n, k = shape
    dtype = DTYPES[dtype_name]
    device = torch.device("cuda" if ctx.cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(table["seed"])
    x = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
    dy = torch.randn(m, n, generator=gen, device=device, dtype=dtype)
    w_dense = (torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k**-0.5).to(dtype)
    x32, dy32, w32 = x.float(), dy.float(), w_dense.float()
    ctx.log(f"[bold]{suite} {dtype_name} M={m} N={n} K={k}[/]")
    dense_ms = {}
    dense_ops = Operands(x, dy, None, None, w_dense)
    refs = _references(table["ops"], x32, dy32, w32, lambda d: d)
    for op in table["ops"]:  # dense first: every sparse row's speedup needs it
        result = _measure("dense", op, dense_ops, refs[op], ctx)
        if result is None:
            continue
        dense_ms[op] = result["ms"]
        mult = 3 if op == "step" else 1
        rows.append(_row(suite, op, "dense", dtype_name, shape, 0, 1.0, mult * 2.0 * m * n * k, result["ms"], result, ctx))
        ctx.log(_progress(rows[-1]))
    del refs
    methods = ["tilesparse"] + [p for p in table["peers"] if p not in ("dense", "tilesparse")]
    for block in table["blocks"]:
        for density in table["densities"]:
            layout = layouts.random(n, k, block, density, seed=table["seed"], device=device)
            values = layout.gather(w_dense)
            operands = Operands(x, dy, layout, values, w_dense)
            w_sparse32 = layout.to_dense(values).float()
            nnz_flops = 2.0 * m * layout.nnz * block * block
            refs = _references(table["ops"], x32, dy32, w_sparse32, layout.gather)
            for op in table["ops"]:
                for method in methods:
                    result = _measure(method, op, operands, refs[op], ctx)
                    if result is None:
                        continue
                    mult = 3 if op == "step" else 1
                    row = _row(suite, op, method, dtype_name, shape, block, density, mult * nnz_flops,
                               dense_ms.get(op), result, ctx)
                    rows.append(row)
                    ctx.log(_progress(row))
            del operands, values, w_sparse32, layout, refs
            ctx.checkpoint(rows)


@contextlib.contextmanager
def _float32_precision(dtype_name: str):
    """fp32 cases run with TF32 tensor cores for every method (dense cuBLAS and the
    Triton kernels follow the same torch switch), as the fp32 goal is stated against
    dense TF32; the previous setting is restored after."""
    previous = torch.get_float32_matmul_precision()
    if dtype_name == "fp32":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def run(suite: str, table: dict, ctx: RunContext) -> list[dict]:
    """Run every (dtype, shape) of ``table``; rows in CSV order. fp32 rows use TF32."""
    rows: list[dict] = []
    for dtype_name in table["dtypes"]:
        for shape in table["shapes"]:
            start = time.perf_counter()
            with _float32_precision(dtype_name):
                _run_shape(suite, table, dtype_name, shape, ctx, rows)
            ctx.log(f"  ({time.perf_counter() - start:.0f} s)")
            if ctx.cuda:
                torch.cuda.empty_cache()
    return rows


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    return resolve_table(name, quick=quick, overrides=overrides)


for _name in ("large", "cpu-reference"):
    register(_name, prepare=prepare, run=run)
