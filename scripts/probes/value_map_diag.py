"""Diagnose value-map packing against torch._cslt_compress on the GPU: where the buffers
differ (value region, metadata, trailing slack), and whether the products agree, with
the default and the searched cuSPARSELt algorithm."""
import os
import torch
from tilesparse.semi24 import transposable_mask
from tilesparse.semi24.value_map import maps_for


def where_differ(a, b, n_values):
    d = (a.view(-1).view(torch.int16) != b.view(-1).view(torch.int16)).nonzero().squeeze(1)
    if d.numel() == 0:
        return "equal"
    return (f"{d.numel()} differ of {a.numel()}; first {int(d[0])} last {int(d[-1])}; "
            f"n_values {n_values}; in values {(d < n_values).sum().item()}")


def product_err(packed, wm, m, alg):
    a = torch.randn(m, wm.shape[1], device="cuda", dtype=wm.dtype)
    out = torch._cslt_sparse_mm(packed, a.t(), transpose_result=True, alg_id=alg)
    want = a.double() @ wm.double().t()
    return ((out.double() - want).norm() / want.norm()).item()


for dtype in (torch.bfloat16, torch.float16):
    for shape in ((512, 1024), (1024, 4096), (1024, 512)):
        w = torch.randn(*shape, device="cuda", dtype=dtype)
        mask = transposable_mask(w)
        maps = maps_for(mask, dtype, want_t=True)
        if maps is None or maps[1] is None:
            print(dtype, shape, "no maps", maps)
            continue
        w2 = torch.randn(*shape, device="cuda", dtype=dtype)
        wm2 = torch.where(mask, w2, torch.zeros_like(w2))
        for name, vm, dense in (("fwd", maps[0], wm2), ("bwd", maps[1], wm2.t().contiguous())):
            g = vm.pack(w2)
            c = torch._cslt_compress(dense)
            c2 = torch._cslt_compress(dense)
            print(dtype, shape, name, "packed", tuple(g.shape), "gather vs compress:", where_differ(g, c, vm.n_values),
                  "| compress vs compress:", where_differ(c, c2, vm.n_values))
            algs = [0]
            if dtype == torch.bfloat16:
                for m in (64, 4096):
                    a = torch.randn(m, dense.shape[1], device="cuda", dtype=dtype)
                    algs.append(int(torch._cslt_sparse_mm_search(c, a.t(), transpose_result=True)))
            for m in (64, 4096):
                for alg in sorted(set(algs)):
                    print(f"   m {m} alg {alg}: err gather {product_err(g, dense, m, alg):.2e} "
                          f"compress {product_err(c, dense, m, alg):.2e}")
