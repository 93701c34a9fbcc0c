"""The small-batch kernel's L2 prefetch hints (``SmallConfig.l2_ahead``) on the CPU: the
field is checked, off by default, and switched off where the hint cannot run (the
interpreter, CPU tensors), so interpreted launches with it give the reference. That the
hints change no bit on a GPU is tested in ``test_bsmm_kernels_gpu.py``; that they compile
for sm_90, in ``scripts/sm90_compile_check.py``."""

import pytest
import torch

from bsmm_cases import dense_of, make_layout, random_values
from tilesparse.kernels import _l2_prefetch
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tolerances import assert_close


def test_l2_ahead_is_checked_and_off_by_default():
    assert bsmm_small.small_config(1, 64, torch.bfloat16).l2_ahead == 0
    for bad in (-1, bsmm_small.MAX_L2_AHEAD + 1, 2.0, True):
        with pytest.raises(ValueError, match="l2_ahead"):
            bsmm_small.SmallConfig(32, 32, 16, 4, 2, l2_ahead=bad)
    assert bsmm_small.SmallConfig(32, 32, 16, 4, 2, l2_ahead=bsmm_small.MAX_L2_AHEAD).l2_ahead == 256


def test_panel_l2_ahead_is_checked_and_off_by_default():
    from tilesparse.kernels import bsmm_panel

    assert bsmm_panel.PanelConfig(8).l2_ahead == 0
    for bad in (3, -2, True, 1.0, 1024):
        with pytest.raises(ValueError, match="l2_ahead"):
            bsmm_panel.PanelConfig(8, l2_ahead=bad)
    assert bsmm_panel.PanelConfig(8, l2_ahead=16).l2_ahead == 16


def test_l2_prefetch_is_off_for_cpu_tensors():
    assert not _l2_prefetch.l2_prefetch_on(torch.zeros(1))


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("block_size, sub, block_k", [(32, 32, 32), (16, 16, 64), (64, 32, 32)])
@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_interpreted_launch_with_l2_ahead_matches_the_reference(kind, block_size, sub, block_k, trans):
    layout = make_layout(kind, 3, 4, block_size)
    rows, cols = layout.shape
    a = torch.randn(5, cols if trans else rows)
    values = random_values(layout, torch.float32)
    config = bsmm_small.SmallConfig(sub, block_k, 16, 4, 2, l2_ahead=4)
    out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    assert_close(out, a.double() @ (s.t() if trans else s), torch.float32, "dds l2_ahead")

