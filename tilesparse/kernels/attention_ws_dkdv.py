"""Hopper (sm90) warp-specialized dK/dV kernel of the fused block-sparse attention, in
Gluon: FlashAttention-3's split on Hopper. One producer warp reads the layout's CSC
column and streams the query and output-gradient tiles through a ring of TMA stages
(:mod:`tilesparse.kernels.attention_ws_dkdv_load`); the consumer warpgroups only wait on
mbarriers and issue wgmma, with Pᵀ and dSᵀ fed to the next wgmma from registers
(:mod:`tilesparse.kernels.attention_ws_dkdv_consumer`). This module holds the kernel, which
sets up the ring and partitions, and its launcher.

Same math, tables and order as ``_bwd_dkdv_kernel`` (:mod:`tilesparse.kernels.attention_kernels`):
per key tile of one kv head, for each query head of its group and each query tile of
the key block's column, sT = K Qᵀ, Pᵀ = exp2(sT * scale·log2e - lse), dV += Pᵀ dO,
dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ - delta), dK += dSᵀ Q; dK is scaled once at the end; bitwise
deterministic. The default at blocks of 128 and D 128 on Hopper
(:mod:`tilesparse.kernels.attention_ws`, where its config and support checks live).
With ``DkdvWsConfig.atomic_dq`` (``deterministic=False``) it also adds each pair's dQ
share, scale · dS K, into an fp32 buffer by TMA reductions from shared memory
(:mod:`tilesparse.kernels.attention_ws_dq_adds`): 5 products per pair and no dQ kernel;
dQ's bits then depend on the order the adds land in (``ordered_dq``: a dQ writer warp
adds them in a fixed order instead), and dK / dV, reproducible run to run, differ in
their last bits from the deterministic mode's (the column walk starts elsewhere).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ._device import sm_count
from ._launch import launch
from ._stamps import check_stamps
from .attention_launch_order import launch_order, persistent_items
from .attention_ordered_dq import last_flagged_ranks, launch_table_on, ordered_tables, semaphores
from .attention_ws_base import (LOG2E, DkdvWsConfig, _backward_descs, _layouts, _one_shot_barrier, check_dq_acc,
                                host_backward_descs, host_head_desc)
from .attention_ws_dkdv_consumer import _dkdv_ws_mma
from .attention_ws_dkdv_load import _dkdv_ws_load
from .attention_ws_dq_adds import _dkdv_dq_writer, _dq_layout, _ds_smem_layout, _out_smem_layout, dq_tile_cols
from .bsmm_tma import ensure_allocator  # the device-built descriptors' scratch
from .bsmm_ws import _alloc_ring

__all__ = ["launch_dkdv_ws"]


# ordered_dq's dQ writer (attention_ws_dq_adds._dkdv_dq_writer): 2 reads each tile's counters
# ahead (LOOK_AHEAD), 1 reads them once the shares are handed over (the twenty-fifth session's)
ORDERED_DQ_WRITER = 2


@gluon.jit
def _bwd_dkdv_ws_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, kpm_ptr, col_ptr_ptr, col_rows_ptr, ds_ptr,
    dq_acc_ptr, order_ptr, ranks_ptr, sem_ptr, stamp_ptr, B, S, H, HKV, GROUP, NB, L_HEADS, NNZ, BHK_OFFSET,
    DS_ROW_OFFSET, qk_scale, scale, N_BHK, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds, dqb, dqh, dqs,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr, STORE_DS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
    CONSUMERS: gl.constexpr = 1, MMA_REGS: gl.constexpr = 232, OVERLAP: gl.constexpr = False,
    STATS_SMEM: gl.constexpr = False, ATOMIC_DQ: gl.constexpr = 0, dq_layout: gl.constexpr = None,
    ds_smem_layout: gl.constexpr = None, STAGED_STORES: gl.constexpr = False, out_smem_layout: gl.constexpr = None,
    HOST_DESCS: gl.constexpr = False, PERSISTENT: gl.constexpr = False, ORDERED: gl.constexpr = False,
    ORDERED_DQ: gl.constexpr = False, FIRST_STORE: gl.constexpr = False, STAMPS: gl.constexpr = False,
    LAST_UNCOUNTED: gl.constexpr = False,
):
    """Program (key block, batch * kv head), or (PERSISTENT) a program per SM at most taking
    such items in turn, head major (items running at once share Q and dO in L2); ORDERED: a
    1-D grid, program p taking the item of entry p of ``order_ptr`` (the launch-order table),
    or with PERSISTENT, program p the items of its share of the balanced schedule ``order_ptr``
    (:func:`attention_launch_order.persistent_items`).
    Q and dO are read through descriptors over [B, H, S, D] (zero-filled past S), K and V
    over [B, Hkv, S, D]; built on the device
    (HOST_DESCS: q_ptr, k_ptr, v_ptr, do_ptr and dq_acc_ptr are host-built descriptors).
    CONSUMERS = 2: two consumer partitions of ``num_warps`` warps, half the keys each.
    ORDERED_DQ (ATOMIC_DQ 2, ORDERED): dQ's shares added in a fixed order by a fifth partition,
    the dQ writer (``ranks_ptr``, ``sem_ptr``; :func:`_dkdv_dq_writer`); FIRST_STORE: each
    query tile's first share stored, not added (no zeroed buffer); LAST_UNCOUNTED: its last
    not counted (``ranks_ptr`` flagged). STAMPS (a probe's): each
    program's row of ``stamp_ptr`` (int64 [programs, 8]) gets its SM and times."""
    gl.static_assert(not ORDERED_DQ or (ATOMIC_DQ == 2 and ORDERED and not PERSISTENT),
                     "ORDERED_DQ: the shared-dS atomic mode, launched in its order table, not persistent")
    gl.static_assert(not FIRST_STORE or ORDERED_DQ != 0, "FIRST_STORE: the first share is known in the ordered mode only")
    gl.static_assert(not LAST_UNCOUNTED or ORDERED_DQ != 0, "LAST_UNCOUNTED: the last share is known in the ordered mode only")
    gl.static_assert(not (STAMPS and PERSISTENT), "STAMPS: a row per program, one item each")
    gl.static_assert(ATOMIC_DQ != 2 or CONSUMERS == 2, "ATOMIC_DQ 2 (shared dS tiles) needs two consumers")
    gl.static_assert(not (ATOMIC_DQ and STORE_DS), "STORE_DS and ATOMIC_DQ are two ways to make dQ")
    q_desc, k_desc, v_desc, do_desc = _backward_descs(q_ptr, k_ptr, v_ptr, do_ptr, B, S, H, HKV, D, (sqb, sqh, sqs),
                                                      (skb, skh, sks), (svb, svh, svs), (sdb, sdh, sds), BLOCK_M, BS,
                                                      qo_layout, kv_layout, HOST_DESCS)
    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, [1, 1, BS, D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, BS, D], kv_layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, D], qo_layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, D], qo_layout)
    kv_bar = _one_shot_barrier()
    ready_bars, empty_bars = _alloc_ring(STAGES, CONSUMERS)
    # ATOMIC_DQ: dQ's share in slices of DQ_N columns (mode 2: half of D per consumer)
    DQ_N: gl.constexpr = D // 2 if ATOMIC_DQ == 2 else (64 if D > 64 else D)
    if ATOMIC_DQ and HOST_DESCS:
        dq_desc = dq_acc_ptr
    elif ATOMIC_DQ:  # dq_acc: contiguous fp32 [B, H, S, D], added into in [1, 1, BLOCK_M, DQ_N] boxes
        dq_desc = tma.make_tensor_descriptor(dq_acc_ptr, [B, H, S, D], [dqb, dqh, dqs, 1], [1, 1, BLOCK_M, DQ_N],
                                             dq_layout)
    else:
        dq_desc = q_desc  # not used
    descs = (q_desc, k_desc, v_desc, do_desc, dq_desc)
    # STATS_SMEM: per stage s the query tile's lse (row 2 s) and delta (row 2 s + 1)
    stat_bufs = gl.allocate_shared_memory(gl.float32, [2 * STAGES if STATS_SMEM else 2, BLOCK_M],
                                          gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if ATOMIC_DQ:  # two fp32 staging tiles of dQ's share per consumer
        dq_bufs = gl.allocate_shared_memory(gl.float32, [2 * CONSUMERS, 1, 1, BLOCK_M, DQ_N], dq_layout)
    else:
        dq_bufs = stat_bufs  # not used
    if ATOMIC_DQ == 2:  # two dSᵀ tiles of the whole key block, each written by both consumers
        ds_bufs = gl.allocate_shared_memory(dtype, [2, BS, BLOCK_M], ds_smem_layout)
        ds_ready, ds_free = _alloc_ring(2, 2, 2)
    else:
        ds_bufs, ds_ready, ds_free = stat_bufs, ready_bars, empty_bars  # not used
    bufs = (k_smem, v_smem, q_bufs, do_bufs, stat_bufs, dq_bufs, ds_bufs)
    if PERSISTENT:  # the consumers' release of an item's K and V (one arrival each)
        kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_free, count=CONSUMERS)
    else:
        kv_free = kv_bar  # not used
    if ORDERED_DQ:  # each consumer's two staging tiles handed to the dQ writer (full) and back (empty)
        dq_full, dq_empty = _alloc_ring(4, 1)
    else:
        dq_full, dq_empty = ready_bars, empty_bars  # not used
    bars = (kv_bar, ready_bars, empty_bars, ds_ready, ds_free, kv_free, dq_full, dq_empty)
    tables = (col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr, kpm_ptr, dk_ptr, dv_ptr, ds_ptr, dq_acc_ptr, order_ptr,
              ranks_ptr, sem_ptr, stamp_ptr)
    sizes = (S, H, HKV, GROUP, NB, L_HEADS, NNZ, BHK_OFFSET, DS_ROW_OFFSET, qk_scale, scale, N_BHK)
    # (the argument tuples are written out in each branch: built once as variables, Triton 3.6
    # turns their constexpr ints into tensors, and its tuple + fails on a None constexpr)
    if ORDERED_DQ:  # the consumers, the producer and the dQ writer
        gl.warp_specialize([
            (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, 0,
                            OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES, out_smem_layout, PERSISTENT,
                            ORDERED, ORDERED_DQ, STAMPS)),
            (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, 1,
                            OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES, out_smem_layout, PERSISTENT,
                            ORDERED, ORDERED_DQ, STAMPS)),
            (_dkdv_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, STATS_SMEM, ATOMIC_DQ, PERSISTENT,
                             ORDERED, ORDERED_DQ)),
            (_dkdv_dq_writer, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, ORDERED_DQ == 2, STAGED_STORES == 1,
                               FIRST_STORE, LAST_UNCOUNTED)),
        ], [num_warps, 1, 1], [MMA_REGS, LOAD_REGS, LOAD_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([
            (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, 0,
                            OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES, out_smem_layout, PERSISTENT,
                            ORDERED, ORDERED_DQ, STAMPS)),
            (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, 1,
                            OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES, out_smem_layout, PERSISTENT,
                            ORDERED, ORDERED_DQ, STAMPS)),
            (_dkdv_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, STATS_SMEM, ATOMIC_DQ, PERSISTENT,
                             ORDERED, ORDERED_DQ)),
        ], [num_warps, 1], [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, 0,
                            OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES, out_smem_layout, PERSISTENT,
                            ORDERED, ORDERED_DQ, STAMPS)),
            (_dkdv_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, STATS_SMEM, ATOMIC_DQ, PERSISTENT,
                             ORDERED, ORDERED_DQ)),
        ], [1], [LOAD_REGS])


def launch_dkdv_ws(q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, nb: int, layout_heads: int,
                   block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: DkdvWsConfig,
                   ds=None, kv_heads: tuple[int, int] | None = None, ds_row_offset: int = 0,
                   dq_acc=None, meta=None, stamps=None) -> None:
    """dk, dv (contiguous [B, Hkv, S, D]) of the block-sparse attention, as
    ``_bwd_dkdv_kernel`` computes them; and each pair's dS into ``ds`` where given (its
    STORE_DS workspace, whose row 0 is row ``ds_row_offset``), or scale · dS K added into
    ``dq_acc`` (zeroed, contiguous fp32 [B, H, S, D]) where given, which needs
    ``cfg.atomic_dq``. ``kv_heads``: only the flat (batch, kv head) range [first, end)
    (default all). ``cfg.balanced`` with the packed tables ``meta`` (whose views col_ptr and
    col_rows are), over all of them: the programs launch in the order remembered on ``meta``
    (with ``cfg.persistent``: each program takes its share of the schedule remembered there,
    ``attention_launch_order.persistent_items``, where it gains; else the round-robin).
    ``stamps`` (a probe's: contiguous int64 [programs, 8], not with ``cfg.persistent``): each
    program's SM and time stamps, in launch order (``STAMPS``)."""
    check_dq_acc(q, cfg, dq_acc, ds)
    if cfg.ring_stores and cfg.block_m < block_size // cfg.consumers:
        raise ValueError(f"cfg={cfg}: ring_stores needs block_m >= block_size / consumers "
                         f"({block_size // cfg.consumers})")
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qo_layout, kv_layout = _layouts(cfg.block_m, block_size, D, q.dtype)
    dq_layout = _dq_layout(cfg.block_m, D, cfg.shared_ds)
    ensure_allocator()
    first, end = kv_heads or (0, B * hkv)
    operands = (q, k, v, grad_out, delta if dq_acc is None else dq_acc)
    if cfg.host_descs:  # (dQ's boxes: the staging tile's shape)
        dq_box = dq_tile_cols(D, cfg.shared_ds)
        operands = (*host_backward_descs(q, k, v, grad_out, cfg.block_m, block_size, qo_layout, kv_layout),
                    delta if dq_acc is None else host_head_desc(dq_acc, cfg.block_m, dq_layout, dq_box))
    # persistent: a program per SM at most, each taking items (key block, batch * kv head) in turn,
    # round-robin or (balanced) its share of the balanced schedule
    whole = meta is not None and cfg.balanced and (first, end) == (0, B * hkv)
    if cfg.persistent:
        programs = max(1, min(nb * (end - first), sm_count(q.device)))
        order = persistent_items(meta, layout_heads, nb, B, H, hkv, programs,
                                 head_major_long=cfg.atomic_dq) if whole else None
    else:
        order = launch_order(meta, layout_heads, nb, "dkdv", B, H, hkv, 1, sm_count(q.device),
                             head_major_long=cfg.atomic_dq) if whole else None
    ranks = sems = None
    if cfg.ordered_dq:  # its walk and ranks, its launch order, a zeroed semaphore per (b * h, tile, consumer)
        if meta is None or (first, end) != (0, B * hkv):
            raise ValueError(f"cfg={cfg}: ordered_dq needs the layout's tables (meta) and every kv head")
        tables = ordered_tables(meta, layout_heads, nb)
        if tables is None:
            raise ValueError(f"cfg={cfg}: this layout's shares cannot be ordered cheaply (some would wait on a "
                             "program that reaches their query tile no earlier), or the order was first asked for "
                             "inside a CUDA graph capture; use the deterministic two-kernel backward")
        col_rows, ranks = tables
        if cfg.last_share_uncounted:
            ranks = last_flagged_ranks(meta, layout_heads, nb)
        order = launch_table_on(meta, nb, B * hkv)
        sems = semaphores(B * H * nb * (block_size // cfg.block_m) * 2, q.device)
    if cfg.persistent:
        grid = (programs,)
    else:
        grid = (nb, end - first) if order is None else (order.numel(),)
    if stamps is not None:
        check_stamps(stamps, grid, cfg.persistent, q.device)
    launch(_bwd_dkdv_ws_kernel, grid,
        *operands[:4], lse, delta, dk, dv, kpm, col_ptr, col_rows, dk if ds is None else ds, operands[4],
        col_ptr if order is None else order, col_ptr if ranks is None else ranks, col_ptr if sems is None else sems,
        col_ptr if stamps is None else stamps, B, S, H, hkv,
        H // hkv, nb, layout_heads, col_rows.numel(), first, ds_row_offset, scale * LOG2E, scale, end - first,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
        *(dq_acc.stride()[:3] if dq_acc is not None else (0, 0, 0)),
        BS=block_size, D=D, BLOCK_M=cfg.block_m, STAGES=cfg.stages, CAUSAL=causal, HAS_KPM=has_kpm,
        LOAD_REGS=cfg.load_regs, STORE_DS=ds is not None, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=block_size // 16 // cfg.consumers, CONSUMERS=cfg.consumers,
        OVERLAP=2 if cfg.fa3_order else cfg.overlap, MMA_REGS=cfg.mma_regs,
        STATS_SMEM=cfg.stats_in_smem, ATOMIC_DQ=(2 if cfg.shared_ds else 1) if cfg.atomic_dq else 0,
        dq_layout=dq_layout if cfg.atomic_dq else None,
        ds_smem_layout=_ds_smem_layout(block_size, cfg.block_m, q.dtype) if cfg.shared_ds else None,
        STAGED_STORES=2 if cfg.ring_stores else cfg.staged_stores, HOST_DESCS=cfg.host_descs, PERSISTENT=cfg.persistent,
        ORDERED=order is not None, ORDERED_DQ=ORDERED_DQ_WRITER if cfg.ordered_dq else False,
        FIRST_STORE=cfg.first_share_stored, STAMPS=stamps is not None, LAST_UNCOUNTED=cfg.last_share_uncounted,
        out_smem_layout=(_out_smem_layout(block_size // cfg.consumers, D, q.dtype)
                         if cfg.staged_stores or cfg.ring_stores else None),
    )
