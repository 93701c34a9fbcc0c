"""Layouts chosen from a dense weight: keep the blocks with the largest L2 norm."""

from __future__ import annotations

import torch

from ..layout import BlockLayout
from ._common import block_grid, keep_count


def blockwise_norms(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """L2 norm of every b x b block of a 2-D tensor, as [rows / b, cols / b]; differentiable,
    float64 for float64 input and float32 otherwise (16-bit sums would overflow). The one
    implementation behind layout selection, the group-lasso penalty and the gradient
    block norms' reference."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point tensor, got dtype {weight.dtype}")
    block_rows, block_cols = block_grid(weight.shape[0], weight.shape[1], block_size)
    blocks = weight.reshape(block_rows, block_size, block_cols, block_size)
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    return torch.linalg.vector_norm(blocks, dim=(1, 3), dtype=dtype)


def block_norms(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """:func:`blockwise_norms`, detached and in float32: what layout selection ranks by."""
    return blockwise_norms(weight.detach(), block_size).float()


def from_dense(weight: torch.Tensor, block_size: int, density: float) -> BlockLayout:
    """Keep the ``round(density * blocks)`` blocks of ``weight`` with the largest L2 norm.
    Ties break toward the lower storage index, so the result is deterministic."""
    norms = block_norms(weight, block_size)
    keep = keep_count(density, norms.numel())
    flat = norms.flatten()
    # Stable descending order: equal norms keep their row-major order.
    order = torch.sort(flat, descending=True, stable=True).indices[:keep]
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[order] = True
    return BlockLayout(mask.view_as(norms), block_size)
