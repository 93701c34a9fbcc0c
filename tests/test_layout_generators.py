"""Structured and graph layout generators (tilesparse.layouts): small_world,
barabasi_albert, banded, block_diagonal (the plot helper: test_layout_plot.py).

Expected masks come from plain Python loops over node pairs, following the node grid
documented in tilesparse/layouts/_grid.py (n = max(block_rows, block_cols) nodes; node u
lies in block-row u * block_rows // n and block-col u * block_cols // n), and from
networkx graphs built here: never from the library's own vectorised code.
"""

import random as pyrandom

import networkx as nx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilesparse import BlockLayout, layouts

B = 4  # block size of most tests: the generators only see the block grid

# Block grids that break the folding in different ways: square (the identity mapping),
# wide with an uneven fold (16 / 6 is not whole: runs of 2 and 3 nodes share a block-row),
# tall with an even fold (4 nodes per block-col), a single block-row, and an odd square.
GRIDS = [(12, 12), (6, 16), (16, 4), (1, 5), (7, 7)]
GRID_IDS = ["square", "wide_uneven", "tall_even", "one_row", "odd_square"]


def fresh_seed() -> int:
    """A new seed every run (replayable through the conftest's printed base seed)."""
    return int(torch.randint(2**31 - 1, ()))


# --------------------------------------------------------------------------- brute force


def brute_fold(pairs, block_rows: int, block_cols: int, diagonal: bool = False) -> torch.Tensor:
    """Mask of undirected node pairs folded onto the grid, plus (u, u) for every node."""
    n = max(block_rows, block_cols) if block_rows and block_cols else 0
    mask = torch.zeros(block_rows, block_cols, dtype=torch.bool)
    for u, v in pairs:
        mask[u * block_rows // n, v * block_cols // n] = True
        mask[v * block_rows // n, u * block_cols // n] = True
    if diagonal:
        for u in range(n):
            mask[u * block_rows // n, u * block_cols // n] = True
    return mask


def brute_band(block_rows: int, block_cols: int, bandwidth: int, wrap: bool, diagonal: bool) -> torch.Tensor:
    n = max(block_rows, block_cols) if block_rows and block_cols else 0  # no blocks, no nodes
    pairs = []
    for u in range(n):
        for v in range(n):
            d = abs(u - v)
            if wrap:
                d = min(d, n - d)
            if d <= bandwidth and (diagonal or d > 0):
                pairs.append((u, v))
    return brute_fold(pairs, block_rows, block_cols)


def diagonal_cells(block_rows: int, block_cols: int) -> set:
    n = max(block_rows, block_cols)
    return {(u * block_rows // n, u * block_cols // n) for u in range(n)}


def density_of(mask: torch.Tensor) -> float:
    return sum(map(sum, mask.int().tolist())) / mask.numel()


def make(generator: str, grid, *, seed=0, diagonal=False, **kwargs) -> BlockLayout:
    """One layout per family with a default parameter, for the tests shared by all."""
    rows, cols = grid[0] * B, grid[1] * B
    if generator == "small_world":
        if "density" not in kwargs:
            kwargs.setdefault("degree", 2)
        return layouts.small_world(rows, cols, B, seed=seed, diagonal=diagonal, **kwargs)
    if generator == "barabasi_albert":
        if "density" not in kwargs:
            kwargs.setdefault("m", 1)
        return layouts.barabasi_albert(rows, cols, B, seed=seed, diagonal=diagonal, **kwargs)
    if generator == "banded":
        kwargs.setdefault("bandwidth", 1)
        return layouts.banded(rows, cols, B, diagonal=diagonal, **kwargs)
    raise AssertionError(generator)


ALL = ["small_world", "barabasi_albert", "banded"]
SEEDED = ["small_world", "barabasi_albert"]


# --------------------------------------------------------------------------- shared properties


@pytest.mark.parametrize("generator", ALL)
@pytest.mark.parametrize("grid", GRIDS, ids=GRID_IDS)
def test_shape_and_block_size(generator, grid):
    for b in (1, 3, 16):  # the block size only scales the element shape
        rows, cols = grid[0] * b, grid[1] * b
        layout = {
            "small_world": lambda: layouts.small_world(rows, cols, b, degree=2, seed=1),
            "barabasi_albert": lambda: layouts.barabasi_albert(rows, cols, b, m=1, seed=1),
            "banded": lambda: layouts.banded(rows, cols, b, bandwidth=1),
        }[generator]()
        assert isinstance(layout, BlockLayout)
        assert layout.shape == (rows, cols) and layout.block_size == b
        assert (layout.block_rows, layout.block_cols) == grid
        assert layout.mask.dtype == torch.bool and layout.device == torch.device("cpu")


@pytest.mark.parametrize("generator", ALL)
@pytest.mark.parametrize("grid", GRIDS, ids=GRID_IDS)
def test_diagonal_option_includes_every_diagonal_block(generator, grid):
    seed = fresh_seed()
    with_diagonal = make(generator, grid, seed=seed, diagonal=True)
    cells = diagonal_cells(*grid)
    mask = with_diagonal.mask.tolist()
    assert all(mask[r][c] for r, c in cells)
    # ... so every block-row and every block-col holds a block
    assert with_diagonal.mask.any(dim=1).all() and with_diagonal.mask.any(dim=0).all()
    # on a square grid the stretched diagonal is the ordinary one
    if grid[0] == grid[1]:
        assert cells == {(i, i) for i in range(grid[0])}
    # diagonal=True adds exactly those cells to the same graph (same seed)
    without = make(generator, grid, seed=seed, diagonal=False)
    expected = without.mask.clone()
    for r, c in cells:
        expected[r, c] = True
    assert torch.equal(with_diagonal.mask, expected)


def test_stretched_diagonal_steps_start_at_ceil_i_cols_over_rows():
    # Documented in _grid.py: on a wide grid block-row i's step of the diagonal starts at
    # block-col ceil(i * cols / rows), i.e. i * cols // rows when the sides divide evenly;
    # on a tall grid the same with the sides swapped.
    for rows, cols in [(6, 16), (16, 6), (5, 12), (4, 16), (3, 3)]:
        cells = diagonal_cells(rows, cols)
        small, large = min(rows, cols), max(rows, cols)
        starts = {(i, -(-i * large // small)) for i in range(small)}
        if rows > cols:
            starts = {(c, r) for r, c in starts}
        assert starts <= cells
        for r, c in starts:  # each is the first cell of its step
            assert (r, c - 1) not in cells if rows <= cols else (r - 1, c) not in cells
        if large % small == 0:
            assert starts == {(i, i * large // small) for i in range(small)} or rows > cols


@pytest.mark.parametrize("generator", SEEDED)
def test_seeded_reproducible_and_seeds_differ(generator):
    # 32 x 32 blocks (n = 32 nodes): two seeds giving the same graph would be a collision
    # among a vast number of graphs.
    seed = fresh_seed()
    kwargs = {"m": 2} if generator == "barabasi_albert" else {"degree": 4, "rewire_p": 0.3}
    first = make(generator, (32, 32), seed=seed, **kwargs)
    assert first == make(generator, (32, 32), seed=seed, **kwargs)
    assert first != make(generator, (32, 32), seed=seed + 1, **kwargs)
    # the density search reproduces too
    by_density = make(generator, (20, 48), seed=seed, density=0.2)
    assert by_density == make(generator, (20, 48), seed=seed, density=0.2)


@pytest.mark.parametrize("generator", SEEDED)
def test_independent_of_global_random_state(generator):
    pyrandom.seed(0)
    torch.manual_seed(0)
    first = make(generator, (16, 16), seed=7)
    pyrandom.seed(1)
    torch.manual_seed(1)
    assert make(generator, (16, 16), seed=7) == first


def test_banded_is_deterministic():
    # banded has nothing random, hence no seed argument
    assert layouts.banded(64, 48, 4, bandwidth=2) == layouts.banded(64, 48, 4, bandwidth=2)


@pytest.mark.parametrize("generator", ALL)
def test_square_layouts_are_symmetric(generator):
    # Undirected graphs and bands: the square adjacency is symmetric.
    layout = make(generator, (24, 24), seed=fresh_seed(), diagonal=bool(torch.randint(2, ())))
    assert torch.equal(layout.mask, layout.mask.t())


@pytest.mark.parametrize("generator", ALL)
def test_device_argument(generator):
    # "meta" stands in for another device (no GPU here); the mask is built on the CPU first.
    layout = make(generator, (8, 8), device="meta")
    assert layout.device.type == "meta" and layout.mask.shape == (8, 8)


# --------------------------------------------------------------------------- banded


class TestBanded:
    # Bandwidths: the diagonal alone, narrow bands, one wider than the grid (full).
    @pytest.mark.parametrize("grid", GRIDS, ids=GRID_IDS)
    @pytest.mark.parametrize("bandwidth", [0, 1, 2, 40])
    @pytest.mark.parametrize("wrap", [False, True], ids=["line", "ring"])
    @pytest.mark.parametrize("diagonal", [True, False], ids=["diag", "nodiag"])
    def test_matches_brute_force(self, grid, bandwidth, wrap, diagonal):
        layout = layouts.banded(grid[0] * B, grid[1] * B, B, bandwidth=bandwidth, wrap=wrap, diagonal=diagonal)
        assert torch.equal(layout.mask, brute_band(*grid, bandwidth, wrap, diagonal))

    # Every small grid shape, including 0-wide ones; hypothesis shrinks failures.
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        rows=st.integers(0, 13), cols=st.integers(0, 13), bandwidth=st.integers(0, 15),
        wrap=st.booleans(), diagonal=st.booleans(),
    )
    def test_matches_brute_force_any_grid(self, rows, cols, bandwidth, wrap, diagonal):
        layout = layouts.banded(rows * 2, cols * 2, 2, bandwidth=bandwidth, wrap=wrap, diagonal=diagonal)
        assert torch.equal(layout.mask, brute_band(rows, cols, bandwidth, wrap, diagonal))

    @pytest.mark.parametrize("kwargs, expected", [
        (dict(), [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 1, 1, 1],
            [0, 0, 0, 0, 1, 1],
        ]),
        (dict(wrap=True, diagonal=False), [
            [0, 1, 0, 0, 0, 1],
            [1, 0, 1, 0, 0, 0],
            [0, 1, 0, 1, 0, 0],
            [0, 0, 1, 0, 1, 0],
            [0, 0, 0, 1, 0, 1],
            [1, 0, 0, 0, 1, 0],
        ]),
    ], ids=["band", "ring"])
    def test_square_band_written_out(self, kwargs, expected):
        layout = layouts.banded(6 * B, 6 * B, B, bandwidth=1, **kwargs)
        assert layout.mask.int().tolist() == expected

    def test_square_band_is_abs_difference(self):
        n, w = 20, 3
        mask = layouts.banded(n * B, n * B, B, bandwidth=w, diagonal=False).mask.tolist()
        assert all(mask[r][c] == (1 <= abs(r - c) <= w) for r in range(n) for c in range(n))

    def test_diagonal_false_bandwidth_0_is_empty(self):
        assert layouts.banded(32, 64, 4, bandwidth=0, diagonal=False).nnz == 0

    def test_bandwidth_past_the_grid_is_full(self):
        assert layouts.banded(24, 40, 4, bandwidth=10).mask.all()


class TestBlockDiagonal:
    def test_square_is_identity(self):
        assert torch.equal(layouts.block_diagonal(40, 40, 8).mask, torch.eye(5, dtype=torch.bool))

    def test_wide_gives_each_row_its_own_run(self):
        mask = layouts.block_diagonal(4 * B, 16 * B, B).mask
        expected = torch.zeros(4, 16, dtype=torch.bool)
        for r in range(4):
            expected[r, 4 * r:4 * r + 4] = True
        assert torch.equal(mask, expected)

    def test_tall_is_the_transpose_of_wide(self):
        assert torch.equal(layouts.block_diagonal(16 * B, 4 * B, B).mask, layouts.block_diagonal(4 * B, 16 * B, B).mask.t())

    @pytest.mark.parametrize("grid", GRIDS, ids=GRID_IDS)
    def test_is_banded_0_and_the_diagonal_cells(self, grid):
        layout = layouts.block_diagonal(grid[0] * B, grid[1] * B, B)
        assert layout == layouts.banded(grid[0] * B, grid[1] * B, B, bandwidth=0)
        assert {tuple(rc) for rc in layout.coords.tolist()} == diagonal_cells(*grid)


# --------------------------------------------------------------------------- small_world


class TestSmallWorld:
    @pytest.mark.parametrize("grid", GRIDS, ids=GRID_IDS)
    @pytest.mark.parametrize("degree, rewire_p", [(2, 0.1), (4, 0.5), (4, 1.0)])
    def test_is_the_networkx_graph_folded(self, grid, degree, rewire_p):
        n, seed = max(grid), fresh_seed()
        degree = min(degree, n - n % 2)
        layout = layouts.small_world(grid[0] * B, grid[1] * B, B, degree=degree, rewire_p=rewire_p, seed=seed)
        graph = nx.watts_strogatz_graph(n, degree, rewire_p, seed=seed)
        assert torch.equal(layout.mask, brute_fold(graph.edges(), *grid))

    # rewire_p=0 leaves the ring lattice: the circulant band of half-width degree / 2.
    @pytest.mark.parametrize(
        "grid, degree",
        [(g, k) for g in GRIDS + [(30, 30)] for k in (0, 2, 4, 6) if k <= max(g)],  # degree <= n
        ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"k{v}",
    )
    @pytest.mark.parametrize("diagonal", [False, True], ids=["nodiag", "diag"])
    def test_rewire_0_is_exactly_a_banded_ring(self, grid, degree, diagonal):
        rows, cols = grid[0] * B, grid[1] * B
        layout = layouts.small_world(rows, cols, B, degree=degree, rewire_p=0.0, seed=fresh_seed(), diagonal=diagonal)
        ring = brute_band(*grid, degree // 2, wrap=True, diagonal=diagonal)
        assert torch.equal(layout.mask, ring)
        assert layout == layouts.banded(rows, cols, B, bandwidth=degree // 2, wrap=True, diagonal=diagonal)

    @pytest.mark.parametrize("rewire_p", [0.0, 0.2, 1.0])
    def test_square_block_count_is_exact(self, rewire_p):
        # Rewiring moves edges and never drops them: n * degree blocks, density degree / n.
        n, degree = 40, 6
        layout = layouts.small_world(n * B, n * B, B, degree=degree, rewire_p=rewire_p, seed=fresh_seed())
        assert layout.nnz == n * degree and layout.density == degree / n
        assert not layout.mask.diagonal().any()  # no self-loops without diagonal=True

    def test_rewiring_changes_the_ring(self):
        n = 64
        ring = layouts.banded(n * B, n * B, B, bandwidth=2, wrap=True, diagonal=False)
        rewired = layouts.small_world(n * B, n * B, B, degree=4, rewire_p=0.3, seed=fresh_seed())
        assert rewired != ring and rewired.nnz == ring.nnz

    def test_degree_n_is_complete(self):
        layout = layouts.small_world(8 * B, 8 * B, B, degree=8, seed=0)
        assert torch.equal(layout.mask, ~torch.eye(8, dtype=torch.bool))
        assert layouts.small_world(8 * B, 8 * B, B, degree=8, diagonal=True).mask.all()


# --------------------------------------------------------------------------- barabasi_albert


class TestBarabasiAlbert:
    @pytest.mark.parametrize("grid", [g for g in GRIDS if max(g) >= 2], ids=[i for g, i in zip(GRIDS, GRID_IDS) if max(g) >= 2])
    @pytest.mark.parametrize("m", [1, 2, 3])
    def test_is_the_networkx_graph_folded(self, grid, m):
        n, seed = max(grid), fresh_seed()
        m = min(m, n - 1)
        layout = layouts.barabasi_albert(grid[0] * B, grid[1] * B, B, m=m, seed=seed)
        graph = nx.barabasi_albert_graph(n, m, seed=seed)
        assert torch.equal(layout.mask, brute_fold(graph.edges(), *grid))

    @pytest.mark.parametrize("m", [1, 3, 10])
    @pytest.mark.parametrize("diagonal", [False, True], ids=["nodiag", "diag"])
    def test_square_block_count_is_exact(self, m, diagonal):
        # m (n - m) edges, each stored as two blocks; the diagonal adds n.
        n = 40
        layout = layouts.barabasi_albert(n * B, n * B, B, m=m, seed=fresh_seed(), diagonal=diagonal)
        assert layout.nnz == 2 * m * (n - m) + (n if diagonal else 0)

    def test_degree_distribution_is_heavy_tailed(self):
        # 256 x 256 blocks, m = 3 (about 2.3% dense). Over 1000 seeds (measured when this
        # test was written): BA's largest block-row count was >= 5.06x the mean, against
        # <= 3.37x for a uniformly random layout of the same density; the top 5% of
        # block-rows held >= 18.8% of the blocks, against <= 11.0%. The thresholds sit
        # between the two.
        seed = fresh_seed()
        ba = layouts.barabasi_albert(256 * B, 256 * B, B, m=3, seed=seed)
        uniform = layouts.random(256 * B, 256 * B, B, ba.density, seed=seed)
        assert ba.density < 0.03
        for layout, heavy in ((ba, True), (uniform, False)):
            counts = layout.mask.sum(dim=1).float()
            peak = (counts.max() / counts.mean()).item()
            top_share = (counts.topk(13).values.sum() / counts.sum()).item()  # 13 = 5% of 256
            assert (peak > 4.2) == heavy, (peak, heavy)
            assert (top_share > 0.15) == heavy, (top_share, heavy)

    def test_hubs_are_the_first_nodes(self):
        # Documented: networkx numbers nodes by arrival, and early nodes become the hubs.
        counts = layouts.barabasi_albert(128 * B, 128 * B, B, m=2, seed=fresh_seed()).mask.sum(dim=1)
        assert counts[:8].float().mean() > 3 * counts[64:].float().mean()

    def test_two_nodes_is_the_smallest_graph(self):
        assert layouts.barabasi_albert(B, 2 * B, B, m=1).mask.tolist() == [[True, True]]


# --------------------------------------------------------------------------- density targets


class TestDensity:
    # Square grids: density grows exactly with the parameter, so the pick is the closest
    # of all candidates; checked against a sweep over every parameter value.
    @pytest.mark.parametrize("target", [0.05, 0.1, 0.2, 0.33, 0.5])
    @pytest.mark.parametrize("diagonal", [False, True], ids=["nodiag", "diag"])
    def test_small_world_square_picks_the_closest_degree(self, target, diagonal):
        n, seed = 24, fresh_seed()
        layout = layouts.small_world(n * B, n * B, B, density=target, seed=seed, diagonal=diagonal)
        sweep = [
            layouts.small_world(n * B, n * B, B, degree=k, seed=seed, diagonal=diagonal).density
            for k in range(0, n + 1, 2)
        ]
        assert abs(layout.density - target) == pytest.approx(min(abs(d - target) for d in sweep))
        assert abs(layout.density - target) <= 1 / n + 1e-12  # half a step of 2 / n

    @pytest.mark.parametrize("target", [0.1, 0.2, 0.3, 0.45])
    @pytest.mark.parametrize("diagonal", [False, True], ids=["nodiag", "diag"])
    def test_barabasi_albert_square_picks_the_closest_m(self, target, diagonal):
        n, seed = 24, fresh_seed()
        layout = layouts.barabasi_albert(n * B, n * B, B, density=target, seed=seed, diagonal=diagonal)
        sweep = [(2 * m * (n - m) + diagonal * n) / n**2 for m in range(1, n // 2 + 1)]
        assert abs(layout.density - target) == pytest.approx(min(abs(d - target) for d in sweep))

    # Larger and non-square grids, the densities the paper's layouts use. Tolerance 0.02
    # absolute: the local step between neighbouring parameters is at most 2 / 64 ~ 0.031 on
    # these grids (half of it is the square-grid guarantee) and folding adds noise.
    @pytest.mark.parametrize("grid", [(64, 64), (64, 160), (192, 64)], ids=["square", "wide", "tall"])
    @pytest.mark.parametrize("target", [0.05, 0.1, 0.25])
    @pytest.mark.parametrize("generator", SEEDED)
    def test_lands_near_the_target(self, generator, grid, target):
        layout = make(generator, grid, seed=fresh_seed(), density=target)
        assert abs(layout.density - target) <= 0.02, layout.density

    def test_exact_density_is_on_the_layout(self):
        layout = layouts.small_world(64 * B, 64 * B, B, density=0.1, seed=1)
        assert layout.density == density_of(layout.mask) == 6 / 64  # 6.4 rounds to degree 6

    @pytest.mark.parametrize(
        "call",
        [
            lambda: layouts.barabasi_albert(16 * B, 16 * B, B, density=0.9),  # BA tops out near 1/2
            lambda: layouts.barabasi_albert(16 * B, 16 * B, B, density=0.02),  # m = 1 gives 0.117
            lambda: layouts.small_world(16 * B, 16 * B, B, density=1.0),  # no self-loops: 15/16 at most
            lambda: layouts.small_world(4 * B, 48 * B, B, density=0.01, diagonal=True),  # diagonal alone: 1/4
        ],
        ids=["ba_too_dense", "ba_too_sparse", "ws_full_without_diagonal", "ws_folded_diagonal"],
    )
    def test_unreachable_density_raises_with_the_range(self, call):
        with pytest.raises(ValueError, match=r"density=.* is outside what .* reaches.*\[.*\]"):
            call()

    def test_a_positive_density_closest_to_no_blocks_is_refused(self):
        # 8 x 2 blocks: degree 0 gives 0, degree 2 gives 0.75-0.81; 0.3 is nearer 0 (review, 2026-12-04: the
        # empty layout came back without a word, e.g. as an LSTM's recurrent weight)
        with pytest.raises(ValueError, match=r"density=0.3 on a 8x2 block grid is closest to an empty small_world"):
            layouts.small_world(8 * B, 2 * B, B, density=0.3)
        assert layouts.small_world(8 * B, 2 * B, B, density=0.0).nnz == 0  # asked for: fine
        assert layouts.small_world(8 * B, 2 * B, B, density=0.5).nnz > 0

    def test_just_outside_the_range_within_half_a_step_is_accepted(self):
        # 16 nodes: m = 1 gives 30/256 = 0.117, m = 2 gives 0.219; 0.1 is within half a step.
        assert layouts.barabasi_albert(16 * B, 16 * B, B, density=0.1).nnz == 30
        assert layouts.small_world(16 * B, 16 * B, B, density=1.0, diagonal=True).mask.all()
        # diagonal alone is 1/16, one half step (of 2/16) above 0
        assert layouts.small_world(16 * B, 16 * B, B, density=0.0, diagonal=True) == layouts.block_diagonal(
            16 * B, 16 * B, B)

    @pytest.mark.parametrize("generator", SEEDED)
    @pytest.mark.parametrize("grid", [(0, 5), (3, 0), (0, 0)], ids=["no_rows", "no_cols", "none"])
    def test_grid_without_blocks_is_empty(self, generator, grid):
        for kwargs in ({"density": 0.3}, {}):
            layout = make(generator, grid, seed=fresh_seed(), diagonal=True, **kwargs)
            assert layout.mask.shape == grid and layout.nnz == 0
        with pytest.raises(ValueError, match="density"):  # arguments are still checked
            make(generator, grid, density=1.5)
