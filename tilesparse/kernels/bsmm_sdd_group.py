"""Grouped variant of sdd (updat, dW = dY^T X on the layout): several stored blocks of one
block-row per program, sharing each dY^T tile.

The one-block kernel (:mod:`tilesparse.kernels.bsmm`) computes each stored block
[b, b] alone: per reduction step it loads a dY^T tile [b, BM] and an X tile [BM, b] and
runs a b x b x BM product. At b 64 that is a 64-wide MMA whose operands are re-read from
shared memory for every 64 output columns; on the H200 updat at b 64 ran at 40-43 % of
dense's rate on 16384x8192², against fprop's 65-67 % (docs/performance.md, twelfth
session), and at b 32 / 16 at 13-21 % / 4-5 %. Here a program owns up to G consecutive
stored blocks of one block-row (storage order is row-major, so they are adjacent
entries): the dY^T tile is loaded once per step and multiplied by a [BM, G*b] panel of
the G blocks' X columns (gathered by column block), one wide product instead of G narrow
ones, G times less dY traffic, and no zeros: every column of the panel is a stored
block's (a row's last group may hold fewer).

Which entries start a group is computed on the device from the packed tables, without
a host sync: entry z starts one where ``(z - row_ptr[row_of[z]]) % G == 0``. The starts
are moved to the front of a list of ``cdiv(nnz, G) + block_rows`` entries (an upper
bound on the groups) by a stable argsort; programs whose entry is not a start (the
padding past the real starts) do nothing. The list is remembered on the ``meta`` tensor
per G, like the other table views. Each stored block is written by one program, its
reduction in a fixed order: bitwise deterministic. With ``splits`` S > 1 the reduction
over M is cut in S runs, program (group, s) writes run s's fp32 partial products to a
workspace and the S partials are summed in a fixed order, still bitwise deterministic:
more programs when a layout's groups are too few to fill the GPU, as at density 0.05
where a row's dozen blocks make one group and 256 groups walk all of M. Chosen by config
(``SddGroupConfig``) or from the tuned table, until measurements make it a default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..layout import table_views
from ._device import cached_table, shared_memory_bytes
from ._alloc import new_output
from ._launch import launch
from ._tiles import cdiv, check_bools, check_power_of_two, split_runs, sum_partials, tile_for

__all__ = ["SddGroupConfig", "group_starts", "launch_sdd_group"]

MAX_PANEL = 256  # G * tile columns per program (the accumulator is [tile, G * tile] fp32)
SMEM_LIMIT = 232448  # bytes of shared memory a Hopper block may use (sm_90)


@triton.jit
def _sdd_group_kernel(
    a_ptr, b_ptr, out_ptr, starts_ptr, row_ptr_ptr, row_of_ptr, cols_ptr,
    M, m_per_split, split_stride, stride_ar, stride_am, stride_bm, stride_bc,
    B: tl.constexpr, TILE_B: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, SWAP: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Program (g, s): if starts[g] = z0 starts a group of its block-row r, computes
    out[s, z0 + j] = A[r-block, M run s] @ B[M run s, cols[z0 + j]-block] for
    j < min(G, row end - z0); the runs are m_per_split long (a multiple of BLOCK_M), and
    out's split s starts split_stride elements after split 0.

    a [R*B, M] strided (dY^T), b [M, C*B] strided (X). SWAP: each step as the transposed
    product (the panel's G*b columns as the MMA's M side, for b < 64 where the MMA's M is
    otherwise too narrow for wgmma); acc is transposed back before the stores.
    """
    z0 = tl.load(starts_ptr + tl.program_id(0))
    r = tl.load(row_of_ptr + z0)
    first = tl.load(row_ptr_ptr + r)
    last = tl.load(row_ptr_ptr + r + 1)
    if (z0 - first) % GROUP == 0:  # else: padding past the real starts
        count = tl.minimum(last - z0, GROUP)
        PANEL: tl.constexpr = GROUP * TILE_B
        offs_i = tl.arange(0, TILE_B)
        offs_g = tl.arange(0, GROUP)
        m_start = tl.program_id(1) * m_per_split
        m_end = tl.minimum(m_start + m_per_split, M)
        offs_m = tl.arange(0, BLOCK_M)
        i_ok = offs_i < B
        g_ok = offs_g < count
        cols = tl.load(cols_ptr + z0 + offs_g, mask=g_ok, other=0).to(tl.int64)
        a_ptrs = a_ptr + (r.to(tl.int64) * B + offs_i)[:, None] * stride_ar + (m_start + offs_m)[None, :] * stride_am
        # the panel as [BLOCK_M, GROUP, TILE_B]: where X is row-major, contiguous along its
        # last axis (a block's columns), so the loads stay vectorized and pipelined;
        # reshaped for the product
        b_ptrs = b_ptr + (m_start + offs_m)[:, None, None] * stride_bm \
            + (cols[None, :, None] * B + offs_i[None, None, :]) * stride_bc
        panel_ok = g_ok[None, :, None] & i_ok[None, None, :]
        if SWAP:
            acc = tl.zeros((PANEL, TILE_B), dtype=tl.float32)
        else:
            acc = tl.zeros((TILE_B, PANEL), dtype=tl.float32)
        for m0 in range(m_start, m_end, BLOCK_M):
            m_ok = (m0 + offs_m) < M
            a = tl.load(a_ptrs, mask=i_ok[:, None] & m_ok[None, :], other=0.0)
            panel = tl.reshape(tl.load(b_ptrs, mask=m_ok[:, None, None] & panel_ok, other=0.0), (BLOCK_M, PANEL))
            if SWAP:
                acc = tl.dot(tl.trans(panel), tl.trans(a), acc, input_precision=INPUT_PRECISION)
            else:
                acc = tl.dot(a, panel, acc, input_precision=INPUT_PRECISION)
            a_ptrs += BLOCK_M * stride_am
            b_ptrs += BLOCK_M * stride_bm
        if SWAP:
            acc = tl.trans(acc)  # [TILE_B, PANEL], as the store below expects
        out = tl.reshape(acc, (TILE_B, GROUP, TILE_B)).to(out_ptr.dtype.element_ty)
        out_ptrs = out_ptr + tl.program_id(1).to(tl.int64) * split_stride \
            + (z0 + offs_g).to(tl.int64)[None, :, None] * (B * B) + offs_i[:, None, None] * B + offs_i[None, None, :]
        tl.store(out_ptrs, out, mask=i_ok[:, None, None] & panel_ok)


@dataclass(frozen=True)
class SddGroupConfig:
    """Launch parameters of the grouped sdd: ``group`` stored blocks of a block-row per
    program (group * tile <= 256 columns), ``block_m`` the M step, ``swap``: each step
    as the transposed product (the panel as the MMA's M side); ``splits``: the M
    reduction cut in that many runs (fp32 partials summed in a fixed order)."""

    group: int
    block_m: int = 64
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False
    splits: int = 1

    def __post_init__(self):
        check_power_of_two(self, "group", minimum=1)
        check_power_of_two(self, "block_m")
        if isinstance(self.splits, bool) or not isinstance(self.splits, int) or self.splits < 1:
            raise ValueError(f"SddGroupConfig.splits must be a positive int, got {self.splits!r}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"SddGroupConfig needs num_warps in 1..16 (a power of two) and num_stages >= 1, "
                             f"got {self.num_warps!r}, {self.num_stages!r}")
        check_bools(self, "swap")

    def smem_bytes(self, block_size: int, itemsize: int = 2) -> int:
        """Estimated shared memory: ``num_stages - 1`` buffers of the [block_m, tile]
        dY^T tile and ``num_stages`` of the [block_m, G * tile] panel. Fitted to what sm_90
        compiles reported (fp32 b 128 G 2 at 3 stages: 262,144 B, refused on the H200;
        bf16 b 128 G 2 at 4 stages and fp32 b 64 G 4 at 3 stages ran); an estimate, not
        Triton's allocator."""
        tile = tile_for(block_size)
        a_tile = self.block_m * tile * itemsize
        return max(1, self.num_stages - 1) * a_tile + self.num_stages * self.group * a_tile

    def fits(self, block_size: int, itemsize: int = 2, limit: int = SMEM_LIMIT) -> bool:
        """Whether the panel (group x the block's tile) fits MAX_PANEL columns and the
        estimated shared memory (:meth:`smem_bytes`, ``itemsize`` bytes per input) fits
        ``limit`` bytes (default: sm_90's per-block maximum)."""
        return self.group * tile_for(block_size) <= MAX_PANEL and self.smem_bytes(block_size, itemsize) <= limit

    def check_block(self, block_size: int, itemsize: int = 2, limit: int = SMEM_LIMIT) -> None:
        """ValueError unless the panel and its shared memory fit (:meth:`fits`)."""
        tile = tile_for(block_size)
        if self.group * tile > MAX_PANEL:
            raise ValueError(f"SddGroupConfig.group={self.group} x the {tile}-wide tile of block size "
                             f"{block_size} exceeds {MAX_PANEL} columns")
        if not self.fits(block_size, itemsize, limit):
            raise ValueError(f"{self} needs ~{self.smem_bytes(block_size, itemsize)} B of shared memory at block size "
                             f"{block_size} with {itemsize}-byte inputs (limit {limit}); lower block_m or "
                             f"num_stages")


def smem_limit(device: torch.device) -> int:
    """Shared memory a block may use on ``device`` (CUDA), else sm_90's."""
    return shared_memory_bytes(device) if device.type == "cuda" else SMEM_LIMIT


_STARTS = "_tilesparse_sdd_group_starts"


def group_starts(meta: torch.Tensor, block_rows: int, block_cols: int, group: int) -> torch.Tensor:
    """int32 [min(nnz, cdiv(nnz, group) + block_rows)]: the storage entries that start a
    group of ``group`` consecutive blocks in their block-row, ascending, then other entries
    (padding the kernel skips). Built on meta's device without a host sync and remembered
    on ``meta`` (built outside CUDA graphs' private pools, complete before any stream reads
    it), except while a CUDA graph is being captured."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a positive int, got {group!r}")

    def build():
        row_ptr, row_of = table_views(meta, block_rows, block_cols, "row_ptr", "row_of")
        nnz = row_of.numel()
        entry = torch.arange(nnz, device=meta.device)
        is_start = (entry - row_ptr[row_of.long()]) % group == 0
        bound = min(nnz, cdiv(nnz, group) + block_rows)
        return torch.argsort((~is_start).to(torch.uint8), stable=True)[:bound].to(torch.int32)

    return cached_table(meta, _STARTS, (block_rows, block_cols, group), build)


def launch_sdd_group(a, b, values, meta, block_rows, block_cols, precision, config: SddGroupConfig) -> None:
    """values[z] = (A @ B)[block z] for every stored block; a [R*b, M], b [M, C*b], values
    [nnz, b, b] (nnz > 0, M > 0), as prepared by ``bsmm.sdd``."""
    block_size = values.shape[-1]
    config.check_block(block_size, a.element_size(), smem_limit(a.device))
    row_ptr, row_of, row_cols = table_views(meta, block_rows, block_cols, "row_ptr", "row_of", "row_cols")
    starts = group_starts(meta, block_rows, block_cols, config.group)
    m = a.shape[1]
    splits, m_per_split = split_runs(m, config.splits, config.block_m)
    out = values if splits == 1 else new_output(splits, *values.shape, dtype=torch.float32, device=values.device)
    launch(_sdd_group_kernel, (starts.numel(), splits),
        a, b, out, starts, row_ptr, row_of, row_cols,
        m, m_per_split, values.numel(), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        B=block_size, TILE_B=tile_for(block_size), GROUP=config.group, BLOCK_M=config.block_m, SWAP=config.swap,
        INPUT_PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if splits > 1:
        sum_partials(out, values)
