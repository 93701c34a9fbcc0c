"""An eager BlockSparseLinear forward without autograd (decoding), with and without the layer's plans
(tilesparse.ops.linear_plans), against the same call replayed from a CUDA graph (the kernels alone).

Each case runs ``calls`` forwards back to back (the GPU synchronized before and after) and reports
the wall time per call: where the host is slower than the kernel, that is the host's time. Plans on
and off alternate round by round, so the shared host's drifts fall on both; medians over the rounds.

    python scripts/probes/linear_plans_eager.py --out linear_plans_eager.json
    python scripts/probes/linear_plans_eager.py --profile  # and where a planned call's host time goes
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

import tilesparse as ts
from tilesparse.ops import linear_plans

CASES = [  # (N = K, block, density, M)
    (4096, 32, 0.25, 1), (4096, 64, 0.25, 16), (4096, 128, 0.1, 64),
    (12288, 32, 0.1, 1), (12288, 64, 0.25, 16), (12288, 128, 0.1, 32), (12288, 16, 0.25, 8),
]


def wall_us(fn, calls: int) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls, synchronized before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(fn, calls: int) -> float:
    """Microseconds per call replayed from a CUDA graph of ``calls`` calls (no host in between)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def profile_planned(calls: int) -> str:
    """cProfile of ``calls`` planned forwards (W 4096², b 32, d 0.25, M 1), and the host cost of the
    CUDA calls a planned forward makes, each alone."""
    module = ts.nn.BlockSparseLinear(4096, 4096, block_size=32, density=0.25).to("cuda", torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    module(x)
    lines = []
    for name, fn in (("module(x), planned", lambda: module(x)),
                     ("torch.cuda.current_stream(device)", lambda: torch.cuda.current_stream(x.device)),
                     ("torch.cuda.is_current_stream_capturing()", torch.cuda.is_current_stream_capturing),
                     ("torch.empty(1, 4096) on cuda", lambda: torch.empty(1, 4096, device=x.device, dtype=x.dtype)),
                     ("torch.is_autocast_enabled('cuda')", lambda: torch.is_autocast_enabled("cuda")),
                     ("torch.cuda.current_device()", torch.cuda.current_device)):
        lines.append(f"{name:44s} {wall_us(fn, 2000):6.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        module(x)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    return "\n".join(lines) + "\n" + text.getvalue()


class BeforeHostCuts:
    """The forty-ninth session's host-time cuts undone in this process (for ``--host-ab``): environment
    switches read through ``os.environ.get``, the layer's weight, bias and mask through nn.Module's
    attribute lookup (the owner check stays the new one)."""

    def __enter__(self):
        import os

        from tilesparse import _env
        from tilesparse.nn import linear

        self.saved = (_env._raw, linear._BlockStoredLinear._forward, linear._BlockStoredLinear.layout)
        _env._raw = lambda name: os.environ.get(name)

        def forward(module, x, transposed_storage):
            return module._plans(x, module.weight, module.layout, module.bias, transposed_storage)

        def layout(module):
            mask = getattr(module, module.MASK_BUFFER)
            if module._layout.device != mask.device:
                module._layout = module._layout.to(mask.device)
            return module._layout

        linear._BlockStoredLinear._forward = forward
        linear._BlockStoredLinear.layout = property(layout)
        return self

    def __exit__(self, *exc):
        from tilesparse import _env
        from tilesparse.nn import linear

        _env._raw, linear._BlockStoredLinear._forward, linear._BlockStoredLinear.layout = self.saved


def host_ab(rounds: int, calls: int) -> list[dict]:
    """Planned calls with the host cuts (``after``) and without (``before``, :class:`BeforeHostCuts`),
    alternating round by round in this process; medians of wall µs per call."""
    import contextlib

    rows = []
    for n, block, density, m in CASES:
        module = ts.nn.BlockSparseLinear(n, n, block_size=block, density=density, seed=0).to("cuda", torch.bfloat16)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        module(x)
        samples = {"after": [], "before": []}
        for _ in range(rounds):
            for mode in ("after", "before", "before", "after"):
                with BeforeHostCuts() if mode == "before" else contextlib.nullcontext():
                    module(x)
                    samples[mode].append(wall_us(lambda: module(x), calls))
        row = {"n": n, "block": block, "density": density, "m": m,
               **{f"{mode}_us": statistics.median(v) for mode, v in samples.items()}}
        rows.append(row)
        print(f"N=K {n:5d} b {block:3d} d {density:4.2f} M {m:3d}: planned call with the host cuts "
              f"{row['after_us']:6.1f} us, without {row['before_us']:6.1f} us", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default="linear_plans_eager.json")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--host-ab", action="store_true", help="planned calls with and without the 49th session's host cuts")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    if args.profile:
        print(profile_planned(2000))
        return
    if args.host_ab:
        rows = host_ab(args.rounds, args.calls)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rounds": args.rounds, "calls": args.calls,
                       "mode": "host-ab", "rows": rows}, f, indent=2)
        return
    rows = []
    for n, block, density, m in CASES:
        module = ts.nn.BlockSparseLinear(n, n, block_size=block, density=density, seed=0).to("cuda", torch.bfloat16)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        samples = {"plans": [], "no_plans": []}
        for _ in range(args.rounds):
            for mode, on in (("plans", True), ("no_plans", False), ("no_plans", False), ("plans", True)):
                linear_plans.PLANS = on
                module(x)  # (the first call of a key plans it)
                samples[mode].append(wall_us(lambda: module(x), args.calls))
        linear_plans.PLANS = True
        kernels = graph_us(lambda: module(x), args.calls)
        row = {"n": n, "block": block, "density": density, "m": m, "kernel_us": kernels,
               **{f"{mode}_us": statistics.median(v) for mode, v in samples.items()}}
        rows.append(row)
        print(f"N=K {n:5d} b {block:3d} d {density:4.2f} M {m:3d}: eager with plans {row['plans_us']:6.1f} us, "
              f"without {row['no_plans_us']:6.1f} us, graph replay {kernels:6.1f} us", flush=True)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rounds": args.rounds, "calls": args.calls,
                   "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
