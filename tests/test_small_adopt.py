"""``scripts/measure_small_crossover.py --adopt``: a variant sweep's winner goes into the
shipped table only where it beats, in the same run, the heuristic config (a variant equal
to it, or the sweep's own ``default``), the large-batch kernel and the dispatcher's choice."""

import json

import pytest
import torch

from script_modules import load_script
from tilesparse.kernels import tuned
from tilesparse.kernels.bsmm_panel import PanelConfig


@pytest.fixture
def crossover(tmp_path, monkeypatch):
    module = load_script("scripts/measure_small_crossover.py")
    monkeypatch.setattr(module, "SHIPPED", tmp_path)
    return module


def _row(default_ms, panel_ms, large_ms=1.0, auto_ms=None, m=64):
    row = {"op": "fprop", "block": 16, "density": 0.5, "M": m, "weight_bytes": 151 << 20, "copies": 3,
           "large_ms": large_ms, "default": default_ms, "pG8m64w4st4x8": panel_ms}
    if auto_ms is not None:
        row.update(auto=auto_ms, auto_err=1e-3)
    return row


def _adopted_entries(crossover, tmp_path, row) -> dict:
    """The shipped table's entries after adopting a one-row sweep of W 12288² on the H200."""
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"gpu": "NVIDIA H200", "weight": "12288x12288", "rows": [row]}))
    crossover.adopt(sweep)
    table = tmp_path / "nvidia-h200.json"
    return json.loads(table.read_text())["entries"] if table.exists() else {}


@pytest.mark.parametrize("row, adopted", [
    (_row(0.147, 0.060), True),  # well ahead of the heuristic and the large kernel
    (_row(0.147, 0.145), False),  # within 3 % of the heuristic
    (_row(0.147, 0.060, large_ms=0.05), False),  # the large-batch kernel is faster
    (_row(0.147, 0.060, auto_ms=0.055), False),  # the dispatcher's own choice is faster
])
def test_adopt_compares_against_the_sweeps_default_variant(crossover, tmp_path, row, adopted):
    entries = _adopted_entries(crossover, tmp_path, row)
    key = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 64, 0.5)
    assert (key in entries) == adopted
    if adopted:
        assert tuned.from_json(entries[key]["config"]) == PanelConfig(8, 64, 4, 4, 8, 8)


@pytest.mark.parametrize("auto_ms, adopted", [(0.060, True), (0.0505, False)], ids=["beaten", "within-3pct"])
def test_adopt_writes_the_heuristic_where_it_beats_the_tables_entry(crossover, tmp_path, auto_ms, adopted):
    # the heuristic is the fastest variant but the dispatcher runs a tuned entry (e.g. a panel)
    # that is slower: the heuristic's config is written over it, so the dispatcher runs it
    from tilesparse.kernels import bsmm_small

    entries = _adopted_entries(crossover, tmp_path, _row(0.049, 0.070, auto_ms=auto_ms))
    key = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 64, 0.5)
    assert (key in entries) == adopted
    if adopted:
        assert tuned.from_json(entries[key]["config"]) == bsmm_small.small_config(64, 16, torch.bfloat16, 227 << 10)
        assert entries[key]["dispatched_ms"] == 0.06


@pytest.mark.parametrize("extra", [{}, {"auto": 0.060, "auto_err": 0.5}], ids=["no-auto", "auto-wrong"])
def test_adopt_writes_no_heuristic_without_a_timed_entry_to_beat(crossover, tmp_path, extra):
    # without the dispatcher's choice timed right nothing shows its entry is slower
    row = {**_row(0.049, 0.070), **extra}
    assert _adopted_entries(crossover, tmp_path, row) == {}


def test_adopt_takes_equal_configs_for_one(crossover, tmp_path):
    # "defaultS" was the heuristic with spread_index, now the heuristic itself: a few % of
    # noise between two names of one config is no win over the heuristic
    from tilesparse.kernels import bsmm_small, tuned as tuned_module

    heuristic = bsmm_small.small_config(64, 16, torch.bfloat16, 227 << 10)
    row = {**_row(0.050, 0.070), "defaultS": 0.045, "defaultS_config": tuned_module.to_json(heuristic)}
    assert _adopted_entries(crossover, tmp_path, row) == {}
    entries = _adopted_entries(crossover, tmp_path, {**row, "auto": 0.052, "auto_err": 1e-3})
    assert list(entries) == [tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 64, 0.5)]  # beats auto


def test_adopt_skips_configs_of_removed_fields(crossover, tmp_path):
    row = {**_row(0.147, 0.060), "gone": 0.030, "gone_config": {"kind": "small", "sub": 16, "block_k": 64,
                                                                  "block_m": 64, "num_warps": 4, "num_stages": 8,
                                                                  "chunk_every_run": True}}
    entries = _adopted_entries(crossover, tmp_path, row)
    key = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 64, 0.5)
    assert tuned.from_json(entries[key]["config"]) == PanelConfig(8, 64, 4, 4, 8, 8)


def test_adopt_records_a_winning_resident_variant(crossover, tmp_path):
    # the resident-activation fprop (its own config kind) is adopted like any small variant
    from tilesparse.kernels.bsmm_resident import ResidentConfig

    row = {"op": "fprop", "block": 16, "density": 0.5, "M": 32, "weight_bytes": 151 << 20, "copies": 3,
           "large_ms": 0.23, "default": 0.091, "rR12x2": 0.050, "rC6x1": 0.045, "auto": 0.091, "auto_err": 1e-3}
    entries = _adopted_entries(crossover, tmp_path, row)
    key = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 32, 0.5)
    # the column-major variant's fields travel with it
    assert tuned.from_json(entries[key]["config"]) == ResidentConfig(rows=6, splits=1, chunk=16, w_stages=2,
                                                                     columns=True, box=8)
