"""Small-batch dds over a balanced stream of reduction steps (stream-K for block rows).

The small kernel (:mod:`tilesparse.kernels.bsmm_small`) runs one program per output
slice, so a random layout's longest block-rows (1.3-2.5x the mean) set the kernel's
time while most SMs idle: ncu at b 16, density 0.1, M 32 found the SMs active for 80 %
of the elapsed cycles. Here the reduction steps of all output slices, in table order,
form one stream that is cut into equal runs, one per program (``programs_per_sm`` per
SM). A program walks its run block-row by block-row: rows wholly inside it are written
directly; a row cut by a run boundary is summed by its programs into an fp32 workspace,
and the last of them to arrive adds the partials in program order (deterministic,
whatever the arrival order) and writes the row.

Same tables, math and step shapes as the small kernel (its docstring): steps over G
consecutive blocks for small blocks (``block_k`` > the tile, one index load per block),
else ``tile / block_k`` steps per block. The step table (each block-row's first step)
and each program's first block-row are built on the device once per layout and config,
with no host sync: the run length comes from a bound on the step count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._alloc import arrival_counters, new_output
from ._device import cached_table, sm_count
from ._launch import launch
from ._pdl import let_next_kernel_start, pdl_options, wait_for_previous_kernel
from ._tiles import cdiv, check_bools, check_fits_tile, check_power_of_two, tile_for
from .bsmm_small import _per_lane, _step, _store_output


@triton.jit
def _dds_stream_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    ptr_ptr, idx_ptr, slot_ptr, steps_ptr, first_ptr, ws_ptr, sem_ptr,
    M, n_rows, per_program,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PDL: tl.constexpr = 0, SPREAD_INDEX: tl.constexpr = True,
):
    """Program (p, tile) runs steps [p * per_program, (p + 1) * per_program) of the stream
    for output slice s and activation rows m-tile (tile = m_tile * SUBS + s). steps_ptr[j]
    is block-row j's first step (n_rows + 1 values); first_ptr[p] the first block-row the
    program touches: the one its first step continues, else the first that starts in its run
    (empty rows included: a row is written by the program whose run holds its first step).
    A row cut by run boundaries: each of its programs stores its partial sum at
    ws[(q * 2 + side) * n_tiles + tile] (side 0: the part that starts the program's run)
    and counts itself on sem[row * n_tiles + tile]; the last sums them for q in order."""
    wait_for_previous_kernel(PDL)
    SUBS: tl.constexpr = TILE_B // SUB
    p = tl.program_id(0)
    tile = tl.program_id(1)
    n_tiles = tl.num_programs(1)
    m_tile = tile // SUBS
    s = tile % SUBS
    t0 = p * per_program
    t1 = t0 + per_program
    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = s * SUB + tl.arange(0, SUB)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    f_ok = offs_f < B
    offs_ws = tl.arange(0, SUB)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    j = tl.load(first_ptr + p)
    row_first = tl.load(steps_ptr + j)
    while (j < n_rows) & (row_first < t1):
        row_end = tl.load(steps_ptr + j + 1)
        e_first = tl.load(ptr_ptr + j)
        e_end = tl.load(ptr_ptr + j + 1)
        u0 = tl.maximum(row_first, t0) - row_first
        u1 = tl.minimum(row_end, t1) - row_first
        acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
        if BLOCK_K > TILE_B:  # steps over G consecutive blocks of the row
            G: tl.constexpr = BLOCK_K // TILE_B
            k_in = offs_k % TILE_B
            k_ok = k_in < B
            e_off = offs_k // TILE_B
            for u in range(u0, u1):
                e0 = e_first + u * G
                e = e0 + e_off
                ok = k_ok & (e < e_end)
                if SPREAD_INDEX:
                    blk = _per_lane(idx_ptr, e0, e_end, G, TILE_B)
                else:
                    blk = tl.load(idx_ptr + e, mask=ok, other=0).to(tl.int64)
                if HAS_SLOT and SPREAD_INDEX:
                    slot = _per_lane(slot_ptr, e0, e_end, G, TILE_B)
                elif HAS_SLOT:
                    slot = tl.load(slot_ptr + e, mask=ok, other=0).to(tl.int64)
                else:
                    slot = e.to(tl.int64)
                acc = _step(acc, v_ptr + slot * (B * B), blk, k_in, ok, offs_f, f_ok, a_ptr, offs_m, m_ok,
                            stride_am, stride_ak, B, TRANS_V, False, INPUT_PRECISION)
        else:  # TILE_B // BLOCK_K steps per block
            K_STEPS: tl.constexpr = TILE_B // BLOCK_K
            for u in range(u0, u1):
                e = e_first + u // K_STEPS
                k_in = (u % K_STEPS) * BLOCK_K + offs_k
                blk = tl.load(idx_ptr + e).to(tl.int64)
                if HAS_SLOT:
                    slot = tl.load(slot_ptr + e).to(tl.int64)
                else:
                    slot = e.to(tl.int64)
                acc = _step(acc, v_ptr + slot * (B * B), blk, k_in, k_in < B, offs_f, f_ok, a_ptr, offs_m, m_ok,
                            stride_am, stride_ak, B, TRANS_V, False, INPUT_PRECISION)
        cols = j.to(tl.int64) * B + offs_f
        if (row_first >= t0) & (row_end <= t1):  # the whole row is this program's
            _store_output(acc, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS)
        else:
            side = tl.where(row_first + u0 == t0, 0, 1)
            tl.store(ws_ptr + ((p * 2 + side).to(tl.int64) * n_tiles + tile) * (SUB * BLOCK_M) + offs_ws, acc,
                     cache_modifier=".cg")
            tl.debug_barrier()  # every thread's partial is stored before the count below
            q0 = row_first // per_program
            q1 = (row_end - 1) // per_program
            counter = sem_ptr + j.to(tl.int64) * n_tiles + tile
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == q1 - q0:  # the last of the row's programs to finish
                total = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
                for q in range(q0, q1 + 1):
                    side_q = tl.where((q > q0) | (row_first == q0 * per_program), 0, 1)
                    total += tl.load(ws_ptr + ((q * 2 + side_q).to(tl.int64) * n_tiles + tile) * (SUB * BLOCK_M)
                                     + offs_ws, cache_modifier=".cg")
                _store_output(total, c_ptr, bias_ptr, cols, offs_m, f_ok, m_ok, stride_cm, stride_cn, HAS_BIAS)
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        j += 1
        row_first = row_end
    let_next_kernel_start(PDL)


@dataclass(frozen=True)
class StreamConfig:
    """Launch parameters of the balanced-stream small-batch kernel: ``sub``, ``block_k``,
    ``block_m``, ``num_warps``, ``num_stages`` as the small kernel's (SmallConfig; no swapped
    orientation), ``programs_per_sm`` runs of the step stream per SM (the stream is cut into
    that many times the GPU's SMs equal runs; 1 per device elsewhere), ``spread_index``:
    steps over several blocks load each block's index once."""

    sub: int
    block_k: int
    block_m: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 4
    spread_index: bool = True

    def __post_init__(self):
        check_power_of_two(self, "sub", "block_k", "block_m")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"StreamConfig needs num_warps in 1..16 (a power of two) and num_stages >= 1, got "
                             f"{self.num_warps!r}, {self.num_stages!r}")
        if isinstance(self.programs_per_sm, bool) or not isinstance(self.programs_per_sm, int) \
                or not 1 <= self.programs_per_sm <= 64:
            raise ValueError(f"StreamConfig.programs_per_sm must be an int in 1..64, got {self.programs_per_sm!r}")
        check_bools(self, "spread_index")


def steps_per_block_row(lengths: torch.Tensor, tile: int, block_k: int) -> torch.Tensor:
    """Reduction steps of each output block-row of ``lengths`` blocks: ceil(len / G) for steps
    over G = block_k / tile blocks, else len * tile / block_k."""
    if block_k > tile:
        g = block_k // tile
        return (lengths + g - 1) // g
    return lengths * (tile // block_k)


def step_bound(nnz: int, n_rows: int, tile: int, block_k: int) -> int:
    """An upper bound of the stream's step count known on the host (no sync): exact for steps
    within blocks; for steps over G blocks each row's last step may be short."""
    if block_k > tile:
        g = block_k // tile
        return (nnz + n_rows * (g - 1)) // g
    return nnz * (tile // block_k)


def stream_tables(ptr: torch.Tensor, tile: int, block_k: int, programs: int, per_program: int):
    """(steps, first): each block-row's first step in the stream (int32, n_rows + 1) and each
    program's first block-row (int32, ``programs``), built on ptr's device and remembered on
    ptr (layout tables are never written after they are built)."""
    def build():
        n_rows = ptr.numel() - 1
        lengths = (ptr[1:] - ptr[:-1]).to(torch.int64)
        steps = torch.zeros(n_rows + 1, dtype=torch.int64, device=ptr.device)
        torch.cumsum(steps_per_block_row(lengths, tile, block_k), 0, out=steps[1:])
        t0 = torch.arange(programs, dtype=torch.int64, device=ptr.device) * per_program
        starts_here = torch.searchsorted(steps, t0, side="left")  # first row whose first step >= t0
        continues = torch.searchsorted(steps[1:], t0, side="right")  # first row ending past t0
        first = torch.minimum(starts_here, continues).clamp_(max=n_rows)
        return steps.to(torch.int32), first.to(torch.int32)

    return cached_table(ptr, "_tilesparse_stream_tables", (tile, block_k, programs, per_program), build)


def launch_dds_small_stream(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, config: StreamConfig):
    """C = A @ op(S) (+ bias) for few rows of A over the balanced step stream; arguments as
    prepared by bsmm.dds."""
    b = values.shape[-1]
    tile = tile_for(b)
    cfg = config
    check_fits_tile(cfg, tile, "sub")
    m = a.shape[0]
    programs = cfg.programs_per_sm * sm_count(c.device)
    bound = step_bound(idx.numel(), n_out, tile, cfg.block_k)
    per_program = max(1, cdiv(bound + 1, programs))  # + 1: a run holds step `bound` (rows empty at the end)
    if programs * per_program >= 2 ** 31:
        raise ValueError(f"the step stream ({bound} steps) is past int32 indexing")
    steps, first = stream_tables(ptr, tile, cfg.block_k, programs, per_program)
    n_tiles = cdiv(m, cfg.block_m) * (tile // cfg.sub)
    # one [sub, block_m] fp32 partial per (program, side, tile); NaN-poisoned under
    # TILESPARSE_POISON=1, so a partial read unwritten shows
    ws = new_output(programs * 2 * n_tiles * cfg.sub * cfg.block_m, dtype=torch.float32, device=c.device)
    sem = arrival_counters(c.device, n_out * n_tiles)
    launch(_dds_stream_kernel, (programs, n_tiles),
        a, values, bias if bias is not None else c, c,
        ptr, idx, slot if slot is not None else ptr, steps, first, ws, sem,
        m, n_out, per_program,
        a.stride(0), a.stride(1), c.stride(0), c.stride(1),
        B=b, TILE_B=tile, SUB=cfg.sub, BLOCK_K=cfg.block_k, BLOCK_M=cfg.block_m,
        TRANS_V=trans_v, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None, INPUT_PRECISION=precision,
        SPREAD_INDEX=cfg.spread_index and cfg.block_k > tile,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_options(c),
    )
