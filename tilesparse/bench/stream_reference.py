"""Plain streams of a given traffic: the small suite's ceilings at a row's size.

A kernel moving 9-30 MB pays a launch, a ramp and a tail that the 1 GiB copy setting
the suite's divisor barely does. Two references of the same traffic, timed as the rows
are, say what any kernel of that size could reach:

- :func:`copy_call`: an SM kernel copying half the bytes (read + written = the traffic).
  Not ``dst.copy_(src)``: inside a CUDA graph that is a memcpy node, which ran at 1.3-2.7
  TB/s at 4-302 MB on the H200 (levelling off at ~2.7: a copy engine's rate, not the SMs'),
  below an elementwise kernel at every size (3.3 TB/s at 30 MB, 4.05 at 151;
  ``scripts/probes/copy_sizes.py``).
- :func:`read_call`: a Triton kernel reading all the bytes and writing one word per
  program, the shape of the small-batch kernels' traffic (weights read, a thin output).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["copy_call", "read_call", "READ_BLOCK"]

READ_BLOCK = 8192  # int32 words per program of the read kernel (32 KB)
_WORD = 4


def _words(nbytes: int) -> int:
    if nbytes < 1:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return max(1, nbytes // _WORD)


def _source(n: int, device) -> torch.Tensor:
    """n int32 words 0, 1, 2, ...: not all equal, so a test can see that every word moved."""
    return torch.arange(n, dtype=torch.int32, device=device)


def copy_call(nbytes: int, device: torch.device | str) -> Callable[[], object]:
    """A call copying nbytes // 2 bytes (int32 words) from one buffer to another with an
    elementwise kernel (``bitwise_or(src, 0, out=dst)``): nbytes of traffic. The call
    returns the destination; the source holds the words 0, 1, 2, ..."""
    n = max(1, _words(nbytes) // 2)
    src = _source(n, device)
    dst = torch.empty_like(src)
    return lambda: torch.bitwise_or(src, 0, out=dst)


def read_call(nbytes: int, device: torch.device | str) -> Callable[[], object]:
    """A call reading nbytes (int32 words): on a GPU a Triton kernel folding each
    READ_BLOCK words to one (an xor) and storing it, returning those words; on the CPU
    ``src.sum()``. The source holds the words 0, 1, 2, ..."""
    n = _words(nbytes)
    src = _source(n, device)
    if src.device.type != "cuda":
        return lambda: src.sum()
    import triton

    from ._stream_read import stream_read

    sink = torch.empty(triton.cdiv(n, READ_BLOCK), dtype=torch.int32, device=device)
    grid = (sink.numel(),)

    def call() -> torch.Tensor:
        stream_read[grid](src, sink, n, BLOCK=READ_BLOCK, num_warps=8)
        return sink

    return call
