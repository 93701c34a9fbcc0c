"""Hopper (sm90) warp-specialized backward kernels (dK/dV, dQ) of the fused block-sparse
attention, written in Gluon (Triton's explicit-layout dialect), opt-in.

Why: the Triton dK/dV kernel (:mod:`tilesparse.kernels.attention`) takes 1.45 ms of
the 2.43 ms backward on local-1024 attention (B 4, H 16, S 8192, D 128, H200), against
FlexAttention's whole backward at 2.05 ms; its config sweeps found nothing better, and
it does not spill inside its loop (docs/performance.md). This kernel splits the work
as FlashAttention-3 does on Hopper: one producer warp reads the layout's CSC column and
streams the query and output-gradient tiles through a ring of TMA stages, and the
consumer warpgroups only wait on mbarriers and issue wgmma, with Pᵀ and dSᵀ fed to the
next wgmma from registers (no shared-memory round trip).

Same math, tables and order as ``_bwd_dkdv_kernel`` (read that module's docstring): per
key tile of one kv head, for each query head of its group and each query tile of the
key block's column, sT = K Qᵀ, Pᵀ = exp2(sT * scale·log2e - lse), dV += Pᵀ dO,
dPᵀ = V dOᵀ, dSᵀ = Pᵀ (dPᵀ - delta), dK += dSᵀ Q; dK is scaled once at the end. The dQ
kernel mirrors ``_bwd_dq_kernel`` the same way (the producer streams K and V along the
query block's CSR row; dQ += dS K with dS from registers). The sums run in the same
order: bitwise deterministic. Rows past S read zeros (TMA
zero-fill) and keys past S or padding are masked, as in the Triton kernel.

Written after the session's device time ran out: compiled for sm_90 on the CPU
(``scripts/sm90_compile_check.py``), GPU tests in ``tests/test_attention_ws_gpu.py``,
never run on a GPU yet. :func:`ws_supported` says where they apply: sm90, fp16 /
bf16, D 64 or 128, block 64 or 128, heads' rows addressable by TMA.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma

from ._device import shared_memory_bytes
from ._launch import launch
from .bsmm_tma import ensure_allocator  # the device-built descriptors' scratch
from .bsmm_ws import _alloc_ring, _fill_stage, _nvmma, hopper_reason

LOG2E = 1.4426950408889634


@gluon.jit
def _head_desc(ptr, B, HEADS, S, D: gl.constexpr, stride_b, stride_h, stride_s, ROWS: gl.constexpr,
               layout: gl.constexpr):
    """A TMA descriptor over [B, HEADS, S, D] (unit stride along D) with [1, 1, ROWS, D]
    boxes: each head's rows past S are zero-filled on load."""
    return tma.make_tensor_descriptor(ptr, [B, HEADS, S, D], [stride_b, stride_h, stride_s, 1], [1, 1, ROWS, D],
                                      layout)


@gluon.jit
def _needs_mask(kblk, qblk, S, BS: gl.constexpr, HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether block pair (qblk, kblk) needs the element mask, as the Triton kernels'
    ``_needs_mask``: always with key padding, else the last key block when S is not a
    multiple of the block and, if causal, the diagonal block."""
    need = (kblk + 1) * BS > S
    if CAUSAL:
        need = need | (kblk == qblk)
    if HAS_KPM:
        need = need | (kblk == kblk)
    return need


@gluon.jit
def _row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """[queries, keys] bool of a row walk's tile: query < S, key < S and not padding, key
    <= query when causal (the Triton kernels' ``_tile_mask``)."""
    n_ok = offs_n < S
    if HAS_KPM:
        pad = gl.load(kpm_ptr + bz.to(gl.int64) * S + offs_n, mask=n_ok, other=1)
        n_ok = n_ok & (pad == 0)
    keep = m_ok[:, None] & n_ok[None, :]
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


@dataclasses.dataclass(frozen=True)
class DkdvWsConfig:
    """Launch parameters of the warp-specialized dK/dV kernel: ``block_m`` query rows per
    step (the key tile is the whole layout block, 16 rows per consumer warp), ``stages``
    of query / output-gradient tiles in flight, the producer warp's ``load_regs``."""

    block_m: int = 64
    stages: int = 2
    load_regs: int = 40

    def __post_init__(self):
        if self.block_m not in (32, 64, 128):
            raise ValueError(f"DkdvWsConfig.block_m must be 32, 64 or 128, got {self.block_m!r}")
        if self.stages < 2:
            raise ValueError(f"DkdvWsConfig.stages must be >= 2, got {self.stages!r}")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """K and V tiles, plus the ring of query and output-gradient tiles."""
        return (2 * block_size + 2 * self.stages * self.block_m) * head_dim * element_bytes + 1024


@gluon.jit
def _dkdv_ws_load(descs, bufs, bars, tables, sizes,
                  BS: gl.constexpr, BLOCK_M: gl.constexpr):
    """Producer (one warp): the key tile's K and V once, then for each query head of the
    group and each query tile of the key block's CSC column, the Q and dO tiles."""
    q_desc, k_desc, v_desc, do_desc = descs
    k_smem, v_smem, q_bufs, do_bufs = bufs
    kv_bar, ready_bars, empty_bars = bars
    col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr, kpm_ptr, dk_ptr, dv_ptr = tables
    S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale = sizes
    M_STEPS: gl.constexpr = BS // BLOCK_M
    kblk = gl.program_id(0)
    bhk = gl.program_id(1)
    bz = bhk // HKV
    hkv = bhk % HKV
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [bz, hkv, kblk * BS, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [bz, hkv, kblk * BS, 0], kv_bar, v_smem)
    step = 0
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        lh = h % L_HEADS
        start = gl.load(col_ptr_ptr + lh * NB + kblk)
        end = gl.load(col_ptr_ptr + lh * NB + kblk + 1)
        for t in range(start * M_STEPS, end * M_STEPS):
            qblk = gl.load(col_rows_ptr + t // M_STEPS)
            row = qblk * BS + (t % M_STEPS) * BLOCK_M
            _fill_stage(step, q_desc, [bz, h, row, 0], do_desc, [bz, h, row, 0], q_bufs, do_bufs, ready_bars,
                        empty_bars)
            step += 1


@gluon.jit
def _dkdv_ws_mma(descs, bufs, bars, tables, sizes,
                 BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                 CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (the default partition, 16 key rows per warp): the four products per
    query tile, synchronous wgmma, the stage released after the last one that read it;
    then dK * scale and dV stored with masks (keys past S are not written)."""
    q_desc, k_desc, v_desc, do_desc = descs
    k_smem, v_smem, q_bufs, do_bufs = bufs
    kv_bar, ready_bars, empty_bars = bars
    col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr, kpm_ptr, dk_ptr, dv_ptr = tables
    S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale = sizes
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    M_STEPS: gl.constexpr = BS // BLOCK_M
    dtype: gl.constexpr = q_desc.dtype
    # sT, pT, dpT: [BS keys, BLOCK_M queries]; dK, dV: [BS keys, D]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    # pT and dsT as wgmma's A operand from registers
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    kblk = gl.program_id(0)
    bhk = gl.program_id(1)
    bz = bhk // HKV
    hkv = bhk % HKV

    offs_n = kblk * BS + gl.arange(0, BS, layout=gl.SliceLayout(1, s_layout))
    n_keep = offs_n < S
    if HAS_KPM:
        pad = gl.load(kpm_ptr + bz.to(gl.int64) * S + offs_n, mask=n_keep, other=1)
        n_keep = n_keep & (pad == 0)
    dk = gl.zeros((BS, D), dtype=gl.float32, layout=o_layout)
    dv = gl.zeros((BS, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((BS, BLOCK_M), dtype=gl.float32, layout=s_layout)

    mbarrier.wait(kv_bar, 0)
    k = k_smem.reshape([BS, D])
    v = v_smem.reshape([BS, D])
    step = 0
    for g in range(0, GROUP):
        h = hkv * GROUP + g
        lh = h % L_HEADS
        bh = (bz * H + h).to(gl.int64)
        start = gl.load(col_ptr_ptr + lh * NB + kblk)
        end = gl.load(col_ptr_ptr + lh * NB + kblk + 1)
        for t in range(start * M_STEPS, end * M_STEPS):
            qblk = gl.load(col_rows_ptr + t // M_STEPS)
            row = qblk * BS + (t % M_STEPS) * BLOCK_M
            offs_m = row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            m_ok = offs_m < S
            lse = gl.load(lse_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
            lse = gl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634  # empty rows: p = 0 anyway
            delta = gl.load(delta_ptr + bh * S + offs_m, mask=m_ok, other=0.0)
            s = step % STAGES
            mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
            q = q_bufs.index(s).reshape([BLOCK_M, D])
            do = do_bufs.index(s).reshape([BLOCK_M, D])
            sT = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False)
            pT = gl.exp2(sT * qk_scale - lse[None, :])
            # the element mask where the Triton kernel needs one (_needs_mask): key padding,
            # the last key block when S is not a multiple of the block, the causal diagonal
            if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
                keep = n_keep[:, None] & m_ok[None, :]
                if CAUSAL:
                    keep = keep & (offs_n[:, None] <= offs_m[None, :])
                pT = gl.where(keep, pT, 0.0)
            dv = warpgroup_mma(gl.convert_layout(pT.to(dtype), p_operand), do, dv)
            dpT = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False)
            dsT = pT * (dpT - delta[None, :])
            dk = warpgroup_mma(gl.convert_layout(dsT.to(dtype), p_operand), q, dk)
            mbarrier.arrive(empty_bars.index(s), count=1)  # the wgmma above were synchronous
            step += 1

    offs_on = kblk * BS + gl.arange(0, BS, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    out_off = bhk.to(gl.int64) * S * D + offs_on.to(gl.int64)[:, None] * D + offs_d[None, :]
    out_mask = (offs_on < S)[:, None] & (offs_d < D)[None, :]
    gl.store(dk_ptr + out_off, (dk * scale).to(dtype), mask=out_mask)
    gl.store(dv_ptr + out_off, dv.to(dtype), mask=out_mask)


@gluon.jit
def _bwd_dkdv_ws_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, kpm_ptr, col_ptr_ptr, col_rows_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (key block, batch * kv head). Q and dO are read through descriptors over
    [B, H, S, D] (zero-filled past S), K and V over [B, Hkv, S, D]; built on the device."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc = _head_desc(q_ptr, B, H, S, D, sqb, sqh, sqs, BLOCK_M, qo_layout)
    do_desc = _head_desc(do_ptr, B, H, S, D, sdb, sdh, sds, BLOCK_M, qo_layout)
    k_desc = _head_desc(k_ptr, B, HKV, S, D, skb, skh, sks, BS, kv_layout)
    v_desc = _head_desc(v_ptr, B, HKV, S, D, svb, svh, svs, BS, kv_layout)
    k_smem = gl.allocate_shared_memory(dtype, [1, 1, BS, D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, BS, D], kv_layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, D], qo_layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, D], qo_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    descs = (q_desc, k_desc, v_desc, do_desc)
    bufs = (k_smem, v_smem, q_bufs, do_bufs)
    bars = (kv_bar, ready_bars, empty_bars)
    tables = (col_ptr_ptr, col_rows_ptr, lse_ptr, delta_ptr, kpm_ptr, dk_ptr, dv_ptr)
    sizes = (S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale)
    gl.warp_specialize([
        (_dkdv_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, CAUSAL, HAS_KPM, num_warps)),
        (_dkdv_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M)),
    ], [1], [LOAD_REGS])


@dataclasses.dataclass(frozen=True)
class _RowWalkConfig:
    """Launch parameters of a row-walking kernel (forward, dQ): ``block_m`` query rows per
    program (16 per consumer warp), ``block_n`` key rows per step, ``stages`` of K / V
    tiles in flight, the producer warp's ``load_regs``."""

    block_m: int = 128
    block_n: int = 64
    stages: int = 2
    load_regs: int = 40
    _QUERY_TILES = 1  # query-side tiles held in shared memory (Q; dQ also dO)

    def __post_init__(self):
        name = type(self).__name__
        if self.block_m not in (64, 128) or self.block_n not in (32, 64, 128):
            raise ValueError(f"{name}.block_m must be 64 or 128 and block_n 32, 64 or 128, "
                             f"got {self.block_m!r}, {self.block_n!r}")
        if self.stages < 2:
            raise ValueError(f"{name}.stages must be >= 2, got {self.stages!r}")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """The query-side tiles, plus the ring of K and V tiles."""
        return (self._QUERY_TILES * self.block_m + 2 * self.stages * self.block_n) * head_dim * element_bytes + 1024


@dataclasses.dataclass(frozen=True)
class DqWsConfig(_RowWalkConfig):
    """The warp-specialized dQ kernel's launch parameters (see ``_RowWalkConfig``)."""

    _QUERY_TILES = 2


@gluon.jit
def _row_ws_load(descs, bufs, bars, tables, sizes,
                 BS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, LOAD_DO: gl.constexpr):
    """Producer (one warp) of the row walks (forward, dQ): the query tile's Q (and dO)
    once, then for each key block of the query block's CSR row, its K and V tiles."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs = bufs
    q_bar, ready_bars, empty_bars = bars
    row_ptr_ptr, row_cols_ptr = tables[0], tables[1]
    H, GROUP, NB, L_HEADS = sizes[1], sizes[2], sizes[3], sizes[4]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    N_STEPS: gl.constexpr = BS // BLOCK_N
    pid = gl.program_id(0)
    bh = gl.program_id(1)
    qblk = pid // M_SPLIT
    bz = bh // H
    h = bh % H
    row0 = qblk * BS + (pid % M_SPLIT) * BLOCK_M
    if LOAD_DO:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [bz, h, row0, 0], q_bar, do_smem)
    else:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_bar, q_smem)
    lh = h % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    step = 0
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        key0 = kblk * BS + (t % N_STEPS) * BLOCK_N
        _fill_stage(step, k_desc, [bz, h // GROUP, key0, 0], v_desc, [bz, h // GROUP, key0, 0], k_bufs, v_bufs,
                    ready_bars, empty_bars)
        step += 1


@gluon.jit
def _dq_ws_mma(descs, bufs, bars, tables, sizes,
               BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (the default partition, 16 query rows per warp): per key tile S = Q Kᵀ,
    P, dP = dO Vᵀ, dS, dQ += dS K (dS from registers), synchronous wgmma; then dQ * scale
    stored with masks (rows past S are not written)."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs = bufs
    q_bar, ready_bars, empty_bars = bars
    row_ptr_ptr, row_cols_ptr, lse_ptr, delta_ptr, kpm_ptr, dq_ptr = tables
    S, H, GROUP, NB, L_HEADS, qk_scale, scale = sizes
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    N_STEPS: gl.constexpr = BS // BLOCK_N
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    ds_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    pid = gl.program_id(0)
    bh = gl.program_id(1)
    qblk = pid // M_SPLIT
    bz = bh // H
    offs_m = qblk * BS + (pid % M_SPLIT) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_ok = offs_m < S
    lse = gl.load(lse_ptr + bh.to(gl.int64) * S + offs_m, mask=m_ok, other=0.0)
    lse = gl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634
    delta = gl.load(delta_ptr + bh.to(gl.int64) * S + offs_m, mask=m_ok, other=0.0)
    dq = gl.zeros((BLOCK_M, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=s_layout)
    lh = (bh % H) % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([BLOCK_M, D])
    do = do_smem.reshape([BLOCK_M, D])
    step = 0
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        offs_n = kblk * BS + (t % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = step % STAGES
        mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
        k = k_bufs.index(s).reshape([BLOCK_N, D])
        v = v_bufs.index(s).reshape([BLOCK_N, D])
        p = gl.exp2(warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False) * qk_scale - lse[:, None])
        if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
            p = gl.where(_row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM, CAUSAL), p, 0.0)
        dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False)
        ds = p * (dp - delta[:, None])
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), ds_operand), k, dq)
        mbarrier.arrive(empty_bars.index(s), count=1)  # the wgmma above were synchronous
        step += 1

    offs_om = qblk * BS + (pid % M_SPLIT) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    out_off = bh.to(gl.int64) * S * D + offs_om.to(gl.int64)[:, None] * D + offs_d[None, :]
    gl.store(dq_ptr + out_off, (dq * scale).to(dtype), mask=(offs_om < S)[:, None] & (offs_d < D)[None, :])


@gluon.jit
def _bwd_dq_ws_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, kpm_ptr, row_ptr_ptr, row_cols_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (query tile, batch * head), as ``_bwd_dq_kernel``; descriptors over
    [B, H, S, D] and [B, Hkv, S, D] (zero-filled past S), built on the device."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc = _head_desc(q_ptr, B, H, S, D, sqb, sqh, sqs, BLOCK_M, qo_layout)
    do_desc = _head_desc(do_ptr, B, H, S, D, sdb, sdh, sds, BLOCK_M, qo_layout)
    k_desc = _head_desc(k_ptr, B, HKV, S, D, skb, skh, sks, BLOCK_N, kv_layout)
    v_desc = _head_desc(v_ptr, B, HKV, S, D, svb, svh, svs, BLOCK_N, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    do_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    descs = (q_desc, k_desc, v_desc, do_desc)
    bufs = (q_smem, do_smem, k_bufs, v_bufs)
    bars = (q_bar, ready_bars, empty_bars)
    tables = (row_ptr_ptr, row_cols_ptr, lse_ptr, delta_ptr, kpm_ptr, dq_ptr)
    sizes = (S, H, GROUP, NB, L_HEADS, qk_scale, scale)
    gl.warp_specialize([
        (_dq_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM, num_warps)),
        (_row_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, BLOCK_N, True)),
    ], [1], [LOAD_REGS])


@dataclasses.dataclass(frozen=True)
class FwdWsConfig(_RowWalkConfig):
    """The warp-specialized forward's launch parameters (see ``_RowWalkConfig``)."""

    block_n: int = 128


@gluon.jit
def _fwd_ws_mma(descs, bufs, bars, tables, sizes,
                BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (the default partition, 16 query rows per warp): the online softmax over
    the row's key tiles, S = Q Kᵀ and O += P V (P from registers) as synchronous wgmma;
    then O / l and lse stored (rows past S are not written; empty rows give O = 0 and
    lse = -inf), as ``_fwd_kernel`` does."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs = bufs
    q_bar, ready_bars, empty_bars = bars
    row_ptr_ptr, row_cols_ptr, lse_ptr, kpm_ptr, o_ptr = tables
    S, H, GROUP, NB, L_HEADS, qk_scale, sob, soh, sos = sizes
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    N_STEPS: gl.constexpr = BS // BLOCK_N
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    pid = gl.program_id(0)
    bh = gl.program_id(1)
    qblk = pid // M_SPLIT
    bz = bh // H
    h = bh % H
    offs_m = qblk * BS + (pid % M_SPLIT) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_ok = offs_m < S
    m_i = gl.full((BLOCK_M,), float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros((BLOCK_M,), dtype=gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros((BLOCK_M, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=s_layout)
    lh = h % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([BLOCK_M, D])
    step = 0
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        offs_n = kblk * BS + (t % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        st = step % STAGES
        mbarrier.wait(ready_bars.index(st), (step // STAGES) & 1)
        k = k_bufs.index(st).reshape([BLOCK_N, D])
        v = v_bufs.index(st).reshape([BLOCK_N, D])
        s = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False) * qk_scale
        if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
            s = gl.where(_row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM, CAUSAL), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        # a row with nothing kept so far has m_new = -inf: subtract 0 instead (no NaN)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        l_i = l_i * alpha + gl.sum(p, 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_operand), v, acc)
        mbarrier.arrive(empty_bars.index(st), count=1)  # the wgmma above were synchronous
        m_i = m_new
        step += 1

    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) / 1.4426950408889634)
    gl.store(lse_ptr + bh.to(gl.int64) * S + offs_m, lse, mask=m_ok)
    acc = acc / gl.convert_layout(gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))[:, None]
    offs_om = qblk * BS + (pid % M_SPLIT) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    out_off = bz.to(gl.int64) * sob + h.to(gl.int64) * soh + offs_om.to(gl.int64)[:, None] * sos + offs_d[None, :]
    gl.store(o_ptr + out_off, acc.to(dtype), mask=(offs_om < S)[:, None] & (offs_d < D)[None, :])


@gluon.jit
def _fwd_ws_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kpm_ptr, row_ptr_ptr, row_cols_ptr,
    B, S, H, HKV, GROUP, NB, L_HEADS, qk_scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
    BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, LOAD_REGS: gl.constexpr,
    qo_layout: gl.constexpr, kv_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (query tile, batch * head), as ``_fwd_kernel``; descriptors over
    [B, H, S, D] and [B, Hkv, S, D] (zero-filled past S), built on the device."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_desc = _head_desc(q_ptr, B, H, S, D, sqb, sqh, sqs, BLOCK_M, qo_layout)
    k_desc = _head_desc(k_ptr, B, HKV, S, D, skb, skh, sks, BLOCK_N, kv_layout)
    v_desc = _head_desc(v_ptr, B, HKV, S, D, svb, svh, svs, BLOCK_N, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    descs = (q_desc, k_desc, v_desc, q_desc)  # (no dO in the forward: the loader skips it)
    bufs = (q_smem, q_smem, k_bufs, v_bufs)
    bars = (q_bar, ready_bars, empty_bars)
    tables = (row_ptr_ptr, row_cols_ptr, lse_ptr, kpm_ptr, o_ptr)
    sizes = (S, H, GROUP, NB, L_HEADS, qk_scale, sob, soh, sos)
    gl.warp_specialize([
        (_fwd_ws_mma, (descs, bufs, bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM, num_warps)),
        (_row_ws_load, (descs, bufs, bars, tables, sizes, BS, BLOCK_M, BLOCK_N, False)),
    ], [1], [LOAD_REGS])


@functools.lru_cache(maxsize=None)
def _layouts(query_rows: int, key_rows: int, head_dim: int, dtype: torch.dtype):
    """(query-side, key-side) shared-memory layouts of [1, 1, rows, D] tiles (remembered:
    a launch asks every call)."""
    return _nvmma([1, 1, query_rows, head_dim], dtype), _nvmma([1, 1, key_rows, head_dim], dtype)


# Where a warp-specialized kernel is the measured default on Hopper: (kind, block size,
# head dim) -> config; the launchers consult it only when no config is given. Measured on
# the H200 (scripts/probes/attention_configs.py, B 4, H 16, S 8192, bf16; eleventh
# session), backward time with the other kernel at its default:
#   dQ   causal 8.44 -> 7.78 ms, local1024 2.57 -> 2.57 ms
#   dK/dV causal 8.25 -> 8.06 ms, local1024 2.55 -> 2.55 ms
# The warp-specialized forward lost to the Triton one there (causal 2.50 vs 2.35 ms,
# local1024 0.88 vs 0.80 ms), so it stays opt-in.
_WS_DEFAULTS: dict = {
    ("dq", 128, 128): DqWsConfig(block_m=128, block_n=128, stages=2),
    ("dkdv", 128, 128): DkdvWsConfig(block_m=64, stages=2),
}


def default_config(kind: str, q, k, v, third, block_size: int):
    """The warp-specialized config of ``kind`` ("fwd", "dkdv" or "dq") for these inputs
    where one is the measured default and the inputs qualify, else None (the Triton
    kernel's config applies)."""
    cfg = _WS_DEFAULTS.get((kind, block_size, q.shape[-1]))
    if cfg is None or ws_supported(q, k, v, third, block_size, cfg) is not None:
        return None
    return cfg


def ws_supported(q, k, v, third, block_size: int, cfg) -> str | None:
    """Why the kernel of ``cfg`` (a DkdvWsConfig, DqWsConfig or FwdWsConfig) cannot run
    these operands, or None if it can; ``third`` is grad_out for the backward kernels,
    the output for the forward."""
    D = q.shape[-1]
    third_name = "out" if isinstance(cfg, FwdWsConfig) else "grad_out"
    why = hopper_reason(q)
    if why is not None:
        return why
    if D not in (64, 128):
        return f"needs a head dim of 64 or 128, got {D}"
    tile = max(cfg.block_m, getattr(cfg, "block_n", cfg.block_m))
    if block_size not in (64, 128) or block_size % tile:
        return f"needs a block size of 64 or 128 divisible by the tiles of {cfg}, got {block_size}"
    if isinstance(cfg, DkdvWsConfig) and cfg.block_m > 64 and D > 64:
        return f"spills its registers at block_m={cfg.block_m} with D {D} (sT, dPᵀ, dK and dV live at once)"
    for name, t in (("q", q), ("k", k), ("v", v), (third_name, third)):
        if t.dtype != q.dtype:
            return f"needs one dtype: {name} is {t.dtype}, q is {q.dtype}"
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:3]):
            return f"needs {name} with unit stride along D and 16-byte-aligned strides"
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
            return f"needs {name} without broadcast (zero-stride) dimensions"
    if max(q.shape[2], q.shape[1] * q.shape[0]) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    # each program builds its descriptors in a 384-byte slot of scratch memory that Triton
    # addresses with a 32-bit offset: bound the programs (at most one per block_m queries)
    if q.shape[0] * q.shape[1] * -(-q.shape[2] // cfg.block_m) * 384 >= 1 << 31:
        return "would need more programs than its descriptors' 32-bit scratch offsets reach; split the batch"
    if cfg.shared_bytes(block_size, D) > shared_memory_bytes(q.device):
        return f"needs {cfg.shared_bytes(block_size, D)} bytes of shared memory, more than the GPU has"
    return None


def launch_dkdv_ws(q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows, nb: int, layout_heads: int,
                   block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: DkdvWsConfig) -> None:
    """dk, dv (contiguous [B, Hkv, S, D]) of the block-sparse attention, as
    ``_bwd_dkdv_kernel`` computes them."""
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qo_layout, kv_layout = _layouts(cfg.block_m, block_size, D, q.dtype)
    ensure_allocator()
    launch(_bwd_dkdv_ws_kernel, (nb, B * hkv),
        q, k, v, grad_out, lse, delta, dk, dv, kpm, col_ptr, col_rows,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
        BS=block_size, D=D, BLOCK_M=cfg.block_m, STAGES=cfg.stages, CAUSAL=causal, HAS_KPM=has_kpm,
        LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout, num_warps=block_size // 16,
    )


def launch_dq_ws(q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols, nb: int, layout_heads: int,
                 block_size: int, causal: bool, has_kpm: bool, scale: float, cfg: DqWsConfig) -> None:
    """dq (contiguous [B, H, S, D]) of the block-sparse attention, as ``_bwd_dq_kernel``
    computes it."""
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qo_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, D, q.dtype)
    ensure_allocator()
    launch(_bwd_dq_ws_kernel, (nb * (block_size // cfg.block_m), B * H),
        q, k, v, grad_out, lse, delta, dq, kpm, row_ptr, row_cols,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E, scale,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
        BS=block_size, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        HAS_KPM=has_kpm, LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=cfg.block_m // 16,
    )


def launch_fwd_ws(q, k, v, out, lse, kpm, row_ptr, row_cols, nb: int, layout_heads: int, block_size: int,
                  causal: bool, has_kpm: bool, scale: float, cfg: FwdWsConfig) -> None:
    """out [B, H, S, D] and lse [B, H, S] of the block-sparse attention, as ``_fwd_kernel``
    computes them."""
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qo_layout, kv_layout = _layouts(cfg.block_m, cfg.block_n, D, q.dtype)
    ensure_allocator()
    launch(_fwd_ws_kernel, (nb * (block_size // cfg.block_m), B * H),
        q, k, v, out, lse, kpm, row_ptr, row_cols,
        B, S, H, hkv, H // hkv, nb, layout_heads, scale * LOG2E,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        BS=block_size, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal,
        HAS_KPM=has_kpm, LOAD_REGS=cfg.load_regs, qo_layout=qo_layout, kv_layout=kv_layout,
        num_warps=cfg.block_m // 16,
    )
