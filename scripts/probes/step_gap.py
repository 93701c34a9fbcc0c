"""Why the eager training step (autograd) takes longer than its three products.

On the H200 (large suite, 2026-11-30) the step at X 8192x4096, W 4096², b 128, density
0.25 took 0.89 ms while fprop + bprop + updat took 0.39 ms timed one by one, and stk's
step (three direct calls, no autograd) 0.46 ms. This times, in one process on that case:
the three products called directly; the autograd step (as the suite runs it); the same
with autograd's device threads off; each under do_bench (eager) and as plain host wall
time per call; then runs the autograd step under ``torch.cuda.set_sync_debug_mode``
to list any host synchronisation, times the phases of the backward on each thread (the
hand-off to our Python backward, its body, the rest), and a CUDA-side profile of one
step's kernels.

    python scripts/probes/step_gap.py --out step_gap.json
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
import triton.testing

import tilesparse as ts
from tilesparse import ops
from tilesparse.bench.timing import host_us


def _backward_phases(forward, backward, n: int = 50) -> dict:
    """Median microseconds, per autograd threading mode, from the call of ``backward(y)``
    (after ``y = forward()`` and a sync) to the entry of our backward (the hand-off), of
    our backward's body, and from its return to ``backward`` returning. Wraps _DdsFunction.backward with
    timers for the duration."""
    import statistics

    from tilesparse.ops import bsmm as ops_bsmm

    marks = {}
    original = ops_bsmm._DdsFunction.backward

    def timed_backward(ctx, grad):
        marks["enter"] = time.perf_counter()
        out = original(ctx, grad)
        marks["leave"] = time.perf_counter()
        return out

    ops_bsmm._DdsFunction.backward = staticmethod(timed_backward)
    phases = {}
    try:
        for mode, enabled in (("worker thread", True), ("calling thread", False)):
            samples = []
            with torch.autograd.set_multithreading_enabled(enabled):
                for _ in range(n):
                    y = forward()
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    backward(y)
                    done = time.perf_counter()
                    samples.append((marks["enter"] - start, marks["leave"] - marks["enter"], done - marks["leave"]))
            phases[mode] = {key: statistics.median(x[i] for x in samples) * 1e6
                            for i, key in enumerate(("handoff_us", "body_us", "tail_us"))}
    finally:
        ops_bsmm._DdsFunction.backward = original
    return phases


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x4096x4096", help="MxNxK")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--density", type=float, default=0.25)
    p.add_argument("--out", default="step_gap.json")
    args = p.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    dev, dt = torch.device("cuda"), torch.bfloat16
    layout = ts.layouts.random(n, k, args.block, args.density, device=dev)
    x = torch.randn(m, k, device=dev, dtype=dt)
    dy = torch.randn(m, n, device=dev, dtype=dt)
    values = torch.randn(layout.nnz, args.block, args.block, device=dev, dtype=dt)
    xg, wg = x.detach().requires_grad_(True), values.detach().requires_grad_(True)

    def direct():
        return (ops.dds(x, values, layout, trans_b=True), ops.dds(dy, values, layout),
                ops.sdd(dy, x, layout, trans_a=True))

    def step():
        y = ops.block_sparse_linear(xg, wg, layout)
        return torch.autograd.grad(y, (xg, wg), dy)

    def forward_only():
        return ops.block_sparse_linear(xg, wg, layout)

    meta, rows_, cols_ = layout.meta_on(dev), layout.block_rows, layout.block_cols

    def op_step():  # the registered custom op and its registered autograd, in eager mode
        y = torch.ops.tilesparse.dds(xg, wg, meta, None, rows_, cols_, True)
        return torch.autograd.grad(y, (xg, wg), dy)

    def linear(x, w):
        return ops.block_sparse_linear(x, w, layout)

    compiled = {mode: torch.compile(linear, mode=mode) for mode in ("default", "reduce-overhead")}

    def compiled_step(mode):
        def run():
            y = compiled[mode](xg, wg)
            return torch.autograd.grad(y, (xg, wg), dy)
        return run

    w_dense = torch.randn(n, k, device=dev, dtype=dt, requires_grad=True)

    def dense_step():
        y = torch.nn.functional.linear(xg, w_dense)
        return torch.autograd.grad(y, (xg, w_dense), dy)

    rows = {}
    for name, fn in (("dense step", dense_step), ("direct three products", direct), ("autograd step", step),
                     ("forward with grad", forward_only), ("custom-op step", op_step),
                     ("compiled step", compiled_step("default")),
                     ("compiled step, reduce-overhead", compiled_step("reduce-overhead"))):
        for _ in range(3):
            fn()  # compile and record graphs outside the timing
        rows[name] = {"do_bench_ms": triton.testing.do_bench(fn, rep=200, return_mode="median"),
                      "host_us": host_us(fn, 100, 5)}
    torch.autograd.set_multithreading_enabled(False)
    rows["autograd step, one thread"] = {"do_bench_ms": triton.testing.do_bench(step, rep=200, return_mode="median"),
                                         "host_us": host_us(step, 100, 5)}
    torch.autograd.set_multithreading_enabled(True)
    for name, row in rows.items():
        print(f"{name:28s} do_bench {row['do_bench_ms']:.3f} ms   host {row['host_us']:.0f} us/call", flush=True)

    syncs = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
        direct()
    torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        syncs.append(f"{w.filename}:{w.lineno}: {w.message}")
    print("host syncs in one step + direct call:", len(syncs))
    for s in syncs[:20]:
        print("  ", s)

    # Where the worker thread's time goes: the hand-off (grad() called -> our backward
    # entered) and our backward's own Python, on the worker thread and on the caller's.
    phases = _backward_phases(forward_only, lambda y: torch.autograd.grad(y, (xg, wg), dy))
    for mode, row in phases.items():
        print(f"backward {mode:16s} hand-off {row['handoff_us']:7.1f} us   our backward body {row['body_us']:7.1f} us"
              f"   after it {row['tail_us']:7.1f} us (medians)")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=12)
    print(table)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "shape": args.shape, "block": args.block,
                   "density": args.density, "rows": rows, "syncs": syncs, "backward_phases": phases,
                   "profile": table}, f, indent=1)


if __name__ == "__main__":
    main()
