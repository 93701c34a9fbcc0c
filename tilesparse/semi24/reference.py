"""Pure-PyTorch references for the 2:4 kernels of :mod:`tilesparse.kernels.semi24`.

Every reference makes the same selections as its kernel, bit for bit: magnitudes are
compared in fp32 (|x| of an fp16/bf16 value is exact in fp32), NaN counts as +inf, ties
go to the lower index, and the optimal transposable mask scores each of the 90 patterns
with the same fp32 additions in the same order as the kernel
(``((rowpair0 + rowpair1) + rowpair2) + rowpair3``, each row pair ``|a| + |b|`` with the
lower column first), so tests can demand exact equality.
"""

from __future__ import annotations

import itertools

import torch

# The 6 ways to keep 2 of 4, in lexicographic order: ROW_CHOICES[c] = (lower, upper) column.
ROW_CHOICES: tuple[tuple[int, int], ...] = tuple(itertools.combinations(range(4), 2))


def _enumerate_patterns() -> tuple[tuple[int, int, int, int], ...]:
    """The 90 transposable 4x4 patterns as row-choice quadruples (r0, r1, r2, r3), in
    lexicographic order: row i keeps columns ROW_CHOICES[r_i], every column keeps 2."""
    out = []
    for rows in itertools.product(range(6), repeat=4):
        counts = [0, 0, 0, 0]
        for r in rows:
            for c in ROW_CHOICES[r]:
                counts[c] += 1
        if counts == [2, 2, 2, 2]:
            out.append(rows)
    return tuple(out)


PATTERN_ROWS: tuple[tuple[int, int, int, int], ...] = _enumerate_patterns()
assert len(PATTERN_ROWS) == 90


def pattern_masks() -> torch.Tensor:
    """The 90 patterns as a bool tensor [90, 4, 4] (pattern p, row i, column j)."""
    masks = torch.zeros(len(PATTERN_ROWS), 4, 4, dtype=torch.bool)
    for p, rows in enumerate(PATTERN_ROWS):
        for i, r in enumerate(rows):
            masks[p, i, list(ROW_CHOICES[r])] = True
    return masks


def pattern_rows_table() -> torch.Tensor:
    """[90, 4] int32: the row choice of each row of each pattern (what the kernel loads)."""
    return torch.tensor(PATTERN_ROWS, dtype=torch.int32)


def pattern_bits_table() -> torch.Tensor:
    """[90] int32: pattern p's mask as 16 bits, bit 4*i + j for row i, column j."""
    weights = (1 << torch.arange(16, dtype=torch.int64)).view(4, 4)
    return (pattern_masks().long() * weights).sum((1, 2)).to(torch.int32)


def magnitude(w: torch.Tensor) -> torch.Tensor:
    """|w| in fp32 with NaN as +inf (what the kernels compare)."""
    a = w.float().abs()
    return torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)


def prune_24_rows_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the 2 largest-|w| entries of every 4 consecutive ones along each row.

    Entry i of a group is kept iff fewer than 2 entries j beat it, where j beats i when
    |w_j| > |w_i|, or |w_j| == |w_i| and j < i. Returns (w * mask, mask), mask bool."""
    n, k = w.shape
    a = magnitude(w).view(n, k // 4, 4)
    idx = torch.arange(4, device=w.device)
    beats = (a[..., None, :] > a[..., :, None]) | (
        (a[..., None, :] == a[..., :, None]) & (idx[None, :] < idx[:, None])
    )  # [..., i, j]: j beats i
    mask = (beats.sum(-1) < 2).view(n, k)
    return torch.where(mask, w, torch.zeros_like(w)), mask


def _tiles(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/4 * K/4, 4, 4] tiles, row-major over the tile grid."""
    n, k = w.shape
    return w.reshape(n // 4, 4, k // 4, 4).permute(0, 2, 1, 3).reshape(-1, 4, 4)


def _untile(t: torch.Tensor, n: int, k: int) -> torch.Tensor:
    return t.reshape(n // 4, k // 4, 4, 4).permute(0, 2, 1, 3).reshape(n, k)


def transposable_mask_reference(w: torch.Tensor, method: str = "optimal", chunk: int = 1 << 16) -> torch.Tensor:
    """A mask [N, K] that is 2:4 along rows and columns in every 4x4 tile.

    ``optimal``: the pattern of the 90 with the largest kept magnitude (fp32 sums in the
    kernel's order), lowest pattern index on ties. ``greedy``: repeatedly keep the
    largest entry whose row and column hold fewer than 2 kept (lowest index on ties),
    until none is left; at most 2 per row and column, possibly fewer (see the kernel)."""
    n, k = w.shape
    tiles = magnitude(_tiles(w))  # [T, 4, 4]
    if method == "optimal":
        choices = torch.tensor(ROW_CHOICES, device=w.device)
        rows = pattern_rows_table().to(w.device).long()  # [90, 4]
        bits = pattern_masks().to(w.device)
        out = []
        for start in range(0, tiles.shape[0], chunk):
            t = tiles[start:start + chunk]
            pair = t[:, :, choices[:, 0]] + t[:, :, choices[:, 1]]  # [T, 4, 6]
            score = pair[:, 0, rows[:, 0]] + pair[:, 1, rows[:, 1]]
            score = score + pair[:, 2, rows[:, 2]]
            score = score + pair[:, 3, rows[:, 3]]  # [T, 90]
            out.append(bits[torch.argmax(score, dim=1)])  # argmax: the first maximum
        kept = torch.cat(out) if out else tiles.new_zeros(0, 4, 4, dtype=torch.bool)
    elif method == "greedy":
        kept = _greedy_tiles(tiles)
    else:
        raise ValueError(f"method must be 'optimal' or 'greedy', got {method!r}")
    return _untile(kept, n, k)


def _greedy_tiles(a: torch.Tensor) -> torch.Tensor:
    t = a.shape[0]
    flat = a.reshape(t, 16)
    kept = torch.zeros(t, 4, 4, dtype=torch.bool, device=a.device)
    lin = torch.arange(16, device=a.device)
    for _ in range(8):
        row_ok = kept.sum(2, keepdim=True) < 2
        col_ok = kept.sum(1, keepdim=True) < 2
        eligible = (row_ok & col_ok & ~kept).reshape(t, 16)
        best = torch.where(eligible, flat, torch.full_like(flat, -1.0)).amax(1, keepdim=True)
        hit = eligible & (flat == best)
        first = torch.where(hit, lin, torch.full_like(lin, 16)).amin(1)  # lowest index on ties
        take = first < 16
        pick = torch.zeros(t, 16, dtype=torch.bool, device=a.device)
        pick[take, first[take]] = True
        kept |= pick.view(t, 4, 4)
    return kept


def apply_mask_and_transpose_reference(w: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W * mask, (W * mask)^T contiguous); masked-out entries are exactly 0 (even for
    non-finite W)."""
    out = torch.where(mask, w, torch.zeros_like(w))
    return out, out.t().contiguous()


def is_24(mask: torch.Tensor, transposable: bool = False) -> bool:
    """Whether ``mask`` [N, K] keeps at most 2 of every 4 consecutive entries of each row
    (and, if ``transposable``, of each column within each 4x4 tile)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a 2-D tensor [N, K], got "
                         + (f"shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__))
    n, k = mask.shape
    if k % 4 or (transposable and n % 4):
        return False
    ok = bool((mask.reshape(n, k // 4, 4).sum(-1) <= 2).all())
    if transposable:
        ok = ok and bool((mask.t().reshape(k, n // 4, 4).sum(-1) <= 2).all())
    return ok


def semi24_linear_reference(x, weight, mask, bias=None):
    """Y = X (W * M)^T + b, the dense masked product."""
    return torch.nn.functional.linear(x, torch.where(mask, weight, torch.zeros_like(weight)), bias)
