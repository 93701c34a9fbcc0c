"""The row-run warp-specialized sdd (``bsmm_ws_sdd_rows``, Gluon, b 64): its config and
unit count on the CPU, a model of its unit mapping against the layout's CSR tables, and on
an sm90 GPU (marked ``gpu``) forced by its config against float64 references: groups 1-4,
the dY tile from shared memory or registers, overlap, rows whose last run is short, M not
a multiple of the slice, empty, full and partly empty layouts, fp16 and bf16, many units
per program, determinism and CUDA-graph capture."""

import pytest
import torch

from bsmm_cases import (assert_sdd_falls_back_to_the_heuristic, assert_sdd_is_deterministic_and_captures,
                        assert_sdd_matches_reference, assert_sdd_refuses_the_config_off_hopper,
                        assert_tuned_entry_runs_only_from_its_density, make_layout, needs_hopper)
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_ws_sdd_rows, tuned
from tilesparse.kernels.bsmm_ws_sdd_rows import WsSddRowsConfig, unit_count, unit_table
from tilesparse.layout import table_views
from tolerances import assert_close


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs,match", [
    (dict(group=3), "group"), (dict(group=8), "at most 4"), (dict(block_k=48), "block_k"),
    (dict(block_k=256), "at most 128"), (dict(stages=1), "stages"), (dict(stages=True), "stages must be an int"),
    (dict(load_regs=13), "load_regs must be a multiple of 8"), (dict(mma_regs=300), "mma_regs must be a multiple"),
    (dict(overlap=1), "overlap must be a bool"), (dict(a_from_registers=0), "a_from_registers must be a bool"),
    (dict(group=4, overlap=True), "overlap needs group <= 2"),
    (dict(group=2, overlap=True, a_from_registers=True), "overlap needs"),
])
def test_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WsSddRowsConfig(**kwargs)


def test_config_sizes():
    cfg = WsSddRowsConfig(4, 32, 4)
    assert cfg.unit == 8
    # 4 stages of one dY slice and 8 X slices [32, 64], 8 output blocks [64, 64]
    assert cfg.shared_bytes() == 4 * 9 * 32 * 64 * 2 + 8 * 64 * 64 * 2 + 1024
    # 7 rows x 2 runs of 8, or fewer when the blocks are few (ceil(nnz / 8) + 7); at least 1
    assert unit_count(7, 11, 77, cfg) == (2, 14) and unit_count(7, 11, 20, cfg) == (2, 10)
    assert unit_count(3, 0, 0, cfg) == (1, 3) and unit_count(0, 5, 0, cfg) == (1, 1)


def _units(kind: str, group: int, block_rows: int = 9, block_cols: int = 21):
    cfg = WsSddRowsConfig(group)
    layout = make_layout(kind, block_rows, block_cols, 64)
    meta = layout.meta_on("cpu")
    row_ptr, row_cols = table_views(meta, block_rows, block_cols, "row_ptr", "row_cols")
    nnz = int(layout.mask.sum())
    table = unit_table(meta, row_ptr, block_rows, block_cols, nnz, cfg)
    units = []  # the kernel's _unit, in Python: (row, first slot, block count)
    for r, lo in table.tolist():
        units.append((r, lo, min(max(int(row_ptr[r + 1]) - lo, 0), cfg.unit)))
    return cfg, layout, row_cols, nnz, units


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("kind", ["random", "full", "empty_rows_cols", "empty"])
def test_units_cover_every_stored_block_once(kind, group):
    # consumer w of a unit takes its entries w*G .. w*G + G - 1
    cfg, layout, row_cols, nnz, units = _units(kind, group)
    assert len(units) == unit_count(9, 21, nnz, cfg)[1]
    seen = []
    for r, lo, n in units:
        for w in range(2):
            mine = min(max(n - w * group, 0), group)
            seen += [lo + w * group + g for g in range(mine)]
            assert all(layout.mask[r, int(row_cols[lo + w * group + g])] for g in range(mine))
    assert sorted(seen) == list(range(nnz))


@pytest.mark.parametrize("group", [1, 2, 4])
def test_units_come_full_first_then_longest_then_empty(group):
    # equal work in the first waves of the round-robin, the shorter units after, longest first
    cfg, _, _, _, units = _units("random", group, 23, 37)
    counts = [n for _, _, n in units]
    full = [i for i, n in enumerate(counts) if n == cfg.unit]
    assert full == list(range(len(full)))
    assert [units[i][0] for i in full] == sorted(units[i][0] for i in full)  # row by row
    rest = counts[len(full):]
    assert rest == sorted(rest, reverse=True)
    partial = units[len(full):len(full) + sum(1 for n in rest if n)]
    for (r1, _, n1), (r2, _, n2) in zip(partial, partial[1:]):
        assert n1 > n2 or (n1 == n2 and r1 < r2)


def test_the_unit_table_is_built_without_host_copies_or_syncs():
    # it may be built during a CUDA-graph capture, where a copy from the host or a sync
    # breaks the capture. On a CUDA tensor a Python scalar set into one element is a copy_
    # from a host tensor (a slice takes fill_); item / nonzero read back to the host
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    row_ptr = torch.tensor([0, 3, 11, 11, 20, 27, 30, 40], dtype=torch.int32)
    with Record():
        table = unit_table(torch.empty(1), row_ptr, 7, 11, 40, WsSddRowsConfig(2))
    assert table.shape == (unit_count(7, 11, 40, WsSddRowsConfig(2))[1], 2)
    assert "index_put_" in seen  # the record saw the build
    assert not seen & {"copy_", "_local_scalar_dense", "nonzero", "item"}


def test_config_round_trips_through_the_tuned_table_format():
    cfg = WsSddRowsConfig(2, 64, 3, overlap=True)
    assert tuned.from_json(tuned.to_json(cfg)) == cfg


def test_a_tuned_entry_the_operands_cannot_take_falls_back(monkeypatch):
    assert_sdd_falls_back_to_the_heuristic(monkeypatch, WsSddRowsConfig(), bsmm_ws_sdd_rows, "launch_sdd_ws_rows")


def test_operand_checks_name_what_is_wrong(monkeypatch):
    # the warp-specialized sdd kernels' shared checks, with the device check faked
    from tilesparse.kernels import bsmm_ws_sdd

    monkeypatch.setattr(bsmm_ws_sdd, "hopper_reason", lambda t: None)
    a_t, x = torch.randn(64, 128).to(torch.bfloat16), torch.randn(64, 192).to(torch.bfloat16)
    out = torch.empty(3, 64, 64, dtype=torch.bfloat16)
    assert bsmm_ws_sdd.operand_reason(a_t, x, out, (64,)) is None
    assert "block size of 64 or 128, got 32" in bsmm_ws_sdd.operand_reason(a_t, x, out[:, :32, :32], (64, 128))
    assert "one dtype" in bsmm_ws_sdd.operand_reason(a_t, x.half(), out, (64,))
    assert "B with M leading" in bsmm_ws_sdd.operand_reason(a_t, x.t().contiguous().t(), out, (64,))
    assert bsmm_ws_sdd_rows.ws_sdd_rows_supported(a_t, x, out[:, :32, :32], WsSddRowsConfig()).startswith(
        "needs a block size of 64")


def test_sdd_refuses_the_config_off_hopper():
    assert_sdd_refuses_the_config_off_hopper(WsSddRowsConfig(), "row-run warp-specialized sdd")


# --------------------------------------------------------------------------- GPU

CONFIGS = [WsSddRowsConfig(), WsSddRowsConfig(4, 32, 4, a_from_registers=True), WsSddRowsConfig(4, 64, 2),
           WsSddRowsConfig(2, 64, 3, overlap=True), WsSddRowsConfig(2, 64, 3, a_from_registers=True),
           WsSddRowsConfig(1, 64, 4, overlap=True)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["random", "full", "empty_rows_cols", "empty"])
def test_matches_reference_gpu(kind, dtype, cfg):
    # M: a short last slice, one slice, many
    assert_sdd_matches_reference(kind, dtype, cfg, (1000, 32, 8192 + 40), "row-run ws sdd")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_many_units_per_program_gpu(kind, cfg):
    # 40 x 48 blocks: 40 rows x 48 / 2G runs = 240-960 units over the SMs (stages and output
    # buffers reused across units, short and empty runs between)
    assert_sdd_matches_reference(kind, torch.bfloat16, cfg, (3000,), "row-run ws sdd", 40, 48)


@pytest.mark.gpu
@needs_hopper
def test_is_bitwise_deterministic_and_captures_gpu():
    assert_sdd_is_deterministic_and_captures(WsSddRowsConfig())


@pytest.mark.gpu
@needs_hopper
def test_a_first_call_inside_a_capture_builds_its_unit_table_there_gpu():
    # a layout never used before: the unit table is built inside the capture (not cached)
    import tilesparse

    cfg = WsSddRowsConfig(4, 32, 4, a_from_registers=True)
    layout = tilesparse.layouts.random(12 * 64, 20 * 64, 64, 0.4, seed=11)
    meta = layout.meta_on("cuda")
    dy = torch.randn(512, 12 * 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 20 * 64, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.sdd(dy.t(), x, meta, 64, 12, 20, config=cfg)
    graph.replay()
    torch.cuda.synchronize()
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    assert_close(captured, expected, torch.bfloat16, "row-run ws sdd captured on a fresh layout")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("density, used", [(0.1, True), (0.05, False)])
def test_a_tuned_entry_runs_only_from_its_measured_density_gpu(monkeypatch, density, used):
    assert_tuned_entry_runs_only_from_its_density(monkeypatch, WsSddRowsConfig(4, 32, 4, a_from_registers=True),
                                                  bsmm_ws_sdd_rows, "launch_sdd_ws_rows", density, used)
