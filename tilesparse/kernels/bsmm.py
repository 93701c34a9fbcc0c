"""Triton kernels for block-sparse matrix products, and their launchers.

Two kernels close over all three products of a linear layer (Gray et al. 2017):

* ``dds``: C[M, n*b] = A[M, k*b] @ op(S) (+ bias), S block-sparse [R*b, Cb*b].
  - fprop  Y  = X @ W^T  -> dds with op = transpose, walking W's row table;
  - bprop  dX = dY @ W   -> dds with op = identity, walking W's column table.
* ``sdd``: values[z] = (A @ B)[block z], A [R*b, M], B [M, Cb*b]  (sampled product).
  - updat  dW = dY^T @ X on the layout's blocks only.

Every output element is written by exactly one program, in a fixed order: the
results are bitwise deterministic. Row offsets are computed in int64, so tensors
past 2**31 elements index safely. Block sizes under 16 run on 16-wide tiles with
masked loads (tl.dot needs every dimension >= 16).

The launchers take raw tables (see :mod:`tilesparse.layout`) and do no argument
checking beyond what they need; the registered ops in :mod:`tilesparse.ops.bsmm`
check user input.
"""

from __future__ import annotations

import dataclasses
import functools
from math import prod

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..layout import longest_runs, table_views
from .._env import switch
from . import (bsmm_gemv, bsmm_kmajor, bsmm_panel, bsmm_resident, bsmm_sdd_group, bsmm_sdd_tile, bsmm_small,
               bsmm_tma, bsmm_ws, bsmm_ws_group, bsmm_ws_sdd, bsmm_ws_sdd_group, bsmm_ws_sdd_rows, tuned, ws_schedule)
from .bsmm_config import KernelConfig, _input_precision, dds_config, sdd_config, use_small_kernel
from .transpose import transpose_contiguous
from ._alloc import new_output
from ._launch import launch
from ._tiles import cdiv, check_fits_tile, grouped_tile, split_runs, sum_partials, tile_for
from ._device import capability_major, shared_memory_bytes, sm_count


@triton.jit
def _dds_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    ptr_ptr, idx_ptr, slot_ptr,
    M, n_out_blocks,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """One program computes C[m-tile, block-column j] = sum over the table entries e of
    column j: A[m-tile, idx[e]-block] @ op(V[slot[e]]).

    a [M, *] strided; v [nnz, B, B] contiguous; c [M, n_out_blocks * B] strided.
    ptr [n_out_blocks + 1], idx [nnz], slot [nnz] int32 (slot[e] = e when not HAS_SLOT).
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), n_out_blocks, GROUP_M)

    start = tl.load(ptr_ptr + pid_n)
    end = tl.load(ptr_ptr + pid_n + 1)

    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, TILE_B)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    acc = tl.zeros((BLOCK_M, TILE_B), dtype=tl.float32)

    K_STEPS: tl.constexpr = TILE_B // BLOCK_K
    for t in range(start * K_STEPS, end * K_STEPS):
        e = t // K_STEPS
        k_in = (t % K_STEPS) * BLOCK_K + offs_k
        blk = tl.load(idx_ptr + e).to(tl.int64)
        if HAS_SLOT:
            slot = tl.load(slot_ptr + e).to(tl.int64)
        else:
            slot = e.to(tl.int64)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + (blk * B + k_in)[None, :] * stride_ak
        v_base = v_ptr + slot * (B * B)
        if TRANS_V:  # op(V)[k, n] = V[n, k]
            v_ptrs = v_base + offs_n[None, :] * B + k_in[:, None]
        else:
            v_ptrs = v_base + k_in[:, None] * B + offs_n[None, :]
        if TILE_B == B:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            v = tl.load(v_ptrs)
        else:
            a = tl.load(a_ptrs, mask=m_ok[:, None] & (k_in < B)[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=(k_in < B)[:, None] & (offs_n < B)[None, :], other=0.0)
        acc = tl.dot(a, v, acc, input_precision=INPUT_PRECISION)

    cols = pid_n.to(tl.int64) * B + offs_n
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=offs_n < B, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_n < B)[None, :])


@triton.jit
def _sdd_kernel(
    a_ptr, b_ptr, out_ptr, rows_ptr, cols_ptr,
    M, m_per_split, nnz,
    stride_ar, stride_am, stride_bm, stride_bc,
    B: tl.constexpr, TILE_B: tl.constexpr, BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Program (z, s) computes A[rows[z]-block, M-slice s] @ B[M-slice s, cols[z]-block]
    and writes it to out[s, z] (out [splits, nnz, B, B]; with one split, out is the
    values tensor itself and the result is cast to its dtype).

    a [R*B, M] strided, b [M, C*B] strided.
    """
    z = tl.program_id(0)
    split = tl.program_id(1)
    r = tl.load(rows_ptr + z).to(tl.int64)
    c = tl.load(cols_ptr + z).to(tl.int64)
    offs_i = tl.arange(0, TILE_B)
    offs_m = tl.arange(0, BLOCK_M)
    i_ok = offs_i < B
    m_start = split.to(tl.int64) * m_per_split
    m_end = tl.minimum(m_start + m_per_split, M)
    rows_m = m_start + offs_m
    a_ptrs = a_ptr + (r * B + offs_i)[:, None] * stride_ar + rows_m[None, :] * stride_am
    b_ptrs = b_ptr + rows_m[:, None] * stride_bm + (c * B + offs_i)[None, :] * stride_bc
    acc = tl.zeros((TILE_B, TILE_B), dtype=tl.float32)
    for m0 in range(m_start, m_end, BLOCK_M):
        m_ok = (m0 + offs_m) < m_end
        a = tl.load(a_ptrs, mask=i_ok[:, None] & m_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=m_ok[:, None] & i_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_M * stride_am
        b_ptrs += BLOCK_M * stride_bm
    slot = split.to(tl.int64) * nnz + z
    out_ptrs = out_ptr + slot * (B * B) + offs_i[:, None] * B + offs_i[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & i_ok[None, :])


# --------------------------------------------------------------------------- launchers


@functools.lru_cache(maxsize=256)
def _with_chunks(config: bsmm_small.SmallConfig, chunks: int) -> bsmm_small.SmallConfig:
    return dataclasses.replace(config, chunks=chunks)


def _density(meta: torch.Tensor, block_rows: int, block_cols: int) -> float:
    """Fraction of blocks stored, from the packed tables' length (no device access)."""
    nnz = (meta.numel() - block_rows - block_cols - 2) // 4
    return nnz / max(1, block_rows * block_cols)


_WS_SDD = {kernel.CONFIG: kernel for kernel in (bsmm_ws_sdd, bsmm_ws_sdd_group, bsmm_ws_sdd_rows)}  # by config

# TF32 updat's activation copies through kernels/transpose.py instead of PyTorch's copy
# (see sdd). Measured on the H200 (twelfth session, scripts/probes/transpose_copy.py):
# 8192x4096 fp32 copy 0.243 -> 0.069 ms; TF32 updat at density 0.05 0.61 -> 0.27 ms,
# bitwise equal. False: PyTorch's copies.
TILED_TF32_COPIES = True

# The small kernel on K-major activations where bsmm_kmajor.KMAJOR_WINS measured it faster than the
# row-major choice, the transposing copy included (b 16 / 32, 16-64 rows, 16-bit, CUDA, weights at least
# 12288² unless the activations are K-major already; only where the dispatcher chooses the config).
# False: the row-major dispatch (the sweeps' baseline); the environment's TILESPARSE_KMAJOR=off (read at
# import) sets it, for A/B runs of whole suites (the LSTM's h^T written by its cell follows it too).
KMAJOR_SMALL = switch("TILESPARSE_KMAJOR", True)


def _launch_ws(a, values, c, bias, ptr, idx, slot, n_out, cfg: bsmm_ws.WsConfig, trans_v, meta, trans) -> None:
    """The warp-specialized dds, with its balanced tile schedule where ``cfg.balanced``
    and the layout's block counts are known (``ws_schedule.schedule_tensor``)."""
    sched = None
    if cfg.balanced:
        m = a.shape[0]
        sched = ws_schedule.schedule_tensor(meta, trans, n_out, cdiv(m, cfg.block_m), cfg.group_m,
                                            values.shape[-1] // cfg.block_k,
                                            bsmm_ws.programs(m, n_out, cfg, a.device), a.device)
    bsmm_ws.launch_dds_ws(a, values, c, bias, ptr, idx, slot, n_out, cfg, trans_v, sched)


def _use_tma(cfg: KernelConfig, block_size: int, *operands) -> bool:
    """TMA when asked for, on sm90+, for power-of-two b >= 16 and TMA-addressable
    row-major operands (3-D operands are blocks [nnz, b, b], contiguous)."""
    if not cfg.tma or tile_for(block_size) != block_size or not bsmm_tma.tma_supported(operands[0].device):
        return False
    return all(bsmm_tma.row_major_tma_ok(t) for t in operands if t is not None)


def _fall_back(config, why: str, kernel: str, chosen_here: bool) -> None:
    """None (the other kernels) for a tuned entry these operands cannot take; for the
    caller's own config, a ValueError saying why the kernel refuses it."""
    if not chosen_here:
        raise ValueError(f"config={config}: the {kernel} {why}")
    return None


def dds(
    a: torch.Tensor,
    values: torch.Tensor,
    meta: torch.Tensor,
    bias: torch.Tensor | None,
    block_rows: int,
    block_cols: int,
    trans: bool,
    config: (KernelConfig | bsmm_small.SmallConfig | bsmm_panel.PanelConfig | bsmm_ws.WsConfig
             | bsmm_ws_group.WsGroupConfig | bsmm_resident.ResidentConfig | bsmm_gemv.GemvConfig | None) = None,
) -> torch.Tensor:
    """C = A @ op(S) (+ bias) with S = (values, meta) of block grid [block_rows, block_cols].
    Few rows of A (``use_small_kernel``) run the small-batch kernel of
    :mod:`tilesparse.kernels.bsmm_small`; a config of any kind forces its kernel
    (``bsmm_panel.PanelConfig``: several output block-columns per program, small blocks;
    ``bsmm_ws.WsConfig``: the Hopper warp-specialized persistent kernel, b 16-128, 16-bit
    or fp32 as TF32; the default where measured faster: ``bsmm_ws.default_config``;
    ``bsmm_ws_group.WsGroupConfig``: its small-block variant, G output block-columns per
    tile sharing each activation tile, Hopper, 16-bit, b 16-64;
    ``bsmm_resident.ResidentConfig``: fprop at <= 64 rows with the activations held in shared
    memory while several block-rows stream past them, Hopper, 16-bit, b 16-64;
    ``bsmm_gemv.GemvConfig``: 1-8 rows, the product in FMAs, no tensor cores). Without one,
    the tuned table or the heuristic picks it, and a skewed layout (whose
    longest runs its tables carry: ``tilesparse.layout.longest_runs``) has its long runs
    cut in chunks on the small-batch kernel (``bsmm_small.auto_chunks``).

    trans=True:  C [M, block_rows*b] = A [M, block_cols*b] @ S^T   (fprop)
    trans=False: C [M, block_cols*b] = A [M, block_rows*b] @ S     (bprop)
    """
    return _dds(a, values, meta, bias, block_rows, block_cols, trans, config)[0]


def _dds(a, values, meta, bias, block_rows, block_cols, trans, config=None):
    """:func:`dds`: (C, the ``dds_launch.DdsLaunch`` that ran it (the small, FMA and panel kernels),
    or None for the other kernels)."""
    b = values.shape[-1]
    values = values.contiguous()  # the kernels address blocks as slot * b * b
    bias = bias.contiguous() if bias is not None else None  # and bias as bias_ptr + column
    if trans:
        (ptr, idx), slot, n_out = table_views(meta, block_rows, block_cols, "row_ptr", "row_cols"), None, block_rows
    else:
        ptr, idx, slot = table_views(meta, block_rows, block_cols, "col_ptr", "col_rows", "col_slot")
        n_out = block_cols
    precision = _input_precision(a.dtype)
    trans_v = trans
    if not trans and precision == "tf32":
        # TF32 tensor cores read their operands K-major only; S's blocks used untransposed
        # are N-major. Transposing each stored block (a pass over the nonzero values, not
        # a dense W) turns bprop into the K-major access fprop has.
        values, trans_v = values.transpose(1, 2).contiguous(), True
    m = a.shape[0]
    c = new_output(m, n_out * b, dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c, None
    chosen_here = config is None  # not the caller's: the layout's skew may still adjust it
    density = _density(meta, block_rows, block_cols)
    op = "fprop" if trans else "bprop"
    problem = (op, a.dtype, b, m, density, a.device, tuned.weight_shape(block_rows, block_cols, b))  # table key
    if config is None:  # a measured config for this problem, if `tilesparse tune` found one
        config = tuned.lookup(*problem)
        if isinstance(config, bsmm_sdd_group.SddGroupConfig):  # another op's kind (a hand-edited table)
            config = None
    elif isinstance(config, bsmm_sdd_group.SddGroupConfig):
        raise ValueError(f"config={config}: an sdd (updat) config; dds takes KernelConfig, SmallConfig, "
                         "PanelConfig, WsConfig, WsGroupConfig, ResidentConfig or GemvConfig")
    from_table = chosen_here and config is not None
    if chosen_here and KMAJOR_SMALL and bsmm_kmajor.kmajor_pays(op, a, b, density, block_rows * block_cols * b * b):
        # (the table's entries were tuned on row-major activations: K-major takes its own config)
        config, from_table = bsmm_kmajor.kmajor_config(m, b, a.dtype, shared_memory_bytes(a.device)), False
        a = bsmm_kmajor.as_kmajor(a)
    if isinstance(config, bsmm_resident.ResidentConfig):
        why = bsmm_resident.resident_supported(a, values, c, trans, config)
        if why is None and bsmm_resident.launch_dds_resident(a, values, c, bias, meta, block_rows, block_cols, config):
            return c, None
        why = why or "has no chunk table for this layout (columns out of order, or first asked for in a graph capture)"
        config = _fall_back(config, why, "resident-activation kernel", chosen_here)
    if isinstance(config, bsmm_ws_group.WsGroupConfig):
        why = bsmm_ws_group.dds_refusal(a, values, c, meta, block_rows, block_cols, trans, config)
        if why is None and chosen_here and density < bsmm_ws_group.MIN_DENSITY:
            why = f"is not used below density {bsmm_ws_group.MIN_DENSITY} (measured slower)"  # a tuned bucket's low end
        if why is None:
            bsmm_ws_group.launch_dds_ws_group(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v, config)
            return c, None
        config = _fall_back(config, why, "grouped warp-specialized kernel", chosen_here)
    if isinstance(config, bsmm_ws.WsConfig):
        why = bsmm_ws.ws_supported(a, values, c, config)
        if why is None:
            _launch_ws(a, values, c, bias, ptr, idx, slot, n_out, config, trans_v, meta, trans)
            return c, None
        config = _fall_back(config, why, "warp-specialized kernel", chosen_here)  # (a strided view, say)
    if isinstance(config, bsmm_gemv.GemvConfig):
        why = bsmm_gemv.gemv_supported(m, a.dtype)
        if why is None:
            return c, bsmm_gemv.launch_dds_gemv(a, values, c, bias, ptr, idx, slot, n_out, trans_v, config)
        config = _fall_back(config, why, "FMA kernel", chosen_here)
    if isinstance(config, bsmm_panel.PanelConfig):
        why = bsmm_panel.panel_refusal(meta, block_rows, block_cols, trans, b, config)
        if why is None:
            try:
                return c, bsmm_panel.launch_dds_panel(a, values, c, bias, meta, block_rows, block_cols, trans,
                                                      trans_v, precision, config)
            except OutOfResources as exc:  # found at its first compile, before anything ran
                why = f"needs more shared memory than this GPU has ({exc})"
        config = _fall_back(config, why, "panel kernel", chosen_here)
    if isinstance(config, bsmm_small.SmallConfig) or (config is None and use_small_kernel(m, b, a.dtype)):
        small_cfg = config or bsmm_small.small_config(m, b, a.dtype, shared_memory_bytes(a.device))
        if chosen_here and small_cfg.chunks == 1 and small_cfg.splits == 1:
            # The tables and heuristics were measured on random layouts; a skewed one
            # (hub block-rows, e.g. Barabasi-Albert) gets its long runs cut in chunks.
            runs = longest_runs(meta)
            chunks = bsmm_small.auto_chunks(runs and runs[0 if trans else 1], idx.numel(), n_out, b,
                                            small_cfg.sub, a.dtype)
            if chunks > 1:
                small_cfg = _with_chunks(small_cfg, chunks)
        if chosen_here and small_cfg.num_warps < 4:  # 1-2 warps were measured where each SM ran several
            # programs: 4 on one wave or less, unless the table's entry is for this very weight shape (then it
            # was measured on this grid)
            four = bsmm_small.warps_for_grid(small_cfg, prod(bsmm_small.small_grid(n_out, b, m, small_cfg)),
                                             sm_count(a.device))
            if four is not small_cfg and not (from_table and tuned.lookup_entry(*problem)[1]):
                small_cfg = four
        return c, bsmm_small.launch_dds_small(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, small_cfg)
    if config is None:  # on Hopper, the warp-specialized kernels where they were measured faster
        group_cfg = bsmm_ws_group.default_config(a, b, density)
        if group_cfg is not None and bsmm_ws_group.dds_refusal(a, values, c, meta, block_rows, block_cols, trans,
                                                               group_cfg) is None:
            bsmm_ws_group.launch_dds_ws_group(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v,
                                              group_cfg)
            return c, None
        ws_cfg = bsmm_ws.default_config(a, b, density)
        if ws_cfg is not None and bsmm_ws.ws_supported(a, values, c, ws_cfg) is None:
            _launch_ws(a, values, c, bias, ptr, idx, slot, n_out, ws_cfg, trans_v, meta, trans)
            return c, None
    cfg = config or dds_config(m, b, a.dtype)
    check_fits_tile(cfg, tile_for(b), "block_k")
    if _use_tma(cfg, b, a, values, c):  # the bias is read through pointers
        bsmm_tma.launch_dds_device_desc(a, values, c, bias, ptr, idx, slot, n_out, cfg, trans_v, precision)
        return c, None
    launch(_dds_kernel, (cdiv(m, cfg.block_m) * n_out,),
        a, values, bias if bias is not None else c, c,
        ptr, idx, slot if slot is not None else ptr,
        m, n_out,
        a.stride(0), a.stride(1), c.stride(0), c.stride(1),
        B=b, TILE_B=tile_for(b), BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        TRANS_V=trans_v, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None,
        GROUP_M=cfg.group_m, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return c, None


class DdsPlan:
    """:func:`dds` of one weight, many times, on activations of a few shapes and strides (a recurrence's
    timesteps: the caller's h0, then the cell's h or h^T): the first call with a shape, strides, dtype and
    device dispatches as :func:`dds` does; where that chose the small, FMA or panel kernel, later calls
    with the same launch it again with no dispatch (on the H200's host ~35 µs per eager call, a large
    part of an eager LSTM timestep). The other kernels take :func:`dds` each call. For one sequence:
    the launches hold what the dispatch made of the weight (a transposed copy for TF32 bprop, a
    contiguous one of a strided weight), which an in-place update of the weight would leave stale."""

    MAX_SIGNATURES = 4

    def __init__(self, values, meta, bias, block_rows: int, block_cols: int, trans: bool):
        self.values, self.meta, self.bias = values, meta, bias
        self.block_rows, self.block_cols, self.trans = block_rows, block_cols, trans
        self.runs: dict = {}  # (shape, strides, dtype, device) -> (launch, whether it takes a K-major copy)
        b = values.shape[-1]
        self.width = (block_rows if trans else block_cols) * b

    def __call__(self, a: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """C = A @ op(S) (+ bias); ``out``: a contiguous [M, width] buffer C is written into where the
        plan's remembered launch runs (the first call and :func:`dds`'s return a new tensor)."""
        if out is not None and (out.shape != (a.shape[0], self.width) or not out.is_contiguous()
                                or out.dtype != a.dtype or out.device != a.device):
            raise ValueError(f"out must be a contiguous ({a.shape[0]}, {self.width}) {a.dtype} tensor on {a.device}, "
                             f"got {tuple(out.shape)} {out.dtype} on {out.device}")
        signature = (a.shape, a.stride(), a.dtype, a.device)
        found = self.runs.get(signature)
        if found is not None:
            run, kmajor = found
            c = new_output(a.shape[0], self.width, dtype=a.dtype, device=a.device) if out is None else out
            run(bsmm_kmajor.as_kmajor(a) if kmajor else a, c)
            return c
        c, run = _dds(a, self.values, self.meta, self.bias, self.block_rows, self.block_cols, self.trans)
        if run is not None and len(self.runs) < self.MAX_SIGNATURES:
            self.runs[signature] = (run, run.strides != a.stride())  # (the dispatcher made them K-major)
        return c

    @property
    def run(self):
        """The launch remembered first (None before one is), for tests and probes."""
        return next(iter(self.runs.values()))[0] if self.runs else None


def sdd(
    a: torch.Tensor,
    b: torch.Tensor,
    meta: torch.Tensor,
    block_size: int,
    block_rows: int,
    block_cols: int,
    config: KernelConfig | bsmm_ws.WsConfig | bsmm_sdd_group.SddGroupConfig | bsmm_sdd_tile.SddTileConfig
    | bsmm_ws_sdd_group.WsSddGroupConfig | bsmm_ws_sdd_rows.WsSddRowsConfig | None = None,
) -> torch.Tensor:
    """values[z] = (A @ B)[block z] for the layout's blocks; A [R*b, M], B [M, C*b]. Opt-in
    or tuned configs: ``bsmm_sdd_group.SddGroupConfig`` (several blocks of a block-row per
    program, sharing each A tile) and ``bsmm_sdd_tile.SddTileConfig`` (a dense tile of
    blocks, only the stored ones written) for small blocks; on Hopper (16-bit) the
    warp-specialized ``bsmm_ws.WsConfig`` (b 64/128, M step ``block_m``),
    ``bsmm_ws_sdd_group.WsSddGroupConfig`` and ``bsmm_ws_sdd_rows.WsSddRowsConfig`` (b 64).

    With several M slices, partial products go to an fp32 workspace and are summed in a
    fixed order (no atomics), so the result stays bitwise deterministic.
    """
    row_of, row_cols = table_views(meta, block_rows, block_cols, "row_of", "row_cols")
    nnz = row_cols.numel()
    m = a.shape[1]
    precision = _input_precision(a.dtype)
    if precision == "tf32" and nnz:
        # TF32 tensor cores read K-major operands only; the reduction axis here is M, and
        # in the backward A = dY^T and B = X are M-strided views. One copy of each
        # activation makes them M-contiguous (no copy of the weight). PyTorch's copy of a
        # transposed view ran at ~1.1 TB/s on the H200 (0.49 of TF32 updat's 0.61 ms at
        # 8192x4096², density 0.05); kernels/transpose.py's tiled copy runs at ~3.9 TB/s
        # (TILED_TF32_COPIES; scripts/probes/transpose_copy.py compares both).
        if TILED_TF32_COPIES:
            a = a if a.stride(1) == 1 else transpose_contiguous(a.t())
            b = b if b.stride(0) == 1 else transpose_contiguous(b).t()
        else:
            a = a if a.stride(1) == 1 else a.contiguous()
            b = b if b.stride(0) == 1 else b.t().contiguous().t()
    values = new_output(nnz, block_size, block_size, dtype=a.dtype, device=a.device)
    if nnz == 0:
        return values
    if m == 0:  # an empty reduction: zero blocks (no kernel needs to build descriptors over empty operands)
        return values.zero_()
    density = nnz / max(1, block_rows * block_cols)
    cfg = config or tuned.lookup("updat", a.dtype, block_size, m, density, a.device,
                                 tuned.weight_shape(block_rows, block_cols, block_size))
    ws_sdd = _WS_SDD.get(type(cfg))
    if ws_sdd is not None:  # a Hopper warp-specialized kernel (asked for, or measured faster)
        why = ws_sdd.run_if_supported(a.t(), b, values, meta, block_rows, block_cols, cfg, config is None)
        if why is None:
            return values
        if config is not None:
            raise ValueError(f"config={config}: the {ws_sdd.KERNEL_NAME} {why}")
        cfg = None  # a tuned entry this call cannot run: the defaults below
    if isinstance(cfg, bsmm_sdd_group.SddGroupConfig):
        if config is None and not cfg.fits(block_size, a.element_size(), bsmm_sdd_group.smem_limit(a.device)):
            cfg = None  # a tuned entry too wide (or too big) for this block size: the heuristic below
        else:
            bsmm_sdd_group.launch_sdd_group(a, b, values, meta, block_rows, block_cols, precision, cfg)
            return values
    if cfg is None and a.is_cuda and a.dtype != torch.float32 and torch.version.hip is None:
        # the dense tile where measured faster (16-bit on Hopper, enough tiles for the SMs)
        tiles = bsmm_sdd_tile.tile_count(block_rows, block_cols, block_size, bsmm_sdd_tile.DEFAULT_TILE)
        cfg = bsmm_sdd_tile.default_config(m, block_size, density, tiles, sm_count(a.device),
                                           capability_major(a.device))
    if isinstance(cfg, bsmm_sdd_tile.SddTileConfig):
        if config is None and not cfg.fits(block_size):
            cfg = None  # a tuned entry for block sizes its tiles do not fit: the heuristic below
        else:
            bsmm_sdd_tile.launch_sdd_tile(a, b, values, meta, block_rows, block_cols, precision, cfg)
            return values
    if not isinstance(cfg, KernelConfig):  # nothing measured (or an entry of another kernel's kind)
        cfg = sdd_config(m, block_size, nnz, a.dtype, a.device)
    splits, m_per_split = split_runs(m, cfg.splits, cfg.block_m)
    out = values if splits == 1 else new_output(
        splits, nnz, block_size, block_size, dtype=torch.float32, device=a.device
    )
    tma = _use_tma(cfg, block_size, a.t(), b)
    if tma and cfg.device_desc:
        bsmm_tma.launch_sdd_device_desc(
            a.t(), b, out, row_of, row_cols, m, m_per_split, nnz, splits, cfg, block_size,
            precision,
        )
    elif tma:
        bsmm_tma.launch_sdd(
            a.t(), b, out, row_of, row_cols, m, m_per_split, nnz, splits, cfg, block_size, precision,
        )
    else:
        launch(_sdd_kernel, (nnz, splits),
            a, b, out, row_of, row_cols,
            m, m_per_split, nnz,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            B=block_size, TILE_B=tile_for(block_size), BLOCK_M=cfg.block_m,
            INPUT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if splits > 1:
        sum_partials(out, values)
    return values
