"""Small-batch (memory-bound) variant of dds: few rows of activations, large sparse weight.

With M <= 64 rows (RNN minibatches, decoding) the product moves far more weight bytes
than it does FLOPs, so the kernel's job is to stream every nonzero block from HBM
once, with enough loads in flight to saturate it. The large-batch kernel tiles the
output as [M-tile, whole block-column]: at M = 32 it would run one program per
block-column (96 for W 12288² at b = 128: fewer than the SMs) and waste most of each
128-row tile. Here the product is computed transposed ("swap AB"),

    C^T [n_out*b, M] = op(S) [n_out*b, K] @ A^T [K, M],

so a weight slice is the tile's left operand and M is the narrow side. Each program
owns SUB output features (a slice of one block-row of op(S)) for all M, and walks the
same row/column table as the large kernel. Splitting a block-row into b / SUB slices
gives b / SUB times more programs, each streaming contiguous SUB x b pieces of the
blocks (fprop) or SUB-wide column strips of them (bprop).

Same tables, same results (bitwise deterministic: every output written once, fixed
reduction order) as :mod:`tilesparse.kernels.bsmm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._alloc import arrival_counters, new_output
from .bsmm_small_config import (CHUNK_MIN_BYTES, CHUNK_SKEW, MAX_CHUNKS, SmallConfig, auto_chunks,
                                rows_per_program, small_config, small_grid, warps_for_grid)
from ._device import cached_table
from ._l2_prefetch import (MAX_L2_AHEAD, l2_prefetch_on, prefetch_block_slices, prefetch_l2_bytes,
                           prefetch_l2_bytes_each)
from ._launch import launch
from ._pdl import let_next_kernel_start, pdl_options, wait_for_previous_kernel
from ._tiles import MAX_GRID_Y, check_fits_tile, swappable_dot, tile_for
from .dds_launch import DdsLaunch

__all__ = ["launch_dds_small", "small_launch",
           # the config and its rules, from bsmm_small_config (callers name them through this module)
           "CHUNK_MIN_BYTES", "CHUNK_SKEW", "MAX_CHUNKS", "SmallConfig", "auto_chunks", "rows_per_program",
           "small_config", "small_grid", "warps_for_grid"]


@triton.jit
def _dds_small_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    ptr_ptr, idx_ptr, slot_ptr, ws_ptr, sem_ptr, order_ptr,
    M, split_stride, chunk_len,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    SPLITS: tl.constexpr, CHUNKS: tl.constexpr, LONGEST_FIRST: tl.constexpr, SWAP: tl.constexpr,
    M_INNER: tl.constexpr, PREFETCH: tl.constexpr, TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PDL: tl.constexpr = 0, L2_AHEAD: tl.constexpr = 0, SPREAD_INDEX: tl.constexpr = False,
):
    """Program (j * SUBS + s, m-tile, split) computes C[m-tile, j*B + s*SUB + (0..SUB)] as
    acc[SUB, BLOCK_M] = sum over entries e of table j: op(V[slot e])[rows s, :] @ A[m, idx e block]^T.

    TRANS_V (fprop): op(V) = V, rows of the stored block are output features.
    not TRANS_V (bprop): op(V) = V^T, columns of the stored block are output features.
    SPLITS > 1: split p takes the p-th of SPLITS equal runs of table j's entries and
    writes its fp32 partial sum (no bias) at c + p * split_stride; the launcher adds the
    partials in a fixed order (deterministic).
    CHUNKS > 1: only long entry runs are split, in-kernel. Chunk p of table j takes the
    p-th run of max(chunk_len, ceil(len / CHUNKS)) entries; a table of at most chunk_len
    entries is one chunk and writes C directly. Chunks of a split run store fp32 partials
    in ws and count themselves on sem; the last to arrive sums the partials in chunk
    order (deterministic, whatever the arrival order), writes C and resets its counter
    to zero for the next launch.
    LONGEST_FIRST: program j * SUBS + s works on table order[j] (the tables ordered by
    run length, longest first), so when the programs take more than one wave the long
    runs start in the first.
    SWAP: each step is computed as acc^T[BLOCK_M, SUB] += A-tile^T @ op(V)-tile^T, the
    activation rows as the MMA's M side (on Hopper, wgmma needs 64 there: BLOCK_M 64
    with 32-wide slices, where the default orientation runs mma.sync); acc is transposed
    back once, before the stores, so the rest of the kernel is the same.
    M_INNER: the grid is (m-tile, j * SUBS + s, split): the m-tiles of one weight slice
    are consecutive programs, which run together and share the slice through L2.
    PREFETCH: each step's activation tile is loaded one step ahead and its block index two
    steps ahead (registers carried through the loop), so neither the index load nor the
    activation gather it feeds sits on the step's critical path; Triton's pipeliner
    streams only the weight tiles (their address needs no load, in fprop).
    PDL: the programmatic-dependent-launch mode (``tilesparse.kernels._pdl``).
    L2_AHEAD > 0: the program asks L2 for its first L2_AHEAD blocks at the start, then, at
    each block, for the one L2_AHEAD entries ahead (``tilesparse.kernels._l2_prefetch``), so
    more bytes are in flight than the shared-memory ring holds. Without slots (fprop) entry
    e's block is V[e] and each program asks for its own slice of it; with slots (bprop, whose
    programs read column strips) each block is asked for whole, by one of the SUBS programs
    that read it, its slot loaded one block ahead of the hint so nothing waits on the load.
    SPREAD_INDEX (steps over several blocks): each step's G block indices (and slots) are
    loaded once, G values, and spread over their blocks' lanes, instead of one load per
    reduction lane (BLOCK_K values, TILE_B equal ones per block).
    """
    tl.static_assert(L2_AHEAD == 0 or not HAS_SLOT or BLOCK_K <= TILE_B,
                     "L2_AHEAD with slot tables needs steps within one block")
    wait_for_previous_kernel(PDL)
    SUBS: tl.constexpr = TILE_B // SUB
    if M_INNER:
        pid = tl.program_id(1)
        m_tile = tl.program_id(0)
        m_tiles = tl.num_programs(0)
    else:
        pid = tl.program_id(0)
        m_tile = tl.program_id(1)
        m_tiles = tl.num_programs(1)
    if LONGEST_FIRST:
        j = tl.load(order_ptr + pid // SUBS)
    else:
        j = pid // SUBS
    s = pid % SUBS
    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = s * SUB + tl.arange(0, SUB)  # output features within the block
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    f_ok = offs_f < B
    start = tl.load(ptr_ptr + j)
    end = tl.load(ptr_ptr + j + 1)
    if SPLITS > 1:
        split = tl.program_id(2)
        chunk = (end - start + SPLITS - 1) // SPLITS
        start = tl.minimum(start + split * chunk, end)
        end = tl.minimum(start + chunk, end)
    n_chunks = 1
    if CHUNKS > 1:
        step = tl.maximum(chunk_len, (end - start + CHUNKS - 1) // CHUNKS)
        n_chunks = tl.maximum((end - start + step - 1) // step, 1)
        start = tl.minimum(start + tl.program_id(2) * step, end)
        end = tl.minimum(start + step, end)
    if SWAP:
        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
    else:
        acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
    if L2_AHEAD > 0:
        if HAS_SLOT:
            _prefetch_slotted_head(v_ptr, slot_ptr, s, start, end, L2_AHEAD, B, SUBS)
            slot_ahead = tl.load(slot_ptr + start + L2_AHEAD, mask=start + L2_AHEAD < end, other=0)
        else:
            prefetch_block_slices(v_ptr, s, start, end, L2_AHEAD, B, SUB)
    if BLOCK_K > TILE_B:
        # Several whole blocks per step: G consecutive entries of the table, gathered
        # along the reduction axis, so small blocks still make deep steps (a 16-deep
        # step per 16x16 block leaves too few bytes per load in flight).
        G: tl.constexpr = BLOCK_K // TILE_B
        k_in = offs_k % TILE_B
        k_ok = k_in < B
        e_off = offs_k // TILE_B
        if PREFETCH:  # the block indices two steps ahead, the activation tile one step ahead
            ok_a = k_ok & (start + e_off < end)
            if SPREAD_INDEX:
                blk_a = _per_lane(idx_ptr, start, end, G, TILE_B)
                blk_b = _per_lane(idx_ptr, start + G, end, G, TILE_B)
            else:
                blk_a = tl.load(idx_ptr + start + e_off, mask=ok_a, other=0).to(tl.int64)
                blk_b = tl.load(idx_ptr + start + G + e_off, mask=k_ok & (start + G + e_off < end),
                                other=0).to(tl.int64)
            x_next = _x_tile(a_ptr, blk_a, k_in, ok_a, offs_m, m_ok, stride_am, stride_ak, B)
        for e0 in range(start, end, G):
            e = e0 + e_off
            ok = k_ok & (e < end)
            if L2_AHEAD > 0:
                prefetch_block_slices(v_ptr, s, e0 + L2_AHEAD, end, G, B, SUB)
            if PREFETCH:
                x = x_next
                x_next = _x_tile(a_ptr, blk_b, k_in, k_ok & (e + G < end), offs_m, m_ok, stride_am, stride_ak, B)
                if SPREAD_INDEX:
                    blk_b = _per_lane(idx_ptr, e0 + 2 * G, end, G, TILE_B)
                else:
                    blk_b = tl.load(idx_ptr + e + 2 * G, mask=k_ok & (e + 2 * G < end), other=0).to(tl.int64)
            elif SPREAD_INDEX:
                blk = _per_lane(idx_ptr, e0, end, G, TILE_B)
            else:
                blk = tl.load(idx_ptr + e, mask=ok, other=0).to(tl.int64)
            if HAS_SLOT and SPREAD_INDEX:
                slot = _per_lane(slot_ptr, e0, end, G, TILE_B)
            elif HAS_SLOT:
                slot = tl.load(slot_ptr + e, mask=ok, other=0).to(tl.int64)
            else:
                slot = e.to(tl.int64)
            if PREFETCH:
                w = _w_tile(v_ptr + slot * (B * B), k_in, ok, offs_f, f_ok, B, TRANS_V)
                acc = swappable_dot(acc, w, x, SWAP, INPUT_PRECISION)
            else:
                acc = _step(acc, v_ptr + slot * (B * B), blk, k_in, ok, offs_f, f_ok, a_ptr, offs_m, m_ok, stride_am,
                            stride_ak, B, TRANS_V, SWAP, INPUT_PRECISION)
    else:
        K_STEPS: tl.constexpr = TILE_B // BLOCK_K
        t_end = end * K_STEPS
        if PREFETCH:  # the block index two steps ahead, the activation tile one step ahead
            t0 = start * K_STEPS
            blk_a = tl.load(idx_ptr + t0 // K_STEPS, mask=t0 < t_end, other=0).to(tl.int64)
            blk_b = tl.load(idx_ptr + (t0 + 1) // K_STEPS, mask=t0 + 1 < t_end, other=0).to(tl.int64)
            k_in_a = (t0 % K_STEPS) * BLOCK_K + offs_k
            x_next = _x_tile(a_ptr, blk_a, k_in_a, (k_in_a < B) & (t0 < t_end), offs_m, m_ok, stride_am, stride_ak, B)
        for t in range(start * K_STEPS, t_end):
            e = t // K_STEPS
            k_in = (t % K_STEPS) * BLOCK_K + offs_k
            k_ok = k_in < B
            if L2_AHEAD > 0:
                first_step = t % K_STEPS == 0
                e_ahead = e + L2_AHEAD
                if HAS_SLOT:  # the whole block, by the program e_ahead % SUBS of its column
                    prefetch_l2_bytes(v_ptr + slot_ahead.to(tl.int64) * (B * B),
                                      B * B * (v_ptr.dtype.element_ty.primitive_bitwidth // 8),
                                      first_step & (e_ahead < end) & (e_ahead % SUBS == s))
                    slot_ahead = tl.where(first_step, tl.load(slot_ptr + e_ahead + 1,
                                                              mask=first_step & (e_ahead + 1 < end), other=0),
                                          slot_ahead)
                else:
                    prefetch_block_slices(v_ptr, s, tl.where(first_step, e_ahead, end), end, 1, B, SUB)
            if PREFETCH:
                x = x_next
                k_in_n = ((t + 1) % K_STEPS) * BLOCK_K + offs_k
                x_next = _x_tile(a_ptr, blk_b, k_in_n, (k_in_n < B) & (t + 1 < t_end), offs_m, m_ok, stride_am,
                                 stride_ak, B)
                blk_b = tl.load(idx_ptr + (t + 2) // K_STEPS, mask=t + 2 < t_end, other=0).to(tl.int64)
            else:
                blk = tl.load(idx_ptr + e).to(tl.int64)
            if HAS_SLOT:
                slot = tl.load(slot_ptr + e).to(tl.int64)
            else:
                slot = e.to(tl.int64)
            if PREFETCH:
                w = _w_tile(v_ptr + slot * (B * B), k_in, k_ok, offs_f, f_ok, B, TRANS_V)
                acc = swappable_dot(acc, w, x, SWAP, INPUT_PRECISION)
            else:
                acc = _step(acc, v_ptr + slot * (B * B), blk, k_in, k_ok, offs_f, f_ok, a_ptr, offs_m, m_ok, stride_am,
                            stride_ak, B, TRANS_V, SWAP, INPUT_PRECISION)
    let_next_kernel_start(PDL)
    if SWAP:
        acc = tl.trans(acc)  # [SUB, BLOCK_M], as the stores below expect
    cols = j.to(tl.int64) * B + offs_f
    if SPLITS > 1:  # fp32 partial sums; bias and rounding after the fixed-order sum
        c_ptrs = c_ptr + tl.program_id(2).to(tl.int64) * split_stride + offs_m[None, :] * stride_cm \
            + cols[:, None] * stride_cn
        tl.store(c_ptrs, acc, mask=f_ok[:, None] & m_ok[None, :])
    elif CHUNKS > 1:
        chunk = tl.program_id(2)
        if n_chunks == 1:
            if chunk == 0:
                _store_output(acc, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS)
        elif chunk < n_chunks:
            tile = pid.to(tl.int64) * m_tiles + m_tile
            ws_tile = ws_ptr + tile * (CHUNKS * SUB * BLOCK_M)
            offs_ws = tl.arange(0, SUB)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
            tl.store(ws_tile + chunk * (SUB * BLOCK_M) + offs_ws, acc, cache_modifier=".cg")
            tl.debug_barrier()  # every thread's partial is stored before the count below
            arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == n_chunks - 1:  # the last chunk of this tile to finish
                total = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
                for q in range(0, n_chunks):
                    total += tl.load(ws_tile + q * (SUB * BLOCK_M) + offs_ws, cache_modifier=".cg")
                _store_output(total, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS)
                tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        _store_output(acc, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS)


@triton.jit
def _per_lane(table_ptr, first, end, G: tl.constexpr, TILE_B: tl.constexpr):
    """table[first + g] (int64; 0 at or past ``end``) of G consecutive entries, each spread
    over its block's TILE_B lanes of a step [G * TILE_B], declared constant in runs of TILE_B
    (so the gathers it addresses stay 16-byte loads): G loads where one per lane took G * TILE_B."""
    g = first + tl.arange(0, G)
    v = tl.load(table_ptr + g, mask=g < end, other=0).to(tl.int64)
    lanes = tl.reshape(tl.broadcast_to(v[:, None], (G, TILE_B)), (G * TILE_B,))
    return tl.max_constancy(lanes, [TILE_B])


@triton.jit
def _prefetch_slotted_head(v_ptr, slot_ptr, s, start, end, COUNT: tl.constexpr, B: tl.constexpr, SUBS: tl.constexpr):
    """L2 prefetch of the whole blocks V[slot[e]] of the entries e in [start, start + COUNT)
    before ``end`` that fall to this program (e % SUBS == s), in one pass over a tensor at
    least as long as the program's threads (no thread repeats another's prefetch)."""
    ELT: tl.constexpr = v_ptr.dtype.element_ty.primitive_bitwidth // 8
    e = start + tl.arange(0, HEAD_LANES)
    ok = (e < start + COUNT) & (e < end) & (e % SUBS == s)
    slots = tl.load(slot_ptr + e, mask=ok, other=0).to(tl.int64)
    prefetch_l2_bytes_each(v_ptr + slots * (B * B), B * B * ELT, ok)


@triton.jit
def _step(acc, v_base, blk, k_in, k_ok, offs_f, f_ok, a_ptr, offs_m, m_ok, stride_am, stride_ak, B: tl.constexpr,
          TRANS_V: tl.constexpr, SWAP: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """acc += op(V)[features, k] @ A[m, blk * B + k]^T over one reduction step (SWAP: its
    transpose, acc[m, features] += A[m, k] @ op(V)[features, k]^T). v_base and blk are one
    block's (scalars) or, for steps over several blocks, each k lane's."""
    w = _w_tile(v_base, k_in, k_ok, offs_f, f_ok, B, TRANS_V)
    x = _x_tile(a_ptr, blk, k_in, k_ok, offs_m, m_ok, stride_am, stride_ak, B)
    return swappable_dot(acc, w, x, SWAP, INPUT_PRECISION)


@triton.jit
def _w_tile(v_base, k_in, k_ok, offs_f, f_ok, B: tl.constexpr, TRANS_V: tl.constexpr):
    """op(V)[features, k] of one step: V[f, k] (TRANS_V) or V[k, f]."""
    if TRANS_V:
        w = tl.load(v_base + offs_f[:, None] * B + k_in[None, :], mask=f_ok[:, None] & k_ok[None, :], other=0.0)
    else:
        w = tl.load(v_base + k_in[None, :] * B + offs_f[:, None], mask=f_ok[:, None] & k_ok[None, :], other=0.0)
    return w


@triton.jit
def _x_tile(a_ptr, blk, k_in, k_ok, offs_m, m_ok, stride_am, stride_ak, B: tl.constexpr):
    """A[m, blk * B + k]^T of one step, [k, m] (zeros where k or m is out of range)."""
    return tl.load(a_ptr + offs_m[None, :] * stride_am + (blk * B + k_in)[:, None] * stride_ak,
                   mask=k_ok[:, None] & m_ok[None, :], other=0.0)


@triton.jit
def _store_output(acc, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS: tl.constexpr):
    """C[offs_m, cols] = acc^T (+ bias), rounded to C's dtype."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=f_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + offs_m[None, :] * stride_cm + cols[:, None] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=f_ok[:, None] & m_ok[None, :])


HEAD_LANES: tl.constexpr = tl.constexpr(max(MAX_L2_AHEAD, 256))  # every reach, and >= the threads of 8 warps


def _longest_first(ptr: torch.Tensor) -> torch.Tensor:
    """The tables of ``ptr`` ordered by run length, longest first (stable), int32; built on
    ptr's device without a host sync and remembered on the ptr tensor (layout tables are
    never written after they are built; built outside CUDA graphs' private pools), except
    inside a CUDA-graph capture."""
    return cached_table(ptr, "_tilesparse_longest_first", None, lambda: torch.argsort(
        ptr[1:] - ptr[:-1], descending=True, stable=True).to(torch.int32))


def launch_dds_small(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, config: SmallConfig):
    """C = A @ op(S) (+ bias) for few rows of A; arguments as prepared by bsmm.dds. Returns the
    :class:`~tilesparse.kernels.dds_launch.DdsLaunch` it ran, for more products of activations
    shaped and strided as ``a``."""
    return small_launch(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, config).first(c)


def small_launch(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, config: SmallConfig) -> DdsLaunch:
    """The small kernel's launch for one weight and activations shaped and strided as ``a``, built
    (workspaces made) but not run."""
    b = values.shape[-1]
    tile = tile_for(b)
    cfg = config
    check_fits_tile(cfg, tile, "sub")  # block_k may span several blocks
    m = a.shape[0]
    # the splits' fp32 partials, summed after the launch
    partials = None if cfg.splits == 1 else new_output(cfg.splits, m, c.shape[1], dtype=torch.float32,
                                                       device=c.device)
    out = c if partials is None else partials
    grid = small_grid(n_out, b, m, cfg)
    m_inner = cfg.m_inner and grid[0] <= MAX_GRID_Y  # the slices on the grid's y axis only where they fit
    if m_inner:
        grid = (grid[1], grid[0], grid[2])
    ws = sem = ptr  # placeholders: only the chunked mode reads them
    chunk_len = 0
    if cfg.chunks > 1:
        tiles = grid[0] * grid[1]
        chunk_len = max(1, -(-idx.numel() // max(n_out, 1)))  # the mean run, rounded up
        # one [sub, block_m] fp32 partial per chunk of every tile (only split runs write
        # theirs; NaN-poisoned under TILESPARSE_POISON=1, so a partial read unwritten shows)
        ws = new_output(tiles * cfg.chunks * cfg.sub * cfg.block_m, dtype=torch.float32, device=c.device)
        sem = arrival_counters(c.device, tiles)
    args = (
        a, values, bias if bias is not None else out, out,
        ptr, idx, slot if slot is not None else ptr, ws, sem, _longest_first(ptr) if cfg.longest_first else ptr,
        m, out.stride(0) if cfg.splits > 1 else 0, chunk_len,
        a.stride(0), a.stride(1), out.stride(-2), out.stride(-1))
    kwargs = dict(
        B=b, TILE_B=tile, SUB=cfg.sub, BLOCK_K=cfg.block_k, BLOCK_M=cfg.block_m, SPLITS=cfg.splits,
        CHUNKS=cfg.chunks, LONGEST_FIRST=cfg.longest_first, SWAP=cfg.swap, M_INNER=m_inner, PREFETCH=cfg.prefetch,
        TRANS_V=trans_v, HAS_SLOT=slot is not None,
        HAS_BIAS=bias is not None, INPUT_PRECISION=precision,
        L2_AHEAD=cfg.l2_ahead if cfg.l2_ahead and (slot is None or cfg.block_k <= tile) and l2_prefetch_on(values)
        else 0,
        SPREAD_INDEX=cfg.spread_index and cfg.block_k > tile,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_options(c))
    return DdsLaunch(_dds_small_kernel, grid, args, kwargs, bias, partials, _module_launch)


def _module_launch(*args, **kwargs) -> None:
    """This module's ``launch``, looked up at call time (tests replace it)."""
    launch(*args, **kwargs)
