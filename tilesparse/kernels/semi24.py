"""Triton kernels for 2:4 semi-structured sparsity (NVIDIA's pattern: at most 2 nonzeros
in every 4 consecutive elements along the reduction dimension), and their launchers.

* ``prune_24_rows``: per row, keep the 2 largest |w| of each group of 4 columns.
* ``transposable_mask``: per 4x4 tile, a mask that is 2:4 in every row and every column
  (Hubara et al. 2021, "Accelerated Sparse Neural Training"; Hu et al. 2024), so that
  both W and W^T are 2:4 (fprop uses W, bprop uses W^T).
  - ``optimal``: the best of the 90 valid 4x4 patterns by kept |w| (table loaded from
    :mod:`tilesparse.semi24.reference`);
  - ``greedy``: keep the largest entry whose row and column hold < 2, until none is
    left (at most 8 picks). Greedy for a b-matching keeps >= 1/2 of the optimum; a tile
    can end with a row or column of fewer than 2 (still valid 2:4, which means *at most*
    2 of 4).
  - with ``WRITE_VALUES`` the same kernel also writes W*M [N, K] and (W*M)^T [K, N]:
    one pass for the mask and both operands of the training step.
* ``apply_mask_and_transpose``: W*M [N, K] and (W*M)^T [K, N] in one pass.

Selections only, no arithmetic on the outputs: every value written is a copy of an input
or 0, and every comparison is made in fp32 on |x| (exact for fp16/bf16), with NaN as
+inf and ties to the lower index, exactly as the references do, so tests compare kernels
and references with torch.equal. Offsets are int64. Masks are written as uint8 (0/1)
and returned as bool views.

The launchers check nothing beyond what they need; :mod:`tilesparse.semi24` checks user
input.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ._alloc import new_output, poison_enabled
from ._launch import launch
from ._tiles import cdiv


@triton.jit
def _magnitude(x):
    a = tl.abs(x.to(tl.float32))
    return tl.where(a != a, float("inf"), a)  # NaN counts as +inf (as in the reference)


@triton.jit
def _prune_rows_kernel(w_ptr, out_ptr, mask_ptr, n_groups, BLOCK_G: tl.constexpr):
    """Groups g of 4 consecutive elements of a contiguous [N, K] tensor (K % 4 == 0) are
    at offsets 4g .. 4g+3. Element i of a group is kept iff fewer than 2 of the group
    beat it (|w_j| > |w_i|, or equal with j < i): exactly 2 kept per group."""
    g = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    j = tl.arange(0, 4)
    offs = g[:, None] * 4 + j[None, :]  # [BLOCK_G, 4]
    ok = (g < n_groups)[:, None]
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    a = _magnitude(w)
    beaten = tl.zeros((BLOCK_G, 4), dtype=tl.int32)
    for jj in tl.static_range(4):
        # a_jj: column jj of the group, broadcast (a one-nonzero sum is exact)
        a_jj = tl.sum(tl.where(j[None, :] == jj, a, 0.0), axis=1)[:, None]
        beats = (a_jj > a) | ((a_jj == a) & (jj < j[None, :]))
        beaten += beats.to(tl.int32)
    keep = beaten < 2
    tl.store(out_ptr + offs, tl.where(keep, w, tl.zeros_like(w)), mask=ok)
    tl.store(mask_ptr + offs, keep.to(tl.uint8), mask=ok)


@triton.jit
def _tile_offsets(t0, n_tiles, tiles_per_row, N, K, BLOCK_T: tl.constexpr):
    """Offsets of BLOCK_T 4x4 tiles (row-major over the tile grid) in [N, K] and in the
    transposed [K, N], both contiguous: ([BLOCK_T, 4, 4] each, and the valid-tile mask)."""
    t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
    i = tl.arange(0, 4)
    rows = (t // tiles_per_row * 4)[:, None, None] + i[None, :, None]  # [T, 4, 1]
    cols = (t % tiles_per_row * 4)[:, None, None] + i[None, None, :]  # [T, 1, 4]
    ok = (t < n_tiles)[:, None, None]
    return rows * K + cols, cols * N + rows, ok


@triton.jit
def _transposable_kernel(
    w_ptr, mask_ptr, out_ptr, out_t_ptr, rows_table_ptr, bits_table_ptr,
    N, K, n_tiles, tiles_per_row,
    BLOCK_T: tl.constexpr, GREEDY: tl.constexpr, WRITE_VALUES: tl.constexpr,
):
    """Mask (uint8 [N, K]) of BLOCK_T 4x4 tiles, 2:4 along rows and columns; with
    WRITE_VALUES also W*M [N, K] and (W*M)^T [K, N].

    Optimal: pair[t, i, c] = |w[i, c0]| + |w[i, c1]| for the 6 row choices c = (c0 < c1);
    pattern p with row choices r (rows_table [90, 4] int32) scores
    ((pair[0, r0] + pair[1, r1]) + pair[2, r2]) + pair[3, r3] in fp32; the first best
    pattern wins and its 16 bits (bits_table [90] int32, bit 4i + j) form the mask.
    Sums with a single nonzero term (where + sum) extract elements exactly, so the
    scores equal the reference's bit for bit."""
    t0 = tl.program_id(0).to(tl.int64) * BLOCK_T
    offs, offs_t, ok = _tile_offsets(t0, n_tiles, tiles_per_row, N, K, BLOCK_T)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    a = _magnitude(w)  # [T, 4, 4]
    ii = tl.arange(0, 4)
    lin = ii[:, None] * 4 + ii[None, :]  # [4, 4]: 4 * row + column
    if GREEDY:
        kept = tl.zeros((BLOCK_T, 4, 4), dtype=tl.int32)
        for _ in tl.static_range(8):
            row_ok = tl.sum(kept, axis=2)[:, :, None] < 2
            col_ok = tl.sum(kept, axis=1)[:, None, :] < 2
            eligible = row_ok & col_ok & (kept == 0)
            cand = tl.where(eligible, a, -1.0)
            best = tl.max(tl.max(cand, axis=2), axis=1)[:, None, None]
            hit = eligible & (cand == best)
            first = tl.min(tl.min(tl.where(hit, lin[None, :, :], 16), axis=2), axis=1)[:, None, None]
            kept = tl.where(lin[None, :, :] == first, 1, kept)  # first == 16: nothing eligible
        keep = kept != 0
    else:
        cc = tl.arange(0, 8)  # 6 row choices, padded to a power of two
        pair = tl.zeros((BLOCK_T, 4, 8), dtype=tl.float32)
        for c in tl.static_range(6):
            # ROW_CHOICES[c] = (c0, c1): (0,1) (0,2) (0,3) (1,2) (1,3) (2,3), in constexpr arithmetic
            c0 = (c >= 3) + (c >= 5)
            c1 = c + 1 - 2 * (c >= 3) - (c >= 5)
            s = tl.sum(tl.where((ii == c0)[None, None, :], a, 0.0), axis=2) + \
                tl.sum(tl.where((ii == c1)[None, None, :], a, 0.0), axis=2)  # [T, 4]
            pair = tl.where((cc == c)[None, None, :], s[:, :, None], pair)
        best_score = tl.full((BLOCK_T,), -1.0, dtype=tl.float32)
        best_p = tl.zeros((BLOCK_T,), dtype=tl.int32)
        for p in range(90):
            r = tl.load(rows_table_ptr + p * 4 + ii)  # [4]
            picked = tl.sum(tl.where((cc[None, :] == r[:, None])[None, :, :], pair, 0.0), axis=2)  # [T, 4]
            p0 = tl.sum(tl.where((ii == 0)[None, :], picked, 0.0), axis=1)
            p1 = tl.sum(tl.where((ii == 1)[None, :], picked, 0.0), axis=1)
            p2 = tl.sum(tl.where((ii == 2)[None, :], picked, 0.0), axis=1)
            p3 = tl.sum(tl.where((ii == 3)[None, :], picked, 0.0), axis=1)
            score = ((p0 + p1) + p2) + p3
            better = score > best_score  # strict: the lowest pattern index wins ties
            best_score = tl.where(better, score, best_score)
            best_p = tl.where(better, p, best_p)
        bits = tl.load(bits_table_ptr + best_p)  # [T]
        keep = ((bits[:, None, None] >> lin[None, :, :]) & 1) != 0
    tl.store(mask_ptr + offs, keep.to(tl.uint8), mask=ok)
    if WRITE_VALUES:
        v = tl.where(keep, w, tl.zeros_like(w))
        tl.store(out_ptr + offs, v, mask=ok)
        tl.store(out_t_ptr + offs_t, v, mask=ok)


@triton.jit
def _apply_transpose_kernel(
    w_ptr, mask_ptr, out_ptr, out_t_ptr, N, K,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[n, k] = w[n, k] if mask[n, k] else 0, and out_t[k, n] = out[n, k]; all
    contiguous, mask uint8. The transposed tile is stored through tl.trans so its
    stores run along N."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    offs = rows[:, None] * K + cols[None, :]
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    m = tl.load(mask_ptr + offs, mask=ok, other=0)
    v = tl.where(m != 0, w, tl.zeros_like(w))
    tl.store(out_ptr + offs, v, mask=ok)
    offs_t = cols[:, None] * N + rows[None, :]
    ok_t = (cols < K)[:, None] & (rows < N)[None, :]
    tl.store(out_t_ptr + offs_t, tl.trans(v), mask=ok_t)


# --------------------------------------------------------------------------- launchers


def _new_mask(n: int, k: int, device) -> torch.Tensor:
    """A uint8 mask buffer; poisoned with 255 (neither 0 nor 1) when TILESPARSE_POISON=1."""
    out = torch.empty(n, k, dtype=torch.uint8, device=device)
    if poison_enabled() and out.numel():
        out.fill_(255)
    return out


def _default_block_t() -> int:
    """Tiles per program: 64 on the GPU (the optimal kernel's pair scores are
    [64, 4, 8] fp32 per program); 512 under the interpreter, whose cost is per program
    and per loop step, not per element."""
    return 512 if os.environ.get("TRITON_INTERPRET") == "1" else 64


@functools.lru_cache(maxsize=16)
def _tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    from ..semi24.reference import pattern_bits_table, pattern_rows_table

    return pattern_rows_table().to(device), pattern_bits_table().to(device)


def prune_24_rows(w: torch.Tensor, block_g: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(W * M, M) with M keeping the 2 largest |w| of every 4 along rows; w [N, K],
    K % 4 == 0. Returns a contiguous tensor and a bool mask (a view of uint8)."""
    w = w.contiguous()
    n, k = w.shape
    out = new_output(n, k, dtype=w.dtype, device=w.device)
    mask = _new_mask(n, k, w.device)
    n_groups = n * k // 4
    if n_groups:
        launch(_prune_rows_kernel, (cdiv(n_groups, block_g),), w, out, mask, n_groups, BLOCK_G=block_g)
    return out, mask.view(torch.bool)


def _launch_transposable(w, greedy, write_values, block_t):
    block_t = block_t or _default_block_t()
    w = w.contiguous()
    n, k = w.shape
    mask = _new_mask(n, k, w.device)
    if write_values:
        out = new_output(n, k, dtype=w.dtype, device=w.device)
        out_t = new_output(k, n, dtype=w.dtype, device=w.device)
    else:
        out = out_t = w  # unused (WRITE_VALUES is False)
    n_tiles = (n // 4) * (k // 4)
    if n_tiles:
        rows_table, bits_table = _tables(w.device)
        launch(
            _transposable_kernel, (cdiv(n_tiles, block_t),), w, mask, out, out_t, rows_table, bits_table,
            n, k, n_tiles, k // 4,
            BLOCK_T=block_t, GREEDY=greedy, WRITE_VALUES=write_values,
        )
    return mask.view(torch.bool), out, out_t


def transposable_mask(w: torch.Tensor, method: str = "optimal", block_t: int | None = None) -> torch.Tensor:
    """Bool mask [N, K], 2:4 along the rows and columns of every 4x4 tile."""
    return _launch_transposable(w, method == "greedy", False, block_t)[0]


def transposable_prune(
    w: torch.Tensor, method: str = "optimal", block_t: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused: (W * M [N, K], (W * M)^T [K, N], M) with M the transposable mask."""
    mask, out, out_t = _launch_transposable(w, method == "greedy", True, block_t)
    return out, out_t, mask


def apply_mask_and_transpose(
    w: torch.Tensor, mask: torch.Tensor, block_n: int = 64, block_k: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W * M [N, K], (W * M)^T [K, N]), both contiguous, in one pass."""
    w = w.contiguous()
    mask = mask.contiguous().view(torch.uint8)
    n, k = w.shape
    out = new_output(n, k, dtype=w.dtype, device=w.device)
    out_t = new_output(k, n, dtype=w.dtype, device=w.device)
    if out.numel():
        launch(_apply_transpose_kernel, (cdiv(n, block_n), cdiv(k, block_k)),
               w, mask, out, out_t, n, k, BLOCK_N=block_n, BLOCK_K=block_k)
    return out, out_t
