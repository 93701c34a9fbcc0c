"""Tile helpers shared by the kernels: the grouped tile order (device side) and the
launchers' integer math (host side).

The host helpers are plain Python on purpose: in Triton 3.6 ``triton.cdiv`` and
``triton.next_power_of_2`` are constexpr-function wrappers that cost ~4 µs per call on
the host, and a launcher calls several per launch.
"""

import torch
import triton
import triton.language as tl


MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y (and z)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def split_runs(m: int, splits: int, block_m: int) -> tuple[int, int]:
    """(runs, run length) of a reduction of length ``m`` cut into at most ``splits`` runs
    of whole ``block_m`` steps, none empty: for kernels that write one fp32 partial
    product per run (summed by :func:`sum_partials`)."""
    m = max(m, 1)
    run = cdiv(cdiv(m, max(1, min(splits, cdiv(m, block_m)))), block_m) * block_m
    return cdiv(m, run), run


def sum_partials(partials: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` = the fp32 ``partials`` [runs, ...] summed over runs, in run order (a
    fixed-order reduction: the split products stay bitwise deterministic)."""
    if out.dtype == torch.float32:
        torch.sum(partials, dim=0, out=out)
    else:
        out.copy_(partials.sum(dim=0))


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def check_power_of_two(config, *fields: str, minimum: int = 16) -> None:
    """Raise ValueError naming the field unless each is a power of two >= ``minimum``
    (launch configs: a wrong one would otherwise compile to a kernel that skips work)."""
    for name in fields:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value & (value - 1):
            raise ValueError(f"{type(config).__name__}.{name} must be a power of two >= {minimum}, got {value!r}")


def check_bools(config, *fields: str) -> None:
    """Raise ValueError naming the field unless each is a bool (1 or "yes" would be taken
    silently)."""
    for name in fields:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{type(config).__name__}.{name} must be a bool, got {getattr(config, name)!r}")


def check_ints(config, *fields: str) -> None:
    """Raise ValueError naming the field unless each is an int (not a bool)."""
    for name in fields:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{type(config).__name__}.{name} must be an int, got {value!r}")


def check_register_budgets(config, *fields: str) -> None:
    """Raise ValueError naming the field unless each is a register count setmaxnreg takes:
    a multiple of 8 in 24..256 (warp-specialized partitions' budgets)."""
    for name in fields:
        value = getattr(config, name)
        if not 24 <= value <= 256 or value % 8:
            raise ValueError(f"{type(config).__name__}.{name} must be a multiple of 8 in 24..256, got {value!r}")


def check_fits_tile(config, tile: int, *fields: str) -> None:
    """Raise ValueError unless each field is at most the tile side (which it divides,
    both being powers of two): a larger one would leave the reduction loop empty."""
    for name in fields:
        if getattr(config, name) > tile:
            raise ValueError(f"{type(config).__name__}.{name}={getattr(config, name)} exceeds the {tile}-wide tile "
                             "of this block size")


def tile_for(block_size: int) -> int:
    """Tile side for a block: a power of two (tl.arange needs one) and >= 16 (tl.dot
    needs every dimension >= 16). Blocks narrower than their tile use masked loads."""
    return max(16, next_power_of_2(block_size))


@triton.jit
def grouped_tile(tile, num_pid_m, n_out_blocks, GROUP_M: tl.constexpr):
    """(m-tile, output block-column) of a linear tile index in grouped order: GROUP_M
    consecutive m-tiles sweep all block-columns, so the A rows and the weight blocks
    they use stay in L2."""
    pids_per_group = GROUP_M * n_out_blocks
    first_m = (tile // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % pids_per_group) % group_rows
    pid_n = (tile % pids_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def swappable_dot(acc, a, b, SWAP: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """acc += a @ b, or its transpose acc^T += b^T @ a^T (SWAP: the small kernels' choice of
    which operand is the MMA's M side; the accumulator is kept transposed)."""
    if SWAP:
        acc = tl.dot(tl.trans(b), tl.trans(a), acc, input_precision=INPUT_PRECISION)
    else:
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc
