"""Layouts from random graphs (networkx): Watts-Strogatz small worlds and Barabasi-Albert
scale-free graphs.

The graph has one node per block of the larger side of the grid,
``n = max(block_rows, block_cols)``, and its adjacency matrix is folded onto the grid as
described in :mod:`tilesparse.layouts._grid`: on a square grid block ``(r, c)`` is stored
exactly when nodes ``r`` and ``c`` are joined, so the layout is symmetric (the graphs are
undirected); on a non-square grid runs of consecutive nodes share a block of the smaller
side. ``diagonal=True`` adds the pairs ``(u, u)`` (the graphs have no self-loops), which
on a square grid is the block diagonal.

Either give the graph's parameter (``degree`` or ``m``) or a ``density``: then the
parameter whose layout comes closest to that density is chosen, by building layouts for
a few candidates (the same seed for each), and ``layout.density`` is the exact result.
A density more than half a step beyond what the model reaches on the grid is an error
that gives the reachable range.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..layout import BlockLayout
from ._common import block_grid, check_bool, check_density, check_int, check_probability, check_seed
from ._grid import diagonal_mask, fold, node_count

_EPS = 1e-12  # float slack when comparing densities with the requested one


def small_world(
    rows: int,
    cols: int,
    block_size: int,
    *,
    degree: int | None = None,
    density: float | None = None,
    rewire_p: float = 0.1,
    seed: int = 0,
    diagonal: bool = False,
    device=None,
) -> BlockLayout:
    """Watts-Strogatz layout: ``networkx.watts_strogatz_graph(n, degree, rewire_p, seed)``.

    A ring on which every node is joined to its ``degree`` nearest neighbours, then each
    edge is moved to a random endpoint with probability ``rewire_p``. ``rewire_p=0``
    leaves the circulant band ``banded(..., bandwidth=degree // 2, wrap=True,
    diagonal=False)``; ``rewire_p=1`` is close to a random graph.

    Give exactly one of:
        degree: neighbours per node, an even int in [0, n]. On a square grid and for
            ``degree < n`` the layout has exactly ``n * degree`` blocks (rewiring moves edges,
            it never drops them), density ``degree / n``; ``degree == n`` is the complete
            graph, ``n * (n - 1)`` blocks (no self-loops; ``diagonal=True`` adds them).
        density: the target density; the even degree whose layout comes closest is used.

    Other args: ``rewire_p`` in [0, 1]; ``seed`` (int) seeds networkx, so the layout does
    not depend on any global random state; ``diagonal`` adds the block diagonal.
    """
    block_rows, block_cols = block_grid(rows, cols, block_size)
    _one_of("degree", degree, density)
    rewire_p = check_probability("rewire_p", rewire_p)
    seed = check_seed(seed)
    check_bool("diagonal", diagonal)
    if degree is not None:
        degree = check_int("degree", degree)
        if degree % 2:
            raise ValueError(f"degree must be even (a node has degree / 2 neighbours on each side), got {degree}")
    n = node_count(block_rows, block_cols)
    if n == 0:
        return _empty(block_rows, block_cols, block_size, device)
    if degree is not None:
        check_int("degree", degree, low=0, high=n, why=f" (n = max(block_rows, block_cols) = {n} graph nodes)")

    def build(k: int) -> torch.Tensor:
        import networkx as nx

        graph = nx.watts_strogatz_graph(n, k, rewire_p, seed=seed)
        return _graph_mask(graph, block_rows, block_cols, diagonal)

    if degree is None:
        # On a square grid the density is exactly (degree + diagonal) / n.
        estimate = check_density(density) * n - int(diagonal)
        mask = _fit_density(density, list(range(0, n + 1, 2)), build, round(estimate / 2), "degree", "small_world",
                            (block_rows, block_cols))
    else:
        mask = build(degree)
    return BlockLayout(mask.to(device), block_size)


def barabasi_albert(
    rows: int,
    cols: int,
    block_size: int,
    *,
    m: int | None = None,
    density: float | None = None,
    seed: int = 0,
    diagonal: bool = False,
    device=None,
) -> BlockLayout:
    """Barabasi-Albert layout: ``networkx.barabasi_albert_graph(n, m, seed)``.

    Preferential attachment: each new node joins ``m`` existing nodes, chosen with
    probability proportional to their degree, so a few hub block-rows (and, by symmetry,
    block-cols) hold many blocks while most hold about ``m``: a heavy-tailed count per
    row. The 2017 blocksparse paper's sparse LSTMs used layouts of this kind. networkx numbers nodes in order of arrival, so the hubs are the first nodes: the
    densest block-rows are near the top, the densest block-cols near the left.

    Give exactly one of:
        m: edges per new node, 1 <= m < n. The graph has ``m * (n - m)`` edges, so a
            square layout has exactly ``2 * m * (n - m)`` blocks (plus ``n`` with
            ``diagonal``): at most about half the grid, reached at ``m = n // 2``.
        density: the target density; the m in [1, n // 2] whose layout comes closest is
            used.

    On a non-square grid every block of the smaller side folds ``g ~ n / smaller`` nodes of
    at least ``m`` edges each, so the sparsest layout (``m = 1``) has a density of about
    ``2 / min(block_rows, block_cols)``. Needs at least 2 nodes (a grid with a side of 2
    or more blocks). ``seed`` (int)
    seeds networkx; ``diagonal`` adds the block diagonal.
    """
    block_rows, block_cols = block_grid(rows, cols, block_size)
    _one_of("m", m, density)
    seed = check_seed(seed)
    check_bool("diagonal", diagonal)
    if m is not None:
        m = check_int("m", m)
    n = node_count(block_rows, block_cols)
    if n == 0:
        return _empty(block_rows, block_cols, block_size, device)
    if n < 2:
        raise ValueError(
            f"barabasi_albert needs at least 2 graph nodes, but the grid is {block_rows}x{block_cols} blocks "
            "(rows, cols and block_size leave fewer than 2 blocks on each side)"
        )
    if m is not None:
        check_int("m", m, low=1, high=n - 1, why=f" (n = max(block_rows, block_cols) = {n} graph nodes)")

    def build(edges_per_node: int) -> torch.Tensor:
        import networkx as nx

        graph = nx.barabasi_albert_graph(n, edges_per_node, seed=seed)
        return _graph_mask(graph, block_rows, block_cols, diagonal)

    if m is None:
        # Square grid: density = (2 m (n - m) + diagonal * n) / n^2; solve for m.
        target = check_density(density) - int(diagonal) / n
        estimate = n * (1 - math.sqrt(max(0.0, 1 - 2 * max(0.0, target)))) / 2
        mask = _fit_density(density, list(range(1, n // 2 + 1)), build, round(estimate) - 1, "m", "barabasi_albert",
                            (block_rows, block_cols))
    else:
        mask = build(m)
    return BlockLayout(mask.to(device), block_size)


# --------------------------------------------------------------------------- helpers


def _one_of(name: str, value, density) -> None:
    if (value is None) == (density is None):
        raise ValueError(f"give exactly one of {name} or density (got {name}={value!r}, density={density!r})")
    if density is not None:
        check_density(density)


def _empty(block_rows: int, block_cols: int, block_size: int, device) -> BlockLayout:
    # A grid without blocks: nothing to place, whatever the parameters.
    return BlockLayout(torch.zeros(block_rows, block_cols, dtype=torch.bool, device=device), block_size)


def _graph_mask(graph, block_rows: int, block_cols: int, diagonal: bool) -> torch.Tensor:
    edges = torch.tensor(list(graph.edges()), dtype=torch.long)
    mask = fold(edges, block_rows, block_cols, symmetric=True)
    if diagonal:
        mask |= diagonal_mask(block_rows, block_cols)
    return mask


def _fit_density(
    target: float,
    candidates: list[int],
    build: Callable[[int], torch.Tensor],
    start: int,
    param: str,
    model: str,
    grid: tuple[int, int],
) -> torch.Tensor:
    """The mask, among ``build(c)`` for c in ``candidates``, whose density is closest to
    ``target`` (ties go to the sparser one). Density is taken to grow with the candidate
    (exactly so on square grids; on folded grids up to noise, where the search settles on
    a crossing of the target), so the result is within half a step (the gap between
    neighbouring candidates' densities) of the target. A target farther than that outside
    the reachable range is a ValueError naming density. Galloping search from ``start``,
    then bisection: a few graph builds near the answer instead of a sweep over all
    candidates."""
    masks: dict[int, torch.Tensor] = {}

    def density_at(i: int) -> float:
        if i not in masks:
            masks[i] = build(candidates[i])
        mask = masks[i]
        return mask.sum().item() / mask.numel() if mask.numel() else 0.0

    def out_of_range() -> ValueError:
        low, high = density_at(0), density_at(len(candidates) - 1)
        return ValueError(
            f"density={target} is outside what {model} reaches on a {grid[0]}x{grid[1]} block grid: "
            f"[{low:.4g}, {high:.4g}] ({param} from {candidates[0]} to {candidates[-1]})"
        )

    last = len(candidates) - 1

    def at_end(end: int, inner: int) -> torch.Tensor:
        # The target lies beyond the densest (or sparsest) candidate: accept that one if it
        # is within half a step (the gap to its neighbour), as inside the range.
        half_step = abs(density_at(inner) - density_at(end)) / 2
        if abs(density_at(end) - target) > half_step + _EPS:
            raise out_of_range()
        return masks[end]

    i = min(max(start, 0), last)
    # Bracket the target: density_at(lo) < target <= density_at(hi), then bisect to hi == lo + 1.
    if density_at(i) >= target:
        hi, step = i, 1
        while True:
            lo = hi - step
            if lo < 0:
                if density_at(0) >= target:
                    return at_end(0, min(1, last))
                lo = 0
                break
            if density_at(lo) < target:
                break
            hi, step = lo, step * 2
    else:
        lo, step = i, 1
        while True:
            hi = lo + step
            if hi > last:
                if density_at(last) < target:
                    return at_end(last, max(last - 1, 0))
                hi = last
                break
            if density_at(hi) >= target:
                break
            lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if density_at(mid) >= target:
            hi = mid
        else:
            lo = mid
    best = lo if target - density_at(lo) <= density_at(hi) - target else hi
    if target > 0 and density_at(best) == 0:
        # the closest fit to a positive density is no blocks at all: say so, not return an empty layout
        raise ValueError(f"density={target} on a {grid[0]}x{grid[1]} block grid is closest to an empty {model} "
                         f"layout ({param} {candidates[best]}); the next {param} ({candidates[hi]}) gives density "
                         f"{density_at(hi):.4g}: ask for a larger density, a larger grid or a {param}")
    return masks[best]
