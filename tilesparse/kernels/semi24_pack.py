"""Triton kernel that writes the value region of cuSPARSELt's compressed 2:4 operand
straight from W and its mask: the kept entries of every row of W⊙M (or of (W⊙M)ᵀ), in
row-major order, two per group of four.

That is the placement the value maps decoded on the H200 (torch 2.11, cuSPARSELt 0.8;
:mod:`tilesparse.semi24.value_map`), where it is checked before this kernel is used.
It replaces the map's int32 gather index (4 bytes per kept value, per orientation) with
the mask the layer holds anyway, and reads W in tiles instead of gathering it.

Selections only: each output is the bit pattern of one input element (summed as
integers with three zeros, so -0.0 and NaN payloads survive), for 16-bit dtypes. A group
must keep exactly two entries (the caller's map checked the mask). Offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import launch
from ._tiles import cdiv


@triton.jit
def _pack_kept_rows_kernel(
    w_ptr, m_ptr, out_ptr, R, C, swr, swc, smr, smc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Operand element (r, c) is w[r * swr + c * swc] (kept if m[r * smr + c * smc]);
    out[r, j] for j < C / 2 is the (j % 2)-th kept entry of group j // 2 of row r."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < R)[:, None] & (cols < C)[None, :]
    w = tl.load(w_ptr + rows[:, None] * swr + cols[None, :] * swc, mask=ok, other=0.0)
    keep = (tl.load(m_ptr + rows[:, None] * smr + cols[None, :] * smc, mask=ok, other=0) != 0).to(tl.int32)
    bits = w.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    bits = tl.reshape(bits, (BLOCK_R, BLOCK_C // 4, 4))
    keep = tl.reshape(keep, (BLOCK_R, BLOCK_C // 4, 4))
    rank = tl.cumsum(keep, 2)  # 1 at the first kept entry of a group, 2 at the second
    first = tl.sum(tl.where((keep != 0) & (rank == 1), bits, 0), 2)
    second = tl.sum(tl.where((keep != 0) & (rank == 2), bits, 0), 2)
    pair = tl.reshape(tl.join(first, second), (BLOCK_R, BLOCK_C // 2))
    values = pair.to(tl.int16).to(w_ptr.dtype.element_ty, bitcast=True)
    half = tl.program_id(1).to(tl.int64) * (BLOCK_C // 2) + tl.arange(0, BLOCK_C // 2)
    tl.store(out_ptr + rows[:, None] * (C // 2) + half[None, :], values,
             mask=(rows < R)[:, None] & (half < C // 2)[None, :])


def pack_kept_rows(weight: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, *, transposed: bool = False,
                   block_r: int = 32, block_c: int = 128) -> torch.Tensor:
    """Write into ``out`` (contiguous, R * C / 2 elements of W's dtype) the kept values of
    W⊙M [R, C] (``transposed``: of (W⊙M)ᵀ, [C, R] read through W's strides), row by row.
    ``weight`` and ``mask`` share a shape and are 2-D; the operand's rows are 2:4."""
    rows, cols = (weight.shape[1], weight.shape[0]) if transposed else tuple(weight.shape)
    if weight.element_size() != 2 or weight.dim() != 2 or cols % 4:
        raise ValueError(f"weight must be a 2-D 16-bit tensor whose packed operand has a multiple of 4 columns, "
                         f"got {tuple(weight.shape)} {weight.dtype} (transposed={transposed})")
    if mask.shape != weight.shape or mask.device != weight.device:
        raise ValueError(f"mask must match weight: {tuple(mask.shape)} on {mask.device} against "
                         f"{tuple(weight.shape)} on {weight.device}")
    if out.dtype != weight.dtype or not out.is_contiguous() or out.numel() != rows * cols // 2:
        raise ValueError(f"out must be contiguous {weight.dtype} with {rows * cols // 2} elements, got "
                         f"{out.dtype}, {out.numel()}, contiguous={out.is_contiguous()}")
    if out.numel() == 0:
        return out
    m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    sw, sm = weight.stride(), m.stride()
    strides = (sw[1], sw[0], sm[1], sm[0]) if transposed else (sw[0], sw[1], sm[0], sm[1])
    launch(_pack_kept_rows_kernel, (cdiv(rows, block_r), cdiv(cols, block_c)),
           weight, m, out, rows, cols, *strides, BLOCK_R=block_r, BLOCK_C=block_c)
    return out


def pack_kept_rows_reference(weight: torch.Tensor, mask: torch.Tensor, *, transposed: bool = False) -> torch.Tensor:
    """The same values by ``torch.masked_select`` (row-major order of the operand)."""
    operand, keep = (weight.t(), mask.t()) if transposed else (weight, mask)
    return torch.masked_select(operand, keep)
