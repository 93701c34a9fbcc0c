"""Do the attention kernels slow down within one process, and why: the per-kernel device
time of forward + backward (torch.profiler) before and after each timing stage of
attention_gap.py (do_bench with its L2 flush, a CUDA-graph capture and replay, a pause),
with the SM clock, board power and whether the power cap holds the clock sampled beside it
(:func:`tilesparse.bench.env.clock_state`).

Why: on random 10 % (twenty-ninth session) the profiler put the kernels at 1.70 ms per
call in one process and 1.93 ms (every kernel 12-14 % slower, the forward too) in
attention_gap.py's, measured there after its graph capture; FlexAttention's moved 2.5 %.

    python scripts/probes/attention_drift.py --pattern random10 --out drift.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton.testing
from attention_inputs import pattern_methods, qkv_and_grad  # this folder's
from eager_gap import _profiled_kernels  # this folder's

from tilesparse.bench.attention import suite_patterns
from tilesparse.bench.env import clock_state


def main() -> None:
    parser = argparse.ArgumentParser()
    B, H, S, D, block, specs = suite_patterns()
    parser.add_argument("--pattern", default="random10", choices=sorted(specs))
    parser.add_argument("--methods", nargs="+", default=["tilesparse", "flex"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    q, k, v, g = qkv_and_grad((B, H, S, D))
    rows = []
    for method, fns in pattern_methods(specs[args.pattern], args.methods, q, k, v, g, block):
        fn = fns[1]

        def kernels(stage: str) -> None:
            fn()
            torch.cuda.synchronize()
            got = _profiled_kernels(fn, 20)
            row = {"method": method, "stage": stage, "kernels_ms": sum(got.values()), "clocks": clock_state(),
                   "kernels": {name: round(ms, 4) for name, ms in sorted(got.items(), key=lambda kv: -kv[1])}}
            rows.append(row)
            print(json.dumps(row), flush=True)

        kernels("first")
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        kernels(f"after do_bench ({ms:.3f} ms)")
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        kernels(f"after a second do_bench ({ms:.3f} ms)")
        ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        kernels(f"after do_bench_cudagraph ({ms:.3f} ms)")
        time.sleep(3)
        kernels("after 3 s idle")
        torch.cuda.empty_cache()
        kernels("after empty_cache")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
