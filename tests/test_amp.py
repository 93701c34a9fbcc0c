"""Mixed precision on the CPU path: autocast (bf16, fp16) with nn.Linear's semantics and
GradScaler for fp16 (the GPU twins are in test_bsmm_gpu.py / test_lstm.py)."""

import pytest
import torch
from torch import nn

import tilesparse


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        tilesparse.BlockSparseLinear(32, 64, block_size=16, density=0.5, seed=1),
        nn.GELU(),
        tilesparse.BlockSparseLinear(64, 8, block_size=8, density=0.5, seed=2),
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_in_the_autocast_dtype_with_fp32_master_weights(dtype):
    model = _model()
    x = torch.randn(16, 32)
    with torch.autocast("cpu", dtype=dtype):
        y = model(x)
    assert y.dtype == dtype
    ref = model(x)  # fp32
    assert (y.float() - ref).norm() / ref.norm() < 2e-2
    y.float().square().mean().backward()
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_module_under_autocast(dtype):
    from tilesparse.attention import layouts as attention_layouts

    torch.manual_seed(0)
    module = tilesparse.BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, window=32, causal=True))
    x = torch.randn(2, 64, 32)
    with torch.autocast("cpu", dtype=dtype):
        y = module(x)
    assert y.dtype == dtype
    ref = module(x)  # fp32
    assert (y.float() - ref).norm() / ref.norm() < 3e-2
    y.float().square().mean().backward()
    for p in module.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_semi_sparse_linear_under_autocast(dtype):
    torch.manual_seed(0)
    layer = tilesparse.SemiSparseLinear(32, 16)
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=dtype):
        y = layer(x)
    assert y.dtype == dtype
    ref = layer(x)  # fp32
    assert (y.float() - ref).norm() / ref.norm() < 2e-2
    y.float().square().mean().backward()
    assert layer.weight.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


def test_fp16_training_with_grad_scaler():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    gen = torch.Generator().manual_seed(0)
    x, target = torch.randn(64, 32, generator=gen), torch.randn(64, 8, generator=gen)
    losses = []
    for _ in range(20):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = (model(x).float() - target).square().mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert losses[-1] < 0.9 * losses[0]
