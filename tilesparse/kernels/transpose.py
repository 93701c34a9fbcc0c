"""A 2-D transposing copy: ``out = t.t().contiguous()`` for a row-major ``t``, by tiles.

TF32 tensor cores read their operands K-major only, so the TF32 updat (sdd) copies both
activations into M-contiguous form first. PyTorch's copy of a transposed view moved
fp32 [8192, 4096] in 0.24 ms on the H200 (about 1.1 TB/s of its ~4.2 TB/s; eleventh
session, ``scripts/probes/sdd_splits.py``): two of them were 0.49 of TF32 updat's
0.61 ms at density 0.05. A tile is read along its rows and written along its columns,
both coalesced (Triton stages the transpose through shared memory).

Measured on the H200 (twelfth session, ``scripts/probes/transpose_copy.py``, CUDA-graph
replay): fp32 [8192, 4096] 0.243 -> 0.069 ms (3.9 TB/s), bf16 0.220 -> 0.037 ms; TF32
updat at density 0.5 / 0.1 / 0.05 0.89 / 0.61 / 0.61 -> 0.57 / 0.27 / 0.27 ms, bitwise
equal (predicted ~0.08-0.10 ms per copy, updat ~0.3 ms). ``bsmm.sdd`` uses it by default
(``bsmm.TILED_TF32_COPIES``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._alloc import new_output
from ._launch import launch
from ._tiles import cdiv

__all__ = ["transpose_contiguous", "transpose_tiled", "transpose_reference"]

_TILE = 64
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _transpose_kernel(src, dst, rows, cols, src_stride, dst_stride, TILE: tl.constexpr):
    """dst[c, r] = src[r, c] for one TILE x TILE tile (a 1-D grid: CUDA caps grid axes 1-2
    at 65535); offsets in int64 (a side may pass 2^31 elements)."""
    col_tiles = tl.cdiv(cols, TILE)
    pid = tl.program_id(0).to(tl.int64)
    r = (pid // col_tiles) * TILE + tl.arange(0, TILE)
    c = (pid % col_tiles) * TILE + tl.arange(0, TILE)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    tile = tl.load(src + r[:, None] * src_stride + c[None, :], mask=mask)
    tl.store(dst + c[None, :] * dst_stride + r[:, None], tile, mask=mask)


def transpose_reference(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous()


def transpose_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t.t().contiguous()`` for a 2-D tensor: the Triton kernel on CUDA for a row-major
    ``t`` (unit column stride) of a floating dtype the kernels use, PyTorch's copy
    otherwise (CPU, other strides or dtypes)."""
    if t.dim() != 2:
        raise ValueError(f"t must be 2-D, got shape {tuple(t.shape)}")
    rows, cols = t.shape
    if t.device.type != "cuda" or t.stride(1) != 1 or t.numel() == 0 or t.dtype not in _DTYPES:
        return transpose_reference(t)
    return transpose_tiled(t)


def transpose_tiled(t: torch.Tensor) -> torch.Tensor:
    """The kernel itself, for a row-major 2-D ``t`` on any device (no fallback; the CPU
    tests run it under TRITON_INTERPRET=1)."""
    rows, cols = t.shape
    out = new_output(cols, rows, dtype=t.dtype, device=t.device)
    launch(_transpose_kernel, (cdiv(rows, _TILE) * cdiv(cols, _TILE),),
        t, out, rows, cols, t.stride(0), out.stride(0), TILE=_TILE, num_warps=4)
    return out
