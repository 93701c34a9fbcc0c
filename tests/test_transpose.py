"""The tiled transposing copy (tilesparse.kernels.transpose) that makes TF32 updat's
activations M-contiguous: exact (a copy, no arithmetic) against ``t.t().contiguous()``,
on ragged shapes, every dtype, under the interpreter and on the GPU; and TF32 updat,
whose M-strided operands it is written to copy, against a float64 reference."""

import pytest
import torch

from tilesparse.kernels import transpose as tr

SHAPES = [(1, 1), (64, 64), (65, 130), (200, 33), (0, 7), (3, 300)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transpose_kernel_interpreter_is_exact(shape, dtype):
    t = torch.randn(*shape).to(dtype)
    if t.numel() == 0:
        pytest.skip("the launcher returns early on empty tensors")
    out = tr.transpose_tiled(t)
    assert out.is_contiguous() and out.shape == (shape[1], shape[0])
    assert torch.equal(out, t.t().contiguous())


def test_transpose_contiguous_falls_back_off_gpu_and_for_other_strides():
    t = torch.randn(40, 24)
    assert torch.equal(tr.transpose_contiguous(t), t.t().contiguous())
    strided = torch.randn(24, 40).t()  # unit row stride: PyTorch's copy
    assert torch.equal(tr.transpose_contiguous(strided), strided.t().contiguous())
    with pytest.raises(ValueError, match="2-D"):
        tr.transpose_contiguous(torch.randn(2, 3, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(4096, 8192 + 3)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transpose_kernel_gpu_is_exact(shape, dtype):
    t = torch.randn(*shape, device="cuda").to(dtype)
    out = tr.transpose_contiguous(t)
    assert out.is_contiguous() and out.shape == (shape[1], shape[0])
    assert torch.equal(out, t.t().contiguous())
    wide = torch.randn(shape[0], shape[1] + 5, device="cuda").to(dtype)[:, 2:shape[1] + 2]  # a row stride > cols
    assert torch.equal(tr.transpose_contiguous(wide), wide.t().contiguous())


@pytest.mark.gpu
@pytest.mark.parametrize("tiled", [False, True], ids=["torch-copies", "tiled-copies"])
@pytest.mark.parametrize("block_size", [32, 64, 128], ids=lambda b: f"b{b}")
def test_tf32_updat_matches_reference(block_size, tiled, monkeypatch):
    # dW = dY^T X on the layout in TF32: both operands are M-strided views, copied
    # M-contiguous by PyTorch or by the tiled kernel (bsmm.TILED_TF32_COPIES)
    from tilesparse import layouts
    from tilesparse.kernels import bsmm

    monkeypatch.setattr(bsmm, "TILED_TF32_COPIES", tiled)

    m, n, k = 777, 4 * block_size, 6 * block_size
    layout = layouts.random(n, k, block_size, 0.5, seed=1)
    dy = torch.randn(m, n, device="cuda")
    x = torch.randn(m, k, device="cuda")
    meta = layout.meta_on("cuda")
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        got = bsmm.sdd(dy.t(), x, meta, block_size, layout.block_rows, layout.block_cols)
    finally:
        torch.set_float32_matmul_precision(previous)
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    rel = ((got.double().cpu() - expected).norm() / expected.norm()).item()
    assert rel < 5e-3, rel
