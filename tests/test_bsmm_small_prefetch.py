"""The small-batch kernel's prefetch mode (``SmallConfig.prefetch``: each step's block
index loaded two steps ahead and its activation tile one step ahead) against float64
references under the Triton interpreter: steps within a block (2 and 4 per block: b 64 /
128 at 32-deep, b 48 on a 64-wide tile at 16-deep) and over several blocks (b 16, 8 and 24,
4 or 8 blocks a step), runs of zero to five blocks (the prefetches
past a run's end are masked), splits, chunks, the swapped orientation and row tiles
inner, both table directions, every layout class; every pair of these knobs at least
once (``bsmm_cases.pairwise``), not their full product."""

import pytest
import torch

from bsmm_cases import (INTERPRETER_MARKS, LAYOUT_KINDS, TRANS_CASES, dense_of, make_layout, pairwise,
                        random_values)
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tolerances import assert_close

pytestmark = INTERPRETER_MARKS


def _check(layout, m, trans, config, dtype=torch.float32):
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows).to(dtype)
    values = random_values(layout, dtype)
    bias = torch.randn(rows if trans else cols).to(dtype)
    out = kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    assert_close(out, a.double() @ (s.t() if trans else s) + bias.double(), dtype, f"dds {config}")


@pytest.mark.parametrize("kind, trans, tile, extra", pairwise(
    [(kind, kind) for kind in LAYOUT_KINDS], TRANS_CASES,
    [("b64-k32", (64, 32, 32)), ("b16-k64", (16, 16, 64)), ("b8-k64", (8, 16, 64)), ("b32-k32", (32, 32, 32)),
     ("b128-k32", (128, 32, 32)), ("b48-k16", (48, 16, 16)), ("b24-k64", (24, 16, 64))],
    [("whole", {}), ("splits3", {"splits": 3}), ("chunks2", {"chunks": 2}), ("swap", {"swap": True}),
     ("m_inner", {"m_inner": True})]))
def test_prefetch_matches_the_reference(kind, trans, tile, extra):
    block_size, sub, block_k = tile
    layout = make_layout(kind, 3, 5, block_size)
    block_m = 16 if extra.get("m_inner") else 64  # m_inner: 3 row tiles of 40 rows
    config = bsmm_small.SmallConfig(sub, block_k, block_m, num_warps=4, num_stages=2, prefetch=True, **extra)
    _check(layout, 40, trans, config, torch.float16 if kind == "random" else torch.float32)


@pytest.mark.parametrize("run", [1, 2, 3, 5], ids=lambda n: f"run{n}")
@pytest.mark.parametrize("block_size, block_k", [(16, 64), (16, 128), (32, 32), (64, 32), (64, 16)],
                         ids=["b16-k64", "b16-k128", "b32", "b64-k32", "b64-k16"])
def test_prefetch_runs_of_few_steps(block_size, block_k, run):
    # block-row 0 holds `run` blocks, row 1 none, row 2 one: the loop runs 0 to a few steps
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, :run] = True
    mask[2, 5] = True
    layout = BlockLayout(mask, block_size)
    for trans in (True, False):
        _check(layout, 5, trans, bsmm_small.SmallConfig(16, block_k, 16, 4, 2, prefetch=True))


def test_prefetch_is_checked_and_off_by_default():
    assert not bsmm_small.small_config(1, 16, torch.bfloat16).prefetch
    with pytest.raises(ValueError, match="prefetch"):
        bsmm_small.SmallConfig(16, 16, 16, 4, 2, prefetch=1)


@pytest.mark.parametrize("kind, trans, tile, extra, prefetch", pairwise(
    [(kind, kind) for kind in LAYOUT_KINDS], TRANS_CASES,
    [("b16-k128", (16, 128)), ("b24-k64", (24, 64)), ("b64-k32", (64, 32))],
    [("whole", {}), ("chunks2", {"chunks": 2}), ("swap", {"swap": True})],
    [("plain", False), ("prefetch", True)]))
def test_spread_index_matches_the_reference_and_the_per_lane_loads(kind, trans, tile, extra, prefetch):
    block_size, block_k = tile
    # SmallConfig.spread_index: a multi-block step's indices (and slots) loaded once per block
    # and spread over its lanes; the same products in the same order as one load per lane, so
    # bitwise the same result (b 64 at 32-deep steps: one-block steps, where it is ignored)
    layout = make_layout(kind, 3, 5, block_size)
    per_lane = bsmm_small.SmallConfig(16, block_k, 64, num_warps=4, num_stages=2, prefetch=prefetch,
                                      spread_index=False, **extra)
    spread = bsmm_small.SmallConfig(16, block_k, 64, num_warps=4, num_stages=2, prefetch=prefetch, **extra)
    rows, cols = layout.shape
    a = torch.randn(40, cols if trans else rows)
    values = random_values(layout, torch.float32)
    bias = torch.randn(rows if trans else cols)
    call = [layout.meta, bias, layout.block_rows, layout.block_cols, trans]
    out = kernels.dds(a, values, *call, config=spread)
    assert torch.equal(out, kernels.dds(a, values, *call, config=per_lane))
    s = dense_of(values, layout)
    assert_close(out, a.double() @ (s.t() if trans else s) + bias.double(), torch.float32, f"dds {spread}")


def test_spread_index_is_checked_and_on_by_default():
    assert bsmm_small.small_config(8, 16, torch.bfloat16).spread_index
    with pytest.raises(ValueError, match="spread_index"):
        bsmm_small.SmallConfig(16, 64, 16, 4, 2, spread_index=1)
