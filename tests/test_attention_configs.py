"""Launch configs of the fused attention kernels (tilesparse.kernels.attention_configs):
every config fits its block, the H200-measured ones apply where they were measured, and
tensor-descriptor (TMA) loads are refused where a descriptor cannot address the tensors."""

import pytest
import torch

from tilesparse.kernels import attention as kernels


def test_tma_is_refused_where_a_descriptor_cannot_address_the_tensors():
    cfg = kernels.AttentionConfig(16, 16, tma=True)
    t = torch.randn(1, 2, 64, 32)
    assert kernels._tma_ok(cfg, 32, 32, t, t)
    assert not kernels._tma_ok(kernels.AttentionConfig(16, 16), 32, 32, t, t)  # not asked for
    assert not kernels._tma_ok(cfg, 48, 64, t, t)  # D is not the whole box
    odd = torch.randn(1, 2, 64, 33)[..., :32]  # row pitch 33 * 4 bytes: not 16-byte aligned
    assert not kernels._tma_ok(cfg, 32, 32, t, odd)
    shifted = torch.randn(2 * 64 * 32 + 1)[1:].view(1, 2, 64, 32)  # base 4 bytes past alignment
    assert not kernels._tma_ok(cfg, 32, 32, shifted, t)
    assert not kernels._tma_ok(cfg, 32, 32, t, torch.randn(1, 1, 64, 32).expand(1, 2, 64, 32))  # stride 0


def test_config_must_divide_block_size():
    with pytest.raises(ValueError, match="block_m"):
        kernels.AttentionConfig(64, 16).check(32)
    with pytest.raises(ValueError, match="block_n"):
        kernels.AttentionConfig(16, 24).check(32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_every_config_fits_its_block(dtype):
    """attention_config gives launchable tiles (powers of two >= 16 dividing b) for every
    pass, block size and head dim, and the H200-measured ones where they apply."""
    from tilesparse.kernels.attention_configs import _MEASURED, attention_config

    for kind in ("fwd", "dkdv", "dq"):
        for block in (16, 32, 64, 128):
            for head_dim in (32, 64, 96, 128):
                cfg = attention_config(kind, block, head_dim, dtype)
                cfg.check(block)
                measured = dtype != torch.float32 and head_dim > 64 and block >= 128
                assert (cfg == _MEASURED[kind]) == measured, (kind, block, head_dim, cfg)
    with pytest.raises(ValueError, match="kind"):
        attention_config("dx", 64, 64, dtype)
