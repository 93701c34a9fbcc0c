"""The few-row FMA kernel of dds (``bsmm_gemv``: 1-8 activation rows, no tensor cores)
against float64 references: under the Triton interpreter on CPU (fp32 and fp16 inputs:
the kernel multiplies in fp32, so unlike tl.dot the interpreter's bf16 is right too),
and on the GPU (marked). Steps within a block (b 32-128 at 16-64 lanes) and over several
blocks (b 8-48 at 64-256 lanes), runs of zero to five entries (the loads one and two steps
ahead past a run's end are masked), both table directions, every layout class, both
accumulator forms, 1 to 8 rows; configs checked; bitwise repeatable on the GPU."""

import pytest
import torch

from bsmm_cases import LAYOUT_KINDS, TRANS_CASES, dds_against_reference, make_layout, pairwise
from tilesparse import BlockLayout
from tilesparse.kernels import bsmm, bsmm_gemv
from tolerances import assert_close

CUDA = torch.cuda.is_available()
GPU = pytest.mark.gpu


# every pair of layout class, orientation, tile and reduction mode at least once
@pytest.mark.parametrize("kind, trans, tile, reduce_each_step", pairwise(
    [(kind, kind) for kind in LAYOUT_KINDS], TRANS_CASES,
    [("b16-k64", (16, 16, 64)), ("b8-k64", (8, 16, 64)), ("b24-k128", (24, 16, 128)), ("b32-k32", (32, 32, 32)),
     ("b64-k16", (64, 32, 16)), ("b128-k64", (128, 32, 64)), ("b48-k256", (48, 16, 256)),
     ("b16-sub8-k128", (16, 8, 128)), ("b24-sub4-k32", (24, 4, 32))],
    [("acc3d", False), ("reduce", True)]))
@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
def test_gemv_matches_the_reference(kind, trans, tile, reduce_each_step):
    block_size, sub, block_k = tile
    layout = make_layout(kind, 3, 5, block_size)
    config = bsmm_gemv.GemvConfig(sub, block_k, reduce_each_step=reduce_each_step)
    dtype = torch.float16 if kind == "random" else torch.float32
    m = 3 if kind == "random" else 8
    out, expected = dds_against_reference(layout, dtype, trans, m, config, device="cpu")
    assert_close(out, expected, dtype, f"gemv {config}")


@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("run", [1, 2, 3, 5], ids=lambda n: f"run{n}")
@pytest.mark.parametrize("block_size, block_k", [(16, 64), (16, 32), (32, 16), (8, 64)],
                         ids=["b16-k64", "b16-k32", "b32-k16", "b8-k64"])
@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
def test_gemv_runs_of_few_steps(block_size, block_k, run, m):
    # block-row 0 holds `run` blocks, row 1 none, row 2 one: the loop runs 0 to a few steps,
    # and the tiles loaded ahead fall past the run's end
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, :run] = True
    mask[2, 5] = True
    layout = BlockLayout(mask, block_size)
    for trans in (True, False):
        config = bsmm_gemv.GemvConfig(16, block_k)
        out, expected = dds_against_reference(layout, torch.float32, trans, m, config, device="cpu")
        assert_close(out, expected, torch.float32, f"gemv run {run}")


def test_gemv_config_and_rows_are_checked():
    with pytest.raises(ValueError, match="block_k"):
        bsmm_gemv.GemvConfig(16, 48)
    with pytest.raises(ValueError, match="block_k"):
        bsmm_gemv.GemvConfig(16, 8)
    with pytest.raises(ValueError, match="sub"):
        bsmm_gemv.GemvConfig(2, 64)
    with pytest.raises(ValueError, match="sub"):
        bsmm_gemv.GemvConfig(12, 64)
    with pytest.raises(ValueError, match="reduce_each_step"):
        bsmm_gemv.GemvConfig(16, 64, reduce_each_step=1)
    with pytest.raises(ValueError, match="num_warps"):
        bsmm_gemv.GemvConfig(16, 64, num_warps=3)
    for bad in (-1, 257, True, 1.0):
        with pytest.raises(ValueError, match="l2_ahead"):
            bsmm_gemv.GemvConfig(16, 64, l2_ahead=bad)
    assert bsmm_gemv.GemvConfig(16, 64).l2_ahead == 0
    layout = make_layout("full", 2, 2, 16)
    a = torch.randn(9, 32)
    values = torch.randn(layout.nnz, 16, 16)
    with pytest.raises(ValueError, match="1 to 8 rows"):
        bsmm.dds(a, values, layout.meta, None, 2, 2, True, config=bsmm_gemv.GemvConfig(16, 64))
    assert bsmm_gemv.gemv_supported(8, torch.bfloat16) is None
    assert "rows" in bsmm_gemv.gemv_supported(0, torch.bfloat16)


@GPU
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("block_size, sub, block_k, reduce_each_step",
                         [(16, 16, 128, False), (16, 16, 64, False), (16, 16, 32, False), (16, 16, 512, True),
                          (32, 32, 128, False), (64, 32, 64, True), (128, 32, 128, True), (48, 16, 64, False),
                          (16, 8, 128, False), (16, 8, 64, False)],
                         ids=["b16-k128", "b16-k64", "b16-k32", "b16-k512r", "b32-k128", "b64-k64r", "b128-k128r",
                              "b48-k64", "b16-sub8-k128", "b16-sub8-k64"])
def test_gemv_on_the_gpu(block_size, sub, block_k, reduce_each_step, trans, m, dtype):
    layout = make_layout("empty_rows_cols", 6, 7, block_size)
    config = bsmm_gemv.GemvConfig(sub, block_k, reduce_each_step=reduce_each_step)
    torch.manual_seed(0)
    out, expected = dds_against_reference(layout, dtype, trans, m, config)
    assert_close(out, expected, dtype, f"gemv {config}")
    torch.manual_seed(0)
    again, _ = dds_against_reference(layout, dtype, trans, m, config)
    assert torch.equal(out, again)  # a fixed reduction order: bitwise repeatable


@GPU
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("ahead", [1, 8, 256])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("block_size, sub, block_k, reduce_each_step",
                         [(16, 16, 128, False), (16, 16, 64, False), (16, 8, 128, False), (64, 32, 64, True),
                          (128, 32, 128, True), (48, 16, 64, False)],
                         ids=["b16-k128", "b16-k64", "b16-sub8-k128", "b64-k64r", "b128-k128r", "b48-k64"])
def test_gemv_l2_prefetch_changes_no_bit(block_size, sub, block_k, reduce_each_step, m, ahead):
    # L2 prefetch hints (GemvConfig.l2_ahead, fprop) move no data into the program: bitwise the
    # kernel without them at every reach, and bprop (which ignores them) unchanged
    layout = make_layout("empty_rows_cols", 6, 7, block_size)
    plain = bsmm_gemv.GemvConfig(sub, block_k, reduce_each_step=reduce_each_step)
    hinted = bsmm_gemv.GemvConfig(sub, block_k, reduce_each_step=reduce_each_step, l2_ahead=ahead)
    for trans in (True, False):
        torch.manual_seed(0)
        out, expected = dds_against_reference(layout, torch.bfloat16, trans, m, hinted)
        torch.manual_seed(0)
        want, _ = dds_against_reference(layout, torch.bfloat16, trans, m, plain)
        assert torch.equal(out, want), trans
        assert_close(out, expected, torch.bfloat16, f"gemv l2_ahead {trans}")


@GPU
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("density", [0.5, 0.1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_dispatchers_own_choice_at_few_rows(trans, m, dtype, density):
    # no config: whatever the tuned table (on an H200, the FMA kernel at 1-4 rows, b 16,
    # with 8 warps at one row) or the heuristic picks, with bias, against float64
    from tilesparse import layouts
    from tilesparse.kernels import tuned

    layout = layouts.random(40 * 16, 24 * 16, 16, density, seed=m)
    torch.manual_seed(m)
    out, expected = dds_against_reference(layout, dtype, trans, m, None)
    assert_close(out, expected, dtype, f"dds m{m} d{density}")
    chosen = tuned.lookup("fprop" if trans else "bprop", dtype, 16, m, layout.nnz / (40 * 24), out.device,
                          tuned.weight_shape(40, 24, 16))
    if "H200" in torch.cuda.get_device_name():
        assert isinstance(chosen, bsmm_gemv.GemvConfig) == (m <= 4), chosen
        if m == 1:
            assert chosen.num_warps == 8
