"""The dense-tile sdd (kernels/bsmm_sdd_tile.py): a tile of blocks per program, only the
stored blocks written.

Against float64 references sampled on the layout (``layout.gather`` of the dense
product), under the interpreter on CPU (fp32, fp16: the interpreter's bf16 dot is wrong)
and on CUDA (marked), across block sizes, tile shapes (block grids that do not fill the
last tile), odd M and every layout class; plus determinism, untouched padding and bad
configs.
"""

from __future__ import annotations

import functools

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, LAYOUT_KINDS, assert_sdd_falls_back_to_the_heuristic, make_layout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import tuned
from tilesparse.kernels.bsmm_sdd_tile import SddTileConfig
from tolerances import assert_close


def _interpreter(test):
    return functools.reduce(lambda t, mark: mark(t), INTERPRETER_MARKS, test)


def _run(kind, block_size, cfg, m, dtype, device, grid=(5, 7)):
    layout = make_layout(kind, *grid, block_size)
    rows, cols = layout.shape
    dy = torch.randn(m, rows, device=device).to(dtype)
    x = torch.randn(m, cols, device=device).to(dtype)
    got = kernels.sdd(dy.t(), x, layout.meta_on(device), block_size, layout.block_rows, layout.block_cols,
                      config=cfg)
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    return got, expected


@pytest.mark.parametrize("tiles", [(32, 32), (64, 32), (32, 64)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@_interpreter
def test_tile_sdd_matches_reference_interpreter(dtype, kind, block_size, tiles):
    cfg = SddTileConfig(*tiles, block_m=16, num_warps=4, num_stages=2)
    got, expected = _run(kind, block_size, cfg, 45, dtype, "cpu")
    assert got.shape == expected.shape
    if expected.numel():
        assert_close(got, expected, dtype, f"tile sdd b{block_size} {tiles}")


@_interpreter
def test_tile_sdd_block_as_large_as_the_tile_and_one_row_interpreter():
    """b equal to a tile side (one block per tile that way), and M = 1."""
    for block_size, tiles, m in ((32, (32, 64), 1), (16, (16, 16), 3)):
        got, expected = _run("random", block_size, SddTileConfig(*tiles, block_m=16), m, torch.float32, "cpu",
                             grid=(3, 5))
        assert_close(got, expected, torch.float32, f"tile sdd b{block_size} M{m}")


@_interpreter
def test_tile_sdd_is_bitwise_deterministic_and_writes_only_stored_blocks_interpreter():
    from tilesparse.kernels.bsmm_sdd_tile import launch_sdd_tile

    layout = make_layout("random", 6, 6, 16)
    dy, x = torch.randn(70, 96), torch.randn(70, 96)
    meta = layout.meta_on("cpu")
    cfg = SddTileConfig(32, 64, block_m=32)
    runs = [kernels.sdd(dy.t(), x, meta, 16, 6, 6, config=cfg) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    # the stored blocks inside a NaN-filled buffer with a guard block on each side: every
    # stored block written, the guards untouched
    buffer = torch.full((layout.nnz + 2, 16, 16), float("nan"))
    launch_sdd_tile(dy.t(), x, buffer[1:-1], meta, 6, 6, "ieee", cfg)
    assert torch.equal(buffer[1:-1], runs[0])
    assert buffer[0].isnan().all() and buffer[-1].isnan().all()


@pytest.mark.parametrize("programs_per_sm", [1, 3])
@pytest.mark.parametrize("kind", LAYOUT_KINDS)
@_interpreter
def test_persistent_tile_sdd_matches_reference_and_the_one_tile_grid_interpreter(kind, programs_per_sm):
    """The persistent grid (programs walking the non-empty tiles; CPU counts one SM, so 1
    or 3 programs) gives the per-tile kernel's blocks bitwise, the guards untouched."""
    from tilesparse.kernels.bsmm_sdd_tile import launch_sdd_tile

    layout = make_layout(kind, 7, 9, 16)
    rows, cols = layout.shape
    dy, x = torch.randn(37, rows), torch.randn(37, cols)
    meta = layout.meta_on("cpu")
    tiles = dict(tile_rows=32, tile_cols=64, block_m=16)
    per_tile = kernels.sdd(dy.t(), x, meta, 16, 7, 9, config=SddTileConfig(**tiles))
    if layout.nnz == 0:
        assert per_tile.shape[0] == 0
        return
    buffer = torch.full((layout.nnz + 2, 16, 16), float("nan"))
    launch_sdd_tile(dy.t(), x, buffer[1:-1], meta, 7, 9, "ieee",
                    SddTileConfig(**tiles, programs_per_sm=programs_per_sm))
    assert torch.equal(buffer[1:-1], per_tile)
    assert buffer[0].isnan().all() and buffer[-1].isnan().all()
    assert_close(buffer[1:-1], layout.gather(dy.double().t() @ x.double()), torch.float32, f"persistent {kind}")


def test_nonempty_tiles_counts_and_lists_the_busy_tiles_first():
    from tilesparse.kernels.bsmm_sdd_tile import nonempty_tiles
    from tilesparse.layout import BlockLayout

    # 3 x 5 blocks of 16 in 32 x 32 tiles: a 2 x 3 tile grid (the last row and column partial)
    dense = torch.zeros(3, 5, dtype=torch.bool)
    dense[0, 0] = dense[2, 4] = dense[1, 3] = True  # tiles (0, 0), (1, 2), (0, 1)
    layout = BlockLayout(dense, 16)
    order = nonempty_tiles(layout.meta_on("cpu"), 3, 5, 16, SddTileConfig(32, 32, 16))
    assert order.dtype == torch.int32 and order.shape == (1 + 6,)
    assert order[0].item() == 3
    assert order[1:4].tolist() == [0, 1, 5] and sorted(order[4:].tolist()) == [2, 3, 4]


@_interpreter
def test_tile_sdd_other_operand_strides_interpreter():
    """A contiguous along M (dY^T materialized) and X with a column stride of 2."""
    layout = make_layout("random", 5, 3, 16)
    rows, cols = layout.shape
    dy_t = torch.randn(rows, 40)  # [R*b, M], unit stride along M
    x = torch.randn(40, 2 * cols)[:, ::2]  # [M, C*b], column stride 2
    got = kernels.sdd(dy_t, x, layout.meta_on("cpu"), 16, 5, 3, config=SddTileConfig(32, 32, block_m=16))
    assert_close(got, layout.gather(dy_t.double() @ x.double()), torch.float32, "tile sdd, other strides")


def test_tile_sdd_config_checks_its_fields_and_block_size():
    with pytest.raises(ValueError, match="tile_rows"):
        SddTileConfig(96)
    with pytest.raises(ValueError, match="tile_cols"):
        SddTileConfig(128, 8)
    with pytest.raises(ValueError, match="block_m"):
        SddTileConfig(block_m=48)
    with pytest.raises(ValueError, match="num_warps"):
        SddTileConfig(num_warps=3)
    with pytest.raises(ValueError, match="programs_per_sm"):
        SddTileConfig(programs_per_sm=-1)
    with pytest.raises(ValueError, match="programs_per_sm"):
        SddTileConfig(programs_per_sm=True)
    assert SddTileConfig().fits(16) and SddTileConfig().fits(128) and not SddTileConfig(64, 128).fits(128)
    assert not SddTileConfig().fits(48)  # blocks must tile the tile
    layout = make_layout("random", 2, 2, 48)
    dy, x = torch.randn(8, 96), torch.randn(8, 96)
    with pytest.raises(ValueError, match="power-of-two block size"):
        kernels.sdd(dy.t(), x, layout.meta_on("cpu"), 48, 2, 2, config=SddTileConfig())


def test_sdd_falls_back_from_a_tuned_tile_config_that_does_not_fit(monkeypatch):
    """A tuned entry whose tiles do not fit the block size runs the heuristic instead."""
    assert_sdd_falls_back_to_the_heuristic(monkeypatch, SddTileConfig(64, 64), kernels.bsmm_sdd_tile,
                                           "launch_sdd_tile")


def test_default_config_where_measured_faster():
    from tilesparse.kernels.bsmm_sdd_tile import default_config

    hopper = dict(tiles=1024, sms=132, capability=9)
    assert default_config(128, 16, 0.5, **hopper) == SddTileConfig(128, 128, 32, 4, 4, programs_per_sm=2)
    assert default_config(8192, 16, 0.25, **hopper) == SddTileConfig(128, 128, 64, 8, 3)
    assert default_config(128, 16, 0.1, **hopper) is None and default_config(256, 16, 0.1, **hopper) is not None
    assert default_config(512, 32, 0.5, **hopper) is not None and default_config(512, 32, 0.25, **hopper) is None
    assert default_config(8192, 64, 0.5, **hopper) is None and default_config(8192, 128, 0.5, **hopper) is None
    assert default_config(64, 16, 0.5, **hopper) is None  # fewer rows than measured
    assert default_config(8192, 16, 0.5, **{**hopper, "tiles": 4}) is None  # a small weight: SMs left idle
    assert default_config(8192, 16, 0.5, **{**hopper, "capability": 8}) is None  # measured on Hopper only


def test_tile_count_covers_partial_tiles():
    from tilesparse.kernels.bsmm_sdd_tile import tile_count

    assert tile_count(96, 96, 128, SddTileConfig()) == 96 * 96
    assert tile_count(9, 1, 16, SddTileConfig()) == 2  # 144 rows: two 128-row tiles, one 16-wide column tile


def test_sdd_wiring_takes_the_default_only_without_a_tuned_entry(monkeypatch):
    """On CUDA (faked here: the launches are recorded, not run) a 16-bit sdd with no tuned
    entry takes default_config; a tuned entry wins; fp32 keeps the one-block kernel."""
    from tilesparse.kernels import bsmm_sdd_tile

    chosen = []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(kernels, "sm_count", lambda device: 4)
    monkeypatch.setattr(kernels, "capability_major", lambda device: 9)
    monkeypatch.setattr(bsmm_sdd_tile, "launch_sdd_tile", lambda *args: chosen.append(args[-1]))
    monkeypatch.setattr(kernels, "launch", lambda *args, **kwargs: chosen.append("one-block"))
    layout = make_layout("full", 16, 16, 16)  # 256² weight: 4 tiles of 128²
    meta = layout.meta_on("cpu")
    dy, x = torch.randn(200, 256).half(), torch.randn(200, 256).half()
    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args, **kwargs: None)
    kernels.sdd(dy.t(), x, meta, 16, 16, 16)
    assert chosen == [SddTileConfig(128, 128, 32, 4, 4, programs_per_sm=2)]
    kernels.sdd(dy.t().float(), x.float(), meta, 16, 16, 16)
    assert chosen[-1] == "one-block"
    tuned_cfg = SddTileConfig(64, 64, 32, 4, 3)
    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args, **kwargs: tuned_cfg)
    kernels.sdd(dy.t(), x, meta, 16, 16, 16)
    assert chosen[-1] == tuned_cfg


def test_sdd_on_cpu_keeps_the_one_block_kernel_without_a_config(monkeypatch):
    """The measured default is for CUDA 16-bit inputs; the interpreter path is unchanged."""
    monkeypatch.setattr(kernels.bsmm_sdd_tile, "launch_sdd_tile", lambda *args: pytest.fail("tile kernel chosen"))
    monkeypatch.setattr(kernels, "launch", lambda *args, **kwargs: None)
    layout = make_layout("full", 3, 3, 16)
    dy, x = torch.randn(256, 48).half(), torch.randn(256, 48).half()
    kernels.sdd(dy.t(), x, layout.meta_on("cpu"), 16, 3, 3)


def test_sdd_tile_config_round_trips_through_the_tuned_table_format():
    cfg = SddTileConfig(64, 128, 32, 4, 4)
    assert tuned.from_json(tuned.to_json(cfg)) == cfg


@pytest.mark.gpu
@pytest.mark.parametrize("tiles, block_m, warps, stages, persistent", [
    ((128, 128), 64, 8, 3, 0), ((128, 128), 32, 4, 4, 0), ((64, 128), 64, 4, 3, 0), ((64, 64), 64, 4, 3, 0),
    ((256, 128), 32, 8, 4, 0), ((128, 256), 32, 8, 4, 0), ((128, 128), 32, 4, 4, 2), ((128, 128), 64, 8, 3, 1)])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_tile_sdd_matches_reference_gpu(dtype, block_size, tiles, block_m, warps, stages, persistent):
    cfg = SddTileConfig(*tiles, block_m, warps, stages, persistent)
    for kind, m in (("random", 1000), ("empty_rows_cols", 129), ("full", 64), ("random", 1)):
        got, expected = _run(kind, block_size, cfg, m, dtype, "cuda", grid=(11, 9))
        assert_close(got, expected, dtype, f"tile sdd {kind} b{block_size} {cfg}")


@pytest.mark.gpu
def test_tile_sdd_is_bitwise_deterministic_gpu():
    layout = make_layout("random", 40, 40, 16)
    dy = torch.randn(300, 640, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(300, 640, device="cuda", dtype=torch.bfloat16)
    meta = layout.meta_on("cuda")
    runs = [kernels.sdd(dy.t(), x, meta, 16, 40, 40, config=SddTileConfig()) for _ in range(3)]
    runs.append(kernels.sdd(dy.t(), x, meta, 16, 40, 40, config=SddTileConfig(programs_per_sm=2)))
    assert all(torch.equal(runs[0], run) for run in runs[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sdd_default_on_cuda_takes_the_tile_kernel_where_measured_faster(monkeypatch, dtype):
    calls = []
    original = kernels.bsmm_sdd_tile.launch_sdd_tile
    monkeypatch.setattr(kernels.bsmm_sdd_tile, "launch_sdd_tile", lambda *args: calls.append(1) or original(*args))
    monkeypatch.setenv("TILESPARSE_TUNED", "off")  # the heuristic's choice, not a tuned entry
    # 96 x 96 blocks of 16: 144 tiles of 128², at least one per SM (the default's condition)
    got, expected = _run("full", 16, None, 300, dtype, "cuda", grid=(96, 96))
    assert calls == [1]
    assert_close(got, expected, dtype, "default sdd b16 full layout, 300 rows")
