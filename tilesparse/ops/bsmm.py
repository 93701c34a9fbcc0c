"""Registered block-sparse matmul ops, their autograd, and the public functions.

Layers: Triton kernels (:mod:`tilesparse.kernels.bsmm`) or the PyTorch reference,
picked by device -> ``torch.library`` custom ops ``tilesparse::dds`` and
``tilesparse::sdd`` with fakes, so ``torch.compile(fullgraph=True)`` traces them ->
autograd that closes over the same two products -> public functions below. In eager
mode the same impls and gradients run through plain ``autograd.Function``s instead of
the custom-op dispatch (see _DdsFunction for what was measured).

Names follow stk: the letters give the density of output, lhs and rhs
(s = block-sparse, d = dense).
"""

from __future__ import annotations

import math

from typing import Optional

import torch

from .. import _checks
from ..kernels import bsmm as kernels
from ..layout import BlockLayout
from ..reference import dds_reference, sdd_reference
from . import dense_dispatch

__all__ = ["block_sparse_linear", "dds", "dsd", "sdd"]


# --------------------------------------------------------------------------- device dispatch


def _dds_impl(a, values, meta, bias, block_rows, block_cols, trans):
    """C = A @ op(S) (+ bias): Triton on CUDA, the PyTorch reference on CPU and for fp64
    (there is no fp64 tensor-core path)."""
    if a.device.type != "cuda" or a.dtype == torch.float64:
        return dds_reference(a, values, meta, bias, block_rows, block_cols, trans)
    return kernels.dds(a, values, meta, bias, block_rows, block_cols, trans)


def _sdd_impl(a, b, meta, block_size, block_rows, block_cols):
    """values[z] = (A @ B)[block z]: Triton on CUDA, the reference on CPU and for fp64."""
    if a.device.type != "cuda" or a.dtype == torch.float64:
        return sdd_reference(a, b, meta, block_size, block_rows, block_cols)
    return kernels.sdd(a, b, meta, block_size, block_rows, block_cols)


def _dds_plan(values, meta, bias, block_rows, block_cols, trans, like: torch.Tensor, plan: bool = True):
    """C = A @ op(S) (+ bias) for many A shaped like ``like`` (a recurrence's steps): a callable
    ``(a, out=None) -> C`` (``out``: a buffer C may be written into); on CUDA (not fp64, ``plan``)
    ``kernels.DdsPlan`` (dispatched once), else :func:`_dds_impl` each call."""
    if plan and like.device.type == "cuda" and like.dtype != torch.float64:
        return kernels.DdsPlan(values, meta, bias, block_rows, block_cols, trans)
    return lambda a, out=None: _dds_impl(a, values, meta, bias, block_rows, block_cols, trans)


# --------------------------------------------------------------------------- registered ops
# What torch.compile sees: opaque ops with fakes, so fullgraph tracing never breaks.


@torch.library.custom_op("tilesparse::dds", mutates_args=())
def _dds_op(
    a: torch.Tensor,
    values: torch.Tensor,
    meta: torch.Tensor,
    bias: Optional[torch.Tensor],
    block_rows: int,
    block_cols: int,
    trans: bool,
) -> torch.Tensor:
    """C = A @ op(S) (+ bias), S = (values, meta) on a [block_rows, block_cols] grid."""
    return _dds_impl(a, values, meta, bias, block_rows, block_cols, trans)


@_dds_op.register_fake
def _dds_fake(a, values, meta, bias, block_rows, block_cols, trans):
    b = values.shape[-1]
    return a.new_empty(a.shape[0], (block_rows if trans else block_cols) * b)


@torch.library.custom_op("tilesparse::sdd", mutates_args=())
def _sdd_op(
    a: torch.Tensor,
    b: torch.Tensor,
    meta: torch.Tensor,
    block_size: int,
    block_rows: int,
    block_cols: int,
) -> torch.Tensor:
    """values[z] = (A @ B)[block z] on the layout's blocks; A [R*b, M], B [M, C*b]."""
    return _sdd_impl(a, b, meta, block_size, block_rows, block_cols)


@_sdd_op.register_fake
def _sdd_fake(a, b, meta, block_size, block_rows, block_cols):
    nnz = (meta.shape[0] - block_rows - block_cols - 2) // 4
    return a.new_empty(nnz, block_size, block_size)


# --------------------------------------------------------------------------- autograd
# The backward of each product is two calls of the same family (Gray et al.'s fprop /
# bprop / updat). The registered ops' backward calls the registered ops (what
# AOTAutograd traces); the eager Functions' backward calls the eager Functions, so
# gradients of gradients work in both.


def _dds_grads(dds, sdd, ctx, grad):
    a, values, meta = ctx.saved_tensors
    block_rows, block_cols = ctx.grid
    b = values.shape[-1]
    grad_a = grad_values = grad_bias = None
    if ctx.needs_input_grad[0]:  # bprop: dA = dC @ op(S)^T
        grad_a = dds(grad, values, meta, None, block_rows, block_cols, not ctx.trans)
    if ctx.needs_input_grad[1]:  # updat: dS sampled on the layout
        if ctx.trans:  # C = A S^T  ->  dS = dC^T A
            grad_values = sdd(grad.t(), a, meta, b, block_rows, block_cols)
        else:  # C = A S  ->  dS = A^T dC
            grad_values = sdd(a.t(), grad, meta, b, block_rows, block_cols)
    if ctx.has_bias and ctx.needs_input_grad[3]:
        grad_bias = grad.sum(0)
    return grad_a, grad_values, None, grad_bias, None, None, None


def _sdd_grads(dds, ctx, grad_values):
    a, b, meta = ctx.saved_tensors
    block_rows, block_cols = ctx.grid
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:  # dA = S @ B^T = (B @ S^T)^T
        grad_a = dds(b, grad_values, meta, None, block_rows, block_cols, True).t()
    if ctx.needs_input_grad[1]:  # dB = A^T @ S
        grad_b = dds(a.t(), grad_values, meta, None, block_rows, block_cols, False)
    return grad_a, grad_b, None, None, None, None


def _dds_save(ctx, a, values, meta, bias, block_rows, block_cols, trans):
    ctx.save_for_backward(a, values, meta)
    ctx.grid = (block_rows, block_cols)
    ctx.trans = trans
    ctx.has_bias = bias is not None


def _sdd_save(ctx, a, b, meta, block_size, block_rows, block_cols):
    ctx.save_for_backward(a, b, meta)
    ctx.grid = (block_rows, block_cols)


_dds_op.register_autograd(
    lambda ctx, grad: _dds_grads(_dds_op, _sdd_op, ctx, grad),
    setup_context=lambda ctx, inputs, output: _dds_save(ctx, *inputs),
)
_sdd_op.register_autograd(
    lambda ctx, grad: _sdd_grads(_dds_op, ctx, grad),
    setup_context=lambda ctx, inputs, output: _sdd_save(ctx, *inputs),
)


class _DdsFunction(torch.autograd.Function):
    """Eager twin of tilesparse::dds: the same impl and gradients without the custom-op
    dispatch. Old-style forward(ctx, ...): the new style binds arguments with
    inspect.signature on every call. Why a twin: a cProfile of the step on the H200
    charged ~0.3 ms per call to the custom-op layer; a later direct timing (no grad,
    scripts/profile_host.py) did not confirm it (111 µs via the op, 154 µs via this
    Function, noisy). Kept because it keeps eager backward off the dispatcher; to be
    re-measured with the host-overhead work (docs/performance.md)."""

    @staticmethod
    def forward(ctx, a, values, meta, bias, block_rows, block_cols, trans):
        _dds_save(ctx, a, values, meta, bias, block_rows, block_cols, trans)
        return _dds_impl(a, values, meta, bias, block_rows, block_cols, trans)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph: the gradients must be differentiable
            return _dds_grads(_dds_eager, _sdd_eager, ctx, grad)
        return _dds_grads(_dds_impl, _sdd_impl, ctx, grad)  # skips two Function.apply calls


class _SddFunction(torch.autograd.Function):
    """Eager twin of tilesparse::sdd."""

    @staticmethod
    def forward(ctx, a, b, meta, block_size, block_rows, block_cols):
        _sdd_save(ctx, a, b, meta, block_size, block_rows, block_cols)
        return _sdd_impl(a, b, meta, block_size, block_rows, block_cols)

    @staticmethod
    def backward(ctx, grad_values):
        return _sdd_grads(_dds_eager if torch.is_grad_enabled() else _dds_impl, ctx, grad_values)


_dds_eager = _DdsFunction.apply
_sdd_eager = _SddFunction.apply


def _needs_graph(*tensors) -> bool:
    """Whether autograd must record this call: grad mode on and some input requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _dds(a, values, meta, bias, block_rows, block_cols, trans):
    """The registered op under torch.compile; in eager mode the autograd.Function, or the
    impl itself when nothing needs a gradient (inference skips the Function's cost)."""
    if torch.compiler.is_compiling():
        return _dds_op(a, values, meta, bias, block_rows, block_cols, trans)
    if not _needs_graph(a, values, bias):
        return _dds_impl(a, values, meta, bias, block_rows, block_cols, trans)
    return _dds_eager(a, values, meta, bias, block_rows, block_cols, trans)


def _sdd(a, b, meta, block_size, block_rows, block_cols):
    if torch.compiler.is_compiling():
        return _sdd_op(a, b, meta, block_size, block_rows, block_cols)
    if not _needs_graph(a, b):
        return _sdd_impl(a, b, meta, block_size, block_rows, block_cols)
    return _sdd_eager(a, b, meta, block_size, block_rows, block_cols)


# --------------------------------------------------------------------------- public functions


def _autocast(*tensors):
    """Cast floating inputs to the autocast dtype when autocast is on (nn.Linear semantics)."""
    first = tensors[0]
    device_type = first.device.type
    if device_type == "meta" or not torch.is_autocast_enabled(device_type):  # meta has no autocast
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    castable = (torch.float32, torch.float16, torch.bfloat16)  # like autocast: float64 stays
    return tuple(t.to(dtype) if t is not None and t.dtype in castable else t for t in tensors)


def block_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    layout: BlockLayout,
    bias: Optional[torch.Tensor] = None,
    *,
    transposed_storage: bool = False,
) -> torch.Tensor:
    """Y = X W^T + bias with W [out, in] block-sparse: ``weight`` [nnz, b, b] in
    ``layout.coords`` order, ``layout.shape == (out, in)``. X is [..., in]. Where this
    call was measured slower than dense on this GPU (small blocks at high density, large
    batches: :mod:`tilesparse.ops.dense_dispatch`) it warns once and runs as dense, unless
    ``TILESPARSE_DENSE_DISPATCH=0``.

    ``transposed_storage=True``: ``layout`` and ``weight`` hold W^T instead
    (``layout.shape == (in, out)``, W^T's blocks in its ``coords`` order; see
    :class:`tilesparse.nn.TransposedBlockSparseLinear`). The forward then runs as X @ W^T
    on W^T's block-rows (as fast as the rows order since the fortieth session's deep-panel
    fix). Dense dispatch decides as for W stored by rows (the measurements are of that order)."""
    rows, weight, meta, bias, out_features, training = linear_operands(x, weight, layout, bias, transposed_storage)
    if dense_dispatch.run_dense(rows, layout.block_size, layout.density, training,
                                (out_features, rows.shape[1])):
        y = dense_dispatch.dense_linear(rows, weight, meta, bias, layout.block_rows, layout.block_cols,
                                        transposed_storage)
    else:
        y = _dds(rows, weight, meta, bias, layout.block_rows, layout.block_cols, not transposed_storage)
    # 2-D input: the product itself, not a view of it (FSDP2 warns about returned views)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], out_features)


def linear_operands(x, weight, layout, bias, transposed_storage: bool):
    """:func:`block_sparse_linear`'s arguments checked (clear errors naming the argument) and cast
    as autocast asks: (X as rows [-1, in], weight, the layout's tables on X's device, bias,
    out_features, whether autograd records the call)."""
    _checks.check_layout(layout)
    _checks.check_tensor(x, "x", min_dim=1)
    _checks.check_values(weight, layout, "weight")
    if not isinstance(transposed_storage, bool):
        raise TypeError(f"transposed_storage must be a bool, got {type(transposed_storage).__name__}")
    out_features, in_features = layout.shape[::-1] if transposed_storage else layout.shape
    _checks.check_dim(x.shape[-1], in_features, "x.shape[-1] (in_features)")
    if bias is not None:
        _checks.check_tensor(bias, "bias", dim=1)
        _checks.check_dim(bias.shape[0], out_features, "bias.shape[0] (out_features)")
    _checks.check_same_device(weight, "weight", x, "x")
    if bias is not None:
        _checks.check_same_device(bias, "bias", x, "x")
    x, weight, bias = _autocast(x, weight, bias)
    _checks.check_same(weight, "weight", x, "x")
    if bias is not None:
        _checks.check_same(bias, "bias", x, "x")
    training = _needs_graph(x, weight, bias)
    # 2-D input as is: a reshape would still be a view op (and a node in the backward)
    rows = x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), in_features)  # (-1 fails at 0 features)
    return rows, weight, layout.meta_on(x.device), bias, out_features, training


def _check_sparse_operand(values, layout, ref, ref_name):
    _checks.check_layout(layout)
    _checks.check_values(values, layout, "values")
    _checks.check_same(values, "values", ref, ref_name)


def dds(
    a: torch.Tensor,
    values: torch.Tensor,
    layout: BlockLayout,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
) -> torch.Tensor:
    """Dense = op(A) @ op(S), S = (values, layout) block-sparse."""
    _checks.check_flags(trans_a=trans_a, trans_b=trans_b)
    _checks.check_tensor(a, "a", dim=2)
    _check_sparse_operand(values, layout, a, "a")
    a = a.t() if trans_a else a
    rows, cols = layout.shape
    _checks.check_dim(a.shape[1], cols if trans_b else rows, "the inner dimension of op(a)")
    return _dds(a, values, layout.meta_on(a.device), None, layout.block_rows, layout.block_cols, trans_b)


def dsd(
    values: torch.Tensor,
    layout: BlockLayout,
    b: torch.Tensor,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
) -> torch.Tensor:
    """Dense = op(S) @ op(B), S = (values, layout). Computed as (op(B)^T @ op(S)^T)^T on the
    dds kernel, so the result may be a transposed (column-major) view."""
    _checks.check_flags(trans_a=trans_a, trans_b=trans_b)
    _checks.check_tensor(b, "b", dim=2)
    _check_sparse_operand(values, layout, b, "b")
    b = b.t() if trans_b else b
    rows, cols = layout.shape
    _checks.check_dim(b.shape[0], rows if trans_a else cols, "the inner dimension of op(b)")
    meta = layout.meta_on(b.device)
    return _dds(b.t(), values, meta, None, layout.block_rows, layout.block_cols, not trans_a).t()


def sdd(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: BlockLayout,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
) -> torch.Tensor:
    """Block-sparse = op(A) @ op(B), computed only on the layout's blocks: values [nnz, b, b]."""
    _checks.check_flags(trans_a=trans_a, trans_b=trans_b)
    _checks.check_layout(layout)
    _checks.check_tensor(a, "a", dim=2)
    _checks.check_tensor(b, "b", dim=2)
    _checks.check_same(b, "b", a, "a")
    a = a.t() if trans_a else a
    b = b.t() if trans_b else b
    rows, cols = layout.shape
    _checks.check_dim(a.shape[0], rows, "op(a).shape[0]")
    _checks.check_dim(b.shape[1], cols, "op(b).shape[1]")
    _checks.check_dim(b.shape[0], a.shape[1], "op(b).shape[0] (must equal op(a).shape[1]); it")
    meta = layout.meta_on(a.device)
    return _sdd(a, b, meta, layout.block_size, layout.block_rows, layout.block_cols)
