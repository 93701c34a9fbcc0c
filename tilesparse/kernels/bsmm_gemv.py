"""Few-row variant of dds without tensor cores: the weight streamed, the product in FMAs.

At 1-8 rows of activations the small-batch kernel (:mod:`tilesparse.kernels.bsmm_small`)
pads the activations to 16 rows for the MMA. Each step then stages a 16-row activation
tile through shared memory and reads both operands back with ``ldmatrix``: on the H200 at
b 16, M 1, density 0.5 ncu found the L1/shared pipe 81 % busy (~177 shared wavefronts per
2 KB step) while HBM ran at 38 %, so shared memory, not HBM, set the pace.

Here each step's weight tile [SUB, BLOCK_K] (a slice of one block, or G whole blocks
side by side) is multiplied elementwise by the gathered activations [M_PAD, BLOCK_K]
and added into an fp32 accumulator of the same shape; the reduction over k happens once,
after the loop. Per weight element that is M_PAD FMAs, cheap next to its HBM bytes at
M <= 8. Weight and activations are read from global memory straight into registers.
Triton pipelines only loads that feed a dot, so the loop prefetches for itself: each
step's tiles one step ahead, its block indices two steps ahead.

Same tables, same result contract as the other dds kernels: every output written once,
a fixed reduction order (bitwise deterministic), fp32 accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._l2_prefetch import check_reach, l2_prefetch_on, prefetch_block_slices
from ._launch import launch
from ._pdl import let_next_kernel_start, pdl_options, wait_for_previous_kernel
from ._tiles import check_bools, check_fits_tile, check_power_of_two, next_power_of_2, tile_for
from .dds_launch import DdsLaunch

MAX_ROWS = 8  # activation rows this kernel takes (M_PAD FMAs per weight element)


@triton.jit
def _dds_gemv_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr, ptr_ptr, idx_ptr, slot_ptr,
    M, stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, M_PAD: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr, REDUCE_EACH_STEP: tl.constexpr,
    PDL: tl.constexpr = 0, L2_AHEAD: tl.constexpr = 0,
):
    """Program j * SUBS + s computes C[:, j*B + s*SUB + (0..SUB)] =
    sum over entries e of table j: A[:, idx e block] @ op(V[slot e])[rows s, :]^T.

    TRANS_V (fprop): op(V) = V; not TRANS_V (bprop): op(V) = V^T.
    A step covers BLOCK_K lanes of the reduction: a slice of one block (BLOCK_K < TILE_B) or
    G = BLOCK_K / TILE_B consecutive entries of the table, lane k in entry k // TILE_B.
    Triton pipelines only loads that feed a dot, so the loop pipelines itself: each step's
    weight and activation tiles are loaded one step ahead (registers carried through the
    loop) and its block indices (and slots) two steps ahead, so a whole step's bytes are
    in flight while the one before is multiplied.
    REDUCE_EACH_STEP: the accumulator is [M_PAD, SUB], each step's products summed over k
    at once (fewer registers, a reduction per step); else [M_PAD, SUB, BLOCK_K], summed
    over k once after the loop.
    L2_AHEAD > 0 (fprop: no slots): L2 prefetch hints of the program's slices of its first
    L2_AHEAD blocks at the start, then of each step's blocks L2_AHEAD entries ahead
    (``tilesparse.kernels._l2_prefetch``): the loop itself keeps only one step in flight.
    """
    tl.static_assert(L2_AHEAD == 0 or not HAS_SLOT, "L2_AHEAD needs the blocks in table order (fprop)")
    wait_for_previous_kernel(PDL)
    SUBS: tl.constexpr = TILE_B // SUB
    pid = tl.program_id(0)
    j = pid // SUBS
    s = pid % SUBS
    offs_m = tl.arange(0, M_PAD)
    offs_f = s * SUB + tl.arange(0, SUB)
    m_ok = offs_m < M
    f_ok = offs_f < B
    start = tl.load(ptr_ptr + j)
    end = tl.load(ptr_ptr + j + 1)
    if REDUCE_EACH_STEP:
        acc = tl.zeros((M_PAD, SUB), dtype=tl.float32)
    else:
        acc = tl.zeros((M_PAD, SUB, BLOCK_K), dtype=tl.float32)
    # lanes of a step: entry offset (from the step's first entry, in K_STEPS-ths of an entry) and
    # position within the block
    if BLOCK_K > TILE_B:
        K_STEPS: tl.constexpr = 1
        e_off = tl.arange(0, BLOCK_K) // TILE_B
        STEP: tl.constexpr = BLOCK_K // TILE_B  # entries per step
    else:
        K_STEPS: tl.constexpr = TILE_B // BLOCK_K
        e_off = tl.zeros((BLOCK_K,), dtype=tl.int32)
        STEP: tl.constexpr = 1
    t_end = end * K_STEPS
    t0 = start * K_STEPS
    if L2_AHEAD > 0:
        prefetch_block_slices(v_ptr, s, start, end, L2_AHEAD, B, SUB)
    # step t's lanes: entries t // K_STEPS + e_off (or t + e_off for multi-entry steps), block lanes k_in
    e_a, k_a, ok_a = _step_lanes(t0, e_off, t_end, K_STEPS, STEP, BLOCK_K, TILE_B, B)
    blk_a, slot_a = _tables(idx_ptr, slot_ptr, e_a, ok_a, HAS_SLOT)
    w_next, x_next = _tiles(v_ptr, a_ptr, blk_a, slot_a, k_a, ok_a, offs_f, f_ok, offs_m, m_ok, stride_am,
                            stride_ak, B, TRANS_V)
    e_b, k_b, ok_b = _step_lanes(t0 + STEP, e_off, t_end, K_STEPS, STEP, BLOCK_K, TILE_B, B)
    blk_b, slot_b = _tables(idx_ptr, slot_ptr, e_b, ok_b, HAS_SLOT)
    for t in range(t0, t_end, STEP):
        if L2_AHEAD > 0:  # the step's entries L2_AHEAD ahead (at a block's first step when steps split blocks)
            if STEP > 1:
                prefetch_block_slices(v_ptr, s, t + L2_AHEAD, end, STEP, B, SUB)
            else:
                prefetch_block_slices(v_ptr, s, tl.where(t % K_STEPS == 0, t // K_STEPS + L2_AHEAD, end), end, 1,
                                      B, SUB)
        w = w_next
        x = x_next
        w_next, x_next = _tiles(v_ptr, a_ptr, blk_b, slot_b, k_b, ok_b, offs_f, f_ok, offs_m, m_ok, stride_am,
                                stride_ak, B, TRANS_V)
        e_b, k_b, ok_b = _step_lanes(t + 2 * STEP, e_off, t_end, K_STEPS, STEP, BLOCK_K, TILE_B, B)
        blk_b, slot_b = _tables(idx_ptr, slot_ptr, e_b, ok_b, HAS_SLOT)
        prod = w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]  # [M_PAD, SUB, BLOCK_K]
        if REDUCE_EACH_STEP:
            acc += tl.sum(prod, axis=2)
        else:
            acc += prod
    let_next_kernel_start(PDL)
    if REDUCE_EACH_STEP:
        out = acc
    else:
        out = tl.sum(acc, axis=2)  # [M_PAD, SUB]
    cols = j.to(tl.int64) * B + offs_f
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=f_ok, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & f_ok[None, :])


@triton.jit
def _step_lanes(t, e_off, t_end, K_STEPS: tl.constexpr, STEP: tl.constexpr, BLOCK_K: tl.constexpr,
                TILE_B: tl.constexpr, B: tl.constexpr):
    """Step t's lanes: their table entries, positions within the block, and which are real
    (inside the block and the run)."""
    lanes = tl.arange(0, BLOCK_K)
    if STEP > 1:
        e = t + e_off
        k_in = lanes % TILE_B
        ok = (k_in < B) & (e < t_end)
    else:
        e = t // K_STEPS + e_off
        k_in = (t % K_STEPS) * BLOCK_K + lanes
        ok = (k_in < B) & (t < t_end)
    return e, k_in, ok


@triton.jit
def _tables(idx_ptr, slot_ptr, e, ok, HAS_SLOT: tl.constexpr):
    """The block index (and value slot) of each lane's entry; 0 where the lane is not real."""
    blk = tl.load(idx_ptr + e, mask=ok, other=0).to(tl.int64)
    if HAS_SLOT:
        slot = tl.load(slot_ptr + e, mask=ok, other=0).to(tl.int64)
    else:
        slot = e.to(tl.int64)
    return blk, slot


@triton.jit
def _tiles(v_ptr, a_ptr, blk, slot, k_in, ok, offs_f, f_ok, offs_m, m_ok, stride_am, stride_ak,
           B: tl.constexpr, TRANS_V: tl.constexpr):
    """A step's weight tile op(V)[f, k] [SUB, BLOCK_K] and activations A[m, blk * B + k]
    [M_PAD, BLOCK_K] (zeros where a lane, row or feature is not real)."""
    v_base = v_ptr + slot * (B * B)
    if TRANS_V:
        w = tl.load(v_base[None, :] + offs_f[:, None] * B + k_in[None, :], mask=f_ok[:, None] & ok[None, :],
                    other=0.0)
    else:
        w = tl.load(v_base[None, :] + k_in[None, :] * B + offs_f[:, None], mask=f_ok[:, None] & ok[None, :],
                    other=0.0)
    x = tl.load(a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (blk * B + k_in)[None, :] * stride_ak,
                mask=m_ok[:, None] & ok[None, :], other=0.0)
    return w, x


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters of the FMA kernel: ``sub`` output features per program (a slice
    of a block-row), ``block_k`` reduction step (past the tile side: that many lanes over
    consecutive blocks), ``num_warps``, ``reduce_each_step`` (a [rows, sub] accumulator,
    the step's products summed over k at once, instead of a [rows, sub, block_k] one summed
    after the loop). No pipeline depth: Triton's pipeliner leaves a loop without a dot
    alone, and the kernel prefetches one step ahead itself; ``l2_ahead``: blocks ahead of
    the step that each program asks L2 to fetch (bulk prefetch hints, sm_90+, fprop; 0:
    none; bprop, the interpreter and older GPUs ignore it)."""

    sub: int
    block_k: int
    num_warps: int = 4
    reduce_each_step: bool = False
    l2_ahead: int = 0

    def __post_init__(self):
        check_power_of_two(self, "block_k")
        check_power_of_two(self, "sub", minimum=4)  # no dot: slices narrower than 16 are fine
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemvConfig.num_warps must be a power of two in 1..16, got {self.num_warps!r}")
        check_bools(self, "reduce_each_step")
        check_reach(self)


def gemv_supported(m: int, dtype: torch.dtype) -> str | None:
    """None if the FMA kernel takes ``m`` rows of ``dtype``, else why not."""
    if not 1 <= m <= MAX_ROWS:
        return f"takes 1 to {MAX_ROWS} rows of activations, got {m}"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"takes fp16, bf16 or fp32, got {dtype}"
    return None


def launch_dds_gemv(a, values, c, bias, ptr, idx, slot, n_out, trans_v, config: GemvConfig) -> DdsLaunch:
    """C = A @ op(S) (+ bias) for 1-8 rows of A (bsmm.dds has checked them:
    :func:`gemv_supported`); arguments as prepared by bsmm.dds. Returns the launch it ran, for
    more products of activations shaped and strided as ``a``."""
    return gemv_launch(a, values, c, bias, ptr, idx, slot, n_out, trans_v, config).first(c)


def gemv_launch(a, values, c, bias, ptr, idx, slot, n_out, trans_v, config: GemvConfig) -> DdsLaunch:
    """The FMA kernel's launch for one weight and activations shaped and strided as ``a``, not run."""
    b = values.shape[-1]
    tile = tile_for(b)
    check_fits_tile(config, tile, "sub")
    m = a.shape[0]
    args = (a, values, bias if bias is not None else c, c, ptr, idx, slot if slot is not None else ptr,
            m, a.stride(0), a.stride(1), c.stride(0), c.stride(1))
    kwargs = dict(B=b, TILE_B=tile, SUB=config.sub, BLOCK_K=config.block_k, M_PAD=next_power_of_2(m),
                  TRANS_V=trans_v, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None,
                  REDUCE_EACH_STEP=config.reduce_each_step,
                  L2_AHEAD=config.l2_ahead if config.l2_ahead and slot is None and l2_prefetch_on(values) else 0,
                  num_warps=config.num_warps, num_stages=1, **pdl_options(c))  # nothing for Triton's pipeliner
    return DdsLaunch(_dds_gemv_kernel, (n_out * (tile // config.sub),), args, kwargs, bias, None, _module_launch)


def _module_launch(*args, **kwargs) -> None:
    """This module's ``launch``, looked up at call time (tests replace it)."""
    launch(*args, **kwargs)
