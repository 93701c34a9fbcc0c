"""The small-batch kernel's in-kernel chunks (``SmallConfig.chunks``) with
``chunk_every_run``: every run longer than the mean / chunks is cut, so a layout whose runs
are all equal (which plain chunks leave whole) runs as several programs per output slice,
their partials summed in chunk order by the last to finish. Against float64 references
under the Triton interpreter, and the counters left at zero for the next call."""

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, LAYOUT_KINDS, dense_of, make_layout, random_values
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tilesparse.kernels._alloc import arrival_counters
from tolerances import assert_close

pytestmark = INTERPRETER_MARKS


def _run(layout, m, trans, config, dtype=torch.float32):
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows).to(dtype)
    values = random_values(layout, dtype)
    out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    assert_close(out, a.double() @ (s.t() if trans else s), dtype, f"dds {config}")
    return out


@pytest.mark.parametrize("chunks", [2, 3, 5])
@pytest.mark.parametrize("block_size, block_k", [(16, 64), (32, 32), (64, 16)], ids=["b16-k64", "b32", "b64-k16"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
def test_chunk_every_run_matches_the_reference(kind, trans, block_size, block_k, chunks):
    layout = make_layout(kind, 3, 7, block_size)
    config = bsmm_small.SmallConfig(16, block_k, 16, 4, 2, chunks=chunks, chunk_every_run=True)
    _run(layout, 9, trans, config)


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
def test_equal_runs_are_cut_and_the_counters_reset(monkeypatch, prefetch):
    # every block-row holds 6 blocks: plain chunks cut none (no run is longer than the mean,
    # the chunk length the kernel is given); with chunk_every_run each is cut in three
    # (chunk length 2), so the last-arriver sum runs for every slice
    chunk_lens = []
    real_launch = bsmm_small.launch

    def spy(kernel, grid, *args, **kwargs):
        chunk_lens.append(args[12])  # the kernel's chunk_len argument
        return real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(bsmm_small, "launch", spy)
    layout = BlockLayout(torch.ones(4, 6, dtype=torch.bool), 16)
    plain = bsmm_small.SmallConfig(16, 32, 16, 4, 2, chunks=3, prefetch=prefetch)
    _run(layout, 5, True, plain)
    config = bsmm_small.SmallConfig(16, 32, 16, 4, 2, chunks=3, chunk_every_run=True, prefetch=prefetch)
    first = _run(layout, 5, True, config)
    assert chunk_lens == [6, 2]
    counters = arrival_counters(torch.device("cpu"), 4)
    assert torch.count_nonzero(counters) == 0
    x = torch.randn(5, layout.shape[1])
    values = random_values(layout, torch.float32)
    call = [layout.meta, None, layout.block_rows, layout.block_cols, True]
    again = kernels.dds(x, values, *call, config=config)
    assert torch.equal(again, kernels.dds(x, values, *call, config=config))  # deterministic
    assert first.shape == again.shape
