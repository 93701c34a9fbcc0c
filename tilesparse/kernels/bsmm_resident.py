"""Hopper (sm90) small-batch fprop for small blocks: the activations held in shared memory
while each program streams several block-rows of the weight past them.

Why: at 16-64 activation rows the small-batch kernel (:mod:`tilesparse.kernels.bsmm_small`)
gives each program one output block-column and reads, for every stored block of b x b
weights, an activation tile of M x b: at b 16 and M 64 that is 4x the weight's bytes, all of
it from L2, and L2's ~5 TB/s, not HBM, sets the time (W 12288², density 0.5: 144 µs, half
of dense's speed; docs/performance.md, thirtieth session). Here a program owns ``rows``
consecutive block-rows and a run of the reduction dimension (a split). It loads the
activations of that run once, ``chunk`` (<= 32) block-columns at a time, into shared memory
(a ring of two chunks), and for each of its block-rows streams that row's stored blocks of the
chunk into a weight stage, each block into the slot of its column. A per-(row, chunk) bitmask
of the stored columns, loaded for all rows of a chunk at once, drives both warps through
runtime loops over its set bits, ``unroll`` at a time: the producer copies each block into its
column's slot, the consumer issues one asynchronous wgmma per set bit (activation tile and
weight block at the same slot, no address waiting on a load) into the row's accumulator, the
steps past a row's last block on zero tiles. The activations' L2 traffic falls by about
``rows`` times the density. With ``splits`` > 1 each program writes fp32 partials and the
last of a block-row group's programs to finish sums them in split order: bitwise
deterministic.

fprop only (Y = X W^T: block-rows are output block-columns, stored contiguously); M <= 64
(one wgmma's rows; the rows past M are zero-filled by TMA); 16-bit inputs; b 16-64. Opt-in
through a :class:`ResidentConfig` passed to :func:`tilesparse.kernels.bsmm.dds`; no
interpreter path (tests run on the GPU and compile for sm_90 on the CPU).

Slower than the small-batch kernel (W 12288², b 16, density 0.5: ~155 µs at every M
against its 80-166 µs, dense 74): each stored block costs the producer and the consumer
~100 cycles of issue apiece, and the two do not overlap (docs/performance.md, thirty-first
session). Opt-in; its column-major variant (:mod:`tilesparse.kernels.bsmm_resident_columns`,
``columns=True``), which shares its tables, launcher and epilogue, was the H200's shipped
entry where it measured faster, until the deep panel (:mod:`tilesparse.kernels.bsmm_panel`)
beat it there (thirty-sixth session); both are opt-in now.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma, warpgroup_mma_init,
                                                               warpgroup_mma_wait)

from ..layout import table_views
from ._device import cached_table, shared_memory_bytes
from ._launch import launch
from ._tiles import cdiv, check_bools, check_ints, check_register_budgets
from ._alloc import arrival_counters
from .bsmm_tma import ensure_allocator, row_major_tma_ok
from .bsmm_ws import _alloc_ring, _nvmma
from .bsmm_ws_group import small_block_reason

__all__ = ["ResidentConfig", "MAX_M", "resident_supported", "chunk_tables", "launch_dds_resident"]

MAX_M = 64  # one warpgroup's wgmma rows
_HOPPER_SHARED_BYTES = 232448  # the most shared memory a program may have on sm_90 (227 KB)
_CHUNKS = "_tilesparse_resident_chunks"  # where chunk_tables remembers its tables on a layout's meta


@dataclasses.dataclass(frozen=True)
class ResidentConfig:
    """Launch parameters: ``rows`` block-rows per program (each an fp32 accumulator of
    [64, b] in registers), ``splits`` programs along the reduction (fp32 partials summed in
    split order), ``chunk`` block-columns of activations per shared-memory stage (two
    stages; at most 32, the bits of a chunk's mask), ``w_stages`` the weight ring (one
    block-row's blocks of one chunk per stage, a slot per column), ``unroll`` the stored
    blocks each step of the producer's and the consumer's loops takes, ``load_regs`` the
    producer warp's registers. ``columns``: the column-major variant
    (:mod:`tilesparse.kernels.bsmm_resident_columns`), whose ``w_stages`` stages each hold a
    chunk's activation tiles and all ``rows`` rows' blocks of it, copied in boxes of ``box``
    blocks (``unroll`` unused)."""

    rows: int = 12
    splits: int = 2
    chunk: int = 32
    w_stages: int = 4
    unroll: int = 4
    columns: bool = False
    box: int = 8
    # one warp, so a large budget is cheap (v3's loops, unrolled over a chunk's slots for each
    # row, spilled 8.7 KB at 40 registers; the runtime loops since need far fewer)
    load_regs: int = 232

    def __post_init__(self):
        check_ints(self, "rows", "splits", "chunk", "w_stages", "unroll", "box", "load_regs")
        check_bools(self, "columns")
        check_register_budgets(self, "load_regs")
        if not 1 <= self.rows <= 16:
            raise ValueError(f"ResidentConfig.rows must be 1 to 16, got {self.rows!r}")
        if self.splits < 1 or self.w_stages < 2:
            raise ValueError(f"ResidentConfig needs splits >= 1 and w_stages >= 2, got {self}")
        if not 1 <= self.unroll <= 8:
            raise ValueError(f"ResidentConfig.unroll must be 1 to 8, got {self.unroll!r}")
        if not 1 <= self.chunk <= 32:
            raise ValueError(f"ResidentConfig.chunk must be 1 to 32 (a chunk's bitmask is 32 bits), got {self.chunk!r}")
        if self.columns and (self.box < 1 or self.box & (self.box - 1) or self.chunk % self.box):
            raise ValueError("ResidentConfig.box must be a power of two (a TMA box's rows) that divides chunk "
                             f"(a row's run of a stage is whole boxes), got {self}")
        if self.columns and self.shared_bytes(16) > _HOPPER_SHARED_BYTES:
            raise ValueError(f"ResidentConfig(columns=True) stages need {self.shared_bytes(16)} bytes of shared "
                             f"memory even at b 16, more than Hopper's {_HOPPER_SHARED_BYTES}: lower rows, chunk "
                             f"or w_stages (e.g. rows=6, chunk=16, w_stages=2), got {self}")

    def shared_bytes(self, block_size: int, element_bytes: int = 2) -> int:
        """Two stages of activations [chunk, 64, b] and a zero tile, the weight ring
        [w_stages, chunk, b, b] and a zero block, and the barriers (``columns``: w_stages
        stages of [chunk, 64, b] activations and [rows, chunk, b, b] blocks)."""
        if self.columns:
            stage = self.chunk * (MAX_M + self.rows * block_size) * block_size * element_bytes
            return self.w_stages * stage + 1024
        x = (2 * self.chunk + 1) * MAX_M * block_size * element_bytes
        w = (self.w_stages * self.chunk + 1) * block_size * block_size * element_bytes
        return x + w + 1024

    def accumulator_registers(self, block_size: int) -> int:
        """fp32 accumulator registers per consumer thread: rows tiles of [64, b] over 128 threads."""
        return self.rows * MAX_M * block_size // 128


@gluon.jit
def _row_values(ptr, group, c, n_rows, n_chunks, R: gl.constexpr):
    """Entry (row, c) of an int32 [block_rows, n_chunks] table for each of the program's R
    block-rows (0 past the last block-row), as a tuple; the R loads issued together."""
    vals = ()
    for r in gl.static_range(R):
        row = group * R + r
        vals = vals + (gl.load(ptr + row * n_chunks + c, mask=row < n_rows, other=0),)
    return vals


@gluon.jit
def _bit_count(bits):
    """The number of set bits of a chunk's int32 mask, by the usual bit tricks (the arithmetic
    shifts' sign bits are masked off or, in the last step, shifted out)."""
    v = bits - ((bits >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24) & 0x3F


@gluon.jit
def _lowest_bit(bits):
    """The index of the lowest set bit of a nonzero int32 mask: that bit alone is a power of
    two (bit 31: int32's minimum), exact as a float32, whose exponent is the index."""
    low = (bits & (0 - bits)).to(gl.float32)
    return ((low.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127


@gluon.jit
def _resident_load(a_desc, v_desc, z_desc, x_bufs, w_bufs, x_ready, x_empty, w_ready, w_empty, first_ptr, mask_ptr,
                   K_A, n_rows, n_chunks, chunks_per_split, B: gl.constexpr, CHUNK: gl.constexpr,
                   CHUNK_BITS: gl.constexpr, R: gl.constexpr, U: gl.constexpr):
    """Producer (one warp): per chunk of this program's split, the chunk's activation tiles
    (one TMA per block-column, [64, b] each; past M and K zero-filled), then for each of its
    block-rows the row's stored blocks of the chunk, each into the stage's slot of its
    block-column (so that the consumer addresses both operands by the column alone). A row's
    blocks of a chunk are consecutive in storage from its first slot, in column order."""
    XST: gl.constexpr = (x_bufs.type.shape[0] - 1) // CHUNK  # (the zero tile past the stages)
    WST: gl.constexpr = (w_bufs.type.shape[0] - 1) // CHUNK
    X_BYTES: gl.constexpr = CHUNK * a_desc.block_type.nbytes
    ZERO_BYTES: gl.constexpr = a_desc.block_type.nbytes + z_desc.block_type.nbytes
    V_BYTES: gl.constexpr = v_desc.block_type.nbytes
    group = gl.program_id(0)
    c0 = gl.program_id(1) * chunks_per_split
    c1 = gl.minimum(c0 + chunks_per_split, n_chunks)
    wstep = 0
    for c in range(c0, c1):
        i = c - c0
        firsts = _row_values(first_ptr, group, c, n_rows, n_chunks, R)
        masks = _row_values(mask_ptr, group, c, n_rows, n_chunks, R)
        xs = i % XST
        mbarrier.wait(x_empty.index(xs), ((i // XST) & 1) ^ 1)
        mbarrier.expect(x_ready.index(xs), X_BYTES, pred=i != 0)
        mbarrier.expect(x_ready.index(xs), X_BYTES + ZERO_BYTES, pred=i == 0)
        # with the first chunk, the zero tiles past the stages: boxes wholly past A's K, which
        # TMA fills with zeros (the consumer's steps past a row's last block)
        tma.async_copy_global_to_shared(a_desc, [0, K_A], x_ready.index(xs), x_bufs.index(x_bufs.type.shape[0] - 1),
                                        pred=i == 0)
        tma.async_copy_global_to_shared(z_desc, [0, K_A], x_ready.index(xs), w_bufs.index(w_bufs.type.shape[0] - 1),
                                        pred=i == 0)
        for kb in gl.static_range(CHUNK):
            tma.async_copy_global_to_shared(a_desc, [0, (c * CHUNK + kb) * B], x_ready.index(xs),
                                            x_bufs.index(xs * CHUNK + kb))
        for r in gl.static_range(R):
            bits = masks[r]
            n = _bit_count(bits)
            ws = wstep % WST
            mbarrier.wait(w_empty.index(ws), ((wstep // WST) & 1) ^ 1)
            for e in gl.static_range(CHUNK_BITS):  # CHUNK_BITS arrivals, the bytes of n blocks: n's binary digits
                digit = (n >> e) & 1
                mbarrier.expect(w_ready.index(ws), (1 << e) * V_BYTES, pred=digit != 0)
                mbarrier.arrive(w_ready.index(ws), count=1, pred=digit == 0)
            slot = firsts[r]
            for j in range(0, n, U):  # the row's stored blocks of the chunk, in column order, U at a time
                for u in gl.static_range(U):
                    col = _lowest_bit(bits)  # (garbage past the last set bit, where the copy is skipped)
                    bits = bits & (bits - 1)
                    tma.async_copy_global_to_shared(v_desc, [(slot + j + u) * B, 0], w_ready.index(ws),
                                                    w_bufs.index(ws * CHUNK + col), pred=j + u < n)
            wstep += 1


@gluon.jit
def _resident_mma(c_ptr, bias_ptr, ws_ptr, sem_ptr, mask_ptr, x_bufs, w_bufs, x_ready, x_empty, w_ready,
                  w_empty, M, n_rows, n_chunks, chunks_per_split, n_out_cols, stride_cm,
                  B: gl.constexpr, CHUNK: gl.constexpr, R: gl.constexpr, U: gl.constexpr,
                  HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, num_warps: gl.constexpr):
    """The consumer warpgroup: per chunk and block-row, one asynchronous wgmma per stored
    block (the activation tile and the weight block of the same slot of the chunk: no
    address depends on a load; a multiple of U of them, the last on zero tiles), a wait, the
    weight stage freed; the chunk's activations freed after its last row. Then the outputs
    (:func:`_resident_outputs`)."""
    XST: gl.constexpr = (x_bufs.type.shape[0] - 1) // CHUNK
    WST: gl.constexpr = (w_bufs.type.shape[0] - 1) // CHUNK
    ZERO_X: gl.constexpr = x_bufs.type.shape[0] - 1
    ZERO_W: gl.constexpr = w_bufs.type.shape[0] - 1
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, B, 16])
    group = gl.program_id(0)
    c0 = gl.program_id(1) * chunks_per_split
    c1 = gl.minimum(c0 + chunks_per_split, n_chunks)
    accs = (gl.zeros((64, B), dtype=gl.float32, layout=mma_layout),) * R
    wstep = 0
    for c in range(c0, c1):
        i = c - c0
        masks = _row_values(mask_ptr, group, c, n_rows, n_chunks, R)  # (before the wait: in flight under it)
        xs = i % XST
        mbarrier.wait(x_ready.index(xs), (i // XST) & 1)
        for r in gl.static_range(R):
            ws = wstep % WST
            mbarrier.wait(w_ready.index(ws), (wstep // WST) & 1)
            bits = masks[r]
            n = _bit_count(bits)
            acc = warpgroup_mma_init(accs[r])
            # a runtime loop, U set bits per step, branch-free (a step past the row's last block
            # multiplies the zero tiles), so that the compiler interleaves the U address chains:
            # unrolled over all of a chunk's slots, the code outgrew the instruction cache (~500 KB
            # of SASS at R 12, chunk 32); one bit per step, the chain's latency set the pace
            # (~200 cycles per block)
            for j in range(0, n, U):
                for u in gl.static_range(U):
                    col = _lowest_bit(bits)
                    bits = bits & (bits - 1)
                    x_slot = gl.where(j + u < n, xs * CHUNK + col, ZERO_X)
                    w_slot = gl.where(j + u < n, ws * CHUNK + col, ZERO_W)
                    acc = warpgroup_mma(x_bufs.index(x_slot), w_bufs.index(w_slot).permute((1, 0)), acc,
                                        is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(w_empty.index(ws), count=1)
            accs = accs[:r] + (acc,) + accs[r + 1:]
            wstep += 1
        mbarrier.arrive(x_empty.index(xs), count=1)

    _resident_outputs(accs, c_ptr, bias_ptr, ws_ptr, sem_ptr, M, n_out_cols, stride_cm, B, R, HAS_BIAS, SPLIT,
                      mma_layout)


@gluon.jit
def _resident_outputs(accs, c_ptr, bias_ptr, ws_ptr, sem_ptr, M, n_out_cols, stride_cm, B: gl.constexpr,
                      R: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, mma_layout: gl.constexpr):
    """The R block-rows' outputs of program (group, split): rounded and stored (one split), or
    (SPLIT) fp32 partials [splits, 64, n_out_cols] (int64 offsets) of which the last of the
    group's programs to arrive sums them in split order: bitwise deterministic."""
    group = gl.program_id(0)
    split = gl.program_id(1)
    n_splits = gl.num_programs(1)
    offs_m = gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout))
    offs_b = gl.arange(0, B, layout=gl.SliceLayout(0, mma_layout))
    m_ok = offs_m < M
    if not SPLIT:
        for r in gl.static_range(R):
            _store_rows(accs[r], c_ptr, bias_ptr, (group * R + r) * B + offs_b, offs_m, m_ok, n_out_cols, stride_cm,
                        HAS_BIAS)
    else:
        split_stride = n_out_cols.to(gl.int64) * 64
        rows_off = offs_m.to(gl.int64)[:, None] * n_out_cols
        for r in gl.static_range(R):
            cols = (group * R + r) * B + offs_b
            gl.store(ws_ptr + split * split_stride + rows_off + cols[None, :], accs[r],
                     mask=m_ok[:, None] & (cols < n_out_cols)[None, :])
        gl.thread_barrier()  # every thread's partials are stored before the count below
        arrived = gl.atomic_add(sem_ptr + group, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            for r in gl.static_range(R):
                cols = (group * R + r) * B + offs_b
                ptrs = ws_ptr + rows_off + cols[None, :]
                ok2 = m_ok[:, None] & (cols < n_out_cols)[None, :]
                total = gl.load(ptrs, mask=ok2, other=0.0, cache_modifier=".cg")
                for s in range(1, n_splits):
                    total += gl.load(ptrs + s * split_stride, mask=ok2, other=0.0, cache_modifier=".cg")
                _store_rows(total, c_ptr, bias_ptr, cols, offs_m, m_ok, n_out_cols, stride_cm, HAS_BIAS)
            gl.atomic_xchg(sem_ptr + group, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _store_rows(acc, c_ptr, bias_ptr, cols, offs_m, m_ok, n_out_cols, stride_cm, HAS_BIAS: gl.constexpr):
    """C[offs_m, cols] = acc (+ bias), rounded to C's dtype, rows < M and columns < N only."""
    col_ok = cols < n_out_cols
    if HAS_BIAS:
        acc = acc + gl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(gl.float32)[None, :]
    gl.store(c_ptr + offs_m.to(gl.int64)[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & col_ok[None, :])


@gluon.jit
def _dds_resident_kernel(
    a_ptr, v_ptr, c_ptr, bias_ptr, ws_ptr, sem_ptr, first_ptr, mask_ptr,
    M, K_A, n_rows, n_chunks, chunks_per_split, n_out_cols, nnz, stride_am, stride_cm,
    B: gl.constexpr, CHUNK: gl.constexpr, CHUNK_BITS: gl.constexpr, R: gl.constexpr, U: gl.constexpr,
    W_STAGES: gl.constexpr,
    HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, LOAD_REGS: gl.constexpr,
    x_layout: gl.constexpr, v_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (group, split): block-rows group * R .. + R over the split's chunks (SPLIT:
    the grid has more than one split). Descriptors built on the device."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [64, B], x_layout)
    v_desc = tma.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [B, B], v_layout)
    # b x b boxes over A, read only wholly past its K: the zero block (the values' descriptor
    # has no rows at all for an empty layout, and a copy from it faults)
    z_desc = tma.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [B, B], v_layout)
    x_bufs = gl.allocate_shared_memory(dtype, [2 * CHUNK + 1, 64, B], x_layout)  # + a zero tile
    w_bufs = gl.allocate_shared_memory(dtype, [W_STAGES * CHUNK + 1, B, B], v_layout)  # + a zero block
    x_ready, x_empty = _alloc_ring(2)
    w_ready, w_empty = _alloc_ring(W_STAGES, WRITES=CHUNK_BITS)  # see _resident_load's expects
    gl.warp_specialize([
        (_resident_mma, (c_ptr, bias_ptr, ws_ptr, sem_ptr, mask_ptr, x_bufs, w_bufs, x_ready, x_empty,
                         w_ready, w_empty, M, n_rows, n_chunks, chunks_per_split, n_out_cols, stride_cm,
                         B, CHUNK, R, U, HAS_BIAS, SPLIT, num_warps)),
        (_resident_load, (a_desc, v_desc, z_desc, x_bufs, w_bufs, x_ready, x_empty, w_ready, w_empty, first_ptr,
                          mask_ptr, K_A,
                          n_rows, n_chunks, chunks_per_split, B, CHUNK, CHUNK_BITS, R, U)),
    ], [1], [LOAD_REGS])


@functools.lru_cache(maxsize=None)
def _layouts(b: int, dtype: torch.dtype):
    """Shared-memory layouts of an activation tile [64, b] and a weight block [b, b]."""
    return _nvmma([MAX_M, b], dtype), _nvmma([b, b], dtype)


def chunk_tables(meta: torch.Tensor, block_rows: int, block_cols: int, chunk: int):
    """(firsts, masks), int32 [block_rows, n_chunks] each: firsts[r, c] is the storage slot
    of block-row r's first stored block at block-column >= c * chunk (its later blocks of
    the chunk follow it in storage), masks[r, c] has bit j set where block (r, c * chunk + j)
    is stored. Needs each row's blocks stored in column order (the layouts' tables are);
    None where they are not, or while a CUDA graph is being captured before the tables were
    built (the check reads the host). Remembered on ``meta``."""
    if not 1 <= chunk <= 32:
        raise ValueError(f"chunk must be 1 to 32 (the bits of a mask), got {chunk!r}")

    def build():
        row_ptr, row_cols, row_of = table_views(meta, block_rows, block_cols, "row_ptr", "row_cols", "row_of")
        same_row = row_of[1:] == row_of[:-1]
        if bool((same_row & (row_cols[1:] < row_cols[:-1])).any()):
            return ()  # (remembered: refused)
        n_chunks = cdiv(block_cols, chunk)
        key = row_of.long() * n_chunks + row_cols.long() // chunk
        counts = torch.zeros(block_rows * n_chunks, dtype=torch.int64, device=meta.device)
        counts.index_add_(0, key, torch.ones_like(key))
        counts = counts.view(block_rows, n_chunks)
        firsts = row_ptr[:-1, None].long() + counts.cumsum(1) - counts
        bits = torch.zeros(block_rows * n_chunks, dtype=torch.int64, device=meta.device)
        bits.index_add_(0, key, torch.ones_like(key) << (row_cols.long() % chunk))  # distinct bits: a sum is an or
        bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)  # bit 31 as int32's sign
        return firsts.to(torch.int32).contiguous(), bits.view(block_rows, n_chunks).to(torch.int32).contiguous()

    tables = cached_table(meta, _CHUNKS, (block_rows, block_cols, chunk), build, build_while_capturing=False)
    return tables or None


def resident_supported(a: torch.Tensor, values: torch.Tensor, c: torch.Tensor, trans: bool,
                       cfg: ResidentConfig) -> str | None:
    """Why this kernel cannot run these operands, or None if it can."""
    b = values.shape[-1]
    why = small_block_reason(a, values, c, cfg.accumulator_registers(b), f"rows={cfg.rows}")
    if why is not None:
        return why
    if not trans:
        return "computes fprop only (a block-row's blocks stored together); bprop gathers by column"
    if a.shape[0] > MAX_M:
        return f"takes at most {MAX_M} rows of activations, got {a.shape[0]}"
    if not row_major_tma_ok(a) or c.stride(1) != 1:
        return "needs a row-major A (16-byte-aligned rows) and C"
    if values.data_ptr() % 16 or not values.is_contiguous():
        return "needs contiguous, 16-byte-aligned block values"
    if max(a.shape[1], values.shape[0] * b) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    if cfg.columns and cfg.box * b > 256:
        return f"copies boxes of box x b = {cfg.box * b} rows, more than TMA's 256"
    if cfg.shared_bytes(b, a.element_size()) > shared_memory_bytes(a.device):
        return (f"needs {cfg.shared_bytes(b, a.element_size())} bytes of shared memory at this config, "
                "more than the GPU has")
    return None


def launch_dds_resident(a, values, c, bias, meta, block_rows: int, block_cols: int, cfg: ResidentConfig) -> bool:
    """C = A @ S^T (+ bias) into the preallocated C (operands :func:`resident_supported`
    accepts). False (nothing launched) where the chunk table cannot be had now (columns
    out of order, or first asked for inside a CUDA-graph capture)."""
    b = values.shape[-1]
    tables = chunk_tables(meta, block_rows, block_cols, cfg.chunk)
    if tables is None:
        return False
    firsts, masks = tables
    m = a.shape[0]
    n_chunks = cdiv(block_cols, cfg.chunk)
    per_split = cdiv(n_chunks, min(cfg.splits, n_chunks))
    splits = cdiv(n_chunks, per_split)
    n_groups = cdiv(block_rows, cfg.rows)
    n_out = c.shape[1]
    ws = sem = firsts  # (unused with one split)
    if splits > 1:
        ws = torch.empty(splits, MAX_M, n_out, dtype=torch.float32, device=a.device)
        sem = arrival_counters(a.device, n_groups)
    x_layout, v_layout = _layouts(b, a.dtype)
    ensure_allocator()
    if cfg.columns:
        from .bsmm_resident_columns import launch_columns  # (it imports this module's helpers)

        launch_columns((n_groups, splits), a, values, c, bias, ws, sem, firsts, masks, n_chunks, per_split, cfg,
                       x_layout, v_layout)
        return True
    launch(_dds_resident_kernel, (n_groups, splits),
        a, values, c, bias if bias is not None else c, ws, sem, firsts, masks,
        m, a.shape[1], block_rows, n_chunks, per_split, n_out, values.shape[0], a.stride(0), c.stride(0),
        B=b, CHUNK=cfg.chunk, CHUNK_BITS=cfg.chunk.bit_length(), R=cfg.rows, U=cfg.unroll, W_STAGES=cfg.w_stages,
        HAS_BIAS=bias is not None, SPLIT=splits > 1,
        LOAD_REGS=cfg.load_regs, x_layout=x_layout, v_layout=v_layout, num_warps=4,
    )
    return True
