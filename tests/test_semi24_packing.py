"""The one-pass W/Wᵀ packer for cuSPARSELt (semi24.packing): its guards on the CPU (with
stand-ins for the CUDA-only torch ops), and the real packing on the GPU (marked)."""

import warnings

import pytest
import torch

from tilesparse.semi24 import packing, transposable_mask
from tilesparse.semi24.linear import SemiSparseLinear, _is_tile24


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(packing, "_TILE_OK", {})
    monkeypatch.setenv("TILESPARSE_SEMI24_PACKER", "tile")  # opt-in (the default is _cslt_compress)


class _FakeOps:
    """Stand-ins for torch's cuSPARSELt ops on the CPU: a 'packing' is the masked matrix
    itself (1-D for the tile packer, as torch's is), the product a plain matmul.
    ``tile_error`` makes the tile packer raise; ``tile_wrong`` makes it drop a value."""

    def __init__(self, tile_error=False, tile_wrong=False):
        self.tile_error, self.tile_wrong, self.calls = tile_error, tile_wrong, {"tile": 0, "cslt": 0}

    def install(self, monkeypatch):
        monkeypatch.setattr(torch, "_cslt_compress", self.cslt, raising=False)
        monkeypatch.setattr(torch, "_sparse_semi_structured_tile", self.tile, raising=False)
        monkeypatch.setattr(torch, "_cslt_sparse_mm", lambda packed, b: packed @ b, raising=False)

    def cslt(self, w):
        self.calls["cslt"] += 1
        return w.clone()

    def tile(self, w, algorithm="", use_cutlass=True):
        self.calls["tile"] += 1
        if self.tile_error:
            raise RuntimeError("not supported")
        packed, packed_t = w.clone(), w.t().contiguous()
        if self.tile_wrong:
            packed.view(-1)[packed.flatten().nonzero()[0]] = 0
        return packed.flatten(), None, packed_t.flatten(), None, None


def _masked_weight(n=16, k=32):
    w = torch.randn(n, k)
    return torch.where(transposable_mask(w), w, torch.zeros_like(w))


def test_tile_packing_is_checked_once_then_used(monkeypatch):
    ops = _FakeOps()
    ops.install(monkeypatch)
    wm = _masked_weight()
    packed, packed_t = packing.compress_pair(wm, transposable=True, want_t=True)
    assert torch.equal(packed, wm) and torch.equal(packed_t, wm.t())
    assert ops.calls == {"tile": 1, "cslt": 2}  # the first use compares against _cslt_compress
    packing.compress_pair(wm, transposable=True, want_t=True)
    assert ops.calls == {"tile": 2, "cslt": 2}
    packed, packed_t = packing.compress_pair(wm, transposable=True, want_t=False)
    assert packed_t is None and packed.shape == wm.shape


@pytest.mark.parametrize("fault", ["tile_error", "tile_wrong"])
def test_a_failing_or_disagreeing_tile_packer_warns_once_and_falls_back(monkeypatch, fault):
    ops = _FakeOps(**{fault: True})
    ops.install(monkeypatch)
    wm = _masked_weight()
    with pytest.warns(UserWarning, match="_cslt_compress"):
        packed, packed_t = packing.compress_pair(wm, transposable=True, want_t=True)
    assert torch.equal(packed, wm) and torch.equal(packed_t, wm.t().contiguous())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed, _ = packing.compress_pair(wm, transposable=True, want_t=True)
    assert torch.equal(packed, wm) and ops.calls["tile"] == 1


def test_non_transposable_masks_and_the_default_use_cslt(monkeypatch):
    ops = _FakeOps()
    ops.install(monkeypatch)
    wm = _masked_weight()
    packing.compress_pair(wm, transposable=False, want_t=True)
    monkeypatch.delenv("TILESPARSE_SEMI24_PACKER")
    packing.compress_pair(wm, transposable=True, want_t=False)
    assert ops.calls == {"tile": 0, "cslt": 3}


def test_is_tile24_checks_rows_and_columns_of_every_tile():
    w = torch.randn(8, 12)
    assert bool(_is_tile24(transposable_mask(w)))
    rows_only = torch.zeros(8, 12, dtype=torch.bool)
    rows_only[:, :2] = True  # 2:4 along rows, but all 4 rows of a tile keep columns 0 and 1
    assert not bool(_is_tile24(rows_only))
    assert not bool(_is_tile24(rows_only.t().contiguous()))
    assert not bool(_is_tile24(torch.ones(8, 10, dtype=torch.bool)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(512, 1024), (4096, 1024), (1024, 4096)])
def test_gpu_packings_always_give_the_right_products(dtype, shape):
    """Whatever the opt-in tile packer does on this GPU (on the H200 its layout is not
    cuSPARSELt's: it is detected and replaced, with a warning), compress_pair's packings
    give (W⊙M) B and (W⊙M)ᵀ B'."""
    wm = torch.randn(*shape, device="cuda", dtype=dtype)
    wm = torch.where(transposable_mask(wm), wm, torch.zeros_like(wm))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packed, packed_t = packing.compress_pair(wm, transposable=True, want_t=True)
    tile_ok = packing._TILE_OK[(tuple(wm.shape), dtype, str(wm.device))]
    assert tile_ok or any("disagreed" in str(w.message) or "failed" in str(w.message) for w in caught)
    b = torch.randn(shape[1], 96, device="cuda", dtype=dtype)
    bt = torch.randn(shape[0], 96, device="cuda", dtype=dtype)
    want = wm.double() @ b.double()
    want_t = wm.double().t() @ bt.double()
    for got, ref in ((torch._cslt_sparse_mm(packed, b), want), (torch._cslt_sparse_mm(packed_t, bt), want_t)):
        assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_gpu_module_products_with_the_default_packer(monkeypatch):
    monkeypatch.delenv("TILESPARSE_SEMI24_PACKER")
    m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    y = m(x)
    assert m._tile24 and not packing._TILE_OK  # transposable mask seen; the tile packer not tried
    wm = (m.weight.detach() * m.mask).double()
    want = x.double() @ wm.t() + m.bias.detach().double()
    assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
