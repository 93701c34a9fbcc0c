"""The producer warp of the Hopper warp-specialized dK/dV kernel
(:mod:`tilesparse.kernels.attention_ws_dkdv`): per key block (or, persistent, per item of
its program's share) the key tile's K and V, then the query and output-gradient tiles of
the key block's CSC column through the ring of TMA stages (and their lse and delta by
cp.async); and the column walk's order, which the consumers follow too."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier, tma

from ._share_walk import _share_bounds, _share_item
from .attention_ws_base import _grid_item
from .bsmm_ws import _fill_stage


@gluon.jit
def _walk_position(i, start, end, kblk, M_STEPS: gl.constexpr, ATOMIC_DQ: gl.constexpr):
    """The column walk's i-th query tile (i from start * M_STEPS): in order, or with
    ATOMIC_DQ rotated to start at a place that depends on the key block, so that programs
    running at once add their dQ shares into different query tiles (adds to one address
    serialize), as ``_bwd_dkdv_kernel`` walks."""
    if ATOMIC_DQ:
        n = (end - start) * M_STEPS
        return start * M_STEPS + (i - start * M_STEPS + kblk * M_STEPS) % n
    else:
        return i


@gluon.jit
def _column_bounds(col_ptr_ptr, lh, NB, kblk):
    """[start, end): key block ``kblk``'s entries in the CSC tables of layout head ``lh``."""
    return gl.load(col_ptr_ptr + lh * NB + kblk), gl.load(col_ptr_ptr + lh * NB + kblk + 1)


@gluon.jit
def _column_tile(i, start, end, kblk, col_rows_ptr, BS: gl.constexpr, BLOCK_M: gl.constexpr,
                 ROTATE: gl.constexpr):
    """(walk position t, query block, first row) of the column walk's i-th query tile: the
    one place the producer and the consumers, which must walk alike, take it from.
    ROTATE: :func:`_walk_position`'s rotated start (the unordered atomic dQ)."""
    M_STEPS: gl.constexpr = BS // BLOCK_M
    t = _walk_position(i, start, end, kblk, M_STEPS, ROTATE)
    qblk = gl.load(col_rows_ptr + t // M_STEPS)
    return t, qblk, qblk * BS + (t % M_STEPS) * BLOCK_M


@gluon.jit
def _dkdv_ws_load(descs, bufs, bars, tables, sizes,
                  BS: gl.constexpr, BLOCK_M: gl.constexpr, STATS_SMEM: gl.constexpr, ATOMIC_DQ: gl.constexpr,
                  PERSISTENT: gl.constexpr = False, ORDERED: gl.constexpr = False, ORDERED_DQ: gl.constexpr = False):
    """Producer (one warp): per key block (PERSISTENT: per item of this program's share,
    (key block, batch * kv head), head major, round-robin or with ORDERED the schedule's
    share, :func:`_share_walk._share_bounds`), the key tile's K and V once (PERSISTENT:
    once the consumers have released the last item's, ``kv_free``), then for each query
    head of the group and each query tile of the key block's CSC column, the Q and dO tiles
    (STATS_SMEM: and the tile's lse and delta, by cp.async, zero past S; each thread's
    copies hold the stage's ready barrier open until they land)."""
    NB, BHK_OFFSET, N_BHK = sizes[4], sizes[7], sizes[11]
    ROTATE: gl.constexpr = ATOMIC_DQ != 0 and not ORDERED_DQ  # (the consumers walk alike)
    if PERSISTENT:  # (ORDERED: the balanced schedule's share)
        step = gl.to_tensor(0)
        it = 0
        first, end, stride = _share_bounds(tables[9], NB * N_BHK, ORDERED)
        for position in range(first, end, stride):
            item = _share_item(position, tables[9], ORDERED)
            step = _dkdv_ws_load_item(descs, bufs, bars, tables, sizes, item % NB, item // NB + BHK_OFFSET,
                                      step, it, BS, BLOCK_M, STATS_SMEM, ROTATE, PERSISTENT)
            it += 1
    else:  # (ORDERED: the launch-order table's entry)
        kblk, bhk = _grid_item(tables[9], NB, ORDERED)
        _dkdv_ws_load_item(descs, bufs, bars, tables, sizes, kblk, bhk + BHK_OFFSET, 0, 0,
                           BS, BLOCK_M, STATS_SMEM, ROTATE, PERSISTENT)


@gluon.jit
def _dkdv_ws_load_item(descs, bufs, bars, tables, sizes, kblk, bhk, step, it,
                       BS: gl.constexpr, BLOCK_M: gl.constexpr, STATS_SMEM: gl.constexpr, ROTATE: gl.constexpr,
                       PERSISTENT: gl.constexpr):
    """The producer's work for key block ``kblk`` of (batch * kv head) ``bhk``, its ring
    position ``step`` on (the ``it``-th item of a persistent program); returns the position
    after it."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    k_smem, v_smem, q_bufs, do_bufs, stat_bufs, dq_bufs, ds_bufs = bufs
    kv_bar, ready_bars, empty_bars, kv_free = bars[0], bars[1], bars[2], bars[5]
    col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr = tables[0], tables[1], tables[2], tables[3]
    S, H, HKV, GROUP, NB, L_HEADS, NNZ, BHK_OFFSET, DS_ROW_OFFSET, qk_scale, scale, N_BHK = sizes
    M_STEPS: gl.constexpr = BS // BLOCK_M
    step = gl.to_tensor(step)  # a literal 0 from the caller is a constexpr; the loops carry a tensor
    bz = bhk // HKV
    hkv = bhk % HKV
    if PERSISTENT:  # the consumers are done with the last item's K and V
        mbarrier.wait(kv_free, (it & 1) ^ 1)
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [bz, hkv, kblk * BS, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [bz, hkv, kblk * BS, 0], kv_bar, v_smem)
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        lh = h % L_HEADS
        start, end = _column_bounds(col_ptr_ptr, lh, NB, kblk)
        for i in range(start * M_STEPS, end * M_STEPS):
            t, qblk, row = _column_tile(i, start, end, kblk, col_rows_ptr, BS, BLOCK_M, ROTATE)
            if STATS_SMEM:
                _copy_stats(step, row, (bz * H + h).to(gl.int64) * S, S, lse_ptr, delta_ptr, stat_bufs, ready_bars,
                            empty_bars, BLOCK_M)
            _fill_stage(step, q_desc, [bz, h, row, 0], do_desc, [bz, h, row, 0], q_bufs, do_bufs, ready_bars,
                        empty_bars)
            step += 1
    return step


@gluon.jit
def _copy_stats(step, row, head_offset, S, lse_ptr, delta_ptr, stat_bufs, ready_bars, empty_bars,
                BLOCK_M: gl.constexpr):
    """Once stage ``step % STAGES`` is free: cp.async of the query tile's lse and delta
    (rows row .. row + BLOCK_M, zero past S) into it, each thread's copies tracked by the
    stage's ready barrier (an arrival that raises its pending count now and lowers it when
    they land: the phase cannot complete before them). :func:`_fill_stage`'s wait on the
    same stage then passes at once."""
    STAGES: gl.constexpr = stat_bufs.type.shape[0] // 2
    layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    s = step % STAGES
    mbarrier.wait(empty_bars.index(s), ((step // STAGES) & 1) ^ 1)
    offs = row + gl.arange(0, BLOCK_M, layout=layout)
    ok = offs < S
    async_copy.async_copy_global_to_shared(stat_bufs.index(2 * s), lse_ptr + head_offset + offs, mask=ok)
    async_copy.async_copy_global_to_shared(stat_bufs.index(2 * s + 1), delta_ptr + head_offset + offs, mask=ok)
    async_copy.mbarrier_arrive(ready_bars.index(s))
