"""The 'small' suite: block-sparse weights at small batch (M 1..512), where an op is
bound by streaming W from memory, not by arithmetic (GitHub issue "Small-batch regime:
block-sparse weights streamed at >= 75% of HBM bandwidth").

It runs the matmul suite's code (:func:`tilesparse.bench.matmul.run`) on the 'small'
case table of ``cases/matmul.json``, which asks for CUDA-graph timing (a call here is
shorter than its host launch) and for operand rotation past L2 (graph replay does not
flush L2, and a sparse W of a few MB would otherwise be read from L2). Every row adds
``gbps`` (the op's nominal bytes, :func:`bytes_moved`, over its time) and
``bw_fraction`` (gbps over the device copy bandwidth measured in the same run). With the
table's ``"copy_reference": true`` each tilesparse row also gets a ``copy`` and a ``read``
row: an SM copy, and a plain read, of the same bytes (:mod:`.stream_reference`), timed the
same way, whose bw_fraction is the ceiling at that traffic (a stream of 9-30 MB pays
launch, ramp and tail too; the 1 GiB copy that sets the divisor barely does).
"""

from __future__ import annotations

import math

from ..layout import BlockLayout
from . import env, matmul, register, report, stream_reference
from .timing import rotation_copies

__all__ = ["bytes_moved", "copy_reference_rows", "COPY_METHOD", "READ_METHOD", "INDEX_BYTES", "prepare", "run"]

INDEX_BYTES = 4  # the kernels' lookup tables are int32
COPY_METHOD = "copy"
READ_METHOD = "read"
REFERENCE_NOTES = {COPY_METHOD: "an SM copy moving the row's bytes (half read, half written)",
                   READ_METHOD: "a plain read of the row's bytes"}
COPY_SHARE = 1.02  # rows whose traffic is within this factor share one reference timing


def bytes_moved(op: str, m: int, n: int, k: int, elem_bytes: int, layout: BlockLayout | None = None) -> int:
    """Bytes op ``op`` must move for X [m, k], W [n, k], Y [m, n] with ``elem_bytes`` per
    element: W stored dense (``layout`` None) or as ``layout``'s blocks. The count is
    what the op fundamentally reads and writes, the same for every method of a case, so
    bw_fraction compares methods on equal terms:

      fprop  W + row tables (block_rows+1 offsets, nnz block-cols) + X read + Y written
      bprop  W + column tables (block_cols+1 offsets, nnz block-rows, nnz slots) + dY read + dX written
      updat  dW written + (row_of, row_cols: 2 nnz) + dY and X read
      step   the sum of the three
    """
    if op == "step":
        return sum(bytes_moved(o, m, n, k, elem_bytes, layout) for o in ("fprop", "bprop", "updat"))
    if layout is None:
        weight, index = n * k * elem_bytes, 0
    else:
        if layout.shape != (n, k):
            raise ValueError(f"layout of shape {layout.shape} does not match W [{n}, {k}]")
        nnz, b = layout.nnz, layout.block_size
        weight = nnz * b * b * elem_bytes
        index = INDEX_BYTES * {
            "fprop": layout.block_rows + 1 + nnz,
            "bprop": layout.block_cols + 1 + 2 * nnz,
            "updat": 2 * nnz,
        }.get(op, 0)
    activations = {"fprop": m * k + m * n, "bprop": m * n + m * k, "updat": m * n + m * k}
    if op not in activations:
        raise ValueError(f"unknown op {op!r}; choose from fprop, bprop, updat, step")
    return weight + index + activations[op] * elem_bytes


def prepare(name: str, *, quick: bool = False, overrides: dict | None = None) -> dict:
    """The 'small' table (weights x batch sizes, or --shape's shapes); ValueError on an
    impossible case, e.g. a block that does not divide W."""
    return matmul.resolve_table(name, quick=quick, overrides=overrides)


def run(suite: str, table: dict, ctx: matmul.RunContext) -> list[dict]:
    """The matmul suite's rows, each with gbps and bw_fraction; then, with the table's
    ``copy_reference``, the copy and read rows (:func:`copy_reference_rows`)."""
    rows = matmul.run(suite, table, ctx, bytes_moved=bytes_moved)
    if table.get("copy_reference"):
        rows += copy_reference_rows(rows, ctx)
        ctx.checkpoint(rows)
    return rows


def copy_reference_rows(rows: list[dict], ctx: matmul.RunContext) -> list[dict]:
    """For each timed tilesparse row, a row of method ``copy`` and one of method ``read``:
    an SM copy moving the row's bytes (half read, half written) and a read of them, timed
    as the ops are (``ctx``'s CUDA-graph replay, cycling through enough buffers to stream
    past L2). Their ``speedup_vs_dense`` is the most any kernel of that traffic could gain
    over dense in this run."""
    timings: dict[tuple[str, int], tuple[float, str]] = {}
    out = []
    for r in rows:
        if r["method"] != "tilesparse" or not r.get("gbps") or not r.get("ms"):
            continue
        nbytes = round(r["gbps"] * 1e9 * r["ms"] * 1e-3)
        dense_ms = r["ms"] * r["speedup_vs_dense"] if r.get("speedup_vs_dense") else None
        for method, note in REFERENCE_NOTES.items():
            key = (method, round(math.log(nbytes) / math.log(COPY_SHARE)))
            if key not in timings:
                timings[key] = _stream_ms(method, nbytes, ctx)
            ms, timing_note = timings[key]
            gbps = nbytes / (ms * 1e-3) / 1e9
            out.append(dict(r, method=method, ms=ms, tflops_nnz=None, rel_err=None,
                            speedup_vs_dense=dense_ms / ms if dense_ms else None, gbps=gbps,
                            bw_fraction=gbps / ctx.copy_bandwidth_gbs if ctx.copy_bandwidth_gbs else None,
                            note="; ".join(filter(None, [note, timing_note]))))
    return out


def _stream_ms(method: str, nbytes: int, ctx: matmul.RunContext) -> tuple[float, str]:
    """(ms, note) of one ``method`` stream (copy or read) of nbytes of traffic, averaged
    over the buffer sets cycled."""
    device = "cuda" if ctx.cuda else "cpu"
    sets = rotation_copies(nbytes, env.l2_cache_bytes()) if ctx.cuda else 1
    make = stream_reference.copy_call if method == COPY_METHOD else stream_reference.read_call
    calls = [make(nbytes, device) for _ in range(sets)]
    ms, note = matmul.time_call(lambda: [call() for call in calls], ctx)
    return ms / sets, note


register("small", prepare=prepare, run=run, plot=report.plot_bandwidth)
