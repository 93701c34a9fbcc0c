"""The methods a suite times, as adapters: each takes an op name and the operands and
returns ``(fn, None)``, a zero-argument callable that runs the op and returns its
result, or ``(None, reason)`` when the method cannot express the op here.

Ops of a linear layer Y = X W^T, W [N, K] block-sparse (Gray et al. 2017 names):
  fprop  Y  = X W^T      [M, N]
  bprop  dX = dY W       [M, K]
  updat  dW = dY^T X     on W's blocks ([nnz, b, b]; dense: all of [N, K])
  step   fprop + bprop + updat, returned as (Y, dX, dW)

How 'step' is run, per method: through autograd for every method that has one
(``torch.autograd.grad`` of block_sparse_linear / F.linear / stk's dds Function, which
is what training runs, and does not accumulate into .grad); torch BSR has no sampled
product, so no updat and no step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import ops as ts_ops
from ..kernels.bsmm_kmajor import as_kmajor, kmajor_wins
from ..layout import BlockLayout

__all__ = ["Operands", "ADAPTERS", "DESCRIPTIONS", "torch_bsr_available", "stk_available"]

Result = tuple[Optional[Callable[[], object]], Optional[str]]


@dataclass
class Operands:
    """One case's inputs: x [M, K], dy [M, N], W = (values, layout) [N, K], and a dense
    weight of the same shape for cuBLAS (its values do not change cuBLAS's time)."""

    x: torch.Tensor
    dy: torch.Tensor
    layout: BlockLayout
    values: torch.Tensor
    w_dense: torch.Tensor


# --------------------------------------------------------------------------- tilesparse


def tilesparse(op: str, o: Operands) -> Result:
    x, dy, values, layout = o.x, o.dy, o.values, o.layout
    if op == "fprop":
        return (lambda: ts_ops.dds(x, values, layout, trans_b=True)), None
    if op == "bprop":
        return (lambda: ts_ops.dds(dy, values, layout)), None
    if op == "updat":
        return (lambda: ts_ops.sdd(dy, x, layout, trans_a=True)), None
    if op == "step":
        xg, wg = _leaf(x), _leaf(values)
        return _autograd_step(lambda: ts_ops.block_sparse_linear(xg, wg, layout), xg, wg, dy), None
    return None, f"unknown op {op!r}"


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


def _autograd_step(forward: Callable[[], torch.Tensor], xg: torch.Tensor, wg: torch.Tensor, dy: torch.Tensor):
    """A training step as every method's 'step' is timed: y = forward() on the leaves xg
    (activations) and wg (weights), then ``torch.autograd.grad`` of y for the output
    gradient dy; returns (y, dx, dw)."""

    def step():
        y = forward()
        dx, dw = torch.autograd.grad(y, (xg, wg), dy)
        return y, dx, dw

    return step


# --------------------------------------------------------------------------- dense cuBLAS


def dense(op: str, o: Operands) -> Result:
    x, dy, w = o.x, o.dy, o.w_dense
    if op == "fprop":
        return (lambda: torch.matmul(x, w.t())), None
    if op == "bprop":
        return (lambda: torch.matmul(dy, w)), None
    if op == "updat":
        return (lambda: torch.matmul(dy.t(), x)), None
    if op == "step":
        xg, wg = _leaf(x), _leaf(w)
        return _autograd_step(lambda: F.linear(xg, wg), xg, wg, dy), None
    return None, f"unknown op {op!r}"


# --------------------------------------------------------------------------- torch BSR


def torch_bsr_available() -> tuple[bool, str]:
    try:
        from torch.sparse._triton_ops import bsr_dense_mm
    except Exception as exc:  # private module: any import failure means "absent"
        return False, f"{type(exc).__name__}: {exc}"
    if bsr_dense_mm is None:  # defined as None when torch sees no usable triton / GPU
        return False, "torch.sparse._triton_ops.bsr_dense_mm is None (no triton/GPU for torch)"
    return True, ""


def _bsr(layout: BlockLayout, values: torch.Tensor) -> torch.Tensor:
    """A torch BSR tensor holding the same blocks (storage order is row-major in both)."""
    tables = layout.tables
    device = values.device
    crow = tables.row_ptr.to(device=device, dtype=torch.int64)
    col = tables.row_cols.to(device=device, dtype=torch.int64)
    with warnings.catch_warnings():  # "beta" and "invariant checks disabled": noise, once per case
        warnings.filterwarnings("ignore", message=".*[Ss]parse BSR tensor support is in beta.*")
        warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks are implicitly disabled.*")
        return torch.sparse_bsr_tensor(crow, col, values, size=layout.shape, check_invariants=False)


def torch_bsr(op: str, o: Operands) -> Result:
    if op not in ("fprop", "bprop"):
        return None, f"torch BSR has no {op} (no sampled dense-dense product)"
    if not o.x.is_cuda:
        return None, "torch BSR kernels need CUDA"
    ok, why = torch_bsr_available()
    if not ok:
        return None, why
    from torch.sparse._triton_ops import bsr_dense_mm

    layout, values = o.layout, o.values
    if op == "fprop":  # Y^T = W @ X^T
        w_bsr, rhs = _bsr(layout, values), o.x
    else:  # dX^T = W^T @ dY^T; W^T's blocks, in its own row-major order
        w_bsr, rhs = _bsr(layout.transpose(), layout.transposed_values(values)), o.dy
    return (lambda: bsr_dense_mm(w_bsr, rhs.t()).t()), None


# --------------------------------------------------------------------------- stk


def stk_available() -> tuple[bool, str]:
    try:
        import stk  # noqa: F401
        import stk.ops  # noqa: F401
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def _stk_matrix(layout: BlockLayout, values: torch.Tensor):
    """stk.Matrix of W: BCSR with int16 block indices, data in row-major block order."""
    import stk

    device = values.device
    coords = layout.coords.to(device)
    rows = coords[:, 0].to(torch.int16).contiguous()
    cols = coords[:, 1].to(torch.int16).contiguous()
    offsets = layout.tables.row_ptr.to(device=device, dtype=torch.int32)
    return stk.Matrix(torch.Size(layout.shape), values, rows, cols, offsets)


def stk(op: str, o: Operands) -> Result:
    if not o.x.is_cuda:
        return None, "stk needs CUDA"
    ok, why = stk_available()
    if not ok:
        return None, why
    if o.layout.block_size != 128:
        return None, "stk supports block 128 only"
    m = o.x.shape[0]
    n, k = o.layout.shape
    if m % 128 or n % 128 or k % 128:
        return None, "stk needs M, N, K multiples of 128"
    import stk as stk_lib

    w = _stk_matrix(o.layout, o.values)
    w_t = w.t()
    x, dy = o.x, o.dy
    fprop = lambda: stk_lib.ops.dds(x, w_t)  # noqa: E731  Y = X W^T
    bprop = lambda: stk_lib.ops.dds(dy, w)  # noqa: E731  dX = dY W
    updat = lambda: stk_lib.ops.sdd(dy.t(), x, w).data  # noqa: E731  dW = dY^T X on W's blocks
    if op == "step":  # through stk's own autograd Functions, as tilesparse's and dense's steps
        xg, data = _leaf(x), _leaf(o.values)
        w_t = _stk_matrix(o.layout, data).t()
        return _autograd_step(lambda: stk_lib.ops.dds(xg, w_t), xg, data, dy), None
    fn = {"fprop": fprop, "bprop": bprop, "updat": updat}.get(op)
    return (fn, None) if fn is not None else (None, f"unknown op {op!r}")


# --------------------------------------------------------------------------- tilesparse, W stored as Wᵀ


def tilesparse_transposed(op: str, o: Operands) -> Result:
    """fprop with W's blocks stored in Wᵀ's order (TransposedBlockSparseLinear's storage):
    X @ S on Wᵀ's block-rows (once the faster form at few rows for 16x16 blocks; level with
    the rows order since the fortieth session's deep-panel fix). fprop only (the
    other products are the 'tilesparse' rows). The copy and its tables are made here, and
    the call runs once, so a CUDA-graph capture of it finds every table built."""
    if op != "fprop":
        return None, "times fprop only (W stored as Wᵀ is for the forward; the other products are tilesparse's)"
    flipped = o.layout.transpose()
    values_t = o.layout.transposed_values(o.values)
    x = o.x

    def fprop():
        return ts_ops.dds(x, values_t, flipped)

    fprop()
    return fprop, None


def tilesparse_kmajor(op: str, o: Operands) -> Result:
    """fprop / bprop with the activations (x, dy) handed over K-major (A^T contiguous), as a
    producer that writes them so would (e.g. an RNN keeping its state transposed): the small
    kernel then reads each block's activation tile as b rows of M contiguous elements, with no
    transposing copy in the call (``tilesparse.kernels.bsmm_kmajor``). The K-major copy is made
    here, outside the timed call."""
    if op not in ("fprop", "bprop"):
        return None, "times fprop and bprop only (the products that gather activation tiles per block)"
    if not kmajor_wins(op, o.layout.block_size, o.x.shape[0], o.layout.density):
        return None, "times the points of the dispatcher's K-major table only (bsmm_kmajor.KMAJOR_WINS)"
    a = as_kmajor(o.x if op == "fprop" else o.dy)
    values, layout = o.values, o.layout
    return (lambda: ts_ops.dds(a, values, layout, trans_b=op == "fprop")), None


ADAPTERS: dict[str, Callable[[str, Operands], Result]] = {
    "tilesparse": tilesparse,
    "tilesparse_t": tilesparse_transposed,
    "tilesparse_kmajor": tilesparse_kmajor,
    "dense": dense,
    "torch_bsr": torch_bsr,
    "stk": stk,
}

# What each method runs, for the JSON sidecar (so a CSV row can be read without this file).
DESCRIPTIONS = {
    "tilesparse": {
        "fprop": "tilesparse.dds(x, values, layout, trans_b=True)",
        "bprop": "tilesparse.dds(dy, values, layout)",
        "updat": "tilesparse.sdd(dy, x, layout, trans_a=True)",
        "step": "autograd: y = block_sparse_linear(x, w, layout); torch.autograd.grad(y, (x, w), dy)",
    },
    "tilesparse_t": {
        "fprop": "tilesparse.dds(x, values_t, layout.transpose()): W stored as Wᵀ (TransposedBlockSparseLinear)",
    },
    "tilesparse_kmajor": {
        "fprop": "tilesparse.dds(xk, values, layout, trans_b=True), xk = bsmm_kmajor.as_kmajor(x) made beforehand",
        "bprop": "tilesparse.dds(dyk, values, layout), dyk = bsmm_kmajor.as_kmajor(dy) made beforehand",
    },
    "dense": {
        "fprop": "torch.matmul(x, w.t())",
        "bprop": "torch.matmul(dy, w)",
        "updat": "torch.matmul(dy.t(), x) (all of [N, K])",
        "step": "autograd: y = F.linear(x, w); torch.autograd.grad(y, (x, w), dy)",
    },
    "torch_bsr": {
        "fprop": "bsr_dense_mm(W_bsr, x.t()).t()",
        "bprop": "bsr_dense_mm(WT_bsr, dy.t()).t()",
    },
    "stk": {
        "fprop": "stk.ops.dds(x, W.t())",
        "bprop": "stk.ops.dds(dy, W)",
        "updat": "stk.ops.sdd(dy.t(), x, W).data",
        "step": "autograd (stk's Functions): y = stk.ops.dds(x, W.t()); torch.autograd.grad(y, (x, W.data), dy)",
    },
    "copy": {  # the small suite's reference rows (tilesparse.bench.small.copy_reference_rows)
        op: "torch.bitwise_or(src, 0, out=dst): int32 buffers of half the tilesparse row's bytes "
            "(read + written = its traffic); an SM kernel, not a graph's memcpy node"
        for op in ("fprop", "bprop", "updat", "step")
    },
    "read": {
        op: "a Triton kernel reading the tilesparse row's bytes (int32), one word stored per 32 KB read"
        for op in ("fprop", "bprop", "updat", "step")
    },
}
