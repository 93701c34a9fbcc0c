"""The panel dds (``tilesparse.kernels.bsmm_panel``) under the Triton interpreter, against
float64 dense references: small blocks, several output block-columns per program (a
panel of G blocks, zeros where absent). Groups that do not divide the output block count
leave a partial last group; every layout class; both directions; bias; deep steps, the
swapped orientation, splits (summed after the kernel or in it), refusals and fallback.
fp32 and fp16 only (see test_bsmm_interpreter.py for why not bf16)."""

import dataclasses

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, LAYOUT_KINDS, check_dds, dds_expected, dds_inputs, make_layout, run_dds
from tilesparse import BlockLayout
from tilesparse.kernels import _alloc
from tolerances import assert_close

pytestmark = INTERPRETER_MARKS


@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")  # 3: runs of unequal and empty length
@pytest.mark.parametrize("group", [2, 4])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
def test_dds_panel_kernel(layout_kind, trans, group, splits):
    from tilesparse.kernels import bsmm_panel

    layout = make_layout(layout_kind, 5, 3, 16)  # 5 block-rows: partial groups either way
    a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
    check_dds(layout, a, values, bias, trans, torch.float32, bsmm_panel.PanelConfig(group, block_m=32, splits=splits))


@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("entries,swap", [(2, False), (1, True), (4, True)], ids=["e2", "e1swap", "e4swap"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
def test_dds_panel_kernel_deep_steps_and_swap(layout_kind, trans, entries, swap, splits):
    # several union entries per step (a partial last step: 3 columns are not a multiple of
    # 2 or 4) and the features as the MMA's M side, against float64
    from tilesparse.kernels import bsmm_panel

    layout = make_layout(layout_kind, 5, 3, 16)
    a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
    cfg = bsmm_panel.PanelConfig(4, block_m=16, splits=splits, entries=entries, swap=swap)
    check_dds(layout, a, values, bias, trans, torch.float32, cfg)


@pytest.mark.parametrize("cfg, pattern", [
    (lambda P: P(32), "panels of 512 columns"),
    (lambda P: P(2, entries=32), "reduction steps 512 deep"),
], ids=["too-wide", "too-deep"])
def test_panel_kernel_refuses_tiles_past_256_by_name(cfg, pattern):
    from tilesparse.kernels import bsmm_panel

    layout = make_layout("random", 2, 2, 16)
    a, values, _ = dds_inputs(layout, 4, torch.float32, True, False)
    with pytest.raises(ValueError, match=pattern):
        run_dds(layout, a, values, None, True, cfg(bsmm_panel.PanelConfig))


@pytest.mark.parametrize("kwargs, field", [({"entries": 3}, "entries"), ({"swap": 1}, "swap"),
                                           ({"splits": 0}, "splits")])
def test_panel_config_validates_its_fields(kwargs, field):
    from tilesparse.kernels import bsmm_panel

    with pytest.raises(ValueError, match=field):
        bsmm_panel.PanelConfig(2, **kwargs)


def test_a_tuned_panel_entry_the_kernel_refuses_runs_another_kernel(monkeypatch):
    # a tuned entry is the dispatcher's choice, not the caller's: a refusal falls back
    from tilesparse.kernels import bsmm_panel, tuned

    monkeypatch.setattr(tuned, "lookup", lambda *args, **kwargs: bsmm_panel.PanelConfig(2, entries=32, swap=True))
    launched = []
    monkeypatch.setattr(bsmm_panel, "launch_dds_panel", lambda *args: launched.append(args))
    layout = make_layout("random", 3, 4, 16)
    a, values, bias = dds_inputs(layout, 9, torch.float32, True, True)
    check_dds(layout, a, values, bias, True, torch.float32, None)
    assert launched == []


@pytest.mark.parametrize("swap", [True, False], ids=["swap", "rows-as-M"])
@pytest.mark.parametrize("splits", [2, 5], ids=lambda s: f"splits{s}")  # 5: some splits empty
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
def test_dds_panel_fused_split_sum(layout_kind, trans, splits, swap):
    # the last split of each tile sums the partials in split order and writes C (with the
    # bias); the counters are left zero, and a second call gives the same bits
    from tilesparse.kernels import bsmm_panel

    layout = make_layout(layout_kind, 5, 3, 16)
    a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
    cfg = bsmm_panel.PanelConfig(4, block_m=16, splits=splits, entries=2, swap=swap, fused_sum=True)
    first = run_dds(layout, a, values, bias, trans, cfg)
    assert_close(first, dds_expected(layout, a, values, bias, trans), torch.float32, "dds panel, fused split sum")
    assert int(_alloc.arrival_counters(a.device, 8).abs().sum()) == 0
    assert torch.equal(first, run_dds(layout, a, values, bias, trans, cfg))
    unfused = run_dds(layout, a, values, bias, trans, dataclasses.replace(cfg, fused_sum=False))
    assert torch.equal(first, unfused)  # the same fixed-order fp32 sum


def test_panel_tables_list_the_union_of_each_group():
    from tilesparse.kernels import bsmm_panel

    mask = torch.tensor([[1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    layout = BlockLayout(mask, 16)
    pptr, pk, pslots = bsmm_panel.panel_tables(layout.meta, 3, 4, True, 2)
    # group 0 = block-rows 0, 1: union of columns {0, 3} and {2, 3}; storage slots are
    # row-major: (0,0)=0, (0,3)=1, (1,2)=2, (1,3)=3. group 1 = row 2 (+ padding): empty.
    assert pptr.tolist() == [0, 3, 3]
    assert pk.tolist() == [0, 2, 3]
    assert pslots.tolist() == [[0, -1], [-1, 2], [1, 3]]
    pptr, pk, pslots = bsmm_panel.panel_tables(layout.meta, 3, 4, False, 2)  # columns grouped
    # group 0 = block-cols 0, 1: rows {0}; group 1 = cols 2, 3: rows {1} u {0, 1}
    assert pptr.tolist() == [0, 1, 3]
    assert pk.tolist() == [0, 0, 1]
    assert pslots.tolist() == [[0, -1], [-1, 1], [2, 3]]


def test_panel_kernel_rejects_unsupported_blocks():
    from tilesparse.kernels import bsmm_panel

    layout = make_layout("random", 2, 2, 8)
    a, values, _ = dds_inputs(layout, 4, torch.float32, True, False)
    with pytest.raises(ValueError, match="power-of-two block size >= 16"):
        run_dds(layout, a, values, None, True, bsmm_panel.PanelConfig(2, block_m=16))


def test_dds_panel_kernel_b32_fp16():
    from tilesparse.kernels import bsmm_panel

    layout = make_layout("random", 3, 4, 32)
    for trans in (True, False):
        a, values, bias = dds_inputs(layout, 20, torch.float16, trans, True)
        check_dds(layout, a, values, bias, trans, torch.float16, bsmm_panel.PanelConfig(2, block_m=16))
