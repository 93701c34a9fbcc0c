"""K-major activations for the small-batch kernel: where transposing the activations first pays.

The small kernel gathers, for each stored block, the activation tile of its b columns (fprop; bprop:
dY's b columns of the block-row). Row-major, that tile is M rows of b elements: at b = 16 in bf16,
M separate 32-byte pieces, one L1 line each, and ncu found the L1/TEX pipe 81 % busy there (fortieth
session). K-major (A^T contiguous), the tile is b rows of M contiguous elements: at M 64, 16 lines of
128 bytes. Measured on the H200 (forty-third session, ``scripts/probes/small_threshold.py`` variants
``autoKmajor`` / ``defaultKmajor``, W 12288², same run): b 16 fprop at density 0.1 and M 64 42 -> 22 µs,
at 0.25 and M 32 44 -> 35 µs (the small kernel K-major beating the deep panel); at M 8 K-major loses
(7.8 -> 11 µs: 16-byte pieces) and at b >= 64 it changes nothing (b rows are already 128 bytes).

So ``dds`` (config chosen by the dispatcher, CUDA, 16-bit) runs the small kernel on K-major activations
where the table below says the gain outweighs the transposing copy (``transpose.transpose_contiguous``),
and on activations that are K-major already (``is_kmajor``: e.g. a transposed view) without a copy.
"""

from __future__ import annotations

import torch

from .transpose import transpose_contiguous

__all__ = ["is_kmajor", "as_kmajor", "kmajor_wins", "kmajor_pays", "KMAJOR_WINS"]

# (op, block size) -> {rows bucket: (lowest density, highest density)} where the small kernel on
# K-major activations, the copy included, beat the dispatcher's row-major choice on the H200. The
# rows bucket is the power of two at or above M (16, 32, 64); density bounds sit between the measured
# densities (0.03, 0.1, 0.25, 0.5) on a log scale. Forty-third session, with PyTorch's transposing
# copy (3.5-6.5 µs, the upper bound of the tiled copy's): `...-small-kmajor43-*.json`.
KMAJOR_WINS: dict[tuple[str, int], dict[int, tuple[float, float]]] = {
    ("fprop", 16): {16: (0.16, 0.35), 32: (0.055, 0.35), 64: (0.055, 0.35)},
    ("bprop", 16): {32: (0.055, 0.35), 64: (0.055, 0.35)},
    ("fprop", 32): {64: (0.16, 0.71)},
    ("bprop", 32): {64: (0.35, 0.71)},
}

_DTYPES = (torch.bfloat16, torch.float16)
_ROW_BUCKETS = (16, 32, 64)


def is_kmajor(a: torch.Tensor) -> bool:
    """Whether the [M, K] activations are stored K-major (A^T contiguous: unit stride along M)."""
    return a.dim() == 2 and a.shape[0] > 1 and a.stride(0) == 1 and a.stride(1) == a.shape[0]


def as_kmajor(a: torch.Tensor) -> torch.Tensor:
    """The [M, K] activations as a K-major view (a tiled transposing copy unless they are already)."""
    return a if is_kmajor(a) else transpose_contiguous(a).t()


def kmajor_wins(op: str, block_size: int, m: int, density: float) -> bool:
    """Whether KMAJOR_WINS holds (op, block size, rows, density): M a multiple of 16 up to 64
    (K-major tiles of 16-byte vectors; the measured rows)."""
    if m % 16 or not 16 <= m <= 64:
        return False
    bucket = next(rows for rows in _ROW_BUCKETS if rows >= m)
    low, high = KMAJOR_WINS.get((op, block_size), {}).get(bucket, (1.0, 0.0))
    return low <= density <= high


def kmajor_pays(op: str, a: torch.Tensor, block_size: int, density: float) -> bool:
    """Whether ``op`` ('fprop' / 'bprop') on activations ``a`` [M, K] runs faster on the small kernel
    with K-major activations than on the dispatcher's row-major choice: CUDA, 16-bit, ``kmajor_wins``."""
    return (a.is_cuda and a.dtype in _DTYPES and a.dim() == 2
            and kmajor_wins(op, block_size, a.shape[0], density))
