"""A block-sparse linear layer's forwards without autograd, dispatched once per activation shape.

Eagerly, :func:`~tilesparse.ops.bsmm.block_sparse_linear` checks its arguments, asks dense dispatch
and walks the kernel dispatcher on every call: ~20-30 µs of host on this project's CPU
(``scripts/probes/host_python_cost.py``), more than the kernel itself takes at a few rows on the H200,
so an eager decoding loop runs at the host's pace. A layer's :class:`LinearPlans` remembers, per
activation shape, what the first such call decided: dense (then the dense path, without the checks
again), or a :class:`~tilesparse.kernels.bsmm.DdsPlan`, which relaunches the small, FMA or panel
kernel without the dispatcher and most of Triton's launch (the other kernels still dispatch each call).

Used where nothing the first call read can change unseen: CUDA, no autograd recording, not under
autocast (its casts are new tensors every call), not while torch.compile traces or a CUDA graph is
captured, a contiguous weight and bias, and not TF32 with Wᵀ's storage (the dispatcher transposes a
copy of the weight there). The key holds the activations' shape, strides, dtype and device, the
weight's storage order (W or Wᵀ), the caller's stream (a plan's workspaces serve one stream), and the
dispatch settings a program may change between calls (dense dispatch, deterministic algorithms, fp32 matmul precision, the K-major
switch, the tuned tables' generation). Settings read from the environment by the launchers
(``TILESPARSE_TUNED``, ``TILESPARSE_PDL``, ``TILESPARSE_POISON`` for workspaces) are those of a
plan's first call; :meth:`LinearPlans.clear` makes new plans. The plans are for one weight, bias
and layout (identity, address, shape and dtype): another one (``set_layout``, ``.to()``, a new
Parameter or ``.data``) drops them all. The weight and bias are read in place, so in-place updates
(an optimizer step between evaluations) are seen. Plans hold no activations or outputs between
calls. ``TILESPARSE_LINEAR_PLANS=off`` (read at import; ``PLANS`` at call time) turns them off.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch

from .._env import switch
from ..kernels import bsmm as kernels
from ..kernels import tuned
from ..kernels._device import current_stream_handle
from . import dense_dispatch
from .bsmm import block_sparse_linear, linear_operands

__all__ = ["LinearPlans", "PLANS"]

PLANS = switch("TILESPARSE_LINEAR_PLANS", True)


class LinearPlans:
    """One layer's remembered forwards (at most :attr:`MAX_PLANS` activation shapes, least recently
    used out). Not copied with the layer (a deep copy or a pickle gets an empty one): plans hold
    the tensors they were made for."""

    MAX_PLANS = 8
    __slots__ = ("plans", "owner", "lock")

    def __init__(self):
        self.plans: OrderedDict = OrderedDict()  # key -> rows -> Y (2-D)
        self.owner: tuple | None = None  # (weight, bias, layout, their addresses) the plans are for
        self.lock = threading.Lock()  # a plan's prepared launch swaps its arguments in place

    def __deepcopy__(self, memo) -> LinearPlans:
        return LinearPlans()

    def __reduce__(self):
        return LinearPlans, ()

    def __len__(self) -> int:
        return len(self.plans)

    def clear(self) -> None:
        """Forgets every plan (and the tensors they hold)."""
        with self.lock:
            self.plans.clear()
            self.owner = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, layout, bias: torch.Tensor | None = None,
                 transposed_storage: bool = False) -> torch.Tensor:
        """``block_sparse_linear(x, weight, layout, bias, transposed_storage=...)``, from a plan where
        the module docstring says."""
        if not (PLANS and isinstance(x, torch.Tensor) and _plannable(x, weight, bias, transposed_storage)):
            owner = self.owner
            if owner is not None and (owner[0] is not weight or owner[1] is not bias or owner[2] is not layout):
                self.clear()  # (a replaced weight is not held until the next call a plan serves)
            return block_sparse_linear(x, weight, layout, bias, transposed_storage=transposed_storage)
        dtype = x.dtype  # the key: the activations, the storage order, the stream, then the dispatch settings a
        key = (x.shape, x.stride(), dtype, x.device, transposed_storage, _stream_of(x), dense_dispatch.enabled(),
               # program may change between calls
               torch.are_deterministic_algorithms_enabled(), kernels.KMAJOR_SMALL, tuned.generation(),
               torch.get_float32_matmul_precision() if dtype == torch.float32 else "")
        with self.lock:
            if not _owns(self.owner, weight, bias, layout):
                self.plans.clear()
                self.owner = _owner(weight, bias, layout)
            plan = self.plans.get(key)
            if plan is not None:
                self.plans.move_to_end(key)
                rows = x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
                y = plan(rows)
            else:
                # the first call with this key: checked as block_sparse_linear checks (errors raise here)
                rows, weight, meta, bias, out_features, _ = linear_operands(x, weight, layout, bias,
                                                                            transposed_storage)
                plan = _make_plan(rows, weight, meta, bias, layout, out_features, transposed_storage)
                y = plan(rows)
                self.plans[key] = plan
                while len(self.plans) > self.MAX_PLANS:
                    self.plans.popitem(last=False)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


def _make_plan(rows, weight, meta, bias, layout, out_features: int, transposed_storage: bool):
    """rows -> Y for later calls like this one: the dense path where dense dispatch sends it, else
    the kernels' DdsPlan (the small, FMA or panel kernel relaunched; the others dispatched)."""
    block_rows, block_cols = layout.block_rows, layout.block_cols
    if dense_dispatch.run_dense(rows, layout.block_size, layout.density, False, (out_features, rows.shape[1])):
        return lambda a: dense_dispatch.dense_linear(a, weight, meta, bias, block_rows, block_cols,
                                                     transposed_storage)
    return kernels.DdsPlan(weight, meta, bias, block_rows, block_cols, not transposed_storage)


def _owner(weight: torch.Tensor, bias: torch.Tensor | None, layout) -> tuple:
    """What plans are made for: the weight, bias and layout objects, the weight's and bias's addresses,
    shapes and dtypes."""
    return (weight, bias, layout, weight.data_ptr(), weight.shape, weight.dtype,
            None if bias is None else (bias.data_ptr(), bias.shape, bias.dtype))


def _owns(owner: tuple | None, weight: torch.Tensor, bias: torch.Tensor | None, layout) -> bool:
    """Whether ``owner`` (see :func:`_owner`) is these weight, bias and layout, as they are now."""
    return (owner is not None and owner[0] is weight and owner[1] is bias and owner[2] is layout
            and owner[3] == weight.data_ptr() and owner[4] == weight.shape and owner[5] == weight.dtype
            and (bias is None or owner[6] == (bias.data_ptr(), bias.shape, bias.dtype)))


def _stream_of(x: torch.Tensor) -> int | None:
    return current_stream_handle(x.device) if x.is_cuda else None


def _on_device(x: torch.Tensor) -> bool:
    """Whether ``x`` is where plans run (CUDA; tests let the interpreter's CPU tensors in)."""
    return x.is_cuda


def _plannable(x: torch.Tensor, weight, bias, transposed_storage: bool) -> bool:
    """Whether this call may run from a plan (see the module docstring)."""
    if not (_on_device(x) and isinstance(weight, torch.Tensor) and weight.is_contiguous()):
        return False
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return False
    dtype = x.dtype
    if dtype == torch.float64 or (transposed_storage and dtype == torch.float32):
        return False
    if torch.compiler.is_compiling() or torch.is_autocast_enabled(x.device.type):
        return False
    return not (x.is_cuda and torch.cuda.is_current_stream_capturing())


