"""Block-sparse linear layers measured slower than dense: say so, and run them as dense.

Small blocks at high density lose to cuBLAS: on the H200 the eager training step
(fprop + bprop + updat) at b 16, density 0.25 ran at 0.49-0.56x of dense's speed and at
b 32, density 0.5 at 0.59-0.76x (``bench/results/2026-12-01-nvidia-h200-large-b16-32-
5af8cc4.csv``, bf16, M 8192 and 16384, four weight shapes). There
:func:`tilesparse.ops.block_sparse_linear` warns once per configuration and runs such calls
as dense (:class:`_DenseLinear`: the blocks scattered into a dense weight for the matmul,
saved as blocks and scattered again in the backward, the blocks' gradient gathered from the
dense one; the dense weight lives only for the matmul; the copies are Triton kernels that
pass over the dense bytes once, :mod:`tilesparse.kernels.block_scatter`: a 12288² scatter
at density 0.5 0.55 -> 0.11 ms against PyTorch indexing). ``TILESPARSE_DENSE_DISPATCH=0``
keeps the kernels there (still warning). Timed on the H200 (twelfth session, PyTorch
indexing copies, ``scripts/probes/dense_dispatch_ab.py``, 8192x4096², bf16, eager): b 16 at
density 0.25 forward 0.96 -> 0.39 ms and training step 3.81 -> 1.21 ms; at 0.5 1.34 -> 0.43
and 6.44 -> 1.32 ms; b 32 at 0.5 0.56 -> 0.42 and 2.07 -> 1.31 ms.

Where it is known: the GPUs in ``SPEEDUPS`` (by name), bf16 (the suite's dtype; fp16 is
taken as bf16, which it tracked at b 64 and 128), at least ``MIN_ROWS`` rows: the suite's
smallest M. At most ``SMALL_ROWS`` (512) rows the small-batch measurements decide
(:mod:`tilesparse.ops.small_speedups`: W 12288² at 1-512 rows, W 4096² at 1-32), the table of the
measured weight nearest the layer's (from a quarter of it up) among those that measured that many
rows. There the dense path scatters the whole weight every
call, traffic comparable to the product itself, so a call slower than dense runs as dense
only where the model :func:`small_dense_path_faster` says the dense path, copies included,
is faster (timed at 128-512 rows, ``...-dense-dispatch-small-5af8cc4.json``; with the small
suite of 2fa57c2, whose deep panels halved b 16's times at 128-512 rows: forward b 16 at
density 0.5 and 0.25 and b 32 at 0.5, all at 512 rows; no training step), and only warns
elsewhere.
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
import warnings

import torch

from .._env import switch
from ..kernels import block_scatter
from ..kernels.tuned import gpu_slug
from .small_speedups import nearest_table

__all__ = ["MIN_ROWS", "SMALL_PATH", "SMALL_PATH_MAX_DENSITY", "SMALL_PATH_MIN_ROWS",
           "SMALL_ROWS", "SPEEDUPS", "crossover_density", "speedup_estimate", "measured_speedup",
           "small_dense_path_faster", "small_path_ratio", "run_dense", "kernels_only", "scatter_dense",
           "gather_blocks", "dense_linear"]

MIN_ROWS = 8192
SMALL_ROWS = 512  # at most this many rows: the small-batch measurements and the dense path's model

# GPU -> op -> block size -> ((density, speedup over dense), ...): the geometric mean over the
# suite's four shapes (8192x4096², 16384x8192², W [11008, 4096] and its transpose) of the eager
# speedup, bf16; at each point the larger of the runs of the suite on the H200:
# bench/results/2026-11-30-nvidia-h200-large-all-blocks-6d479c1.csv (b 128 from ...-large.csv
# at d7adee3), ...-large.csv at 0be56bf (the balanced warp-specialized kernel at b 128) and,
# for b 16 / 32, 2026-12-01-nvidia-h200-large-b16-32-5af8cc4.csv (updat through the
# dense-tile sdd: b 16's step 0.17-1.40x -> 0.37-1.47x).
# The lent machines' hosts differ (eager rows of the 4096² shape are host-bound on slow
# ones); the larger of the runs is the kernels' speed with the least host in the way.
SPEEDUPS = {
    "nvidia-h200": {
        "step": {
            16: ((0.05, 1.469), (0.1, 0.975), (0.25, 0.532), (0.5, 0.372)),
            32: ((0.05, 3.745), (0.1, 2.513), (0.25, 1.120), (0.5, 0.696)),
            64: ((0.05, 4.163), (0.1, 3.691), (0.25, 1.958), (0.5, 1.127)),
            128: ((0.05, 4.002), (0.1, 3.708), (0.25, 2.963), (0.5, 1.725)),
        },
        "fprop": {
            16: ((0.05, 1.932), (0.1, 1.036), (0.25, 0.430), (0.5, 0.285)),
            32: ((0.05, 5.431), (0.1, 3.137), (0.25, 1.360), (0.5, 0.706)),
            64: ((0.05, 7.725), (0.1, 4.958), (0.25, 2.449), (0.5, 1.305)),
            128: ((0.05, 8.549), (0.1, 6.873), (0.25, 3.376), (0.5, 1.847)),
        },
    },
}

# GPU -> (the dense path's block copy over cuBLAS's product at few rows, per weight byte;
# the row count from which cuBLAS's product is compute-bound): the dense path at <= SMALL_ROWS
# rows costs about dense x (1 + small_path_ratio). H200 (ae2565b): the Triton scatter of a
# 12288² weight ran at 3.9 TB/s (0.114 ms at density 0.5, 0.087 at 0.1), cuBLAS's forward
# at 128 rows at 3.55 TB/s on the weight bytes (0.085 ms) and at 512 rows at ~670 TF/s
# (0.23 ms): copy 3.55 / 3.9 = 0.91 of the product per byte; compute-bound from
# 670e12 * 2 B / (2 * 3.55e12) = 189 rows.
SMALL_PATH = {"nvidia-h200": (0.91, 189)}
SMALL_PATH_MIN_ROWS = 128  # the dense path was timed at 128-512 rows, density 0.1-0.5
SMALL_PATH_MAX_DENSITY = 0.5


def small_path_ratio(gpu: str, rows: int, density: float) -> float | None:
    """The dense path's extra time (the scatter of (1 + density) weight-sized passes) over
    cuBLAS's product at ``rows`` rows, or None where not measured."""
    if gpu not in SMALL_PATH:
        return None
    copy, knee = SMALL_PATH[gpu]
    return (1.0 + density) * copy / max(1.0, rows / knee)


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


_KERNELS_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("tilesparse_kernels_only", default=False)


def enabled() -> bool:
    """Whether measured-slower calls run as dense: unless ``TILESPARSE_DENSE_DISPATCH`` is
    0 / off / false / no, outside :func:`kernels_only`."""
    return not _KERNELS_ONLY.get() and switch("TILESPARSE_DENSE_DISPATCH", True)


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
    dtypes, 513 to MIN_ROWS - 1 rows). At most SMALL_ROWS rows: the fprop (training: the
    lower of fprop and bprop) of the small-batch table of the measured weight nearest
    ``weight_elements`` among those that measured this many rows
    (:func:`tilesparse.ops.small_speedups.nearest_table`; None: not known, no claim);
    between two measured row counts, the lower of the two (the measurements are not
    monotonic in M)."""
    if dtype not in (torch.float16, torch.bfloat16) or SMALL_ROWS < rows < MIN_ROWS or rows < 1:
        return None
    if rows <= SMALL_ROWS:
        table = nearest_table(weight_elements, rows)
        if table is None:
            return None
        estimates = []
        for op in ("fprop", "bprop") if training else ("fprop",):
            by_m = table.SMALL_SPEEDUPS.get(gpu, {}).get(op, {}).get(block_size)
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
    of activations: warn once where measured slower than dense; True (run as dense) with
    dense dispatch on and outside deterministic mode, at MIN_ROWS rows or more where slower
    than dense, and at most SMALL_ROWS rows where the dense path, its block copies
    included, is faster (:func:`small_dense_path_faster`)."""
    speedup = measured_speedup(gpu, dtype, rows, block_size, density, training, weight_elements)
    if speedup is None or speedup >= 1.0:
        return False
    small = rows <= SMALL_ROWS
    dispatch = enabled() and not torch.are_deterministic_algorithms_enabled() and (
        not small or small_dense_path_faster(gpu, rows, density, training, speedup))
    what = ("forward and backward products" if small else "training step") if training else "forward"
    if small:
        what += f" near {rows} rows"
    _warn_once(block_size, round(density, 3), what, round(speedup, 2), dispatch, small)
    return dispatch


def small_dense_path_faster(gpu: str, rows: int, density: float, training: bool, speedup: float) -> bool:
    """At most SMALL_ROWS rows: whether the dense path beats kernels measured at ``speedup``
    of dense, by the model ``speedup < 1 / (1 + k * small_path_ratio)``: k = 1 for the
    forward (one scatter; it matched all 18 forward points timed on the H200 at 128-512 rows,
    b 16 / 32, density 0.1-0.5, ``bench/results/2026-12-01-nvidia-h200-dense-dispatch-small-
    5af8cc4.json``), k = 2.5 for training (two scatters and a gather per step, and more host
    time; the middle of the range 2.1-3.0 that decides the 18 eager steps of the same run
    as timed, with the small suite at deb27c8, but one, left on the kernels where the dense
    path was 1.12x faster). Only inside the range timed (SMALL_PATH_MIN_ROWS to SMALL_ROWS
    rows, density up to SMALL_PATH_MAX_DENSITY); False elsewhere."""
    if not (SMALL_PATH_MIN_ROWS <= rows <= SMALL_ROWS and density <= SMALL_PATH_MAX_DENSITY):
        return False  # outside the range timed: warn only
    ratio = small_path_ratio(gpu, rows, density)
    return ratio is not None and speedup < 1.0 / (1.0 + (2.5 if training else 1.0) * ratio)


@functools.lru_cache(maxsize=None)
def _warn_once(block_size: int, density: float, what: str, speedup: float, dispatch: bool, small: bool) -> None:
    if small and not dispatch:
        action = ("is slower than dense here and runs its kernels (the dense path, which scatters the weight "
                  "every call, was not measured faster)")
    elif dispatch:
        action = "runs as dense here"
    else:
        action = "would be faster as dense here (TILESPARSE_DENSE_DISPATCH=0 keeps the kernels)"
    warnings.warn(
        f"tilesparse: a block-sparse linear layer with {block_size}x{block_size} blocks at density {density} "
        f"{action}: its {what} was measured at {speedup:.2f}x of dense's speed on this GPU "
        f"(data and crossovers: tilesparse/ops/dense_dispatch.py, small_speedups/)", stacklevel=5)


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
    scatters it again for dX and gathers the blocks' gradient from the dense dW.
    ``transposed``: the blocks are W^T's (TransposedBlockSparseLinear's storage)."""

    @staticmethod
    def forward(ctx, x, values, bias, meta, rows: int, cols: int, transposed: bool):
        ctx.save_for_backward(x, values, meta)
        ctx.grid = (rows, cols)
        ctx.has_bias = bias is not None
        ctx.transposed = transposed
        stored = scatter_dense(values, meta, rows, cols)
        return torch.nn.functional.linear(x, stored.t() if transposed else stored, bias)

    @staticmethod
    def backward(ctx, grad):  # differentiable ops only: double backward works, as on the kernels' path
        x, values, meta = ctx.saved_tensors
        rows, cols = ctx.grid
        grad_x = grad_values = grad_bias = None
        if ctx.needs_input_grad[0]:
            stored = scatter_dense(values, meta, rows, cols)
            grad_x = grad @ (stored.t() if ctx.transposed else stored)
        if ctx.needs_input_grad[1]:
            grad_stored = x.t() @ grad if ctx.transposed else grad.t() @ x
            grad_values = gather_blocks(grad_stored, meta, rows, cols, values.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_values, grad_bias, None, None, None, None


def dense_linear(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                 rows: int, cols: int, transposed: bool = False) -> torch.Tensor:
    """The layer as dense, for a 2-D ``x`` (see :class:`_DenseLinear`); ``transposed``: the
    blocks (and ``meta``, ``rows``, ``cols``) are W^T's."""
    return _DenseLinear.apply(x, values, bias, meta, rows, cols, transposed)
