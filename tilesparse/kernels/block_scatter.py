"""Stored blocks to a dense matrix and back, one pass over the dense bytes each.

The dense path (:mod:`tilesparse.ops.dense_dispatch`) runs a layer measured slower than
dense through cuBLAS: its blocks are scattered into a dense W for the call (forward, and
again in the backward) and the blocks' gradient is gathered from the dense dW. PyTorch's
advanced indexing on the [R, C, b, b] block view (a zero fill, then an index_put) took
~0.2-0.55 ms for a 12288² bf16 weight at density 0.1-0.5 on the H200 (fourteenth session,
``...-dense-dispatch-small-ca2277b.json``: 0.3-0.5 TB/s), more than the matmul at a few
hundred rows. Here:

- scatter: one program writes one strip of the dense matrix, ``b`` rows by ``G`` block
  columns (G * b >= 128 columns), exactly once: each block's values where the layout
  stores one, zeros elsewhere (looked up in a [R, C] slot map built once per layout and
  remembered on its tables), so the zeros cost no separate pass;
- gather: one program copies ``G`` stored blocks out of the dense matrix into their slots.

Both are copies (no arithmetic): bitwise equal to the references below. Offsets are int64
(a dense side of 2^31 elements and more is fine). On the H200 (ae2565b,
``scripts/probes/block_scatter_ab.py``, ``bench/results/2026-12-01-nvidia-h200-block-scatter-
ab-ae2565b.json``), 12288² bf16: scatter 0.55 -> 0.11 ms at density 0.5 and 0.19 -> 0.09 ms at
0.1 (3.8-4.0 TB/s), gather 0.44-0.46 -> 0.08-0.09 ms at 0.5, for blocks of 16, 32 and 128.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layout import table_views
from ._alloc import new_output
from ._device import cached_table
from ._launch import launch
from ._tiles import cdiv, next_power_of_2

__all__ = ["scatter_blocks", "gather_blocks", "scatter_reference", "gather_reference", "slot_map"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_STRIP = 128  # dense columns per program (at least): G = max(1, 128 // b) blocks


@triton.jit
def _scatter_kernel(values, slots, dense, C, n_groups, ld, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr):
    """dense[r*B + i, c*B + j] = values[slots[r, c], i, j], or 0 where slots[r, c] < 0, for
    block-row r and block-columns c of group g (pid = r * n_groups + g)."""
    pid = tl.program_id(0).to(tl.int64)
    r = pid // n_groups
    t = tl.arange(0, G * BP)  # strip column: block t // BP of the group, column t % BP in it
    c = (pid % n_groups) * G + t // BP
    j = t % BP
    col_ok = (c < C) & (j < B)
    slot = tl.load(slots + r * C + c, mask=c < C, other=-1).to(tl.int64)
    i = tl.arange(0, BP)
    row_ok = i < B
    src = values + slot[None, :] * (B * B) + i[:, None] * B + j[None, :]
    tile = tl.load(src, mask=row_ok[:, None] & (col_ok & (slot >= 0))[None, :], other=0.0)
    dst = dense + (r * B + i[:, None]) * ld + c[None, :] * B + j[None, :]
    tl.store(dst, tile, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gather_kernel(dense, row_of, col_of, values, nnz, ld, B: tl.constexpr, BP: tl.constexpr, G: tl.constexpr):
    """values[s, i, j] = dense[row_of[s]*B + i, col_of[s]*B + j] for slots s of group pid."""
    pid = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, G * BP)  # tile row: slot t // BP of the group, row t % BP of its block
    s = pid * G + t // BP
    i = t % BP
    row_ok = (s < nnz) & (i < B)
    r = tl.load(row_of + s, mask=s < nnz, other=0).to(tl.int64)
    c = tl.load(col_of + s, mask=s < nnz, other=0).to(tl.int64)
    j = tl.arange(0, BP)
    mask = row_ok[:, None] & (j < B)[None, :]
    tile = tl.load(dense + (r * B + i)[:, None] * ld + c[:, None] * B + j[None, :], mask=mask)
    tl.store(values + s[:, None] * (B * B) + i[:, None] * B + j[None, :], tile, mask=mask)


def _group(b: int) -> int:
    return max(1, _STRIP // next_power_of_2(b))


def slot_map(meta: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[rows * cols] int32: the storage slot of block (r, c) at r * cols + c, -1 where the
    layout stores none. Built on meta's device once per layout and remembered on ``meta``."""
    def build():
        row_of, row_cols = table_views(meta, rows, cols, "row_of", "row_cols")
        out = torch.full((rows * cols,), -1, dtype=torch.int32, device=meta.device)
        out[row_of.long() * cols + row_cols.long()] = torch.arange(row_of.numel(), dtype=torch.int32,
                                                                  device=meta.device)
        return out
    return cached_table(meta, "_tilesparse_slot_map", (rows, cols), build)


def scatter_reference(values: torch.Tensor, meta: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The dense [rows * b, cols * b] matrix of ``values`` [nnz, b, b] (PyTorch indexing)."""
    b = values.shape[-1]
    row_of, row_cols = table_views(meta, rows, cols, "row_of", "row_cols")
    dense = values.new_zeros(rows * b, cols * b)
    dense.view(rows, b, cols, b).permute(0, 2, 1, 3)[row_of.long(), row_cols.long()] = values
    return dense


def gather_reference(dense: torch.Tensor, meta: torch.Tensor, rows: int, cols: int, b: int) -> torch.Tensor:
    """The stored blocks [nnz, b, b] of a dense [rows * b, cols * b] matrix (PyTorch indexing)."""
    row_of, row_cols = table_views(meta, rows, cols, "row_of", "row_cols")
    return dense.reshape(rows, b, cols, b).permute(0, 2, 1, 3)[row_of.long(), row_cols.long()]


def _kernel_applies(t: torch.Tensor, interpret: bool) -> bool:
    return (t.device.type == "cuda" or interpret) and t.dtype in _DTYPES


def _warps(b: int) -> int:
    """8 warps for a 128x128 tile (128 elements a thread on 4 would spill), else 4."""
    return 8 if next_power_of_2(b) * next_power_of_2(b) * _group(b) >= 128 * 128 else 4


def scatter_blocks(values: torch.Tensor, meta: torch.Tensor, rows: int, cols: int, *,
                   interpret: bool = False) -> torch.Tensor:
    """The dense [rows * b, cols * b] matrix of ``values`` [nnz, b, b] on the packed tables
    ``meta``: the Triton kernel on CUDA for fp32 / fp16 / bf16 (``interpret``: also on the
    CPU, for the interpreter tests), the reference otherwise."""
    nnz = table_views(meta, rows, cols, "row_of")[0].numel()
    if values.dim() != 3 or values.shape[0] != nnz or values.shape[1] != values.shape[2]:
        raise ValueError(f"values must have shape (nnz={nnz}, b, b) for this layout, got {tuple(values.shape)}")
    if not _kernel_applies(values, interpret) or values.numel() == 0:
        return scatter_reference(values, meta, rows, cols)
    b = values.shape[-1]
    values = values.contiguous()
    dense = new_output(rows * b, cols * b, dtype=values.dtype, device=values.device)
    group = _group(b)
    n_groups = cdiv(cols, group)
    launch(_scatter_kernel, (rows * n_groups,), values, slot_map(meta, rows, cols), dense, cols, n_groups,
           dense.stride(0), B=b, BP=next_power_of_2(b), G=group, num_warps=_warps(b))
    return dense


def gather_blocks(dense: torch.Tensor, meta: torch.Tensor, rows: int, cols: int, b: int, *,
                  interpret: bool = False) -> torch.Tensor:
    """The stored blocks [nnz, b, b] of a dense [rows * b, cols * b] matrix (any row stride,
    unit column stride for the kernel): the Triton kernel on CUDA for fp32 / fp16 / bf16
    (``interpret``: also on the CPU), the reference otherwise."""
    if tuple(dense.shape) != (rows * b, cols * b):
        raise ValueError(f"dense must have shape {(rows * b, cols * b)} ({rows}x{cols} blocks of {b}), "
                         f"got {tuple(dense.shape)}")
    row_of, row_cols = table_views(meta, rows, cols, "row_of", "row_cols")
    nnz = row_of.numel()
    if not _kernel_applies(dense, interpret) or nnz == 0 or dense.stride(1) != 1:
        return gather_reference(dense, meta, rows, cols, b)
    values = new_output(nnz, b, b, dtype=dense.dtype, device=dense.device)
    group = _group(b)
    launch(_gather_kernel, (cdiv(nnz, group),), dense, row_of, row_cols, values, nnz, dense.stride(0),
           B=b, BP=next_power_of_2(b), G=group, num_warps=_warps(b))
    return values
