"""Dense-tile variant of sdd (updat, dW = dY^T X on the layout) for small blocks: each
program computes a whole [TR, TC] tile of the dense product, a grid of blocks, with
full-width MMAs, and stores only the tile's stored blocks.

The one-block kernel (:mod:`tilesparse.kernels.bsmm`) computes each stored block alone.
At b 16 that is a 16 x 16 x BM product per step: the MMA is too narrow to run at speed
and every block re-reads its own dY^T and X slices. On the H200 updat at b 16, W 12288²,
took 0.58 ms at 128 rows and density 0.5 (dense's whole dW: ~0.09 ms) and 1.73 ms at 512
rows; the grouped kernel (:mod:`tilesparse.kernels.bsmm_sdd_group`) did not beat it
there (``bench/results/...-tune-updat-small-m-ae2565b.log``). Here a program owns the
tile of block-rows ``[tr * GR, (tr + 1) * GR)`` and block-columns ``[tc * GC, ...)``
(GR = TR / b, GC = TC / b): it skips the tile when no block of it is stored, else runs
the dense product over the reduction and writes each stored block to its slot in
``values`` (the layout's slot map, :func:`tilesparse.kernels.block_scatter.slot_map`),
the rest of the tile is discarded. The products of the layout's empty blocks inside
non-empty tiles are wasted work: at density d and GR x GC blocks a tile, about 1/d times
the useful work when tiles are mostly non-empty. That pays where the one-block kernel
runs at a small fraction of the MMA's rate (small blocks), and costs where blocks are
large or density low; measured choices live in the tuned table.

Each stored block is written by one program with its reduction in a fixed order:
bitwise deterministic. Needs a power-of-two block size no larger than the tile sides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._device import cached_table, sm_count
from ._launch import launch
from ._tiles import cdiv, check_power_of_two
from .block_scatter import slot_map

__all__ = ["SddTileConfig", "default_config", "launch_sdd_tile", "nonempty_tiles", "tile_count", "tile_grid"]


@triton.jit
def _tile_product(a_ptr, b_ptr, M, tr, tc, block_rows, block_cols, stride_ar, stride_am, stride_bm, stride_bc,
                  B: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BLOCK_M: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    """The dense [TILE_R, TILE_C] tile (tr, tc) of A @ B in fp32 (zeros past the block grid)."""
    rows = tr.to(tl.int64) * TILE_R + tl.arange(0, TILE_R)
    cols = tc.to(tl.int64) * TILE_C + tl.arange(0, TILE_C)
    offs_m = tl.arange(0, BLOCK_M).to(tl.int64)  # M-strides can be large (int64 offsets)
    rows_ok = rows < block_rows * B
    cols_ok = cols < block_cols * B
    a_ptrs = a_ptr + rows[:, None] * stride_ar + offs_m[None, :] * stride_am
    b_ptrs = b_ptr + offs_m[:, None] * stride_bm + cols[None, :] * stride_bc
    step_a = tl.full((), BLOCK_M, tl.int64) * stride_am  # int64 whether or not the stride is a constant
    step_b = tl.full((), BLOCK_M, tl.int64) * stride_bm
    acc = tl.zeros((TILE_R, TILE_C), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        m_ok = (m0 + offs_m) < M
        a = tl.load(a_ptrs, mask=rows_ok[:, None] & m_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=m_ok[:, None] & cols_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += step_a
        b_ptrs += step_b
    return acc


@triton.jit
def _tile_slots(slots_ptr, tr, tc, block_rows, block_cols, GR: tl.constexpr, GC: tl.constexpr):
    """[GR, GC] storage slots of tile (tr, tc)'s blocks, -1 where none is stored."""
    block_r = tr * GR + tl.arange(0, GR)
    block_c = tc * GC + tl.arange(0, GC)
    return tl.load(slots_ptr + block_r[:, None].to(tl.int64) * block_cols + block_c[None, :],
                   mask=(block_r < block_rows)[:, None] & (block_c < block_cols)[None, :], other=-1)


@triton.jit
def _store_stored_blocks(out_ptr, acc, slots, B: tl.constexpr, GR: tl.constexpr, GC: tl.constexpr):
    """out[slots[gr, gc]] = block (gr, gc) of the tile, for the stored blocks only. The tile
    as [GR, B, GC, B]: element (i, j) of block (gr, gc) goes to out[slots[gr, gc], i, j];
    no permute, the pointers carry the block order."""
    out = tl.reshape(acc.to(out_ptr.dtype.element_ty), (GR, B, GC, B))
    slot4 = tl.reshape(slots, (GR, 1, GC, 1))
    offs_i = tl.arange(0, B)
    out_ptrs = out_ptr + slot4.to(tl.int64) * (B * B) + offs_i[None, :, None, None] * B \
        + offs_i[None, None, None, :]
    tl.store(out_ptrs, out, mask=slot4 >= 0)


@triton.jit
def _sdd_tile_kernel(
    a_ptr, b_ptr, out_ptr, slots_ptr,
    M, block_rows, block_cols, tile_cols,
    stride_ar, stride_am, stride_bm, stride_bc,
    B: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Program (tr, tc) (one axis, row-major over tiles): out[slot] = (A @ B)[block] for
    each stored block of the tile. a [R*B, M] strided (dY^T), b [M, C*B] strided (X)."""
    GR: tl.constexpr = TILE_R // B
    GC: tl.constexpr = TILE_C // B
    pid = tl.program_id(0)
    tr = pid // tile_cols
    tc = pid % tile_cols
    slots = _tile_slots(slots_ptr, tr, tc, block_rows, block_cols, GR, GC)
    if tl.max(tl.max(slots, axis=1), axis=0) >= 0:  # else: no stored block in this tile
        acc = _tile_product(a_ptr, b_ptr, M, tr, tc, block_rows, block_cols, stride_ar, stride_am, stride_bm,
                            stride_bc, B, TILE_R, TILE_C, BLOCK_M, INPUT_PRECISION)
        _store_stored_blocks(out_ptr, acc, slots, B, GR, GC)


@triton.jit
def _sdd_tile_persistent_kernel(
    a_ptr, b_ptr, out_ptr, slots_ptr, order_ptr,
    M, block_rows, block_cols, tile_cols,
    stride_ar, stride_am, stride_bm, stride_bc,
    B: tl.constexpr, TILE_R: tl.constexpr, TILE_C: tl.constexpr, BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """As :func:`_sdd_tile_kernel`, over a fixed grid: program p takes the non-empty tiles
    p, p + P, ... of ``order`` ([count, tile ids...], see :func:`nonempty_tiles`). The loop
    over tiles and the reduction are one flattened loop, so the next tile's loads are in
    flight while this tile's blocks are stored."""
    GR: tl.constexpr = TILE_R // B
    GC: tl.constexpr = TILE_C // B
    count = tl.load(order_ptr)
    for i in tl.range(tl.program_id(0), count, tl.num_programs(0), flatten=True):
        tile = tl.load(order_ptr + 1 + i)
        tr = tile // tile_cols
        tc = tile % tile_cols
        acc = _tile_product(a_ptr, b_ptr, M, tr, tc, block_rows, block_cols, stride_ar, stride_am, stride_bm,
                            stride_bc, B, TILE_R, TILE_C, BLOCK_M, INPUT_PRECISION)
        _store_stored_blocks(out_ptr, acc, _tile_slots(slots_ptr, tr, tc, block_rows, block_cols, GR, GC), B, GR, GC)


@dataclass(frozen=True)
class SddTileConfig:
    """Launch parameters of the dense-tile sdd: a [tile_rows, tile_cols] tile of dW per
    program (a grid of blocks), ``block_m`` the reduction step. ``programs_per_sm`` 0: one
    program per tile; k > 0: a persistent grid of k programs per SM walking the non-empty
    tiles, the next tile's loads overlapping this one's stores (few rows: a short
    reduction per tile)."""

    tile_rows: int = 128
    tile_cols: int = 128
    block_m: int = 64
    num_warps: int = 8
    num_stages: int = 3
    programs_per_sm: int = 0

    def __post_init__(self):
        for name in ("tile_rows", "tile_cols", "block_m"):
            check_power_of_two(self, name, minimum=16)
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"SddTileConfig needs num_warps in 1..16 (a power of two) and num_stages >= 1, "
                             f"got {self.num_warps!r}, {self.num_stages!r}")
        if isinstance(self.programs_per_sm, bool) or not isinstance(self.programs_per_sm, int) \
                or not 0 <= self.programs_per_sm <= 8:
            raise ValueError(f"SddTileConfig.programs_per_sm must be an int in 0..8, got {self.programs_per_sm!r}")

    def fits(self, block_size: int) -> bool:
        """Whether blocks of ``block_size`` tile the program's tile: a power of two no
        larger than either side."""
        return (block_size >= 1 and block_size & (block_size - 1) == 0
                and block_size <= min(self.tile_rows, self.tile_cols))


DEFAULT_TILE = SddTileConfig()  # the tile side the defaults use (for counting programs; built once)


def default_config(m: int, block_size: int, density: float, tiles: int, sms: int,
                   capability: int) -> SddTileConfig | None:
    """The dense-tile config where it was measured faster than the one-block kernel's
    heuristic on the H200 (bf16, ``tilesparse tune`` at 80802f3 and 5af8cc4, W 12288² at
    128-512 rows, 8192x4096² and 16384x8192²: b 16 at density 0.5 / 0.25 by 1.9-7.7x, at 0.1
    from 256 rows by 1.1-1.6x; b 32 at 0.5 by 1.1-1.9x; it lost at b 32 below 0.5 and at b 64),
    else None. The density cuts sit between the buckets timed (0.2 for b 16, 0.08 from 256
    rows; 0.4 for b 32; densities between were not timed). Only where the measurements
    apply: 128 rows or more, at least one ``tiles`` per SM (``sms``; the kernel does not
    split the reduction, so small weights would leave SMs idle), and Hopper (``capability``
    9: the 3-stage 128x128 tiles take ~96 KB of shared memory). For 16-bit inputs on CUDA
    where no tuned entry applies (``bsmm.sdd`` asks)."""
    if m < 128 or tiles < sms or capability != 9:
        return None
    if block_size == 16 and (density >= 0.2 or (density >= 0.08 and m >= 256)) or block_size == 32 and density >= 0.4:
        # up to 512 rows the persistent grid (2 programs per SM) won by 1.09-1.26x (tune at 6a948e6)
        return SddTileConfig(128, 128, 32, 4, 4, programs_per_sm=2) if m <= 512 else SddTileConfig(128, 128, 64, 8, 3)
    return None


def tile_grid(block_rows: int, block_cols: int, block_size: int, config: SddTileConfig) -> tuple[int, int]:
    """(tile rows, tile columns) of the dense-tile kernel over a block grid; one program a
    tile, empty or not."""
    return cdiv(block_rows * block_size, config.tile_rows), cdiv(block_cols * block_size, config.tile_cols)


def tile_count(block_rows: int, block_cols: int, block_size: int, config: SddTileConfig) -> int:
    """Programs of the dense-tile kernel for a block grid (tiles, empty or not)."""
    tile_rows, tile_cols = tile_grid(block_rows, block_cols, block_size, config)
    return tile_rows * tile_cols


def nonempty_tiles(meta, block_rows: int, block_cols: int, block_size: int, config: SddTileConfig):
    """int32 [1 + tiles]: the number of tiles holding a stored block, then those tiles'
    row-major ids (the empty ones after them). Built on meta's device from the layout's
    slot map (a stable sort, no ``nonzero``: nothing read back to the host) once per layout
    and tile shape and remembered on ``meta`` (the first build synchronizes, as every
    cached table does)."""
    def build():
        tile_rows, tile_cols = tile_grid(block_rows, block_cols, block_size, config)
        gr, gc = config.tile_rows // block_size, config.tile_cols // block_size
        stored = slot_map(meta, block_rows, block_cols).view(block_rows, block_cols) >= 0
        padded = stored.new_zeros(tile_rows * gr, tile_cols * gc)
        padded[:block_rows, :block_cols] = stored
        busy = padded.view(tile_rows, gr, tile_cols, gc).any(dim=3).any(dim=1).flatten()
        order = torch.sort((~busy).to(torch.uint8), stable=True).indices.to(torch.int32)
        return torch.cat([busy.sum().to(torch.int32).reshape(1), order])
    key = (block_rows, block_cols, block_size, config.tile_rows, config.tile_cols)
    return cached_table(meta, "_tilesparse_sdd_tiles", key, build)


def launch_sdd_tile(a, b, values, meta, block_rows, block_cols, precision, config: SddTileConfig) -> None:
    """values[z] = (A @ B)[block z] for every stored block; a [R*b, M], b [M, C*b], values
    [nnz, b, b] (nnz > 0, M > 0), as prepared by ``bsmm.sdd``."""
    block_size = values.shape[-1]
    if not config.fits(block_size):
        raise ValueError(f"{config} needs a power-of-two block size no larger than its tile sides, got "
                         f"block size {block_size}")
    tile_rows, tile_cols = tile_grid(block_rows, block_cols, block_size, config)
    slots = slot_map(meta, block_rows, block_cols)
    shape_args = (a.shape[1], block_rows, block_cols, tile_cols, a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    meta_args = dict(B=block_size, TILE_R=config.tile_rows, TILE_C=config.tile_cols, BLOCK_M=config.block_m,
                     INPUT_PRECISION=precision, num_warps=config.num_warps, num_stages=config.num_stages)
    if config.programs_per_sm:
        order = nonempty_tiles(meta, block_rows, block_cols, block_size, config)
        programs = min(tile_rows * tile_cols, config.programs_per_sm * sm_count(a.device))
        launch(_sdd_tile_persistent_kernel, (programs,), a, b, values, slots, order, *shape_args, **meta_args)
    else:
        launch(_sdd_tile_kernel, (tile_rows * tile_cols,), a, b, values, slots, *shape_args, **meta_args)
