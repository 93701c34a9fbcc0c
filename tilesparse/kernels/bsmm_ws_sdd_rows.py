"""Hopper (sm90) warp-specialized sdd (updat's sampled product) for b 64 whose work units
are runs of one block-row's stored blocks: every full unit does the same work.

Why: the grouped kernel (:mod:`tilesparse.kernels.bsmm_ws_sdd_group`, two block-rows x G
block-columns per tile) is bound by HBM on 16384x8192² (ncu: DRAM 81 %, L2 hit rate 23 %,
docs/performance.md, nineteenth session). Its tiles hold 1-8 blocks, so programs walking
M at different rates drift apart and stop sharing dY / X slices in L2; the b 128 sdd,
whose units (one block each) all cost the same, keeps 83 % of dense's rate there. Here a
unit is 2G consecutive stored blocks of one block-row (the layout's CSR order): per
M-slice of BLOCK_K rows the producer warp TMA-loads the row's dY slice once and the X
slices of the unit's blocks; consumer warpgroup w issues one wgmma per block of entries
w*G .. w*G + G - 1 (the dY slice transposed as wgmma's A, from shared memory or, with
``a_from_registers``, loaded once per slice) and stores each block to its slot. Per block
that is (1 + 2G) / 2G slices loaded, against (2 + ~3) / 4 for the grouped tiles at density
0.5, and every unit but a row's last one costs the same.

Program p takes units p, p + P, ... of a unit table (:func:`unit_table`): the full units
(2G blocks) in row order, then each row's last, shorter unit, longest first, then empty
padding. A first version numbered units row-major over R x ceil(C / 2G), empty ones
included: programs got unequal shares of the work (ncu on 16384x8192²: SMs active 71 % of
the time), and a model of the round-robin puts the table at 0.94 of perfect balance
against 0.80 there (density 0.5, 128 block-rows; 0.82 against 0.67 at 64). The table is
built on the device from the layout's CSR offsets with fixed-size tensor operations (no
host sync), so CUDA-graph capture works. One reduction order, no atomics: bitwise
deterministic.
Opt-in through a :class:`WsSddRowsConfig` passed to :func:`tilesparse.kernels.bsmm.sdd`;
no interpreter path (tests run on the GPU and compile for sm_90 on the CPU).
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ..layout import table_views
from ._device import cached_table, sm_count
from ._launch import launch
from ._tiles import cdiv, check_bools
from .bsmm_tma import ensure_allocator
from .bsmm_ws import _alloc_ring, _claim_stage
from .bsmm_ws_sdd import _sdd_layouts, density_floor_reason, operand_reason, shared_memory_reason
from .bsmm_ws_sdd_group import _consume_slices, check_slice_fields

__all__ = ["WsSddRowsConfig", "MIN_DENSITY", "unit_count", "unit_table", "ws_sdd_rows_supported", "run_if_supported", "launch_sdd_ws_rows"]

BLOCK = 64  # one consumer warpgroup's 64 wgmma rows: a block-row
KERNEL_NAME = "row-run warp-specialized sdd"  # as bsmm.sdd's errors name it
# Tuned entries (b 64 updat, with the unit table) won at density 0.5, 0.25 and 0.1 on both
# shapes (16384x8192²: 3.61 -> 2.39, 1.83 -> 1.23, 0.75 -> 0.57 ms; 8192x4096² 1.10-1.13x);
# below the 0.1 bucket's low end nothing was measured, so its entry is ignored there.
MIN_DENSITY = 0.07


@dataclasses.dataclass(frozen=True)
class WsSddRowsConfig:
    """Launch parameters: ``group`` blocks per consumer (G; a unit is 2G blocks of one
    block-row, each consumer holding G [64, 64] fp32 accumulators), ``block_k`` the
    M-slice per ring stage, ``stages`` the ring, ``load_regs`` / ``mma_regs`` the
    producer's and each consumer's registers. ``a_from_registers``: each consumer loads
    the slice's dY tile into registers once for its G products (else every wgmma reads
    it from shared memory). ``overlap`` (shared-memory operands, G <= 2): a slice's wgmma
    stay in flight under the next slice's."""

    group: int = 4
    block_k: int = 32
    stages: int = 4
    load_regs: int = 40
    mma_regs: int = 232
    a_from_registers: bool = False
    overlap: bool = False

    def __post_init__(self):
        check_bools(self, "a_from_registers", "overlap")
        check_slice_fields(self)
        if self.overlap and (self.group > 2 or self.a_from_registers):
            raise ValueError("WsSddRowsConfig.overlap needs group <= 2 and the dY tile in shared memory (ptxas "
                             "serializes the wgmma otherwise)")

    @property
    def unit(self) -> int:
        """Blocks per unit: G per consumer."""
        return 2 * self.group

    def shared_bytes(self, element_bytes: int = 2) -> int:
        """The ring (one dY slice and 2G X slices per stage), the output blocks, barriers."""
        ring = self.stages * (1 + self.unit) * self.block_k * BLOCK * element_bytes
        return ring + self.unit * BLOCK * BLOCK * element_bytes + 1024


CONFIG = WsSddRowsConfig  # the config that asks bsmm.sdd for this kernel


_UNITS = "_tilesparse_ws_sdd_rows_units"  # the unit tables, remembered on the layout's meta


def unit_count(block_rows: int, block_cols: int, nnz: int, cfg: WsSddRowsConfig) -> tuple[int, int]:
    """(units per block-row at most, unit table entries): a row's blocks are cut into runs
    of 2G; the table has room for every non-empty unit, ceil(nnz / 2G) + R at most."""
    per_row = cdiv(max(block_cols, 1), cfg.unit)
    return per_row, max(1, min(block_rows * per_row, cdiv(nnz, cfg.unit) + block_rows))


def unit_table(meta: torch.Tensor, row_ptr: torch.Tensor, block_rows: int, block_cols: int, nnz: int,
               cfg: WsSddRowsConfig) -> torch.Tensor:
    """int32 [entries, 2] (block-row, first storage slot) per unit, in the order programs
    take them: full units (2G blocks) row by row, then rows' last partial units by block
    count, most first (rows in order among equals), then empty padding (row 0, slot nnz).
    Fixed-size device operations only; remembered on ``meta``."""
    w = cfg.unit
    per_row, entries = unit_count(block_rows, block_cols, nnz, cfg)

    def build():
        dev = row_ptr.device
        start = row_ptr[:-1].to(torch.int64)
        lens = row_ptr[1:].to(torch.int64) - start
        full, rem = lens // w, lens % w
        k = torch.arange(per_row, device=dev)
        is_full = k[None, :] < full[:, None]  # [R, per_row], row-major: row order
        # partial units ranked by block count (most first), then by row
        onehot = rem[:, None] == torch.arange(1, w, device=dev)[None, :]  # [R, W - 1]: rem 1 .. W-1
        per_count = onehot.sum(0)
        more = per_count.flip(0).cumsum(0).flip(0) - per_count  # rows whose partial unit is longer
        rank_among_equals = (onehot.cumsum(0) - 1).gather(1, (rem - 1).clamp_min(0)[:, None])[:, 0]
        part_pos = is_full.sum() + more.gather(0, (rem - 1).clamp_min(0)) + rank_among_equals
        is_part = (k[None, :] == full[:, None]) & (rem[:, None] > 0)
        pos = torch.where(is_full, is_full.flatten().cumsum(0).view(block_rows, per_row) - 1,
                          torch.where(is_part, part_pos[:, None].expand(-1, per_row), entries))
        table = torch.zeros(entries + 1, 2, dtype=torch.int32, device=dev)  # the last row: a dump slot
        table[:, 1] = nnz
        rows = torch.arange(block_rows, device=dev)[:, None].expand(-1, per_row)
        first = start[:, None] + k[None, :] * w
        table[pos.flatten()] = torch.stack([rows.flatten(), first.flatten()], 1).to(torch.int32)
        return table[:entries]  # (the dump row, written in any order, dropped)

    return cached_table(meta, _UNITS, (block_rows, block_cols, w), build)


@gluon.jit
def _unit(units_ptr, row_ptr_ptr, unit, W: gl.constexpr):
    """(block-row, first storage slot, block count <= W) of a unit."""
    r = gl.load(units_ptr + 2 * unit)
    lo = gl.load(units_ptr + 2 * unit + 1)
    n = gl.minimum(gl.maximum(gl.load(row_ptr_ptr + r + 1) - lo, 0), W)
    return r, lo, n


@gluon.jit
def _rows_load(at_desc, x_desc, a_bufs, x_bufs, ready_bars, empty_bars, units_ptr, row_ptr_ptr, row_cols_ptr, sizes,
               W: gl.constexpr, BLOCK_K: gl.constexpr):
    """Producer (one warp): per M-slice of each of this program's non-empty units, wait for
    a free stage, then TMA-load the row's dY slice and the X slices of the unit's blocks,
    one arrival expecting exactly those bytes. The unit's columns are read once."""
    num_units, k_steps = sizes
    A_BYTES: gl.constexpr = at_desc.block_type.nbytes
    X_BYTES: gl.constexpr = x_desc.block_type.nbytes
    B: gl.constexpr = x_desc.block_type.shape[1]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for unit in range(pid, num_units, nprog):
        r, lo, n = _unit(units_ptr, row_ptr_ptr, unit, W)
        cols = (gl.load(row_cols_ptr + lo, mask=n > 0, other=0),)
        for i in gl.static_range(1, W):
            cols = cols + (gl.load(row_cols_ptr + lo + i, mask=i < n, other=0),)
        for ks in range(0, gl.where(n > 0, k_steps, 0)):
            s, ready = _claim_stage(step, ready_bars, empty_bars)
            for c in gl.static_range(1, W + 1):
                mbarrier.expect(ready, A_BYTES + c * X_BYTES, pred=n == c)
            m0 = ks * BLOCK_K
            tma.async_copy_global_to_shared(at_desc, [m0, r * B], ready, a_bufs.index(s))
            for i in gl.static_range(W):
                tma.async_copy_global_to_shared(x_desc, [m0, cols[i] * B], ready, x_bufs.index(s * W + i),
                                                pred=i < n)
            step += 1


@gluon.jit
def _rows_mma(out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, units_ptr, row_ptr_ptr, sizes,
              G: gl.constexpr, A_REGS: gl.constexpr, OVERLAP: gl.constexpr, ROLE: gl.constexpr,
              num_warps: gl.constexpr):
    """A consumer (one warpgroup): entries ROLE*G .. ROLE*G + G - 1 of each unit. Per
    M-slice one asynchronous wgmma per block it holds; wait for them and free the stage (or,
    with OVERLAP, wait only for the previous slice's), then its blocks out through shared
    memory and TMA stores to their (consecutive) slots."""
    num_units, k_steps = sizes
    B: gl.constexpr = x_bufs.type.shape[2]
    W: gl.constexpr = 2 * G
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, B, 16])
    a_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    zero = gl.zeros((B, B), dtype=gl.float32, layout=mma_layout)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for unit in range(pid, num_units, nprog):
        r, lo, n = _unit(units_ptr, row_ptr_ptr, unit, W)
        mine = gl.minimum(gl.maximum(n - ROLE * G, 0), G)  # this consumer's blocks: a prefix of its G
        mask = (1 << mine) - 1
        n_steps = gl.where(n > 0, k_steps, 0)  # the producer's count: both consumers free each stage
        accs, step = _consume_slices((zero,) * G, step, n_steps, a_bufs, x_bufs, ready_bars, empty_bars, 0,
                                     ROLE * G, mask, mine, a_operand, G, 1, W, A_REGS, OVERLAP)
        if mine > 0:  # (the table's empty padding, and a partial unit's second consumer, store nothing)
            tma.store_wait(pendings=0)  # the previous unit's stores have left the output buffers
            for g in gl.static_range(G):
                c_bufs.index(ROLE * G + g).store(accs[g].to(out_desc.dtype))
            fence_async_shared()
            for g in gl.static_range(G):
                if g < mine:
                    tma.async_copy_shared_to_global(out_desc, [(lo + ROLE * G + g) * B, 0],
                                                    c_bufs.index(ROLE * G + g))
    tma.store_wait(pendings=0)


@gluon.jit
def _sdd_ws_rows_kernel(
    at_ptr, x_ptr, out_ptr, units_ptr, row_ptr_ptr, row_cols_ptr,
    M, R_B, C_B, nnz, stride_atm, stride_xm, num_units,
    B: gl.constexpr, G: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, A_REGS: gl.constexpr, OVERLAP: gl.constexpr,
    in_layout: gl.constexpr, out_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Persistent: program p takes units p, p + P, ... of the unit table. ``at`` is dY [M, R*B]
    (sdd's left operand transposed), ``x`` is X [M, C*B], ``out`` the blocks [nnz, B, B].
    Slices past M are zero-filled by TMA."""
    dtype: gl.constexpr = at_ptr.dtype.element_ty
    at_desc = tma.make_tensor_descriptor(at_ptr, [M, R_B], [stride_atm, 1], [BLOCK_K, B], in_layout)
    x_desc = tma.make_tensor_descriptor(x_ptr, [M, C_B], [stride_xm, 1], [BLOCK_K, B], in_layout)
    out_desc = tma.make_tensor_descriptor(out_ptr, [nnz * B, B], [B, 1], [B, B], out_layout)
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, B], in_layout)
    x_bufs = gl.allocate_shared_memory(dtype, [STAGES * 2 * G, BLOCK_K, B], in_layout)
    c_bufs = gl.allocate_shared_memory(dtype, [2 * G, B, B], out_layout)
    ready_bars, empty_bars = _alloc_ring(STAGES, 2)
    sizes = (num_units, gl.cdiv(M, BLOCK_K))
    gl.warp_specialize([
        (_rows_mma, (out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, units_ptr, row_ptr_ptr, sizes, G,
                     A_REGS, OVERLAP, 0, num_warps)),
        (_rows_mma, (out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, units_ptr, row_ptr_ptr, sizes, G,
                     A_REGS, OVERLAP, 1, num_warps)),
        (_rows_load, (at_desc, x_desc, a_bufs, x_bufs, ready_bars, empty_bars, units_ptr, row_ptr_ptr, row_cols_ptr,
                      sizes, 2 * G, BLOCK_K)),
    ], [num_warps, 1], [MMA_REGS, LOAD_REGS])


def ws_sdd_rows_supported(a_t: torch.Tensor, x: torch.Tensor, out: torch.Tensor,
                          cfg: WsSddRowsConfig) -> str | None:
    """Why this kernel cannot run these operands (as
    :func:`tilesparse.kernels.bsmm_ws_sdd.operand_reason`, b 64), or None if it can."""
    block = out.shape[-1]
    why = operand_reason(a_t, x, out, (BLOCK,))
    if why is not None:
        return why
    _, units = unit_count(a_t.shape[1] // block, x.shape[1] // block, out.shape[0], cfg)
    if max(a_t.shape[0], a_t.shape[1], x.shape[1], (out.shape[0] + cfg.unit) * block, 2 * units) >= 1 << 31:
        return "addresses tensors and units with 32-bit coordinates, too few for this problem"
    return shared_memory_reason(cfg.shared_bytes(a_t.element_size()), a_t.device)


def run_if_supported(a_t, x, out, meta, block_rows, block_cols, cfg: WsSddRowsConfig, tuned_entry: bool) -> str | None:
    """Run the kernel and return None if it can take this call; else say why (the
    interface of :func:`tilesparse.kernels.bsmm_ws_sdd_group.run_if_supported`); a tuned
    entry (``tuned_entry``) below :data:`MIN_DENSITY` is refused: measured slower there."""
    why = (ws_sdd_rows_supported(a_t, x, out, cfg)
           or density_floor_reason(out.shape[0], block_rows, block_cols, MIN_DENSITY, tuned_entry))
    if why is None:
        launch_sdd_ws_rows(a_t, x, out, meta, block_rows, block_cols, cfg)
    return why


def launch_sdd_ws_rows(a_t, x, out, meta, block_rows, block_cols, cfg: WsSddRowsConfig) -> None:
    """out[z] = (a_t^T @ x)[block z] for every stored block z, into the preallocated
    contiguous out [nnz, 64, 64]. The operands must be ones :func:`ws_sdd_rows_supported`
    accepts (:func:`run_if_supported` checks)."""
    row_ptr, row_cols = table_views(meta, block_rows, block_cols, "row_ptr", "row_cols")
    units = unit_table(meta, row_ptr, block_rows, block_cols, out.shape[0], cfg)
    in_layout, out_layout = _sdd_layouts(cfg.block_k, BLOCK, a_t.dtype)  # the one-block sdd's, at M step block_k
    ensure_allocator()
    launch(_sdd_ws_rows_kernel, (max(1, min(units.shape[0], sm_count(a_t.device))),),
        a_t, x, out, units, row_ptr, row_cols,
        a_t.shape[0], a_t.shape[1], x.shape[1], out.shape[0], a_t.stride(0), x.stride(0), units.shape[0],
        B=BLOCK, G=cfg.group, BLOCK_K=cfg.block_k, STAGES=cfg.stages,
        LOAD_REGS=cfg.load_regs, MMA_REGS=cfg.mma_regs, A_REGS=cfg.a_from_registers, OVERLAP=cfg.overlap,
        in_layout=in_layout, out_layout=out_layout, num_warps=4,
    )
