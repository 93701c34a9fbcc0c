"""L2 prefetch hints: bring a table's bytes into L2 well before the loads that need them.

A loop that loads a block index and then gathers through it waits, every step, on the
index load; where the index table itself streams from HBM (each program reads its own
run once), that wait is an HBM round trip per step (~0.5-1 µs under load), however deep
the gather's own prefetch. ``prefetch.global.L2`` asks for the line without a register
result, so nothing waits on it; the index load a few steps later then hits L2.

The hint is PTX, which the Triton interpreter cannot run: launchers switch it on through
:func:`l2_prefetch_on`, false for interpreted launches and devices other than NVIDIA
GPUs. Results never depend on it (a prefetch moves no data into registers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["l2_prefetch_on", "prefetch_l2"]


def l2_prefetch_on(t: torch.Tensor) -> bool:
    """Whether a kernel launched on ``t``'s device may issue PTX prefetch hints: a CUDA
    (not ROCm) device and not the interpreter."""
    return t.is_cuda and torch.version.hip is None and not triton.knobs.runtime.interpret


@triton.jit
def prefetch_l2(ptr):
    """Hint that the line at ``ptr`` (a scalar pointer) is read soon: fetched into L2, no
    register written, nothing waits on it."""
    tl.inline_asm_elementwise("{ prefetch.global.L2 [$1]; mov.u32 $0, 0; }", "=r,l", [ptr], dtype=tl.int32,
                              is_pure=False, pack=1)
