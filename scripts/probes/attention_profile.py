"""Per-kernel GPU time of block-sparse attention forward + backward (torch.profiler),
next to FlexAttention's on the identical mask: where the backward's time goes.

    python scripts/probes/attention_profile.py [--layouts causal local1024 random10]

The layouts are the attention suite's patterns (tilesparse.bench.attention.suite_patterns),
on its first shape unless --shape says otherwise.
"""
import argparse

import torch
from attention_inputs import pattern_methods, qkv_and_grad  # this folder's
from eager_gap import _profiled_kernels  # this folder's

from tilesparse.bench.attention import suite_patterns

*suite_shape, block, specs = suite_patterns()
parser = argparse.ArgumentParser()
parser.add_argument("--layouts", nargs="+", default=["local1024", "causal"], choices=sorted(specs))
parser.add_argument("--shape", type=int, nargs=4, default=suite_shape, metavar=("B", "H", "S", "D"))
args = parser.parse_args()
B, H, S, D = args.shape
q, k, v, g = qkv_and_grad((B, H, S, D))


def kernel_table(fn, label, reps=20):
    """Each kernel's device time per call of ``fn`` (eager_gap's profiler sums: its
    key_averages also count the backward's kernels, launched from autograd's thread)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    totals = _profiled_kernels(fn, reps)
    print(f"-- {label}: {sum(totals.values()):.3f} ms of kernels per call")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {ms:8.3f} ms  {name}")

for name in args.layouts:
    for method, fns in pattern_methods(specs[name], ("tilesparse", "tilesparse_atomic", "flex"), q, k, v, g, block):
        kernel_table(fns[1], f"{method} {name} forward + backward")
