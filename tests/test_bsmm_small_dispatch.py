"""How dds picks the small-batch kernel's config for a layout: the longest runs learned
when a layout's tables are built, the chunks rule for skewed layouts
(``bsmm_small.auto_chunks``), and the config that reaches the kernel (run under the
Triton interpreter on CPU tensors, against a float64 dense reference)."""

import dataclasses

import pytest
import torch

from bsmm_cases import dense_of, random_values
import tilesparse
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small, bsmm_small_config
from tilesparse.layout import longest_runs
from tolerances import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")


def skewed_mask(block_rows=8, block_cols=16, generator=None):
    """A hub block-row and a hub block-column (full), the rest sparse: longest runs
    well past the mean in both directions."""
    generator = generator or torch.Generator().manual_seed(0)
    mask = torch.rand(block_rows, block_cols, generator=generator) < 0.1
    mask[0] = True
    mask[:, 0] = True
    return mask


def test_longest_runs_are_learned_with_the_tables():
    mask = skewed_mask()
    layout = BlockLayout(mask, 16)
    assert longest_runs(layout.meta) == (int(mask.sum(1).max()), int(mask.sum(0).max()))
    assert longest_runs(layout.transpose().meta) == (int(mask.sum(0).max()), int(mask.sum(1).max()))


def test_longest_runs_unknown_where_tables_are_built_without_a_sync():
    mask = skewed_mask()
    layout = BlockLayout.from_mask_with_nnz(mask, 16, int(mask.sum()))
    assert longest_runs(layout.meta) is None  # learning them would cost a host sync
    assert longest_runs(BlockLayout(torch.zeros(0, 3, dtype=torch.bool), 16).meta) is None
    given = BlockLayout.from_mask_with_nnz(mask, 16, int(mask.sum()), runs=(16, 8))
    assert longest_runs(given.meta) == (16, 8)


def test_tables_built_inside_torch_compile_trace_without_the_runs():
    # Dynamo cannot trace a write to a tensor's __dict__: a layout whose tables are first
    # built inside a compiled call must still compile (the runs stay unknown there).
    layout = BlockLayout(skewed_mask(), 16)
    x = torch.randn(3, layout.shape[1])
    values = random_values(layout, torch.float32)

    def f(x, values):
        return tilesparse.ops.block_sparse_linear(x, values, layout)

    out = torch.compile(f, backend="eager", fullgraph=False)(x, values)
    expected = x.double() @ dense_of(values, layout).t()
    assert_close(out, expected, torch.float32, "compiled, tables built in the trace")


@pytest.mark.parametrize("longest, nnz, n_out, block, sub, dtype, expected", [
    (38, 912, 96, 128, 32, torch.bfloat16, 2),   # Barabasi-Albert b 128, density 0.1: measured faster
    (20, 922, 96, 128, 32, torch.bfloat16, 1),   # random b 128, density 0.1: skew ~2, measured slower
    (12, 276, 96, 128, 32, torch.bfloat16, 1),   # b 128, density 0.03: ~23 KB per program, latency-bound
    (132, 14560, 384, 32, 32, torch.bfloat16, 2),  # Barabasi-Albert b 32, density 0.1
    (38, 912, 96, 128, 32, torch.float32, 1),    # fp32: not measured
    (None, 912, 96, 128, 32, torch.bfloat16, 1),  # runs unknown
    (0, 0, 96, 128, 32, torch.bfloat16, 1),      # empty layout
])
def test_auto_chunks_rule(longest, nnz, n_out, block, sub, dtype, expected):
    assert bsmm_small.auto_chunks(longest, nnz, n_out, block, sub, dtype) == expected


def hub_column_mask():
    """Skewed by columns only: a full block-column, every block-row of about the same
    length. bprop (which walks columns) must chunk, fprop (rows) must not."""
    mask = torch.zeros(12, 16, dtype=torch.bool)
    mask[:, 0] = True
    mask[torch.arange(12), 1 + torch.arange(12)] = True
    return mask


@pytest.mark.parametrize("trans, expected", [(True, 1), (False, 2)], ids=["fprop", "bprop"])
def test_the_rule_reads_the_runs_of_the_products_direction(monkeypatch, trans, expected):
    monkeypatch.setattr(bsmm_small_config, "CHUNK_MIN_BYTES", 0)
    seen = []
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]))
    layout = BlockLayout(hub_column_mask(), 16)
    rows, cols = layout.shape
    a = torch.randn(4, cols if trans else rows).half()
    kernels.dds(a, random_values(layout, torch.float16), layout.meta, None, 12, 16, trans)
    assert seen[-1].chunks == expected


@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.interpreter
def test_dds_cuts_a_skewed_layouts_runs_in_chunks(monkeypatch, trans):
    # The byte threshold is lowered so that an interpreter-sized problem qualifies; the
    # skew test is the real one. The config reaching the kernel must carry 2 chunks and
    # the product must still be right; a caller's own config is never changed.
    monkeypatch.setattr(bsmm_small_config, "CHUNK_MIN_BYTES", 0)
    seen = []
    launch = bsmm_small.launch_dds_small
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]) or launch(*args))
    layout = BlockLayout(skewed_mask(), 16)
    runs, n_out = longest_runs(layout.meta), (layout.block_rows if trans else layout.block_cols)
    assert runs[0 if trans else 1] >= bsmm_small.CHUNK_SKEW * layout.nnz / n_out  # the case is skewed
    rows, cols = layout.shape
    a = torch.randn(9, cols if trans else rows).half()  # fp16: fp32 keeps whole runs (not measured)
    values = random_values(layout, torch.float16)
    bias = torch.randn(rows if trans else cols).half()
    out = kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans)
    s = dense_of(values, layout)
    expected = a.double() @ (s.t() if trans else s) + bias.double()
    assert_close(out, expected, torch.float16, "dds auto chunks")
    assert seen[-1].chunks == 2
    forced = bsmm_small.small_config(9, 16, torch.float16)
    kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans, config=forced)
    assert seen[-1] is forced


@pytest.mark.interpreter
def test_dds_leaves_a_balanced_layout_whole(monkeypatch):
    monkeypatch.setattr(bsmm_small_config, "CHUNK_MIN_BYTES", 0)
    seen = []
    launch = bsmm_small.launch_dds_small
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]) or launch(*args))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1:, 2:] = False  # longest row 4 blocks against a mean of 2.67: under 3x, whole
    layout = BlockLayout(mask, 16)
    assert longest_runs(layout.meta) == (4, 3)
    a = torch.randn(5, 64).half()
    values = random_values(layout, torch.float16)
    kernels.dds(a, values, layout.meta, None, 3, 4, True)
    assert seen[-1] == bsmm_small.small_config(5, 16, torch.float16)


@pytest.mark.parametrize("block_size, block_k", [(32, 32), (64, 64), (128, 64)])
def test_m_above_32_takes_the_swapped_orientation(block_size, block_k):
    # H200 sweep (small-swap): M 64 at b >= 32 8-22 % faster swapped; M 32 and b 16 not
    for m in (33, 64) + ((200,) if block_size == 32 else ()):
        cfg = bsmm_small.small_config(m, block_size, torch.bfloat16)
        assert (cfg.swap, cfg.sub, cfg.block_k, cfg.block_m, cfg.num_stages) == (True, 32, block_k, 64, 12)
    assert not bsmm_small.small_config(32, block_size, torch.bfloat16).swap
    assert not bsmm_small.small_config(64, block_size, torch.float32).swap
    assert not bsmm_small.small_config(64, 16, torch.bfloat16).swap


@pytest.mark.gpu
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("m", [1, 32])
def test_gpu_skewed_layout_runs_chunked_right_and_reproducibly(monkeypatch, trans, m):
    # W 8192², b 128: two full block-rows and a full block-column over ~10 % random
    # blocks (mean run ~9.6, longest 64: the rule's real thresholds, no patching). The
    # tables reach the GPU by meta_on, which must carry the longest runs along.
    monkeypatch.setenv("TILESPARSE_TUNED", "off")  # the rule on the heuristic, whatever the user's table holds
    seen = []
    launch = bsmm_small.launch_dds_small
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]) or launch(*args))
    mask = torch.rand(64, 64, generator=torch.Generator().manual_seed(1)) < 0.1
    mask[:2] = True
    mask[:, 0] = True
    layout = BlockLayout(mask, 128)
    meta = layout.meta_on("cuda")
    assert longest_runs(meta) == longest_runs(layout.meta)
    a = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
    values = random_values(layout, torch.bfloat16, "cuda")
    out = kernels.dds(a, values, meta, None, 64, 64, trans)
    assert seen[-1].chunks == 2
    s = dense_of(values, layout)
    assert_close(out, a.double().cpu() @ (s.t() if trans else s), torch.bfloat16, "dds auto chunks")
    for _ in range(3):
        assert torch.equal(kernels.dds(a, values, meta, None, 64, 64, trans), out)


def test_longest_first_orders_the_runs_by_length():
    # runs of 11, 7, 0 and 1 entries -> tables 0, 1, 3, 2 (ties keep table order)
    ptr = torch.tensor([0, 11, 18, 18, 19, 19], dtype=torch.int32)
    assert bsmm_small._longest_first(ptr).tolist() == [0, 1, 3, 2, 4]
    assert bsmm_small._longest_first(ptr) is bsmm_small._longest_first(ptr)  # remembered on the tensor


@pytest.mark.interpreter  # (CPU tensors through the launcher)
@pytest.mark.parametrize("max_grid_y", [65535, 1], ids=["row-tiles-inner", "too-many-slices"])
def test_m_inner_puts_the_row_tiles_on_the_grids_x_axis_where_the_slices_fit_y(monkeypatch, max_grid_y):
    layout = BlockLayout(torch.rand(6, 5, generator=torch.Generator().manual_seed(1)) < 0.5, 16)
    values = random_values(layout, torch.float32)
    a = torch.randn(40, layout.shape[1])
    grids = []
    real = bsmm_small.launch
    monkeypatch.setattr(bsmm_small, "launch", lambda kernel, grid, *args, **kw: grids.append(grid) or real(
        kernel, grid, *args, **kw))
    monkeypatch.setattr(bsmm_small, "MAX_GRID_Y", max_grid_y)
    config = bsmm_small.SmallConfig(16, 16, 16, num_warps=4, num_stages=2, m_inner=True)
    out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True, config)
    assert_close(out, a.double() @ dense_of(values, layout).t(), torch.float32, "dds m_inner")
    slices, row_tiles = layout.block_rows, 3  # 16-wide slices of 16-wide blocks; 40 rows in tiles of 16
    assert grids == [(row_tiles, slices, 1) if max_grid_y > slices else (slices, row_tiles, 1)]


@pytest.mark.parametrize("block_size", [64, 128])
def test_m_65_to_512_takes_wide_slices_with_the_row_tiles_inner(block_size):
    # H200 sweeps at fe39cf4 (small-mid): 64-wide slices, row tiles inner; 128-row programs above M 128
    for m, block_m, warps, stages in ((65, 64, 4, 8), (128, 64, 4, 8), (129, 128, 8, 6), (512, 128, 8, 6)):
        cfg = bsmm_small.small_config(m, block_size, torch.float16)
        assert (cfg.sub, cfg.block_k, cfg.block_m, cfg.num_warps, cfg.num_stages, cfg.swap, cfg.m_inner) == (
            64, 64, block_m, warps, stages, True, True)
    assert not bsmm_small.small_config(100, 64, torch.float32).m_inner
    assert not bsmm_small.small_config(100, 32, torch.bfloat16).m_inner
    assert not bsmm_small.small_config(100, 48, torch.bfloat16).m_inner  # 48 on a 64-wide tile: not timed


@pytest.mark.parametrize("m, block_size, dtype, warps", [
    (1, 32, torch.bfloat16, 2), (16, 128, torch.float16, 2), (32, 16, torch.bfloat16, 2), (64, 16, torch.bfloat16, 2),
    (64, 32, torch.bfloat16, 4),  # swapped: wgmma needs the four warps of a warpgroup
    (1, 32, torch.float32, 4), (32, 64, torch.float32, 4),  # fp32 not measured at 2
])
def test_the_heuristic_runs_two_warps_for_16_bit_slices_unswapped(m, block_size, dtype, warps):
    # H200 sweeps at 4d956ce (warps44): 2 warps 1-10 % faster than 4 at one row, b 32-128, every forward point
    cfg = bsmm_small.small_config(m, block_size, dtype)
    assert cfg.num_warps == warps and cfg.swap == (warps == 4 and dtype != torch.float32)


def test_one_wave_or_less_runs_four_warps():
    # H200 (warps46, 4096²: 128 programs at b >= 32): 4 warps 3-22 % faster there; with several programs
    # per SM (12288², 8192²) the measured 1-2 warps stay
    two = bsmm_small.small_config(8, 32, torch.bfloat16)
    assert two.num_warps == 2
    assert bsmm_small.warps_for_grid(two, 132, 132).num_warps == 4
    assert bsmm_small.warps_for_grid(two, 1, 132) == dataclasses.replace(two, num_warps=4)
    assert bsmm_small.warps_for_grid(two, 133, 132) is two
    one = dataclasses.replace(two, num_warps=1)
    assert bsmm_small.warps_for_grid(one, 100, 132).num_warps == 4
    swapped = bsmm_small.small_config(64, 32, torch.bfloat16)
    assert bsmm_small.warps_for_grid(swapped, 10, 132) is swapped  # 4 already
    wide = bsmm_small.small_config(256, 64, torch.bfloat16)
    assert wide.num_warps == 8 and bsmm_small.warps_for_grid(wide, 10, 132) is wide


@pytest.mark.parametrize("m, block_size, splits, chunks, m_inner", [
    (3, 32, 1, 1, False), (40, 64, 1, 1, False), (9, 16, 2, 1, False), (9, 16, 1, 2, False), (100, 64, 1, 1, True)])
def test_small_grid_is_the_launchs_grid(monkeypatch, m, block_size, splits, chunks, m_inner):
    grids = []
    monkeypatch.setattr(bsmm_small, "launch", lambda kernel, grid, *args, **kw: grids.append(grid))
    layout = BlockLayout(torch.rand(5, 3, generator=torch.Generator().manual_seed(1)) < 0.7, block_size)
    cfg = dataclasses.replace(bsmm_small.small_config(m, block_size, torch.float16), splits=splits, chunks=chunks,
                              m_inner=m_inner)
    kernels.dds(torch.randn(m, layout.shape[1]).half(), random_values(layout, torch.float16), layout.meta, None,
                5, 3, True, config=cfg)
    grid = bsmm_small.small_grid(5, block_size, m, cfg)
    assert grids == [(grid[1], grid[0], grid[2]) if m_inner else grid]  # (m_inner: the row tiles on x)


@pytest.mark.parametrize("sms, warps", [(1, 2), (10, 2), (11, 4), (132, 4)])
def test_dds_gives_a_grid_of_one_wave_four_warps(monkeypatch, sms, warps):
    seen = []
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]))
    monkeypatch.setattr(kernels, "sm_count", lambda device: sms)
    monkeypatch.setenv("TILESPARSE_TUNED", "off")
    layout = BlockLayout(torch.ones(11, 4, dtype=torch.bool), 32)  # fprop: 11 slices of 32 features, one row tile
    a = torch.randn(8, layout.shape[1]).half()
    values = random_values(layout, torch.float16)
    kernels.dds(a, values, layout.meta, None, 11, 4, True)
    assert seen[-1] == dataclasses.replace(bsmm_small.small_config(8, 32, torch.float16), num_warps=warps)
    forced = bsmm_small.small_config(8, 32, torch.float16)
    kernels.dds(a, values, layout.meta, None, 11, 4, True, config=forced)
    assert seen[-1] is forced  # a caller's config is never changed


@pytest.mark.parametrize("for_this_shape, warps", [(True, 2), (False, 4)])
def test_a_table_entry_for_this_weight_shape_keeps_its_warps(monkeypatch, for_this_shape, warps):
    # `tilesparse tune` measures 1-2 warps on the shape itself: such an entry is left as measured
    seen = []
    entry = bsmm_small.small_config(8, 32, torch.float16)
    monkeypatch.setattr(bsmm_small, "launch_dds_small", lambda *args: seen.append(args[-1]))
    monkeypatch.setattr(kernels, "sm_count", lambda device: 132)
    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args: entry)
    monkeypatch.setattr(kernels.tuned, "lookup_entry", lambda *args: (entry, for_this_shape))
    layout = BlockLayout(torch.ones(11, 4, dtype=torch.bool), 32)
    kernels.dds(torch.randn(8, layout.shape[1]).half(), random_values(layout, torch.float16), layout.meta, None,
                11, 4, True)
    assert entry.num_warps == 2 and seen[-1] == dataclasses.replace(entry, num_warps=warps)


def test_which_kernel_runs_without_a_measured_config():
    use = kernels.use_small_kernel
    assert all(use(64, b, dt) for b in (16, 32, 64, 128) for dt in (torch.float32, torch.bfloat16))
    assert use(128, 32, torch.bfloat16) and not use(129, 32, torch.bfloat16)
    assert use(512, 64, torch.float16) and not use(513, 64, torch.float16)
    assert use(256, 128, torch.bfloat16) and not use(257, 128, torch.bfloat16)
    assert not use(65, 16, torch.bfloat16) and not use(65, 128, torch.float32)
    assert not use(100, 24, torch.bfloat16) and not use(100, 48, torch.bfloat16)  # not powers of two: not timed
