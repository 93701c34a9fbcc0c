"""Layouts chosen from a dense weight: keep the blocks with the largest L2 norm."""

from __future__ import annotations

import torch

from ..layout import BlockLayout
from ._common import block_grid, keep_count


def block_norms(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """L2 norm of every b x b block of a 2-D tensor, as [rows / b, cols / b] (float32)."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    block_rows, block_cols = block_grid(weight.shape[0], weight.shape[1], block_size)
    blocks = weight.detach().float().reshape(block_rows, block_size, block_cols, block_size)
    return blocks.pow(2).sum(dim=(1, 3)).sqrt()


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
