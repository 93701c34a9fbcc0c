"""The persistent warp-specialized attention forward (Hopper, Gluon).

Why: on local-1024 attention (B 4, H 16, S 8192, D 128, blocks of 128) a query block
walks ~9 key blocks, and the forward's programs take ~160 KB of shared memory each: one
per SM, so nothing overlaps a program's start (Q's load, the first K / V tiles) and end
(O / l, the stores) with another's main loop. Here one program per SM takes query tiles
in a static round-robin (consecutive tiles: the same head, neighbouring blocks, so K and
V stay in L2) and the producer warp runs ahead across tiles: Q is double-buffered and
the K / V ring flows on from one tile's row into the next, so the next tile's loads land
while the consumers finish the current one. Each tile is computed by
:func:`tilesparse.kernels.attention_ws._fwd_row`, as in the one-tile-per-program kernel:
same results, bitwise. Opt-in (``FwdWsConfig(persistent=True)``) until timed.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ._device import sm_count
from ._launch import launch
from .attention_ws import _fwd_row, _row_kv_fill
from .attention_ws_base import LOG2E, FwdWsConfig, _layouts, _qkv_descs
from .bsmm_tma import ensure_allocator
from .bsmm_ws import _alloc_ring

__all__ = ["launch_fwd_ws_persistent", "programs"]


@gluon.jit
def _tile_coords(tile, q_tiles, H, BS: gl.constexpr, BLOCK_M: gl.constexpr):
    """(query block, first row, batch, head, batch * head) of tile number ``tile``
    (tiles ordered head by head, query tiles in order within a head)."""
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    bh = tile // q_tiles
    qt = tile % q_tiles
    qblk = qt // M_SPLIT
    return qblk, qblk * BS + (qt % M_SPLIT) * BLOCK_M, bh // H, bh % H, bh


@gluon.jit
def _persistent_load(descs, bufs, bars, tables, sizes, tiles,
                     BS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Producer (one warp): for each of the program's tiles, Q into its buffer once the
    consumers have released it, then the K and V tiles of the query block's row."""
    q_desc, k_desc, v_desc = descs
    q_bufs, k_bufs, v_bufs = bufs
    q_ready, q_empty, ready_bars, empty_bars = bars
    row_ptr_ptr, row_cols_ptr = tables[0], tables[1]
    H, GROUP, NB, L_HEADS = sizes[1], sizes[2], sizes[3], sizes[4]
    n_tiles, q_tiles = tiles
    step = 0
    i = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        qblk, row0, bz, h, bh = _tile_coords(tile, q_tiles, H, BS, BLOCK_M)
        qi = i % 2
        # a Q buffer is released once per reuse; its first use finds it free
        mbarrier.wait(q_empty.index(qi), ((i // 2) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qi), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_ready.index(qi), q_bufs.index(qi))
        step = _row_kv_fill(step, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, ready_bars, empty_bars,
                            row_ptr_ptr, row_cols_ptr, GROUP, NB, L_HEADS, BS, BLOCK_N)
        i += 1


@gluon.jit
def _persistent_mma(descs, bufs, bars, tables, sizes, tiles,
                    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (the default partition): each of the program's tiles in turn
    (:func:`_fwd_row`), releasing its Q buffer after the tile's last wgmma."""
    q_bufs, k_bufs, v_bufs = bufs
    q_ready, q_empty, ready_bars, empty_bars = bars
    H = sizes[1]
    n_tiles, q_tiles = tiles
    step = 0
    i = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        qblk, row0, bz, h, bh = _tile_coords(tile, q_tiles, H, BS, BLOCK_M)
        qi = i % 2
        step = _fwd_row(q_bufs.index(qi).reshape([BLOCK_M, D]), q_ready.index(qi), (i // 2) & 1, step, qblk, row0,
                        bz, h, bh, k_bufs, v_bufs, ready_bars, empty_bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N,
                        CAUSAL, HAS_KPM, num_warps)
        mbarrier.arrive(q_empty.index(qi), count=1)  # _fwd_row's wgmma were synchronous: Q is read
        i += 1


@gluon.jit
def _fwd_ws_persistent_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kpm_ptr, row_ptr_ptr, row_cols_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale, n_tiles, q_tiles,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program p takes tiles p, p + P, p + 2P, ... of the n_tiles = B * H * q_tiles query
    tiles; descriptors as ``_fwd_ws_kernel``'s."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc, k_desc, v_desc = _qkv_descs(q_ptr, k_ptr, v_ptr, B, S, H, HKV, D, (sqb, sqh, sqs), (skb, skh, sks),
                                        (svb, svh, svs), BLOCK_M, BLOCK_N, qo_layout, kv_layout)
    q_bufs = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_ready, q_empty = _alloc_ring(2)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    descs = (q_desc, k_desc, v_desc)
    bufs = (q_bufs, k_bufs, v_bufs)
    bars = (q_ready, q_empty, ready_bars, empty_bars)
    tables = (row_ptr_ptr, row_cols_ptr, lse_ptr, kpm_ptr, o_ptr)
    sizes = (S, H, GROUP, NB, L_HEADS, qk_scale, sob, soh, sos)
    tiles = (n_tiles, q_tiles)
    gl.warp_specialize([
        (_persistent_mma, (descs, bufs, bars, tables, sizes, tiles, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM,
                           num_warps)),
        (_persistent_load, (descs, bufs, bars, tables, sizes, tiles, BS, BLOCK_M, BLOCK_N)),
    ], [1], [LOAD_REGS])


def programs(n_tiles: int, cfg: FwdWsConfig, block_size: int, head_dim: int, device) -> int:
    """Programs of the persistent launch: one per SM (the compiled kernels take the whole
    register file: 256 threads x 256 registers at block_m 64, 384 x 168 at 128), at most
    one per tile."""
    return max(1, min(n_tiles, sm_count(device)))


def launch_fwd_ws_persistent(q, k, v, out, lse, kpm, row_ptr, row_cols, nb: int, layout_heads: int,
                             block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: FwdWsConfig) -> None:
    """out [B, H, S, D] and lse [B, H, S], as ``launch_fwd_ws`` computes them."""
    B, H, S, D = q.shape
    hkv = k.shape[1]
    q_tiles = nb * (block_size // cfg.block_m)
    n_tiles = B * H * q_tiles
    qo_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, D, q.dtype)
    ensure_allocator()
    launch(_fwd_ws_persistent_kernel, (programs(n_tiles, cfg, block_size, D, q.device),),
        q, k, v, out, lse, kpm, row_ptr, row_cols,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E, n_tiles, q_tiles,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        BS=block_size, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        HAS_KPM=has_kpm, LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=cfg.block_m // 16,
    )
