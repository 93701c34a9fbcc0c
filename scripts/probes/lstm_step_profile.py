"""Where does an eager BlockSparseLSTM timestep go on the GPU machine: host or kernels?

The 9f8dfe6 A/B (step plans on, b 16, density 0.25, batch 32) timed the forward at 90 µs per
timestep at H 2048 and 51 at H 4096, H 2048 first in the process. This times each hidden size's
forward (no grad) and training step as the suite does (median of do_bench), then profiles a few
calls: the kernels' summed device time per timestep against the wall time per timestep (host-bound
where the kernels are a small part), the kernels by device time, and the host's busiest ops.
Hidden sizes run in the order given, so a size listed twice shows any first-case effect.

    python scripts/probes/lstm_step_profile.py --hidden 2048 4096 2048 --batch 32 --block 16 --density 0.25
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

import tilesparse as ts
from tilesparse.bench.timing import bench_ms


def _kernel_us(prof, calls: int, steps: int) -> tuple[float, list]:
    """(summed device µs of the kernels per timestep, [(kernel, µs per timestep, launches per timestep)])."""
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(event, "self_cuda_time_total", 0)
        if device_us > 0 and event.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((event.key[:70], device_us / calls / steps, event.count / calls / steps))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def _host_ops(prof, calls: int, steps: int, top: int) -> list:
    """The host ops with the most self CPU time, µs per timestep."""
    rows = [(e.key[:70], e.self_cpu_time_total / calls / steps, e.count / calls / steps)
            for e in prof.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def _profile_hidden(hidden: int, args, dtype, device, activities) -> list[dict]:
    """The forward's and the training step's rows for one hidden size."""
    steps = args.steps
    torch.manual_seed(0)
    model = ts.nn.BlockSparseLSTM(hidden, hidden, block_size=args.block, density=args.density,
                                  sparse_input=True, input_density=args.density).to(device, dtype)
    x = torch.randn(steps, args.batch, hidden, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(steps, args.batch, hidden, device=device, dtype=dtype)

    def forward():
        with torch.no_grad():
            model(x)

    def step():
        out = model(x)[0]
        torch.autograd.grad(out, [x, *model.parameters()], grad_out)

    results = []
    for name, fn in (("forward", forward), ("step", step)):
        fn()
        ms = bench_ms(fn, cuda=device.type == "cuda")
        with profile(activities=activities) as prof:
            for _ in range(args.calls):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
        kernel_us, kernels = _kernel_us(prof, args.calls, steps)
        host = _host_ops(prof, args.calls, steps, 12)
        row = dict(hidden=hidden, batch=args.batch, block=args.block, density=args.density, op=name,
                   wall_us_per_step=ms * 1000 / steps, kernel_us_per_step=kernel_us,
                   kernels=kernels[:12], host_ops=host)
        results.append(row)
        print(f"H {hidden} {name}: wall {row['wall_us_per_step']:.1f} µs/step, kernels {kernel_us:.1f} µs/step")
        for key, us, count in kernels[:8]:
            print(f"   gpu  {us:7.2f} µs x{count:4.2f}  {key}")
        for key, us, count in host[:8]:
            print(f"   host {us:7.2f} µs x{count:4.2f}  {key}")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096, 2048])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--density", type=float, default=0.25)
    p.add_argument("--calls", type=int, default=5, help="profiled calls per op")
    p.add_argument("--out", help="JSON file for the numbers")
    p.add_argument("--device", default="cuda", help="cuda (the point), or cpu for a smoke run")
    args = p.parse_args()
    dtype, device = torch.bfloat16, torch.device(args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    results = []
    for hidden in args.hidden:
        results += _profile_hidden(hidden, args, dtype, device, activities)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__, results=results), f, indent=1)


if __name__ == "__main__":
    main()
