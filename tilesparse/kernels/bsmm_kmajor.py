"""K-major activations for the small-batch kernel: where transposing the activations first pays.

The small kernel gathers, for each stored block, the activation tile of its b columns (fprop; bprop:
dY's b columns of the block-row). Row-major, that tile is M rows of b elements: at b = 16 in bf16,
M separate 32-byte pieces, one L1 line each, and ncu found the L1/TEX pipe 81 % busy there (fortieth
session). K-major (A^T contiguous), the tile is b rows of M contiguous elements: at M 64, 16 lines of
128 bytes. Measured on the H200 (forty-third session, ``scripts/probes/small_threshold.py`` variants
``autoKmajor`` / ``defaultKmajor``, W 12288², same run, activations already K-major): b 16 fprop at
density 0.1 and M 64 42 -> 22 µs, at 0.25 and M 32 44 -> 35 µs (the small kernel K-major beating the
deep panel); at M 8 K-major loses (7.8 -> 11 µs: 16-byte pieces), at b >= 64 it changes nothing (b
rows are already 128 bytes) and at density 0.5 the deep panels stay faster.

So ``dds`` (config chosen by the dispatcher, CUDA, 16-bit) runs the small kernel on K-major activations
where the table below says the gain outweighs the transposing copy (``transpose.transpose_contiguous``;
on weights at least as large as the one measured), and on activations that are K-major already
(``is_kmajor``: e.g. a transposed view) without a copy.
"""

from __future__ import annotations

import torch

from . import bsmm_small
from ._device import capability_major
from .transpose import transpose_contiguous

__all__ = ["is_kmajor", "as_kmajor", "kmajor_config", "kmajor_wins", "kmajor_pays", "kmajor_inputs_pay",
           "KMAJOR_WINS", "MEASURED_WEIGHT_ELEMENTS"]

# (op, block size) -> {rows: (lowest density, highest density)} where the dispatcher's small kernel on
# K-major activations, the tiled transposing copy included (2.5-4 µs at W 12288²), beat its row-major
# choice on the H200 by more than the noise (same run, W 12288², densities 0.03 / 0.1 / 0.25 / 0.5; the
# bounds sit between them on a log scale). Forty-third session, `...-small-kmajor43b-*-83a180d.json`:
# b 16 fprop at density 0.1 and 64 rows 41.8 -> 26.3 µs, at 0.25 and 16 rows 39.4 -> 34.1; lost at 48
# rows and density 0.25 (55 -> 60: the K-major tiles of 48 rows are slower without the copy too) and
# for b 32 everywhere but density 0.5 at 64 rows (64.8 -> 57.2). Forty-fourth session, with K-major on the
# heuristic's 2-warp config (`...-small-kmajor45-*-3214b77.json`, the tiled copy timed): b 16 gained density
# 0.5 at 16 rows (fprop 59.3 -> 56.2 µs, bprop 59.1 -> 46.1) and bprop 0.5 at 32 rows (65.5 -> 58.4), bprop 0.25
# at 16 / 48 / 64 rows (34.0 -> 27.8, 54.9 -> 49.7, 55.8 -> 44.8); the rest of the table held.
KMAJOR_WINS: dict[tuple[str, int], dict[int, tuple[float, float]]] = {
    ("fprop", 16): {16: (0.055, 0.71), 32: (0.055, 0.35), 48: (0.055, 0.16), 64: (0.016, 0.35)},
    ("bprop", 16): {16: (0.16, 0.71), 32: (0.055, 0.71), 48: (0.055, 0.35), 64: (0.055, 0.35)},
    ("fprop", 32): {64: (0.35, 0.71)},
    ("bprop", 32): {64: (0.35, 0.71)},
}

_DTYPES = (torch.bfloat16, torch.float16)

# The weight the table was measured on. The kernel's gain grows with the stored blocks, the copy's cost
# (2.5-4 µs there, mostly latency) does not: at the closest table point (bprop, density 0.1, 32 rows:
# 22.9 -> 21.8 µs) a weight with fewer blocks would lose. So the copy is made for weights at least this
# large only; activations already K-major need no copy and take the table at any size.
MEASURED_WEIGHT_ELEMENTS = 12288 * 12288


def is_kmajor(a: torch.Tensor) -> bool:
    """Whether the [M, K] activations are stored K-major (A^T contiguous: unit stride along M)."""
    return a.dim() == 2 and a.shape[0] > 1 and a.stride(0) == 1 and a.stride(1) == a.shape[0]


def as_kmajor(a: torch.Tensor) -> torch.Tensor:
    """The [M, K] activations as a K-major view (a tiled transposing copy unless they are already)."""
    return a if is_kmajor(a) else transpose_contiguous(a).t()


def kmajor_wins(op: str, block_size: int, m: int, density: float) -> bool:
    """Whether KMAJOR_WINS holds (op, block size, rows, density): the measured rows (16, 32, 48,
    64; K-major tiles of 16-byte vectors) only."""
    low, high = KMAJOR_WINS.get((op, block_size), {}).get(m, (1.0, 0.0))
    return low <= density <= high


def kmajor_pays(op: str, a: torch.Tensor, block_size: int, density: float, weight_elements: int) -> bool:
    """Whether ``op`` ('fprop' / 'bprop') on activations ``a`` [M, K] runs faster on the small kernel
    with K-major activations than on the dispatcher's row-major choice: a Hopper GPU (the table was
    measured on the H200; NVIDIA, compute capability 9), 16-bit, ``kmajor_wins``, and either ``a``
    K-major already or a weight (``weight_elements`` = N x K) at least as large as the one measured
    (``MEASURED_WEIGHT_ELEMENTS``), where the gain outweighs the copy."""
    return (a.dim() == 2 and kmajor_inputs_pay(op, a.device, a.dtype, a.shape[0], block_size, density)
            and (is_kmajor(a) or weight_elements >= MEASURED_WEIGHT_ELEMENTS))


def kmajor_inputs_pay(op: str, device: torch.device, dtype: torch.dtype, m: int, block_size: int,
                      density: float) -> bool:
    """Whether ``op`` on ``m`` rows of activations handed over K-major (no copy) runs faster than on
    row-major ones: a Hopper GPU (NVIDIA, compute capability 9), 16-bit, and ``kmajor_wins``. For a
    producer that can write its output transposed as cheaply as not (the LSTM cell's h)."""
    return (device.type == "cuda" and torch.version.hip is None and dtype in _DTYPES
            and kmajor_wins(op, block_size, m, density) and capability_major(device) == 9)


def kmajor_config(m: int, block_size: int, dtype: torch.dtype, smem_bytes: int) -> bsmm_small.SmallConfig:
    """The small kernel's config on K-major activations: the heuristic's, not the tuned table's (whose
    entries were measured on row-major activations). On the H200 (forty-fourth session, W 12288², b 16,
    activations already K-major, same run, ``...-small-kmajor44-b16-40de382.json``) the table's configs
    were no faster than the heuristic's and up to 12 % slower; and the heuristic's 2 warps (16-bit, not
    swapped) beat 4 at all 24 points, by 3-28 % (fprop density 0.1, M 64 22.2 -> 19.3 µs; bprop density
    0.25, M 16 34.4 -> 24.7), 1 warp within 5 % of 2 either way (``...-small-warps44-b16-4d956ce.json``)."""
    return bsmm_small.small_config(m, block_size, dtype, smem_bytes)
