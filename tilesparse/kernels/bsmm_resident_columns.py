"""Hopper (sm90) small-batch fprop, column-major: the resident kernel's variant whose
consumer walks a chunk column by column, each activation tile loaded into registers once
and multiplied by every one of the program's block-rows that stores that column.

Why: the resident kernel (:mod:`tilesparse.kernels.bsmm_resident`) issues one wgmma per
stored block with its [64, b] activation tile read from shared memory each time, and its
producer one small copy per block: ~100 cycles of issue apiece per block at b 16 (W 12288²,
density 0.5: 155 µs at every M against dense's 74; docs/performance.md, thirty-first
session). Here the tile crosses shared memory once per column instead of once per block
(``rows`` times the density fewer reads), the wgmmas take it from registers, and the
producer copies each block-row's stored blocks of a chunk, contiguous in storage, in boxes
of ``box`` blocks (the over-read past the row's last one lands in slots nobody reads, and
comes from the next chunk's lines: L2 hits). One stage holds a chunk's activation tiles and
all the program's rows' blocks of it; the consumer waits for it once, issues every wgmma of
the chunk, drains once and frees it. A block's slot in its row's run is the count of the
row's stored columns before it (counted as the consumer walks the mask), so no address waits
on a load.

Same contract as the resident kernel (fprop, M <= 64, 16-bit, b 16-64, splits summed in a
fixed order by the last program of a group: deterministic); chosen by
``ResidentConfig(columns=True)``.

Measured (H200, docs/performance.md, thirty-second session): its time follows the bytes
its copies land in shared memory (~2.7-3.7 TB/s over the GPU, zero-filled rows included),
so the activation copies take only M's rows rounded up to 16 / 32 / 64. b 16, density 0.5,
W 12288²: 116-121 µs at 33-64 rows, against the small kernel's 126-168 (the shipped entry
there until the deep panel took 101 µs, thirty-sixth session); slower than the small kernel at fewer rows and lower densities, and than dense
(72-81 µs) everywhere.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_init

from ._launch import launch
from .bsmm_resident import MAX_M, _bit_count, _resident_outputs, _row_values
from .bsmm_ws import _alloc_ring
from .bsmm_ws_group import _wait_all

__all__ = ["launch_columns"]


@gluon.jit
def _columns_load(a_desc, box_desc, x_bufs, w_boxes, ready, empty, first_ptr, mask_ptr, n_rows, n_chunks,
                  chunks_per_split, B: gl.constexpr, CHUNK: gl.constexpr, R: gl.constexpr, BOX: gl.constexpr,
                  BOX_BITS: gl.constexpr):
    """Producer (one warp): per chunk, once its stage is free, the chunk's activation tiles
    ([64, b] each; past M and K zero-filled; only the first ROWS rows where M <= ROWS < 64,
    the rest of the tile left as it was: rows the outputs never store) and, for each
    block-row, ceil(n / BOX) boxes of its n stored blocks from its first slot into the row's
    run of the stage. The stage's barrier expects the tiles' bytes (one arrival) and the
    boxes' bytes, their count written in binary over BOX_BITS arrivals (Gluon's expects take
    constant byte counts)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0] // CHUNK
    ROWS: gl.constexpr = a_desc.block_type.shape[0]
    X_BYTES: gl.constexpr = CHUNK * a_desc.block_type.nbytes
    BOX_BYTES: gl.constexpr = box_desc.block_type.nbytes
    RUN: gl.constexpr = CHUNK // BOX  # boxes per row per stage
    group = gl.program_id(0)
    c0 = gl.program_id(1) * chunks_per_split
    c1 = gl.minimum(c0 + chunks_per_split, n_chunks)
    for c in range(c0, c1):
        i = c - c0
        s = i % STAGES
        firsts = _row_values(first_ptr, group, c, n_rows, n_chunks, R)
        masks = _row_values(mask_ptr, group, c, n_rows, n_chunks, R)
        boxes = ()  # each row's ceil(n / BOX)
        total = 0
        for r in gl.static_range(R):
            boxes = boxes + ((_bit_count(masks[r]) + (BOX - 1)) // BOX,)
            total += boxes[r]
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), X_BYTES)
        for e in gl.static_range(BOX_BITS):
            digit = (total >> e) & 1
            mbarrier.expect(ready.index(s), (1 << e) * BOX_BYTES, pred=digit != 0)
            mbarrier.arrive(ready.index(s), count=1, pred=digit == 0)
        for kb in gl.static_range(CHUNK):
            tma.async_copy_global_to_shared(a_desc, [0, (c * CHUNK + kb) * B], ready.index(s),
                                            x_bufs.index(s * CHUNK + kb).slice(0, ROWS))
        for r in gl.static_range(R):
            for q in range(boxes[r]):
                tma.async_copy_global_to_shared(box_desc, [(firsts[r] + q * BOX) * B, 0], ready.index(s),
                                                w_boxes.index((s * R + r) * RUN + q))


@gluon.jit
def _columns_mma(c_ptr, bias_ptr, ws_ptr, sem_ptr, mask_ptr, x_bufs, w_blocks, ready, empty, M, n_rows, n_chunks,
                 chunks_per_split, n_out_cols, stride_cm, B: gl.constexpr, CHUNK: gl.constexpr, R: gl.constexpr,
                 HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, num_warps: gl.constexpr):
    """The consumer warpgroup: per chunk, one wait; for each column (static) its activation
    tile into registers, and for each block-row (static) that stores the column an
    asynchronous wgmma into the row's accumulator, the block at the row's run slot counted
    so far; one drain, the stage freed. Then the outputs."""
    STAGES: gl.constexpr = x_bufs.type.shape[0] // CHUNK
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, B, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    group = gl.program_id(0)
    c0 = gl.program_id(1) * chunks_per_split
    c1 = gl.minimum(c0 + chunks_per_split, n_chunks)
    accs = (gl.zeros((64, B), dtype=gl.float32, layout=mma_layout),) * R
    for c in range(c0, c1):
        i = c - c0
        s = i % STAGES
        masks = _row_values(mask_ptr, group, c, n_rows, n_chunks, R)  # (in flight under the wait)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        for r in gl.static_range(R):
            accs = accs[:r] + (warpgroup_mma_init(accs[r]),) + accs[r + 1:]
        slots = ()  # each row's next slot: its run's start, plus its stored columns so far
        for r in gl.static_range(R):
            slots = slots + ((s * R + r) * CHUNK,)
        stored = masks[0]  # the columns any of the rows stores (the others' tiles are not loaded)
        for r in gl.static_range(1, R):
            stored = stored | masks[r]
        for kb in gl.static_range(CHUNK):
            if ((stored >> kb) & 1) != 0:
                xa = x_bufs.index(s * CHUNK + kb).load(a_layout)
                for r in gl.static_range(R):
                    acc = accs[r]
                    slot = slots[r]
                    if ((masks[r] >> kb) & 1) != 0:
                        acc = warpgroup_mma(xa, w_blocks.index(slot).permute((1, 0)), acc, is_async=True)
                        slot += 1
                    accs = accs[:r] + (acc,) + accs[r + 1:]
                    slots = slots[:r] + (slot,) + slots[r + 1:]
        accs = _wait_all(accs, R)
        mbarrier.arrive(empty.index(s), count=1)
    _resident_outputs(accs, c_ptr, bias_ptr, ws_ptr, sem_ptr, M, n_out_cols, stride_cm, B, R, HAS_BIAS, SPLIT,
                      mma_layout)


@gluon.jit
def _dds_columns_kernel(
    a_ptr, v_ptr, c_ptr, bias_ptr, ws_ptr, sem_ptr, first_ptr, mask_ptr,
    M, K_A, n_rows, n_chunks, chunks_per_split, n_out_cols, nnz, stride_am, stride_cm,
    B: gl.constexpr, CHUNK: gl.constexpr, R: gl.constexpr, BOX: gl.constexpr, BOX_BITS: gl.constexpr,
    STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, LOAD_REGS: gl.constexpr, X_ROWS: gl.constexpr,
    x_layout: gl.constexpr, v_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (group, split): block-rows group * R .. + R over the split's chunks. The
    weight stages are one buffer seen two ways: [b, b] blocks (the consumer's operands) and
    [BOX * b, b] boxes (the producer's copies); the shared-memory layout of the two is the
    same (the swizzle follows the row width, b elements, in both)."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [X_ROWS, B], x_layout)
    box_desc = tma.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [BOX * B, B], v_layout)
    x_bufs = gl.allocate_shared_memory(dtype, [STAGES * CHUNK, 64, B], x_layout)
    w_blocks = gl.allocate_shared_memory(dtype, [STAGES * R * CHUNK, B, B], v_layout)
    w_boxes = w_blocks._reinterpret(dtype, [STAGES * R * CHUNK // BOX, BOX * B, B], v_layout)
    ready, empty = _alloc_ring(STAGES, WRITES=1 + BOX_BITS)
    gl.warp_specialize([
        (_columns_mma, (c_ptr, bias_ptr, ws_ptr, sem_ptr, mask_ptr, x_bufs, w_blocks, ready, empty, M, n_rows,
                        n_chunks, chunks_per_split, n_out_cols, stride_cm, B, CHUNK, R, HAS_BIAS, SPLIT, num_warps)),
        (_columns_load, (a_desc, box_desc, x_bufs, w_boxes, ready, empty, first_ptr, mask_ptr, n_rows, n_chunks,
                         chunks_per_split, B, CHUNK, R, BOX, BOX_BITS)),
    ], [1], [LOAD_REGS])


# A/B switch for probes (shipped: True): copy only the activation rows there are, rounded up
# to 16 / 32 / 64, rather than always 64 (2026-12-02: this kernel's time follows the bytes its
# copies land in shared memory, zero-filled rows past M included, ~2.7-3.7 TB/s over the GPU)
SHORT_ACTIVATION_BOXES = True


def activation_box_rows(m: int) -> int:
    """Rows of each activation copy: M rounded up to a power of two, 16 to 64 (64 with
    SHORT_ACTIVATION_BOXES off). Whole swizzle periods (8 rows), so the tile's layout holds."""
    return min(MAX_M, max(16, 1 << (m - 1).bit_length())) if SHORT_ACTIVATION_BOXES else MAX_M


def launch_columns(grid, a, values, c, bias, ws, sem, firsts, masks, n_chunks, per_split, cfg, x_layout, v_layout):
    """Launch the column-major kernel on ``grid`` (groups, splits) with the resident
    launcher's tables and workspace (:func:`tilesparse.kernels.bsmm_resident.launch_dds_resident`)."""
    b = values.shape[-1]
    launch(_dds_columns_kernel, grid,
        a, values, c, bias if bias is not None else c, ws, sem, firsts, masks,
        a.shape[0], a.shape[1], masks.shape[0], n_chunks, per_split, c.shape[1], values.shape[0], a.stride(0),
        c.stride(0),
        B=b, CHUNK=cfg.chunk, R=cfg.rows, BOX=cfg.box, BOX_BITS=(cfg.rows * cfg.chunk // cfg.box).bit_length(),
        STAGES=cfg.w_stages, HAS_BIAS=bias is not None, SPLIT=grid[1] > 1,
        LOAD_REGS=cfg.load_regs, X_ROWS=activation_box_rows(a.shape[0]), x_layout=x_layout, v_layout=v_layout,
        num_warps=4,
    )
