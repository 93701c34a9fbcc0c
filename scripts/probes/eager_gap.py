"""Why a product times slower eagerly (do_bench: L2 flushed before each call, host
launch inside the timed span) than in CUDA-graph replay, on one case: the same call
timed five ways in one process, with the kernels' own durations from the profiler.

On the H200 at 16384x8192², b 128, density 0.5, the eager suite timed updat (sdd) at
2.77 ms and graph replay at 2.02 ms in the same device call (eleventh session), while
fprop and dense matched within 3 %. This separates host gaps from a slower kernel:

  eager      triton.testing.do_bench (the suite's eager timing)
  graph      triton.testing.do_bench_cudagraph (the suite's --cuda-graph timing)
  hot        back-to-back calls, events around the batch (no flush, no host gap)
  flushed    a 256 MB memset before each call, events around the call only
  profiler   the kernels' own device time per call (torch.profiler)

    python scripts/probes/eager_gap.py --shape 16384x8192x8192 --block 128 --density 0.5
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton.testing

import tilesparse as ts
from tilesparse.bench import peers


def _events_ms(fn, reps: int, flush: torch.Tensor | None) -> float:
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _hot_ms(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _profiled_kernels(fn, reps: int) -> dict[str, float]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA and evt.self_device_time_total > 0:
            name = evt.key[:80]  # (two kernels sharing these 80 characters are summed, not overwritten)
            out[name] = out.get(name, 0.0) + evt.self_device_time_total / 1e3 / reps
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="16384x8192x8192", help="MxNxK")
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--density", type=float, default=0.5)
    p.add_argument("--ops", nargs="+", default=["updat", "fprop"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16
    layout = ts.layouts.random(n, k, args.block, args.density, seed=0, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    values = torch.randn(layout.nnz, args.block, args.block, device="cuda", dtype=dtype) * args.block ** -0.5
    o = peers.Operands(x=x, dy=dy, layout=layout, values=values, w_dense=torch.randn(n, k, device="cuda", dtype=dtype))
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    rows = []
    for op in args.ops:
        methods = {"tilesparse": peers.tilesparse, "dense": peers.dense}
        for name, make in methods.items():
            fn, why = make(op, o)
            if fn is None:
                continue
            fn()
            torch.cuda.synchronize()
            row = {"op": op, "method": name,
                   "eager": triton.testing.do_bench(fn, return_mode="median"),
                   "graph": triton.testing.do_bench_cudagraph(fn, return_mode="median"),
                   "hot": _hot_ms(fn, args.reps),
                   "flushed": _events_ms(fn, args.reps, flush),
                   "profiler": _profiled_kernels(fn, args.reps)}
            rows.append(row)
            print(f"{op:6} {name:10} eager {row['eager']:.4f}  graph {row['graph']:.4f}  hot {row['hot']:.4f}  "
                  f"flushed {row['flushed']:.4f}  "
                  f"kernels {json.dumps({k_: round(v, 4) for k_, v in row['profiler'].items()})}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "block": args.block, "density": args.density,
                       "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
