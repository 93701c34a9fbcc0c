"""``kernels._tiles.split_runs`` / ``sum_partials``: how the sdd kernels (one-block and
grouped) cut their M reduction into runs and sum the runs' fp32 partial products."""

import pytest
import torch

from tilesparse.kernels._tiles import split_runs, sum_partials


@pytest.mark.parametrize("m, splits, block_m, expected", [
    (150, 3, 32, (3, 64)),  # runs of whole steps: 64, 64, 22
    (45, 4, 32, (2, 32)),  # no more runs than M has steps
    (300, 4, 64, (3, 128)),  # 4 asked, but runs of 128 cover 300 in 3: no empty run
    (100, 1, 64, (1, 128)),
    (0, 3, 32, (1, 32)),  # an empty reduction still has one run
])
def test_split_runs(m, splits, block_m, expected):
    runs, run = split_runs(m, splits, block_m)
    assert (runs, run) == expected
    assert run % block_m == 0 and (runs - 1) * run < max(m, 1) <= runs * run  # every run holds part of M


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_partials_in_run_order(dtype):
    partials = torch.randn(3, 5, 4, 4)
    out = torch.full((5, 4, 4), float("nan"), dtype=dtype)
    sum_partials(partials, out)
    assert torch.equal(out, partials.sum(dim=0).to(dtype))
