"""Hopper (sm90) warp-specialized kernels of the fused block-sparse attention, written in
Gluon (Triton's explicit-layout dialect): the forward here; dQ in
:mod:`tilesparse.kernels.attention_ws_dq`, dK/dV in
:mod:`tilesparse.kernels.attention_ws_dkdv`; their configs and shared helpers (the row
walks' producer among them) in
:mod:`tilesparse.kernels.attention_ws_base`. This module is where the attention
launchers (:mod:`tilesparse.kernels.attention`) find all three: the measured defaults
(:func:`default_config`) and where the kernels apply (:func:`ws_supported`).

Why: the Triton backward kernels took 2.35 ms of the backward on local-1024 attention
(B 4, H 16, S 8192, D 128, H200) against FlexAttention's whole backward at 2.05 ms. These
split the work as FlashAttention-3 does on Hopper: one producer warp reads the layout's
tables and streams tiles through a ring of TMA stages, and the consumer warpgroups only
wait on mbarriers and issue wgmma. The dQ kernel mirrors ``_bwd_dq_kernel`` (the
producer streams K and V along the query block's CSR row; dQ += dS K with dS from
registers), the forward ``_fwd_kernel``; the sums run in the same order as the Triton
kernels: bitwise deterministic. Rows past S read zeros (TMA zero-fill) and keys past S
or padding are masked.

Measured on the H200 (docs/performance.md): at blocks of 128 and D 64 or 128 all three
are the defaults (:data:`_WS_DEFAULTS`, with the history of each choice); the forward there
is the persistent kernel (:mod:`tilesparse.kernels.attention_ws_persistent`). Tests:
``tests/test_attention_ws_gpu.py``; compiled for sm_90 on the CPU by
``scripts/sm90_compile_check.py``. :func:`ws_supported` says where they apply: sm90,
fp16 / bf16, D 64 or 128, block 64 or 128, heads' rows addressable by TMA.
"""

from __future__ import annotations

import dataclasses

import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma

from ._device import shared_memory_bytes
from ._launch import launch
from .attention_ws_base import (LOG2E, DkdvWsConfig, DqWsConfig, FwdWsConfig, _a_operand, _layouts, _needs_mask,
                                _one_shot_barrier, _qkv_descs, _row_keep, _row_ws_load, _store_through,
                                _wgmma_layout, tma_operand_reason)
from .attention_ordered_dq import MAX_DEFAULT_COLUMN_SKEW, column_skew, ordered_tables
from .attention_ws_dkdv import launch_dkdv_ws
from .attention_ws_dq import launch_dq_ws
from .bsmm_tma import ensure_allocator  # the device-built descriptors' scratch
from .bsmm_ws import _alloc_ring, hopper_reason

__all__ = ["DkdvWsConfig", "DqWsConfig", "FwdWsConfig", "default_config", "ordered_candidate", "ordered_layout_ok",
           "ordered_default", "ws_supported", "launch_dkdv_ws", "launch_dq_ws", "launch_fwd_ws"]


@gluon.jit
def _fwd_ws_mma(descs, bufs, bars, tables, sizes,
                BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (the default partition, 16 query rows per warp) of the program's query
    tile: :func:`_fwd_row` once Q has landed."""
    q_smem, k_bufs, v_bufs = bufs[0], bufs[2], bufs[3]
    q_bar, ready_bars, empty_bars = bars
    H = sizes[1]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    pid = gl.program_id(0)
    bh = gl.program_id(1)
    qblk = pid // M_SPLIT
    _fwd_row(q_smem.reshape([BLOCK_M, D]), q_bar, 0, 0, qblk, qblk * BS + (pid % M_SPLIT) * BLOCK_M, bh // H, bh % H, bh,
             k_bufs, v_bufs, ready_bars, empty_bars, tables, sizes, BS, D, BLOCK_M, BLOCK_N, CAUSAL, HAS_KPM,
             num_warps)


@gluon.jit
def _fwd_row(q, q_bar, q_phase, step, qblk, row0, bz, h, bh, k_bufs, v_bufs, ready_bars, empty_bars, tables, sizes,
             BS: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr, HAS_KPM: gl.constexpr, num_warps: gl.constexpr, STAGED: gl.constexpr = False):
    """One query tile (rows row0 .. row0 + BLOCK_M of block ``qblk``, head ``h`` of batch
    ``bz``), once ``q_bar`` completes phase ``q_phase`` (Q has landed in ``q``): the online
    softmax over its key tiles, taken from the ring from position ``step`` on, S = Q Kᵀ and
    O += P V (P from registers) as synchronous wgmma; then O / l and lse stored (rows past S are not written; empty rows give O = 0 and lse =
    -inf), as ``_fwd_kernel`` does (STAGED: O through ``q``, this consumer's own Q rows, idle
    by then; :func:`_store_row`). Returns the ring position after its tiles."""
    row_ptr_ptr, row_cols_ptr, kpm_ptr = tables[0], tables[1], tables[3]
    S, NB, L_HEADS, qk_scale = sizes[0], sizes[3], sizes[4], sizes[5]
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    N_STEPS: gl.constexpr = BS // BLOCK_N
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = _wgmma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = _wgmma_layout(D, num_warps)
    p_operand: gl.constexpr = _a_operand(o_layout)
    step = gl.to_tensor(step)  # a literal 0 from the caller is a constexpr; the loop carries a tensor
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    m_ok = offs_m < S
    m_i = gl.full((BLOCK_M,), float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros((BLOCK_M,), dtype=gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros((BLOCK_M, D), dtype=gl.float32, layout=o_layout)
    s_zero = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=s_layout)
    lh = h % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    mbarrier.wait(q_bar, q_phase)
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        offs_n = kblk * BS + (t % N_STEPS) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        st = step % STAGES
        mbarrier.wait(ready_bars.index(st), (step // STAGES) & 1)
        k = k_bufs.index(st).reshape([BLOCK_N, D])
        v = v_bufs.index(st).reshape([BLOCK_N, D])
        s = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False)
        p, m_i, alpha, l_i = _softmax_step(s, m_i, l_i, kblk, qblk, offs_m, offs_n, m_ok, kpm_ptr, bz, S, qk_scale,
                                           BS, HAS_KPM, CAUSAL)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_operand), v, acc)
        mbarrier.arrive(empty_bars.index(st), count=1)  # the wgmma above were synchronous
        step += 1
    _store_row(acc, m_i, l_i, offs_m, m_ok, row0, bz, h, bh, tables, sizes, D, BLOCK_M, STAGED, q, num_warps)
    return step


@gluon.jit
def _softmax_step(s, m_i, l_i, kblk, qblk, offs_m, offs_n, m_ok, kpm_ptr, bz, S, qk_scale,
                  BS: gl.constexpr, HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """The online softmax of one score tile S = Q Kᵀ (unscaled), in base 2: (P, the new
    running max, alpha = the rescale factor of the old O and l, the new l)."""
    s = s * qk_scale
    if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
        s = gl.where(_row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM, CAUSAL), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    # a row with nothing kept so far has m_new = -inf: subtract 0 instead (no NaN)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    return p, m_new, alpha, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _store_row(acc, m_i, l_i, offs_m, m_ok, row0, bz, h, bh, tables, sizes, D: gl.constexpr, BLOCK_M: gl.constexpr,
               STAGED: gl.constexpr = False, stage=None, num_warps: gl.constexpr = 4):
    """A query tile's end: lse, and O / l stored (rows past S are not written; rows with
    nothing kept give O = 0 and lse = -inf); STAGED: through ``stage`` (idle shared memory
    of the tile's shape, the rows' Q) in 16-byte stores (``FwdWsConfig.staged_stores``)."""
    lse_ptr, o_ptr = tables[2], tables[4]
    S, sob, soh, sos = sizes[0], sizes[6], sizes[7], sizes[8]
    o_layout: gl.constexpr = acc.type.layout
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) / 1.4426950408889634)
    gl.store(lse_ptr + bh.to(gl.int64) * S + offs_m, lse, mask=m_ok)
    acc = acc / gl.convert_layout(gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))[:, None]
    if STAGED:
        _store_through(o_ptr + bz.to(gl.int64) * sob + h.to(gl.int64) * soh, acc.to(o_ptr.dtype.element_ty), stage, 0,
                       row0, S, sos, D, BLOCK_M, num_warps)
    else:
        offs_om = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        out_off = bz.to(gl.int64) * sob + h.to(gl.int64) * soh + offs_om.to(gl.int64)[:, None] * sos + offs_d[None, :]
        gl.store(o_ptr + out_off, acc.to(o_ptr.dtype.element_ty), mask=(offs_om < S)[:, None] & (offs_d < D)[None, :])


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
    q_desc, k_desc, v_desc = _qkv_descs(q_ptr, k_ptr, v_ptr, B, S, H, HKV, D, (sqb, sqh, sqs), (skb, skh, sks),
                                        (svb, svh, svs), BLOCK_M, BLOCK_N, qo_layout, kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], qo_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], kv_layout)
    q_bar = _one_shot_barrier()
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


# Where a warp-specialized kernel is the measured default on Hopper: (kind, block size,
# head dim) -> config; the launchers consult it only when no config is given. Measured on
# the H200 (scripts/probes/attention_configs.py, B 4, H 16, S 8192, bf16; eleventh
# session), backward time with the other kernel at its default:
#   dQ   causal 8.44 -> 7.78 ms, local1024 2.57 -> 2.57 ms
#   dK/dV causal 8.25 -> 8.06 ms, local1024 2.55 -> 2.55 ms
# The one-tile warp-specialized forward lost to the Triton one there (causal 2.50 vs 2.35
# ms, local1024 0.88 vs 0.80 ms). Sixteenth session: the persistent forward with the
# softmax under P V and two consumer warpgroups (each synchronizing only itself before its
# barrier arrivals) beat the Triton forward on every pattern of the suite
# (...-attention-fwd-two-consumers-dd27a07.json: local1024 0.753 -> 0.624 ms, strided 0.909
# -> 0.823, BigBird 0.784 -> 0.680, random 10 % 0.598 -> 0.577, causal 2.464 -> 2.265); the
# backward kernels take two consumers too (scripts/probes/attention_two_consumers.py).
# At D 64 (...-attention-two-consumers-d64-ffd6099.json) the same kernels beat the Triton
# ones on the layouts shared by all heads (forward local1024 0.633 -> 0.439 ms, strided
# 0.788 -> 0.541, causal 2.155 -> 1.442; backward 1.72 -> 1.62, 2.17 -> 1.95, 6.07 -> 4.65)
# and not on the per-head ones (BigBird forward 0.518 vs 0.526, random 10 % 0.364 vs 0.401;
# random 10 % backward 1.31 vs 1.39): there they applied to shared layouts only. Seventeenth
# session: with the persistent forward's tiles balanced by row length (attention_schedule)
# its D 64 forward beats the Triton one on the per-head layouts too
# (...-attention-balanced-d64.json: BigBird 0.518 -> 0.405 ms, random 10 % 0.366 -> 0.338,
# fixed 0.602 -> 0.433), and with overlap the D 64 backward kernels do too
# (...-attention-bwd-overlap-d64-perhead-db6667e.json, backward ms against the Triton
# kernels': BigBird 1.808 -> 1.604, random 10 % 1.307 -> 1.288): no layout-kind limits left.
# Seventeenth session (...-attention-bwd-overlap-9f8be5d.json): the elementwise work under
# asynchronous wgmma (overlap) makes dQ 1.5-2.3 % faster at D 128 (local1024 2.249 -> 2.215 ms
# of backward, causal 6.999 -> 6.841) and both kernels faster at D 64 (local1024 backward
# 1.637 -> 1.510 ms, random 10 % 1.399 -> 1.280); dK/dV's at D 128 spills and loses
# (2.235 -> 2.851 ms): synchronous there.
# Eighteenth session (...-attention-bwd-stats-smem-cab1e06.json, local 1024, D 128): lse and
# delta read from the ring stage (stats_in_smem) take the synchronous dK/dV consumer's spills
# from 220 B to none and the backward from 2.222 to 2.059 ms (overlapped too: 2.683 -> 2.088;
# bitwise the same gradients): the D 128 default. At D 64 (no spills either way) not measured.
# Twenty-third session (...-attention-tma-dq-modes-d773be5.json, D 128): TMA descriptors built
# on the host (host_descs) for both backward kernels instead of by every program: backward
# 2.057 -> 1.919 ms on local 1024, strided 2.557 -> 2.400, causal 6.430 -> 6.240, bitwise the
# same gradients. The persistent dK/dV kernel lost (2.073, 2.607, 6.733): opt-in. At D 64
# (...-attention-tma-dq-d64-3130ffc.json) host descriptors for both: local 1024 1.530 -> 1.248
# ms, causal 4.322 -> 4.092 (persistent dK/dV 1.388 / 4.409). Then both kernels launched
# long columns / rows first (balanced, attention_launch_order; ...-attention-balanced-bwd-560fb7d.json,
# D 128, bitwise the same gradients): BigBird 1.973 -> 1.807 ms, random 10 % 1.567 -> 1.505,
# fixed 1.906 -> 1.857, causal 6.179 -> 6.090; local windows and strided get no table (their
# columns are near-equal). With deterministic=False the dK/dV kernel's order was mixed (BigBird
# 1.766 -> 1.652, fixed 1.777 -> 1.860, random 10 % 1.359 -> 1.376): not there. Twenty-fourth session
# (...-attention-balanced-d64-ea17eb4.json): at D 64 too, BigBird 1.359 -> 1.219 ms, fixed 1.303 ->
# 1.263, random 10 % 1.035 -> 1.031 (local 1024 gets no table), bitwise the same.
# Twenty-fifth session (...-attention-delta-smem-d{128,64}-549e36d.json, 7 interleaved rounds; the
# working tree on 549e36d):
# the dQ kernel computes delta itself (delta: O's tile loaded after Q and dO, summed before the
# walk) and runs first, the delta kernel gone: D 128 local 1024 1.945 -> 1.911 ms, BigBird 1.855
# -> 1.832, random 10 % 1.591 -> 1.586, causal 6.212 -> 6.156; D 64 local 1024 1.251 -> 1.235,
# BigBird 1.216 -> 1.177, random 10 % 1.027 -> 0.989; bitwise the same gradients (its sums
# are the delta kernel's). O loaded into registers at the start instead (...-delta-registers-d128-549e36d):
# -2.4 % to +2.5 %, not kept. Twenty-seventh session (...-attention-ring-stores-d128-f413e94.json,
# 5 rounds): D 128 dK / dV through the drained Q / dO ring (ring_stores; the stamps had the
# epilogue at 4 us per program, 1.5 with staged stores), the two kernels' backward: local 1024
# 1.917 -> 1.815 ms, random 10 % 1.514 -> 1.450, BigBird 1.792 -> 1.740, causal 6.151 -> 6.013,
# bitwise the same. D 64: not timed. Twenty-eighth session (...-attention-staged-d128-d6cd339.json,
# 5 rounds): the persistent forward's O through the consumers' Q rows (staged_stores, 16-byte
# stores): local 1024 0.631 -> 0.593 ms, random 10 % 0.502 -> 0.464, BigBird 0.610 -> 0.561,
# fixed 0.620 -> 0.579, bitwise the same O and lse. The dQ kernel's staged dQ was mixed over
# three probe runs (random 10 % +4.9 / -4.6 / -2.0 %, BigBird +3.4 / -4.6 / -1.6 %, fixed -2.2 /
# -3.0 %; ...-attention-probe-d128-70b1038.json, ...-attention-probe-dq-staged-d128-ae748d3.json):
# opt-in. At D 64 (...-attention-probe-d64-70b1038.json, 5 rounds): the forward's staged stores,
# random 10 % 0.339 -> 0.312 ms, BigBird 0.406 -> 0.378, local 1024 0.438 -> 0.417, and dK / dV
# through the drained ring (ring_stores), backward 0.998 -> 0.947, 1.177 -> 1.128, 1.226 ->
# 1.186, both bitwise the same: the D 64 defaults (deterministic=False keeps its staged stores:
# not timed with the ring there). Twenty-ninth session (...-attention-probe-dq-staged-energy-d128-417b01e.json):
# the suite's rows run at the board's 700 W power cap, where energy per call sets the time; back to
# back for 3 s the dQ kernel's staged stores (ncu: its 4-byte stores wrote 2x the sectors needed) took
# random 10 % 1.555 -> 1.512 ms (1076 -> 1044 mJ per call) and BigBird 1.847 -> 1.807 (1277 -> 1251 mJ),
# interleaved 1.474 -> 1.433 / 1.712 -> 1.708, bitwise the same: the D 128 default. Thirtieth session
# (...-attention-probe-d64-41c4838.json, D 64, 3 s back to back): random 10 % 691 -> 680 mJ per call
# (1.002 -> 0.986 ms), BigBird 830 -> 806 mJ (1.201 -> 1.167 ms), bitwise the same: the D 64 default too.
_WS_DEFAULTS: dict = {
    ("fwd", 128, 128): FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2, staged_stores=True),
    ("dq", 128, 128): DqWsConfig(block_m=128, block_n=128, stages=2, consumers=2, overlap=True, host_descs=True,
                                 balanced=True, delta=True, staged_stores=True),
    ("dkdv", 128, 128): DkdvWsConfig(block_m=64, stages=2, consumers=2, stats_in_smem=True, host_descs=True,
                                     balanced=True, ring_stores=True),
    ("fwd", 128, 64): FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2, staged_stores=True),
    ("dq", 128, 64): DqWsConfig(block_m=128, block_n=128, stages=2, consumers=2, overlap=True, host_descs=True,
                                balanced=True, delta=True, staged_stores=True),
    ("dkdv", 128, 64): DkdvWsConfig(block_m=64, stages=2, consumers=2, overlap=True, host_descs=True, balanced=True,
                                    ring_stores=True),
}
_SHARED_LAYOUTS_ONLY: set = set()  # (kind, block, D) measured faster on layouts shared by all heads only


# (kind, block, D) -> the atomic-dQ mode of the dK/dV default with deterministic=False (dQ added
# by TMA reductions, no dQ kernel). Twenty-second session (...-attention-tma-dq-9424a3b.json,
# B 4, H 16, S 8192, D 128, one process): the shared-dS mode (FlashAttention-3's: both
# consumers share each dS tile, each adds half of dQ's columns) took the backward from the
# deterministic default's 2.118 to 1.965 ms on local 1024 (strided 2.594 -> 2.439, BigBird
# 2.161 -> 2.097, random 10 % 1.736 -> 1.660, causal 6.526 -> 5.939), against the Triton
# kernel's atomics at 2.747; without shared dS 2.170 (stats in smem) to 3.03 (overlapped).
# D 64 (...-attention-tma-dq-d64-042cf62.json): the plain atomic mode with the stats in shared
# memory, not overlapped, wins there (local 1024 1.528 -> 1.357 ms, causal 4.301 -> 4.016;
# shared dS 1.416 / 4.216; the Triton kernel's atomics 1.951 / 6.913).
# Twenty-third session (...-attention-tma-dq-modes-d773be5.json, D 128): shared dS with
# FlashAttention-3's asynchronous order (fa3_order, 240 / 24 registers), dK / dV stored through
# the idle dQ staging tiles (staged_stores) and host-built descriptors: local 1024 1.958 ->
# 1.669 ms, strided 2.492 -> 2.180, causal 6.021 -> 5.781 (each alone: 1.889 / 1.885 / 1.844
# on local 1024; persistent 2.058, lost). D 64 (...-attention-tma-dq-d64-3130ffc.json): the
# plain mode with staged stores and host descriptors, local 1024 1.358 -> 1.144 ms, causal
# 4.006 -> 3.864 (D 128's mode 1.155 / 3.835: within noise, the plain one kept).
# Twenty-fourth session: launched in the balanced order with each head's long columns together
# (attention_launch_order's head_major_long), timed in 5 interleaved rounds
# (...-attention-balanced-d128-rounds-29508d3.json, D 128): BigBird 1.799 -> 1.674 ms, fixed
# 1.859 -> 1.818, random 10 % 1.413 -> 1.419, causal 5.696 -> 5.684; D 64
# (...-attention-balanced-d64-ea17eb4.json): BigBird 1.237 -> 1.089, fixed 1.235 -> 1.159, random
# 10 % 0.940 -> 0.918. Local windows and strided get no table (the same kernel).
# Twenty-seventh session (...-attention-ring-stores-d128-f413e94.json, 5 rounds): dK / dV
# through the drained Q / dO ring (ring_stores) instead of the staging tiles, local 1024 1.743
# -> 1.727 ms, random 10 % 1.415 -> 1.424, BigBird 1.721 -> 1.677, causal 5.833 -> 5.662.
_ATOMIC_DQ_DEFAULTS: dict = {("dkdv", 128, 128): {"shared_ds": True, "fa3_order": True, "mma_regs": 240,
                                                  "load_regs": 24, "ring_stores": True, "host_descs": True,
                                                  "balanced": True},
                             ("dkdv", 128, 64): {"overlap": False, "stats_in_smem": True, "staged_stores": True,
                                                 "ring_stores": False, "host_descs": True, "balanced": True}}


# (block, D, dtype) -> the dK/dV config the deterministic backward runs instead of its two
# kernels where the layout's dQ shares can be ordered cheaply (ordered_candidate, then
# ordered_layout_ok): the shipped deterministic=False mode at D 128 with its shares added in
# a fixed order by the dQ writer warp. Twenty-sixth session (...-attention-ordered-writer-
# d128-*.json, bf16, B 4, H 16, S 8192, 7 interleaved rounds), backward ms, two kernels ->
# ordered: local 1024 1.878 -> 1.818, strided 2.417 -> 2.254, causal 6.403 -> 5.719; the
# fixed pattern 1.882 -> 2.057 (refused by its column skew). D 64: slower on every pattern
# timed (not listed). Twenty-seventh session (...-attention-ordered-options-d128-c869ce3.json):
# each query tile's first share stored (first_share_stored: no zero fill of dQ's fp32
# buffer) 1.820 -> 1.770 local, 2.256 -> 2.192 strided, 5.763 -> 5.711 causal; staged
# stores (not taken) 1.788 / 2.212 / 5.800; dK / dV through the drained Q / dO ring
# (ring_stores, ...-attention-ring-stores-d128-f413e94.json, 5 rounds) local 1024 1.876 -> 1.751
# (the shipped default in the same rounds: 1.783), causal 5.730 -> 5.644. fp16: the same kernel (its GPU tests pass);
# layouts shared by all heads only (per-head layouts keep the two kernels: not timed).
_ORDERED_DQ_CONFIG = DkdvWsConfig(block_m=64, stages=2, consumers=2, stats_in_smem=True, atomic_dq=True,
                                  shared_ds=True, fa3_order=True, mma_regs=240, load_regs=24, host_descs=True,
                                  ordered_dq=True, first_share_stored=True, ring_stores=True)
_ORDERED_DQ_DEFAULTS: dict = {(128, 128, torch.bfloat16): _ORDERED_DQ_CONFIG,
                              (128, 128, torch.float16): _ORDERED_DQ_CONFIG}


def ordered_candidate(q, k, v, grad_out, block_size: int, layout_heads: int):
    """The ordered-dQ dK/dV config (``_ORDERED_DQ_DEFAULTS``) these operands could run in
    place of the deterministic backward's two kernels: listed for (block, D, dtype), a
    layout shared by all heads, and supported by the kernel; else None. Depends on the
    operands only (the launcher remembers it with its plan); :func:`ordered_layout_ok`
    then decides per layout."""
    cfg = _ORDERED_DQ_DEFAULTS.get((block_size, q.shape[-1], q.dtype))
    if cfg is None or layout_heads != 1 or ws_supported(q, k, v, grad_out, block_size, cfg) is not None:
        return None
    return cfg


def ordered_layout_ok(meta, layout_heads: int, num_blocks: int) -> bool:
    """Whether this layout takes the ordered mode by default: its shares can be ordered
    without long waits (``attention_ordered_dq.ordered_tables``) and its longest key-block
    column is at most ``MAX_DEFAULT_COLUMN_SKEW`` times the mean (``column_skew``). False
    while a CUDA graph is captured before either was computed for this layout (both read
    the tables to the host): such a capture runs the two kernels, whose bits differ from
    the ordered mode's."""
    if meta is None:
        return False
    skew = column_skew(meta, layout_heads, num_blocks)
    return (skew is not None and skew <= MAX_DEFAULT_COLUMN_SKEW
            and ordered_tables(meta, layout_heads, num_blocks) is not None)


def ordered_default(q, k, v, grad_out, block_size: int, meta, layout_heads: int, num_blocks: int):
    """:func:`ordered_candidate` where :func:`ordered_layout_ok`, else None: the dK/dV
    config the deterministic backward runs for these operands and this layout."""
    cfg = ordered_candidate(q, k, v, grad_out, block_size, layout_heads)
    return cfg if cfg is not None and ordered_layout_ok(meta, layout_heads, num_blocks) else None


def default_config(kind: str, q, k, v, third, block_size: int, layout_heads: int = 1, deterministic: bool = True):
    """The warp-specialized config of ``kind`` ("fwd", "dkdv" or "dq") for these inputs
    where one is the measured default and the inputs qualify, else None (the Triton
    kernel's config applies). ``layout_heads``: the layout's heads (1: one layout shared
    by every head); some defaults were measured faster on shared layouts only.
    ``deterministic=False`` (backward): the dK/dV default with ``atomic_dq`` where listed
    in ``_ATOMIC_DQ_DEFAULTS`` (in the mode listed there), and no dQ kernel."""
    key = (kind, block_size, q.shape[-1])
    cfg = _WS_DEFAULTS.get(key)
    if not deterministic and kind != "fwd":
        listed = kind == "dkdv" and key in _ATOMIC_DQ_DEFAULTS and cfg is not None and cfg.block_m == 64
        cfg = dataclasses.replace(cfg, atomic_dq=True, **_ATOMIC_DQ_DEFAULTS[key]) if listed else None
    if cfg is None or (layout_heads > 1 and key in _SHARED_LAYOUTS_ONLY):
        return None
    if ws_supported(q, k, v, third, block_size, cfg) is not None:
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
    if isinstance(cfg, DkdvWsConfig) and cfg.consumers == 2 and block_size != 128:
        return f"needs blocks of 128 with two consumers (a warpgroup of 64 keys each), got {block_size}"
    if isinstance(cfg, DkdvWsConfig) and cfg.block_m > 64 and D > 64:
        return f"spills its registers at block_m={cfg.block_m} with D {D} (sT, dPᵀ, dK and dV live at once)"
    if isinstance(cfg, DkdvWsConfig) and cfg.atomic_dq and block_size // 16 // cfg.consumers > 4:
        return (f"with atomic_dq needs a warpgroup per consumer (consumers=2 at blocks of {block_size}): "
                "wider consumers would repeat dQ's product in every warpgroup")
    for name, t in (("q", q), ("k", k), ("v", v), (third_name, third)):
        why = tma_operand_reason(name, t, q.dtype)
        if why is not None:
            return why
    if max(q.shape[2], q.shape[1] * q.shape[0]) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    # each program builds its descriptors in a slot of scratch memory (up to 640 bytes: the
    # atomic-dQ dK/dV kernel's five) that Triton addresses with a 32-bit offset: bound the
    # programs (at most one per block_m queries)
    if q.shape[0] * q.shape[1] * -(-q.shape[2] // cfg.block_m) * 640 >= 1 << 31:
        return "would need more programs than its descriptors' 32-bit scratch offsets reach; split the batch"
    if cfg.shared_bytes(block_size, D) > shared_memory_bytes(q.device):
        return f"needs {cfg.shared_bytes(block_size, D)} bytes of shared memory, more than the GPU has"
    return None


def launch_fwd_ws(q, k, v, out, lse, kpm, row_ptr, row_cols, nb: int, layout_heads: int, block_size: int,
                  causal: bool, has_kpm: bool, scale: float, cfg: FwdWsConfig, meta=None) -> None:
    """out [B, H, S, D] and lse [B, H, S] of the block-sparse attention, as ``_fwd_kernel``
    computes them (``cfg.persistent``: by the persistent kernel, balanced by ``meta``'s
    row lengths where given)."""
    if cfg.persistent:
        from .attention_ws_persistent import launch_fwd_ws_persistent  # late: that module imports this one

        launch_fwd_ws_persistent(q, k, v, out, lse, kpm, row_ptr, row_cols, nb, layout_heads, block_size, causal,
                                 has_kpm, scale, cfg, meta)
        return
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
