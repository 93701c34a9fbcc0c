"""The consumer side of the Hopper warp-specialized dK/dV kernel
(:mod:`tilesparse.kernels.attention_ws_dkdv`): each consumer warpgroup's walk over its key
blocks (or, persistent, its share of items) and the per-key-block work, sT = K Qᵀ,
Pᵀ = exp2(sT * scale·log2e - lse), dV += Pᵀ dO, dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ - delta),
dK += dSᵀ Q, with Pᵀ and dSᵀ fed to the next wgmma from registers, waiting only on the
producer's mbarriers.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._share_walk import _share_bounds, _share_item
from ._stamps import now_ns, program_stamp_row, sm_id, store_stamp
from .attention_ws_base import _a_operand, _grid_item, _probabilities, _wgmma_layout
from .attention_ws_dkdv_load import _column_bounds, _column_tile
from .attention_ws_dq_adds import _add_share, _dkdv_staging, _pass_share, _store_staged

__all__: list[str] = []  # Gluon helpers of attention_ws_dkdv's kernel


@gluon.jit
def _dkdv_ws_mma(descs, bufs, bars, tables, sizes,
                 BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                 CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, STORE_DS: gl.constexpr,
                 CONSUMERS: gl.constexpr, ROLE: gl.constexpr, OVERLAP: gl.constexpr, STATS_SMEM: gl.constexpr,
                 ATOMIC_DQ: gl.constexpr, num_warps: gl.constexpr, STAGED_STORES: gl.constexpr = False,
                 out_smem_layout: gl.constexpr = None, PERSISTENT: gl.constexpr = False,
                 ORDERED: gl.constexpr = False, ORDERED_DQ: gl.constexpr = False, STAMPS: gl.constexpr = False):
    """A consumer partition: :func:`_dkdv_ws_item` for the program's key block (ORDERED:
    the launch-order table's entry), or (PERSISTENT) for each item of its share in turn
    (ORDERED: the balanced schedule's share),
    the ring and staging positions carried. STAMPS: consumer 0 writes the program's row of
    ``tables[12]``: SM, time at start, K and V in, walk done, stores issued."""
    NB, BHK_OFFSET, N_BHK = sizes[4], sizes[7], sizes[11]
    if PERSISTENT:  # (ORDERED: the balanced schedule's share)
        step = gl.to_tensor(0)
        reduces = gl.to_tensor(0)
        it = 0
        first, end, stride = _share_bounds(tables[9], NB * N_BHK, ORDERED)
        for position in range(first, end, stride):
            item = _share_item(position, tables[9], ORDERED)
            step, reduces = _dkdv_ws_item(descs, bufs, bars, tables, sizes, item % NB, item // NB + BHK_OFFSET,
                                          step, reduces, it & 1, BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS,
                                          CONSUMERS, ROLE, OVERLAP, STATS_SMEM, ATOMIC_DQ, num_warps, STAGED_STORES,
                                          out_smem_layout, PERSISTENT, ORDERED_DQ)
            it += 1
    else:
        kblk, bhk = _grid_item(tables[9], NB, ORDERED)
        _dkdv_ws_item(descs, bufs, bars, tables, sizes, kblk, bhk + BHK_OFFSET, 0, 0, 0,
                      BS, D, BLOCK_M, CAUSAL, HAS_KPM, STORE_DS, CONSUMERS, ROLE, OVERLAP, STATS_SMEM, ATOMIC_DQ,
                      num_warps, STAGED_STORES, out_smem_layout, PERSISTENT, ORDERED_DQ, STAMPS and ROLE == 0)


@gluon.jit
def _dkdv_ws_item(descs, bufs, bars, tables, sizes, kblk, bhk, step, reduces, kv_phase,
                  BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                  CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, STORE_DS: gl.constexpr,
                  CONSUMERS: gl.constexpr, ROLE: gl.constexpr, OVERLAP: gl.constexpr, STATS_SMEM: gl.constexpr,
                  ATOMIC_DQ: gl.constexpr, num_warps: gl.constexpr, STAGED_STORES: gl.constexpr,
                  out_smem_layout: gl.constexpr, PERSISTENT: gl.constexpr, ORDERED_DQ: gl.constexpr = False,
                  STAMPS: gl.constexpr = False):
    """A consumer partition's work (16 key rows per warp) for key block ``kblk`` of (batch *
    kv head) ``bhk``, its ring position ``step`` on, its ``reduces``-th staging tile on (mode
    1), K and V loaded once ``kv_bar`` completes phase ``kv_phase``; returns (step,
    reduces) after it (PERSISTENT: K and V released to the producer, ``kv_free``, before
    the stores). The four products per query tile,
    synchronous wgmma (OVERLAP: asynchronous, below), the stage released after the last one
    that read it has been waited for; then dK *
    scale and dV stored with masks (keys past S are not written). STORE_DS: each dSᵀ tile
    also goes to the workspace as ``_bwd_dkdv_kernel`` stores it. With CONSUMERS = 2,
    consumer ROLE takes key rows ROLE * BS / 2 .. of the block, on its own warpgroup and
    barrier arrivals. OVERLAP: sT and dPᵀ are issued together as asynchronous wgmma, Pᵀ is
    computed under dPᵀ's and dSᵀ under dV's (the same products in the same order: bitwise
    the synchronous consumer's). ATOMIC_DQ 1: then dQ's share of this consumer's keys,
    scale · dS K (dS = dSᵀ transposed by a layout conversion, K from shared memory), DQ_N
    columns at a time through two fp32 staging tiles, each added into ``dq_acc`` by a TMA
    reduction while the next is computed. ATOMIC_DQ 2 (two consumers): each consumer writes
    its keys' dSᵀ rows into a shared [BS, BLOCK_M] tile (two in turn), both wait for the
    other's (``ds_ready``), and consumer ROLE computes columns ROLE·D/2.. of the whole
    block's share, dS (all keys) K, with one reduction: half the reduction bytes of mode 1
    and no register transpose; ``ds_free`` holds a tile until both have read it. OVERLAP 2
    (ATOMIC_DQ 2 only): FlashAttention-3's order, every wgmma asynchronous: Sᵀ and dPᵀ
    together, Pᵀ under dPᵀ, the dSᵀ exchange under dV, dQ then dK issued, the reduction
    under dK, the stage released after the last wait. STAGED_STORES 1 (with ATOMIC_DQ): dK and
    dV leave through this consumer's two staging tiles, idle once its reductions have read
    them (ORDERED_DQ: once the dQ writer has freed them; ``out_smem_layout``), in 16-byte
    stores instead of the accumulator layout's 4-byte ones; 2: through stage ROLE of the Q
    and dO ring, once both consumers have released every stage (no wait on any dQ add).
    ORDERED_DQ (ATOMIC_DQ 2): the column walked in the host's order (``col_rows`` is
    :func:`attention_ordered_dq.ordered_tables`' walk, not rotated), each share handed to
    the dQ writer (:func:`_dkdv_dq_writer`) through the staging tiles instead of added here."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    k_smem, v_smem, q_bufs, do_bufs, stat_bufs, dq_bufs, ds_bufs = bufs
    kv_bar, ready_bars, empty_bars, ds_ready, ds_free, kv_free = bars[0], bars[1], bars[2], bars[3], bars[4], bars[5]
    dq_full, dq_empty = bars[6], bars[7]  # (ORDERED_DQ: the staging tiles handed to the dQ writer)
    col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr = tables[0], tables[1], tables[2], tables[3]
    kpm_ptr, dk_ptr, dv_ptr, ds_ptr = tables[4], tables[5], tables[6], tables[7]
    S, H, HKV, GROUP, NB, L_HEADS, NNZ, BHK_OFFSET, DS_ROW_OFFSET, qk_scale, scale, N_BHK = sizes
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    M_STEPS: gl.constexpr = BS // BLOCK_M
    KEYS: gl.constexpr = BS // CONSUMERS  # this consumer's key rows
    dtype: gl.constexpr = q_desc.dtype
    # sT, pT, dpT: [BS keys, BLOCK_M queries]; dK, dV: [BS keys, D]
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_M, num_warps)
    o_layout: gl.constexpr = _wgmma_layout(D, num_warps)
    # pT and dsT as wgmma's A operand from registers
    p_operand: gl.constexpr = _a_operand(o_layout)
    # STORE_DS's stores: 8 consecutive queries (16 bytes) per thread, BLOCK_M // 8 threads per row
    ds_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // (BLOCK_M // 8), BLOCK_M // 8],
                                               warps_per_cta=[num_warps, 1], order=[1, 0])
    # ATOMIC_DQ: dS [BLOCK_M queries, keys] as the A operand of dQ = dS K, the share [BLOCK_M, DQ_N]
    # in the dQ descriptor's boxes (the kernel picks their width)
    DQ_N: gl.constexpr = dq_desc.block_type.shape[3]
    dq_acc_layout: gl.constexpr = _wgmma_layout(DQ_N, num_warps)
    ds_operand: gl.constexpr = _a_operand(dq_acc_layout)
    bz = bhk // HKV
    hkv = bhk % HKV
    if ATOMIC_DQ:
        dq_zero = gl.zeros((BLOCK_M, DQ_N), dtype=gl.float32, layout=dq_acc_layout)
        # mode 1: this consumer's reductions issued (they alternate between its two staging
        # tiles); a literal 0 from the caller is a constexpr, the loops carry a tensor
        reduces = gl.to_tensor(reduces)

    key0 = kblk * BS + ROLE * KEYS
    offs_n = key0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
    n_keep = offs_n < S
    if HAS_KPM:
        pad = gl.load(kpm_ptr + bz.to(gl.int64) * S + offs_n, mask=n_keep, other=1)
        n_keep = n_keep & (pad == 0)
    dk = gl.zeros((KEYS, D), dtype=gl.float32, layout=o_layout)
    dv = gl.zeros((KEYS, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((KEYS, BLOCK_M), dtype=gl.float32, layout=s_layout)

    if STAMPS:
        stamp_row = program_stamp_row(tables[12])
        store_stamp(stamp_row, 0, sm_id(num_warps), num_warps)
        store_stamp(stamp_row, 1, now_ns(num_warps), num_warps)
    mbarrier.wait(kv_bar, kv_phase)
    if STAMPS:  # (K and V in)
        store_stamp(stamp_row, 2, now_ns(num_warps), num_warps)
    k = k_smem.reshape([BS, D]).slice(ROLE * KEYS, KEYS)
    v = v_smem.reshape([BS, D]).slice(ROLE * KEYS, KEYS)
    step = gl.to_tensor(step)  # (as reduces)
    ROTATE: gl.constexpr = ATOMIC_DQ != 0 and not ORDERED_DQ  # (the producer and the dQ writer walk alike)
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        lh = h % L_HEADS
        bh = (bz * H + h).to(gl.int64)
        start, end = _column_bounds(col_ptr_ptr, lh, NB, kblk)
        for i in range(start * M_STEPS, end * M_STEPS):
            t, qblk, row = _column_tile(i, start, end, kblk, col_rows_ptr, BS, BLOCK_M, ROTATE)
            offs_m = row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            m_ok = offs_m < S
            if not STATS_SMEM:
                lse = gl.load(lse_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
                delta = gl.load(delta_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
            s = step % STAGES
            mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
            if STATS_SMEM:  # read where used: no registers held across the first wgmma
                lse = stat_bufs.index(2 * s).load(gl.SliceLayout(0, s_layout))
            lse = gl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634  # empty rows: p = 0 anyway
            q = q_bufs.index(s).reshape([BLOCK_M, D])
            do = do_bufs.index(s).reshape([BLOCK_M, D])
            if OVERLAP == 2:  # FlashAttention-3's order (shared dS): Sᵀ and dPᵀ in flight together, the
                # exp2 under dPᵀ, the dS exchange under dV, dK issued while dQ runs, the reduction under dK
                gl.static_assert(ATOMIC_DQ == 2, "OVERLAP 2 (FlashAttention-3's order) is written for shared dS")
                s_tok = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                dp_tok = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                sT = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
                pT = _probabilities(sT, lse, qk_scale, kblk, qblk, S, offs_n, offs_m, n_keep, m_ok, BS, HAS_KPM, CAUSAL)
                dpT = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
                if STATS_SMEM:
                    delta = stat_bufs.index(2 * s + 1).load(gl.SliceLayout(0, s_layout))
                dsT = (pT * (dpT - delta[None, :])).to(dtype)
                pT_op = gl.convert_layout(pT.to(dtype), p_operand)
                dv = warpgroup_mma(pT_op, do, dv, is_async=True)
                buf = step % 2
                mbarrier.wait(ds_free.index(buf), ((step // 2) & 1) ^ 1)  # both read it two tiles ago
                ds_bufs.index(buf).slice(ROLE * KEYS, KEYS, dim=0).store(dsT)
                fence_async_shared()
                mbarrier.arrive(ds_ready.index(buf), count=1)
                mbarrier.wait(ds_ready.index(buf), (step // 2) & 1)  # the other consumer's rows are in
                k_all = k_smem.reshape([BS, D])
                dq_tok = warpgroup_mma(ds_bufs.index(buf).permute((1, 0)), k_all.slice(ROLE * DQ_N, DQ_N, dim=1),
                                       dq_zero, use_acc=False, is_async=True)
                dv, pT_op = warpgroup_mma_wait(num_outstanding=1, deps=(dv, pT_op))  # dV done, dQ in flight
                dsT_op = gl.convert_layout(dsT, p_operand)
                dk = warpgroup_mma(dsT_op, q, dk, is_async=True)
                dq_part = warpgroup_mma_wait(num_outstanding=1, deps=(dq_tok,))  # dQ done, dK in flight
                mbarrier.arrive(ds_free.index(buf), count=1)
                _pass_share(dq_desc, dq_bufs, dq_full, dq_empty, dq_part, scale, buf, step, [bz, h, row, ROLE * DQ_N],
                            ROLE, ORDERED_DQ)
                dk, dsT_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dsT_op))
                mbarrier.arrive(empty_bars.index(s), count=1)  # every wgmma of the tile has been waited for
            else:
                if OVERLAP:
                    s_tok = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    dp_tok = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    sT = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
                else:
                    sT = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False)
                pT = _probabilities(sT, lse, qk_scale, kblk, qblk, S, offs_n, offs_m, n_keep, m_ok, BS, HAS_KPM, CAUSAL)
                if OVERLAP:  # dV under way while dSᵀ is formed; all waited for before the stage is released
                    pT_op = gl.convert_layout(pT.to(dtype), p_operand)
                    dv = warpgroup_mma(pT_op, do, dv, is_async=True)
                    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok,))
                    if STATS_SMEM:
                        delta = stat_bufs.index(2 * s + 1).load(gl.SliceLayout(0, s_layout))
                    dsT = pT * (dpT - delta[None, :])
                    dsT_op = gl.convert_layout(dsT.to(dtype), p_operand)
                    dk = warpgroup_mma(dsT_op, q, dk, is_async=True)
                    dv, dk, pT_op, dsT_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pT_op, dsT_op))
                else:
                    dv = warpgroup_mma(gl.convert_layout(pT.to(dtype), p_operand), do, dv)
                    dpT = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False)
                    if STATS_SMEM:
                        delta = stat_bufs.index(2 * s + 1).load(gl.SliceLayout(0, s_layout))
                    dsT = pT * (dpT - delta[None, :])
                    dk = warpgroup_mma(gl.convert_layout(dsT.to(dtype), p_operand), q, dk)
                mbarrier.arrive(empty_bars.index(s), count=1)  # every wgmma above has been waited for
                if ATOMIC_DQ == 2:  # dSᵀ through shared memory; this consumer's half of dQ's columns. Both
                    # consumers must walk the same query tiles (no per-role skip): each waits for the other
                    buf = step % 2
                    mbarrier.wait(ds_free.index(buf), ((step // 2) & 1) ^ 1)  # both read it two tiles ago
                    ds_bufs.index(buf).slice(ROLE * KEYS, KEYS, dim=0).store(dsT.to(dtype))
                    fence_async_shared()
                    mbarrier.arrive(ds_ready.index(buf), count=1)
                    mbarrier.wait(ds_ready.index(buf), (step // 2) & 1)  # the other consumer's rows are in
                    k_all = k_smem.reshape([BS, D])
                    dq_part = warpgroup_mma(ds_bufs.index(buf).permute((1, 0)), k_all.slice(ROLE * DQ_N, DQ_N, dim=1),
                                            dq_zero, use_acc=False)
                    mbarrier.arrive(ds_free.index(buf), count=1)  # (a synchronous wgmma: read)
                    _pass_share(dq_desc, dq_bufs, dq_full, dq_empty, dq_part, scale, buf, step,
                                [bz, h, row, ROLE * DQ_N], ROLE, ORDERED_DQ)
                elif ATOMIC_DQ:  # K stays in shared memory for the whole walk; rows past S are dropped by the TMA
                    ds_op = gl.convert_layout(gl.permute(dsT.to(dtype), (1, 0)), ds_operand)
                    for c in gl.static_range(D // DQ_N):
                        dq_part = warpgroup_mma(ds_op, k.slice(c * DQ_N, DQ_N, dim=1), dq_zero, use_acc=False)
                        _add_share(dq_desc, dq_bufs.index(ROLE * 2 + reduces % 2), dq_part * scale, [bz, h, row, c * DQ_N])
                        reduces += 1
                if STORE_DS:  # ds[row, slot, n, m] = dsT[n, m] (keys-major, as the Triton kernel stores it),
                    # in a blocked layout: 16-byte vectors along the queries, whole rows per warp (the
                    # accumulator layout would store 4-byte pieces)
                    HPL = H // L_HEADS
                    ds_tile = ds_ptr + ((bz * HPL + h // L_HEADS - DS_ROW_OFFSET).to(gl.int64) * NNZ + t // M_STEPS) * (BS * BS)
                    n_in = ROLE * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(1, ds_layout))
                    m_in = (t % M_STEPS) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ds_layout))
                    gl.store(ds_tile + n_in[:, None] * BS + m_in[None, :], gl.convert_layout(dsT.to(dtype), ds_layout))
            step += 1
    if PERSISTENT:  # every wgmma that read K or V has been waited for: the producer may load the next item's
        mbarrier.arrive(kv_free, count=1)
    if STAMPS:
        store_stamp(stamp_row, 3, now_ns(num_warps), num_warps)

    if STAGED_STORES:  # 1: through this consumer's dQ staging tiles; 2: through the drained Q / dO ring
        gl.static_assert(STAGED_STORES == 1 or (not PERSISTENT and BLOCK_M >= KEYS and STAGES >= CONSUMERS),
                         "STAGED_STORES 2: a ring stage holds a [KEYS, D] tile, one per consumer, no next item")
        gl.static_assert(STAGED_STORES == 2 or (ATOMIC_DQ != 0 and BLOCK_M * DQ_N * 4 >= KEYS * D * 2),
                         "STAGED_STORES 1: an atomic-dQ staging tile holds a 16-bit [KEYS, D] tile")
        dk_stage, dv_stage = _dkdv_staging(bufs, bars, step, ROLE, STAGED_STORES, ORDERED_DQ)
        row0 = bhk.to(gl.int64) * S
        _store_staged(dk_ptr, (dk * scale).to(dtype), dk_stage, row0, key0, S, D, KEYS, out_smem_layout, num_warps)
        _store_staged(dv_ptr, dv.to(dtype), dv_stage, row0, key0, S, D, KEYS, out_smem_layout, num_warps)
        if STAGED_STORES == 2 and ATOMIC_DQ and not ORDERED_DQ:
            tma.store_wait(pendings=0)  # the staging tiles are read before the program ends
    else:
        offs_on = key0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        out_off = bhk.to(gl.int64) * S * D + offs_on.to(gl.int64)[:, None] * D + offs_d[None, :]
        out_mask = (offs_on < S)[:, None] & (offs_d < D)[None, :]
        gl.store(dk_ptr + out_off, (dk * scale).to(dtype), mask=out_mask)
        gl.store(dv_ptr + out_off, dv.to(dtype), mask=out_mask)
        if ATOMIC_DQ:
            tma.store_wait(pendings=0)  # the staging tiles are read before the program ends
    if STAMPS:
        store_stamp(stamp_row, 4, now_ns(num_warps), num_warps)
    return step, reduces
