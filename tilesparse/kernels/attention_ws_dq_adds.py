"""How the warp-specialized dK/dV kernel's dQ shares reach dQ
(:mod:`tilesparse.kernels.attention_ws_dkdv`, ``DkdvWsConfig.atomic_dq``): each share
scale · dS K is staged in shared memory and added into the fp32 dQ buffer by a TMA
reduction (:mod:`tilesparse.kernels._tma_reduce`), either by the consumer that computed
it, in whatever order the adds land (:func:`_add_share`), or (``ordered_dq``) handed to a
dQ writer warp that adds each query tile's shares in a fixed order behind semaphores
(:func:`_hand_share`, :func:`_dkdv_dq_writer`; :mod:`tilesparse.kernels._ordered_adds`).
Also the staging tiles' reuse for dK and dV's stores (``staged_stores``: :func:`_store_staged`,
after :func:`_staging_returned` in the ordered mode) and their shape and layout (host side)."""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ._ordered_adds import count_done, count_pair_done, read_turn, reads_done, wait_turn, wait_turn_from
from ._tma_reduce import async_reduce_add
from .attention_ordered_dq import LAST_SHARE_FLAG
from .attention_ws_base import _grid_item, _store_through
from .attention_ws_dkdv_load import _column_bounds, _column_tile
from .bsmm_ws import _nvmma

__all__ = ["dq_tile_cols"]

_LAST_SHARE_FLAG = gl.constexpr(LAST_SHARE_FLAG)  # (a global a kernel reads must be a constexpr)


@gluon.jit
def _add_share(dq_desc, stage, share, coord):
    """Add ``share`` (fp32 registers, the descriptor's box) into dQ through the staging
    tile ``stage`` by a TMA reduction, once the reduction issued two before (the last one
    from this tile, as a consumer alternates between two) has read it."""
    tma.store_wait(pendings=1)
    stage.reshape(share.type.shape).store(share)
    fence_async_shared()
    async_reduce_add(dq_desc, coord, stage)


@gluon.jit
def _hand_share(stage, share, full, empty, phase):
    """ORDERED_DQ: ``share`` into the staging tile once the dQ writer has freed it (its
    use ``phase``), then handed to the writer (``full``)."""
    mbarrier.wait(empty, phase ^ 1)
    stage.reshape(share.type.shape).store(share)
    fence_async_shared()
    mbarrier.arrive(full, count=1)


@gluon.jit
def _pass_share(dq_desc, dq_bufs, dq_full, dq_empty, part, scale, buf, step, coord, ROLE: gl.constexpr,
                ORDERED_DQ: gl.constexpr):
    """Consumer ROLE's share ``part * scale`` of a query tile (shared dS) on its way into dQ
    through its staging tile ``buf``: handed to the dQ writer (ORDERED_DQ, :func:`_hand_share`),
    or added here at ``coord`` (:func:`_add_share`)."""
    stage = dq_bufs.index(ROLE * 2 + buf)
    if ORDERED_DQ:
        _hand_share(stage, part * scale, dq_full.index(ROLE * 2 + buf), dq_empty.index(ROLE * 2 + buf),
                    (step // 2) & 1)
    else:
        _add_share(dq_desc, stage, part * scale, coord)


@gluon.jit
def _count_pair(sem_ptr, inc, LOOK_AHEAD: gl.constexpr):
    """The last tile's two shares (counters ``sem_ptr[0]`` and ``[1]``) landed, then counted
    by ``inc`` (0 or 1); LOOK_AHEAD: after one completion wait."""
    if LOOK_AHEAD:
        count_pair_done(sem_ptr, inc, 1)
    else:
        count_done(sem_ptr, inc, 1)
        count_done(sem_ptr + 1, inc, 1)


@gluon.jit
def _count_last_tile(sem_ptr, pending, LOOK_AHEAD: gl.constexpr, LAST_UNCOUNTED: gl.constexpr):
    """:func:`_count_pair` of the last tile; LAST_UNCOUNTED with ``pending`` 0 (no tile yet,
    or a tile whose shares were its row's last: nothing waits for their count): only
    their source tiles read, not the adds landed."""
    if LAST_UNCOUNTED:
        if pending == 0:
            reads_done(1)
        else:
            _count_pair(sem_ptr, pending, LOOK_AHEAD)
    else:
        _count_pair(sem_ptr, pending, LOOK_AHEAD)


@gluon.jit
def _dkdv_dq_writer(descs, bufs, bars, tables, sizes, BS: gl.constexpr, BLOCK_M: gl.constexpr,
                    LOOK_AHEAD: gl.constexpr = False, STAGED_STORES: gl.constexpr = False,
                    FIRST_STORE: gl.constexpr = False, LAST_UNCOUNTED: gl.constexpr = False):
    """ORDERED_DQ, a partition of one warp (FlashAttention-3's dQ writer): for the column's
    query tiles in the consumers' walk, each consumer's staging tile, once handed over, is
    added into dQ when its turn comes (the shares ranked before it counted), and counted and
    freed once it has landed, off the consumers' path.

    LOOK_AHEAD: the tile's two counters are read at the step's start, while the last tile's
    reductions complete and the consumers hand over, so where the turn has come by then no
    round trip to L2 sits between a hand-over and its reduction; the last tile's two shares
    are counted after one completion wait. STAGED_STORES: the last two staging tiles are freed
    too, once their shares have landed (the consumers store dK and dV through them).
    FIRST_STORE: a tile's share of rank 0 is stored (a TMA copy), not added, so dQ's buffer
    need not be zeroed first; the count and the order are the same. LAST_UNCOUNTED: ranks
    carry ``LAST_SHARE_FLAG`` on each row's last share, which is added but not counted."""
    dq_desc, dq_bufs, dq_full, dq_empty = descs[4], bufs[5], bars[6], bars[7]
    col_ptr_ptr, col_rows_ptr, ranks_ptr, sem_ptr = tables[0], tables[1], tables[10], tables[11]
    H, HKV, GROUP, NB, L_HEADS, BHK_OFFSET = sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[7]
    M_STEPS: gl.constexpr = BS // BLOCK_M
    DQ_N: gl.constexpr = dq_desc.block_type.shape[3]
    kblk, bhk = _grid_item(tables[9], NB, True)
    bhk = bhk + BHK_OFFSET
    bz = bhk // HKV
    hkv = bhk % HKV
    step = gl.to_tensor(0)
    last_sem = gl.to_tensor(0).to(gl.int64)
    pending = gl.to_tensor(0)
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        bh = (bz * H + h).to(gl.int64)
        start, end = _column_bounds(col_ptr_ptr, h % L_HEADS, NB, kblk)
        for i in range(start * M_STEPS, end * M_STEPS):
            t, qblk, row = _column_tile(i, start, end, kblk, col_rows_ptr, BS, BLOCK_M, False)
            rank = gl.load(ranks_ptr + t // M_STEPS)
            if LAST_UNCOUNTED:
                counted = (rank < _LAST_SHARE_FLAG).to(gl.int32)
                rank = rank & (_LAST_SHARE_FLAG - 1)
            sem = (bh * (NB * M_STEPS) + row // BLOCK_M) * 2
            buf = step % 2
            if LOOK_AHEAD:
                seen0 = read_turn(sem_ptr + sem, 1)
                seen1 = read_turn(sem_ptr + sem + 1, 1)
            # the last tile's two shares landed and counted (LAST_UNCOUNTED, a row's last: only read),
            # their staging tiles freed
            _count_last_tile(sem_ptr + last_sem, pending, LOOK_AHEAD, LAST_UNCOUNTED)
            if step > 0:
                mbarrier.arrive(dq_empty.index(1 - buf), count=1)
                mbarrier.arrive(dq_empty.index(2 + 1 - buf), count=1)
            for role in gl.static_range(2):
                mbarrier.wait(dq_full.index(role * 2 + buf), (step // 2) & 1)
                if LOOK_AHEAD:
                    if role == 0:
                        wait_turn_from(sem_ptr + sem, rank, seen0, 1)
                    else:
                        wait_turn_from(sem_ptr + sem + 1, rank, seen1, 1)
                else:
                    wait_turn(sem_ptr + sem + role, rank, 1)
                if FIRST_STORE:
                    if rank == 0:
                        tma.async_copy_shared_to_global(dq_desc, [bz, h, row, role * DQ_N],
                                                        dq_bufs.index(role * 2 + buf))
                    else:
                        async_reduce_add(dq_desc, [bz, h, row, role * DQ_N], dq_bufs.index(role * 2 + buf))
                else:
                    async_reduce_add(dq_desc, [bz, h, row, role * DQ_N], dq_bufs.index(role * 2 + buf))
            last_sem = sem
            if LAST_UNCOUNTED:
                pending = counted
            else:
                pending = gl.to_tensor(1)
            step += 1
    _count_last_tile(sem_ptr + last_sem, pending, LOOK_AHEAD, LAST_UNCOUNTED)
    if STAGED_STORES and step > 0:
        mbarrier.arrive(dq_empty.index((step - 1) % 2), count=1)
        mbarrier.arrive(dq_empty.index(2 + (step - 1) % 2), count=1)


@gluon.jit
def _staging_returned(dq_empty, ROLE: gl.constexpr, step):
    """ORDERED_DQ with STAGED_STORES: wait until the dQ writer has freed this consumer's two
    staging tiles after the last of the ``step`` shares handed through them (tile b took
    shares b, b + 2, ...; the writer frees each use once it has landed)."""
    for b in gl.static_range(2):
        uses = (step - b + 1) // 2
        if uses > 0:
            mbarrier.wait(dq_empty.index(ROLE * 2 + b), (uses - 1) & 1)


@gluon.jit
def _dkdv_staging(bufs, bars, step, ROLE: gl.constexpr, STAGED_STORES: gl.constexpr, ORDERED_DQ: gl.constexpr):
    """The two shared-memory tiles consumer ROLE stores dK and dV through once its walk of
    ``step`` tiles is done, once they are idle: STAGED_STORES 1, its dQ staging tiles (after
    its reductions have read them; ORDERED_DQ: after the dQ writer has returned them); 2,
    stage ROLE of the Q and dO ring (after every stage's last readers, :func:`_ring_drained`)."""
    q_bufs, do_bufs, dq_bufs = bufs[2], bufs[3], bufs[5]
    if STAGED_STORES == 2:
        _ring_drained(bars[2], step, q_bufs.type.shape[0])
        return q_bufs.index(ROLE), do_bufs.index(ROLE)
    else:
        if ORDERED_DQ:
            _staging_returned(bars[7], ROLE, step)
        else:
            tma.store_wait(pendings=0)
        return dq_bufs.index(ROLE * 2), dq_bufs.index(ROLE * 2 + 1)


@gluon.jit
def _ring_drained(empty_bars, step, STAGES: gl.constexpr):
    """STAGED_STORES 2: wait until every stage of the Q / dO ring has been released by all its
    readers after its last use of the ``step`` tiles walked (stage s took tiles s, s + STAGES,
    ...; no load follows in a program of one item), so its buffers may take dK and dV."""
    for s in gl.static_range(STAGES):
        uses = (step - s + STAGES - 1) // STAGES
        if uses > 0:
            mbarrier.wait(empty_bars.index(s), (uses - 1) & 1)


@gluon.jit
def _store_staged(out_ptr, tile, stage, row0, key0, S, D: gl.constexpr, KEYS: gl.constexpr,
                  out_smem_layout: gl.constexpr, num_warps: gl.constexpr):
    """Store ``tile`` (16-bit [KEYS, D], rows key0.. of the head whose first row is ``row0``;
    rows past S dropped) through the shared-memory tile ``stage`` (at least KEYS * D * 2
    bytes, idle), seen as ``out_smem_layout``: :func:`_store_through`."""
    _store_through(out_ptr, tile, stage._reinterpret(tile.dtype, [KEYS, D], out_smem_layout), row0, key0, S, D, D,
                   KEYS, num_warps)


@functools.lru_cache(maxsize=16)
def _ds_smem_layout(block_size: int, block_m: int, dtype: torch.dtype):
    """The shared-memory layout of a ``shared_ds`` dSᵀ tile [block_size keys, block_m queries]."""
    return _nvmma([block_size, block_m], dtype)


@functools.lru_cache(maxsize=16)
def _out_smem_layout(keys: int, head_dim: int, dtype: torch.dtype):
    """The shared-memory layout of a ``staged_stores`` dK or dV tile [keys, head_dim], 16-bit."""
    return _nvmma([keys, head_dim], dtype)


@functools.lru_cache(maxsize=16)
def _dq_layout(block_m: int, head_dim: int, shared_ds: bool = False):
    """The shared-memory layout of an atomic-dQ staging tile, fp32 [1, 1, block_m, <= 64]
    (with ``shared_ds``: half of the head dim)."""
    return _nvmma([1, 1, block_m, dq_tile_cols(head_dim, shared_ds)], torch.float32)


def dq_tile_cols(head_dim: int, shared_ds: bool) -> int:
    """The columns of an atomic-dQ staging tile (the kernel's DQ_N)."""
    return head_dim // 2 if shared_ds else min(64, head_dim)
