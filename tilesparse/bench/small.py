"""The 'small' suite: block-sparse weights at small batch (M 1..512), where an op is
bound by streaming W from memory, not by arithmetic (GitHub issue "Small-batch regime:
block-sparse weights streamed at >= 75% of HBM bandwidth").

It runs the matmul suite's code (:func:`tilesparse.bench.matmul.run`) on the 'small'
case table of ``cases/matmul.json``, which asks for CUDA-graph timing (a call here is
shorter than its host launch) and for operand rotation past L2 (graph replay does not
flush L2, and a sparse W of a few MB would otherwise be read from L2). Every row adds
``gbps`` (the op's nominal bytes, :func:`bytes_moved`, over its time) and
``bw_fraction`` (gbps over the device copy bandwidth measured in the same run).
"""

from __future__ import annotations

from ..layout import BlockLayout
from . import matmul, register, report

__all__ = ["bytes_moved", "INDEX_BYTES", "prepare", "run"]

INDEX_BYTES = 4  # the kernels' lookup tables are int32


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
    """The matmul suite's rows, each with gbps and bw_fraction."""
    return matmul.run(suite, table, ctx, bytes_moved=bytes_moved)


register("small", prepare=prepare, run=run, plot=report.plot_bandwidth)
