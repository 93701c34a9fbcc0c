"""2:4 activation sparsity in a squared-ReLU feed-forward block (Haziza et al. 2025,
"Accelerating Transformer Inference and Training with 2:4 Activation Sparsity").

    H  = relu(X W1^T + b1)^2            [tokens, hidden]
    Hs = H ⊙ M,  M = 2:4 of each row of H along the hidden (feature) axis, at run time
    Y  = Hs W2^T + b2

Squared-ReLU activations are mostly zero already, so keeping the 2 largest of every 4
features loses little. Backward: the gradient reaches H through the kept entries only
(dH = (dY W2) ⊙ M), then relu^2's derivative 2 relu(.) as usual.

Here the 2:4 selection runs through the registered op ``tilesparse::semi24_prune_rows``
(the Triton kernel on CUDA, the reference on the CPU) and the second product is dense.
Future work (GPU): run the second product on cuSPARSELt with Hs as the sparse first
operand (Y = Hs W2^T: Hs [tokens, hidden] is 2:4 along hidden, the reduction axis),
compressing Hs per batch since it changes every call, and fuse the squaring, the
selection and the compression into one kernel. The backward's dW2 = dY^T Hs could use
the same compressed Hs^T only with a transposable selection, which this does not make.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.nn import functional as F

from .._counts import check_count

__all__ = ["SquaredReLUFFN", "sparsify_24"]


@torch.library.custom_op("tilesparse::semi24_prune_rows", mutates_args=())
def _prune_rows_op(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(H ⊙ M, M) with M keeping the 2 largest |h| of every 4 along the last axis; h 2-D."""
    from . import prune_24_rows

    return prune_24_rows(h)


@_prune_rows_op.register_fake
def _prune_rows_fake(h):
    return h.new_empty(h.shape), h.new_empty(h.shape, dtype=torch.bool)


def _prune_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _prune_backward(ctx, grad, grad_mask):
    (mask,) = ctx.saved_tensors
    return torch.where(mask, grad, torch.zeros_like(grad))


_prune_rows_op.register_autograd(_prune_backward, setup_context=_prune_setup)


def sparsify_24(h: torch.Tensor) -> torch.Tensor:
    """H ⊙ M, M the 2:4 mask of H's rows along the last axis (which must be a multiple of 4);
    the gradient flows through the kept entries only. H [..., features]."""
    if h.shape[-1] % 4:
        raise ValueError(f"h.shape[-1]={h.shape[-1]} must be a multiple of 4 for 2:4 activation sparsity")
    out, _ = _prune_rows_op(h.reshape(-1, h.shape[-1]))
    return out.reshape(h.shape)


class SquaredReLUFFN(nn.Module):
    """Y = (relu(X W1^T + b1)^2 ⊙ M) W2^T + b2 with M the run-time 2:4 mask of the hidden
    activation along its features. ``sparse=False`` skips the mask (the dense baseline).

    Args:
        dim: model width (input and output features).
        hidden: hidden width, a multiple of 4.
        bias, device, dtype: as nn.Linear.
    """

    def __init__(self, dim: int, hidden: int, bias: bool = True, device=None, dtype=None, *, sparse: bool = True):
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, numbers.Integral) or hidden < 4 or hidden % 4:
            raise ValueError(f"hidden={hidden!r} must be a positive multiple of 4 (2:4 groups along it)")
        hidden, dim = int(hidden), check_count("dim", dim, 1)
        factory = {"device": device, "dtype": dtype}
        self.dim, self.hidden, self.sparse = dim, hidden, sparse
        self.fc1 = nn.Linear(dim, hidden, bias=bias, **factory)
        self.fc2 = nn.Linear(hidden, dim, bias=bias, **factory)

    def hidden_activation(self, x: torch.Tensor) -> torch.Tensor:
        """relu(X W1^T + b1)^2, before the 2:4 selection."""
        return F.relu(self.fc1(x)).square()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., dim] -> [..., dim]: fc2(sparsify_24(relu(fc1(x))^2)) (2:4 only when sparse)."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be a [..., dim={self.dim}] tensor, got "
                             + (f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__))
        weight = self.fc1.weight
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"x has dtype {x.dtype} but the layer's weights are {weight.dtype}; they must match")
        h = self.hidden_activation(x)
        if self.sparse:
            h = sparsify_24(h)
        return self.fc2(h)

    def extra_repr(self) -> str:
        """Sizes, for print(module)."""
        return f"dim={self.dim}, hidden={self.hidden}, sparse={self.sparse}"
