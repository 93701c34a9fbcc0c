"""Uniformly random layouts: ``random`` (exact block count over the matrix) and
``balanced`` (the same block count in every block-row, which balances the work of
the row-wise kernels)."""

from __future__ import annotations

import torch

from ..layout import BlockLayout
from ._common import block_grid, check_density, check_seed, keep_count


def random(rows: int, cols: int, block_size: int, density: float, *, seed: int = 0, device=None) -> BlockLayout:
    """A layout with exactly ``round(density * blocks)`` blocks, placed uniformly at random."""
    block_rows, block_cols = block_grid(rows, cols, block_size)
    total = block_rows * block_cols
    keep = keep_count(density, total)
    generator = torch.Generator().manual_seed(check_seed(seed))
    chosen = torch.randperm(total, generator=generator)[:keep]
    mask = torch.zeros(total, dtype=torch.bool)
    mask[chosen] = True
    return BlockLayout(mask.view(block_rows, block_cols).to(device), block_size)


def balanced(rows: int, cols: int, block_size: int, density: float, *, seed: int = 0, device=None) -> BlockLayout:
    """Every block-row keeps the same ``round(density * block_cols)`` blocks, at random columns."""
    check_density(density)
    block_rows, block_cols = block_grid(rows, cols, block_size)
    per_row = keep_count(density, block_cols)
    generator = torch.Generator().manual_seed(check_seed(seed))
    scores = torch.rand(block_rows, block_cols, generator=generator)
    mask = torch.zeros(block_rows, block_cols, dtype=torch.bool)
    if per_row:
        mask.scatter_(1, scores.topk(per_row, dim=1).indices, True)
    return BlockLayout(mask.to(device), block_size)
