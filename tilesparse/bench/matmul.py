"""The block-sparse matmul suites: 'large' (GPU) and 'cpu-reference' (no GPU); the
'small' suite (:mod:`tilesparse.bench.small`) runs through the same code.

For every dtype and shape [M, N, K] (X [M, K], W [N, K]) the dense cuBLAS time of each
op is measured first; then for every block size and density a random layout (fixed
seed) is drawn, W's blocks are taken from a fresh random dense weight, and each method
of :mod:`tilesparse.bench.peers` runs each op: once to check its result against an fp32
dense reference (``rel_err``), then timed. Rows report the nominal density of the case
table; flops count the layout's actual blocks.

Two options serve suites that judge memory traffic rather than flops: a ``bytes_moved``
function given to :func:`run` adds ``gbps`` and ``bw_fraction`` (over the copy bandwidth
measured in the same run) to every row, and a table's ``"cold_l2": true`` makes each
timed call cycle through copies of its operands, so that graph replays (which do not
flush L2) read them from HBM, not from L2.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import layouts
from ..layout import BlockLayout, longest_runs
from ..ops import dense_dispatch
from . import base_row, case_table, env, register
from .peers import ADAPTERS, Operands
from .timing import bench_ms_noted, rotation_copies

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
    autograd_threads: bool = True  # False: every method's step runs its backward on the calling thread
    copy_bandwidth_gbs: float | None = None  # measured by the caller in the same run; bw_fraction's divisor
    log: Callable[[str], None] = print
    checkpoint: Callable[[list], None] = lambda rows: None  # called after every case
    skipped: dict = field(default_factory=dict)  # "method/op" -> reason


def time_call(fn: Callable[[], object], ctx: RunContext, backward: bool = False) -> tuple[float, str]:
    """(ms, note) of one call of ``fn`` timed as ``ctx`` says (:func:`bench_ms_noted`).
    With ``ctx.autograd_threads`` off, a call that runs a backward (``backward``) is timed
    with autograd running it on the calling thread instead of its CUDA worker thread, and
    the note says so."""
    if ctx.autograd_threads or not backward:
        return bench_ms_noted(fn, cuda=ctx.cuda, graph=ctx.graph)
    with torch.autograd.set_multithreading_enabled(False):
        ms, note = bench_ms_noted(fn, cuda=ctx.cuda, graph=ctx.graph)
    return ms, "; ".join(filter(None, [note, "autograd worker threads off"]))


def positive_int(value, what: str) -> int:
    """``value`` if it is an int >= 1 (not a bool); else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def check_dtypes_ops_densities(table: dict, ops, suite: str = "") -> None:
    """Raise ValueError unless a case table's dtypes, ops (from ``ops``) and densities are
    valid: the checks every suite's ``prepare`` shares."""
    for d in table["dtypes"]:
        if d not in DTYPES:
            raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for op in table["ops"]:
        if op not in ops:
            raise ValueError(f"unknown op {op!r}{suite}; choose from {', '.join(ops)}")
    for d in table["densities"]:
        if not 0.0 < d <= 1.0:
            raise ValueError(f"density {d} is not in (0, 1]")


def resolve_table(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The case table of suite ``name`` with --quick's subset and command-line overrides
    applied; raises ValueError on an impossible case."""
    table = case_table("matmul", name, quick=quick, overrides=overrides)
    _expand_weights(table)
    table["shapes"] = [tuple(int(v) for v in s) for s in table["shapes"]]
    check_dtypes_ops_densities(table, OPS)
    for m, n, k in table["shapes"]:
        if min(m, n, k) < 1:
            raise ValueError(f"shape {m}x{n}x{k} has a non-positive dimension")
        for b in table["blocks"]:
            if b < 1 or n % b or k % b:
                raise ValueError(f"block {b} does not divide W [{n}, {k}] of shape {m}x{n}x{k}")
    return table


def _expand_weights(table: dict) -> None:
    """A table may give its shapes as ``weights`` [[N, K], ...] times ``batch_sizes``
    [M, ...] (every M for each weight, in order); explicit ``shapes`` (--shape) win."""
    weights, batch_sizes = table.pop("weights", None), table.pop("batch_sizes", None)
    if "shapes" in table:
        return
    if not weights or not batch_sizes:
        raise ValueError("a case table needs 'shapes', or 'weights' and 'batch_sizes'")
    for w in weights:
        if len(w) != 2:
            raise ValueError(f"a weight is [N, K], got {w!r}")
    table["shapes"] = [(m, n, k) for n, k in weights for m in batch_sizes]


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


def _measure(method: str, op: str, operands: Operands, ref, ctx: RunContext,
             copies: list[Operands] = ()) -> dict | None:
    """Check and time one (method, op). Returns {'ms', 'rel_err', 'note'}, or None when a
    peer cannot run it (logged once per reason). With ``copies`` (operand sets equal to
    ``operands``), the timed call runs the op on ``operands`` and then on each copy, and
    the time reported is per op call."""
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
        timed, calls = fn, 1
        if copies:
            fns = [fn] + [ADAPTERS[method](op, copy)[0] for copy in copies]
            timed, calls = _in_turn(fns), len(fns)
        ms, note = time_call(timed, ctx, backward=op == "step")
        ms /= calls
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


def _in_turn(fns: list[Callable[[], object]]) -> Callable[[], list]:
    """One call that runs each of ``fns`` once, keeping every result until all have run
    (so each writes its own output buffer, not one that L2 still holds)."""
    return lambda: [f() for f in fns]


def _row(suite, op, method, dtype_name, shape, block, density, flops, dense_ms, result, ctx,
         nbytes: int | None = None) -> dict:
    """One CSV row; with ``nbytes`` (the op's nominal traffic) also gbps and bw_fraction."""
    ms = result["ms"]
    row = base_row(suite, op, method, dtype_name, *shape, block, density, ms, flops, dense_ms, ctx.stamp)
    row["rel_err"] = result["rel_err"]
    row["note"] = result["note"]
    if nbytes is not None:
        gbps = nbytes / (ms * 1e-3) / 1e9 if ms else None
        row["gbps"] = gbps
        row["bw_fraction"] = gbps / ctx.copy_bandwidth_gbs if gbps and ctx.copy_bandwidth_gbs else None
    return row


def _progress(row: dict) -> str:
    if row["ms"] is None:
        return f"  {row['op']:5} {row['method']:10} b={row['block']:<3} d={row['density']:<5} [red]{row['note']}[/]"
    text = (
        f"  {row['op']:5} {row['method']:10} b={row['block']:<3} d={row['density']:<5} "
        f"{row['ms']:9.4f} ms {row['tflops_nnz']:7.1f} TFLOP/s {row['speedup_vs_dense']:6.2f}x "
        f"err {row['rel_err']:.1e}"
    )
    if row.get("gbps"):
        text += f" {row['gbps']:7.0f} GB/s"
        if row.get("bw_fraction"):
            text += f" ({row['bw_fraction']:.0%} of copy)"
    return text


# --------------------------------------------------------------------------- the suite


def _operand_copies(operands: Operands, ctx: RunContext, enabled: bool) -> list[Operands]:
    """Copies of ``operands`` (x, dy, and W as the case stores it: dense, or values with
    their own layout tables) so that one case's operand sets together exceed the L2 cache
    several times over (:func:`rotation_copies`); none on the CPU or when not enabled."""
    if not (enabled and ctx.cuda):
        return []
    count = rotation_copies(_footprint(operands), env.l2_cache_bytes()) - 1
    copies = []
    for _ in range(count):
        layout = operands.layout
        if layout is not None:  # its own tables too, so they are not read hot either
            layout = BlockLayout.from_mask_with_nnz(layout.mask, layout.block_size, layout.nnz,
                                                    runs=longest_runs(layout.meta))  # the same kernel choice
        copies.append(Operands(
            operands.x.clone(), operands.dy.clone(), layout,
            operands.values.clone() if operands.values is not None else None,
            operands.w_dense.clone() if operands.layout is None else operands.w_dense,
        ))
    return copies


def _footprint(operands: Operands) -> int:
    """Bytes a case's operands occupy: x, dy, and W (values and tables, or dense)."""
    weight = (operands.w_dense.nbytes if operands.layout is None
              else operands.values.nbytes + operands.layout.meta.nbytes)
    return operands.x.nbytes + operands.dy.nbytes + weight


def _run_shape(suite: str, table: dict, dtype_name: str, shape, ctx: RunContext, rows: list[dict],
               bytes_moved: Callable[..., int] | None = None) -> None:
    """Append the rows of one (dtype, shape) to ``rows``, checkpointing after every case.
    ``bytes_moved(op, m, n, k, elem_bytes, layout)`` (layout None: dense) adds gbps and
    bw_fraction to the rows; ``table["cold_l2"]`` times each op over operand copies."""
    m, n, k = shape
    dtype = DTYPES[dtype_name]
    elem_bytes = dtype.itemsize
    cold_l2 = bool(table.get("cold_l2"))
    device = torch.device("cuda" if ctx.cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(table["seed"])
    x = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
    dy = torch.randn(m, n, generator=gen, device=device, dtype=dtype)
    w_dense = (torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k**-0.5).to(dtype)
    x32, dy32, w32 = x.float(), dy.float(), w_dense.float()
    ctx.log(f"[bold]{suite} {dtype_name} M={m} N={n} K={k}[/]")

    def traffic(op, layout):
        return None if bytes_moved is None else bytes_moved(op, m, n, k, elem_bytes, layout)

    dense_ms = {}
    dense_ops = Operands(x, dy, None, None, w_dense)
    copies = _operand_copies(dense_ops, ctx, cold_l2)
    refs = _references(table["ops"], x32, dy32, w32, lambda d: d)
    for op in table["ops"]:  # dense first: every sparse row's speedup needs it
        result = _measure("dense", op, dense_ops, refs[op], ctx, copies)
        if result is None:
            continue
        dense_ms[op] = result["ms"]
        mult = 3 if op == "step" else 1
        rows.append(_row(suite, op, "dense", dtype_name, shape, 0, 1.0, mult * 2.0 * m * n * k, result["ms"], result,
                         ctx, traffic(op, None)))
        ctx.log(_progress(rows[-1]))
    del refs, copies
    methods = ["tilesparse"] + [p for p in table["peers"] if p not in ("dense", "tilesparse")]
    for block in table["blocks"]:
        for density in table["densities"]:
            layout = layouts.random(n, k, block, density, seed=table["seed"], device=device)
            values = layout.gather(w_dense)
            operands = Operands(x, dy, layout, values, w_dense)
            copies = _operand_copies(operands, ctx, cold_l2)
            w_sparse32 = layout.to_dense(values).float()
            nnz_flops = 2.0 * m * layout.nnz * block * block
            refs = _references(table["ops"], x32, dy32, w_sparse32, layout.gather)
            for op in table["ops"]:
                for method in methods:
                    result = _measure(method, op, operands, refs[op], ctx, copies)
                    if result is None:
                        continue
                    mult = 3 if op == "step" else 1
                    row = _row(suite, op, method, dtype_name, shape, block, density, mult * nnz_flops,
                               dense_ms.get(op), result, ctx, traffic(op, layout))
                    rows.append(row)
                    ctx.log(_progress(row))
            del operands, values, w_sparse32, layout, refs, copies
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


def run(suite: str, table: dict, ctx: RunContext, bytes_moved: Callable[..., int] | None = None) -> list[dict]:
    """Run every (dtype, shape) of ``table``; rows in CSV order. fp32 rows use TF32.
    ``bytes_moved``: see :func:`_run_shape` (the large suites pass none). The kernels are
    timed even where a layer would run as dense (``tilesparse.ops.dense_dispatch``)."""
    rows: list[dict] = []
    for dtype_name in table["dtypes"]:
        for shape in table["shapes"]:
            start = time.perf_counter()
            with _float32_precision(dtype_name), dense_dispatch.kernels_only():
                _run_shape(suite, table, dtype_name, shape, ctx, rows, bytes_moved)
            ctx.log(f"  ({time.perf_counter() - start:.0f} s)")
            if ctx.cuda:
                torch.cuda.empty_cache()
    return rows


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    return resolve_table(name, quick=quick, overrides=overrides)


for _name in ("large", "cpu-reference"):
    register(_name, prepare=prepare, run=run)
