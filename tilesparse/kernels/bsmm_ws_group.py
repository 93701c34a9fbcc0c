"""Hopper (sm90) warp-specialized dds for small blocks (b 16-64): G output block-columns
per tile, each activation tile loaded once for all of them and held in registers.

Why: in the one-block-column kernels (:mod:`tilesparse.kernels.bsmm_ws`) every stored
block brings an activation tile [BM, b] that serves b output columns only, so each byte
written to and read from shared memory carries b / 2 FLOP; at b 16-64 shared memory, not
the tensor cores, sets the rate (b 64 / 32 / 16 at ~66 / 35 / 11-15 % of dense's rate:
docs/performance.md, twelfth session). Here a tile owns G consecutive output
block-columns and walks the *union* of their reduction blocks (the panel tables of
:mod:`tilesparse.kernels.bsmm_panel`). For each union entry the producer warp TMA-loads
the activation tile and only the stored ones of the G weight blocks; each consumer loads
its rows of the activation tile into registers once and issues one wgmma (activation
from registers, weight block from shared memory) per stored block into that block
column's own accumulator. Absent blocks cost nothing: no zeros are multiplied, unlike the
panel kernel. The activation's shared-memory and L2 traffic drop by the number of
stored blocks per union entry (about G * density / (1 - (1 - density)^G)).

Two consumer partitions (one warpgroup each) take the top and bottom 64 rows of each
128-row tile and run unsynchronised, so one's wgmma fills the other's waits. The grid is
persistent (one program per SM, tiles round-robin in grouped order). The same
reduction order as the panel kernel; no atomics: bitwise deterministic. Opt-in through a
:class:`WsGroupConfig` passed to :func:`tilesparse.kernels.bsmm.dds`; no interpreter
path (tests run on the GPU and compile for sm_90 on the CPU).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from ._device import cached_table, capability_major, shared_memory_bytes, sm_count
from ._launch import launch
from ._tiles import cdiv, check_bools, check_ints, check_power_of_two, check_register_budgets
from .bsmm_panel import panel_tables
from .bsmm_tma import ensure_allocator, row_major_tma_ok
from .bsmm_ws import WS_MIN_M, _alloc_ring, _claim_stage, _Layouts, _nvmma, _tile_coords, hopper_reason

__all__ = ["WsGroupConfig", "MIN_DENSITY", "default_config", "ws_group_supported", "dds_refusal", "small_block_reason",
           "group_tables", "tables_ready", "launch_dds_ws_group"]

_ROWS_PER_CONSUMER = 64  # one warpgroup's wgmma rows
_MASKS = "_tilesparse_group_masks"  # where group_tables remembers the masks on a layout's meta


@dataclasses.dataclass(frozen=True)
class WsGroupConfig:
    """Launch parameters of the grouped kernel: ``group`` output block-columns per tile
    (G), ``stages`` the shared-memory ring (one activation tile and up to G weight blocks
    per stage), ``group_m`` the tile order's group (L2 reuse), ``load_regs`` the
    producer warp's registers, ``mma_regs`` each consumer warpgroup's. Tiles are 128
    rows (two consumers of 64). ``a_from_registers``: each consumer loads its activation
    rows into registers once per union entry and waits for the entry's wgmma before the
    next (ptxas serializes every wgmma if register operands stay in flight across
    iterations); else the wgmma read them from shared memory, and one entry's wgmma run
    while the next entry's are issued. ``entries_per_stage`` E in 2..4 (activation from
    registers only): a ring stage holds E union entries, so the consumers wait, synchronize
    and free a stage once per E entries, and issue each entry's wgmma right behind the
    previous one's (E 3-4: the producer needs ~72-96 registers; E 4 is b 16's default)."""

    group: int = 4
    stages: int = 4
    group_m: int = 8
    load_regs: int = 40
    mma_regs: int = 232
    a_from_registers: bool = True
    entries_per_stage: int = 1

    def __post_init__(self):
        check_power_of_two(self, "group", minimum=1)
        check_bools(self, "a_from_registers")
        if self.entries_per_stage not in (1, 2, 3, 4) or isinstance(self.entries_per_stage, bool):
            raise ValueError(f"WsGroupConfig.entries_per_stage must be 1 to 4, got {self.entries_per_stage!r}")
        if self.entries_per_stage > 1 and not self.a_from_registers:
            raise ValueError(f"WsGroupConfig.entries_per_stage={self.entries_per_stage} needs a_from_registers=True")
        check_ints(self, "stages", "group_m", "load_regs", "mma_regs")
        check_register_budgets(self, "load_regs", "mma_regs")
        if self.group > 8:
            raise ValueError(f"WsGroupConfig.group must be at most 8, got {self.group!r}")
        if self.stages < 2:
            raise ValueError(f"WsGroupConfig.stages must be >= 2, got {self.stages!r}")
        if self.group_m < 1:
            raise ValueError(f"WsGroupConfig.group_m must be >= 1, got {self.group_m!r}")

    @property
    def block_m(self) -> int:
        return 2 * _ROWS_PER_CONSUMER

    def shared_bytes(self, block_size: int, element_bytes: int = 2) -> int:
        """The ring (activation tile + G weight blocks per stage), the two consumers'
        output tiles and the barriers."""
        ring = (self.stages * self.entries_per_stage * (self.block_m * block_size + self.group * block_size ** 2)
                * element_bytes)
        return ring + self.group * self.block_m * block_size * element_bytes + 1024

    def accumulator_registers(self, block_size: int) -> int:
        """fp32 accumulator registers per consumer thread: G tiles of [64, b] over 128 threads."""
        return self.group * _ROWS_PER_CONSUMER * block_size // 128


@gluon.jit
def _entry_tables(pk_ptr, pslots_ptr, u, ok, G: gl.constexpr):
    """Union entry u's reduction block and the G storage slots (-1: absent); nothing is
    read where not ``ok`` (a tile without entries, in a layout that may have none)."""
    slots = (gl.load(pslots_ptr + u * G, mask=ok, other=-1),)
    for g in gl.static_range(1, G):
        slots = slots + (gl.load(pslots_ptr + u * G + g, mask=ok, other=-1),)
    return gl.load(pk_ptr + u, mask=ok, other=0), slots


@gluon.jit
def _stage_tables(pk_ptr, pslots_ptr, u, end, G: gl.constexpr, E: gl.constexpr):
    """The tables of entries u .. u + E - 1 (those before ``end``; the others read as
    absent: no activation, every slot -1), one (k, slots) pair per entry."""
    entries = (_entry_tables(pk_ptr, pslots_ptr, u, u < end, G),)
    for e in gl.static_range(1, E):
        entries = entries + (_entry_tables(pk_ptr, pslots_ptr, u + e, u + e < end, G),)
    return entries


@gluon.jit
def _group_load(descs, bufs, bars, tables, sizes,
                B: gl.constexpr, G: gl.constexpr, E: gl.constexpr, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr):
    """Producer (one warp): for each stage's E union entries of each of this program's
    tiles, wait for a free stage, then TMA-load each entry's activation tile and the
    stored ones of its G weight blocks into it. The stage's ready barrier takes one
    arrival per entry, expecting exactly its bytes (a plain one for an entry past the
    tile's end). The next stage's table reads are issued before this stage's wait, so
    their latency is off the issue path."""
    a_desc, v_desc = descs[0], descs[1]
    a_bufs, v_bufs = bufs[0], bufs[1]
    ready_bars, empty_bars = bars
    pptr_ptr, pk_ptr, pslots_ptr = tables[0], tables[1], tables[2]
    num_pid_m, n_groups, num_tiles = sizes
    A_BYTES: gl.constexpr = a_desc.block_type.nbytes
    V_BYTES: gl.constexpr = v_desc.block_type.nbytes
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, q = _tile_coords(tile, num_pid_m, n_groups, GROUP_M)
        row0 = pid_m * BLOCK_M
        start = gl.load(pptr_ptr + q)
        end = gl.load(pptr_ptr + q + 1)
        entries = _stage_tables(pk_ptr, pslots_ptr, start, end, G, E)
        for u in range(start, end, E):
            entries_next = _stage_tables(pk_ptr, pslots_ptr, u + E, end, G, E)
            s, ready = _claim_stage(step, ready_bars, empty_bars)
            for e in gl.static_range(E):
                k, slots = entries[e]
                present = u + e < end
                stored = (slots[0] >= 0).to(gl.int32)
                for g in gl.static_range(1, G):
                    stored += (slots[g] >= 0).to(gl.int32)
                for n in gl.static_range(1, G + 1):  # one arrival expecting this entry's bytes
                    mbarrier.expect(ready, A_BYTES + n * V_BYTES, pred=present & (stored == n))
                if E > 1:  # an entry past the tile's end: a plain arrival
                    mbarrier.arrive(ready, count=1, pred=u + e >= end)
                tma.async_copy_global_to_shared(a_desc, [row0, k * B], ready, a_bufs.index(s * E + e), pred=present)
                for g in gl.static_range(G):
                    tma.async_copy_global_to_shared(v_desc, [slots[g] * B, 0], ready,
                                                    v_bufs.index((s * E + e) * G + g), pred=slots[g] >= 0)
            entries = entries_next
            step += 1


@gluon.jit
def _maybe_mma(acc, a, b, present, INIT: gl.constexpr = True):
    """acc += a @ b issued asynchronously where ``present``, else acc unchanged (as the
    same asynchronous-accumulator type, so both branches agree; INIT: ``acc`` is still a
    plain tensor, not yet an accumulator of this stage)."""
    if INIT:
        acc = warpgroup_mma_init(acc)
    if present:
        acc = warpgroup_mma(a, b, acc, is_async=True)
    return acc


@gluon.jit
def _entry_mmas(accs, a, v_bufs, first, mask, G: gl.constexpr, TRANS_V: gl.constexpr, INIT: gl.constexpr = True):
    """One union entry's products: for each block column g whose bit is set in ``mask``,
    accs[g] += a @ op(v_bufs[first + g]), asynchronously (op: transposed where TRANS_V)."""
    for g in gl.static_range(G):
        if TRANS_V:
            v = v_bufs.index(first + g).permute((1, 0))
        else:
            v = v_bufs.index(first + g)
        accs = accs[:g] + (_maybe_mma(accs[g], a, v, ((mask >> g) & 1) != 0, INIT),) + accs[g + 1:]
    return accs


@gluon.jit
def _popcount(mask, G: gl.constexpr):
    """The number of bits set among the low G of ``mask``."""
    n = mask & 1
    for g in gl.static_range(1, G):
        n += (mask >> g) & 1
    return n


@gluon.jit
def _wait_all(accs, G: gl.constexpr):
    """Wait for every wgmma in flight; the G accumulators, as a tuple."""
    done = warpgroup_mma_wait(num_outstanding=0, deps=accs)
    if G == 1:
        done = (done,)
    return done


@gluon.jit
def _wait_for_previous(accs, issued, G: gl.constexpr):
    """Wait until at most ``issued`` wgmma groups are in flight (this union entry's: each
    asynchronous wgmma commits its own group, and their number varies, while the wait
    takes a constant): the previous entry's are done."""
    done = warpgroup_mma_wait(num_outstanding=G, deps=accs)
    if G == 1:
        done = (done,)
    for n in gl.static_range(G):
        if issued == n:  # the waits chain through one set of values: no copies of in-flight registers
            done = warpgroup_mma_wait(num_outstanding=n, deps=done)
            if G == 1:
                done = (done,)
    return done


@gluon.jit
def _pair_step(accs, u, end, step, a_bufs, v_bufs, ready_bars, empty_bars, pmask_ptr, a_operand,
               G: gl.constexpr, E: gl.constexpr, ROLE: gl.constexpr, ROWS: gl.constexpr, TRANS_V: gl.constexpr):
    """One stage of E entries (activation from registers): wait for it, then per entry its
    rows into registers and one asynchronous wgmma per stored block, the second entry's
    right behind the first's; one wait for all of them, then free the stage. Entries past
    ``end`` have no stored blocks (mask 0)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0] // E
    masks = (gl.load(pmask_ptr + u),)  # u < end
    for e in gl.static_range(1, E):
        masks = masks + (gl.where(u + e < end, gl.load(pmask_ptr + gl.minimum(u + e, end)), 0),)
    s = step % STAGES
    mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
    held = ()
    for e in gl.static_range(E):
        a = a_bufs.index(s * E + e).slice(ROLE * ROWS, ROWS, dim=0).load(a_operand)
        held = held + (a,)
        accs = _entry_mmas(accs, a, v_bufs, (s * E + e) * G, masks[e], G, TRANS_V, e == 0)
    accs = warpgroup_mma_wait(num_outstanding=0, deps=accs + held)[:G]
    mbarrier.arrive(empty_bars.index(s), count=1)
    return accs


@gluon.jit
def _group_mma(descs, bufs, bars, tables, sizes,
               B: gl.constexpr, G: gl.constexpr, E: gl.constexpr, BLOCK_M: gl.constexpr, TRANS_V: gl.constexpr,
               HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr, A_REGS: gl.constexpr, ROLE: gl.constexpr,
               num_warps: gl.constexpr):
    """A consumer (one warpgroup): rows ROLE * 64 .. + 64 of each tile. Per union entry:
    the activation rows into registers, one asynchronous wgmma per stored weight block
    into its block column's accumulator, wait, free the stage. Then each of the G output
    blocks (bias, cast) through shared memory and a TMA store."""
    c_desc = descs[2]
    a_bufs, v_bufs, c_bufs = bufs
    ready_bars, empty_bars = bars
    pptr_ptr, pmask_ptr, bias_ptr, n_out_cols = tables[0], tables[3], tables[4], tables[5]
    num_pid_m, n_groups, num_tiles = sizes
    STAGES: gl.constexpr = a_bufs.type.shape[0] // E
    ROWS: gl.constexpr = BLOCK_M // 2
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, B, 16])
    a_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    zero = gl.zeros((ROWS, B), dtype=gl.float32, layout=mma_layout)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, q = _tile_coords(tile, num_pid_m, n_groups, GROUP_M)
        start = gl.load(pptr_ptr + q)
        end = gl.load(pptr_ptr + q + 1)
        accs = (zero,) * G
        if E > 1:
            for u in range(start, end, E):
                accs = _pair_step(accs, u, end, step, a_bufs, v_bufs, ready_bars, empty_bars, pmask_ptr, a_operand,
                                  G, E, ROLE, ROWS, TRANS_V)
                step += 1
        else:
            mask_next = gl.load(pmask_ptr + start)  # pmask has one entry past the last union entry
            for u in range(start, end):
                mask = mask_next
                mask_next = gl.load(pmask_ptr + u + 1)
                s = step % STAGES
                mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
                if A_REGS:
                    a = a_bufs.index(s).slice(ROLE * ROWS, ROWS, dim=0).load(a_operand)
                else:
                    a = a_bufs.index(s).slice(ROLE * ROWS, ROWS, dim=0)
                accs = _entry_mmas(accs, a, v_bufs, s * G, mask, G, TRANS_V)
                if A_REGS:
                    # ptxas serializes every wgmma if register operands stay in flight across
                    # iterations: wait for this entry's, then free its stage
                    accs = warpgroup_mma_wait(num_outstanding=0, deps=accs + (a,))[:G]
                    mbarrier.arrive(empty_bars.index(s), count=1)
                else:
                    # this entry's wgmma stay in flight; the previous entry's are done: free its stage
                    accs = _wait_for_previous(accs, _popcount(mask, G), G)
                    mbarrier.arrive(empty_bars.index((step + STAGES - 1) % STAGES), count=1, pred=u > start)
                step += 1
            if not A_REGS:
                accs = _wait_all(accs, G)
                mbarrier.arrive(empty_bars.index((step + STAGES - 1) % STAGES), count=1, pred=end > start)
        tma.store_wait(pendings=0)  # the previous tile's stores have left the output buffers
        for g in gl.static_range(G):
            acc = accs[g]
            if HAS_BIAS:
                cols = (q * G + g) * B + gl.arange(0, B, layout=gl.SliceLayout(0, mma_layout))
                acc = acc + gl.load(bias_ptr + cols, mask=cols < n_out_cols, other=0.0).to(gl.float32)[None, :]
            c_bufs.index(ROLE * G + g).store(acc.to(c_desc.dtype))
        fence_async_shared()
        for g in gl.static_range(G):
            # a block column past the output (the last group's tail) lies outside C: TMA writes nothing
            tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M + ROLE * ROWS, (q * G + g) * B],
                                            c_bufs.index(ROLE * G + g))
    tma.store_wait(pendings=0)


@gluon.jit
def _dds_ws_group_kernel(
    a_ptr, v_ptr, c_ptr, bias_ptr, pptr_ptr, pk_ptr, pslots_ptr, pmask_ptr,
    M, K_A, n_groups, n_out_cols, nnz, stride_am, stride_cm,
    B: gl.constexpr, G: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
    TRANS_V: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, A_REGS: gl.constexpr, E: gl.constexpr,
    a_layout: gl.constexpr, v_layout: gl.constexpr, c_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Persistent: program p takes tiles p, p + P, ... of the grouped order (tile = 128
    rows x G block columns). Descriptors built on the device; rows past M are zero-filled
    on load and clipped on store, as are block columns past the output."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [BLOCK_M, B], a_layout)
    v_desc = tma.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [B, B], v_layout)
    c_desc = tma.make_tensor_descriptor(c_ptr, [M, n_out_cols], [stride_cm, 1], [BLOCK_M // 2, B], c_layout)
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES * E, BLOCK_M, B], a_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES * E * G, B, B], v_layout)
    c_bufs = gl.allocate_shared_memory(dtype, [2 * G, BLOCK_M // 2, B], c_layout)
    ready_bars, empty_bars = _alloc_ring(STAGES, 2, E)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    descs = (a_desc, v_desc, c_desc)
    bufs = (a_bufs, v_bufs, c_bufs)
    bars = (ready_bars, empty_bars)
    tables = (pptr_ptr, pk_ptr, pslots_ptr, pmask_ptr, bias_ptr, n_out_cols)
    sizes = (num_pid_m, n_groups, num_pid_m * n_groups)
    gl.warp_specialize([
        (_group_mma, (descs, bufs, bars, tables, sizes, B, G, E, BLOCK_M, TRANS_V, HAS_BIAS, GROUP_M, A_REGS, 0,
                       num_warps)),
        (_group_mma, (descs, bufs, bars, tables, sizes, B, G, E, BLOCK_M, TRANS_V, HAS_BIAS, GROUP_M, A_REGS, 1,
                       num_warps)),
        (_group_load, (descs, bufs, bars, tables, sizes, B, G, E, BLOCK_M, GROUP_M)),
    ], [num_warps, 1], [MMA_REGS, LOAD_REGS])


@functools.lru_cache(maxsize=None)
def _layouts(b: int, dtype: torch.dtype) -> _Layouts:
    """The shared-memory layouts of the activation tile, a weight block and an output tile."""
    return _Layouts(_nvmma([128, b], dtype), _nvmma([b, b], dtype), _nvmma([_ROWS_PER_CONSUMER, b], dtype))


def group_tables(meta: torch.Tensor, block_rows: int, block_cols: int, trans: bool, group: int):
    """(pptr, pk, pslots, pmask): the panel tables (:func:`bsmm_panel.panel_tables`) and
    per union entry a bitmask of its stored blocks (bit g: block column g of the group),
    one zero entry past the end. Remembered on ``meta`` like the panel tables."""
    pptr, pk, pslots = panel_tables(meta, block_rows, block_cols, trans, group)

    def build():
        bits = (pslots >= 0).to(torch.int32) << torch.arange(group, dtype=torch.int32, device=pslots.device)
        return torch.cat([bits.sum(dim=1, dtype=torch.int32), bits.new_zeros(1)])

    return pptr, pk, pslots, cached_table(meta, _MASKS, (block_rows, block_cols, trans, group), build)


# The shipped choice, measured on the H200 (scripts/probes/ws_sweep.py, 8192x4096², fprop,
# kernel time; docs/performance.md, eighteenth session): (block size, density at least)
# -> config. At density 0.5: b 32 0.573 -> 0.443 ms (35 -> 45 % of dense's rate; the
# activation from registers, groups of 8), b 64 0.307 -> 0.271 ms (66 -> 75 %; groups of
# 4, 3 stages). At density 0.25 and below every block size lost (0.8-1.0x): the other
# kernels run there.
MIN_DENSITY = 0.45  # below it no grouped config was measured faster: tuned entries too are ignored there
_DEFAULTS = (
    (64, MIN_DENSITY, WsGroupConfig(4, 3)),
    # b 32: two union entries per ring stage, 3 stages (H200, density 0.5: 8192x4096² fprop
    # 0.438 -> 0.402 ms, 16384x8192² 3.79 -> 3.30 ms against G 8 / 4 stages / one entry)
    (32, MIN_DENSITY, WsGroupConfig(8, 3, load_regs=56, entries_per_stage=2)),
    # b 16: four union entries per stage (H200, density 0.5, twentieth session: 8192x4096²
    # fprop / bprop 1.33 / 1.38 -> 1.19 / 1.19 ms against the panel kernel's tuned entry,
    # 16384x8192² 14.5 -> 9.2 ms against the Triton tile kernel)
    (16, MIN_DENSITY, WsGroupConfig(8, 3, load_regs=96, entries_per_stage=4)),
)


def default_config(a: torch.Tensor, block_size: int, density: float) -> WsGroupConfig | None:
    """The grouped kernel's config where it is the measured choice (sm90, 16-bit, at least
    ``WS_MIN_M`` rows, the block sizes and densities of ``_DEFAULTS``), else None."""
    if (a.dtype not in (torch.bfloat16, torch.float16) or a.shape[0] < WS_MIN_M or a.device.type != "cuda"
            or capability_major(a.device) != 9):
        return None
    for block, least, cfg in _DEFAULTS:
        if block == block_size and density >= least:
            return cfg
    return None


def tables_ready(meta: torch.Tensor, block_rows: int, block_cols: int, trans: bool, group: int) -> bool:
    """Whether :func:`group_tables` for these arguments are already built. They cannot be
    built while a CUDA graph is being captured (their size needs a host sync), so callers
    that may capture check this first."""
    return (block_rows, block_cols, trans, group) in meta.__dict__.get(_MASKS, {})


def small_block_reason(a: torch.Tensor, values: torch.Tensor, c: torch.Tensor, accumulator_registers: int,
                       knob: str) -> str | None:
    """Why a Hopper kernel for b 16-64 with its accumulators in registers (this one, the
    resident fprop) cannot take these operands' device, dtypes and block size, or the
    config's ``accumulator_registers`` per thread (``knob`` names the setting behind them);
    None if it can."""
    b = values.shape[-1]
    why = hopper_reason(a)
    if why is not None:
        return why
    if c.dtype != a.dtype or values.dtype != a.dtype:
        return f"needs one dtype: A is {a.dtype}, C {c.dtype}, the blocks {values.dtype}"
    if b not in (16, 32, 64):
        return f"needs a block size of 16, 32 or 64, got {b}"
    if accumulator_registers > 128:
        return f"would hold {accumulator_registers} accumulator registers per thread ({knob} at b = {b}); at most 128"
    return None


def ws_group_supported(a: torch.Tensor, values: torch.Tensor, c: torch.Tensor, cfg: WsGroupConfig) -> str | None:
    """Why this kernel cannot run these operands, or None if it can."""
    b = values.shape[-1]
    why = small_block_reason(a, values, c, cfg.accumulator_registers(b), f"group={cfg.group}")
    if why is not None:
        return why
    for name, t in (("A", a), ("C", c)):
        if not row_major_tma_ok(t):
            return f"needs a row-major {name} with 16-byte-aligned, non-overlapping rows"
    if values.data_ptr() % 16 or not values.is_contiguous():
        return "needs contiguous, 16-byte-aligned block values"
    if max(a.shape[0] + cfg.block_m, a.shape[1], values.shape[0] * b, c.shape[1] + cfg.group * b) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    if cfg.shared_bytes(b, a.element_size()) > shared_memory_bytes(a.device):
        return (f"needs {cfg.shared_bytes(b, a.element_size())} bytes of shared memory at this config, "
                "more than the GPU has")
    return None


def launch_dds_ws_group(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v, cfg: WsGroupConfig):
    """C = A @ op(S) (+ bias) into the preallocated C; ``trans`` picks the grouping
    (fprop groups S's block-rows), ``trans_v`` how stored blocks are read (see bsmm.dds).
    The operands must be ones :func:`ws_group_supported` accepts: ``bsmm.dds`` checks
    before it calls this, as for the other launchers."""
    b = values.shape[-1]
    pptr, pk, pslots, pmask = group_tables(meta, block_rows, block_cols, trans, cfg.group)
    if pslots.numel() >= 1 << 31:
        raise ValueError(f"the group tables hold {pslots.numel()} entries; the kernel indexes them with 32 bits")
    n_groups = pptr.numel() - 1
    m = a.shape[0]
    grid = max(1, min(cdiv(m, cfg.block_m) * n_groups, sm_count(a.device)))
    lay = _layouts(b, a.dtype)
    ensure_allocator()
    launch(_dds_ws_group_kernel, (grid,),
        a, values, c, bias if bias is not None else c, pptr, pk, pslots, pmask,
        m, a.shape[1], n_groups, c.shape[1], values.shape[0], a.stride(0), c.stride(0),
        B=b, G=cfg.group, BLOCK_M=cfg.block_m, STAGES=cfg.stages,
        TRANS_V=trans_v, HAS_BIAS=bias is not None, GROUP_M=cfg.group_m,
        LOAD_REGS=cfg.load_regs, MMA_REGS=cfg.mma_regs, A_REGS=cfg.a_from_registers, E=cfg.entries_per_stage,
        a_layout=lay.a, v_layout=lay.v, c_layout=lay.c,
        num_warps=4,
    )


def dds_refusal(a, values, c, meta, block_rows: int, block_cols: int, trans: bool,
                cfg: WsGroupConfig) -> str | None:
    """Why the grouped kernel cannot run this call (:func:`ws_group_supported`,
    or its tables not built yet during a CUDA-graph capture, where their host sync is not
    allowed and the other kernels run instead unless the call was warmed up), or None."""
    why = ws_group_supported(a, values, c, cfg)
    if (why is None and meta.is_cuda and torch.cuda.is_current_stream_capturing()
            and not tables_ready(meta, block_rows, block_cols, trans, cfg.group)):
        why = ("builds its tables with a host sync, not allowed while a CUDA graph is being captured: "
               "call it once before capturing")
    return why
