"""Why attention forward + backward times slower in the suite (do_bench: L2 flushed before
each call, the host's launches inside the timed span) than its kernels' sum: one pattern,
each method timed four ways in one process, plus the host's own time per call and a
cProfile of our Python.

Twenty-third session, H200, local 1024: the suite timed tilesparse's forward + backward at
2.62 ms (deterministic=False 2.46) while the profiler summed its kernels to 2.34 (2.20);
FlexAttention's 3.11 against 3.02. This separates host gaps from slower kernels:

  eager     triton.testing.do_bench (the suite's timing)
  graph     triton.testing.do_bench_cudagraph (no host in the timed span)
  hot       back-to-back calls, events around the batch (no flush)
  host      wall time per call of back-to-back calls (the host's cost where it exceeds the GPU's)
  kernels   the kernels' own device time per call (torch.profiler)

    python scripts/probes/attention_gap.py --pattern local1024 --out gap.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats

import torch
import triton.testing
from attention_inputs import pattern_methods, qkv_and_grad  # this folder's
from eager_gap import _hot_ms, _profiled_kernels  # this folder's: the same timings for the bsmm ops

from tilesparse.bench.attention import suite_patterns
from tilesparse.bench.timing import host_us


def python_profile(fn, reps: int = 20, top: int = 25, sort: str = "tottime") -> str:
    """cProfile of ``reps`` calls of ``fn`` (after one), the ``top`` entries by ``sort``."""
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(sort).print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    B, H, S, D, block, specs = suite_patterns()  # the suite's patterns, as it builds them
    parser.add_argument("--pattern", default="local1024", choices=sorted(specs))
    parser.add_argument("--shape", type=int, nargs=4, default=[B, H, S, D])
    parser.add_argument("--methods", nargs="+", default=["tilesparse", "tilesparse_atomic", "flex"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    B, H, S, D = args.shape
    q, k, v, g = qkv_and_grad((B, H, S, D))
    rows = []
    for method, fns in pattern_methods(specs[args.pattern], args.methods, q, k, v, g, block):
        for op, fn in zip(("fwd", "fwd_bwd"), fns):
            row = {"method": method, "op": op, "pattern": args.pattern}
            row["eager_ms"] = float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
            try:
                row["graph_ms"] = float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
            except Exception as exc:  # noqa: BLE001 (a probe: record and go on)
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            row["hot_ms"] = _hot_ms(fn, 20)
            row["host_ms"] = host_us(fn, n=50) / 1e3
            kernels = _profiled_kernels(fn, 5)
            row["kernels_ms"] = sum(kernels.values())
            row["kernels"] = {name: round(ms, 4) for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])}
            rows.append(row)
            print("  ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in row.items()), flush=True)
            if method != "flex" and op == "fwd_bwd":
                print(python_profile(fn), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
