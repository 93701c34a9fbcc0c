"""The grouped warp-specialized sdd (``bsmm_ws_sdd_group``, Gluon, b 64): its config and
slot table on the CPU, and on an sm90 GPU (marked ``gpu``) forced by its config against
float64 references: groups 1-4 (the last group cut short), odd block-row counts, M not a
multiple of the slice, empty, full and partly empty layouts, fp16 and bf16, determinism,
CUDA-graph capture."""

import pytest
import torch

from bsmm_cases import (assert_sdd_falls_back_to_the_heuristic, assert_sdd_is_deterministic_and_captures,
                        assert_sdd_matches_reference, assert_sdd_refuses_the_config_off_hopper,
                        assert_tuned_entry_runs_only_from_its_density, make_layout, needs_hopper)
from tilesparse.kernels import bsmm_ws_sdd, bsmm_ws_sdd_group, tuned
from tilesparse.kernels.bsmm_ws_sdd_group import WsSddGroupConfig
from tilesparse.layout import table_views


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs,match", [
    (dict(group=3), "group"), (dict(group=8), "at most 4"), (dict(block_k=48), "block_k"),
    (dict(block_k=256), "at most 128"), (dict(stages=1), "stages"), (dict(stages=True), "stages must be an int"),
    (dict(group_m=0), "group_m"), (dict(load_regs=13), "load_regs must be a multiple of 8"),
    (dict(mma_regs=300), "mma_regs must be a multiple of 8"), (dict(overlap=1), "overlap must be a bool"),
    (dict(group=4, overlap=True), "overlap needs group <= 2"),
])
def test_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WsSddGroupConfig(**kwargs)


def test_config_shared_bytes():
    # 3 stages of two dY slices and 4 X slices [64, 64], two consumers' 4 output blocks
    assert WsSddGroupConfig(4, 64, 3).shared_bytes() == 3 * 6 * 64 * 64 * 2 + 8 * 64 * 64 * 2 + 1024


@pytest.mark.parametrize("group", [1, 2, 4])
def test_slot_table_places_every_stored_block(group):
    layout = make_layout("random", 7, 11, 64)  # odd block-rows, a short last group
    meta = layout.meta_on("cpu")
    row_of, row_cols = table_views(meta, 7, 11, "row_of", "row_cols")
    slots = bsmm_ws_sdd_group.sdd_group_slots(meta, row_of, row_cols, 7, 11, group)
    assert slots.shape == (4, -(-11 // group), 2, group) and slots.dtype == torch.int32
    seen = []
    for pair in range(slots.shape[0]):
        for q in range(slots.shape[1]):
            for w in range(2):
                for g in range(group):
                    z = int(slots[pair, q, w, g])
                    if z >= 0:
                        assert (int(row_of[z]), int(row_cols[z])) == (2 * pair + w, q * group + g)
                        seen.append(z)
    assert sorted(seen) == list(range(row_of.numel()))  # each stored block exactly once
    again = bsmm_ws_sdd_group.sdd_group_slots(meta, row_of, row_cols, 7, 11, group)
    assert again is slots  # remembered on the layout


def test_config_round_trips_through_the_tuned_table_format():
    cfg = WsSddGroupConfig(2, 32, 6, overlap=True)
    assert tuned.from_json(tuned.to_json(cfg)) == cfg


def test_a_tuned_entry_the_operands_cannot_take_falls_back(monkeypatch):
    assert_sdd_falls_back_to_the_heuristic(monkeypatch, WsSddGroupConfig(), bsmm_ws_sdd_group, "launch_sdd_ws_group")


def test_support_check_refuses_tile_indices_past_32_bits(monkeypatch):
    # the check reads shapes only: meta tensors stand in for operands, the device checks are faked
    a_t = torch.empty(64, 64 * 2, dtype=torch.bfloat16, device="meta")
    x = torch.empty(64, 64 * 4, dtype=torch.bfloat16, device="meta")
    out = torch.empty(3, 64, 64, dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(bsmm_ws_sdd, "hopper_reason", lambda t: None)
    monkeypatch.setattr(bsmm_ws_sdd, "row_major_tma_ok", lambda t: True)
    monkeypatch.setattr(bsmm_ws_sdd, "shared_memory_bytes", lambda device: 1 << 20)  # the shared check's
    assert bsmm_ws_sdd_group.ws_sdd_group_supported(a_t, x, out, WsSddGroupConfig()) is None
    assert "32 bits" in bsmm_ws_sdd_group.ws_sdd_group_supported(a_t, x, out, WsSddGroupConfig(group_m=1 << 31))


def test_sdd_refuses_the_config_off_hopper():
    assert_sdd_refuses_the_config_off_hopper(WsSddGroupConfig(), "grouped warp-specialized sdd")


# --------------------------------------------------------------------------- GPU


CONFIGS = [WsSddGroupConfig(), WsSddGroupConfig(2, 64, 4, overlap=True), WsSddGroupConfig(4, 32, 6),
           WsSddGroupConfig(1, 64, 4, overlap=True), WsSddGroupConfig(2, 64, 4)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["random", "full", "empty_rows_cols", "empty"])
def test_matches_reference_gpu(kind, dtype, cfg):
    # M: a short last slice, one slice, many
    assert_sdd_matches_reference(kind, dtype, cfg, (1000, 64, 8192 + 40), "grouped ws sdd")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_even_block_rows_and_many_tiles_per_program_gpu(kind, cfg):
    # 40 x 48 blocks: 20 pairs x 48 / G groups = 240-960 tiles over the SMs (several per
    # program: stages and output buffers reused across tiles, half-empty and empty tiles between)
    assert_sdd_matches_reference(kind, torch.bfloat16, cfg, (3000,), "grouped ws sdd", 40, 48)


@pytest.mark.gpu
@needs_hopper
def test_is_bitwise_deterministic_and_captures_gpu():
    assert_sdd_is_deterministic_and_captures(WsSddGroupConfig())


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("density, used", [(0.5, True), (0.25, False)])
def test_a_tuned_entry_runs_only_from_its_measured_density_gpu(monkeypatch, density, used):
    assert_tuned_entry_runs_only_from_its_density(monkeypatch, WsSddGroupConfig(), bsmm_ws_sdd_group,
                                                  "launch_sdd_ws_group", density, used)
