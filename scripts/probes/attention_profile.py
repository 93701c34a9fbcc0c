"""Per-kernel GPU time of block-sparse attention forward + backward (torch.profiler),
next to FlexAttention's on the identical mask: where the backward's time goes.

    python scripts/probes/attention_profile.py [--layouts causal local1024]
"""
import argparse

import torch
from attention_inputs import qkv_and_grad  # this folder's
from torch.profiler import ProfilerActivity, profile

from tilesparse.attention import layouts
from tilesparse.bench.attention import _make_fns

parser = argparse.ArgumentParser()
parser.add_argument("--layouts", nargs="+", default=["local1024", "causal"])
parser.add_argument("--shape", type=int, nargs=4, default=[4, 16, 8192, 128])
args = parser.parse_args()
B, H, S, D = args.shape
b = 128
q, k, v, g = qkv_and_grad((B, H, S, D))
builders = {"local1024": lambda: (layouts.local(S, b, 1024, causal=True), True),
            "causal": lambda: (layouts.causal(S, b), True),
            "strided": lambda: (layouts.strided(S, b, 1024), True)}


def kernel_table(fn, label, reps=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time_total / reps / 1e3
    print(f"-- {label}: {sum(totals.values()):.3f} ms of kernels per call")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {ms:8.3f} ms  {name[:110]}")


for name in args.layouts:
    layout, causal = builders[name]()
    for method in ("tilesparse", "tilesparse_atomic", "flex"):
        fns, why = _make_fns(method, q, k, v, layout, causal, name, g)
        if fns is None:
            print(f"{method} {name}: {why}")
            continue
        kernel_table(fns[1], f"{method} {name} forward + backward")
