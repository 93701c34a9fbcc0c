"""The node grid behind the structured layouts (bands and graphs).

A grid of ``block_rows x block_cols`` blocks is read as the adjacency matrix of a graph
on ``n = max(block_rows, block_cols)`` nodes, stretched onto the grid: node ``u`` lies in
block-row ``u * block_rows // n`` and block-col ``u * block_cols // n``. On the larger
side every node has a block of its own; on the smaller side runs of about
``n / smaller`` consecutive nodes share one block (they are folded together). A node pair
``(u, v)`` marks block ``(u * block_rows // n, v * block_cols // n)``.

The *diagonal* is the image of the pairs ``(u, u)``: blocks
``(u * block_rows // n, u * block_cols // n)`` for ``u < n``. For a square grid that is
the ordinary block diagonal; otherwise it is a staircase that gives every block-row and
every block-col at least one block. For a wide grid (``block_rows < block_cols``) block-row
``i``'s step starts at block-col ``ceil(i * block_cols / block_rows)``, which is
``i * cols // rows`` when the sides divide evenly (and the same with rows and cols swapped
for a tall grid). For a square grid the whole mapping is the identity. A grid with no blocks (a side of 0) has no nodes and every layout of it is empty.
"""

from __future__ import annotations

import torch


def node_count(block_rows: int, block_cols: int) -> int:
    """Nodes of the graph behind a grid: the larger side (none for a grid with no blocks)."""
    return max(block_rows, block_cols) if block_rows and block_cols else 0


def node_spans(blocks: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last node (inclusive) of each of ``blocks`` blocks on a side of ``n`` nodes."""
    owner = torch.arange(n) * blocks // n  # nondecreasing, hits every block when blocks <= n
    index = torch.arange(blocks)
    first = torch.searchsorted(owner, index, right=False)
    last = torch.searchsorted(owner, index, right=True) - 1
    return first, last


def fold(pairs: torch.Tensor, block_rows: int, block_cols: int, *, symmetric: bool) -> torch.Tensor:
    """Bool mask [block_rows, block_cols] of the blocks hit by node ``pairs`` [E, 2]
    (both directions when ``symmetric``)."""
    n = node_count(block_rows, block_cols)
    mask = torch.zeros(block_rows, block_cols, dtype=torch.bool)
    pairs = pairs.reshape(-1, 2).long()
    if pairs.numel():
        u, v = pairs[:, 0], pairs[:, 1]
        mask[u * block_rows // n, v * block_cols // n] = True
        if symmetric:
            mask[v * block_rows // n, u * block_cols // n] = True
    return mask


def diagonal_mask(block_rows: int, block_cols: int) -> torch.Tensor:
    """The (stretched) block diagonal: the image of every self pair ``(u, u)``."""
    nodes = torch.arange(node_count(block_rows, block_cols))
    return fold(torch.stack([nodes, nodes], dim=1), block_rows, block_cols, symmetric=False)
