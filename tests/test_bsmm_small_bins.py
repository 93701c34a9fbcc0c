"""Load-balanced launches of the small-batch dds kernel (tilesparse.kernels.bsmm_small):
the LPT bins of a layout's tables, and the binned kernel against the unbinned one
(bitwise) and the float64 reference, under the Triton interpreter."""

import pytest
import torch
from bsmm_cases import INTERPRETER_MARKS, dense_of, make_layout, random_values
from hypothesis import given, settings
from hypothesis import strategies as st

from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tolerances import assert_close


def decode(bins, counts):
    """Each bin's tables and load (an empty table counts 1), from balanced_bins' output."""
    bin_ptr, bin_rows = (t.tolist() for t in bins)
    members = [bin_rows[bin_ptr[b]:bin_ptr[b + 1]] for b in range(len(bin_ptr) - 1)]
    return members, [sum(max(counts[t], 1) for t in m) for m in members]


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=60), subs=st.sampled_from([1, 2, 4]),
       min_programs=st.integers(0, 40))
def test_bins_hold_every_table_whole_once_and_balance_the_work(counts, subs, min_programs):
    ptr = torch.tensor([0] + counts).cumsum(0)
    bins = bsmm_small.balanced_bins(ptr, subs, min_programs)
    work = [max(c, 1) for c in counts]
    if bins is None:  # nothing to gain: as many bins as tables
        assert -(-sum(work) // max(work)) >= len(counts) or -(-min_programs // subs) >= len(counts)
        return
    members, loads = decode(bins, counts)
    assert sorted(t for m in members for t in m) == list(range(len(counts)))  # every table once, whole
    assert len(loads) < len(counts) and sum(loads) == sum(work)
    assert max(loads) <= sum(work) / len(loads) + max(work)  # the LPT bound


def test_equal_tables_are_not_binned():
    ptr = torch.arange(0, 13 * 5, 5)
    assert bsmm_small.balanced_bins(ptr, 4, 8) is None


def test_uneven_tables_pack_to_the_longest():
    ptr = torch.tensor([0, 8, 9, 10, 14, 18, 19, 20, 28])  # tables of 8, 1, 1, 4, 4, 1, 1, 8 blocks
    bins = bsmm_small.balanced_bins(ptr, 1, 0)
    _, loads = decode(bins, (ptr[1:] - ptr[:-1]).tolist())
    assert sorted(loads) == [6, 6, 8, 8]  # 28 steps, the longest 8: 4 bins, the short tables fill the 4s


@pytest.fixture
def binned_everywhere(monkeypatch):
    """Bin whenever tables differ (the GPU default also asks for 2 programs per SM)."""
    monkeypatch.setattr(bsmm_small, "MIN_PROGRAMS_PER_SM", 0)


def _skewed_layout(block_size):
    """Block-rows and block-cols of very different lengths, some empty."""
    mask = torch.zeros(7, 6, dtype=torch.bool)
    mask[0, :] = True
    mask[2, :2] = True
    mask[3, 4] = True
    mask[5, 1:] = True
    return BlockLayout(mask, block_size)


def _binned_against_unbinned(kind, trans, sub, block_k, dtype, device, block_size=32, m=19):
    layout = _skewed_layout(block_size) if kind == "skewed" else make_layout(kind, 7, 6, block_size)
    rows, cols = layout.shape
    torch.manual_seed(0)
    a = torch.randn(m, cols if trans else rows, device=device).to(dtype)
    values = random_values(layout, dtype, device)
    bias = torch.randn(rows if trans else cols, device=device).to(dtype)
    meta = layout.meta_on(device)
    ptr = kernels.table_views(meta, layout.block_rows, layout.block_cols, "row_ptr" if trans else "col_ptr")[0]
    if kind == "skewed":
        assert bsmm_small._bins_for(ptr, max(16, block_size) // sub) is not None  # the binned path runs
    outs = []
    for balance in (True, False):
        cfg = bsmm_small.SmallConfig(sub, block_k, 32, num_warps=4, num_stages=2, balance=balance)
        outs.append(kernels.dds(a, values, meta, bias, layout.block_rows, layout.block_cols, trans, config=cfg))
    assert torch.equal(outs[0], outs[1])
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s) + bias.double().cpu()
    assert_close(outs[0], expected, dtype, "dds binned")


@pytest.mark.parametrize("kind", ["skewed", "random", "empty_rows_cols"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("sub, block_k", [(16, 16), (32, 16)])
@INTERPRETER_MARKS[0]
@INTERPRETER_MARKS[1]
def test_binned_kernel_matches_unbinned_bitwise_and_the_reference(binned_everywhere, kind, trans, sub, block_k):
    _binned_against_unbinned(kind, trans, sub, block_k, torch.float32, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32, 64, 128], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("kind", ["skewed", "random"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_gpu_binned_kernel_matches_unbinned_bitwise(binned_everywhere, kind, trans, block_size):
    _binned_against_unbinned(kind, trans, 16, min(64, max(16, block_size)), torch.bfloat16, "cuda",
                             block_size=block_size, m=37)
