"""BlockLayout and the layout generators (tilesparse.layouts).

Everything here is checked against brute force computed from the bool mask with plain
Python loops, never against the library's own vectorised code.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilesparse
from tilesparse import BlockLayout, layouts
from tilesparse.layout import meta_numel, split_meta


# --------------------------------------------------------------------------- brute force


def brute_tables(mask: torch.Tensor) -> dict:
    """The six lookup tables, from their definition in tilesparse/layout.py, by loops."""
    m = mask.tolist()
    n_rows, n_cols = mask.shape
    storage = [(r, c) for r in range(n_rows) for c in range(n_cols) if m[r][c]]  # row-major
    slot_of = {rc: i for i, rc in enumerate(storage)}
    row_ptr = [0]
    for r in range(n_rows):
        row_ptr.append(row_ptr[-1] + sum(1 for c in range(n_cols) if m[r][c]))
    col_ptr, col_rows, col_slot = [0], [], []
    for c in range(n_cols):
        for r in range(n_rows):
            if m[r][c]:
                col_rows.append(r)
                col_slot.append(slot_of[(r, c)])
        col_ptr.append(len(col_rows))
    return {
        "row_ptr": row_ptr,
        "row_cols": [c for _, c in storage],
        "row_of": [r for r, _ in storage],
        "col_ptr": col_ptr,
        "col_rows": col_rows,
        "col_slot": col_slot,
        "coords": storage,
    }


def assert_tables_match(layout: BlockLayout) -> None:
    expected = brute_tables(layout.mask)
    meta = layout.meta
    assert meta.dtype == torch.int32
    assert meta.dim() == 1
    assert meta.numel() == meta_numel(layout.block_rows, layout.block_cols, layout.nnz)
    tables = layout.tables
    for name in ("row_ptr", "row_cols", "row_of", "col_ptr", "col_rows", "col_slot"):
        got = getattr(tables, name)
        assert got.dtype == torch.int32, name
        assert got.tolist() == expected[name], name
    # split_meta on the raw tensor gives the same views as .tables
    again = split_meta(meta, layout.block_rows, layout.block_cols)
    assert again.col_slot.tolist() == expected["col_slot"]
    assert [tuple(rc) for rc in layout.coords.tolist()] == expected["coords"]


def brute_block_norms(weight: torch.Tensor, b: int) -> list[list[float]]:
    w = weight.double()
    rows, cols = w.shape
    return [
        [math.sqrt(float((w[r * b:(r + 1) * b, c * b:(c + 1) * b] ** 2).sum())) for c in range(cols // b)]
        for r in range(rows // b)
    ]


# Named masks covering the table edge cases: nothing stored, everything stored, whole
# block-rows and block-cols empty (ptr entries that repeat), a single block, degenerate
# 1-wide grids, and a grid with zero block-rows (only the ptr sentinels remain).
NAMED_MASKS = {
    "empty": torch.zeros(3, 4, dtype=torch.bool),
    "full": torch.ones(3, 4, dtype=torch.bool),
    "empty_rows_cols": torch.tensor(
        [[0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.bool
    ),
    "single_block": torch.tensor([[0, 0], [0, 1]], dtype=torch.bool),
    "one_row": torch.tensor([[1, 0, 1, 1]], dtype=torch.bool),
    "one_col": torch.tensor([[1], [0], [1]], dtype=torch.bool),
    "zero_block_rows": torch.zeros(0, 3, dtype=torch.bool),
}


# --------------------------------------------------------------------------- construction and validation


class TestConstruction:
    def test_non_tensor_mask_is_type_error_naming_mask(self):
        with pytest.raises(TypeError, match="mask"):
            BlockLayout([[True, False]], 4)

    @pytest.mark.parametrize("shape", [(4,), (2, 2, 2), ()], ids=["1d", "3d", "0d"])
    def test_mask_must_be_2d(self, shape):
        with pytest.raises(ValueError, match="mask must be 2-D"):
            BlockLayout(torch.ones(shape, dtype=torch.bool), 4)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64], ids=str)
    def test_float_mask_is_type_error_naming_mask(self, dtype):
        with pytest.raises(TypeError, match="mask"):
            BlockLayout(torch.ones(2, 2, dtype=dtype), 4)

    def test_integer_mask_outside_0_1_is_value_error_naming_mask(self):
        with pytest.raises(ValueError, match="mask"):
            BlockLayout(torch.tensor([[0, 2], [1, 0]]), 4)

    @pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
    def test_integer_0_1_mask_becomes_bool(self, dtype):
        layout = BlockLayout(torch.tensor([[0, 1], [1, 1]], dtype=dtype), 4)
        assert layout.mask.dtype == torch.bool
        assert layout.mask.tolist() == [[False, True], [True, True]]

    @pytest.mark.parametrize("block_size", [0, -8, 2.0, True, "8", None], ids=repr)
    def test_bad_block_size_is_value_error_naming_block_size(self, block_size):
        with pytest.raises(ValueError, match="block_size"):
            BlockLayout(torch.ones(2, 2, dtype=torch.bool), block_size)

    def test_non_contiguous_mask_is_stored_contiguous(self):
        mask = torch.tensor([[1, 0, 0], [1, 1, 0]], dtype=torch.bool).t()
        layout = BlockLayout(mask, 2)
        assert layout.mask.is_contiguous()
        assert torch.equal(layout.mask, mask)
        assert_tables_match(layout)

    def test_shape_and_grid(self):
        layout = BlockLayout(torch.ones(3, 5, dtype=torch.bool), 16)
        assert (layout.block_rows, layout.block_cols) == (3, 5)
        assert layout.shape == (48, 80)
        assert layout.block_size == 16
        assert layout.device == torch.device("cpu")

    def test_dense_constructor_is_full(self):
        layout = BlockLayout.dense(32, 48, 16)
        assert layout.mask.all() and layout.shape == (32, 48) and layout.nnz == 6

    @pytest.mark.parametrize("rows, cols, name", [(30, 48, "rows"), (32, 50, "cols")], ids=["rows", "cols"])
    def test_dense_constructor_rejects_non_divisible(self, rows, cols, name):
        with pytest.raises(ValueError, match=name):
            BlockLayout.dense(rows, cols, 16)


def test_a_layout_keeps_its_own_copy_of_the_mask():
    """Editing the mask given after building a layout changes nothing in it (review, 2026-12-04: a bool,
    contiguous mask was kept as given, so its count, coords and lazily built tables could disagree)."""
    mask = torch.zeros(2, 2, dtype=torch.bool)
    layouts_built = []
    for i in range(2):
        mask.zero_()
        mask[i, i] = True
        layouts_built.append(BlockLayout(mask, 4))
    assert layouts_built[0].coords.tolist() == [[0, 0]] and layouts_built[1].coords.tolist() == [[1, 1]]
    mask[0, 1] = True
    assert layouts_built[1].nnz == 1 and layouts_built[1].tables.row_cols.tolist() == [1]


class TestCountsAndCoords:
    @pytest.mark.parametrize("name", list(NAMED_MASKS), ids=list(NAMED_MASKS))
    def test_nnz_and_density(self, name):
        mask = NAMED_MASKS[name]
        layout = BlockLayout(mask, 8)
        count = sum(bool(v) for row in mask.tolist() for v in row)
        assert layout.nnz == count
        total = mask.shape[0] * mask.shape[1]
        assert layout.density == (count / total if total else 0.0)

    def test_coords_are_row_major(self):
        mask = torch.rand(7, 9) < 0.4
        coords = BlockLayout(mask, 4).coords
        assert coords.dtype == torch.int64 and coords.shape == (int(mask.sum()), 2)
        pairs = [tuple(p) for p in coords.tolist()]
        assert pairs == sorted(pairs)
        assert pairs == [(r, c) for r in range(7) for c in range(9) if mask[r, c]]


# --------------------------------------------------------------------------- tables


class TestTables:
    @pytest.mark.parametrize("name", list(NAMED_MASKS), ids=list(NAMED_MASKS))
    def test_named_masks(self, name):
        assert_tables_match(BlockLayout(NAMED_MASKS[name], 8))

    # Random masks of every small grid shape, including 0-wide ones; hypothesis shrinks
    # any failure to the smallest mask. The autouse seed fixture does not affect the
    # drawn masks, hence the health-check suppression.
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(rows=st.integers(0, 6), cols=st.integers(0, 6), bits=st.integers(0, 2**36 - 1))
    def test_random_masks(self, rows, cols, bits):
        flat = [(bits >> i) & 1 for i in range(rows * cols)]
        mask = torch.tensor(flat, dtype=torch.bool).reshape(rows, cols)
        assert_tables_match(BlockLayout(mask, 2))

    def test_meta_is_cached_per_device(self):
        layout = BlockLayout(torch.rand(4, 4) < 0.5, 8)
        assert layout.meta is layout.meta
        assert layout.meta_on("cpu") is layout.meta

    def test_tables_from_generated_layouts(self):
        assert_tables_match(layouts.random(96, 64, 8, 0.3, seed=3))
        assert_tables_match(layouts.balanced(64, 96, 16, 0.5, seed=4))


# --------------------------------------------------------------------------- from_coords


class TestFromCoords:
    def test_builds_the_mask_and_orders_row_major(self):
        coords = [(2, 1), (0, 3), (1, 0), (0, 0)]
        layout = BlockLayout.from_coords(coords, 3, 4, 8)
        assert layout.shape == (24, 32) and layout.nnz == 4
        assert layout.coords.tolist() == sorted(list(c) for c in coords)
        expected = torch.zeros(3, 4, dtype=torch.bool)
        for r, c in coords:
            expected[r, c] = True
        assert torch.equal(layout.mask, expected)

    def test_accepts_tensor_coords(self):
        coords = torch.tensor([[1, 1], [0, 2]])
        layout = BlockLayout.from_coords(coords, 2, 3, 4)
        assert layout.coords.tolist() == [[0, 2], [1, 1]]

    @pytest.mark.parametrize("coords", [[], torch.empty(0, 2, dtype=torch.long)], ids=["list", "tensor"])
    def test_empty_coords_give_an_empty_layout(self, coords):
        layout = BlockLayout.from_coords(coords, 2, 3, 4)
        assert layout.nnz == 0 and layout.shape == (8, 12)
        assert_tables_match(layout)

    def test_duplicates_raise(self):
        with pytest.raises(ValueError, match="duplicate"):
            BlockLayout.from_coords([(0, 1), (1, 0), (0, 1)], 2, 2, 4)

    @pytest.mark.parametrize(
        "coords",
        [[(2, 0)], [(0, 3)], [(-1, 0)], [(0, -1)]],
        ids=["row_too_big", "col_too_big", "negative_row", "negative_col"],
    )
    def test_out_of_range_raises(self, coords):
        with pytest.raises(ValueError, match="out of range"):
            BlockLayout.from_coords(coords, 2, 3, 4)

    def test_wrong_coords_shape_raises(self):
        with pytest.raises(ValueError, match="coords"):
            BlockLayout.from_coords([[0, 1, 2]], 2, 3, 4)

    def test_equals_layout_from_mask(self):
        mask = torch.rand(5, 6) < 0.5
        assert BlockLayout.from_coords(mask.nonzero(), 5, 6, 8) == BlockLayout(mask, 8)


# --------------------------------------------------------------------------- to / transpose / dense round trips


class TestTransforms:
    def test_to_same_device_is_identity(self):
        layout = BlockLayout(torch.rand(3, 3) < 0.5, 4)
        assert layout.to("cpu") is layout
        assert layout.to(torch.device("cpu")) is layout

    def test_to_other_device_keeps_layout(self):
        # No GPU here: the meta device stands in for "another device" (the GPU suite
        # covers cuda, with the tables checked there).
        mask = torch.rand(3, 5) < 0.5
        layout = BlockLayout(mask, 4)
        assert layout.nnz == int(mask.sum())  # cached before the move: meta tensors cannot .item()
        moved = layout.to("meta")
        assert moved is not layout
        assert moved.device.type == "meta"
        assert moved.mask.device.type == "meta"
        assert (moved.shape, moved.block_size, moved.nnz) == (layout.shape, 4, int(mask.sum()))
        # the original is untouched
        assert layout.device.type == "cpu" and torch.equal(layout.mask, mask)

    def test_transpose(self):
        b = 4
        mask = torch.rand(3, 5) < 0.5
        mask[0, 0] = True
        layout = BlockLayout(mask, b)
        t = layout.transpose()
        assert t.shape == (layout.shape[1], layout.shape[0])
        assert torch.equal(t.mask, mask.t())
        assert t.transpose() == layout
        assert_tables_match(t)
        # documented storage-order relation: values of W^T = values[col_slot].transpose(1, 2)
        values = torch.randn(layout.nnz, b, b, dtype=torch.float64)
        slot = layout.tables.col_slot.long()
        assert torch.equal(t.to_dense(values[slot].transpose(1, 2)), layout.to_dense(values).t())
        assert torch.equal(layout.transposed_values(values), values[slot].transpose(1, 2))
        assert layout.transposed_values(values).is_contiguous()
        assert torch.equal(t.transposed_values(layout.transposed_values(values)), values)  # the round trip

    @pytest.mark.parametrize("shape", [(4, 4, 4), (2, 4, 4), (3, 2, 2), (3, 4)])
    def test_transposed_values_refuses_values_of_another_shape(self, shape):
        layout = BlockLayout(torch.tensor([[True, False], [True, True]]), 4)  # 3 blocks of 4 x 4
        with pytest.raises(ValueError, match=r"values must have shape \(3, 4, 4\)"):
            layout.transposed_values(torch.randn(*shape))

    @pytest.mark.parametrize("name", ["empty", "full", "empty_rows_cols", "single_block"])
    def test_to_dense_brute_force(self, name):
        b = 3
        layout = BlockLayout(NAMED_MASKS[name], b)
        values = torch.randn(layout.nnz, b, b, dtype=torch.float64)
        dense = layout.to_dense(values)
        expected = torch.zeros(layout.shape, dtype=torch.float64)
        for i, (r, c) in enumerate(layout.coords.tolist()):
            expected[r * b:(r + 1) * b, c * b:(c + 1) * b] = values[i]
        assert torch.equal(dense, expected)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
    def test_gather_to_dense_round_trip(self, dtype):
        b = 4
        layout = BlockLayout(NAMED_MASKS["empty_rows_cols"], b)
        values = torch.randn(layout.nnz, b, b).to(dtype)
        assert torch.equal(layout.gather(layout.to_dense(values)), values)
        dense = torch.randn(layout.shape).to(dtype)
        kept = layout.mask.repeat_interleave(b, 0).repeat_interleave(b, 1)
        assert torch.equal(layout.to_dense(layout.gather(dense)), torch.where(kept, dense, 0))
        assert layout.gather(dense).is_contiguous()

    def test_to_dense_rejects_wrong_shape(self):
        layout = BlockLayout(torch.ones(2, 2, dtype=torch.bool), 4)
        with pytest.raises(ValueError, match="values"):
            layout.to_dense(torch.zeros(3, 4, 4))
        with pytest.raises(ValueError, match="values"):
            layout.to_dense(torch.zeros(4, 2, 2))

    def test_gather_rejects_wrong_shape(self):
        layout = BlockLayout(torch.ones(2, 2, dtype=torch.bool), 4)
        with pytest.raises(ValueError, match="dense"):
            layout.gather(torch.zeros(8, 9))


class TestEquality:
    def test_equal_layouts(self):
        mask = torch.rand(4, 4) < 0.5
        assert BlockLayout(mask, 8) == BlockLayout(mask.clone(), 8)

    def test_different_block_size(self):
        mask = torch.rand(4, 4) < 0.5
        assert BlockLayout(mask, 8) != BlockLayout(mask, 16)

    def test_different_mask(self):
        mask = torch.zeros(4, 4, dtype=torch.bool)
        other = mask.clone()
        other[2, 3] = True
        assert BlockLayout(mask, 8) != BlockLayout(other, 8)

    def test_different_grid_shape(self):
        assert BlockLayout(torch.ones(2, 4, dtype=torch.bool), 8) != BlockLayout(torch.ones(4, 2, dtype=torch.bool), 8)

    def test_non_layout(self):
        layout = BlockLayout(torch.ones(2, 2, dtype=torch.bool), 8)
        assert layout.__eq__(3) is NotImplemented
        assert layout != "layout"

    def test_unhashable(self):
        with pytest.raises(TypeError):
            hash(BlockLayout(torch.ones(2, 2, dtype=torch.bool), 8))

    def test_repr(self):
        text = repr(BlockLayout(torch.tensor([[1, 0], [0, 0]], dtype=torch.bool), 8))
        assert "block_size=8" in text and "nnz=1" in text and "(16, 16)" in text


# --------------------------------------------------------------------------- generators


class TestRandom:
    # Grids chosen so density * blocks is an exact integer, or a non-integer that rounds
    # (48 blocks * 0.3 = 14.4 -> 14), plus the 0 and 1 ends.
    @pytest.mark.parametrize(
        "rows, cols, b, density, count",
        [(64, 64, 8, 0.25, 16), (48, 64, 8, 0.3, 14), (32, 96, 16, 0.5, 6), (64, 64, 16, 0.0, 0), (64, 64, 16, 1.0, 16)],
        ids=["quarter", "rounded", "half", "zero", "one"],
    )
    def test_exact_count(self, rows, cols, b, density, count):
        layout = layouts.random(rows, cols, b, density, seed=int(torch.randint(1000, ())))
        assert layout.nnz == count
        assert layout.shape == (rows, cols) and layout.block_size == b

    def test_seeded_reproducible(self):
        seed = int(torch.randint(10_000, ()))
        assert layouts.random(128, 128, 8, 0.3, seed=seed) == layouts.random(128, 128, 8, 0.3, seed=seed)

    def test_different_seeds_differ(self):
        # 256 blocks, 77 kept: two seeds agree with probability ~1/C(256, 77).
        assert layouts.random(128, 128, 8, 0.3, seed=1) != layouts.random(128, 128, 8, 0.3, seed=2)

    def test_independent_of_global_rng(self):
        torch.manual_seed(0)
        first = layouts.random(64, 64, 8, 0.5, seed=5)
        torch.manual_seed(1)
        assert layouts.random(64, 64, 8, 0.5, seed=5) == first


class TestBalanced:
    # Per-row counts written out: exact (16 * 0.25), half, the 0 and 1 ends, and a
    # rounded one (7 block-cols * 0.3 = 2.1 -> 2).
    @pytest.mark.parametrize(
        "rows, cols, b, density, per_row",
        [(64, 128, 8, 0.25, 4), (96, 64, 16, 0.5, 2), (32, 32, 8, 0.0, 0), (32, 32, 8, 1.0, 4), (64, 112, 16, 0.3, 2)],
        ids=["quarter", "half", "zero", "one", "rounded"],
    )
    def test_same_count_per_row(self, rows, cols, b, density, per_row):
        layout = layouts.balanced(rows, cols, b, density, seed=int(torch.randint(1000, ())))
        assert layout.mask.sum(dim=1).tolist() == [per_row] * (rows // b)
        assert layout.shape == (rows, cols)

    def test_seeded_reproducible_and_seeds_differ(self):
        a = layouts.balanced(128, 128, 8, 0.5, seed=11)
        assert a == layouts.balanced(128, 128, 8, 0.5, seed=11)
        assert a != layouts.balanced(128, 128, 8, 0.5, seed=12)


class TestFromDense:
    @pytest.mark.parametrize(
        "rows, cols, b, density",
        [(48, 64, 8, 0.25), (64, 32, 16, 0.5), (32, 32, 8, 1.0), (32, 32, 8, 0.0), (40, 40, 8, 0.35)],
        ids=["quarter", "half", "one", "zero", "rounded"],  # rounded: 25 blocks * 0.35 = 8.75 -> 9
    )
    def test_keeps_top_l2_blocks(self, rows, cols, b, density):
        weight = torch.randn(rows, cols) * torch.rand(rows, cols)  # uneven block norms
        layout = layouts.from_dense(weight, b, density)
        norms = brute_block_norms(weight, b)
        flat = sorted(
            ((norms[r][c], r, c) for r in range(rows // b) for c in range(cols // b)), key=lambda t: -t[0]
        )
        keep = round(density * len(flat))
        expected = torch.zeros(rows // b, cols // b, dtype=torch.bool)
        for _, r, c in flat[:keep]:
            expected[r, c] = True
        assert torch.equal(layout.mask, expected)
        assert layout.block_size == b and layout.shape == (rows, cols)

    def test_ties_prefer_lower_storage_index(self):
        layout = layouts.from_dense(torch.ones(32, 32), 8, 0.25)  # all 16 norms equal
        assert layout.coords.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
    def test_low_and_high_precision_weights(self, dtype):
        weight = torch.zeros(32, 32, dtype=dtype)
        weight[8:16, 24:32] = 3.0
        weight[24:32, 0:8] = 2.0
        layout = layouts.from_dense(weight, 8, 2 / 16)
        assert layout.coords.tolist() == [[1, 3], [3, 0]]

    def test_requires_grad_weight(self):
        weight = torch.randn(16, 16, requires_grad=True)
        assert layouts.from_dense(weight, 8, 0.5).nnz == 2

    def test_non_2d_weight_raises(self):
        with pytest.raises(ValueError, match="weight"):
            layouts.from_dense(torch.randn(4, 16, 16), 8, 0.5)


# --------------------------------------------------------------------------- generator argument errors

GENERATORS = {
    "random": lambda rows, cols, b, d: layouts.random(rows, cols, b, d),
    "balanced": lambda rows, cols, b, d: layouts.balanced(rows, cols, b, d),
    "from_dense": lambda rows, cols, b, d: layouts.from_dense(torch.randn(rows, cols), b, d),
}


@pytest.mark.parametrize("generator", list(GENERATORS), ids=list(GENERATORS))
@pytest.mark.parametrize("rows, cols, name", [(36, 64, "rows"), (64, 36, "cols")], ids=["rows", "cols"])
def test_generators_reject_non_divisible_dims(generator, rows, cols, name):
    with pytest.raises(ValueError, match=f"{name}=36 is not divisible by block_size=8"):
        GENERATORS[generator](rows, cols, 8, 0.5)


@pytest.mark.parametrize("generator", list(GENERATORS), ids=list(GENERATORS))
@pytest.mark.parametrize("density", [-0.1, 1.01, 2.0, float("nan")], ids=["neg", "just_over", "two", "nan"])
def test_generators_reject_density_outside_unit_interval(generator, density):
    with pytest.raises(ValueError, match="density"):
        GENERATORS[generator](32, 32, 8, density)


@pytest.mark.parametrize("generator", list(GENERATORS), ids=list(GENERATORS))
@pytest.mark.parametrize("block_size", [0, -4], ids=["zero", "negative"])
def test_generators_reject_bad_block_size(generator, block_size):
    with pytest.raises(ValueError, match="block_size"):
        GENERATORS[generator](32, 32, block_size, 0.5)


def test_public_namespace():
    assert tilesparse.layouts is layouts
    assert set(layouts.__all__) == {
        "random", "balanced", "from_dense", "small_world", "barabasi_albert", "banded", "block_diagonal", "plot",
    }
    for name in layouts.__all__:
        assert callable(getattr(layouts, name))
