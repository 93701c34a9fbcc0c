"""Hopper (sm90) warp-specialized, persistent block-sparse dds, C = A @ op(S), written in
Gluon (Triton's explicit-layout dialect), with a producer warp and consumer warpgroups
as CUTLASS's Hopper GEMMs are built; also the config, shared-memory ring and MMA helpers
that :mod:`tilesparse.kernels.bsmm_ws_sdd` (updat's sampled product) shares.

Why: Triton's own pipeliner stops prefetching across the dependent scalar load of the
block index once tiles grow past 128x128 (docs/performance.md, "the Triton mainloop
ceiling"), which holds the b = 128 kernel at ~75 % of cuBLAS. Here one warp reads the
layout's tables and issues the tensor-memory-accelerator (TMA) loads into a ring of
shared-memory stages; the consumer warps only wait on mbarriers and issue wgmma, so the
index lookups are off their critical path. The grid is persistent (one program per SM)
and the producer runs ahead into the next tile while the consumers store the last one.

Same math and tables as :mod:`tilesparse.kernels.bsmm` (read its docstring):
trans=True is fprop (values[slot] used as S_block^T), trans=False is bprop. The
launcher in :mod:`tilesparse.kernels.bsmm` calls it for a :class:`WsConfig` and by
default where measured faster (:func:`default_config`); :func:`ws_supported` says where
it applies (sm90; 16-bit, or fp32 as TF32; row-major 16-byte-aligned operands; b 16-128:
b 16 and 32 by explicit config only, compiled for sm_90 but not yet run on a GPU). Measured on an H200 (docs/performance.md, tenth and eleventh sessions): the
default for 16-bit and TF32 at large M. The balanced tile schedule
(``WsConfig.balanced``, :mod:`tilesparse.kernels.ws_schedule`) is written and compiled
for sm_90, not yet run on a GPU. There is no interpreter path: tests run the kernels on
the GPU (``tests/test_bsmm_ws_gpu.py``) and compile them for sm_90 on the CPU
(``tests/test_sm90_codegen.py``).
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
    warpgroup_mma_wait,
)

from ._device import capability_major, shared_memory_bytes, sm_count
from ._launch import launch
from .bsmm_tma import ensure_allocator, row_major_tma_ok  # descriptor scratch; what TMA can address
from ._tiles import cdiv, check_power_of_two


@dataclasses.dataclass(frozen=True)
class WsConfig:
    """Launch parameters of the warp-specialized kernel. ``block_m`` rows of A per tile
    (dds: at least 16 per warp, a warpgroup's wgmma covering 64 rows; sdd: the M step), ``block_k``
    the reduction step, ``stages`` the shared-memory ring, ``group_m`` the tile order's
    group (L2 reuse), ``load_regs`` the producer warp's register budget. ``pingpong``: a
    second consumer of ``num_warps`` warps (``mma_regs`` registers each) takes every other
    tile, so that one consumer's epilogue overlaps the other's main loop. ``balanced``
    (dds): programs take their tiles from a schedule balanced by each tile's block count
    (:mod:`tilesparse.kernels.ws_schedule`) instead of round-robin."""

    block_m: int = 128
    block_k: int = 64
    num_warps: int = 8
    stages: int = 4
    group_m: int = 8
    load_regs: int = 40
    pingpong: bool = False
    mma_regs: int = 232
    balanced: bool = False

    def __post_init__(self):
        check_power_of_two(self, "block_m", "block_k")
        if self.num_warps not in (4, 8):
            raise ValueError(f"WsConfig.num_warps must be 4 or 8, got {self.num_warps!r}")
        if not 64 <= self.block_m <= 256:
            raise ValueError(f"WsConfig.block_m must be 64, 128 or 256, got {self.block_m!r}")
        if self.stages < 2:
            raise ValueError(f"WsConfig.stages must be >= 2, got {self.stages!r}")
        if self.pingpong and self.num_warps != 4:
            raise ValueError(f"WsConfig.pingpong needs num_warps=4 (one warpgroup per consumer), got {self.num_warps!r}")
        if self.group_m < 1:
            raise ValueError(f"WsConfig.group_m must be >= 1, got {self.group_m!r}")

    def shared_bytes(self, block_size: int, element_bytes: int = 2, sdd: bool = False) -> int:
        """Shared memory the kernel allocates: the ring of operand tiles plus the output
        tile(s) and barriers (dds; ``sdd``: the sampled product's kernel, whose ring holds
        two [block_m, b] activation tiles per stage and whose output is one block)."""
        if sdd:
            return self.stages * 2 * self.block_m * block_size * element_bytes + block_size ** 2 * element_bytes + 1024
        ring = self.stages * (self.block_m + block_size) * self.block_k * element_bytes
        return ring + (1 + self.pingpong) * self.block_m * block_size * element_bytes + 1024


@gluon.constexpr_function
def _warps_per_cta(block_m, num_warps):
    # wgmma's atom is 4 warps along M (64 rows); more warps go along M while rows last
    warps_m = min(num_warps, max(4, block_m // 16))
    return [warps_m, num_warps // warps_m]


@gluon.jit
def _tile_coords(tile, num_pid_m, n_out_blocks, GROUP_M: gl.constexpr):
    """(m-tile, output block-column) of a linear tile index, grouped as in
    :func:`tilesparse.kernels._tiles.grouped_tile`."""
    pids_per_group = GROUP_M * n_out_blocks
    first_m = (tile // pids_per_group) * GROUP_M
    group_rows = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % pids_per_group) % group_rows
    pid_n = (tile % pids_per_group) // group_rows
    return pid_m, pid_n


@gluon.jit
def _program_tiles(sched_ptr, pid, nprog, num_tiles, SCHEDULED: gl.constexpr):
    """(lo, hi, stride) of this program's walk: its slice of the balanced schedule (whose
    first nprog + 1 entries are the programs' offsets), or round-robin p, p + P, ..."""
    if SCHEDULED:
        lo = gl.load(sched_ptr + pid)
        hi = gl.load(sched_ptr + pid + 1)
        stride = 1
    else:
        lo = pid
        hi = num_tiles
        stride = nprog
    return lo, hi, stride


@gluon.jit
def _nth_tile(sched_ptr, i, nprog, SCHEDULED: gl.constexpr):
    """The grouped-order index of the tile at position i of the walk."""
    if SCHEDULED:
        tile = gl.load(sched_ptr + nprog + 1 + i)
    else:
        tile = i
    return tile


@gluon.jit
def _alloc_ring(STAGES: gl.constexpr, READERS: gl.constexpr = 1, WRITES: gl.constexpr = 1):
    """The ring's barriers, initialised: per stage one `ready` (its loads have landed,
    completed by WRITES arrivals, each with or without expected bytes) and one `empty`
    (its readers are done: completed once each of READERS consumer partitions has
    arrived)."""
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=WRITES)
        mbarrier.init(empty_bars.index(i), count=READERS)
    return ready_bars, empty_bars


@gluon.jit
def _claim_stage(step, ready_bars, empty_bars):
    """Producer side of the ring: wait until stage ``step % STAGES`` is free. A stage's
    empty barrier completes once per reuse; the first pass finds it free. Returns (the
    stage, its ready barrier)."""
    STAGES: gl.constexpr = empty_bars.type.shape[0]
    s = step % STAGES
    ready = ready_bars.index(s)
    mbarrier.wait(empty_bars.index(s), ((step // STAGES) & 1) ^ 1)
    return s, ready


@gluon.jit
def _fill_stage(step, a_desc, a_coord, b_desc, b_coord, a_bufs, b_bufs, ready_bars, empty_bars):
    """Producer side of the ring: wait until stage ``step % STAGES`` is free, then
    TMA-load one tile of each operand into it (both complete its ready barrier)."""
    s, _ = _claim_stage(step, ready_bars, empty_bars)
    mbarrier.expect(ready_bars.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, a_coord, ready_bars.index(s), a_bufs.index(s))
    tma.async_copy_global_to_shared(b_desc, b_coord, ready_bars.index(s), b_bufs.index(s))


@gluon.jit
def _mma_stages(acc, step, n_steps, a_bufs, b_bufs, ready_bars, empty_bars,
                TRANS_A: gl.constexpr, TRANS_B: gl.constexpr):
    """Consumer side of the ring: acc += the products of stages step .. step + n_steps - 1
    (transposed views where asked), one wgmma in flight; each stage is released once the
    wgmma that read it has retired. Returns the finished accumulator."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    for i in range(n_steps):
        g = step + i
        s = g % STAGES
        mbarrier.wait(ready_bars.index(s), (g // STAGES) & 1)
        if TRANS_A:
            a = a_bufs.index(s).permute((1, 0))
        else:
            a = a_bufs.index(s)
        if TRANS_B:
            b = b_bufs.index(s).permute((1, 0))
        else:
            b = b_bufs.index(s)
        acc = warpgroup_mma(a, b, acc, is_async=True)
        # one MMA stays in flight; the one before it has read its stage: free that stage
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty_bars.index((g + STAGES - 1) % STAGES), count=1, pred=i > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty_bars.index((step + n_steps + STAGES - 1) % STAGES), count=1, pred=n_steps > 0)
    return acc


@gluon.jit
def _ws_load_partition(descs, bufs, bars, tables, sizes,
                       B: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr,
                       TRANS_V: gl.constexpr, HAS_SLOT: gl.constexpr, GROUP_M: gl.constexpr,
                       SCHEDULED: gl.constexpr):
    """Producer (one warp): walk this program's tiles and their block lists, and fill
    the ring: wait for a free stage, then TMA-load the A tile and the S tile into it."""
    a_desc, v_desc, c_desc = descs
    a_bufs, v_bufs, c_bufs = bufs
    ready_bars, empty_bars, turn_bars = bars
    ptr_ptr, idx_ptr, slot_ptr, bias_ptr, sched_ptr = tables
    num_pid_m, n_out_blocks, num_tiles = sizes
    K_STEPS: gl.constexpr = B // BLOCK_K
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    lo, hi, stride = _program_tiles(sched_ptr, pid, nprog, num_tiles, SCHEDULED)
    step = 0
    for i in range(lo, hi, stride):
        tile = _nth_tile(sched_ptr, i, nprog, SCHEDULED)
        pid_m, pid_n = _tile_coords(tile, num_pid_m, n_out_blocks, GROUP_M)
        row0 = pid_m * BLOCK_M
        start = gl.load(ptr_ptr + pid_n)
        end = gl.load(ptr_ptr + pid_n + 1)
        for t in range(start * K_STEPS, end * K_STEPS):
            e = t // K_STEPS
            kk = (t % K_STEPS) * BLOCK_K
            blk = gl.load(idx_ptr + e)
            if HAS_SLOT:
                slot = gl.load(slot_ptr + e)
            else:
                slot = e
            if TRANS_V:
                v_coord = [slot * B, kk]
            else:
                v_coord = [slot * B + kk, 0]
            _fill_stage(step, a_desc, [row0, blk * B + kk], v_desc, v_coord, a_bufs, v_bufs, ready_bars, empty_bars)
            step += 1


@gluon.jit
def _ws_mma_partition(descs, bufs, bars, tables, sizes,
                      B: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr,
                      TRANS_V: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr,
                      CONSUMERS: gl.constexpr, ROLE: gl.constexpr, SCHEDULED: gl.constexpr,
                      num_warps: gl.constexpr):
    """A consumer: per tile, wgmma over the ring's stages with one MMA in flight,
    releasing each stage once the MMA that read it has retired; then the epilogue
    (bias, cast, shared memory, TMA store) while the producer loads ahead. With two
    consumers (ping-pong) consumer ``ROLE`` takes every other tile of the program: the
    ring hands out stages in tile order, so one's main loop runs while the other stores.
    Their main loops take turns (``turn_bars``): an mbarrier's parity wait cannot tell
    its phase from one two phases later, so a consumer must not wait on a stage more
    than one round ahead of the one the other is still reading."""
    a_desc, v_desc, c_desc = descs
    a_bufs, v_bufs, c_bufs = bufs
    ready_bars, empty_bars, turn_bars = bars
    ptr_ptr, idx_ptr, slot_ptr, bias_ptr, sched_ptr = tables
    num_pid_m, n_out_blocks, num_tiles = sizes
    K_STEPS: gl.constexpr = B // BLOCK_K
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=_warps_per_cta(BLOCK_M, num_warps),
        instr_shape=[16, B, 256 // c_desc.dtype.primitive_bitwidth])  # k: 16 for 16-bit, 8 for tf32
    c_smem = c_bufs.index(ROLE)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    lo, hi, stride = _program_tiles(sched_ptr, pid, nprog, num_tiles, SCHEDULED)
    step = 0  # the ring position of the tile's first stage, counted over every consumer's tiles
    j = 0
    own = 0
    for i in range(lo, hi, stride):
        tile = _nth_tile(sched_ptr, i, nprog, SCHEDULED)
        pid_m, pid_n = _tile_coords(tile, num_pid_m, n_out_blocks, GROUP_M)
        start = gl.load(ptr_ptr + pid_n)
        end = gl.load(ptr_ptr + pid_n + 1)
        n_steps = (end - start) * K_STEPS
        if j % CONSUMERS == ROLE:
            if CONSUMERS > 1:  # consumer 0 goes first (a fresh barrier passes a parity-1 wait)
                mbarrier.wait(turn_bars.index(ROLE), (own & 1) ^ (1 - ROLE))
            acc = gl.zeros((BLOCK_M, B), dtype=gl.float32, layout=mma_layout)
            acc = _mma_stages(acc, step, n_steps, a_bufs, v_bufs, ready_bars, empty_bars, False, TRANS_V)
            if CONSUMERS > 1:  # this tile's stages are all read and released: the other's turn
                mbarrier.arrive(turn_bars.index(1 - ROLE), count=1)
            own += 1
            if HAS_BIAS:
                cols = pid_n * B + gl.arange(0, B, layout=gl.SliceLayout(0, mma_layout))
                acc = acc + gl.load(bias_ptr + cols).to(gl.float32)[None, :]
            tma.store_wait(pendings=0)  # this consumer's previous store has left its buffer
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * B], c_smem)
        step += n_steps
        j += 1
    tma.store_wait(pendings=0)


@gluon.jit
def _dds_ws_kernel(
    a_ptr, v_ptr, c_ptr, bias_ptr, ptr_ptr, idx_ptr, slot_ptr, sched_ptr,
    M, K_A, n_out_blocks, nnz, stride_am, stride_cm,
    B: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    TRANS_V: gl.constexpr, HAS_SLOT: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr,
    LOAD_REGS: gl.constexpr, PINGPONG: gl.constexpr, MMA_REGS: gl.constexpr, SCHEDULED: gl.constexpr,
    a_layout: gl.constexpr, v_layout: gl.constexpr, c_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Persistent: program p takes tiles p, p + P, ... of the grouped order (SCHEDULED:
    its slice of the balanced schedule at sched_ptr). Descriptors
    are built on the device (no host encoding per launch); rows past M are zero-filled
    on load and clipped on store. PINGPONG: a second consumer warpgroup (a worker
    partition of num_warps warps, MMA_REGS registers) takes every other tile."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    CONSUMERS: gl.constexpr = 2 if PINGPONG else 1
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [BLOCK_M, BLOCK_K], a_layout)
    if TRANS_V:
        v_desc = tma.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [B, BLOCK_K], v_layout)
    else:
        v_desc = tma.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [BLOCK_K, B], v_layout)
    c_desc = tma.make_tensor_descriptor(c_ptr, [M, n_out_blocks * B], [stride_cm, 1], [BLOCK_M, B], c_layout)

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], a_layout)
    if TRANS_V:
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, B, BLOCK_K], v_layout)
    else:
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, B], v_layout)
    c_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_M, B], c_layout)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)

    num_pid_m = gl.cdiv(M, BLOCK_M)
    descs = (a_desc, v_desc, c_desc)
    bufs = (a_bufs, v_bufs, c_bufs)
    bars = (ready_bars, empty_bars, turn_bars)
    tables = (ptr_ptr, idx_ptr, slot_ptr, bias_ptr, sched_ptr)
    sizes = (num_pid_m, n_out_blocks, num_pid_m * n_out_blocks)
    load_args = (descs, bufs, bars, tables, sizes, B, BLOCK_M, BLOCK_K, TRANS_V, HAS_SLOT, GROUP_M, SCHEDULED)
    if PINGPONG:
        gl.warp_specialize([
            (_ws_mma_partition, (descs, bufs, bars, tables, sizes, B, BLOCK_M, BLOCK_K, TRANS_V, HAS_BIAS, GROUP_M,
                                 CONSUMERS, 0, SCHEDULED, num_warps)),
            (_ws_mma_partition, (descs, bufs, bars, tables, sizes, B, BLOCK_M, BLOCK_K, TRANS_V, HAS_BIAS, GROUP_M,
                                 CONSUMERS, 1, SCHEDULED, num_warps)),
            (_ws_load_partition, load_args),
        ], [num_warps, 1], [MMA_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_ws_mma_partition, (descs, bufs, bars, tables, sizes, B, BLOCK_M, BLOCK_K, TRANS_V, HAS_BIAS, GROUP_M,
                                 CONSUMERS, 0, SCHEDULED, num_warps)),
            (_ws_load_partition, load_args),
        ], [1], [LOAD_REGS])


def _nvmma(shape: list[int], dtype: torch.dtype):
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(shape, gl_dtype)


@dataclasses.dataclass(frozen=True)
class _Layouts:
    a: object
    v: object
    c: object


@functools.lru_cache(maxsize=None)
def _layouts(cfg: WsConfig, b: int, trans_v: bool, dtype: torch.dtype) -> _Layouts:
    """The dds kernel's shared-memory layouts (remembered: a launch asks every call)."""
    v_shape = [b, cfg.block_k] if trans_v else [cfg.block_k, b]
    return _Layouts(_nvmma([cfg.block_m, cfg.block_k], dtype), _nvmma(v_shape, dtype), _nvmma([cfg.block_m, b], dtype))


# The shipped choice, measured on the H200 (scripts/probes/ws_sweep.py, docs/performance.md):
# (block size, density at least) -> config, first match; the large-batch path only (M
# above the small-batch crossover table's range, which ends at 512).
# b 128: two ping-pong consumers of one warpgroup each, 4 stages, tiles from the balanced
# schedule (ws_schedule.py). Twelfth session, kernel time, fprop / bprop, 8192x4096² and
# 16384x8192², density 0.05-0.5: 1.02-1.09x faster than the round-robin cooperative
# kernel (128x128, 8 warps, 5 stages) everywhere but 8192x4096² at density 0.05 (within
# 3 %); 83-84 % of dense's rate at density 0.25 on the main shape, 90-92 % on the large.
# b 64: the cooperative round-robin kernel; balancing gained <= 4 % at density <= 0.1 on
# the large shape and lost up to 4 % at 0.5, so it stays off.
_DEFAULTS = (
    (128, 0.0, WsConfig(128, 64, 4, 4, pingpong=True, balanced=True)),
    (64, 0.0, WsConfig(128, 64, 8, 5)),
)
# fp32 inputs run as TF32 (32-wide K steps: the swizzled tiles' rows are 128 bytes), tiles
# from the balanced schedule. Measured on the H200, b 128, 8192x4096², fprop, kernel time:
# 0.458 / 0.251 / 0.132 / 0.088 ms at density 0.5 / 0.25 / 0.1 / 0.05 (dense TF32 0.812 ms),
# against 0.468 / 0.278 / 0.141 / 0.090 round-robin and 0.667 / 0.371 / 0.186 / 0.117 for
# the Triton tile kernel: 89 / 81 / 61 / 46 % of dense TF32's rate. b 64 was not measured.
_TF32_DEFAULTS = (
    (128, 0.0, WsConfig(128, 32, 8, 4, balanced=True)),
)
WS_MIN_M = 513


def default_config(a: torch.Tensor, block_size: int, density: float) -> WsConfig | None:
    """The warp-specialized kernel's config for this problem where it is the measured
    choice (sm90, the block sizes and densities of ``_DEFAULTS`` for 16-bit inputs and of
    ``_TF32_DEFAULTS`` for fp32, M >= WS_MIN_M), else None: the other kernels run."""
    table = {torch.bfloat16: _DEFAULTS, torch.float16: _DEFAULTS, torch.float32: _TF32_DEFAULTS}.get(a.dtype)
    if a.shape[0] < WS_MIN_M or table is None or a.device.type != "cuda" or capability_major(a.device) != 9:
        return None
    for block, least, cfg in table:
        if block == block_size and density >= least:
            return cfg
    return None


def hopper_reason(t: torch.Tensor, fp32: bool = False) -> str | None:
    """Why the Gluon kernels cannot take ``t``'s device or dtype (they need sm90 and 16-bit
    inputs, or fp32 where ``fp32``), or None."""
    if t.device.type != "cuda" or capability_major(t.device) != 9:
        return "needs an sm90 (Hopper) GPU"
    if t.dtype not in ((torch.bfloat16, torch.float16, torch.float32) if fp32 else (torch.bfloat16, torch.float16)):
        return f"needs {'bf16, fp16 or fp32' if fp32 else 'bf16 or fp16'} inputs, got {t.dtype}"
    return None


def ws_supported(a: torch.Tensor, values: torch.Tensor, c: torch.Tensor, cfg: WsConfig) -> str | None:
    """Why this kernel cannot run these operands, or None if it can."""
    b = values.shape[-1]
    why = hopper_reason(a, fp32=True)
    if why is not None:
        return why
    if c.dtype != a.dtype:
        return f"needs one dtype: C is {c.dtype}, A is {a.dtype}"
    if a.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "runs fp32 as TF32 only (torch.get_float32_matmul_precision() is 'highest')"
    if a.dtype == torch.float32 and cfg.block_k * 4 > 128:
        return f"needs block_k <= 32 for fp32 (128-byte rows of the swizzled tiles), got {cfg.block_k}"
    if b < 16 or b & (b - 1) or b > 128:
        return f"needs a block size of 16, 32, 64 or 128, got {b}"
    if cfg.block_k > b:
        return f"block_k={cfg.block_k} exceeds the block size {b}"
    if 16 * cfg.num_warps > cfg.block_m:
        return f"would compute each of block_m={cfg.block_m} rows more than once with {cfg.num_warps} warps"
    for name, t in (("A", a), ("C", c)):
        if not row_major_tma_ok(t):
            return f"needs a row-major {name} with 16-byte-aligned, non-overlapping rows"
    if values.data_ptr() % 16 or not values.is_contiguous() or values.dtype != a.dtype:
        return "needs contiguous, 16-byte-aligned block values of A's dtype"
    if max(a.shape[0], a.shape[1], values.shape[0] * b, c.shape[1]) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    if cfg.shared_bytes(b, a.element_size()) > shared_memory_bytes(a.device):
        return f"needs {cfg.shared_bytes(b, a.element_size())} bytes of shared memory at this config, more than the GPU has"
    return None


def programs(m: int, n_out: int, cfg: WsConfig, device: torch.device) -> int:
    """The persistent grid: one program per SM, fewer where there are fewer tiles."""
    return max(1, min(cdiv(m, cfg.block_m) * n_out, sm_count(device)))


def launch_dds_ws(a, values, c, bias, ptr, idx, slot, n_out, cfg: WsConfig, trans_v: bool,
                  sched: torch.Tensor | None = None) -> None:
    """C = A @ op(S) (+ bias) into the preallocated C (row-major, same dtype as A).
    ``sched``: a balanced schedule for :func:`programs` programs
    (:func:`tilesparse.kernels.ws_schedule.schedule_tensor`), else round-robin."""
    b = values.shape[-1]
    m = a.shape[0]
    grid = programs(m, n_out, cfg, a.device)
    tiles = cdiv(m, cfg.block_m) * n_out
    if sched is not None and (sched.numel() != grid + 1 + tiles or sched.dtype != torch.int32
                              or sched.device != a.device):
        raise ValueError(f"sched must hold {grid + 1 + tiles} int32 entries on {a.device} ({grid} programs, "
                         f"{tiles} tiles), got {sched.numel()} {sched.dtype} entries on {sched.device}")
    lay = _layouts(cfg, b, trans_v, a.dtype)
    ensure_allocator()
    launch(_dds_ws_kernel, (grid,),
        a, values, c, bias if bias is not None else c, ptr, idx, slot if slot is not None else ptr,
        sched if sched is not None else ptr,
        m, a.shape[1], n_out, values.shape[0], a.stride(0), c.stride(0),
        B=b, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, STAGES=cfg.stages,
        TRANS_V=trans_v, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None, GROUP_M=cfg.group_m,
        LOAD_REGS=cfg.load_regs, PINGPONG=cfg.pingpong, MMA_REGS=cfg.mma_regs, SCHEDULED=sched is not None,
        a_layout=lay.a, v_layout=lay.v, c_layout=lay.c,
        num_warps=cfg.num_warps,
    )
