"""Time stamps from inside a Gluon kernel partition, for probes of where a program's time
goes (e.g. ``attention_ws_dkdv``'s ``STAMPS``): the GPU-wide nanosecond timer and the SM a
program runs on, written by one thread per partition into an int64 table.

Why: a kernel's total time hides its per-program fixed costs (loads before the first
product, the epilogue, the gap before the next program on the SM); the stamps of every
program give them directly. ``%globaltimer`` is one clock for all SMs, so the gaps between
programs on one SM are comparable across SMs.
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["now_ns", "sm_id", "store_stamp", "program_stamp_row", "check_stamps", "STAMP_COLUMNS"]

# a program's row of the stamp table (int64); the kernel says which columns it writes
STAMP_COLUMNS = 8
_COLUMNS = gl.constexpr(STAMP_COLUMNS)


@gluon.jit
def _lanes(num_warps: gl.constexpr):
    """int32 [32 * num_warps]: each thread's index in a ``num_warps``-warp partition."""
    return gl.arange(0, 32 * num_warps, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))


@gluon.jit
def now_ns(num_warps: gl.constexpr):
    """The GPU's global nanosecond timer, read by every thread of the partition."""
    lanes = _lanes(num_warps)
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lanes], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def sm_id(num_warps: gl.constexpr):
    """The SM this program runs on, read by every thread of the partition (int64)."""
    lanes = _lanes(num_warps)
    return gl.inline_asm_elementwise("{ .reg .u32 s; mov.u32 s, %smid; cvt.u64.u32 $0, s; }", "=l,r", [lanes],
                                     dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def program_stamp_row(stamp_ptr):
    """This program's row of the stamp table: STAMP_COLUMNS int64 per program, programs
    numbered program_id(0) + program_id(1) * num_programs(0) (the launch order of a 1-D grid)."""
    pid = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    return stamp_ptr + pid.to(gl.int64) * _COLUMNS


@gluon.jit
def store_stamp(stamp_ptr, index, value, num_warps: gl.constexpr):
    """``stamp_ptr[index] = value`` (a per-thread int64 tensor from :func:`now_ns` or
    :func:`sm_id`), written by the partition's first thread."""
    lanes = _lanes(num_warps)
    gl.store(stamp_ptr + index + lanes * 0, value, mask=lanes == 0)


def check_stamps(stamps, grid: tuple, persistent: bool, device) -> None:
    """Refuse a stamp table that cannot take a row of STAMP_COLUMNS int64 per program of
    ``grid`` (contiguous, on the kernel's ``device``), or a persistent launch (its programs
    take many items)."""
    programs = math.prod(grid)
    if (persistent or stamps.dtype != torch.int64 or not stamps.is_contiguous() or stamps.device != device
            or stamps.numel() < STAMP_COLUMNS * programs):
        raise ValueError(f"stamps: a contiguous int64 tensor of {STAMP_COLUMNS} per program ({programs} programs) "
                         f"on {device}, not with a persistent config; got {stamps.dtype} {tuple(stamps.shape)} on "
                         f"{stamps.device}, persistent={persistent}")
