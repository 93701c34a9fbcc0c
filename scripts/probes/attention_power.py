"""Power, SM clock and energy per call of attention forward + backward under sustained
load: each method called back to back for a few seconds while nvidia-smi samples the
board every 50 ms.

Why: the twenty-ninth session found our kernels power-capped under the suite's timing
(throttle reason "SW power cap", SM clock 1770-1830 MHz, every kernel 10-13 % slower
than after an idle pause) while FlexAttention's stayed near 1965 MHz. Under a power cap
what decides the ratio is energy per call, not the kernels' latency at full clock.

    python scripts/probes/attention_power.py --patterns random10 local1024 --out power.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch
from attention_inputs import pattern_methods, qkv_and_grad  # this folder's

from tilesparse.bench.attention import suite_patterns
from tilesparse.bench.env import CLOCK_QUERY, nvidia_smi_target, parse_clock_state


def parse_samples(text: str) -> list[dict]:
    """The readings (:func:`tilesparse.bench.env.parse_clock_state`: SM MHz, watts, whether
    the SW power cap holds the clock) of each line nvidia-smi printed for ``CLOCK_QUERY``
    (csv, no header, no units); lines missing a field (N/A, a partial last line) skipped."""
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines = lines[:-1]  # cut off by the sampler's end: its fields may be cut short, not just missing
    readings = (parse_clock_state(line) for line in lines)
    return [r for r in readings if r is not None and None not in r.values()]


def summarize(samples: list[dict], elapsed_s: float, calls: int) -> dict:
    """ms per call, median power (W) and SM clock (MHz), the share of samples with the SW
    power cap among the throttle reasons (``power_capped_share``), energy per call (mJ = W x ms)."""
    if not samples or calls < 1:
        raise ValueError(f"need samples and calls, got {len(samples)} samples, {calls} calls")
    ms = elapsed_s / calls * 1e3
    watts = statistics.median(s["watts"] for s in samples)
    return {"ms_per_call": ms, "watts": watts, "sm_mhz": statistics.median(s["sm_mhz"] for s in samples),
            "power_capped_share": sum(s["power_capped"] for s in samples) / len(samples), "mj_per_call": watts * ms,
            "samples": len(samples)}


def sustained(fn, seconds: float, rest: float = 1.0) -> dict:
    """After ``rest`` s idle (each case starts from a board that has cooled off), call ``fn``
    back to back for ``seconds`` (after 1 s of the same as warm-up) with nvidia-smi
    sampling every 50 ms: :func:`summarize` of it."""
    time.sleep(rest)
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={CLOCK_QUERY}", "--format=csv,noheader,nounits", "-lms", "50",
                            *(nvidia_smi_target() or [])], stdout=subprocess.PIPE, text=True)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    smi.terminate()
    samples = parse_samples(smi.communicate()[0])
    return summarize(samples[2:] or samples, elapsed, calls)  # the first samples may predate the loop


def main() -> None:
    parser = argparse.ArgumentParser()
    B, H, S, D, block, specs = suite_patterns()
    parser.add_argument("--patterns", nargs="+", default=["random10", "local1024"], choices=sorted(specs))
    parser.add_argument("--methods", nargs="+", default=["tilesparse", "tilesparse_atomic", "flex"])
    parser.add_argument("--ops", nargs="+", default=["fwd_bwd"], choices=["fwd", "fwd_bwd"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    limit = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,power.default_limit,power.max_limit",
                            "--format=csv,noheader", *(nvidia_smi_target() or [])],
                           capture_output=True, text=True).stdout.strip()
    print(f"power limit, default, max: {limit}")
    q, k, v, g = qkv_and_grad((B, H, S, D))
    rows = []
    for pattern in args.patterns:
        for method, fns in pattern_methods(specs[pattern], args.methods, q, k, v, g, block):
            for op in args.ops:
                row = {"pattern": pattern, "method": method, "op": op,
                       **sustained(fns[op == "fwd_bwd"], args.seconds, rest=2.0)}  # each from an idle board
                rows.append(row)
                print("  ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                                for key, value in row.items()), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "power_limit": limit,
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
