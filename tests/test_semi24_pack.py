"""The row-major 2:4 packing kernel (tilesparse.kernels.semi24_pack) against its
masked_select reference: under the Triton interpreter on the CPU, and on the GPU
(marked). It only selects, so kernel and reference agree bitwise."""

from __future__ import annotations

import functools

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS
from tilesparse.kernels.semi24_pack import pack_kept_rows, pack_kept_rows_reference
from tilesparse.semi24 import transposable_mask


def _interp(test):
    return functools.reduce(lambda t, mark: mark(t), INTERPRETER_MARKS, test)


def _case(shape, dtype, device="cpu"):
    w = torch.randn(*shape, device=device).to(dtype)
    return w, transposable_mask(w)


def _pack(w, mask, transposed, **blocks):
    rows, cols = (w.shape[1], w.shape[0]) if transposed else w.shape
    out = torch.full((rows * cols // 2,), float("nan"), dtype=w.dtype, device=w.device)  # poisoned
    return pack_kept_rows(w, mask, out, transposed=transposed, **blocks)


def _bits(t):
    return t.view(torch.int16)


@_interp
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(4, 4), (8, 20), (40, 200), (64, 128)])
@pytest.mark.parametrize("transposed", [False, True], ids=["W", "WT"])
def test_kernel_equals_masked_select(dtype, shape, transposed):
    """Shapes: the minimum, tiles cut short on both sides (20 and 200 columns against
    tiles of 32 x 128), and whole tiles."""
    w, mask = _case(shape, dtype)
    got = _pack(w, mask, transposed)
    assert torch.equal(_bits(got), _bits(pack_kept_rows_reference(w, mask, transposed=transposed)))


@_interp
@pytest.mark.parametrize("transposed", [False, True], ids=["W", "WT"])
def test_special_values_keep_their_bits(transposed):
    """-0.0, infinities and NaN payloads at kept entries come through bit for bit, and
    an inf or NaN at a pruned entry leaks nowhere."""
    w, mask = _case((16, 32), torch.bfloat16)
    kept = mask.reshape(-1).nonzero().squeeze(1)
    pruned = (~mask).reshape(-1).nonzero().squeeze(1)
    specials = torch.tensor([-0.0, float("inf"), -float("inf"), float("nan")], dtype=torch.bfloat16)
    flat = w.view(-1)
    flat[kept[:4]] = specials
    flat[pruned[:4]] = specials
    payload = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)  # a NaN with a payload
    flat[kept[4]] = payload[0]
    got = _pack(w, mask, transposed)
    assert torch.equal(_bits(got), _bits(pack_kept_rows_reference(w, mask, transposed=transposed)))


@_interp
def test_strided_weight_and_other_tiles():
    """A weight seen through a transposed view (its strides, not a copy), and tile sizes
    other than the default."""
    base, _ = _case((48, 32), torch.float16)
    w = base.t()  # [32, 48], column-major
    mask = transposable_mask(w.contiguous())
    for transposed in (False, True):
        got = _pack(w, mask, transposed, block_r=16, block_c=64)
        assert torch.equal(_bits(got), _bits(pack_kept_rows_reference(w, mask, transposed=transposed)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["W", "WT"])
def test_gpu_kernel_equals_masked_select(dtype, transposed):
    w, mask = _case((4096, 1040), dtype, "cuda")  # 1040: a partial column tile
    got = _pack(w, mask, transposed)
    assert torch.equal(_bits(got), _bits(pack_kept_rows_reference(w, mask, transposed=transposed)))


@_interp
def test_uint8_and_strided_masks_and_bad_arguments():
    w, mask = _case((32, 64), torch.bfloat16)
    want = pack_kept_rows_reference(w, mask)
    assert torch.equal(_bits(_pack(w, mask.to(torch.uint8) * 3, False)), _bits(want))  # any nonzero keeps
    wide = torch.zeros(32, 128, dtype=torch.bool)
    wide[:, ::2] = mask  # a strided view of the same mask
    assert torch.equal(_bits(_pack(w, wide[:, ::2], False)), _bits(want))
    out = torch.empty(32 * 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-bit"):
        pack_kept_rows(w.float(), mask, out.float())
    with pytest.raises(ValueError, match="mask must match"):
        pack_kept_rows(w, mask[:16], out)
    with pytest.raises(ValueError, match="out must be contiguous"):
        pack_kept_rows(w, mask, out[:-1])
