"""The row-group small-batch kernel (``kernels/bsmm_small_rows.py``, experimental): its group cuts, its
schedule tables, and its products under the Triton interpreter on CPU tensors against a float64 dense
reference (fprop and bprop, bias, empty rows, several rows per group, steps shorter than a block), and the
same bits as the small kernel where both take one block per step."""

import os

import pytest
import torch

from bsmm_cases import dense_of, random_values
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tilesparse.kernels.bsmm_small_rows import RowsConfig, dds_rows, row_groups, rows_schedule
from tolerances import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@pytest.mark.parametrize("counts, groups", [
    ([3, 3, 3, 3], 2), ([10, 1, 1, 1, 1, 10], 3), ([0, 0, 5, 0], 2), ([1] * 17, 4), ([7], 3), ([], 2),
    ([0, 0, 0], 2), ([5, 5, 5, 5, 5], 1),
])
def test_row_groups_cut_consecutive_rows_into_about_equal_runs(counts, groups):
    bounds = row_groups(counts, groups)
    assert bounds[0] == 0 and bounds[-1] == len(counts)
    assert all(a < b for a, b in zip(bounds, bounds[1:])) or not counts
    assert len(bounds) - 1 <= max(groups, 1)
    runs = [sum(counts[a:b]) for a, b in zip(bounds, bounds[1:])]
    if counts and sum(counts):
        # each run within one row of the even share
        share = sum(counts) / (len(bounds) - 1)
        assert max(runs) <= share + max(counts)


def test_rows_schedule_codes_mark_each_rows_last_entry():
    counts = [2, 0, 3, 1]
    ptr = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
    group, code, empty = rows_schedule(counts, ptr, 2)
    assert group.tolist()[0] == 0 and group.tolist()[-1] == 6
    assert code.tolist() == [0, 1, 4, 4, 5, 7]
    assert empty.tolist() == [1]


def _layout(block_rows, block_cols, b, density, seed, empty_rows=(), empty_cols=()):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(block_rows, block_cols, generator=g) < density
    for r in empty_rows:
        mask[r] = False
    for c in empty_cols:
        mask[:, c] = False
    return BlockLayout(mask, b)


@interpreter
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("b, cfg", [
    (32, RowsConfig(32, 32, 16, 2, 2, programs_per_sm=1)),
    (32, RowsConfig(16, 16, 16, 2, 2, programs_per_sm=1)),  # two steps per block, two slices
    (64, RowsConfig(32, 64, 16, 2, 2, programs_per_sm=2)),
])
@pytest.mark.parametrize("m, with_bias", [(1, True), (5, False), (16, True)])
def test_products_match_a_float64_reference(trans, b, cfg, m, with_bias):
    layout = _layout(7, 5, b, 0.4, seed=b + m, empty_rows=(2,), empty_cols=(3,))
    values = random_values(layout, torch.float32)
    width_in = layout.shape[1] if trans else layout.shape[0]
    width_out = layout.shape[0] if trans else layout.shape[1]
    a = torch.randn(m, width_in)
    bias = torch.randn(width_out) if with_bias else None
    out = dds_rows(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans, cfg, sms=3)
    dense = dense_of(values, layout)
    ref = a.double() @ (dense.t() if trans else dense)
    if bias is not None:
        ref += bias.double()
    assert_close(out, ref, torch.float32)


@interpreter
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
def test_the_same_bits_as_the_small_kernel(trans):
    layout = _layout(9, 6, 32, 0.5, seed=3)
    values = random_values(layout, torch.float32)
    a = torch.randn(4, layout.shape[1] if trans else layout.shape[0])
    cfg = bsmm_small.SmallConfig(32, 32, 16, num_warps=2, num_stages=2, spread_index=False)
    small = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans, cfg)
    rows = dds_rows(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans,
                    RowsConfig(32, 32, 16, 2, 2, programs_per_sm=1), sms=2)
    assert torch.equal(rows, small)


def test_a_layout_without_counts_is_refused():
    mask = torch.ones(2, 2, dtype=torch.bool)
    layout = BlockLayout.from_mask_with_nnz(mask, 32, 4)
    with pytest.raises(ValueError, match="block counts"):
        dds_rows(torch.randn(1, 64), torch.randn(4, 32, 32), layout.meta, None, 2, 2, True,
                 RowsConfig(32, 32, 16, 2, 2))


def test_config_checks():
    with pytest.raises(ValueError, match="num_warps"):
        RowsConfig(32, 32, 16, 3, 2)
    with pytest.raises(ValueError):
        RowsConfig(24, 32, 16, 2, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("b, m", [(32, 1), (128, 8), (64, 32)])
def test_gpu_products_match_a_float64_reference_and_the_small_kernel(trans, b, m):
    layout = _layout(40, 24, b, 0.3, seed=b, empty_rows=(5,), empty_cols=(7,)).to("cuda")
    values = random_values(layout, torch.bfloat16, device="cuda")
    a = torch.randn(m, layout.shape[1] if trans else layout.shape[0], device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(layout.shape[0] if trans else layout.shape[1], device="cuda", dtype=torch.bfloat16)
    tile = min(b, 128)
    bm = bsmm_small.rows_per_program(m)
    for pps, stages, warps in ((1, 12, 2), (2, 8, 4)):
        out = dds_rows(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans,
                       RowsConfig(32, tile, bm, warps, stages, programs_per_sm=pps))
        dense = dense_of(values, layout)
        ref = a.double().cpu() @ (dense.t() if trans else dense) + bias.double().cpu()
        assert_close(out, ref, torch.bfloat16)
        small = kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans,
                            bsmm_small.SmallConfig(32, tile, bm, num_warps=warps, num_stages=stages))
        assert torch.equal(out, small)  # one block per step, the same order: the same bits
