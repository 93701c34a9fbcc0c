"""Host time per call of SemiSparseLinear at inference (sparse and auto modes) against
F.linear, on a problem small enough that the host can bound it (8192x4096x4096), and
a cProfile of the sparse call: where the Python time goes."""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

from tilesparse.semi24 import SemiSparseLinear

x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
layers = {mode: SemiSparseLinear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16, mode=mode).eval()
          for mode in ("sparse", "auto")}


def host_us(fn, n=200):
    with torch.no_grad():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
        total = (time.perf_counter() - start) / n * 1e6
    return host, total


w = layers["sparse"].weight.detach()
print("F.linear        host %.1f us, with GPU %.1f us" % host_us(lambda: F.linear(x, w)))
for mode, layer in layers.items():
    print(f"{mode:15} host %.1f us, with GPU %.1f us" % host_us(lambda: layer(x)))
with torch.no_grad():
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        layers["sparse"](x)
    prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)

# What the dispatcher timed for the auto layer (back to back), against the same timer
# run on the module calls themselves: the module's own host cost is not in its timing.
from tilesparse.semi24 import dispatch  # noqa: E402
from tilesparse.semi24.cusparselt import cslt_product  # noqa: E402

disp = dispatch.default_dispatcher()
print("dispatcher entries:", {k.split("|torch")[0]: v for k, v in disp._load().items()})
packed, _ = layers["sparse"]._compressed()
with torch.no_grad():
    for name, fn in (("cslt_product", lambda: cslt_product(packed, x, None)),
                     ("F.linear", lambda: F.linear(x, w)),
                     ("layer sparse", lambda: layers["sparse"](x)),
                     ("layer auto", lambda: layers["auto"](x))):
        print(f"{name:14} back to back {dispatch._do_bench(fn):.3f} ms")
