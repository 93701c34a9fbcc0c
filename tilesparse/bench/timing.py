"""Timing: triton.testing.do_bench medians on a GPU, perf_counter medians on the CPU.

On a GPU, do_bench flushes L2 before every call, so inputs that would fit in L2 (a
sparse weight at low density) are not timed hot; the first call (compilation,
autotuning, lookup tables) is run and synchronised before timing starts. do_bench
times what a caller sees, host launch overhead included: where the GPU work is shorter
than the Python that launches it, the host is what gets timed. ``graph=True`` replays
the calls from a CUDA graph instead (do_bench_cudagraph: no host overhead, no L2
flush), which isolates the kernels' own time. Without the flush, an operand smaller than
L2 is read from L2 on every replay after the first; :func:`rotation_copies` says how
many copies of a case's operands to cycle through so that none is.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

__all__ = ["bench_ms", "bench_ms_noted", "interleaved_ms", "rotation_copies", "L2_ROTATION_FACTOR", "MAX_ROTATION_COPIES"]

# Operand sets cycled through together span this many L2 caches, so by the time a set comes
# round again the others have evicted it: its reads go to HBM.
L2_ROTATION_FACTOR = 3
# A bound on the copies (and on the calls captured per graph replay) for the tiniest cases.
MAX_ROTATION_COPIES = 256


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


def bench_ms_noted(fn: Callable[[], object], *, cuda: bool, graph: bool = False) -> tuple[float, str]:
    """(ms, note): :func:`bench_ms`; where a CUDA-graph capture fails (an op that syncs
    with the host, say), the call is timed without the graph and the note says so."""
    try:
        return bench_ms(fn, cuda=cuda, graph=graph), ""
    except Exception as exc:
        if not graph:
            raise
        torch.cuda.synchronize()
        return bench_ms(fn, cuda=cuda), f"graph capture failed ({type(exc).__name__}); timed with do_bench"


def interleaved_ms(fns: dict[str, Callable[[], object]], *, cuda: bool, rounds: int = 5,
                   rep_ms: int = 50) -> dict[str, float]:
    """Median milliseconds of each of ``fns`` over ``rounds`` rounds of :func:`bench_ms`,
    the functions taken in turn within a round, each round starting one function later
    (each leads once every len(fns) rounds), so a drift of the (shared) GPU's clocks or
    load falls on all of them: for A/B choices between variants a few percent apart, where
    separate timings swing by 5-10 %. (Reversing every other round instead left the
    first-listed function 3-5 % slower than identical ones on the H200, twenty-fourth
    session.)"""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(bench_ms(fns[name], cuda=cuda, rep_ms=rep_ms))
    return {name: statistics.median(times) for name, times in samples.items()}


def host_us(fn: Callable[[], object], n: int = 200, warmup: int = 10) -> float:
    """Wall microseconds per call of ``fn`` over ``n`` back-to-back calls, the GPU
    synchronised only before and after: the host's cost per call wherever it exceeds
    the GPU's (a host-bound call), the GPU's otherwise."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return host


def rotation_copies(footprint_bytes: int, l2_bytes: int | None, *, factor: int = L2_ROTATION_FACTOR,
                    max_copies: int = MAX_ROTATION_COPIES) -> int:
    """How many operand sets of ``footprint_bytes`` each (the original included) to cycle
    through so that together they span ``factor`` L2 caches: at least 1, at most
    ``max_copies``; 1 when the L2 size is unknown (CPU)."""
    if not l2_bytes or footprint_bytes <= 0:
        return 1
    return max(1, min(max_copies, math.ceil(factor * l2_bytes / footprint_bytes)))
