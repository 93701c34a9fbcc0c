"""Our Python's share of a block-sparse call's host time, measured on the CPU: every
Triton launch is replaced by a no-op and the CUDA-only dispatch is forced onto the
kernels' wrappers, so what remains is the argument checks, the autograd Functions,
config lookups and output allocation (small tensors, so allocation stays cheap).

The H200's host is shared and its timings swing by +-30 % between runs; this isolates
the part of the host time that our code controls and can be compared before and after
a change on one machine.

    python scripts/probes/host_python_cost.py            # table of µs per call
    python scripts/probes/host_python_cost.py --profile  # and a cProfile of the step
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

os.environ.pop("TRITON_INTERPRET", None)  # the launches are stubbed: nothing is interpreted

import torch  # noqa: E402
from host_cases import host_cases  # noqa: E402

from tilesparse.kernels import bsmm as K  # noqa: E402
from tilesparse.kernels import bsmm_panel, bsmm_small, bsmm_tma  # noqa: E402
from tilesparse.ops import bsmm as O  # noqa: E402
from tilesparse.ops import linear_plans  # noqa: E402


def stub_launches() -> None:
    """No kernel runs: each module's ``launch`` does nothing, and the ops call the
    kernels' wrappers on CPU tensors (normally the PyTorch reference runs there)."""
    for module in (K, bsmm_small, bsmm_tma, bsmm_panel):
        module.launch = lambda *args, **kwargs: None
    O._dds_impl = K.dds
    O._sdd_impl = K.sdd
    linear_plans._on_device = lambda x: True  # a module's forwards without autograd from its plans


def per_call_us(fn, n: int, rounds: int = 15) -> float:
    """The least over ``rounds`` of the mean wall time of ``n`` calls: the code's own cost,
    with the least interference from whatever else the machine runs."""
    for _ in range(20):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return min(samples)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    stub_launches()
    cases = host_cases(torch.device("cpu"), torch.bfloat16, m=64)
    for name, fn in cases.items():
        print(f"{name:48s} {per_call_us(fn, args.calls):7.1f} us")
    if args.profile:
        step = cases["training step, backward on the calling thread"]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
