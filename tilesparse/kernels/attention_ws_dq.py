"""The Hopper (sm90) warp-specialized dQ kernel of the fused block-sparse attention's
deterministic backward, in Gluon: per query tile, one producer warp streams K and V along
the query block's CSR row (:func:`attention_ws_base._row_ws_load`) and one or two consumer
warpgroups compute S, P, dP, dS and dQ += dS K in the order of the Triton kernel
``_bwd_dq_kernel`` (bitwise deterministic). Configs and defaults:
:mod:`tilesparse.kernels.attention_ws`; tests: ``tests/test_attention_ws_gpu.py``."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from ._device import sm_count
from ._launch import launch
from .attention_launch_order import launch_order
from .attention_ws_base import (LOG2E, DqWsConfig, _a_operand, _backward_descs, _grid_item, _head_desc, _layouts,
                                _needs_mask, _one_shot_barrier, _row_keep, _row_ws_load, _wgmma_layout,
                                _store_through, host_backward_descs, host_head_desc, tma_operand_reason)
from .bsmm_tma import ensure_allocator  # the device-built descriptors' scratch
from .bsmm_ws import _alloc_ring

__all__ = ["launch_dq_ws", "out_reason"]


@gluon.jit
def _dq_ws_mma(descs, bufs, bars, tables, sizes,
               BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, CONSUMERS: gl.constexpr, ROLE: gl.constexpr,
               OVERLAP: gl.constexpr, num_warps: gl.constexpr, ORDERED: gl.constexpr = False,
               DELTA: gl.constexpr = False, STAGED_STORES: gl.constexpr = False):
    """A consumer partition (16 query rows per warp): per key tile S = Q Kᵀ, P, dP = dO Vᵀ,
    dS, dQ += dS K (dS from registers), synchronous wgmma (OVERLAP: S and dP asynchronous,
    below); then dQ * scale stored with
    masks (rows past S are not written). With CONSUMERS = 2, consumer ROLE takes rows
    ROLE * BLOCK_M / 2 .. of the tile, on its own warpgroup and barrier arrivals.
    OVERLAP: S and dP are issued together as asynchronous wgmma and P is computed under
    dP's (the same products in the same order: bitwise the synchronous consumer's).
    ORDERED: the program's tile from the launch-order table (``tables[6]``). DELTA: the
    rows' delta = rowsum(dO · O), from the O tile the producer loads into shared memory
    after Q and dO (``bufs[4]``, barrier ``bars[3]``) and the dO tile, before the walk (in
    the walk, with S and dP live, it spilled), written to ``delta_ptr`` for the dK/dV
    kernel (see :func:`_rows_delta`) instead of read from it. STAGED_STORES: dQ leaves through
    this consumer's own rows of the Q tile, idle after its last wgmma, in 16-byte stores."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs, o_smem = bufs
    q_bar, ready_bars, empty_bars, o_bar = bars
    row_ptr_ptr, row_cols_ptr, lse_ptr, delta_ptr, kpm_ptr, dq_ptr, order_ptr = tables
    S, H, GROUP, NB, L_HEADS, qk_scale, scale = sizes
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    N_STEPS: gl.constexpr = BS // BLOCK_N
    ROWS: gl.constexpr = BLOCK_M // CONSUMERS  # this consumer's query rows
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = _wgmma_layout(D, num_warps)
    ds_operand: gl.constexpr = _a_operand(o_layout)
    pid, bh = _grid_item(order_ptr, NB * M_SPLIT, ORDERED)
    qblk = pid // M_SPLIT
    bz = bh // H
    row0 = qblk * BS + (pid % M_SPLIT) * BLOCK_M + ROLE * ROWS
    offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    m_ok = offs_m < S
    lse = gl.load(lse_ptr + bh.to(gl.int64) * S + offs_m, mask=m_ok, other=0.0)
    lse = gl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634
    if not DELTA:
        delta = gl.load(delta_ptr + bh.to(gl.int64) * S + offs_m, mask=m_ok, other=0.0)
    dq = gl.zeros((ROWS, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((ROWS, BLOCK_N), dtype=gl.float32, layout=s_layout)
    lh = (bh % H) % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([BLOCK_M, D]).slice(ROLE * ROWS, ROWS)
    do = do_smem.reshape([BLOCK_M, D]).slice(ROLE * ROWS, ROWS)
    if DELTA:  # (while the first K and V tiles land)
        mbarrier.wait(o_bar, 0)
        o = o_smem.reshape([BLOCK_M, D]).slice(ROLE * ROWS, ROWS)
        delta = gl.convert_layout(_rows_delta(o, do, row0, delta_ptr + bh.to(gl.int64) * S, S, ROWS, D, num_warps),
                                  gl.SliceLayout(1, s_layout))
    step = 0
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        offs_n = kblk * BS + (t % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = step % STAGES
        mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
        k = k_bufs.index(s).reshape([BLOCK_N, D])
        v = v_bufs.index(s).reshape([BLOCK_N, D])
        if OVERLAP:
            s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s_qk = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        else:
            s_qk = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False)
        p = gl.exp2(s_qk * qk_scale - lse[:, None])
        if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
            p = gl.where(_row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM, CAUSAL), p, 0.0)
        if OVERLAP:
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        else:
            dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False)
        ds = p * (dp - delta[:, None])
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), ds_operand), k, dq)
        mbarrier.arrive(empty_bars.index(s), count=1)  # every wgmma above has been waited for
        step += 1

    if STAGED_STORES:  # (q: this consumer's rows only, read by its own wgmma, all waited for)
        _store_through(dq_ptr, (dq * scale).to(dtype), q, bh.to(gl.int64) * S, row0, S, D, D, ROWS, num_warps)
    else:
        offs_om = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        out_off = bh.to(gl.int64) * S * D + offs_om.to(gl.int64)[:, None] * D + offs_d[None, :]
        gl.store(dq_ptr + out_off, (dq * scale).to(dtype), mask=(offs_om < S)[:, None] & (offs_d < D)[None, :])


@gluon.constexpr_function
def _delta_layout(D, num_warps):
    """[rows, D] with 8 consecutive columns per thread and a row over min(D / 8, 32) lanes:
    a row's sum then takes the same additions whatever the tile's rows and warps, so every
    dQ config that computes delta computes the same bits."""
    lanes = min(D // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.jit
def _rows_delta(o_smem, do_smem, row0, delta_row_ptr, S, ROWS: gl.constexpr, D: gl.constexpr,
                num_warps: gl.constexpr):
    """delta = rowsum(dO · O) in fp32 for rows row0 .. row0 + ROWS (the O and dO tiles in
    shared memory, read in :func:`_delta_layout`), stored at ``delta_row_ptr + row``
    (rows < S). The delta kernel's layout: the H200 gave its bits (D 128 and 64)."""
    layout: gl.constexpr = _delta_layout(D, num_warps)
    o = o_smem.load(layout)
    do = do_smem.load(layout)
    delta = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    gl.store(delta_row_ptr + rows, delta, mask=rows < S)
    return delta


@gluon.jit
def _bwd_dq_ws_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, kpm_ptr, row_ptr_ptr, row_cols_ptr, order_ptr, o_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds, sob, soh, sos,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
    CONSUMERS: gl.constexpr = 1, MMA_REGS: gl.constexpr = 232, OVERLAP: gl.constexpr = False,
    HOST_DESCS: gl.constexpr = False, ORDERED: gl.constexpr = False, DELTA: gl.constexpr = False,
    STAGED_STORES: gl.constexpr = False,
):
    """Program (query tile, batch * head), as ``_bwd_dq_kernel`` (ORDERED: a 1-D grid, each
    program's (query tile, batch * head) from entry program_id(0) of ``order_ptr``, the
    launch-order table); descriptors over
    [B, H, S, D] and [B, Hkv, S, D] (zero-filled past S), built on the device (HOST_DESCS:
    q_ptr, k_ptr, v_ptr and do_ptr are host-built descriptors).
    CONSUMERS = 2: two consumer partitions of ``num_warps`` warps, half the rows each.
    DELTA: delta = rowsum(dO · O) computed from O (``o_ptr``, strides ``sob, soh, sos``; a
    host-built descriptor with HOST_DESCS) and written to ``delta_ptr``, not read from it.
    STAGED_STORES: dQ stored through the consumers' rows of the Q tile (:func:`_dq_ws_mma`)."""
    q_desc, k_desc, v_desc, do_desc = _backward_descs(q_ptr, k_ptr, v_ptr, do_ptr, B, S, H, HKV, D, (sqb, sqh, sqs),
                                                      (skb, skh, sks), (svb, svh, svs), (sdb, sdh, sds), BLOCK_M,
                                                      BLOCK_N, qo_layout, kv_layout, HOST_DESCS)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    do_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_bar = _one_shot_barrier()
    ready_bars, empty_bars = _alloc_ring(STAGES, CONSUMERS)
    if DELTA:  # O's tile, loaded after Q and dO
        o_desc = o_ptr if HOST_DESCS else _head_desc(o_ptr, B, H, S, D, sob, soh, sos, BLOCK_M, qo_layout)
        o_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
        o_bar = _one_shot_barrier()
    else:  # (unused)
        o_desc, o_smem, o_bar = do_desc, do_smem, q_bar
    descs = (q_desc, k_desc, v_desc, do_desc)
    bufs = (q_smem, do_smem, k_bufs, v_bufs, o_smem)
    bars = (q_bar, ready_bars, empty_bars, o_bar)
    tables = (row_ptr_ptr, row_cols_ptr, lse_ptr, delta_ptr, kpm_ptr, dq_ptr, order_ptr)
    sizes = (S, H, GROUP, NB, L_HEADS, qk_scale, scale)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_dq_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM, CONSUMERS, 0,
                          OVERLAP, num_warps, ORDERED, DELTA, STAGED_STORES)),
            (_dq_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM, CONSUMERS, 1,
                          OVERLAP, num_warps, ORDERED, DELTA, STAGED_STORES)),
            (_row_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, BLOCK_N, True, ORDERED, o_desc, DELTA)),
        ], [num_warps, 1], [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_dq_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM, CONSUMERS, 0,
                          OVERLAP, num_warps, ORDERED, DELTA, STAGED_STORES)),
            (_row_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, BLOCK_N, True, ORDERED, o_desc, DELTA)),
        ], [1], [LOAD_REGS])


def out_reason(out, q) -> str | None:
    """Why the kernel cannot read ``out`` (the forward's output) to compute delta, or None."""
    if out.shape != q.shape or out.device != q.device:
        return f"must have q's shape {tuple(q.shape)} and device, got {tuple(out.shape)} on {out.device}"
    if any(st == 0 for st in out.stride()[:3]):  # (stricter than the operands' broadcast rule)
        return f"needs out without zero strides, got {out.stride()}"
    return tma_operand_reason("out", out, q.dtype)


def launch_dq_ws(q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols, nb: int, layout_heads: int,
                 block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: DqWsConfig, meta=None,
                 out=None) -> None:
    """dq (contiguous [B, H, S, D]) of the block-sparse attention, as ``_bwd_dq_kernel``
    computes it; with ``cfg.balanced`` and the packed tables ``meta`` (whose views row_ptr
    and row_cols are), the programs launch in the order remembered on ``meta``. ``out``
    (the forward's output O, rows contiguous) given: the kernel computes delta =
    rowsum(dO · O) and writes it into ``delta`` (needs ``cfg.delta``); else it reads delta."""
    if (out is not None) != cfg.delta:
        raise ValueError(f"cfg={cfg}: out must be given exactly when delta is set (the kernel computes delta from it)")
    why = None if out is None else out_reason(out, q)
    if why is not None:
        raise ValueError(f"out: {why}")
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qo_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, D, q.dtype)
    ensure_allocator()
    operands = (host_backward_descs(q, k, v, grad_out, cfg.block_m, cfg.block_n, qo_layout, kv_layout)
                if cfg.host_descs else (q, k, v, grad_out))
    m_split = block_size // cfg.block_m
    order = None if meta is None or not cfg.balanced else launch_order(
        meta, layout_heads, nb, "dq", B, H, hkv, m_split, sm_count(q.device))
    grid = (nb * m_split, B * H) if order is None else (order.numel(),)
    launch(_bwd_dq_ws_kernel, grid,
        *operands, lse, delta, dq, kpm, row_ptr, row_cols, row_ptr if order is None else order,
        q if out is None else host_head_desc(out, cfg.block_m, qo_layout) if cfg.host_descs else out,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
        *(out.stride()[:3] if out is not None else (0, 0, 0)),
        BS=block_size, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        HAS_KPM=has_kpm, LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=cfg.block_m // 16 // cfg.consumers, CONSUMERS=cfg.consumers, OVERLAP=cfg.overlap,
        HOST_DESCS=cfg.host_descs, ORDERED=order is not None, DELTA=cfg.delta, STAGED_STORES=cfg.staged_stores,
    )
