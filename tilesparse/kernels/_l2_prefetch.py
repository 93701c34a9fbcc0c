"""Bulk L2 prefetch: ask for a run of weight bytes to be brought into L2 ahead of the loads.

A memory-bound kernel streams at the rate its loads in flight allow. The small-batch
kernel's weight loads go through a shared-memory ring a few stages deep, and each program
walks its own run of blocks, so the bytes in flight per SM are bounded by the ring (and
fall when short runs finish while long ones go on). ``cp.async.bulk.prefetch.L2`` (sm_90)
asks the copy engine for a whole byte range with one instruction, writes no register and
no shared memory, and nothing waits on it: issued some blocks ahead of the ring, it keeps
many more bytes in flight, and the ring's loads then hit L2.

A prefetch moves no data into the program, so results never depend on it; L2 is the point
of coherence, so a prefetched line is never stale. It is PTX, which the Triton interpreter
cannot run: launchers switch it on through :func:`l2_prefetch_on` (false for interpreted
launches, CPUs, ROCm and GPUs older than sm_90).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import capability_major

__all__ = ["MAX_L2_AHEAD", "check_reach", "l2_prefetch_on", "prefetch_block_slices", "prefetch_l2_bytes",
           "prefetch_l2_bytes_each"]

MAX_L2_AHEAD = 256  # blocks ahead of a step that a kernel's L2 prefetch hints may reach


def l2_prefetch_on(t: torch.Tensor) -> bool:
    """Whether a kernel launched on ``t``'s device may issue bulk L2 prefetches: an NVIDIA
    (not ROCm) GPU of compute capability 9 or newer, and not the interpreter."""
    return (t.is_cuda and torch.version.hip is None and not triton.knobs.runtime.interpret
            and capability_major(t.device) >= 9)


# The prefetch, predicated on the flag ($3), by thread 0 only or by each thread that holds an element
_BY_FIRST_THREAD: tl.constexpr = tl.constexpr(
    "{ .reg .pred %tsp_first, %tsp_on; .reg .u32 %tsp_tid;\n"
    " mov.u32 %tsp_tid, %tid.x;\n"
    " setp.eq.u32 %tsp_first, %tsp_tid, 0;\n"
    " setp.ne.and.s32 %tsp_on, $3, 0, %tsp_first;\n"
    " @%tsp_on cp.async.bulk.prefetch.L2.global [$1], $2;\n"
    " mov.u32 $0, 0; }")
_BY_EACH_THREAD: tl.constexpr = tl.constexpr(
    "{ .reg .pred %tsp_on;\n"
    " setp.ne.s32 %tsp_on, $3, 0;\n"
    " @%tsp_on cp.async.bulk.prefetch.L2.global [$1], $2;\n"
    " mov.u32 $0, 0; }")


@triton.jit
def prefetch_l2_bytes(ptr, nbytes, on):
    """Hint that the ``nbytes`` bytes from ``ptr`` (a scalar pointer) are read soon, when the
    scalar ``on`` is nonzero: one bulk prefetch into L2, issued by the program's first thread."""
    _bulk_prefetch(ptr, nbytes, on, _BY_FIRST_THREAD)


@triton.jit
def prefetch_l2_bytes_each(ptrs, nbytes, on):
    """:func:`prefetch_l2_bytes` for each element of a tensor of pointers ``ptrs`` (with
    ``on`` a tensor of flags of its shape and ``nbytes`` a scalar), issued by the thread that
    holds the element. A tensor smaller than the program's threads is held by several
    threads each, which then issue the same prefetch: give it at least as many elements."""
    _bulk_prefetch(ptrs, nbytes, on, _BY_EACH_THREAD)


@triton.jit
def _bulk_prefetch(ptrs, nbytes, on, ASM: tl.constexpr):
    """``cp.async.bulk.prefetch.L2`` of ``nbytes`` from each pointer, by the PTX ``ASM``. The
    range is widened to 16-byte boundaries, as the instruction needs (a 16-byte chunk that
    holds a byte of the tensor lies in the same page as that byte, so the widening cannot
    fault)."""
    start = ptrs.to(tl.int64, bitcast=True)
    lo = start & -16
    size = (((start + nbytes + 15) & -16) - lo).to(tl.int32)
    tl.inline_asm_elementwise(ASM, "=r,l,r,r", [lo, size, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def check_reach(config, maximum: int = MAX_L2_AHEAD) -> None:
    """Raise ValueError naming ``config.l2_ahead`` unless it is an int in 0..``maximum``."""
    reach = config.l2_ahead
    if isinstance(reach, bool) or not isinstance(reach, int) or not 0 <= reach <= maximum:
        raise ValueError(f"{type(config).__name__}.l2_ahead must be an int in 0..{maximum}, got {reach!r}")


@triton.jit
def prefetch_block_slices(v_ptr, s, first, end, COUNT: tl.constexpr, B: tl.constexpr, SUB: tl.constexpr):
    """L2 prefetch of slice s (rows s * SUB ... of each B x B block) of the blocks
    V[first .. first + COUNT) that lie before ``end``, for blocks stored in table order (a
    row table's entry e is V[e]): one byte range where the slices are whole blocks
    (consecutive entries' blocks are adjacent), else one range per block."""
    ELT: tl.constexpr = v_ptr.dtype.element_ty.primitive_bitwidth // 8
    if SUB >= B:
        n = tl.minimum(tl.maximum(end - first, 0), COUNT)
        prefetch_l2_bytes(v_ptr + first.to(tl.int64) * (B * B), n * (B * B * ELT), n > 0)
    else:
        rows = tl.minimum(SUB, B - s * SUB)
        for q in range(0, COUNT):
            prefetch_l2_bytes(v_ptr + (first + q).to(tl.int64) * (B * B) + s * (SUB * B), rows * (B * ELT),
                              (first + q < end) & (rows > 0))
