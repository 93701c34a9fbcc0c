"""Banded layouts: the blocks within ``bandwidth`` of the block diagonal, and the block
diagonal itself (bandwidth 0).

Non-square grids use the stretched node grid of :mod:`._grid`: the band is taken between
nodes (``n = max(block_rows, block_cols)`` of them, one per block of the larger side) and
folded onto the grid, so ``bandwidth`` counts blocks of the larger side. A block is stored
when some node of its block-row and some node of its block-col are at most ``bandwidth``
apart. The block diagonal of a 4 x 16 grid, for example, gives each block-row its own run
of 4 consecutive block-cols.
"""

from __future__ import annotations

import torch

from ..layout import BlockLayout
from ._common import block_grid, check_bool, check_int
from ._grid import node_count, node_spans


def banded(
    rows: int,
    cols: int,
    block_size: int,
    *,
    bandwidth: int,
    diagonal: bool = True,
    wrap: bool = False,
    device=None,
) -> BlockLayout:
    """The blocks whose nodes lie within ``bandwidth`` of each other.

    Args:
        rows, cols: matrix size in elements (multiples of ``block_size``).
        bandwidth: how far off the diagonal the band reaches, in blocks of the larger side
            (>= 0; 0 is the block diagonal; larger than the grid is simply full).
        diagonal: keep the node pairs on the diagonal itself. ``diagonal=False`` gives the
            band without its middle: on a square grid, exactly the blocks with
            ``1 <= |r - c| <= bandwidth``. (On a non-square grid a folded block can hold
            both a diagonal pair and an off-diagonal one; it is kept then.)
        wrap: measure distance around a ring (``min(|u - v|, n - |u - v|)``), which gives
            a circulant band: the layout of a Watts-Strogatz graph before rewiring.

    Deterministic: there is nothing random to seed. Symmetric on square grids.
    """
    block_rows, block_cols = block_grid(rows, cols, block_size)
    bandwidth = check_int("bandwidth", bandwidth, low=0)
    check_bool("diagonal", diagonal)
    check_bool("wrap", wrap)
    n = node_count(block_rows, block_cols)
    row_first, row_last = node_spans(block_rows, n)
    col_first, col_last = node_spans(block_cols, n)
    r_first, r_last = row_first[:, None], row_last[:, None]

    def gap(shift: int) -> torch.Tensor:
        # Smallest |u - v| over the node spans of each (block-row, block-col), with the
        # column nodes shifted by ``shift`` (0, or +-n around the ring).
        c_first, c_last = col_first[None, :] + shift, col_last[None, :] + shift
        return (c_first - r_last).clamp(min=0).maximum((r_first - c_last).clamp(min=0))

    distance = gap(0)
    if wrap:
        distance = distance.minimum(gap(n)).minimum(gap(-n))
    mask = distance <= bandwidth
    if not diagonal:
        if bandwidth == 0:
            mask.zero_()
        else:
            # Spans that touch hold a pair at distance 1 unless both are the same single
            # node, whose only pair is the diagonal one.
            same_node = (r_first == r_last) & (col_first == col_last)[None, :] & (r_first == col_first[None, :])
            mask &= ~same_node
    return BlockLayout(mask.to(device), block_size)


def block_diagonal(rows: int, cols: int, block_size: int, *, device=None) -> BlockLayout:
    """The block diagonal: ``banded(..., bandwidth=0)``. On a square grid, blocks ``(i, i)``;
    on a non-square grid, the stretched diagonal of :mod:`tilesparse.layouts._grid`, in
    which every block-row and every block-col has at least one block."""
    return banded(rows, cols, block_size, bandwidth=0, diagonal=True, device=device)
