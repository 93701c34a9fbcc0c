"""Host time with and without the direct launch path (tilesparse.kernels._launch), in one
process, the two modes interleaved round by round so drifts in the shared host's load
fall on both; medians over the rounds.

The device host's timings swing by +-30 % from run to run, so separate runs with
TILESPARSE_FAST_LAUNCH=0 and =1 could not show a ~15 µs per launch difference.

    python scripts/probes/launch_ab.py --rounds 15 --out launch_ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from host_cases import host_cases
from tilesparse.bench.timing import host_us
from tilesparse.kernels import _launch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default="launch_ab.json")
    args = p.parse_args()
    fns = host_cases(torch.device("cuda"), torch.bfloat16)
    samples = {name: {"direct": [], "triton": []} for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            for mode, enabled in (("direct", True), ("triton", False), ("triton", False), ("direct", True)):
                _launch._ENABLED = enabled
                samples[name][mode].append(host_us(fn, args.calls))
    _launch._ENABLED = _launch.enabled()
    rows = []
    for name, by_mode in samples.items():
        direct, triton_ = statistics.median(by_mode["direct"]), statistics.median(by_mode["triton"])
        rows.append({"case": name, "direct_us": direct, "triton_us": triton_, "saved_us": triton_ - direct})
        print(f"{name:48s} direct {direct:7.1f} us   Triton's launch {triton_:7.1f} us   saved {triton_ - direct:6.1f}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rounds": args.rounds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
