"""Block norms of a dense weight gradient, without storing the dense gradient.

``block_grad_norms(dy, x, b)`` returns G [N/b, K/b] float32 with

    G[r, c] = || (dY^T X)[r*b:(r+1)*b, c*b:(c+1)*b] ||_F,   dY [M, N], X [M, K],

i.e. the Frobenius norm of every b x b block of the dense gradient dW = dY^T X of a
linear layer y = x W^T. This is what RigL's grow step needs (the 2017 library's
``block_reduced_full_dw``): the Triton kernel keeps each output tile in registers,
reduces it to norms and writes only those, so the dense [N, K] gradient never exists.

Three layers live here, since the op is small:

* ``_block_norms_kernel`` (Triton): program (r, c) computes the [G*T, G*T] tile of
  dY^T X that covers G x G blocks (T = tile side of one block), reducing over M, then
  writes the G x G block norms;
* :func:`block_grad_norms_reference` (PyTorch): the same in chunks of block-rows, so
  at most ``_CHUNK_ELEMENTS`` elements of dW exist at any time;
* :func:`block_grad_norms`: checks, flattens leading dims, and dispatches (CUDA ->
  Triton; CPU or float64 -> the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._counts import check_count
from ..layouts.magnitude import blockwise_norms
from ._alloc import new_output
from ._launch import launch
from ._tiles import cdiv, tile_for
from .bsmm import _input_precision

__all__ = ["block_grad_norms", "block_grad_norms_reference", "block_grad_norms_triton"]

_CHUNK_ELEMENTS = 1 << 22


@triton.jit
def _block_norms_kernel(
    dy_ptr, x_ptr, out_ptr,
    M, R, C,
    stride_dym, stride_dyn, stride_xm, stride_xk,
    B: tl.constexpr, TILE_B: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Program (pid_r, pid_c) writes out[pid_r*G + g, pid_c*G + h] for g, h < G: the
    Frobenius norms of the blocks of dY^T X that its [G*TILE_B, G*TILE_B] tile covers.

    dy [M, R*B] strided, x [M, C*B] strided, out [R, C] float32 contiguous.
    Tile element t of a side belongs to block g = t // TILE_B, in-block index
    i = t % TILE_B; i >= B (blocks narrower than their power-of-two tile) and blocks
    past the grid edge are masked to zero, so they add nothing to the norms.
    """
    pid = tl.program_id(0)
    n_c = tl.cdiv(C, G)
    pid_r = pid // n_c
    pid_c = pid % n_c

    offs_t = tl.arange(0, G * TILE_B)
    in_blk = offs_t % TILE_B
    blk_r = pid_r * G + offs_t // TILE_B
    blk_c = pid_c * G + offs_t // TILE_B
    ok_r = (in_blk < B) & (blk_r < R)
    ok_c = (in_blk < B) & (blk_c < C)
    rows_n = blk_r.to(tl.int64) * B + in_blk  # int64: columns of dY
    cols_k = blk_c.to(tl.int64) * B + in_blk  # int64: columns of X
    offs_m = tl.arange(0, BLOCK_M).to(tl.int64)

    acc = tl.zeros((G * TILE_B, G * TILE_B), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        m = m0 + offs_m
        m_ok = m < M
        # dY^T tile [G*TILE_B, BLOCK_M] and X tile [BLOCK_M, G*TILE_B]
        a = tl.load(dy_ptr + m[None, :] * stride_dym + rows_n[:, None] * stride_dyn,
                    mask=ok_r[:, None] & m_ok[None, :], other=0.0)
        b = tl.load(x_ptr + m[:, None] * stride_xm + cols_k[None, :] * stride_xk,
                    mask=m_ok[:, None] & ok_c[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    sq = tl.reshape(acc * acc, (G, TILE_B, G, TILE_B))
    norms = tl.sqrt(tl.sum(tl.sum(sq, axis=3), axis=1))  # [G, G]
    offs_g = tl.arange(0, G)
    out_r = pid_r * G + offs_g
    out_c = pid_c * G + offs_g
    out_ptrs = out_ptr + out_r.to(tl.int64)[:, None] * C + out_c[None, :]
    tl.store(out_ptrs, norms, mask=(out_r < R)[:, None] & (out_c < C)[None, :])


def _group(block_size: int) -> int:
    """Blocks per tile side: power-of-two blocks under 64 share one 64-wide tile (so b = 16
    does not run 16 x 16 dots); other blocks get one (padded) tile each."""
    tile = tile_for(block_size)
    if tile != block_size:
        return 1
    return max(1, 64 // block_size)


def block_grad_norms_triton(dy: torch.Tensor, x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Launcher of the Triton kernel; dy [M, N], x [M, K] 2-D, same dtype and device."""
    m, n = dy.shape
    k = x.shape[1]
    rows, cols = n // block_size, k // block_size
    out = new_output(rows, cols, dtype=torch.float32, device=dy.device)
    if out.numel() == 0:
        return out
    if m == 0:
        return out.zero_()
    g = _group(block_size)
    tile = tile_for(block_size)
    side = g * tile
    block_m = 32 if (side >= 128 or dy.dtype == torch.float32) else 64
    grid = (cdiv(rows, g) * cdiv(cols, g),)
    launch(
        _block_norms_kernel, grid, dy, x, out,
        m, rows, cols,
        dy.stride(0), dy.stride(1), x.stride(0), x.stride(1),
        B=block_size, TILE_B=tile, G=g, BLOCK_M=block_m,
        INPUT_PRECISION=_input_precision(dy.dtype),
        num_warps=4 if side <= 64 else 8, num_stages=3,
    )
    return out


def block_grad_norms_reference(dy: torch.Tensor, x: torch.Tensor, block_size: int) -> torch.Tensor:
    """PyTorch reference: dW is computed a chunk of block-rows at a time (at most
    ``_CHUNK_ELEMENTS`` elements, or one block-row if that is larger), in float32
    (float64 for float64 input). Returns float32 (float64 for float64 input)."""
    m, n = dy.shape
    k = x.shape[1]
    b = block_size
    rows, cols = n // b, k // b
    cd = torch.float64 if dy.dtype == torch.float64 else torch.float32
    out = torch.zeros(rows, cols, dtype=cd, device=dy.device)
    if m == 0 or out.numel() == 0:
        return out
    xc = x.to(cd)
    step = max(1, _CHUNK_ELEMENTS // max(1, b * k))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        dw = dy[:, r0 * b : r1 * b].to(cd).t() @ xc  # [(r1-r0)*b, K]
        out[r0:r1] = blockwise_norms(dw, b)
    return out


def block_grad_norms(dy: torch.Tensor, x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Frobenius norms of the b x b blocks of the dense gradient dW = dY^T X.

    Args:
        dy: [..., N] gradient of a linear layer's output.
        x: [..., K] that layer's input (same leading dims as ``dy``).
        block_size: b; N and K must be multiples of it.

    Returns:
        [N/b, K/b] float32 (float64 for float64 input), on the inputs' device. CUDA
        tensors (fp16/bf16/fp32, b <= 128) run the Triton kernel, which never writes dW;
        CPU, float64 and b > 128 run the chunked reference.
    """
    if not isinstance(dy, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError("dy and x must be tensors")
    block_size = check_count("block_size", block_size, 1)
    if dy.dim() < 1 or x.dim() < 1 or dy.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"dy {tuple(dy.shape)} and x {tuple(x.shape)} must share their leading dims")
    for name, t in (("dy", dy), ("x", x)):
        if t.shape[-1] % block_size:
            raise ValueError(f"{name}.shape[-1]={t.shape[-1]} is not divisible by block_size={block_size}")
    if dy.device != x.device:
        raise ValueError(f"dy is on {dy.device} but x is on {x.device}")
    if dy.dtype != x.dtype:
        raise TypeError(f"dy is {dy.dtype} but x is {x.dtype}")
    dy2 = dy.reshape(-1, dy.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    # Tiles over 128 x 128 would not fit the fp32 accumulator in registers; those blocks
    # (rare) take the chunked reference, whose matmuls run on cuBLAS.
    if dy.device.type == "cuda" and dy.dtype != torch.float64 and tile_for(block_size) <= 128:
        return block_grad_norms_triton(dy2, x2, block_size)
    return block_grad_norms_reference(dy2, x2, block_size)
