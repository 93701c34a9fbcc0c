"""Panel variant of dds for small blocks (b = 16, 32): several output block-columns per
program, sharing each activation tile.

The one-block-column kernel (:mod:`tilesparse.kernels.bsmm`) loads an activation tile
[BM, b] for every stored block and multiplies it by one b x b block: at b = 16 that is
16 FLOP per activation byte fetched from L2, and a 16-wide dot, so the kernel runs at
~10 % of dense's rate whatever the tuning (docs/performance.md). Here a program owns G
consecutive output block-columns (G * b = 64 or 128 outputs) and walks the *union* of
their reduction blocks: for each reduction block k in the union it loads the
activation tile once and multiplies it by a [b, G*b] panel assembled from the G stored
blocks (k, j..j+G-1), zeros where a block is absent. That is one wide dot per
activation tile instead of up to G narrow ones, and G times less activation traffic
when the rows overlap; the price is the zeros' FLOPs, so it pays where the G rows
share most of their reduction blocks (high density, or layouts built that way).

For few activation rows (16-64 per program) the same panels run with deep steps
(``entries`` union entries per step) and the panel's features as the MMA's M side
(``swap``): on the H200 the b 16 entries of the shipped table at 5-64 rows. At 65-512
rows, 128 x 128 tiles over 64-deep steps unswapped, with two splits summed in the kernel
(``fused_sum``): the b 16 / 32 entries there (the union of 4-8 block-rows is nearly full
at density 0.5, so these do dense's FLOPs on the stored blocks' bytes).

The panel tables (union entries per group and the G storage slots of each) are built
on the device from the layout's packed tables, once per (meta, direction, G), and
remembered on the ``meta`` tensor like the other table views. Same results, same
determinism as the other dds kernels, with one difference: an absent block is multiplied
as zeros, so an inf in the activation columns of a union entry gives NaN in the whole
panel's outputs (as the dense-masked product does), where the one-block kernels skip
absent blocks. Chosen by config (``PanelConfig``) or by a tuned entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..layout import table_views
from ._device import cached_table
from ._alloc import arrival_counters, new_output
from ._l2_prefetch import l2_prefetch_on, prefetch_l2_bytes_each
from ._launch import launch
from ._tiles import cdiv, check_bools, check_ints, check_power_of_two, grouped_tile, swappable_dot
from .dds_launch import DdsLaunch


@triton.jit
def _merge_offsets(x):
    """Offsets x [ROWS, E, B] as [ROWS, E*B], declared contiguous (and aligned) in runs of
    B along the merged axis: the reshape drops what Triton knew of x's runs. True only for
    x[r, e, i] = start(r, e) + i with every start a multiple of B, which each caller builds
    (a block's slot times B*B plus a row times B; a block column times B)."""
    B: tl.constexpr = x.shape[2]
    y = tl.reshape(x, (x.shape[0], x.shape[1] * B))
    return tl.max_contiguous(tl.multiple_of(y, [1, B]), [1, B])


@triton.jit
def _merge_mask(x, B: tl.constexpr):
    """A mask x [ROWS, E, 1] as [ROWS, E*B], declared constant in runs of B."""
    y = tl.reshape(tl.broadcast_to(x, (x.shape[0], x.shape[1], B)), (x.shape[0], x.shape[1] * B))
    return tl.max_constancy(y, [1, B])


@triton.jit
def _dds_panel_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    pptr_ptr, pk_ptr, pslots_ptr, ws_ptr, sem_ptr,
    M, n_out_cols, n_groups, split_stride,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_BIAS: tl.constexpr, GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    ENTRIES: tl.constexpr = 1, SWAP: tl.constexpr = False, FUSED_SUM: tl.constexpr = False,
    L2_AHEAD: tl.constexpr = 0,
):
    """Program (m-tile, group q, split p): C[m-tile, q*G*B : (q+1)*G*B] = sum over union
    entries u of group q: A[m-tile, pk[u]-block] @ panel(u), panel(u)[:, g*B:(g+1)*B] =
    op(V[pslots[u, g]]) (zero where pslots[u, g] < 0). SPLITS > 1: split p takes the p-th
    of SPLITS equal runs of the group's entries (whole steps: rounded up to a multiple of
    ENTRIES, so the last splits may be short or empty) and stores its fp32 partial sum (no bias)
    at c + p * split_stride; the launcher adds the partials in a fixed order.
    ENTRIES > 1: each step takes ENTRIES consecutive union entries, one [ENTRIES*B, G*B]
    panel (a deeper reduction step: b 16's 16-deep steps were the panel's limit).
    SWAP: the step is computed as acc^T[G*B, BLOCK_M] += panel^T @ A-tile^T, the panel's
    features as the MMA's M side, so few activation rows (16-64) fill the narrow side.
    FUSED_SUM (with SPLITS > 1): the partials go to ws, and the last program of a tile to
    count itself on sem sums them in split order (deterministic, whatever the arrival
    order), adds the bias, writes C and leaves its counter zero for the next launch: no
    partial-sum kernels after this one.
    L2_AHEAD > 0 (a power of two): L2 prefetch hints of the stored blocks of the program's
    first L2_AHEAD union entries at the start, then each step of the step's entries L2_AHEAD
    ahead, their slots loaded a step before the hints so nothing waits on them
    (``tilesparse.kernels._l2_prefetch``)."""
    pid_m, q = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), n_groups, GROUP_M)
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, G * B)
    n_in_block = offs_n % B
    m_ok = offs_m < M
    start = tl.load(pptr_ptr + q).to(tl.int64)  # int64 loop index: u * G cannot overflow
    end = tl.load(pptr_ptr + q + 1).to(tl.int64)
    if SPLITS > 1:
        run = (end - start + SPLITS - 1) // SPLITS
        if ENTRIES > 1:  # runs of whole steps, so only a group's last step is partial
            run = (run + ENTRIES - 1) // ENTRIES * ENTRIES
        start = tl.minimum(start + tl.program_id(1) * run, end)
        end = tl.minimum(start + run, end)
    if SWAP:
        acc = tl.zeros((G * B, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, G * B), dtype=tl.float32)
    if L2_AHEAD > 0:
        _prefetch_union_blocks(v_ptr, _union_slots(pslots_ptr, start, end, L2_AHEAD, G), B)
        pf_slots = _union_slots(pslots_ptr, start + L2_AHEAD, end, ENTRIES, G)
    # ENTRIES entries per step, each a [B, G*B] slice of the step's panel. The step's slots
    # are loaded once, spread to the panel's rows, their offsets broadcast over the block's
    # contiguous axis and merged into 2-D tiles with that axis declared contiguous, so the
    # loads stay 16-byte wide and the tiles land in the MMA's swizzled shared layout (a 3-D
    # tile reshaped after the load left an unswizzled one: 7.6-way bank conflicts). One entry
    # per step is the same code (it had its own loop, which loaded each slot once per panel
    # column, until the forty-first session).
    offs_e = tl.arange(0, ENTRIES)
    offs_b = tl.arange(0, B)
    offs_r = tl.arange(0, ENTRIES * B)
    for u0 in range(start, end, ENTRIES):
        if L2_AHEAD > 0:
            _prefetch_union_blocks(v_ptr, pf_slots, B)
            pf_slots = _union_slots(pslots_ptr, u0 + ENTRIES + L2_AHEAD, end, ENTRIES, G)
        u = u0 + offs_e
        u_ok = u < end
        k = tl.load(pk_ptr + u, mask=u_ok, other=0).to(tl.int64)
        # (loaded per panel row, the slots were 16 four-byte loads each: the forward's panel ran
        # 1.4-2x slower than bprop's until the fortieth session)
        step_slots = tl.load(pslots_ptr + u[:, None] * G + tl.arange(0, G)[None, :], mask=u_ok[:, None],
                             other=-1)  # [E, G]
        if TRANS_V:  # panel^T[g*B + n, e*B + r] = V[slot(e, g)][n, r]: contiguous along r
            slots = tl.reshape(tl.broadcast_to(tl.trans(step_slots)[:, None, :], (G, B, ENTRIES)),
                               (G * B, ENTRIES))  # [N, E]
            row = tl.where(slots >= 0, slots, 0).to(tl.int64) * (B * B) + n_in_block[:, None] * B
        else:  # panel[e*B + r, g*B + n] = V[slot(e, g)][r, n]: contiguous along n
            slots = tl.reshape(tl.broadcast_to(step_slots[:, None, :], (ENTRIES, B, G)), (ENTRIES * B, G))
            row = tl.where(slots >= 0, slots, 0).to(tl.int64) * (B * B) + (offs_r % B)[:, None] * B
        offs = _merge_offsets(row[:, :, None] + offs_b[None, None, :])
        ok = _merge_mask((slots >= 0)[:, :, None], B)
        panel = tl.load(v_ptr + offs, mask=ok, other=0.0)  # absent blocks: zeros, no bytes read
        if TRANS_V:
            panel = tl.trans(panel)
        a_cols = _merge_offsets(k[None, :, None] * B + offs_b[None, None, :])
        a_ok = _merge_mask(u_ok[None, :, None], B)
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + a_cols * stride_ak, mask=m_ok[:, None] & a_ok, other=0.0)
        acc = swappable_dot(acc, a, panel, SWAP, INPUT_PRECISION)
    if SWAP:
        acc = tl.trans(acc)  # [BLOCK_M, G * B], as the stores below expect
    cols = q.to(tl.int64) * (G * B) + offs_n
    col_ok = cols < n_out_cols
    if SPLITS > 1 and FUSED_SUM:
        tile = q.to(tl.int64) * tl.cdiv(M, BLOCK_M) + pid_m
        ws_tile = ws_ptr + tile * (SPLITS * BLOCK_M * G * B)
        offs_ws = tl.arange(0, BLOCK_M)[:, None] * (G * B) + offs_n[None, :]
        tl.store(ws_tile + tl.program_id(1) * (BLOCK_M * G * B) + offs_ws, acc, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial is stored before the count below
        arrived = tl.atomic_add(sem_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:  # the last split of this tile to finish
            total = tl.zeros((BLOCK_M, G * B), dtype=tl.float32)
            for p in range(0, SPLITS):
                total += tl.load(ws_tile + p * (BLOCK_M * G * B) + offs_ws, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + cols[None, :] * stride_cn
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])
            tl.atomic_xchg(sem_ptr + tile, 0, sem="relaxed", scope="gpu")
        return
    if SPLITS > 1:
        c_ptr += tl.program_id(1).to(tl.int64) * split_stride
    if HAS_BIAS and SPLITS == 1:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])


@triton.jit
def _union_slots(pslots_ptr, first, end, COUNT: tl.constexpr, G: tl.constexpr):
    """The storage slots of the G blocks of union entries first .. first + COUNT - 1 (before
    ``end``), flat [COUNT * G]; -1 for absent blocks and entries past the run."""
    lanes = tl.arange(0, COUNT * G)
    u = first + lanes // G
    return tl.load(pslots_ptr + u * G + lanes % G, mask=u < end, other=-1)


@triton.jit
def _prefetch_union_blocks(v_ptr, slots, B: tl.constexpr):
    """An L2 prefetch hint for each stored block of ``slots`` (a tensor; -1: none)."""
    ELT: tl.constexpr = v_ptr.dtype.element_ty.primitive_bitwidth // 8
    present = slots >= 0
    prefetch_l2_bytes_each(v_ptr + tl.where(present, slots, 0).to(tl.int64) * (B * B), B * B * ELT, present)


@dataclass(frozen=True)
class PanelConfig:
    """Launch parameters of the panel kernel: ``group`` output block-columns per program
    (G), ``block_m`` activation rows per program, ``splits`` programs per panel, each
    summing a run of its union entries into an fp32 workspace (summed in a fixed order):
    for few activation rows, where one program per panel walking the whole reduction
    left too few programs (b 16 at 16-64 rows: 2-11x slower than the small-batch kernel
    without splits, docs/performance.md). ``entries`` union entries per reduction step
    (``entries`` * b deep); ``swap``: the panel's G * b features as the MMA's M side and
    the activation rows as its N side (few rows); ``fused_sum``: with splits, the last
    program of each tile sums the partials in split order, instead of a torch sum and copy
    after the kernel (two fewer kernels per call); ``l2_ahead``: union entries ahead of the
    step whose stored blocks each program asks L2 to fetch (bulk prefetch hints, sm_90+; 0:
    none, else a power of two; the interpreter and older GPUs ignore it)."""

    group: int
    block_m: int = 128
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    splits: int = 1
    entries: int = 1
    swap: bool = False
    fused_sum: bool = False
    l2_ahead: int = 0

    def __post_init__(self):
        check_power_of_two(self, "group", "entries", minimum=1)
        if isinstance(self.l2_ahead, bool) or self.l2_ahead != 0:
            check_power_of_two(self, "l2_ahead", minimum=1)
            if self.l2_ahead * self.group > 4096:
                raise ValueError(f"PanelConfig.l2_ahead * group must be at most 4096, got {self.l2_ahead} * "
                                 f"{self.group}")
        check_power_of_two(self, "block_m")
        check_ints(self, "splits")
        check_bools(self, "swap", "fused_sum")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.group_m < 1 or self.splits < 1:
            raise ValueError(f"bad PanelConfig {self!r}: num_warps a power of two <= 16, num_stages, group_m and "
                             "splits >= 1")


def panel_supported(block_size: int) -> bool:
    """The panel kernel tiles whole blocks: b must be a power of two >= 16."""
    return block_size >= 16 and block_size & (block_size - 1) == 0


_TABLES = "_tilesparse_panel_tables"


def panel_tables(meta: torch.Tensor, block_rows: int, block_cols: int, trans: bool, group: int):
    """(pptr [Q+1], pk [U], pslots [U, G]) int32 for output block-columns grouped G at a
    time: group q's union entries are pptr[q]:pptr[q+1], each naming a reduction block
    pk[u] and the storage slots of the G blocks (reduction block, output column), -1 for
    an absent block. trans=True (fprop) groups block-rows of S; trans=False groups
    block-columns. Built on meta's device and remembered on ``meta``; the build's
    nonzero() syncs, so during a CUDA-graph capture tables not built before are None."""
    return cached_table(meta, _TABLES, (block_rows, block_cols, trans, group),
                        lambda: _build_panel_tables(meta, block_rows, block_cols, trans, group),
                        build_while_capturing=False)


def panel_refusal(meta: torch.Tensor, block_rows: int, block_cols: int, trans: bool, block: int,
                  cfg: PanelConfig) -> str | None:
    """Why the panel kernel cannot run this call (block size, panel width or step depth
    past what it tiles, or its tables first asked for during a CUDA-graph capture), or None."""
    if not panel_supported(block):
        return f"needs a power-of-two block size >= 16, got {block}"
    if cfg.group * block > 256:
        return f"makes panels of {cfg.group * block} columns at b = {block} (group={cfg.group}); at most 256"
    if cfg.entries * block > 256:
        return f"makes reduction steps {cfg.entries * block} deep at b = {block} (entries={cfg.entries}); at most 256"
    if (meta.is_cuda and torch.cuda.is_current_stream_capturing()
            and (block_rows, block_cols, trans, cfg.group) not in meta.__dict__.get(_TABLES, {})):
        return ("builds its tables with a host sync, not allowed while a CUDA graph is being captured: "
                "call it once before capturing")
    return None


def _build_panel_tables(meta: torch.Tensor, block_rows: int, block_cols: int, trans: bool, group: int):
    row_of, row_cols = table_views(meta, block_rows, block_cols, "row_of", "row_cols")
    nnz = row_of.numel()
    slot = torch.full((block_rows, block_cols), -1, dtype=torch.int32, device=meta.device)
    slot[row_of.long(), row_cols.long()] = torch.arange(nnz, dtype=torch.int32, device=meta.device)
    if not trans:
        slot = slot.t()
    n_out, n_in = slot.shape
    n_groups = cdiv(n_out, group)
    padded = torch.full((n_groups * group, n_in), -1, dtype=torch.int32, device=meta.device)
    padded[:n_out] = slot
    grouped = padded.view(n_groups, group, n_in)
    union = (grouped >= 0).any(dim=1)  # [Q, n_in]
    q_idx, k_idx = union.nonzero(as_tuple=True)  # sorted by group, then reduction block
    pslots = grouped[q_idx, :, k_idx].contiguous()  # [U, G]
    pptr = torch.zeros(n_groups + 1, dtype=torch.int32, device=meta.device)
    pptr[1:] = torch.cumsum(union.sum(dim=1), 0).to(torch.int32)
    return pptr, k_idx.to(torch.int32).contiguous(), pslots


def launch_dds_panel(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v, precision,
                     cfg: PanelConfig) -> DdsLaunch:
    """C = A @ op(S) (+ bias) with the panel kernel; ``trans`` picks the grouping (fprop
    groups S's block-rows), ``trans_v`` how stored blocks are read (see bsmm.dds, which
    first asks :func:`panel_refusal` whether the kernel takes the call). Returns the launch it
    ran, for more products of activations shaped and strided as ``a``."""
    return panel_launch(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v, precision, cfg).first(c)


def panel_launch(a, values, c, bias, meta, block_rows, block_cols, trans, trans_v, precision,
                 cfg: PanelConfig) -> DdsLaunch:
    """The panel kernel's launch for one weight and activations shaped and strided as ``a``, built
    (tables and workspaces made) but not run."""
    b = values.shape[-1]
    pptr, pk, pslots = panel_tables(meta, block_rows, block_cols, trans, cfg.group)
    n_groups = pptr.numel() - 1
    m = a.shape[0]
    fused = cfg.fused_sum and cfg.splits > 1
    split_out = cfg.splits > 1 and not fused
    # the splits' fp32 partials, summed after the launch (deterministic), unless summed in the kernel
    partials = new_output(cfg.splits, m, c.shape[1], dtype=torch.float32, device=c.device) if split_out else None
    out = c if partials is None else partials
    grid = (cdiv(m, cfg.block_m) * n_groups, cfg.splits)
    ws = sem = pptr  # placeholders: only the fused sum reads them
    if fused:
        tiles = grid[0]
        # one [block_m, G*b] fp32 partial per split of every tile (NaN-poisoned under
        # TILESPARSE_POISON=1, so a partial read unwritten shows)
        ws = new_output(tiles * cfg.splits * cfg.block_m * cfg.group * b, dtype=torch.float32, device=c.device)
        sem = arrival_counters(c.device, tiles)
    args = (a, values, bias if bias is not None else out, out,
            pptr, pk, pslots, ws, sem,
            m, c.shape[1], n_groups, out.stride(0) if split_out else 0,
            a.stride(0), a.stride(1), out.stride(-2), out.stride(-1))
    kwargs = dict(B=b, G=cfg.group, BLOCK_M=cfg.block_m, SPLITS=cfg.splits,
                  TRANS_V=trans_v, HAS_BIAS=bias is not None, GROUP_M=cfg.group_m, INPUT_PRECISION=precision,
                  ENTRIES=cfg.entries, SWAP=cfg.swap, FUSED_SUM=fused,
                  L2_AHEAD=cfg.l2_ahead if cfg.l2_ahead and l2_prefetch_on(values) else 0,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return DdsLaunch(_dds_panel_kernel, grid, args, kwargs, bias, partials, _module_launch)


def _module_launch(*args, **kwargs) -> None:
    """This module's ``launch``, looked up at call time (tests replace it)."""
    launch(*args, **kwargs)
