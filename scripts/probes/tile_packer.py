"""Does torch's one-pass W/Wᵀ packer (torch._sparse_semi_structured_tile, use_cutlass=False)
produce what torch._cslt_compress produces on this GPU? Prints shapes, byte equality of
values and metadata, and the products' agreement. Diagnostic for semi24.packing."""

import torch

from tilesparse.semi24 import transposable_mask

for dtype in (torch.bfloat16, torch.float16):
    w = torch.randn(512, 1024, device="cuda", dtype=dtype)
    wm = torch.where(transposable_mask(w), w, torch.zeros_like(w))
    ref = torch._cslt_compress(wm)
    try:
        packed, meta, packed_t, meta_t, bitmask = torch._sparse_semi_structured_tile(wm, algorithm="", use_cutlass=False)
    except Exception as exc:  # noqa: BLE001
        print(dtype, "tile failed:", type(exc).__name__, str(exc)[:300])
        continue
    print(dtype, "cslt", tuple(ref.shape), ref.dtype, "tile", tuple(packed.shape), packed.dtype,
          "meta", None if meta is None else tuple(meta.shape))
    flat_ref, flat = ref.flatten(), packed.flatten()
    n_vals = wm.numel() // 2
    print("  sizes", flat_ref.numel(), flat.numel(), "values equal:",
          torch.equal(flat_ref[:n_vals], flat[:n_vals]) if flat.numel() == flat_ref.numel() else "n/a",
          "all equal:", torch.equal(flat_ref, flat) if flat.numel() == flat_ref.numel() else "n/a")
    if flat.numel() == flat_ref.numel():
        diff = (flat_ref.view(torch.int16) != flat.view(torch.int16)).nonzero().flatten()
        print("  first differing int16 slots:", diff[:8].tolist(), "of", diff.numel())
        b = torch.randn(1024, 64, device="cuda", dtype=dtype)
        got = torch._cslt_sparse_mm(packed.view(ref.shape), b)
        want = torch._cslt_sparse_mm(ref, b)
        print("  product rel diff:", ((got.float() - want.float()).norm() / want.float().norm()).item())
