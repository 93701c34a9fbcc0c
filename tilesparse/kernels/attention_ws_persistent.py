"""The persistent warp-specialized attention forward (Hopper, Gluon).

Why: on local-1024 attention (B 4, H 16, S 8192, D 128, blocks of 128) a query block
walks ~9 key blocks, and the forward's programs take ~160 KB of shared memory each: one
per SM, so nothing overlaps a program's start (Q's load, the first K / V tiles) and end
(O / l, the stores) with another's main loop. Here one program per SM takes query tiles
in a static round-robin (consecutive tiles: the same head, neighbouring blocks, so K and
V stay in L2), or where row lengths differ from the host's schedule balanced by them
(``FwdWsConfig.balanced``, :mod:`tilesparse.kernels.attention_schedule`), and the producer
warp runs ahead across tiles: Q is double-buffered and
the K / V ring flows on from one tile's row into the next, so the next tile's loads land
while the consumers finish the current one. Each tile is computed by
:func:`tilesparse.kernels.attention_ws._fwd_row`, as in the one-tile-per-program kernel:
same results, bitwise. With ``overlap`` and two consumers (below) it is the Hopper default
at blocks of 128 (:data:`tilesparse.kernels.attention_ws._WS_DEFAULTS`).

``FwdWsConfig(persistent=True, overlap=True)``: the consumers overlap each key tile's
softmax with the previous tile's P V product (FlashAttention-3's intra-warpgroup
pipelining): S_t = Q K_tᵀ and O += P_{t-1} V_{t-1} are issued as asynchronous wgmma, the
softmax of S_t runs while the second is in flight, then O is rescaled. V_t is then read
one step after K_t, so K and V come through separate rings (``_row_kv_fill_split``):
each K slot is released as soon as its S is computed. O sees the same operations in the
same order as in ``_fwd_row`` (add P_0 V_0, rescale by alpha_1, add P_1 V_1, ...): the
same results, bitwise (measured on the H200 against the Triton forward as well).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                            warpgroup_mma_wait)

from ._device import sm_count
from ._launch import launch
from .attention_schedule import persistent_schedule
from .attention_ws import _fwd_row, _softmax_step, _store_row
from ._share_walk import _share_bounds, _share_item
from .attention_ws_base import LOG2E, FwdWsConfig, _a_operand, _layouts, _qkv_descs, _row_kv_fill, _wgmma_layout
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
def _row_kv_fill_split(step, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, kv_bars, row_ptr_ptr, row_cols_ptr,
                       GROUP, NB, L_HEADS, BS: gl.constexpr, BLOCK_N: gl.constexpr):
    """As :func:`tilesparse.kernels.attention_ws_base._row_kv_fill`, K and V each through its own
    ring (``kv_bars``: K ready / empty, V ready / empty), so a K slot is refilled while the
    V loaded with it is still being read."""
    k_ready, k_empty, v_ready, v_empty = kv_bars
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    N_STEPS: gl.constexpr = BS // BLOCK_N
    step = gl.to_tensor(step)
    lh = h % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        where = [bz, h // GROUP, kblk * BS + (t % N_STEPS) * BLOCK_N, 0]
        st = step % STAGES
        free = ((step // STAGES) & 1) ^ 1  # a slot's first use finds it free
        mbarrier.wait(k_empty.index(st), free)
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, where, k_ready.index(st), k_bufs.index(st))
        mbarrier.wait(v_empty.index(st), free)
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, where, v_ready.index(st), v_bufs.index(st))
        step += 1
    return step


@gluon.jit
def _persistent_load(descs, bufs, bars, tables, sizes, tiles,
                     BS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, OVERLAP: gl.constexpr):
    """Producer (one warp): for each of the program's tiles, Q into its buffer once the
    consumers have released it, then the K and V tiles of the query block's row (one
    ring for both, or one each with OVERLAP)."""
    q_desc, k_desc, v_desc = descs
    q_bufs, k_bufs, v_bufs = bufs
    q_ready, q_empty, ready_bars, empty_bars, kv_bars = bars
    row_ptr_ptr, row_cols_ptr = tables[0], tables[1]
    H, GROUP, NB, L_HEADS = sizes[1], sizes[2], sizes[3], sizes[4]
    n_tiles, q_tiles, sched_ptr, SCHEDULED = tiles
    step = 0
    i = 0
    first, end, stride = _share_bounds(sched_ptr, n_tiles, SCHEDULED)
    for j in range(first, end, stride):
        qblk, row0, bz, h, bh = _tile_coords(_share_item(j, sched_ptr, SCHEDULED), q_tiles, H, BS, BLOCK_M)
        qi = i % 2
        # a Q buffer is released once per reuse; its first use finds it free
        mbarrier.wait(q_empty.index(qi), ((i // 2) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qi), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_ready.index(qi), q_bufs.index(qi))
        if OVERLAP:
            step = _row_kv_fill_split(step, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, kv_bars, row_ptr_ptr,
                                      row_cols_ptr, GROUP, NB, L_HEADS, BS, BLOCK_N)
        else:
            step = _row_kv_fill(step, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, ready_bars, empty_bars,
                                row_ptr_ptr, row_cols_ptr, GROUP, NB, L_HEADS, BS, BLOCK_N)
        i += 1


@gluon.jit
def _fwd_row_overlap(q, q_bar, q_phase, step, qblk, row0, bz, h, bh, k_bufs, v_bufs, kv_bars, tables, sizes,
                     BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr,
                     STAGED: gl.constexpr = False):
    """``_fwd_row`` with the softmax of key tile t under the wgmma of O += P_{t-1} V_{t-1}:
    the first tile's S is computed alone, then each step issues S_t and the previous tile's
    P V asynchronously, waits for S_t, runs its softmax, waits for P V and rescales O; the
    last tile's P V closes the row. K and V come from their own rings (``kv_bars``)."""
    k_ready, k_empty, v_ready, v_empty = kv_bars
    row_ptr_ptr, row_cols_ptr, kpm_ptr = tables[0], tables[1], tables[3]
    S, NB, L_HEADS, qk_scale = sizes[0], sizes[3], sizes[4], sizes[5]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    N_STEPS: gl.constexpr = BS // BLOCK_N
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = _wgmma_layout(D, num_warps)
    p_operand: gl.constexpr = _a_operand(o_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    step = gl.to_tensor(step)
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_ok = offs_m < S
    m_i = gl.full((BLOCK_M,), float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros((BLOCK_M,), dtype=gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros((BLOCK_M, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=s_layout)
    lh = h % L_HEADS
    first = gl.load(row_ptr_ptr + lh * NB + qblk) * N_STEPS
    last = gl.load(row_ptr_ptr + lh * NB + qblk + 1) * N_STEPS
    mbarrier.wait(q_bar, q_phase)
    if first < last:
        # the first key tile: S alone, its softmax (O is still zero: nothing to rescale)
        kblk = gl.load(row_cols_ptr + first // N_STEPS)
        offs_n = kblk * BS + (first % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        st = step % STAGES
        mbarrier.wait(k_ready.index(st), (step // STAGES) & 1)
        s = warpgroup_mma(q, k_bufs.index(st).reshape([BLOCK_N, D]).permute((1, 0)), s_zero, use_acc=False)
        mbarrier.arrive(k_empty.index(st), count=1)
        p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, kblk, qblk, offs_m, offs_n, m_ok, kpm_ptr, bz, S, qk_scale,
                                           BS, HAS_KPM, CAUSAL)
        p_prev = gl.convert_layout(p.to(dtype), p_operand)
        for t in range(first + 1, last):
            prev = step % STAGES
            prev_phase = (step // STAGES) & 1
            step += 1
            st = step % STAGES
            kblk = gl.load(row_cols_ptr + t // N_STEPS)
            offs_n = kblk * BS + (t % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            mbarrier.wait(k_ready.index(st), (step // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_bufs.index(st).reshape([BLOCK_N, D]).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_ready.index(prev), prev_phase)
            acc = warpgroup_mma(p_prev, v_bufs.index(prev).reshape([BLOCK_N, D]), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_t done; P V may still run
            mbarrier.arrive(k_empty.index(st), count=1)
            p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, kblk, qblk, offs_m, offs_n, m_ok, kpm_ptr, bz, S,
                                               qk_scale, BS, HAS_KPM, CAUSAL)
            acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_prev))
            mbarrier.arrive(v_empty.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_prev = gl.convert_layout(p.to(dtype), p_operand)
        # the last tile's P V
        st = step % STAGES
        mbarrier.wait(v_ready.index(st), (step // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_bufs.index(st).reshape([BLOCK_N, D]), acc)
        mbarrier.arrive(v_empty.index(st), count=1)
        step += 1

    _store_row(acc, m_i, l_i, offs_m, m_ok, row0, bz, h, bh, tables, sizes, D, BLOCK_M, STAGED, q, num_warps)
    return step


@gluon.jit
def _persistent_mma(descs, bufs, bars, tables, sizes, tiles,
                    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, OVERLAP: gl.constexpr,
                    CONSUMERS: gl.constexpr, ROLE: gl.constexpr, num_warps: gl.constexpr,
                    STAGED: gl.constexpr = False):
    """A consumer partition: each of the program's tiles in turn (:func:`_fwd_row`, or
    :func:`_fwd_row_overlap` with OVERLAP), releasing its Q buffer after the tile's last
    wgmma. With CONSUMERS = 2, consumer ROLE computes rows ROLE * BLOCK_M / 2 .. of each
    tile on its own (its own warpgroup, its own barrier arrivals), so that the two are not
    held in step by the partition-wide sync that precedes each arrival. STAGED: each tile's O
    leaves through this consumer's rows of its Q buffer before the buffer is released."""
    PART: gl.constexpr = BLOCK_M // CONSUMERS
    q_bufs, k_bufs, v_bufs = bufs
    q_ready, q_empty, ready_bars, empty_bars, kv_bars = bars
    H = sizes[1]
    n_tiles, q_tiles, sched_ptr, SCHEDULED = tiles
    step = 0
    i = 0
    first, end, stride = _share_bounds(sched_ptr, n_tiles, SCHEDULED)
    for j in range(first, end, stride):
        qblk, row0, bz, h, bh = _tile_coords(_share_item(j, sched_ptr, SCHEDULED), q_tiles, H, BS, BLOCK_M)
        qi = i % 2
        q = q_bufs.index(qi).reshape([BLOCK_M, D]).slice(ROLE * PART, PART)
        row0 = row0 + ROLE * PART
        if OVERLAP:
            step = _fwd_row_overlap(q, q_ready.index(qi), (i // 2) & 1, step, qblk, row0, bz, h, bh, k_bufs, v_bufs,
                                    kv_bars, tables, sizes, BS, D, PART, BLOCK_N, CAUSAL, HAS_KPM, num_warps, STAGED)
        else:
            step = _fwd_row(q, q_ready.index(qi), (i // 2) & 1, step, qblk, row0, bz, h, bh, k_bufs, v_bufs,
                            ready_bars, empty_bars, tables, sizes, BS, D, PART, BLOCK_N, CAUSAL, HAS_KPM,
                            num_warps, STAGED)
        if STAGED:  # O went through the buffer: its generic stores ordered before the next Q's TMA write
            fence_async_shared()
        mbarrier.arrive(q_empty.index(qi), count=1)  # the row's S wgmma have all been waited for: Q is read
        i += 1


@gluon.jit
def _fwd_ws_persistent_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kpm_ptr, row_ptr_ptr, row_cols_ptr, sched_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale, n_tiles, q_tiles,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr, OVERLAP: gl.constexpr = False,
    CONSUMERS: gl.constexpr = 1, MMA_REGS: gl.constexpr = 232, SCHEDULED: gl.constexpr = False,
    STAGED_STORES: gl.constexpr = False,
):
    """Program p takes tiles p, p + P, p + 2P, ... of the n_tiles = B * H * q_tiles query
    tiles, or with SCHEDULED its segment of ``sched_ptr``'s lists (``attention_schedule``);
    descriptors as ``_fwd_ws_kernel``'s. OVERLAP: softmax under the P V wgmma, K and
    V through separate rings. CONSUMERS = 2: two consumer partitions of ``num_warps`` warps
    each take half of every tile's rows (the second with MMA_REGS registers). STAGED_STORES:
    O through the consumers' rows of the Q buffer (``FwdWsConfig.staged_stores``)."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc, k_desc, v_desc = _qkv_descs(q_ptr, k_ptr, v_ptr, B, S, H, HKV, D, (sqb, sqh, sqs), (skb, skh, sks),
                                        (svb, svh, svs), BLOCK_M, BLOCK_N, qo_layout, kv_layout)
    q_bufs = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_ready, q_empty = _alloc_ring(2, CONSUMERS)
    ready_bars, empty_bars = _alloc_ring(STAGES, CONSUMERS)  # K and V together (OVERLAP: unused)
    k_ready, k_empty = _alloc_ring(STAGES, CONSUMERS)  # OVERLAP: K and V apart (else unused)
    v_ready, v_empty = _alloc_ring(STAGES, CONSUMERS)
    descs = (q_desc, k_desc, v_desc)
    bufs = (q_bufs, k_bufs, v_bufs)
    bars = (q_ready, q_empty, ready_bars, empty_bars, (k_ready, k_empty, v_ready, v_empty))
    tables = (row_ptr_ptr, row_cols_ptr, lse_ptr, kpm_ptr, o_ptr)
    sizes = (S, H, GROUP, NB, L_HEADS, qk_scale, sob, soh, sos)
    tiles = (n_tiles, q_tiles, sched_ptr, SCHEDULED)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_persistent_mma, (descs, bufs, bars, tables, sizes, tiles, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM,
                               OVERLAP, CONSUMERS, 0, num_warps, STAGED_STORES)),
            (_persistent_mma, (descs, bufs, bars, tables, sizes, tiles, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM,
                               OVERLAP, CONSUMERS, 1, num_warps, STAGED_STORES)),
            (_persistent_load, (descs, bufs, bars, tables, sizes, tiles, BS, BLOCK_M, BLOCK_N, OVERLAP)),
        ], [num_warps, 1], [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_persistent_mma, (descs, bufs, bars, tables, sizes, tiles, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM,
                               OVERLAP, CONSUMERS, 0, num_warps, STAGED_STORES)),
            (_persistent_load, (descs, bufs, bars, tables, sizes, tiles, BS, BLOCK_M, BLOCK_N, OVERLAP)),
        ], [1], [LOAD_REGS])


def programs(n_tiles: int, cfg: FwdWsConfig, block_size: int, head_dim: int, device) -> int:
    """Programs of the persistent launch: one per SM (the compiled kernels take the whole
    register file: 256 threads x 256 registers at block_m 64, 384 x 168 at 128), at most
    one per tile."""
    return max(1, min(n_tiles, sm_count(device)))


def launch_fwd_ws_persistent(q, k, v, out, lse, kpm, row_ptr, row_cols, nb: int, layout_heads: int,
                             block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: FwdWsConfig,
                             meta=None) -> None:
    """out [B, H, S, D] and lse [B, H, S], as ``launch_fwd_ws`` computes them; with
    ``cfg.balanced`` and the packed tables ``meta`` (whose views row_ptr and row_cols are),
    the programs take the tiles of the host's balanced schedule, remembered on ``meta``
    (``cfg.staged_stores``: out in q's dtype, since O goes through Q's buffers)."""
    if cfg.staged_stores and out.dtype != q.dtype:
        raise ValueError(f"cfg={cfg}: staged_stores stores O through Q's buffers: out must be {q.dtype}, "
                         f"got {out.dtype}")
    B, H, S, D = q.shape
    hkv = k.shape[1]
    q_tiles = nb * (block_size // cfg.block_m)
    n_tiles = B * H * q_tiles
    qo_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, D, q.dtype)
    ensure_allocator()
    grid = programs(n_tiles, cfg, block_size, D, q.device)
    sched = None if meta is None or not cfg.balanced else persistent_schedule(
        meta, layout_heads, nb, B, H, block_size // cfg.block_m, grid)
    launch(_fwd_ws_persistent_kernel, (grid,),
        q, k, v, out, lse, kpm, row_ptr, row_cols, row_ptr if sched is None else sched,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E, n_tiles, q_tiles,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        BS=block_size, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        HAS_KPM=has_kpm, LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=cfg.block_m // 16 // cfg.consumers, OVERLAP=cfg.overlap, CONSUMERS=cfg.consumers,
        SCHEDULED=sched is not None, STAGED_STORES=cfg.staged_stores,
    )
