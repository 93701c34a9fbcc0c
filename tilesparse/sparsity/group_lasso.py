"""Group lasso over blocks: the sum of the blocks' L2 norms.

The penalty ``sum_i ||W_i||_2`` over blocks W_i pulls whole blocks toward zero (its gradient
``W_i / ||W_i||`` has norm 1 whatever the block's size, so weak blocks shrink at a constant rate).
Trained with plain gradient steps, as here (autograd gives 0 at an exactly zero block; there is no
proximal step), they settle near zero rather than at it, and block pruning then removes them. Two
forms:

* :func:`group_lasso` on the stored blocks of block-sparse weights (values [nnz, b, b],
  or every :class:`BlockSparseLinear` of a model);
* :func:`dense_group_lasso` on dense ``nn.Linear`` weights cut into b x b blocks, the
  penalty to train with before :func:`~tilesparse.sparsity.sparsify` prunes to blocks.

Both are differentiable. Norms of 16-bit tensors are accumulated in float32 (a sum of
squares of one 64 x 64 block overflows float16 easily); the result is float32 then,
float64 for float64 input.
"""

from __future__ import annotations

from typing import Callable, Iterable, Union

import torch
from torch import nn

from ..layouts.magnitude import blockwise_norms
from ..nn import BlockSparseLinear
from .convert import convertible_linears

__all__ = ["block_norms", "group_lasso", "dense_block_norms", "dense_group_lasso"]


def _norm_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def block_norms(values: torch.Tensor) -> torch.Tensor:
    """L2 norm of every stored block: values [nnz, b, b] -> [nnz] (differentiable)."""
    if not isinstance(values, torch.Tensor) or values.dim() != 3:
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(f"values must be a [nnz, b, b] tensor, got {shape}")
    return torch.linalg.vector_norm(values.flatten(1), dim=1, dtype=_norm_dtype(values))


def dense_block_norms(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """L2 norm of every b x b block of a dense 2-D weight, as [rows / b, cols / b]
    (differentiable; :func:`tilesparse.layouts.magnitude.block_norms` is the detached
    float32 version that layout selection uses)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a 2-D tensor, got {shape}")
    return blockwise_norms(weight, block_size)


def _sum(terms: list[torch.Tensor]) -> torch.Tensor:
    if not terms:
        return torch.zeros(())
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in terms) else torch.float32
    device = terms[0].device
    return torch.stack([t.to(device, dtype) for t in terms]).sum()


Source = Union[nn.Module, torch.Tensor, Iterable[Union[nn.Module, torch.Tensor]]]


def group_lasso(model_or_params: Source) -> torch.Tensor:
    """Sum of the L2 norms of all stored blocks: a scalar tensor.

    ``model_or_params`` is a values tensor [nnz, b, b], a module (every
    :class:`BlockSparseLinear` inside it, gated ones included: the penalty is on
    ``weight``, not on ``weight * gate``), or an iterable of those. A module without any
    BlockSparseLinear raises ``ValueError`` (for dense weights use
    :func:`dense_group_lasso`).
    """
    if isinstance(model_or_params, torch.Tensor):
        return block_norms(model_or_params).sum()
    if isinstance(model_or_params, nn.Module):
        weights = [m.weight for m in model_or_params.modules() if isinstance(m, BlockSparseLinear)]
        if not weights:
            raise ValueError(
                f"{type(model_or_params).__name__} holds no BlockSparseLinear; "
                "for dense nn.Linear weights use dense_group_lasso(model, block_size)"
            )
        return _sum([block_norms(w).sum() for w in weights])
    if isinstance(model_or_params, Iterable):
        return _sum([group_lasso(item) for item in model_or_params])
    raise TypeError(f"expected a tensor, a module or an iterable of those, got {type(model_or_params).__name__}")


def dense_group_lasso(
    model_or_weight: Union[nn.Module, torch.Tensor],
    block_size: int,
    *,
    filter_fn: Callable[[str, nn.Module], bool] | None = None,
) -> torch.Tensor:
    """Block group lasso of dense weights: the sum of the L2 norms of their b x b blocks.

    ``model_or_weight`` is a 2-D weight or a module. For a module, the penalty covers
    exactly the nn.Linear modules that ``sparsify(model, block_size=block_size,
    filter_fn=filter_fn)`` would convert (the others are not pruned to blocks, so
    penalising them would only shrink them); none raises ``ValueError``.
    """
    if isinstance(model_or_weight, torch.Tensor):
        return dense_block_norms(model_or_weight, block_size).sum()
    if not isinstance(model_or_weight, nn.Module):
        raise TypeError(f"expected a 2-D tensor or a module, got {type(model_or_weight).__name__}")
    linears = convertible_linears(model_or_weight, block_size=block_size, filter_fn=filter_fn)
    if not linears:
        raise ValueError(
            f"no nn.Linear of {type(model_or_weight).__name__} can be cut into {block_size}x{block_size} blocks"
        )
    return _sum([dense_block_norms(m.weight, block_size).sum() for m in linears.values()])
