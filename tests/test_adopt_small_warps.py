"""``scripts/adopt_small_warps.py``: a shipped small-kernel entry takes 1 / 2 warps only where the
sweep timed that very entry at those warps (row-major, same run) faster than the entry by more than
the margin; K-major rows, other kinds and unmeasured entries stay as they are."""

import copy

import pytest
import torch

from script_modules import load_script
from tilesparse.kernels import tuned
from tilesparse.kernels.bsmm_small import SmallConfig

GPU = "nvidia-h200"
ENTRY_CFG = SmallConfig(32, 64, 16, 4, 8)


@pytest.fixture(scope="module")
def adopt():
    return load_script("scripts/adopt_small_warps.py").adopt


def _entries():
    key = tuned.key(GPU, "fprop", torch.bfloat16, 32, 16, 0.1)
    return key, {key: {"config": tuned.to_json(ENTRY_CFG), "small_ms": 0.0133, "source": "small-crossover"},
                 "other": {"config": {"kind": "panel"}}}


def _row(auto_ms, w1_ms, w2_ms, cfg=ENTRY_CFG, m=16, density=0.1):
    row = {"op": "fprop", "block": 32, "density": density, "M": m, "auto": auto_ms}
    for warps, ms in ((1, w1_ms), (2, w2_ms)):
        row[f"autoW{warps}"] = ms
        row[f"autoW{warps}_config"] = tuned.to_json(SmallConfig(cfg.sub, cfg.block_k, cfg.block_m, warps,
                                                                cfg.num_stages))
    return row


def test_the_fastest_warps_past_the_margin_are_adopted(adopt):
    key, entries = _entries()
    lines = adopt([_row(0.0133, 0.0124, 0.0121)], "12288x12288", entries, "warps44", 0.03, GPU)
    assert entries[key]["config"]["num_warps"] == 2 and entries[key]["small_ms"] == 0.0121
    assert entries[key]["source"] == "small-crossover+warps44" and len(lines) == 1
    assert tuned.from_json(entries[key]["config"]) == SmallConfig(32, 64, 16, 2, 8)
    adopted = copy.deepcopy(entries)  # the same sweep again: the entry already runs those warps
    assert adopt([_row(0.0133, 0.0124, 0.0121)], "12288x12288", entries, "warps44", 0.03, GPU) == []
    assert entries == adopted


@pytest.mark.parametrize("row", [
    _row(0.0133, 0.0131, 0.0130),  # within the margin: noise
    _row(0.0133, 0.0100, 0.0100, cfg=SmallConfig(16, 64, 16, 4, 8)),  # the dispatcher ran another config
    _row(0.0133, 0.0100, 0.0100, m=64),  # a row-count bucket without an entry
    dict(_row(0.0133, 0.0100, 0.0100), auto_kmajor=True),  # auto ran K-major: another config than the entry's
])
def test_rows_that_do_not_measure_the_entry_change_nothing(adopt, row):
    key, entries = _entries()
    before = copy.deepcopy(entries)
    assert adopt([row], "12288x12288", entries, "warps44", 0.03, GPU) == []
    assert entries == before


def test_sweeps_without_the_k_major_flag_skip_the_points_the_k_major_table_covers(adopt, monkeypatch):
    key, entries = _entries()
    from tilesparse.kernels import bsmm_kmajor
    monkeypatch.setitem(bsmm_kmajor.KMAJOR_WINS, ("fprop", 32), {16: (0.05, 0.2)})
    assert adopt([_row(0.0133, 0.0100, 0.0100)], "12288x12288", entries, "warps44", 0.03, GPU) == []
    monkeypatch.setitem(bsmm_kmajor.KMAJOR_WINS, ("fprop", 32), {})
    assert len(adopt([_row(0.0133, 0.0100, 0.0100)], "12288x12288", entries, "warps44", 0.03, GPU)) == 1
