"""Small-batch (memory-bound) variant of dds: few rows of activations, large sparse weight.

With M <= 64 rows (RNN minibatches, decoding) the product moves far more weight bytes
than it does FLOPs, so the kernel's job is to stream every nonzero block from HBM
once, with enough loads in flight to saturate it. The large-batch kernel tiles the
output as [M-tile, whole block-column]: at M = 32 it would run one program per
block-column (96 for W 12288² at b = 128: fewer than the SMs) and waste most of each
128-row tile. Here the product is computed transposed ("swap AB"),

    C^T [n_out*b, M] = op(S) [n_out*b, K] @ A^T [K, M],

so a weight slice is the tile's left operand and M is the narrow side. Each program
owns SUB output features (a slice of one block-row of op(S)) for all M, and walks the
same row/column table as the large kernel. Splitting a block-row into b / SUB slices
gives b / SUB times more programs, each streaming contiguous SUB x b pieces of the
blocks (fprop) or SUB-wide column strips of them (bprop).

Same tables, same results (bitwise deterministic: every output written once, fixed
reduction order) as :mod:`tilesparse.kernels.bsmm`.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._alloc import new_output
from ._tiles import cdiv, check_fits_tile, check_power_of_two, next_power_of_2, tile_for


@triton.jit
def _dds_small_kernel(
    a_ptr, v_ptr, bias_ptr, c_ptr,
    ptr_ptr, idx_ptr, slot_ptr, bin_ptr_ptr, bin_rows_ptr,
    M, split_stride,
    stride_am, stride_ak, stride_cm, stride_cn,
    B: tl.constexpr, TILE_B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
    SPLITS: tl.constexpr, BINNED: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Program (j * SUBS + s, m-tile, split) computes C[m-tile, j*B + s*SUB + (0..SUB)] as
    acc[SUB, BLOCK_M] = sum over entries e of table j: op(V[slot e])[rows s, :] @ A[m, idx e block]^T.

    TRANS_V (fprop): op(V) = V, rows of the stored block are output features.
    not TRANS_V (bprop): op(V) = V^T, columns of the stored block are output features.
    SPLITS > 1: split p takes the p-th of SPLITS equal runs of table j's entries and
    writes its fp32 partial sum (no bias) at c + p * split_stride; the launcher adds the
    partials in a fixed order (deterministic).
    BINNED: program (bin * SUBS + s, m-tile) computes the slices of tables
    bin_rows[bin_ptr[bin]:bin_ptr[bin + 1]] one after another (see :func:`balanced_bins`).
    """
    SUBS: tl.constexpr = TILE_B // SUB
    pid = tl.program_id(0)
    s = pid % SUBS
    offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = s * SUB + tl.arange(0, SUB)  # output features within the block
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    f_ok = offs_f < B
    K_STEPS: tl.constexpr = TILE_B // BLOCK_K
    acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
    if BINNED:  # the bin's tables one after another, each summed and stored as below
        bin_id = pid // SUBS
        for r in range(tl.load(bin_ptr_ptr + bin_id), tl.load(bin_ptr_ptr + bin_id + 1)):
            j = tl.load(bin_rows_ptr + r)
            acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
            for t in range(tl.load(ptr_ptr + j) * K_STEPS, tl.load(ptr_ptr + j + 1) * K_STEPS):
                acc = _small_step(acc, a_ptr, v_ptr, idx_ptr, slot_ptr, t // K_STEPS,
                                  (t % K_STEPS) * BLOCK_K + offs_k, offs_f, f_ok, offs_m, m_ok, stride_am, stride_ak,
                                  B, TRANS_V, HAS_SLOT, INPUT_PRECISION)
            _small_store(acc, c_ptr, bias_ptr, j, offs_f, f_ok, offs_m, m_ok, stride_cm, stride_cn, B, HAS_BIAS,
                         True)
    else:
        j = pid // SUBS
        start = tl.load(ptr_ptr + j)
        end = tl.load(ptr_ptr + j + 1)
        if SPLITS > 1:
            split = tl.program_id(2)
            chunk = (end - start + SPLITS - 1) // SPLITS
            start = tl.minimum(start + split * chunk, end)
            end = tl.minimum(start + chunk, end)
        for t in range(start * K_STEPS, end * K_STEPS):
            acc = _small_step(acc, a_ptr, v_ptr, idx_ptr, slot_ptr, t // K_STEPS,
                              (t % K_STEPS) * BLOCK_K + offs_k, offs_f, f_ok, offs_m, m_ok, stride_am, stride_ak,
                              B, TRANS_V, HAS_SLOT, INPUT_PRECISION)
        if SPLITS > 1:  # fp32 partial sums; bias and rounding after the fixed-order sum
            cols = j.to(tl.int64) * B + offs_f
            c_ptrs = c_ptr + tl.program_id(2).to(tl.int64) * split_stride + offs_m[None, :] * stride_cm \
                + cols[:, None] * stride_cn
            tl.store(c_ptrs, acc, mask=f_ok[:, None] & m_ok[None, :])
        else:
            _small_store(acc, c_ptr, bias_ptr, j, offs_f, f_ok, offs_m, m_ok, stride_cm, stride_cn, B, HAS_BIAS,
                         True)


@triton.jit
def _small_step(acc, a_ptr, v_ptr, idx_ptr, slot_ptr, e, k_in, offs_f, f_ok, offs_m, m_ok, stride_am,
                stride_ak, B: tl.constexpr, TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr,
                INPUT_PRECISION: tl.constexpr):
    """acc += op(V[slot e])[offs_f, k_in] @ A[offs_m, block idx e, k_in]^T."""
    k_ok = k_in < B
    blk = tl.load(idx_ptr + e).to(tl.int64)
    if HAS_SLOT:
        slot = tl.load(slot_ptr + e).to(tl.int64)
    else:
        slot = tl.cast(e, tl.int64)
    v_base = v_ptr + slot * (B * B)
    if TRANS_V:  # feature f, reduction k: V[f, k]
        w = tl.load(v_base + offs_f[:, None] * B + k_in[None, :], mask=f_ok[:, None] & k_ok[None, :], other=0.0)
    else:  # V[k, f]
        w = tl.load(v_base + k_in[None, :] * B + offs_f[:, None], mask=f_ok[:, None] & k_ok[None, :], other=0.0)
    x = tl.load(
        a_ptr + offs_m[None, :] * stride_am + (blk * B + k_in)[:, None] * stride_ak,
        mask=k_ok[:, None] & m_ok[None, :], other=0.0,
    )
    return tl.dot(w, x, acc, input_precision=INPUT_PRECISION)


@triton.jit
def _small_store(acc, c_ptr, bias_ptr, j, offs_f, f_ok, offs_m, m_ok, stride_cm, stride_cn, B: tl.constexpr,
                 HAS_BIAS: tl.constexpr, do_store):
    """C[offs_m, j*B + offs_f] = acc^T (+ bias), rounded to C's dtype; only where ``do_store``."""
    cols = j.to(tl.int64) * B + offs_f
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=f_ok & do_store, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + offs_m[None, :] * stride_cm + cols[:, None] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=f_ok[:, None] & m_ok[None, :] & do_store)


@dataclass(frozen=True)
class SmallConfig:
    """Launch parameters of the small-batch kernel: ``sub`` output features per program,
    ``block_k`` reduction step, ``block_m`` activation rows per program, ``splits``
    programs per output slice (each summing a run of its blocks into an fp32 workspace;
    for few output slices, e.g. bprop of a small recurrent weight)."""

    sub: int
    block_k: int
    block_m: int
    num_warps: int
    num_stages: int
    splits: int = 1
    balance: bool = True  # tables packed into bins of equal work (balanced_bins); splits == 1 only

    def __post_init__(self):
        check_power_of_two(self, "sub", "block_k", "block_m")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.splits < 1:
            raise ValueError(f"SmallConfig needs num_warps in 1..16 (a power of two) and num_stages >= 1, got "
                             f"{self.num_warps!r}, {self.num_stages!r}")


@functools.lru_cache(maxsize=4096)
def small_config(m: int, block_size: int, dtype: torch.dtype, smem_bytes: int = 1 << 30) -> SmallConfig:
    """Heuristic config: slices of 32 features (16 for blocks of 16), reduction steps of
    up to 64, activations padded to a power of two >= 16, and a deep pipeline: the loop
    is a stream of independent loads, and HBM needs many bytes in flight. On the H200
    (W 12288², density 0.5, bf16, M = 1) 8 stages streamed b = 128 at 3.5 TB/s (43 µs)
    against 84 µs with 4 stages; b = 32 54 vs 114 µs
    (bench/results/2026-11-29-nvidia-h200-small-variants.json)."""
    tile = tile_for(block_size)
    sub = min(tile, 32)
    block_k = min(tile, 64 if dtype != torch.float32 else 32)
    block_m = min(64, max(16, next_power_of_2(max(m, 1))))
    # Fewer stages where shared memory is short (8 stages of b = 128 bf16 tiles at M = 64
    # take ~96 KiB: too much beside the compiler's own use on 99 KiB parts).
    per_stage = (sub * block_k + block_k * block_m) * torch.finfo(dtype).bits // 8
    stages = max(2, min(8, (smem_bytes - 16384) // per_stage))
    return SmallConfig(sub, block_k, block_m, num_warps=4, num_stages=stages)


# Binned launches aim for at least this many programs per SM (enough loads in flight)
MIN_PROGRAMS_PER_SM = 2


def balanced_bins(ptr: torch.Tensor, subs: int, min_programs: int):
    """Pack the tables of a CSR/CSC pointer ``ptr`` [T + 1] into bins of about equal
    work, largest first into the least-loaded bin (LPT), so that no program walks a
    table much longer than the average: on a random layout the longest block-row holds
    1.5-2.5x the mean (binomial counts), and the small-batch kernel, one program per
    table slice, waited for it (H200: a balanced layout of the same density streamed
    1.2-1.4x faster; ``scripts/probes/small_balance.py``). Every table stays whole in
    one bin, so each output is written once, summed in table order: results are
    bitwise those of the unbinned kernel.

    Returns (bin_ptr [n_bins + 1], bin_rows [tables]) as int32 on ptr's device: bin i
    holds tables bin_rows[bin_ptr[i]:bin_ptr[i + 1]]; or None where binning would change
    nothing (equal tables, or as many bins as tables). An empty table counts as one
    step (its zeros are stored). Bins number ceil(work / longest table), at least
    ``min_programs / subs``. Reads ptr on the host: a launcher caches the result."""
    counts = (ptr[1:] - ptr[:-1]).to("cpu", torch.int64)
    tables = counts.numel()
    work = counts.clamp(min=1)
    if tables == 0:
        return None
    n_bins = max(cdiv(int(work.sum()), int(work.max())), cdiv(min_programs, subs))
    if n_bins >= tables:
        return None
    members: list[list[int]] = [[] for _ in range(n_bins)]
    heap = [(0, b) for b in range(n_bins)]
    for table in torch.argsort(-work, stable=True).tolist():  # longest first, into the lightest bin
        load, b = heapq.heappop(heap)
        members[b].append(table)
        heapq.heappush(heap, (load + int(work[table]), b))
    bin_ptr = torch.tensor([0] + [len(m) for m in members]).cumsum(0)
    bin_rows = torch.tensor([t for m in members for t in sorted(m)])
    return tuple(t.to(device=ptr.device, dtype=torch.int32) for t in (bin_ptr, bin_rows))


def _bins_for(ptr: torch.Tensor, subs: int):
    """balanced_bins for this table pointer, cached on the tensor object (table views
    are themselves cached per layout, so this runs once per layout and orientation);
    None while a CUDA graph is being captured and nothing is cached (no host sync there)."""
    if ptr.is_cuda:
        sms = torch.cuda.get_device_properties(ptr.device).multi_processor_count
    else:
        sms = 4
    cache = ptr.__dict__.setdefault("_tilesparse_bins", {})
    key = (subs, MIN_PROGRAMS_PER_SM * sms)
    if key not in cache:
        if ptr.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        cache[key] = balanced_bins(ptr, subs, key[1])
    return cache[key]


def launch_dds_small(a, values, c, bias, ptr, idx, slot, n_out, trans_v, precision, config: SmallConfig):
    """C = A @ op(S) (+ bias) for few rows of A; arguments as prepared by bsmm.dds."""
    b = values.shape[-1]
    tile = tile_for(b)
    cfg = config
    check_fits_tile(cfg, tile, "sub", "block_k")
    m = a.shape[0]
    subs = tile // cfg.sub
    bins = _bins_for(ptr, subs) if cfg.splits == 1 and cfg.balance else None
    out = c if cfg.splits == 1 else new_output(cfg.splits, m, c.shape[1], dtype=torch.float32, device=c.device)
    n_programs = (bins[0].numel() - 1) if bins is not None else n_out
    grid = (n_programs * subs, cdiv(m, cfg.block_m), cfg.splits)
    bin_ptr, bin_rows = bins if bins is not None else (ptr, ptr)
    _dds_small_kernel[grid](
        a, values, bias if bias is not None else c, out,
        ptr, idx, slot if slot is not None else ptr, bin_ptr, bin_rows,
        m, out.stride(0) if cfg.splits > 1 else 0,
        a.stride(0), a.stride(1), out.stride(-2), out.stride(-1),
        B=b, TILE_B=tile, SUB=cfg.sub, BLOCK_K=cfg.block_k, BLOCK_M=cfg.block_m, SPLITS=cfg.splits,
        BINNED=bins is not None,
        TRANS_V=trans_v, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.splits > 1:  # fixed-order sum of the partials: deterministic
        total = out.sum(dim=0)
        if bias is not None:
            total += bias.float()
        c.copy_(total)
