"""Small-batch dds over groups of whole block-rows: one pipelined stream per program (experimental).

The small kernel (:mod:`tilesparse.kernels.bsmm_small`) runs one program per block-row slice. On a
random layout the rows hold binomially many blocks (at density 0.1 and 96 blocks a row: mean 9.6,
longest ~18), and the programs, ~1.5 per slot, end unevenly: on the H200 a balanced layout of the
same density streamed 1.2-1.4x faster (``bench/results/2026-11-30-nvidia-h200-small-balance.json``).

Here a program owns a group of consecutive block-rows (or block-columns for op(S) = Sᵀ) holding
about the same number of blocks as every other group, and walks all their entries in *one* loop:
the entries of consecutive rows are consecutive in the table, so in fprop the weight's address is
still the step count times the block (no table load before the weight load), the software pipeline
runs across row ends without draining, and there is one wave of programs. Each entry's ``code``
(its output row times 2, plus 1 on a row's last entry) says where the row's sum is stored and the
accumulator restarts. Rows without blocks are written (zeros, or the bias) by extra programs.

Every output element is written once with its row's blocks summed in table order, as the small
kernel sums them: the same bits where both run one block per step in the same orientation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._alloc import new_output
from ._launch import launch
from ._tiles import check_power_of_two, cdiv, swappable_dot, tile_for
from .bsmm_small import _store_output, _w_tile, _x_tile

__all__ = ["RowsConfig", "launch_dds_rows", "row_groups", "rows_schedule"]


@dataclass(frozen=True)
class RowsConfig:
    """``sub`` output features per program, ``block_k`` reduction step (at most the tile side),
    ``block_m`` activation rows per program, ``programs_per_sm``: groups are made so that
    SMs x this many programs (all slices) run in one wave."""

    sub: int
    block_k: int
    block_m: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2

    def __post_init__(self):
        check_power_of_two(self, "sub", "block_k", "block_m")
        if self.num_warps not in (1, 2, 4, 8) or self.num_stages < 1 or self.programs_per_sm < 1:
            raise ValueError(f"RowsConfig needs num_warps in 1/2/4/8, num_stages >= 1 and programs_per_sm >= 1, "
                             f"got {self.num_warps!r}, {self.num_stages!r}, {self.programs_per_sm!r}")


@triton.jit
def _dds_rows_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    idx_ptr, slot_ptr, code_ptr, group_ptr, empty_ptr,
    M, n_group_programs,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Program (g * SUBS + s, m-tile) computes, for each row r of group g, C[m-tile, r*B + s*SUB + (0..SUB)]
    as the sum over r's entries e of op(V[slot e])[rows s, :] @ A[m, idx e block]^T, walking the group's
    entries group[g] .. group[g + 1] in one loop. Programs from ``n_group_programs`` on store zeros (+ bias)
    for the empty rows ``empty[(pid - n_group_programs) // SUBS]``."""
    SUBS: tl.constexpr = TILE_B // SUB
    K_STEPS: tl.constexpr = TILE_B // BLOCK_K
    pid = tl.program_id(0)
    s = pid % SUBS
    offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = s * SUB + tl.arange(0, SUB)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    f_ok = offs_f < B
    acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
    if pid >= n_group_programs:  # an empty row's slice: zeros (+ bias)
        row = tl.load(empty_ptr + (pid - n_group_programs) // SUBS)
        _store_output(acc, c_ptr, bias_ptr, row.to(tl.int64) * B + offs_f, offs_m, f_ok, m_ok, stride_cm, stride_cn,
                      HAS_BIAS)
    else:
        g = pid // SUBS
        start = tl.load(group_ptr + g)
        end = tl.load(group_ptr + g + 1)
        for t in range(start * K_STEPS, end * K_STEPS):
            e = t // K_STEPS
            k_in = (t % K_STEPS) * BLOCK_K + offs_k
            k_ok = k_in < B
            blk = tl.load(idx_ptr + e).to(tl.int64)
            code = tl.load(code_ptr + e)
            if HAS_SLOT:
                slot = tl.load(slot_ptr + e).to(tl.int64)
            else:
                slot = e.to(tl.int64)
            w = _w_tile(v_ptr + slot * (B * B), k_in, k_ok, offs_f, f_ok, B, TRANS_V)
            x = _x_tile(a_ptr, blk, k_in, k_ok, offs_m, m_ok, stride_am, stride_ak, B)
            acc = swappable_dot(acc, w, x, False, INPUT_PRECISION)
            done = ((code & 1) == 1) & (t % K_STEPS == K_STEPS - 1)  # the row's last step: store, restart
            cols = (code >> 1).to(tl.int64) * B + offs_f
            out = acc
            if HAS_BIAS:
                out += tl.load(bias_ptr + cols, mask=f_ok & done, other=0.0).to(tl.float32)[:, None]
            tl.store(c_ptr + offs_m[None, :] * stride_cm + cols[:, None] * stride_cn, out.to(c_ptr.dtype.element_ty),
                     mask=f_ok[:, None] & m_ok[None, :] & done)
            acc = tl.where(done, 0.0, acc)


def row_groups(counts, groups: int) -> list[int]:
    """Boundaries (row indices, ``groups + 1`` of them, first 0, last len(counts)) cutting rows of
    ``counts`` blocks into at most ``groups`` runs of consecutive rows with about equal blocks: run k
    ends at the row boundary nearest k / groups of the total (repeated boundaries are dropped)."""
    n = len(counts)
    total = sum(counts)
    if n == 0 or total == 0 or groups <= 1:
        return [0, n]
    bounds, cum, r = [0], 0, 0
    for k in range(1, groups):
        target = total * k / groups
        while r < n and cum + counts[r] <= target:
            cum += counts[r]
            r += 1
        # at row r the running sum passes the target: end before r or after it, whichever is nearer
        cut = r + 1 if r < n and (cum + counts[r] - target) < (target - cum) else r
        if cut > bounds[-1] and cut < n:
            bounds.append(cut)
    bounds.append(n)
    return bounds


def rows_schedule(counts, ptr: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(group entry offsets [G + 1], each entry's code [nnz]: output row * 2 + 1 on a row's last entry,
    the empty rows [>= 1]) as int32 on ptr's device, for rows of ``counts`` blocks (host ints) whose
    entries start at ``ptr`` (the table's offsets) and ``groups`` groups."""
    bounds = row_groups(counts, groups)
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    group = torch.tensor([offsets[b] for b in bounds], dtype=torch.int32)
    rows = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts, dtype=torch.long))
    code = rows * 2
    if code.numel():
        last = torch.tensor(offsets[1:], dtype=torch.long)[torch.tensor(counts) > 0] - 1
        code[last] += 1
    empty = [r for r, c in enumerate(counts) if c == 0] or [0]  # (a placeholder when none: never read)
    device = ptr.device
    return group.to(device), code.to(device=device, dtype=torch.int32), torch.tensor(empty, dtype=torch.int32,
                                                                                       device=device)


def launch_dds_rows(a, values, c, bias, counts, ptr, idx, slot, n_out, trans_v, precision, config: RowsConfig,
                    sms: int):
    """C = A @ op(S) (+ bias) for few rows of A over groups of rows (see the module docstring); ``counts``
    the host's blocks per output row (``n_out`` of them), the other arguments as ``bsmm.dds`` prepares them
    for the small kernel. The schedule is remembered on ``ptr`` per (groups, orientation)."""
    b = values.shape[-1]
    tile = tile_for(b)
    cfg = config
    if cfg.sub > tile or tile % cfg.block_k:
        raise ValueError(f"RowsConfig sub {cfg.sub} / block_k {cfg.block_k} do not fit the tile {tile}")
    subs = tile // cfg.sub
    m = a.shape[0]
    groups = max(1, sms * cfg.programs_per_sm // subs)
    cache = ptr.__dict__.setdefault("_tilesparse_rows_schedule", {})
    key = (groups, n_out)
    if key not in cache:
        cache[key] = rows_schedule(list(counts), ptr, groups)
    group, code, empty = cache[key]
    n_empty = sum(1 for x in counts if x == 0)
    n_group_programs = (group.numel() - 1) * subs
    grid = (n_group_programs + n_empty * subs, cdiv(m, cfg.block_m))
    launch(_dds_rows_kernel, grid,
           a, values, bias if bias is not None else c, c,
           idx, slot if slot is not None else idx, code, group, empty,
           m, n_group_programs,
           a.stride(0), a.stride(1), c.stride(0), c.stride(1),
           B=b, TILE_B=tile, SUB=cfg.sub, BLOCK_K=cfg.block_k, BLOCK_M=cfg.block_m, TRANS_V=trans_v,
           HAS_SLOT=slot is not None, HAS_BIAS=bias is not None, INPUT_PRECISION=precision,
           num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return c


def dds_rows(a: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias, block_rows: int, block_cols: int,
             trans: bool, config: RowsConfig, sms: int | None = None) -> torch.Tensor:
    """:func:`tilesparse.kernels.bsmm.dds` through the row-group kernel (for probes and tests): needs the
    layout's host counts (``layout.block_counts``), which tables built from a mask have."""
    from ..layout import block_counts, table_views
    from .bsmm import _input_precision
    counts = block_counts(meta)
    if counts is None:
        raise ValueError("dds_rows needs the layout's block counts (tables built from a mask)")
    if trans:  # C [M, R*b] = A @ S^T: rows of S are outputs, entries in storage order
        ptr, idx = table_views(meta, block_rows, block_cols, "row_ptr", "row_cols")
        slot, n_out, per_out = None, block_rows, counts[0]
    else:  # C [M, Ccols*b] = A @ S: columns of S are outputs
        ptr, idx, slot = table_views(meta, block_rows, block_cols, "col_ptr", "col_rows", "col_slot")
        n_out, per_out = block_cols, counts[1]
    b = values.shape[-1]
    c = new_output(a.shape[0], n_out * b, dtype=a.dtype, device=a.device)
    if sms is None:
        sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    return launch_dds_rows(a, values, c, bias, per_out, ptr, idx, slot, n_out, trans, _input_precision(a.dtype),
                           config, sms)
