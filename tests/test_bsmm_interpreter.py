"""The Triton launchers ``tilesparse.kernels.bsmm.dds`` / ``.sdd`` called directly on CPU
tensors, so they run under the Triton interpreter (TRITON_INTERPRET=1, set by conftest
when there is no GPU), against float64 dense references.

TILESPARSE_POISON=1 makes every kernel output start as NaN, so an element a kernel
forgets to write fails the finiteness check in ``assert_close``.

Dtypes: fp32 and fp16 only. The interpreter's ``tl.dot`` on bfloat16 is wrong (it
multiplies the raw 16-bit patterns, giving relative errors ~1e9), so bf16 kernel
numerics can only be checked on a GPU (test_bsmm_gpu.py).

Block sizes 8-64 across the grid; 128 gets one small case each, because the interpreter
runs every program in Python and a 128-wide tile is slow.
"""

import dataclasses

import pytest
import torch

from bsmm_cases import (INTERPRETER_MARKS, LAYOUT_KINDS, TRANS_CASES, check_dds, dds_expected, dds_inputs, make_layout,
                        pairwise, random_values, run_dds)
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_small
from tilesparse.kernels import _alloc
from tilesparse.kernels._alloc import poison_enabled
from tolerances import assert_close

pytestmark = INTERPRETER_MARKS

BLOCK_SIZES = [8, 16, 32, 64]  # 8 runs on masked 16-wide tiles; 128 below, once
DTYPES = [torch.float32, torch.float16]  # no bf16: see the module docstring
DTYPE_IDS = ["fp32", "fp16"]
GRID = (3, 4)  # block-rows x block-cols; out != in so a transposition slip changes shapes


def run_sdd(layout, a, b, config=None):
    return kernels.sdd(a, b, layout.meta, layout.block_size, layout.block_rows, layout.block_cols, config=config)


def check_sdd(layout, a, b, dtype, config=None):
    out = run_sdd(layout, a, b, config)
    assert out.dtype == dtype and out.shape == (layout.nnz, layout.block_size, layout.block_size)
    assert_close(out, layout.gather(a.double() @ b.double()), dtype, "sdd")


def test_poisoning_is_on():
    # The finiteness checks below only catch unwritten elements if outputs start as NaN.
    assert poison_enabled()


# --------------------------------------------------------------------------- dds


def kernel_config(path, m, block_size, dtype):
    """Force one of dds's two kernels: the large-batch tiles or the small-batch stream."""
    if path == "large":
        return kernels.dds_config(m, block_size, dtype)
    return bsmm_small.small_config(m, block_size, dtype)


# trans=True is fprop (row table), trans=False is bprop (column table + slot indirection).
# M=1 (one partial 16-row tile) and M=37 (a partial 64-row tile), through both kernels.
@pytest.mark.parametrize("path", ["large", "small"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("m", [1, 37], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
def test_dds(block_size, dtype, trans, m, with_bias, path):
    layout = make_layout("empty_rows_cols", *GRID, block_size)
    a, values, bias = dds_inputs(layout, m, dtype, trans, with_bias)
    check_dds(layout, a, values, bias, trans, dtype, kernel_config(path, m, block_size, dtype))


# The small-batch kernel's own knobs: feature slices narrower than the block (several
# programs per block-row), a reduction step shorter than the block, M past one m-tile,
# the reduction split over programs (3 splits of 1-4 entries: some splits empty; or the
# runs longer than the mean cut in 2-3 chunks summed in-kernel), a step spanning 2 or
# 4 consecutive blocks (runs that end mid-step), and the swapped product orientation.
# (every pair of layout class, orientation, tile and knobs at least once: bsmm_cases.pairwise)
@pytest.mark.parametrize("layout_kind, trans, tile, knobs", pairwise(
    [(kind, kind) for kind in LAYOUT_KINDS], TRANS_CASES,
    [(f"s{s}-k{k}-m{m}", (s, k, m)) for s, k, m in [(16, 16, 16), (16, 32, 32), (32, 16, 16), (16, 64, 16),
                                                   (32, 128, 16), (32, 32, 64)]],
    [("whole", (1, 1, False, False)), ("splits3", (3, 1, False, False)), ("chunks2", (1, 2, False, False)),
     ("chunks3", (1, 3, False, False)), ("longest", (1, 1, True, False)), ("chunks2-longest", (1, 2, True, False)),
     ("swap", (1, 1, False, True)), ("splits3-swap", (3, 1, False, True)), ("chunks2-swap", (1, 2, False, True))]))
def test_dds_small_kernel_tiling(layout_kind, trans, tile, knobs):
    sub, block_k, block_m = tile
    splits, chunks, longest_first, swap = knobs
    layout = make_layout(layout_kind, *GRID, 32)
    a, values, bias = dds_inputs(layout, 40, torch.float32, trans, True)
    config = bsmm_small.SmallConfig(sub, block_k, block_m, num_warps=4, num_stages=2, splits=splits, chunks=chunks,
                                    longest_first=longest_first, swap=swap)
    check_dds(layout, a, values, bias, trans, torch.float32, config)


@pytest.mark.parametrize("extra", [{}, {"splits": 3}, {"chunks": 2}, {"swap": True}, {"chunks": 2, "swap": True}],
                         ids=["whole", "splits3", "chunks2", "swap", "chunks2-swap"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_dds_small_kernel_m_tiles_inner(program_order, trans, extra):
    # m_inner: the grid's x axis walks M's 3 row tiles, y the slices (chunk tiles still distinct)
    layout = make_layout("random", *GRID, 32)
    a, values, bias = dds_inputs(layout, 40, torch.float32, trans, True)
    config = bsmm_small.SmallConfig(16, 32, 16, num_warps=4, num_stages=2, m_inner=True, **extra)
    check_dds(layout, a, values, bias, trans, torch.float32, config)


def test_dds_small_kernel_chunks_leave_their_counters_at_zero():
    # The last chunk of a tile to finish resets its arrival counter, so the next launch
    # (here: the same product again, on a layout with long and short block-rows) starts
    # from zero and gives the same result.
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[0] = True          # 6 entries: above the mean, split
    mask[1, :1] = True      # 1 entry: one chunk, written directly
    mask[3, 2:5] = True     # 3 entries
    layout = BlockLayout(mask, 16)
    a, values, bias = dds_inputs(layout, 20, torch.float32, True, True)
    config = bsmm_small.SmallConfig(16, 16, 32, num_warps=4, num_stages=2, chunks=3)
    first = run_dds(layout, a, values, bias, True, config)
    assert_close(first, dds_expected(layout, a, values, bias, True), torch.float32, "dds chunks")
    counters = _alloc.arrival_counters(a.device, 1)
    assert int(counters.abs().sum()) == 0
    assert torch.equal(run_dds(layout, a, values, bias, True, config), first)


@pytest.fixture(params=["in order", "reversed", "shuffled"])
def program_order(request, monkeypatch):
    """Run the interpreter's programs in launch order, reversed, or shuffled (it runs them
    one after another, z fastest, so in-kernel cross-program logic, the chunks' last-to-
    arrive sum, otherwise only ever sees one tile's chunks back to back, highest last)."""
    if request.param != "in order":
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        original = type(builder).set_grid_idx
        orders = {}

        def remapped_idx(self, x, y, z):
            nx, ny, nz = self.grid_dim
            if request.param == "reversed":
                return original(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)
            n = nx * ny * nz
            perm = orders.setdefault(n, torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist())
            flat = perm[(x * ny + y) * nz + z]
            original(self, flat // (ny * nz), flat // nz % ny, flat % nz)

        monkeypatch.setattr(type(builder), "set_grid_idx", remapped_idx)
    return request.param


# Block-rows of 11, 7, 0 and 1 entries (mean 4.75, chunks of 5): the long ones cut in 3
# and 2 chunks; blocks narrower than their tile (8, 20), steps over several blocks (block_k 64).
@pytest.mark.parametrize("swap", [False, True], ids=["", "swap"])
@pytest.mark.parametrize("block_size, sub, block_k", [(8, 16, 64), (20, 32, 64), (32, 32, 32)])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_dds_small_kernel_chunks_in_any_arrival_order(program_order, block_size, sub, block_k, trans, swap):
    mask = torch.zeros(4, 12, dtype=torch.bool)
    mask[0, :11] = True
    mask[1, 2:9] = True
    mask[3, 4] = True
    if not trans:
        mask = mask.t().contiguous()  # bprop walks the columns: the same run lengths there
    layout = BlockLayout(mask, block_size)
    a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
    config = bsmm_small.SmallConfig(sub, block_k, 32, num_warps=4, num_stages=2, chunks=3, longest_first=trans,
                                    swap=swap)
    out = run_dds(layout, a, values, bias, trans, config)
    assert_close(out, dds_expected(layout, a, values, bias, trans), torch.float32, "dds chunks")
    assert int(_alloc.arrival_counters(a.device, 1).abs().sum()) == 0


@pytest.mark.parametrize("kwargs, field", [({"splits": 2, "chunks": 2}, "chunks"), ({"chunks": 0}, "chunks"),
                                           ({"chunks": 2.0}, "chunks"), ({"chunks": True}, "chunks"),
                                           ({"chunks": bsmm_small.MAX_CHUNKS + 1}, "chunks"),
                                           ({"longest_first": 1}, "longest_first"), ({"swap": 1}, "swap"),
                                           ({"m_inner": 1}, "m_inner")])
def test_small_config_refuses_bad_reduction_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        bsmm_small.SmallConfig(16, 16, 16, 4, 2, **kwargs)


# Every layout class (empty: bias-only output from zero-length ptr ranges; full; random;
# empty rows/cols), both table directions, at one block size.
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
def test_dds_layouts(layout_kind, trans):
    layout = make_layout(layout_kind, *GRID, 16)
    a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
    check_dds(layout, a, values, bias, trans, torch.float32)


def test_dds_empty_layout_without_bias_is_zero():
    layout = make_layout("empty", *GRID, 16)
    a, values, _ = dds_inputs(layout, 37, torch.float32, True, False)
    out = run_dds(layout, a, values, None, True)
    assert torch.equal(out, torch.zeros(37, layout.shape[0]))


# Strided A: a column-major view (stride_ak = M) and a column slice (stride_ak = 2).
@pytest.mark.parametrize("a_kind", ["transposed", "sliced"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dds_strided_a(dtype, trans, a_kind):
    layout = make_layout("random", *GRID, 16)
    rows, cols = layout.shape
    k = cols if trans else rows
    if a_kind == "transposed":
        a = torch.randn(k, 37).to(dtype).t()
    else:
        a = torch.randn(37, 2 * k).to(dtype)[:, ::2]
    assert not a.is_contiguous()
    values = random_values(layout, dtype)
    check_dds(layout, a, values, None, trans, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dds_block_128(dtype):
    layout = make_layout("random", 2, 2, 128)
    for trans in (True, False):
        a, values, bias = dds_inputs(layout, 5, dtype, trans, True)
        check_dds(layout, a, values, bias, trans, dtype)


# M = 1100 is 9 tiles of 128 rows: with group_m 1, 4 and 8 the last group is partial,
# which exercises the grouped program-to-tile mapping; block_k 16 on b=32 gives two
# reduction steps per block.
@pytest.mark.parametrize("group_m, block_k", [(1, 32), (4, 16), (8, 32)], ids=["g1", "g4-k16", "g8"])
def test_dds_grouped_tile_order(group_m, block_k):
    layout = make_layout("empty_rows_cols", 3, 2, 32)
    for trans in (True, False):
        a, values, bias = dds_inputs(layout, 1100, torch.float32, trans, True)
        config = dataclasses.replace(kernels.dds_config(1100, 32, torch.float32), group_m=group_m, block_k=block_k)
        check_dds(layout, a, values, bias, trans, torch.float32, config)


def test_dds_zero_rows():
    layout = make_layout("random", *GRID, 16)
    a, values, bias = dds_inputs(layout, 0, torch.float32, True, True)
    out = run_dds(layout, a, values, bias, True)
    assert out.shape == (0, layout.shape[0])


# --------------------------------------------------------------------------- sdd


# M=1 and 37 (one partial reduction step), 300 (several steps with a partial last one).
# A as stored contiguously, or as the transposed view the backward passes (grad.t()).
@pytest.mark.parametrize("a_kind", ["contiguous", "transposed"])
@pytest.mark.parametrize("m", [1, 37, 300], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
def test_sdd(block_size, dtype, m, a_kind):
    layout = make_layout("empty_rows_cols", *GRID, block_size)
    rows, cols = layout.shape
    a = torch.randn(rows, m).to(dtype) if a_kind == "contiguous" else torch.randn(m, rows).to(dtype).t()
    b = torch.randn(m, cols).to(dtype)
    check_sdd(layout, a, b, dtype)


@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
def test_sdd_layouts(layout_kind):
    layout = make_layout(layout_kind, *GRID, 16)
    rows, cols = layout.shape
    check_sdd(layout, torch.randn(rows, 37), torch.randn(37, cols), torch.float32)


def test_sdd_strided_b():
    layout = make_layout("random", *GRID, 16)
    rows, cols = layout.shape
    b = torch.randn(cols, 37).t()  # column-major B
    check_sdd(layout, torch.randn(rows, 37), b, torch.float32)
    b = torch.randn(37, 2 * cols)[:, 1::2]  # column slice
    check_sdd(layout, torch.randn(rows, 37), b, torch.float32)


# Split M reductions (fp32 workspace summed in a fixed order). M=300 is 10 steps of 32
# (fp32) or 5 of 64 (fp16): splits 2 and 3 give uneven slices, 7 leaves some slices
# empty after rounding to whole steps, 64 is clipped to the step count.
@pytest.mark.parametrize("splits", [2, 3, 7, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sdd_split_reduction(dtype, splits):
    layout = make_layout("random", *GRID, 16)
    rows, cols = layout.shape
    a, b = torch.randn(rows, 300).to(dtype), torch.randn(300, cols).to(dtype)
    config = dataclasses.replace(kernels.sdd_config(300, 16, layout.nnz, dtype, a.device), splits=splits)
    check_sdd(layout, a, b, dtype, config)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sdd_block_128(dtype):
    layout = make_layout("random", 2, 2, 128)
    check_sdd(layout, torch.randn(256, 20).to(dtype), torch.randn(20, 256).to(dtype), dtype)


def test_sdd_zero_reduction_length_is_zero():
    layout = make_layout("random", *GRID, 16)
    rows, cols = layout.shape
    out = run_sdd(layout, torch.randn(rows, 0), torch.randn(0, cols))
    assert torch.equal(out, torch.zeros(layout.nnz, 16, 16))


# --------------------------------------------------------------------------- regressions


def test_launcher_with_non_contiguous_bias():
    # Regression: a strided bias once reached the kernel, which reads bias_ptr + column;
    # the launcher now makes bias (and values) contiguous.
    layout = make_layout("random", *GRID, 16)
    a, values, _ = dds_inputs(layout, 37, torch.float32, True, False)
    bias = torch.randn(2 * layout.shape[0])[::2]
    assert not bias.is_contiguous()
    out = kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, True)
    assert_close(out, dds_expected(layout, a, values, bias, True), torch.float32, "dds with strided bias")


# Regression: block sizes that are not powers of two once failed to compile (tl.arange
# needs a power of two); they now run on the next power-of-two tile, masked. 12 (< 16),
# 24 and 48 (between powers of two).
@pytest.mark.parametrize("block_size", [12, 24, 48], ids=lambda b: f"b{b}")
def test_non_power_of_two_block_sizes(block_size):
    layout = make_layout("empty_rows_cols", 3, 2, block_size)
    rows, cols = layout.shape
    for trans in (True, False):
        a, values, bias = dds_inputs(layout, 37, torch.float32, trans, True)
        check_dds(layout, a, values, bias, trans, torch.float32)
    check_sdd(layout, torch.randn(rows, 37), torch.randn(37, cols), torch.float32)


# --------------------------------------------------------------------------- device-built descriptors
# The Hopper kernels that build their TMA descriptors in the kernel run under the
# interpreter too (tl.make_tensor_descriptor is emulated), so their indexing is checked
# here; the launchers only pick them on sm90+ GPUs, hence the direct launcher calls.


@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_dds_device_descriptors(kind, trans, with_bias):
    from tilesparse.kernels import bsmm_tma
    from tilesparse.layout import table_views

    layout = make_layout(kind, *GRID, 16)
    a, values, bias = dds_inputs(layout, 45, torch.float32, trans, with_bias)  # 45: partial m-tile
    r, c = layout.block_rows, layout.block_cols
    if trans:
        (ptr, idx), slot, n_out = table_views(layout.meta, r, c, "row_ptr", "row_cols"), None, r
    else:
        (ptr, idx, slot), n_out = table_views(layout.meta, r, c, "col_ptr", "col_rows", "col_slot"), c
    out = torch.full((45, n_out * 16), float("nan"))
    cfg = kernels.KernelConfig(32, 16, 4, 2, tma=True, device_desc=True)
    bsmm_tma.launch_dds_device_desc(a, values, out, bias, ptr, idx, slot, n_out, cfg, trans, "ieee")
    assert_close(out, dds_expected(layout, a, values, bias, trans), torch.float32, "dds device descriptors")


@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_sdd_device_descriptors(kind):
    from tilesparse.kernels import bsmm_tma
    from tilesparse.layout import table_views

    layout = make_layout(kind, *GRID, 16)
    rows, cols = layout.shape
    g, b = torch.randn(50, rows), torch.randn(50, cols)  # A = g^T as in the backward
    row_of, row_cols = table_views(layout.meta, layout.block_rows, layout.block_cols, "row_of", "row_cols")
    out = torch.full((layout.nnz, 16, 16), float("nan"))
    cfg = kernels.KernelConfig(16, 16, 4, 2, tma=True, device_desc=True)
    bsmm_tma.launch_sdd_device_desc(g, b, out, row_of, row_cols, 50, 64, layout.nnz, 1, cfg, 16, "ieee")
    assert_close(out, layout.gather(g.t().double() @ b.double()), torch.float32, "sdd device descriptors")


# --------------------------------------------------------------------------- TF32 operand order
# Under TF32 the launchers transpose bprop's blocks and make updat's operands
# M-contiguous (tensor cores read TF32 K-major only); the interpreter checks that the
# rearranged operands still give the same products.


@pytest.fixture
def tf32():
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("block_size", [8, 16], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
def test_tf32_bprop_and_updat_operand_order(tf32, kind, block_size):
    assert kernels._input_precision(torch.float32) == "tf32"
    layout = make_layout(kind, *GRID, block_size)
    a, values, bias = dds_inputs(layout, 37, torch.float32, False, True)
    check_dds(layout, a, values, bias, False, torch.float32)
    rows, cols = layout.shape
    g, x = torch.randn(37, rows), torch.randn(37, cols)
    check_sdd(layout, g.t(), x, torch.float32)  # the backward's strided views


def test_tma_eligibility_refuses_misaligned_and_overlapping_rows():
    # what a TMA descriptor can describe: row-major, 16-byte base and pitch, rows that do
    # not overlap (an expanded view's zero row stride cannot be described)
    from tilesparse.kernels.bsmm_tma import row_major_tma_ok

    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    assert row_major_tma_ok(x)
    assert not row_major_tma_ok(x.t())  # column-major
    assert not row_major_tma_ok(torch.zeros(64 * 128 + 1, dtype=torch.bfloat16)[1:].view(64, 128))  # 2 bytes off
    assert not row_major_tma_ok(x[:1].expand(64, 128))  # row stride 0
    assert row_major_tma_ok(x[:1].expand(1, 128))
    assert not row_major_tma_ok(torch.zeros(0, 128, dtype=torch.bfloat16))


def test_sdd_with_no_rows_gives_zero_blocks():
    # an empty reduction (M = 0): every stored block is zero, whatever kernel would run
    layout = make_layout("random", 3, 2, 16)
    a, b = torch.zeros(layout.shape[0], 0), torch.zeros(0, layout.shape[1])
    out = kernels.sdd(a, b, layout.meta, 16, layout.block_rows, layout.block_cols)
    assert out.shape == (layout.nnz, 16, 16) and bool((out == 0).all())
