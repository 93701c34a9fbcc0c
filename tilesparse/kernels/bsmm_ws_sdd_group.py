"""Hopper (sm90) warp-specialized sdd (updat's sampled product) for b 64: a tile of two
block-rows x G block-columns, each activation slice loaded once for all of its blocks.

Why: the one-block-per-program sdd kernels load, for every stored block, an M-slice of
dY's block-column and one of X's: each loaded byte serves one [b, b] product. At b 64 that
kept updat at ~50 % of dense's rate while fprop reached ~75 % (graph run at d65845e,
docs/performance.md, nineteenth session). Here a tile owns block-rows 2p and 2p + 1 and
block-columns qG .. qG + G - 1. For each M-slice of BLOCK_K rows the producer warp
TMA-loads the two dY slices (one per block-row) and the X slices of the columns that hold
a stored block in either row; consumer warpgroup w (one per block-row) issues one
asynchronous wgmma per stored block of its row (dY slice transposed from shared memory
as wgmma's A, the X slice as B) into that block's own accumulator. Absent blocks cost
nothing, and each loaded X slice serves up to two blocks, each dY slice up to G.

The set of stored blocks is fixed for a tile, so every slice issues the same products.
The two consumers run unsynchronised, so one's wgmma fill the other's waits. The grid is persistent
(one program per SM, tiles round-robin in grouped order); tiles without blocks cost a
table read. One reduction order, no atomics: bitwise deterministic. The tables are a
scatter of the layout's blocks into a grid (no host sync: CUDA-graph capture is fine).
Opt-in through a :class:`WsSddGroupConfig` passed to :func:`tilesparse.kernels.bsmm.sdd`,
and the shipped H200 table's choice for b 64 updat at ~8192 rows and density 0.5; no
interpreter path (tests run on the GPU and compile for sm_90 on the CPU).
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ._device import cached_table, sm_count
from ._launch import launch
from ._tiles import cdiv, check_bools, check_ints, check_power_of_two, check_register_budgets
from ..layout import table_views
from .bsmm_tma import ensure_allocator
from .bsmm_ws import _alloc_ring, _claim_stage, _tile_coords
from .bsmm_ws_sdd import _sdd_layouts, density_floor_reason, operand_reason, shared_memory_reason
from .bsmm_ws_group import _entry_mmas, _popcount, _wait_all, _wait_for_previous

__all__ = ["WsSddGroupConfig", "MIN_DENSITY", "sdd_group_slots", "ws_sdd_group_supported", "run_if_supported",
           "launch_sdd_ws_group"]

BLOCK = 64  # the block size it is written for: one consumer warpgroup's 64 wgmma rows per block-row
# Measured on the H200 (scripts/probes/ws_sweep.py --ops updat, kernel time, G 4, 64-row
# slices, 3 stages, against the shipped choice): 8192x4096² at density 0.5 0.368 -> 0.318
# ms (52 -> 60 % of dense's rate); 16384x8192² 3.47 -> 3.42 ms. At density 0.25 0.69-0.80x
# and at 0.1 0.41x: a tile streams both block-rows' dY slices and every X slice its
# columns need, however few blocks it holds. Tuned entries are ignored below:
MIN_DENSITY = 0.45
KERNEL_NAME = "grouped warp-specialized sdd"  # as bsmm.sdd's errors name it
_SLOTS = "_tilesparse_ws_sdd_group_slots"  # where sdd_group_slots remembers its table on a layout's meta


@dataclasses.dataclass(frozen=True)
class WsSddGroupConfig:
    """Launch parameters: ``group`` block-columns per tile (G; each consumer holds G
    [64, 64] fp32 accumulators), ``block_k`` the M-slice per ring stage, ``stages`` the
    ring, ``group_m`` the tile order's group (L2 reuse), ``load_regs`` the producer
    warp's registers, ``mma_regs`` each consumer warpgroup's. ``overlap``: a slice's wgmma
    stay in flight while the next slice's are issued (ptxas serializes the wgmma at G 4,
    C7515); else each slice's are waited for, and the other consumer's fill the gap."""

    group: int = 4
    block_k: int = 64
    stages: int = 3
    group_m: int = 8
    load_regs: int = 40
    mma_regs: int = 232
    overlap: bool = False

    def __post_init__(self):
        check_bools(self, "overlap")
        check_ints(self, "group_m")
        check_slice_fields(self)
        if self.group_m < 1:
            raise ValueError(f"WsSddGroupConfig.group_m must be >= 1, got {self.group_m!r}")
        if self.overlap and self.group > 2:
            raise ValueError(f"WsSddGroupConfig.overlap needs group <= 2 (at group {self.group} ptxas serializes "
                             "the wgmma, C7515)")

    def shared_bytes(self, element_bytes: int = 2) -> int:
        """The ring (two dY slices and G X slices per stage), the output blocks, barriers."""
        ring = self.stages * (2 + self.group) * self.block_k * BLOCK * element_bytes
        return ring + 2 * self.group * BLOCK * BLOCK * element_bytes + 1024


CONFIG = WsSddGroupConfig  # the config that asks bsmm.sdd for this kernel


def check_slice_fields(cfg) -> None:
    """The fields the b 64 warp-specialized sdd configs share (this one and
    ``bsmm_ws_sdd_rows.WsSddRowsConfig``): ints; ``group`` a power of two up to 4 (G
    [64, 64] fp32 accumulators, 128 registers), ``block_k`` 16..128 and a power of two,
    ``stages`` >= 2, setmaxnreg budgets. ValueError naming the field."""
    check_ints(cfg, "group", "block_k", "stages", "load_regs", "mma_regs")
    check_power_of_two(cfg, "group", minimum=1)
    check_power_of_two(cfg, "block_k", minimum=16)
    name = type(cfg).__name__
    if cfg.group > 4:
        raise ValueError(f"{name}.group must be at most 4 (128 accumulator registers), got {cfg.group}")
    if cfg.block_k > 128:
        raise ValueError(f"{name}.block_k must be at most 128, got {cfg.block_k}")
    if cfg.stages < 2:
        raise ValueError(f"{name}.stages must be >= 2, got {cfg.stages!r}")
    check_register_budgets(cfg, "load_regs", "mma_regs")


@gluon.jit
def _row_slots(slots_ptr, base, G: gl.constexpr):
    """The G storage slots of one block-row of a tile (-1: absent) and their bitmask."""
    slots = (gl.load(slots_ptr + base),)
    for g in gl.static_range(1, G):
        slots = slots + (gl.load(slots_ptr + base + g),)
    mask = (slots[0] >= 0).to(gl.int32)
    for g in gl.static_range(1, G):
        mask |= (slots[g] >= 0).to(gl.int32) << g
    return slots, mask


@gluon.jit
def _consume_slices(accs, step, n_steps, a_bufs, x_bufs, ready_bars, empty_bars, a_first, x_first, mask, issued,
                    a_operand, G: gl.constexpr, A_STRIDE: gl.constexpr, X_STRIDE: gl.constexpr,
                    A_REGS: gl.constexpr, OVERLAP: gl.constexpr):
    """A consumer's M-slices of one tile (this kernel's and ``bsmm_ws_sdd_rows``'s): per
    slice, wait for its stage, then accs[g] += dYᵀ-slice @ X-slice for each bit g of
    ``mask`` (the dY slice at ``a_bufs[A_STRIDE * stage + a_first]`` transposed as wgmma's
    A, into registers where A_REGS; the X slices from ``x_bufs[X_STRIDE * stage + x_first]``
    on); wait for them and free the stage, or with OVERLAP (``issued`` wgmma a slice) wait
    only for the previous slice's. Returns (accs, ring position after the slices)."""
    STAGES: gl.constexpr = empty_bars.type.shape[0]
    for ks in range(0, n_steps):
        s = step % STAGES
        mbarrier.wait(ready_bars.index(s), (step // STAGES) & 1)
        a = a_bufs.index(A_STRIDE * s + a_first).permute((1, 0))  # dY slice [BLOCK_K, B] as wgmma's A [B, BLOCK_K]
        if A_REGS:
            a = a.load(a_operand)
        accs = _entry_mmas(accs, a, x_bufs, X_STRIDE * s + x_first, mask, G, False)
        if OVERLAP:
            accs = _wait_for_previous(accs, issued, G)  # this slice's wgmma stay in flight
            mbarrier.arrive(empty_bars.index((step + STAGES - 1) % STAGES), count=1, pred=ks > 0)
        else:
            if A_REGS:
                accs = _wait_all(accs + (a,), G + 1)[:G]
            else:
                accs = _wait_all(accs, G)
            mbarrier.arrive(empty_bars.index(s), count=1)
        step += 1
    if OVERLAP:
        accs = _wait_all(accs, G)
        mbarrier.arrive(empty_bars.index((step + STAGES - 1) % STAGES), count=1, pred=n_steps > 0)
    return accs, step


@gluon.jit
def _sdd_group_load(at_desc, x_desc, a_bufs, x_bufs, ready_bars, empty_bars, slots_ptr, sizes,
                    G: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr):
    """Producer (one warp): for each M-slice of each of this program's tiles that hold a
    block, wait for a free stage, then TMA-load the two block-rows' dY slices and the X
    slices of the columns stored in either row. One arrival expecting exactly those bytes."""
    num_row_pairs, n_groups, num_tiles, k_steps = sizes
    A_BYTES: gl.constexpr = at_desc.block_type.nbytes
    X_BYTES: gl.constexpr = x_desc.block_type.nbytes
    B: gl.constexpr = x_desc.block_type.shape[1]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for tile in range(pid, num_tiles, nprog):
        pr, q = _tile_coords(tile, num_row_pairs, n_groups, GROUP_M)
        base = (pr * n_groups + q) * 2 * G
        _, mask0 = _row_slots(slots_ptr, base, G)
        _, mask1 = _row_slots(slots_ptr, base + G, G)
        union = mask0 | mask1
        n_union = _popcount(union, G)
        for ks in range(0, gl.where(union != 0, k_steps, 0)):
            s, ready = _claim_stage(step, ready_bars, empty_bars)
            for n in gl.static_range(1, G + 1):
                mbarrier.expect(ready, 2 * A_BYTES + n * X_BYTES, pred=n_union == n)
            m0 = ks * BLOCK_K
            # a block-row past the layout (odd row count) is zero-filled by TMA, bytes counted
            tma.async_copy_global_to_shared(at_desc, [m0, (2 * pr) * B], ready, a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(at_desc, [m0, (2 * pr + 1) * B], ready, a_bufs.index(2 * s + 1))
            for g in gl.static_range(G):
                tma.async_copy_global_to_shared(x_desc, [m0, (q * G + g) * B], ready, x_bufs.index(s * G + g),
                                                pred=((union >> g) & 1) != 0)
            step += 1


@gluon.jit
def _sdd_group_mma(out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, slots_ptr, sizes,
                   G: gl.constexpr, GROUP_M: gl.constexpr, OVERLAP: gl.constexpr, ROLE: gl.constexpr,
                   num_warps: gl.constexpr):
    """A consumer (one warpgroup): block-row 2p + ROLE of each tile. Per M-slice one
    asynchronous wgmma per stored block of its row; wait for them and free the stage (or,
    with OVERLAP, wait only for the previous slice's and free its stage), then each stored
    block out through shared memory and a TMA store to its slot."""
    num_row_pairs, n_groups, num_tiles, k_steps = sizes
    B: gl.constexpr = x_bufs.type.shape[2]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, B, 16])
    zero = gl.zeros((B, B), dtype=gl.float32, layout=mma_layout)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for tile in range(pid, num_tiles, nprog):
        pr, q = _tile_coords(tile, num_row_pairs, n_groups, GROUP_M)
        base = (pr * n_groups + q) * 2 * G
        slots, mask = _row_slots(slots_ptr, base + ROLE * G, G)
        _, other = _row_slots(slots_ptr, base + (1 - ROLE) * G, G)
        n_steps = gl.where((mask | other) != 0, k_steps, 0)  # the producer's count: both consumers free each stage
        accs, step = _consume_slices((zero,) * G, step, n_steps, a_bufs, x_bufs, ready_bars, empty_bars, ROLE, 0,
                                     mask, _popcount(mask, G), None, G, 2, G, False, OVERLAP)
        tma.store_wait(pendings=0)  # the previous tile's stores have left the output buffers
        for g in gl.static_range(G):
            c_bufs.index(ROLE * G + g).store(accs[g].to(out_desc.dtype))
        fence_async_shared()
        for g in gl.static_range(G):
            if slots[g] >= 0:
                tma.async_copy_shared_to_global(out_desc, [slots[g] * B, 0], c_bufs.index(ROLE * G + g))
    tma.store_wait(pendings=0)


@gluon.jit
def _sdd_ws_group_kernel(
    at_ptr, x_ptr, out_ptr, slots_ptr,
    M, R_B, C_B, nnz, stride_atm, stride_xm, num_row_pairs, n_groups,
    B: gl.constexpr, G: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
    LOAD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, OVERLAP: gl.constexpr,
    in_layout: gl.constexpr, out_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """Persistent: program p takes tiles p, p + P, ... of the grouped order (tile = block-rows
    2p', 2p' + 1 x G block-columns). ``at`` is dY [M, R*B] (sdd's left operand transposed),
    ``x`` is X [M, C*B], ``out`` the blocks [nnz, B, B]. Slices past M are zero-filled."""
    dtype: gl.constexpr = at_ptr.dtype.element_ty
    at_desc = tma.make_tensor_descriptor(at_ptr, [M, R_B], [stride_atm, 1], [BLOCK_K, B], in_layout)
    x_desc = tma.make_tensor_descriptor(x_ptr, [M, C_B], [stride_xm, 1], [BLOCK_K, B], in_layout)
    out_desc = tma.make_tensor_descriptor(out_ptr, [nnz * B, B], [B, 1], [B, B], out_layout)
    a_bufs = gl.allocate_shared_memory(dtype, [2 * STAGES, BLOCK_K, B], in_layout)
    x_bufs = gl.allocate_shared_memory(dtype, [STAGES * G, BLOCK_K, B], in_layout)
    c_bufs = gl.allocate_shared_memory(dtype, [2 * G, B, B], out_layout)
    ready_bars, empty_bars = _alloc_ring(STAGES, 2)
    sizes = (num_row_pairs, n_groups, num_row_pairs * n_groups, gl.cdiv(M, BLOCK_K))
    gl.warp_specialize([
        (_sdd_group_mma, (out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, slots_ptr, sizes, G, GROUP_M, OVERLAP,
                          0, num_warps)),
        (_sdd_group_mma, (out_desc, a_bufs, x_bufs, c_bufs, ready_bars, empty_bars, slots_ptr, sizes, G, GROUP_M, OVERLAP,
                          1, num_warps)),
        (_sdd_group_load, (at_desc, x_desc, a_bufs, x_bufs, ready_bars, empty_bars, slots_ptr, sizes, G, BLOCK_K,
                           GROUP_M)),
    ], [num_warps, 1], [MMA_REGS, LOAD_REGS])


def sdd_group_slots(meta: torch.Tensor, row_of: torch.Tensor, row_cols: torch.Tensor, block_rows: int,
                    block_cols: int, group: int) -> torch.Tensor:
    """int32 [ceil(R / 2), ceil(C / G), 2, G]: the storage slot of each tile's blocks (-1:
    absent), a scatter of the layout's blocks (``row_of`` / ``row_cols``: each stored block's
    block-row and block-column, in storage order) into the padded grid. Remembered on ``meta``."""
    pairs, n_groups = cdiv(block_rows, 2), cdiv(block_cols, group)

    def build():
        grid = torch.full((2 * pairs, n_groups * group), -1, dtype=torch.int32, device=row_of.device)
        grid[row_of.long(), row_cols.long()] = torch.arange(row_of.numel(), dtype=torch.int32, device=row_of.device)
        return grid.view(pairs, 2, n_groups, group).permute(0, 2, 1, 3).contiguous()

    return cached_table(meta, _SLOTS, (block_rows, block_cols, group), build)


def ws_sdd_group_supported(a_t: torch.Tensor, x: torch.Tensor, out: torch.Tensor,
                           cfg: WsSddGroupConfig) -> str | None:
    """Why this kernel cannot run these operands (as
    :func:`tilesparse.kernels.bsmm_ws_sdd.operand_reason`, b 64), or None if it can."""
    block = out.shape[-1]
    why = operand_reason(a_t, x, out, (BLOCK,))
    if why is not None:
        return why
    if max(a_t.shape[0], a_t.shape[1] + block, x.shape[1] + cfg.group * block, out.shape[0] * block) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    pairs, n_groups = cdiv(a_t.shape[1] // block, 2), cdiv(x.shape[1] // block, cfg.group)
    if max(pairs * n_groups * 2 * cfg.group, cfg.group_m * n_groups) >= 1 << 31:
        return "indexes its tile table and tile order with 32 bits, too few for this many tiles at this config"
    return shared_memory_reason(cfg.shared_bytes(a_t.element_size()), a_t.device)


def run_if_supported(a_t, x, out, meta, block_rows, block_cols, cfg: WsSddGroupConfig, tuned_entry: bool) -> str | None:
    """Run the kernel and return None if it can take this call; else say why. A tuned
    entry (``tuned_entry``) below :data:`MIN_DENSITY` is refused: measured slower there."""
    why = (ws_sdd_group_supported(a_t, x, out, cfg)
           or density_floor_reason(out.shape[0], block_rows, block_cols, MIN_DENSITY, tuned_entry))
    if why is None:
        launch_sdd_ws_group(a_t, x, out, meta, block_rows, block_cols, cfg)
    return why


def launch_sdd_ws_group(a_t, x, out, meta, block_rows, block_cols, cfg: WsSddGroupConfig) -> None:
    """out[z] = (a_t^T @ x)[block z] for every stored block z, into the preallocated
    contiguous out [nnz, 64, 64]. The operands must be ones :func:`ws_sdd_group_supported`
    accepts (:func:`run_if_supported` checks)."""
    row_of, row_cols = table_views(meta, block_rows, block_cols, "row_of", "row_cols")
    slots = sdd_group_slots(meta, row_of, row_cols, block_rows, block_cols, cfg.group)
    pairs, n_groups = slots.shape[0], slots.shape[1]
    in_layout, out_layout = _sdd_layouts(cfg.block_k, BLOCK, a_t.dtype)  # the one-block sdd's, at M step block_k
    ensure_allocator()
    launch(_sdd_ws_group_kernel, (max(1, min(pairs * n_groups, sm_count(a_t.device))),),
        a_t, x, out, slots,
        a_t.shape[0], a_t.shape[1], x.shape[1], out.shape[0], a_t.stride(0), x.stride(0), pairs, n_groups,
        B=BLOCK, G=cfg.group, BLOCK_K=cfg.block_k, STAGES=cfg.stages, GROUP_M=cfg.group_m,
        LOAD_REGS=cfg.load_regs, MMA_REGS=cfg.mma_regs, OVERLAP=cfg.overlap,
        in_layout=in_layout, out_layout=out_layout, num_warps=4,
    )
