"""The grouped sdd (kernels/bsmm_sdd_group.py): several blocks of a block-row per program.

Against float64 references sampled on the layout (``layout.gather`` of the dense
product), under the interpreter on CPU (fp32, fp16: the interpreter's bf16 dot is wrong)
and on CUDA (marked), across block sizes, group sizes, both orientations, odd M and
every layout class; plus the group-start table, determinism and bad configs.
"""

from __future__ import annotations

import functools

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, LAYOUT_KINDS, assert_sdd_falls_back_to_the_heuristic, make_layout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import tuned
from tilesparse.kernels.bsmm_sdd_group import SddGroupConfig, group_starts
from tolerances import assert_close


def _interpreter(test):
    return functools.reduce(lambda t, mark: mark(t), INTERPRETER_MARKS, test)


def _run(kind, block_size, group, swap, m, dtype, device, block_m=32, splits=1):
    layout = make_layout(kind, 5, 7, block_size)
    rows, cols = layout.shape
    dy = torch.randn(m, rows, device=device).to(dtype)
    x = torch.randn(m, cols, device=device).to(dtype)
    meta = layout.meta_on(device)
    cfg = SddGroupConfig(group, block_m, swap=swap, splits=splits)
    got = kernels.sdd(dy.t(), x, meta, block_size, layout.block_rows, layout.block_cols, config=cfg)
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    return got, expected


@pytest.mark.parametrize("swap", [False, True], ids=["panel-n", "panel-m"])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@_interpreter
def test_grouped_sdd_matches_reference_interpreter(dtype, kind, block_size, group, swap):
    got, expected = _run(kind, block_size, group, swap, 45, dtype, "cpu")
    assert got.shape == expected.shape
    if expected.numel():
        assert_close(got, expected, dtype, f"grouped sdd b{block_size} G{group}")


@pytest.mark.parametrize("m, splits", [(150, 3), (45, 4), (200, 2)])  # 3 runs of 64; capped at 2 steps; 2 of 128
@pytest.mark.parametrize("swap", [False, True], ids=["panel-n", "panel-m"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@_interpreter
def test_grouped_sdd_with_m_splits_matches_reference_interpreter(dtype, kind, block_size, swap, m, splits):
    got, expected = _run(kind, block_size, 4, swap, m, dtype, "cpu", splits=splits)
    assert got.shape == expected.shape and got.dtype == dtype
    if expected.numel():
        assert_close(got, expected, dtype, f"grouped sdd b{block_size} G4 with {splits} M splits")


@pytest.mark.parametrize("splits", [1, 3])
@_interpreter
def test_grouped_sdd_is_bitwise_deterministic_interpreter(splits):
    layout = make_layout("random", 6, 6, 16)
    dy, x = torch.randn(170, 96), torch.randn(170, 96)
    meta = layout.meta_on("cpu")
    cfg = SddGroupConfig(4, 32, splits=splits)
    runs = [kernels.sdd(dy.t(), x, meta, 16, 6, 6, config=cfg) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_group_starts_lists_each_rows_groups_first():
    layout = make_layout("empty_rows_cols", 9, 11, 16)
    counts = layout.mask.sum(dim=1).tolist()
    expected, entry = [], 0
    for n in counts:  # storage order is row-major: a row's blocks are consecutive entries
        expected += list(range(entry, entry + n, 3))
        entry += n
    starts = group_starts(layout.meta_on("cpu"), 9, 11, 3)
    assert starts.dtype == torch.int32
    assert starts.numel() >= len(expected)
    assert starts[:len(expected)].tolist() == expected
    assert set(starts[len(expected):].tolist()).isdisjoint(expected)  # padding: entries that start nothing


def test_group_starts_are_kept_per_grid_and_group_and_check_the_group():
    layout = make_layout("random", 4, 4, 16)
    meta = layout.meta_on("cpu")
    assert group_starts(meta, 4, 4, 2) is group_starts(meta, 4, 4, 2)
    assert group_starts(meta, 4, 4, 4) is not group_starts(meta, 4, 4, 2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="group must be a positive int"):
            group_starts(meta, 4, 4, bad)


def test_dds_refuses_an_sdd_config():
    layout = make_layout("random", 4, 4, 16)
    a = torch.randn(8, 64)
    values = torch.randn(layout.nnz, 16, 16)
    with pytest.raises(ValueError, match="an sdd .updat. config"):
        kernels.dds(a, values, layout.meta_on("cpu"), None, 4, 4, True, config=SddGroupConfig(2))


def test_sdd_group_config_checks_its_fields():
    with pytest.raises(ValueError, match="group"):
        SddGroupConfig(3)
    with pytest.raises(ValueError, match="block_m"):
        SddGroupConfig(2, block_m=48)
    with pytest.raises(ValueError, match="num_warps"):
        SddGroupConfig(2, num_warps=3)
    with pytest.raises(ValueError, match="swap"):
        SddGroupConfig(2, swap=1)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="splits must be a positive int"):
            SddGroupConfig(2, splits=bad)
    with pytest.raises(ValueError, match="exceeds 256 columns"):
        SddGroupConfig(8).check_block(64)
    SddGroupConfig(4).check_block(64)


def test_sdd_group_config_checks_shared_memory_by_input_size():
    """fp32 b 128 G 2 at 3 stages asked sm_90 for 256 KiB (refused on the H200); 16-bit fits."""
    assert SddGroupConfig(2, 64, 8, 3).smem_bytes(128, 4) == 262144  # what sm_90's compile reported
    cfg = SddGroupConfig(2, 64, 8, 3)
    assert cfg.fits(128, 2) and not cfg.fits(128, 4)
    cfg.check_block(128, 2)
    with pytest.raises(ValueError, match="shared memory at block size 128 with 4-byte inputs"):
        cfg.check_block(128, 4)
    assert SddGroupConfig(2, 32, 8, 3).fits(128, 4)  # a shorter M step fits
    assert SddGroupConfig(4, 64, 4, 3).fits(64, 4)  # compiled and passed on the H200
    assert SddGroupConfig(2, 64, 4, 4).fits(128, 2)  # ran on the H200 (the sweep's grp-b64-g2w4 at b 128)
    assert not cfg.fits(128, 2, limit=99 * 1024)  # a GPU with less shared memory


def test_sdd_falls_back_from_a_tuned_group_too_big_for_fp32(monkeypatch):
    """A tuned 16-bit entry must not make fp32 updat fail: sdd uses its heuristic instead."""
    assert_sdd_falls_back_to_the_heuristic(monkeypatch, SddGroupConfig(2, 64, 8, 3), kernels.bsmm_sdd_group,
                                           "launch_sdd_group")


def test_sdd_group_config_round_trips_through_the_tuned_table_format():
    for cfg in (SddGroupConfig(4, 64, 8, 3, swap=True), SddGroupConfig(16, 32, 8, 3, swap=True, splits=4)):
        assert tuned.from_json(tuned.to_json(cfg)) == cfg
    # entries written before splits existed read as one split
    assert tuned.from_json({"kind": "sdd_group", "group": 4, "block_m": 64, "num_warps": 4, "num_stages": 3,
                            "swap": True}).splits == 1


@pytest.mark.gpu
@pytest.mark.parametrize("swap", [False, True], ids=["panel-n", "panel-m"])
@pytest.mark.parametrize("block_size, group", [(16, 8), (16, 16), (32, 4), (32, 8), (64, 2), (64, 4), (128, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_grouped_sdd_matches_reference_gpu(dtype, block_size, group, swap):
    for kind in ("random", "empty_rows_cols", "full"):
        block_m = 64 if SddGroupConfig(group, 64).fits(block_size, dtype.itemsize) else 32
        got, expected = _run(kind, block_size, group, swap, 1000, dtype, "cuda", block_m=block_m)
        assert_close(got, expected, dtype, f"grouped sdd {kind} b{block_size} G{group}")
        got, expected = _run(kind, block_size, group, swap, 1000, dtype, "cuda", block_m=block_m, splits=4)
        assert_close(got, expected, dtype, f"grouped sdd {kind} b{block_size} G{group} 4 splits")
