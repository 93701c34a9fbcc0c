"""Where a block-sparse linear layer would be slower than dense, run it as dense, and say so.

Small blocks at high density lose to cuBLAS: on the H200 the eager training step
(fprop + bprop + updat) at b 16, density 0.1 ran at 0.65-0.79x of dense's speed and at
b 32, density 0.5 at 0.44-0.57x (``bench/results/2026-11-30-nvidia-h200-large-all-blocks-
6d479c1.csv``, bf16, M 8192 and 16384, four weight shapes). There
:func:`tilesparse.ops.block_sparse_linear` scatters the blocks into a dense weight for the
call (``BlockLayout.to_dense``: a transient [out, in] tensor, freed after the call, and
differentiable: the gradient of the blocks is gathered from the dense one) and calls
``F.linear``, and warns once per (block size, density) so that users know.

Only where it was measured: the GPUs in ``SPEEDUPS`` (by name), fp16 / bf16 (the suite
timed bf16; fp16 tracked it), at least ``MIN_ROWS`` rows (the suite's smallest M; the
small-batch kernel, which streams the weight, was faster than dense at every density up to
0.5 it was timed at). The crossover density of each block size is where the measured
speedup, interpolated linearly in log speedup against log density between the densities
timed, crosses 1; above the largest density timed (0.5) the speedup is taken as the rate at
0.5 (speedup x density, dense's rate share) over the density. ``TILESPARSE_DENSE_DISPATCH=0``
or :func:`kernels_only` turn it off; code compiled by ``torch.compile`` runs the kernels.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import warnings

import torch

from ..kernels.tuned import gpu_slug

__all__ = ["MIN_ROWS", "SPEEDUPS", "crossover_density", "speedup_estimate", "measured_speedup", "dense_is_faster",
           "kernels_only"]

MIN_ROWS = 8192

# GPU -> op -> block size -> ((density, speedup over dense), ...): the geometric mean over the
# suite's four shapes (8192x4096², 16384x8192², W [11008, 4096] and its transpose) of the eager
# speedup in bench/results/2026-11-30-nvidia-h200-large-all-blocks-6d479c1.csv (bf16, the
# Triton kernels); b 128 from ...-large.csv at d7adee3 (the warp-specialized kernel; b 64 now
# runs it too, and its 6d479c1 speedups are kept as a floor).
SPEEDUPS = {
    "nvidia-h200": {
        "step": {
            16: ((0.05, 1.401), (0.1, 0.727), (0.25, 0.290), (0.5, 0.168)),
            32: ((0.05, 3.644), (0.1, 2.218), (0.25, 1.023), (0.5, 0.512)),
            64: ((0.05, 4.163), (0.1, 3.691), (0.25, 1.958), (0.5, 1.071)),
            128: ((0.05, 4.002), (0.1, 3.708), (0.25, 2.963), (0.5, 1.725)),
        },
        "fprop": {
            16: ((0.05, 1.903), (0.1, 1.021), (0.25, 0.423), (0.5, 0.280)),
            32: ((0.05, 5.404), (0.1, 3.129), (0.25, 1.352), (0.5, 0.706)),
            64: ((0.05, 7.725), (0.1, 4.938), (0.25, 2.153), (0.5, 1.123)),
            128: ((0.05, 8.549), (0.1, 6.873), (0.25, 3.270), (0.5, 1.775)),
        },
    },
}


def speedup_estimate(points: tuple, density: float) -> float:
    """Block-sparse over dense at ``density`` from measured (density, speedup) points:
    log-log interpolation inside their range; below it the lowest point's speedup (sparse
    only gets faster with fewer blocks); above it the largest density's rate (speedup x
    density) over ``density``."""
    if density <= points[0][0]:
        return points[0][1]
    last_d, last_s = points[-1]
    if density >= last_d:
        return last_s * last_d / density
    for (d0, s0), (d1, s1) in zip(points, points[1:]):
        if d0 <= density <= d1:
            t = (math.log(density) - math.log(d0)) / (math.log(d1) - math.log(d0))
            return math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0)))
    raise AssertionError("unreachable: points are sorted by density")


def crossover_density(points: tuple) -> float:
    """The density above which dense is faster (speedup < 1), or 1.0 if it never is up to
    a full layout."""
    lo, hi = points[0][0], 1.0
    if speedup_estimate(points, hi) >= 1.0:
        return 1.0
    for _ in range(60):  # bisection: the estimate falls with density
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if speedup_estimate(points, mid) >= 1.0 else (lo, mid)
    return hi


_FORCED: list = []  # kernels_only() nesting: while non-empty, never dispatch


def enabled() -> bool:
    return not _FORCED and os.environ.get("TILESPARSE_DENSE_DISPATCH", "1") != "0"


@contextlib.contextmanager
def kernels_only():
    """Within it, block-sparse layers run their kernels whatever the measurements say (the
    benchmarks time the kernels)."""
    _FORCED.append(True)
    try:
        yield
    finally:
        _FORCED.pop()


@functools.lru_cache(maxsize=None)
def _gpu(index: int) -> str:
    return gpu_slug(torch.cuda.get_device_name(index))


def measured_speedup(gpu: str, dtype: torch.dtype, rows: int, block_size: int, density: float,
                     training: bool) -> float | None:
    """The block-sparse layer's speedup over dense for this call as measured on ``gpu`` (a
    name slug, e.g. "nvidia-h200"), or None where it was not measured (other GPUs and
    dtypes, fewer than MIN_ROWS rows)."""
    if dtype not in (torch.float16, torch.bfloat16) or rows < MIN_ROWS:
        return None
    points = SPEEDUPS.get(gpu, {}).get("step" if training else "fprop", {}).get(block_size)
    return None if points is None else speedup_estimate(points, density)


def dense_is_faster(x: torch.Tensor, block_size: int, density: float, training: bool) -> bool:
    """Whether this call of a block-sparse linear layer is measured slower than dense on
    this GPU (see the module docstring for where that is known); warns once where so.
    Not under ``torch.compile`` (the device-name lookup would break a full graph): compiled
    code runs the kernels."""
    if torch.compiler.is_compiling() or x.device.type != "cuda" or not enabled():
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    rows = x.numel() // max(1, x.shape[-1])
    speedup = measured_speedup(_gpu(index), x.dtype, rows, block_size, density, training)
    if speedup is None or speedup >= 1.0:
        return False
    _warn_once(block_size, round(density, 3), "training step" if training else "forward", round(speedup, 2))
    return True


@functools.lru_cache(maxsize=None)
def _warn_once(block_size: int, density: float, what: str, speedup: float) -> None:
    warnings.warn(
        f"tilesparse: a block-sparse linear layer with {block_size}x{block_size} blocks at density {density} "
        f"runs as dense here: its {what} was measured at {speedup:.2f}x of dense's speed on this GPU "
        f"(crossover and data: tilesparse/ops/dense_dispatch.py; TILESPARSE_DENSE_DISPATCH=0 turns this off)",
        stacklevel=4)
