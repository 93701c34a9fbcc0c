"""Compress a 2:4 weight for cuSPARSELt, and its transpose, as cheaply as possible.

``torch._cslt_compress`` costs ~1.45 ms per 16384x4096 bf16 weight on an H200 (45 % of
its GEMM; twice per weight when bprop needs Wᵀ too). ``torch._sparse_semi_structured_tile``
packs W and Wᵀ together in one pass (~0.25 ms for both, /work/shared/anchors). It prunes
each 4x4 tile greedily to 2 per row and column, keeping the largest magnitudes first; on
W⊙M with M a transposable 2:4 mask, every kept value is nonzero and no row or column of a
tile holds more than two, so the greedy pass keeps exactly W⊙M's nonzeros: the packing
of the same matrix. Its output is 1-D; cuSPARSELt reads it as [rows, -1].

On the H200 (torch 2.11, cuSPARSELt 0.8) that packing is NOT cuSPARSELt's: its products
with ``torch._cslt_sparse_mm`` were wrong (relative error 1.07, scripts/probes/tile_packer.py;
torch marks the layout as unverified). So ``_cslt_compress`` is what this module uses by
default (after a weight update under an unchanged mask, :mod:`~tilesparse.semi24.value_map`
repacks by a gather instead), and the tile packer is opt-in
(``TILESPARSE_SEMI24_PACKER=tile``), for GPUs where it holds: its first
use per (shape, dtype, device) checks it against ``_cslt_compress`` through one product
each, and a mismatch (or a failure of the tile kernel) warns once and keeps
``_cslt_compress`` for that key, so it is never silently wrong.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from .._env import choice

# TILESPARSE_SEMI24_PACKER: the value-map repacker (default; :mod:`~tilesparse.semi24.value_map`), cuSPARSELt's
# compress every time, or the tile packer
PACKERS = ("map", "cslt", "tile")
DEFAULT_PACKER = "map"

_TILE_OK: dict[tuple, bool] = {}


def _cslt_pair(wm: torch.Tensor, want_t: bool):
    packed = torch._cslt_compress(wm.contiguous())
    return packed, (torch._cslt_compress(wm.t().contiguous()) if want_t else None)


def _tile_pair(wm: torch.Tensor):
    packed, _, packed_t, _, _ = torch._sparse_semi_structured_tile(wm.contiguous(), algorithm="", use_cutlass=False)
    return packed.view(wm.shape[0], -1), packed_t.view(wm.shape[1], -1)


def _same_products(wm: torch.Tensor, tile, cslt) -> bool:
    """The two packings give the same products (W⊙M) B and (W⊙M)ᵀ B' on random B."""
    gen = torch.Generator(device=wm.device).manual_seed(0)
    for got, want, inner in ((tile[0], cslt[0], wm.shape[1]), (tile[1], cslt[1], wm.shape[0])):
        if want is None:
            continue
        if got.shape != want.shape:
            return False
        b = torch.randn(inner, 64, generator=gen, device=wm.device, dtype=wm.dtype)
        if not torch.equal(torch._cslt_sparse_mm(got, b), torch._cslt_sparse_mm(want, b)):
            return False
    return True


def compress_pair(wm: torch.Tensor, *, transposable: bool, want_t: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(compressed W⊙M, compressed (W⊙M)ᵀ or None) for ``torch._cslt_sparse_mm``.

    ``wm`` is the masked weight on a CUDA device; ``transposable`` says its mask is 2:4
    in rows and in columns of every 4x4 tile (the tile packer needs that); ``want_t``
    asks for the transpose's packing too (bprop)."""
    if not transposable or choice("TILESPARSE_SEMI24_PACKER", DEFAULT_PACKER, PACKERS) != "tile":
        return _cslt_pair(wm, want_t)
    key = (tuple(wm.shape), wm.dtype, str(wm.device))
    ok = _TILE_OK.get(key)
    if ok is False:
        return _cslt_pair(wm, want_t)
    try:
        tile = _tile_pair(wm)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        _TILE_OK[key] = False
        warnings.warn(f"tilesparse.semi24: the one-pass W/Wᵀ packer failed for {key[:2]} ({type(exc).__name__}: "
                      f"{exc}); using torch._cslt_compress (slower)", stacklevel=3)
        return _cslt_pair(wm, want_t)
    if ok is None:
        ok = _TILE_OK[key] = _same_products(wm, tile, _cslt_pair(wm, True))
        if not ok:
            warnings.warn(f"tilesparse.semi24: the one-pass W/Wᵀ packing disagreed with torch._cslt_compress for "
                          f"{key[:2]}; using torch._cslt_compress (slower)", stacklevel=3)
            return _cslt_pair(wm, want_t)
    return tile[0], (tile[1] if want_t else None)
