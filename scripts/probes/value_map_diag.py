"""Diagnose value-map learning against torch._cslt_compress on the GPU: learn the maps for
several shapes and masks, several times each (the allocator's leftovers differ between
runs), print why a map was refused, and where the gathered buffer differs from a
compression (value region, metadata, trailing padding)."""
import torch
from tilesparse.semi24 import transposable_mask, transposable_prune
from tilesparse.semi24.value_map import ValueMapError, learn_value_map


def where_differ(a, b, n_values):
    d = (a.view(-1).view(torch.int16) != b.view(-1).view(torch.int16)).nonzero().squeeze(1)
    if d.numel() == 0:
        return "equal"
    return (f"{d.numel()} differ of {a.numel()}; first {int(d[0])} last {int(d[-1])}; "
            f"in values {(d < n_values).sum().item()}")


junk = [torch.randn(1 << 24, device="cuda") for _ in range(4)]  # leave non-zero leftovers in the allocator
del junk
for dtype in (torch.bfloat16, torch.float16):
    for shape in ((512, 1024), (1024, 4096), (16384, 4096), (4096, 16384)):
        for trial in range(3):
            w = torch.randn(*shape, device="cuda", dtype=dtype)
            mask = transposable_mask(w) if trial < 2 else transposable_prune(w)[0] != 0
            for transposed in (False, True):
                try:
                    vm = learn_value_map(mask, dtype, transposed=transposed)
                except ValueMapError as exc:
                    print(dtype, shape, trial, "T" if transposed else "W", "REFUSED:", exc)
                    continue
                w2 = torch.randn(*shape, device="cuda", dtype=dtype)
                wm2 = torch.where(mask, w2, torch.zeros_like(w2))
                dense = wm2.t().contiguous() if transposed else wm2
                g, c = vm.pack(w2), torch._cslt_compress(dense)
                print(dtype, shape, trial, "T" if transposed else "W", "ok; gather vs compress:",
                      where_differ(g, c, vm.n_values), "| numel", g.numel(), "values", vm.n_values)
