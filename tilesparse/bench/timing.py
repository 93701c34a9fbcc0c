"""Timing: triton.testing.do_bench medians on a GPU, perf_counter medians on the CPU.

On a GPU, do_bench flushes L2 before every call, so inputs that would fit in L2 (a
sparse weight at low density) are not timed hot; the first call (compilation,
autotuning, lookup tables) is run and synchronised before timing starts. do_bench
times what a caller sees, host launch overhead included: where the GPU work is shorter
than the Python that launches it, the host is what gets timed. ``graph=True`` replays
the calls from a CUDA graph instead (do_bench_cudagraph: no host overhead, no L2
flush), which isolates the kernels' own time.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["bench_ms"]


def bench_ms(
    fn: Callable[[], object],
    *,
    cuda: bool,
    graph: bool = False,
    warmup_ms: int = 25,
    rep_ms: int = 100,
    cpu_reps: int = 5,
) -> float:
    """Median milliseconds of one call of ``fn``."""
    if cuda:
        import triton.testing

        fn()  # compile / warm-up outside the estimate do_bench makes of the call's length
        torch.cuda.synchronize()
        if graph:
            return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    times = []
    for _ in range(cpu_reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
