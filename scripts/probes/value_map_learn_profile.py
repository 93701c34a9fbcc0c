"""Where does learning a new mask's value maps go (9.3 ms per 16384x4096 bf16 weight on
the H200, sixth session, against ~3 ms for its two compressions)? Profiles
``maps_for(mask, want_t=True)`` for a shape already known row-major (the one-pass
learn) with torch.profiler: GPU kernels and the host's own time, top entries of each.

    python scripts/probes/value_map_learn_profile.py [--shape 16384x4096]
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from tilesparse.semi24 import transposable_mask
from tilesparse.semi24.value_map import maps_for

p = argparse.ArgumentParser()
p.add_argument("--shape", default="16384x4096")
args = p.parse_args()
n, k = map(int, args.shape.split("x"))
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
w[w == 0] = 1.0  # no kept zeros (either zero of a group may be kept)
mask = transposable_mask(w)
maps_for(mask, w.dtype, want_t=True)  # first: full decode, learns that the shape is row-major
for _ in range(2):
    maps_for(mask, w.dtype, want_t=True)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(5):
    maps_for(mask, w.dtype, want_t=True)
torch.cuda.synchronize()
print(f"maps_for (one-pass learn, W and Wt): {(time.perf_counter() - start) / 5 * 1e3:.2f} ms per call")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        maps_for(mask, w.dtype, want_t=True)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
