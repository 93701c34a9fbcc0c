"""The 2:4 linear product as registered ops: Y = X (W⊙M)ᵀ + b with the STE backward
(fprop and bprop on cuSPARSELt where a compressed weight is given and the dispatcher
picks it, else the dense masked product; updat dense), and :func:`semi24_linear`, the
functional form :class:`~tilesparse.semi24.SemiSparseLinear` calls. The module docstring
of :mod:`tilesparse.semi24.linear` gives the math and the recipes."""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch.nn import functional as F

from ..ops.bsmm import _autocast
from . import dispatch as _dispatch
from .cusparselt import cslt_product, sparse_unavailable_reason
from .reference import semi24_linear_reference

__all__ = ["semi24_linear"]

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"tilesparse.SemiSparseLinear: {message}; running the dense masked product", stacklevel=4)


def _masked(weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, weight, torch.zeros((), dtype=weight.dtype, device=weight.device))


def _gpu_product(op, a, weight, mask, bias, packed, mode, masked=None):
    """fprop: A (W⊙M)^T + b (packed = compressed W⊙M); bprop: A (W⊙M) (packed =
    compressed (W⊙M)^T, None when the mask is not transposable). ``masked``: W⊙M when
    the caller holds it, so that the dense path skips a masking pass over W."""
    n, k = weight.shape if op == "fprop" else weight.t().shape  # the sparse operand [n, k]
    held = [masked]

    def operand():  # W⊙M (or its transpose), masked at most once per call
        if held[0] is None:
            held[0] = _masked(weight, mask)
        return held[0] if op == "fprop" else held[0].t()

    def dense():  # the dispatcher times it repeatedly: as a layer holding W⊙M runs it
        return F.linear(a, operand(), bias)

    if mode == "dense":
        return dense()
    reason = sparse_unavailable_reason(a.device, a.dtype, n, k)
    if reason is None and op == "bprop" and packed is None and not bool(_is_col24(mask)):
        reason = "the mask is not transposable, so (W⊙M)^T is not 2:4 (bprop)"
    if reason is not None:
        if mode == "sparse":
            _warn_once(f"mode='sparse' but {reason}")
        else:
            _warn_once(reason)
        return dense()
    if packed is None:  # under torch.compile, or a functional call: compress here
        packed = torch._cslt_compress(operand().contiguous())
    choice = _dispatch.default_dispatcher().choose(
        op, a.shape[0], n, k, a.dtype, a.device,
        lambda: cslt_product(packed, a, bias), dense, mode=mode,
    )
    return cslt_product(packed, a, bias) if choice == "sparse" else dense()


def _is_col24(mask: torch.Tensor) -> torch.Tensor:
    n, k = mask.shape
    if n % 4:
        return torch.tensor(False)
    return (mask.t().reshape(k, n // 4, 4).sum(-1) <= 2).all()


def _is_tile24(mask: torch.Tensor) -> torch.Tensor:
    """At most two kept per row and per column of every aligned 4x4 tile (a transposable
    2:4 mask: what the one-pass W/Wᵀ packer keeps unchanged)."""
    n, k = mask.shape
    if k % 4:
        return torch.tensor(False)
    return _is_col24(mask) & (mask.reshape(n, k // 4, 4).sum(-1) <= 2).all()


# --------------------------------------------------------------------------- registered ops


@torch.library.custom_op("tilesparse::semi24_linear", mutates_args=())
def _fprop_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    bias: Optional[torch.Tensor],
    packed: Optional[torch.Tensor],
    packed_t: Optional[torch.Tensor],
    masked: Optional[torch.Tensor],
    srste_decay: float,
    mode: str,
) -> torch.Tensor:
    """Y = X (W⊙M)^T + b, X [M, K]; ``packed``/``packed_t``: compressed W⊙M and
    (W⊙M)^T for cuSPARSELt, or None; ``masked``: W⊙M for the dense path, or None."""
    if x.device.type != "cuda":
        return semi24_linear_reference(x, weight, mask, bias)
    return _gpu_product("fprop", x, weight, mask, bias, packed, mode, masked)


@_fprop_op.register_fake
def _fprop_fake(x, weight, mask, bias, packed, packed_t, masked, srste_decay, mode):
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.custom_op("tilesparse::semi24_bprop", mutates_args=())
def _bprop_op(
    grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, packed_t: Optional[torch.Tensor],
    masked: Optional[torch.Tensor], mode: str
) -> torch.Tensor:
    """dX = dY (W⊙M), dY [M, N]."""
    if grad.device.type != "cuda":
        return grad @ _masked(weight, mask)
    return _gpu_product("bprop", grad, weight, mask, None, packed_t, mode, masked)


@_bprop_op.register_fake
def _bprop_fake(grad, weight, mask, packed_t, masked, mode):
    return grad.new_empty(grad.shape[0], weight.shape[1])


def _setup(ctx, inputs, output):
    x, weight, mask, bias, packed, packed_t, masked, srste_decay, mode = inputs
    ctx.save_for_backward(x, weight, mask, packed_t, masked)
    ctx.srste_decay = srste_decay
    ctx.mode = mode
    ctx.has_bias = bias is not None


def _backward(ctx, grad):
    x, weight, mask, packed_t, masked = ctx.saved_tensors
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:  # bprop with the masked weight
        grad_x = _bprop_op(grad, weight, mask, packed_t, masked, ctx.mode)
    if ctx.needs_input_grad[1]:  # updat: dense STE gradient (+ SR-STE's masked decay)
        grad_w = grad.t() @ x
        if ctx.srste_decay:
            grad_w = grad_w + ctx.srste_decay * torch.where(mask, torch.zeros_like(weight), weight)
    if ctx.has_bias and ctx.needs_input_grad[3]:
        grad_b = grad.sum(0)
    return grad_x, grad_w, None, grad_b, None, None, None, None, None


_fprop_op.register_autograd(_backward, setup_context=_setup)


def semi24_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    srste_decay: float = 0.0,
    mode: str = "auto",
    packed: Optional[torch.Tensor] = None,
    packed_t: Optional[torch.Tensor] = None,
    masked: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Y = X (W⊙M)^T + b with the STE backward (see the module docstring); X [..., K].
    ``packed``/``packed_t``: compressed W⊙M and (W⊙M)ᵀ held by the caller (else
    compressed here); ``masked``: W⊙M itself in the compute dtype, held by the caller,
    used where a GPU product runs dense (else W is masked again in each product). Both
    are trusted as given (shapes checked, not contents) and get no gradient; the CPU
    reference path ignores them."""
    _dispatch.check_mode(mode)
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor with at least 1 dim, got {type(x).__name__}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x.shape[-1] is {x.shape[-1]} but weight has in_features={weight.shape[1]}")
    x, weight, bias = _autocast(x, weight, bias)
    if x.dtype != weight.dtype:
        raise TypeError(f"x has dtype {x.dtype} but weight has {weight.dtype}; they must match")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but weight is on {weight.device}; they must match")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],)
                             or bias.dtype != weight.dtype or bias.device != weight.device):
        raise ValueError(f"bias must be a ({weight.shape[0]},) tensor of weight's dtype and device ({weight.dtype}, "
                         f"{weight.device}), got " + (f"{tuple(bias.shape)}, {bias.dtype}, {bias.device}"
                                                     if isinstance(bias, torch.Tensor) else type(bias).__name__))
    if masked is not None and (masked.shape != weight.shape or masked.dtype != weight.dtype
                               or masked.device != weight.device):
        raise ValueError(f"masked must be W⊙M like weight ({tuple(weight.shape)}, {weight.dtype}, {weight.device}), "
                         f"got {tuple(masked.shape)}, {masked.dtype}, {masked.device}")
    y = _fprop_op(x.reshape(-1, x.shape[-1]), weight, mask, bias, packed, packed_t, masked, float(srste_decay),
                  mode)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], weight.shape[0])
