"""Block-sparse linear layers measured slower than dense: say so, and run them as dense.

Small blocks at high density lose to cuBLAS: on the H200 the eager training step
(fprop + bprop + updat) at b 16, density 0.1 ran at 0.65-0.79x of dense's speed and at
b 32, density 0.5 at 0.44-0.57x (``bench/results/2026-11-30-nvidia-h200-large-all-blocks-
6d479c1.csv``, bf16, M 8192 and 16384, four weight shapes). There
:func:`tilesparse.ops.block_sparse_linear` warns once per configuration and runs such calls
as dense (:class:`_DenseLinear`: the blocks scattered into a dense weight for the matmul,
saved as blocks and scattered again in the backward, the blocks' gradient gathered from the
dense one; the dense weight lives only for the matmul; the copies are Triton kernels that
pass over the dense bytes once, :mod:`tilesparse.kernels.block_scatter`, written after the
timings below, which used PyTorch indexing). ``TILESPARSE_DENSE_DISPATCH=0``
keeps the kernels there (still warning). Timed on the H200 (twelfth session,
``scripts/probes/dense_dispatch_ab.py``, 8192x4096², bf16, eager): b 16 at density 0.25
forward 0.96 -> 0.39 ms and training step 3.81 -> 1.21 ms; at 0.5 1.34 -> 0.43 and
6.44 -> 1.32 ms; b 32 at 0.5 0.56 -> 0.42 and 2.07 -> 1.31 ms.

Where it is known: the GPUs in ``SPEEDUPS`` (by name), bf16 (the suite's dtype; fp16 is
taken as bf16, which it tracked at b 64 and 128), at least ``MIN_ROWS`` rows: the suite's
smallest M. At most ``SMALL_ROWS`` (512) rows the small suite's measurements
(:mod:`tilesparse.ops.small_speedups`, W 12288²) decide for weights of at least a quarter
of that size (``SMALL_MIN_WEIGHT``), and such calls only warn: as
dense, each call would scatter the whole weight, more traffic than the product itself
(at density 0.5, b 16 measured 0.25-1.17x of dense and b 32 0.61-0.69x at 128-512 rows;
b 64 / 128 are faster than dense there). Timed directly at 128-512 rows
(``scripts/probes/dense_dispatch_ab.py --ms``, ``...-dense-dispatch-small-ca2277b.json``),
the dense path's forward took 0.28-0.75 ms against the kernels' 0.07-0.97 ms: faster only
for b 16 at 512 rows and density >= 0.25 (0.74 against 0.97 ms at 0.5).
513-8191 rows were not timed: nothing is claimed there. The crossover density of
each block size is where the measured speedup (the geometric mean over the four shapes),
interpolated linearly in log speedup against log density between the densities timed,
crosses 1; above the largest density timed (0.5) the speedup is taken as the rate at 0.5
(speedup x density) over the density, an extrapolation. Not under
``torch.use_deterministic_algorithms`` (cuBLAS needs its own workspace setting there)
nor inside ``torch.compile`` (the device-name lookup would break a full graph): there the
kernels run. The dense path's results differ from the kernels' in the last bits.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import warnings

import torch

from ..kernels import block_scatter
from ..kernels.tuned import gpu_slug
from .small_speedups import SMALL_SPEEDUPS, WEIGHT

__all__ = ["MIN_ROWS", "SMALL_MIN_WEIGHT", "SMALL_ROWS", "SPEEDUPS", "crossover_density", "speedup_estimate",
           "measured_speedup", "run_dense", "kernels_only", "scatter_dense", "gather_blocks", "dense_linear"]

MIN_ROWS = 8192
SMALL_ROWS = 512  # at most this many rows: the small suite's measurements (warned, never dispatched)
# ... for weights of at least a quarter of the measured one's elements (smaller ones, down to
# L2-resident and launch-bound sizes, were not measured the same way)
SMALL_MIN_WEIGHT = math.prod(map(int, WEIGHT.split("x"))) // 4

# GPU -> op -> block size -> ((density, speedup over dense), ...): the geometric mean over the
# suite's four shapes (8192x4096², 16384x8192², W [11008, 4096] and its transpose) of the eager
# speedup, bf16; at each point the larger of two runs of the suite on the H200:
# bench/results/2026-11-30-nvidia-h200-large-all-blocks-6d479c1.csv (b 128 from ...-large.csv
# at d7adee3) and ...-large.csv at 0be56bf (the balanced warp-specialized kernel at b 128).
# The lent machines' hosts differ (eager rows of the 4096² shape are host-bound on slow
# ones); the larger of the two is the kernels' speed with the least host in the way.
SPEEDUPS = {
    "nvidia-h200": {
        "step": {
            16: ((0.05, 1.401), (0.1, 0.727), (0.25, 0.290), (0.5, 0.168)),
            32: ((0.05, 3.644), (0.1, 2.218), (0.25, 1.023), (0.5, 0.512)),
            64: ((0.05, 4.163), (0.1, 3.691), (0.25, 1.958), (0.5, 1.127)),
            128: ((0.05, 4.002), (0.1, 3.708), (0.25, 2.963), (0.5, 1.725)),
        },
        "fprop": {
            16: ((0.05, 1.903), (0.1, 1.021), (0.25, 0.423), (0.5, 0.280)),
            32: ((0.05, 5.404), (0.1, 3.129), (0.25, 1.352), (0.5, 0.706)),
            64: ((0.05, 7.725), (0.1, 4.958), (0.25, 2.449), (0.5, 1.305)),
            128: ((0.05, 8.549), (0.1, 6.873), (0.25, 3.376), (0.5, 1.847)),
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


_OFF = frozenset(("0", "off", "false", "no"))
_KERNELS_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("tilesparse_kernels_only", default=False)


def enabled() -> bool:
    """Whether measured-slower calls run as dense: unless ``TILESPARSE_DENSE_DISPATCH`` is
    0 / off / false / no, outside :func:`kernels_only`."""
    setting = os.environ.get("TILESPARSE_DENSE_DISPATCH", "1").strip().lower()
    return not _KERNELS_ONLY.get() and setting not in _OFF


@contextlib.contextmanager
def kernels_only():
    """Within it (this thread / task), block-sparse layers run their kernels whatever the
    measurements say, and do not warn: the benchmarks time the kernels."""
    token = _KERNELS_ONLY.set(True)
    try:
        yield
    finally:
        _KERNELS_ONLY.reset(token)


@functools.lru_cache(maxsize=None)
def _gpu(index: int) -> str:
    return gpu_slug(torch.cuda.get_device_name(index))


@functools.lru_cache(maxsize=4096)  # every call of a layer asks: 7 µs of interpolation per call on a fast host
def measured_speedup(gpu: str, dtype: torch.dtype, rows: int, block_size: int, density: float,
                     training: bool, weight_elements: int | None = None) -> float | None:
    """The block-sparse layer's speedup over dense for this call as measured on ``gpu`` (a
    name slug, e.g. "nvidia-h200"), or None where it was not measured (other GPUs and
    dtypes, 513 to MIN_ROWS - 1 rows). At most SMALL_ROWS rows: the small suite's fprop
    (training: the lower of fprop and bprop) for weights of at least SMALL_MIN_WEIGHT
    elements (``weight_elements``; None: not known, no claim); between two measured row
    counts, the lower of the two (the measurements are not monotonic in M)."""
    if dtype not in (torch.float16, torch.bfloat16) or SMALL_ROWS < rows < MIN_ROWS or rows < 1:
        return None
    if rows <= SMALL_ROWS:
        if weight_elements is None or weight_elements < SMALL_MIN_WEIGHT:
            return None
        estimates = []
        for op in ("fprop", "bprop") if training else ("fprop",):
            by_m = SMALL_SPEEDUPS.get(gpu, {}).get(op, {}).get(block_size)
            if not by_m:
                return None
            above = min((m for m in by_m if m >= rows), default=None)
            below = max((m for m in by_m if m <= rows), default=None)
            estimates += [speedup_estimate(by_m[m], density) for m in {above, below} if m is not None]
        return min(estimates)
    points = SPEEDUPS.get(gpu, {}).get("step" if training else "fprop", {}).get(block_size)
    return None if points is None else speedup_estimate(points, density)


def run_dense(x: torch.Tensor, block_size: int, density: float, training: bool,
              weight_shape: tuple[int, int] | None = None) -> bool:
    """Whether this call of a block-sparse linear layer (W [N, K] = ``weight_shape``)
    should run as dense: it was measured slower than dense on this GPU (see the module
    docstring for where that is known) and dense dispatch is on. Warns once per
    configuration where it is slower, whether or not it is dispatched."""
    if torch.compiler.is_compiling() or x.device.type != "cuda" or _KERNELS_ONLY.get():
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    elements = None if weight_shape is None else weight_shape[0] * weight_shape[1]
    return _decide(_gpu(index), x.dtype, x.numel() // max(1, x.shape[-1]), block_size, density, training, elements)


def _decide(gpu: str, dtype: torch.dtype, rows: int, block_size: int, density: float, training: bool,
            weight_elements: int | None = None) -> bool:
    """:func:`run_dense`'s decision for a call on ``gpu`` (a name slug) with ``rows`` rows
    of activations: warn once where measured slower than dense; True (run as dense) only
    at MIN_ROWS rows or more, with dense dispatch on and outside deterministic mode."""
    speedup = measured_speedup(gpu, dtype, rows, block_size, density, training, weight_elements)
    if speedup is None or speedup >= 1.0:
        return False
    small = rows <= SMALL_ROWS
    dispatch = enabled() and not torch.are_deterministic_algorithms_enabled() and not small
    what = ("forward and backward products" if small else "training step") if training else "forward"
    if small:
        what += f" near {rows} rows"
    _warn_once(block_size, round(density, 3), what, round(speedup, 2), dispatch, small)
    return dispatch


@functools.lru_cache(maxsize=None)
def _warn_once(block_size: int, density: float, what: str, speedup: float, dispatch: bool, small: bool) -> None:
    if small:
        action = "is slower than dense here and runs its kernels (as dense, every call would scatter the weight)"
    elif dispatch:
        action = "runs as dense here"
    else:
        action = "would be faster as dense here (TILESPARSE_DENSE_DISPATCH=0 keeps the kernels)"
    warnings.warn(
        f"tilesparse: a block-sparse linear layer with {block_size}x{block_size} blocks at density {density} "
        f"{action}: its {what} was measured at {speedup:.2f}x of dense's speed on this GPU "
        f"(data and crossovers: tilesparse/ops/dense_dispatch.py, small_speedups.py)", stacklevel=5)


class _ScatterDense(torch.autograd.Function):
    """Blocks -> dense W (kernels/block_scatter.py); its adjoint, the gather, is the backward."""

    @staticmethod
    def forward(ctx, values, meta, rows: int, cols: int):
        ctx.save_for_backward(meta)
        ctx.grid = (rows, cols, values.shape[-1])
        return block_scatter.scatter_blocks(values, meta, rows, cols)

    @staticmethod
    def backward(ctx, grad):
        (meta,) = ctx.saved_tensors
        return _GatherBlocks.apply(grad, meta, *ctx.grid), None, None, None


class _GatherBlocks(torch.autograd.Function):
    """Dense -> its stored blocks; the scatter is the backward (so both nest for double backward)."""

    @staticmethod
    def forward(ctx, dense, meta, rows: int, cols: int, b: int):
        ctx.save_for_backward(meta)
        ctx.grid = (rows, cols)
        return block_scatter.gather_blocks(dense, meta, rows, cols, b)

    @staticmethod
    def backward(ctx, grad_values):
        (meta,) = ctx.saved_tensors
        return _ScatterDense.apply(grad_values, meta, *ctx.grid), None, None, None, None


def scatter_dense(values: torch.Tensor, meta: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The dense [rows * b, cols * b] matrix of blocks ``values`` [nnz, b, b] on the packed
    tables ``meta`` (storage order): every dense element written once, a block or zeros
    (a Triton kernel on CUDA, PyTorch indexing elsewhere); differentiable."""
    return _ScatterDense.apply(values, meta, rows, cols)


def gather_blocks(dense: torch.Tensor, meta: torch.Tensor, rows: int, cols: int, b: int) -> torch.Tensor:
    """The stored blocks [nnz, b, b] of a dense [rows * b, cols * b] matrix; differentiable."""
    return _GatherBlocks.apply(dense, meta, rows, cols, b)


class _DenseLinear(torch.autograd.Function):
    """Y = X W^T + bias through cuBLAS with W scattered from its blocks for the call. Saves
    the blocks, not the dense W (which would stay alive until the backward): the backward
    scatters it again for dX and gathers the blocks' gradient from the dense dW."""

    @staticmethod
    def forward(ctx, x, values, bias, meta, rows: int, cols: int):
        ctx.save_for_backward(x, values, meta)
        ctx.grid = (rows, cols)
        ctx.has_bias = bias is not None
        return torch.nn.functional.linear(x, scatter_dense(values, meta, rows, cols), bias)

    @staticmethod
    def backward(ctx, grad):  # differentiable ops only: double backward works, as on the kernels' path
        x, values, meta = ctx.saved_tensors
        rows, cols = ctx.grid
        grad_x = grad_values = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ scatter_dense(values, meta, rows, cols)
        if ctx.needs_input_grad[1]:
            grad_values = gather_blocks(grad.t() @ x, meta, rows, cols, values.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_values, grad_bias, None, None, None


def dense_linear(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                 rows: int, cols: int) -> torch.Tensor:
    """The layer as dense, for a 2-D ``x`` (see :class:`_DenseLinear`)."""
    return _DenseLinear.apply(x, values, bias, meta, rows, cols)
