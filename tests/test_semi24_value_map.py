"""semi24.value_map: learning where cuSPARSELt puts each kept value, so that a weight
update under the same mask is repacked by one gather. On the CPU against a stand-in
compressor with its own (deliberately scrambled) layout; on the GPU against
torch._cslt_compress itself (marked)."""

import warnings

import pytest
import torch

from tilesparse.semi24 import transposable_mask
from tilesparse.semi24.value_map import build_value_map, maps_for


def fake_compress(dense: torch.Tensor) -> torch.Tensor:
    """A 2:4 'compressor' with a layout of its own: the kept values of each group of 4,
    visited group-column-major (not row-major), then one int16 of metadata per group
    (the kept positions as bits): [rows, cols / 2 + cols / 4] in the input's dtype."""
    rows, cols = dense.shape
    groups = dense.reshape(rows, cols // 4, 4)
    kept = groups != 0
    order = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)[..., :2]  # the 2 kept, in position order
    values = torch.gather(groups, -1, order)  # [rows, G, 2]
    values = values.transpose(0, 1).reshape(-1)  # group-column-major
    meta = (kept.to(torch.int16) * torch.tensor([1, 2, 4, 8], dtype=torch.int16)).sum(-1).reshape(-1)
    return torch.cat([values, meta.view(dense.dtype)]).view(rows, -1)


def _nonzero_randn(shape, dtype=torch.float16):
    """Random values without exact zeros: randn rounds to 0 in fp16 now and then (1 run in
    ~400 at 128 x 256), and a kept zero lets the compressor, which reads kept positions from
    the nonzeros, pick another pair of its group, so bitwise equality needs none."""
    w = torch.randn(*shape).to(dtype)
    return torch.where(w == 0, torch.ones_like(w), w)


def _masked(shape, dtype=torch.float16):
    w = _nonzero_randn(shape, dtype)
    mask = transposable_mask(w)
    return w, mask


@pytest.mark.parametrize("shape", [(16, 32), (128, 256)], ids=["one_pass", "two_passes"])
def test_gathered_packing_equals_compression(shape):
    w, mask = _masked(shape)
    forward, backward = maps_for(mask, w.dtype, want_t=True, compress=fake_compress)
    wm = torch.where(mask, w, torch.zeros_like(w))
    assert torch.equal(forward.pack(w).view(torch.int16), fake_compress(wm).view(torch.int16))
    assert torch.equal(backward.pack(w).view(torch.int16), fake_compress(wm.t().contiguous()).view(torch.int16))
    w2 = _nonzero_randn(shape, w.dtype)  # an update under the same mask: one gather
    wm2 = torch.where(mask, w2, torch.zeros_like(w2))
    assert torch.equal(forward.pack(w2).view(torch.int16), fake_compress(wm2).view(torch.int16))
    assert forward.index.dtype == torch.int32 and forward.n_values == shape[0] * shape[1] // 2


def row_major_compress(dense: torch.Tensor) -> torch.Tensor:
    """A compressor that stores the kept values in row-major order (as cuSPARSELt does on
    the H200), then one int16 of metadata per group."""
    rows, cols = dense.shape
    groups = dense.reshape(rows, cols // 4, 4)
    kept = groups != 0
    order = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)[..., :2]
    values = torch.gather(groups, -1, order).reshape(-1)
    meta = (kept.to(torch.int16) * torch.tensor([1, 2, 4, 8], dtype=torch.int16)).sum(-1).reshape(-1)
    return torch.cat([values, meta.view(dense.dtype)]).view(rows, -1)


def test_a_row_major_placement_is_learned_once_per_shape_then_checked_in_one_pass():
    calls = []

    def counting(dense):
        calls.append(1)
        return row_major_compress(dense)

    shape = (64, 128)
    for trial in range(3):
        w, mask = _masked(shape)
        calls.clear()
        value_map = build_value_map(mask, torch.float16, compress=counting)
        assert len(calls) == (2 if trial == 0 else 1)  # decoded (1 digit + check) the first time only
        assert (value_map.index is None) == (trial > 0)  # then packed from the mask, no index held
        w2 = _nonzero_randn(shape)
        wm2 = torch.where(mask, w2, torch.zeros_like(w2))
        assert torch.equal(value_map.pack(w2).view(torch.int16), row_major_compress(wm2).view(torch.int16))


def test_a_row_major_packer_that_disagrees_keeps_the_index(monkeypatch):
    from tilesparse.semi24 import value_map as vm

    shape = (32, 64)
    build_value_map(_masked(shape)[1], torch.float16, compress=row_major_compress)  # decoded: row-major

    def wrong(weight, mask, out, transposed):
        out.zero_()

    monkeypatch.setattr(vm, "pack_row_major", wrong)
    w, mask = _masked(shape)
    with pytest.warns(UserWarning, match="row-major 2:4 packing kernel is not used"):
        value_map = build_value_map(mask, torch.float16, compress=row_major_compress)
    assert value_map.index is not None
    wm = torch.where(mask, w, torch.zeros_like(w))
    assert torch.equal(value_map.pack(w).view(torch.int16), row_major_compress(wm).view(torch.int16))


def test_a_mask_changed_in_place_after_learning_is_refused():
    """A row-major map packs from the live mask but holds a copy of its metadata: packing
    after the mask changed in place would mix two masks, silently."""
    shape = (32, 64)
    build_value_map(_masked(shape)[1], torch.float16, compress=row_major_compress)  # decoded: row-major
    w, mask = _masked(shape)
    value_map = build_value_map(mask, torch.float16, compress=row_major_compress)
    assert value_map.index is None
    mask.copy_(_masked(shape)[1])
    with pytest.raises(RuntimeError, match="mask changed in place"):
        value_map.pack(w)


def test_a_mask_that_breaks_the_row_major_pattern_is_decoded_instead():
    """The one-pass check must catch a placement that differs for a later mask."""
    state = {"scrambled": False}

    def changing(dense):
        return fake_compress(dense) if state["scrambled"] else row_major_compress(dense)

    shape = (32, 64)
    build_value_map(_masked(shape)[1], torch.float16, compress=changing)  # row-major: learned as such
    state["scrambled"] = True
    w, mask = _masked(shape)
    value_map = build_value_map(mask, torch.float16, compress=changing)
    wm = torch.where(mask, w, torch.zeros_like(w))
    assert torch.equal(value_map.pack(w).view(torch.int16), fake_compress(wm).view(torch.int16))


def test_a_mask_that_is_not_exactly_two_of_four_is_refused():
    _, mask = _masked((16, 32))
    mask[0, :4] = torch.tensor([True, False, False, False])
    assert build_value_map(mask, torch.float16, compress=fake_compress) is None
    assert maps_for(mask, torch.float16, want_t=True, compress=fake_compress) is None


def test_uninitialised_padding_after_the_metadata_is_ignored():
    """torch allocates the compressed buffer in whole rows; the tail past the metadata is
    garbage and may differ between passes."""
    w, mask = _masked((32, 64))
    calls = []

    def padded(dense):
        out = fake_compress(dense).reshape(-1)
        pad = torch.full((5,), float(len(calls) + 1), dtype=dense.dtype)  # differs per call
        calls.append(1)
        return torch.cat([out, pad])

    value_map = build_value_map(mask, torch.float16, compress=padded)
    assert value_map is not None and len(calls) == 2
    wm = torch.where(mask, w, torch.zeros_like(w))
    n = value_map.n_values
    assert torch.equal(value_map.pack(w).reshape(-1)[:n].view(torch.int16),
                       fake_compress(wm).reshape(-1)[:n].view(torch.int16))


@pytest.mark.parametrize("fault", ["values_altered", "meta_depends_on_values", "too_short", "order_dependent"])
def test_a_compressor_that_breaks_the_assumptions_is_refused(fault):
    _, mask = _masked((32, 64))

    def broken(dense):
        out = fake_compress(dense)
        if fault == "values_altered":
            return out * 2  # codes come back changed
        if fault == "meta_depends_on_values":
            flat = out.reshape(-1).clone()
            flat[dense.numel() // 2] = dense.reshape(-1)[mask.reshape(-1).nonzero()[0]]  # a value leaks in
            return flat.view(out.shape)
        if fault == "order_dependent":  # the value region sorted by value: placement follows the codes
            flat = out.reshape(-1).clone()
            n = dense.numel() // 2
            flat[:n] = torch.sort(flat[:n].view(torch.int16)).values.view(dense.dtype)
            return flat.view(out.shape)
        return out.reshape(-1)[: dense.numel() // 2]  # no metadata region

    assert build_value_map(mask, torch.float16, compress=broken) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(512, 1024), (1024, 4096)])
def test_gpu_gathered_packing_equals_cslt_compress(dtype, shape):
    """Two masks per shape: the first decoded in full (or, if an earlier test decoded
    this shape, already the one-pass learn), the second by the one-pass learn, which on
    the H200 packs with the row-major kernel and holds no index."""
    for trial in range(2):
        w = torch.randn(*shape, device="cuda", dtype=dtype)
        mask = transposable_mask(w)
        maps = maps_for(mask, dtype, want_t=True)
        assert maps is not None and maps[1] is not None, "cuSPARSELt's placement could not be learned"
        if trial == 1:
            assert maps[0].index is None and maps[1].index is None, "the row-major packer was not taken"
        w2 = torch.randn(*shape, device="cuda", dtype=dtype)
        # randn has exact zeros now and then (a few per 10^7 in bf16 on the H200); a kept zero
        # leaves cuSPARSELt free to pick either zero of its group, so bitwise equality needs none
        w2 = torch.where(w2 == 0, torch.ones_like(w2), w2)
        wm2 = torch.where(mask, w2, torch.zeros_like(w2))
        for value_map, dense in ((maps[0], wm2), (maps[1], wm2.t().contiguous())):
            got, want = value_map.pack(w2), torch._cslt_compress(dense)
            assert got.shape == want.shape
            n = value_map.n_values
            got_bits, want_bits = got.view(-1).view(torch.int16), want.view(-1).view(torch.int16)
            assert torch.equal(got_bits[:n], want_bits[:n]), "the packed values are not where cuSPARSELt puts them"
            # metadata equal up to the trailing row of allocation padding, which torch leaves
            # uninitialised (it differed once on the H200, fp16 1024x4096)
            assert torch.equal(got_bits[n:-dense.shape[0]], want_bits[n:-dense.shape[0]])
            a = torch.randn(64, dense.shape[1], device="cuda", dtype=dtype)
            assert torch.equal(torch._cslt_sparse_mm(got, a.t(), transpose_result=True),
                               torch._cslt_sparse_mm(want, a.t(), transpose_result=True))


@pytest.mark.gpu
def test_gpu_kept_zeros_still_pack_to_the_right_product():
    """A kept entry that is exactly zero lets cuSPARSELt's own compression place either
    zero of its group; the gathered buffer keeps the learned placement, which must give
    the same product."""
    from tolerances import assert_close

    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    mask = transposable_mask(w)
    forward, backward = maps_for(mask, torch.bfloat16, want_t=True)
    w2 = torch.randn_like(w)
    w2.view(-1)[mask.view(-1).nonzero().squeeze(1)[::997]] = 0  # ~2000 kept zeros
    wm2 = torch.where(mask, w2, torch.zeros_like(w2)).double()
    a = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    y = torch._cslt_sparse_mm(forward.pack(w2), a.t(), transpose_result=True)
    dx = torch._cslt_sparse_mm(backward.pack(w2), g.t(), transpose_result=True)
    assert_close(y, a.double() @ wm2.t(), torch.bfloat16, "W by gather")
    assert_close(dx, g.double() @ wm2, torch.bfloat16, "Wᵀ by gather")


@pytest.mark.gpu
def test_gpu_module_repacks_by_gather_after_an_update():
    from tilesparse.semi24 import SemiSparseLinear

    m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(x)
        with torch.no_grad():
            m.weight.mul_(1.5)  # an optimizer step: same mask
        y = m(x)
    assert m._maps, "the second pack under one mask learns the placement"
    y.sum().backward()
    wm = (m.weight.detach() * m.mask).double()
    want = x.detach().double() @ wm.t() + m.bias.detach().double()
    assert ((y.double() - want).norm() / want.norm()).item() < 1e-2
    want_dx = torch.ones(64, 512, dtype=torch.float64, device="cuda") @ wm
    assert ((x.grad.double() - want_dx).norm() / want_dx.norm()).item() < 1e-2


@pytest.mark.gpu
def test_gpu_fp32_master_weights_under_autocast_pack_the_cast_weight():
    """AMP: an fp32 layer under bf16 autocast packs its bf16 cast once per weight version
    (then by gather), instead of compressing inside every product."""
    from tilesparse.semi24 import SemiSparseLinear

    m = SemiSparseLinear(1024, 512, device="cuda", mode="sparse")
    x = torch.randn(64, 1024, device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        with torch.no_grad():
            m.weight.add_(0.01)
    assert y.dtype == torch.bfloat16 and m._packed[0].dtype == torch.bfloat16 and m._maps
    y.float().sum().backward()
    assert m.weight.grad.dtype == torch.float32
    wm = (m.weight.detach() - 0.01).to(torch.bfloat16).double() * m.mask
    want = x.to(torch.bfloat16).double() @ wm.t() + m.bias.detach().to(torch.bfloat16).double()
    assert ((y.double() - want).norm() / want.norm()).item() < 2e-2


def test_what_was_learned_about_a_mask_is_forgotten_when_it_may_change():
    """update_mask, densify, load_state_dict and .to() drop the packs, the 2:4 check and the
    value maps (a moved or reloaded mask can repeat the old one's pointer and version)."""
    from tilesparse.semi24 import SemiSparseLinear

    m = SemiSparseLinear(16, 8)
    state = m.state_dict()
    for change in (m.update_mask, lambda: m.load_state_dict(state), lambda: m.to(torch.float64), m.densify):
        m._maps, m._tile24_key, m._packed_key, m._packs_under_mask = ("learned",), ("key",), ("key",), 3
        change()
        assert m._maps is None and m._tile24_key is None and m._packed_key is None and m._packs_under_mask == 0


@pytest.mark.gpu
def test_gpu_a_shape_known_row_major_learns_at_the_first_pack():
    """Once a shape's placement decoded row-major, another layer of that shape in training
    learns its map at its first pack (about one compression) instead of compressing first."""
    from tolerances import assert_close

    from tilesparse.semi24 import SemiSparseLinear

    first = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):  # the second pack under one mask learns (decoding the shape in full if new)
            first.weight.mul_(1.01)
            first(x)
    assert first._maps
    second = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
    y = second(x.requires_grad_())  # a training forward
    assert second._maps and second._maps[0].index is None, "learned at the first pack, packed by the kernel"
    wm = (second.weight * second.mask).detach().double()
    assert_close(y, x.detach().double() @ wm.t() + second.bias.detach().double(), torch.bfloat16, "fprop")
