"""SemiSparseLinear (CPU reference path), its registered op under torch.compile, and the
training recipes (STE, SR-STE, masked decay, flip rate, densify); the dispatcher is in
test_semi24_dispatch.py. GPU-marked tests check the cuSPARSELt path.

The products here are plain PyTorch on the CPU; comparisons against explicit formulas
use fp32 with PyTorch's default tolerances (same arithmetic, possibly another order).
"""

from __future__ import annotations


import pytest
import torch
from torch import nn

from tilesparse import semi24
from tilesparse.semi24 import SemiSparseLinear
from tilesparse.semi24 import dispatch as dsp
from tilesparse.semi24.linear import semi24_linear
from tilesparse.semi24.reference import is_24

from tolerances import assert_close


def _masked(m):
    return m.weight.detach() * m.mask


# --------------------------------------------------------------------------- forward / backward


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposable", [True, False])
def test_forward_is_x_times_masked_weight_t_plus_b(bias, transposable):
    m = SemiSparseLinear(32, 16, bias=bias, transposable=transposable)
    assert is_24(m.mask, transposable=transposable) and not m.mask.all()
    x = torch.randn(2, 5, 32)  # a 3-D batch
    y = m(x)
    expected = x @ _masked(m).t() + (m.bias if bias else 0)
    assert y.shape == (2, 5, 16)
    torch.testing.assert_close(y, expected)
    if transposable:
        assert torch.equal(m.mask, semi24.transposable_mask(m.weight.detach()))
    else:
        assert torch.equal(m.mask, semi24.prune_24_rows(m.weight.detach())[1])


def test_gradients_ste():
    m = SemiSparseLinear(16, 8)
    x = torch.randn(6, 16, requires_grad=True)
    dy = torch.randn(6, 8)
    m(x).backward(dy)
    # dX through the masked weight: autograd of the explicit formula
    x2 = x.detach().clone().requires_grad_()
    (x2 @ _masked(m).t()).backward(dy)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(x.grad, dy @ _masked(m))
    # dW dense (straight-through): dY^T X on every entry, masked-out ones included
    torch.testing.assert_close(m.weight.grad, dy.t() @ x.detach())
    assert (m.weight.grad[~m.mask] != 0).all()
    torch.testing.assert_close(m.bias.grad, dy.sum(0))


def test_srste_decay_term():
    lam = 0.1
    m = SemiSparseLinear(16, 8, srste_decay=lam)
    x, dy = torch.randn(4, 16), torch.randn(4, 8)
    m(x).backward(dy)
    expected = dy.t() @ x + lam * (~m.mask) * m.weight.detach()
    torch.testing.assert_close(m.weight.grad, expected)


def test_masked_decay_on_gradients():
    m = SemiSparseLinear(16, 8)
    with pytest.raises(RuntimeError, match="after backward"):
        m.apply_masked_decay_(0.1)
    x, dy = torch.randn(4, 16), torch.randn(4, 8)
    m(x).backward(dy)
    m.apply_masked_decay_(0.5)
    torch.testing.assert_close(m.weight.grad, dy.t() @ x + 0.5 * (~m.mask) * m.weight.detach())


def test_functional_form_and_autocast():
    w = torch.randn(8, 16)
    mask = semi24.prune_24_rows(w)[1]
    x = torch.randn(3, 16)
    torch.testing.assert_close(semi24_linear(x, w, mask), x @ (w * mask).t())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = semi24_linear(x, w, mask)
    assert y.dtype == torch.bfloat16
    assert_close(y, x.double() @ (w * mask).double().t(), torch.bfloat16, "autocast")


# --------------------------------------------------------------------------- mask schedule


def test_flip_rate_of_a_known_change():
    m = SemiSparseLinear(8, 4, bias=False, transposable=False)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([4.0, 3.0, 2.0, 1.0]).repeat(4, 2))
    m.update_mask()
    assert torch.equal(m.mask, torch.tensor([True, True, False, False]).repeat(4, 2))
    with torch.no_grad():
        m.weight[0, :4] = torch.tensor([1.0, 2.0, 3.0, 4.0])  # one group: keep 2, 3 instead of 0, 1
        m.weight[1, 4:] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m.update_mask()
    assert m.flip_rate == pytest.approx(8 / 32)  # 2 groups x 4 changed entries of 32
    m.update_mask()
    assert m.flip_rate == 0.0


def test_mask_updates_every_k_steps():
    m = SemiSparseLinear(16, 8, mask_every=3)
    updated = []
    for _ in range(7):
        with torch.no_grad():
            m.weight.copy_(torch.randn_like(m.weight))
        before = m.mask.clone()
        updated.append(m.step())
        if updated[-1]:
            assert torch.equal(m.mask, semi24.transposable_mask(m.weight.detach()))
            assert not torch.equal(m.mask, before)
        else:
            assert torch.equal(m.mask, before)
    assert updated == [False, False, True, False, False, True, False]
    assert int(m.num_steps) == 7
    assert 0 < m.flip_rate < 1


def test_training_loop_keeps_the_mask_24():
    torch.manual_seed(0)
    m = SemiSparseLinear(32, 16, mask_every=2, srste_decay=2e-4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, target = torch.randn(64, 32), torch.randn(64, 16)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = ((m(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        m.step()
        losses.append(loss.item())
        assert is_24(m.mask, transposable=True)
    assert losses[-1] < losses[0]


# --------------------------------------------------------------------------- conversions


def test_densify():
    m = SemiSparseLinear(16, 8, mask_every=1)
    x = torch.randn(3, 16)
    linear = m.densify(as_linear=True)
    assert isinstance(linear, nn.Linear) and not m.densified  # as_linear leaves the module alone
    torch.testing.assert_close(linear(x), x @ m.weight.detach().t() + m.bias.detach())
    saved = m.weight.detach().clone()
    with torch.no_grad():
        m.weight.copy_(torch.randn_like(saved))
    m.step()  # a mask update that flips entries
    assert m.flip_rate > 0
    with torch.no_grad():
        m.weight.copy_(saved)
    assert m.densify() is m and m.densified and m.mask.all()
    torch.testing.assert_close(m(x), linear(x))
    assert not m.step() and not m.step()  # no more updates once dense (step says so: review, 2026-12-04)
    assert m.mask.all() and m.flip_rate == 0
    x.requires_grad_()
    m(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, 8) @ m.weight.detach())


@pytest.mark.parametrize("transposable", [True, False])
def test_from_dense(transposable):
    linear = nn.Linear(16, 8)
    m = SemiSparseLinear.from_dense(linear, transposable=transposable, method="greedy", mask_every=5)
    assert torch.equal(m.weight, linear.weight) and torch.equal(m.bias, linear.bias)
    assert m.mask_every == 5 and m.method == "greedy" and m.flip_rate == 0.0
    w = linear.weight.detach()
    expected = semi24.transposable_mask(w, "greedy") if transposable else semi24.prune_24_rows(w)[1]
    assert torch.equal(m.mask, expected)
    with pytest.raises(TypeError, match="linear must be an nn.Linear"):
        SemiSparseLinear.from_dense(nn.Conv1d(4, 4, 1))


def test_state_dict_round_trip():
    m = SemiSparseLinear(16, 8, mask_every=2)
    with torch.no_grad():
        m.weight.copy_(torch.randn_like(m.weight))
    m.step()
    m.step()
    sd = m.state_dict()
    assert set(sd) == {"weight", "bias", "mask", "num_steps"}
    assert sd["mask"].dtype == torch.bool and int(sd["num_steps"]) == 2
    fresh = SemiSparseLinear(16, 8, mask_every=2)
    assert not torch.equal(fresh.mask, m.mask)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.mask, m.mask) and int(fresh.num_steps) == 2
    x = torch.randn(4, 16)
    torch.testing.assert_close(fresh(x), m(x))
    # the step count resumes from the checkpoint: step 3 keeps the mask, step 4 updates it
    assert not fresh.step() and fresh.step() and int(fresh.num_steps) == 4
    assert "transposable=True" in repr(fresh) and "mask_every=2" in repr(fresh)


def test_a_densified_checkpoint_loads_densified_and_other_masks_are_refused():
    """(review, 2026-12-04) ``densified`` is not in the state_dict: a densified layer's all-ones mask loaded
    into a fresh layer left it sparse with a mask that is not 2:4, which the GPU path would hand to
    cuSPARSELt's compression. The all-ones mask now loads as densified; any other mask must be 2:4."""
    dense = SemiSparseLinear(16, 16, mode="sparse")
    dense.densify()
    fresh = SemiSparseLinear(16, 16, mode="sparse")
    fresh.load_state_dict(dense.state_dict())
    assert fresh.densified and bool(fresh.mask.all())
    x = torch.randn(3, 16)
    torch.testing.assert_close(fresh(x), dense(x))
    sparse = SemiSparseLinear(16, 16, mode="sparse")
    fresh.load_state_dict(sparse.state_dict())  # and back: a 2:4 mask undoes it
    assert not fresh.densified and is_24(fresh.mask, True)
    bad = sparse.state_dict()
    bad["mask"] = bad["mask"].clone()
    bad["mask"][0, :4] = True
    with pytest.raises(ValueError, match="mask is not a transposable 2:4 mask"):
        fresh.load_state_dict(bad)
    bad["mask"] = sparse.mask.float()
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        fresh.load_state_dict(bad)
    rows_only = SemiSparseLinear(16, 16, transposable=False)
    row_mask = torch.zeros(16, 16, dtype=torch.bool)
    row_mask[:, :2] = True  # 2:4 along rows, 16 of 16 down each column's 4x4 tiles: not transposable
    row_mask[:, 4:6] = True
    row_mask[:, 8:10] = True
    row_mask[:, 12:14] = True
    assert is_24(row_mask) and not is_24(row_mask, True)
    state = rows_only.state_dict()
    state["mask"] = row_mask
    rows_only.load_state_dict(state)  # rows-only 2:4 is enough where the layer is not transposable
    with pytest.raises(ValueError, match="not a transposable 2:4"):
        SemiSparseLinear(16, 16).load_state_dict(state)


# --------------------------------------------------------------------------- torch.compile


def test_compile_fullgraph_matches_eager():
    m = SemiSparseLinear(32, 16, srste_decay=0.01)
    x = torch.randn(2, 3, 32, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    gx, gw, gb = x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()
    x.grad = None
    m.zero_grad()
    y_eager = m(x)
    y_eager.backward(dy)
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, m.weight.grad)
    torch.testing.assert_close(gb, m.bias.grad)


def test_compile_inductor_forward():
    m = SemiSparseLinear(16, 8)
    x = torch.randn(4, 16)
    torch.testing.assert_close(torch.compile(m, fullgraph=True)(x), m(x))


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="srste_decay must be a real number"):
        SemiSparseLinear(8, 8, srste_decay="a")
    with pytest.raises(ValueError, match=r"mask must be a 2-D tensor \[N, K\], got shape \(8,\)"):
        is_24(torch.zeros(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="in_features=6"):
        SemiSparseLinear(6, 8)
    with pytest.raises(ValueError, match="out_features=6"):
        SemiSparseLinear(8, 6)
    SemiSparseLinear(8, 6, transposable=False)  # rows only: out_features is free
    with pytest.raises(ValueError, match="method"):
        SemiSparseLinear(8, 8, method="best")
    with pytest.raises(ValueError, match="mask_every"):
        SemiSparseLinear(8, 8, mask_every=0)
    with pytest.raises(ValueError, match="mode"):
        SemiSparseLinear(8, 8, mode="fast")
    with pytest.raises(ValueError, match="srste_decay"):
        SemiSparseLinear(8, 8, srste_decay=-1.0)
    m = SemiSparseLinear(8, 8)
    with pytest.raises(ValueError, match="in_features=8"):
        m(torch.randn(3, 4))
    with pytest.raises(TypeError, match="x has dtype"):
        m(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        m([1.0] * 8)
    with pytest.raises(ValueError, match="x is on meta but weight is on cpu"):
        m(torch.randn(3, 8, device="meta"))
    with pytest.raises(ValueError, match="masked must be W⊙M like weight"):
        semi24_linear(torch.randn(3, 8), m.weight, m.mask, masked=torch.zeros(8, 4))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sparse", "dense", "auto"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_cusparselt_matches_dense_masked(mode, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("TILESPARSE_SEMI24_CACHE", str(tmp_path / "c.json"))
    monkeypatch.setattr(dsp, "_DEFAULT", None)
    m = SemiSparseLinear(1024, 512, device="cuda", dtype=dtype, mode=mode)
    x = torch.randn(100, 1024, device="cuda", dtype=dtype, requires_grad=True)  # 100: padded to 104
    y = m(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    wm = (m.weight.detach() * m.mask).double()
    assert_close(y, x.detach().double() @ wm.t() + m.bias.detach().double(), dtype, "fprop")
    assert_close(x.grad, dy.double() @ wm, dtype, "bprop")
    assert_close(m.weight.grad, dy.double().t() @ x.detach().double(), dtype, "updat")
    trained_sparse = mode == "sparse" or (mode == "auto" and any(  # auto in training: the train_step decision
        entry["choice"] == "sparse" for key, entry in dsp.default_dispatcher()._load().items()
        if key.startswith("train_step")))
    if trained_sparse:
        with torch.no_grad():  # inference: packed once, kept while W and M are unchanged
            m(x)
            key = m._packed_key
            assert key is not None
            m(x)
            assert m._packed_key == key
            m.weight.add_(1.0)
            m(x)
            assert m._packed_key != key  # repacked after the weight changed
        # training packs on every forward: FSDP2 writes the all-gathered W into the same
        # storage with its version counter preserved, which a cache key cannot see
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(m.weight):
            m.weight.mul_(-1.0)
        y = m(x)
        wm = (m.weight.detach() * m.mask).double()
        assert_close(y, x.detach().double() @ wm.t() + m.bias.detach().double(), dtype, "fprop after a silent write")


@pytest.mark.gpu
@pytest.mark.parametrize("packer", ["map", "cslt"])
def test_gpu_broadcast_gradient_and_strided_input(packer, monkeypatch):
    """``y.sum().backward()`` hands the layer a stride-0 gradient, and a transposed view
    is a legal input: cuSPARSELt must see contiguous operands (the broadcast gradient
    once came back as garbage, dX off by 1e24)."""
    monkeypatch.setenv("TILESPARSE_SEMI24_PACKER", packer)
    m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="sparse")
    x = torch.randn(1024, 64, device="cuda", dtype=torch.bfloat16).t().requires_grad_()
    for _ in range(3):  # compress, then (map packer) learn the placement and gather
        with torch.no_grad():
            m.weight.mul_(1.01)
        x.grad = None
        y = m(x)
        y.sum().backward()
    wm = (m.weight.detach() * m.mask).double()
    assert_close(y, x.detach().double() @ wm.t() + m.bias.detach().double(), torch.bfloat16, "fprop")
    assert_close(x.grad, torch.ones(64, 512, dtype=torch.float64, device="cuda") @ wm, torch.bfloat16, "bprop")


@pytest.mark.gpu
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_gpu_dense_products_reuse_the_masked_weight_until_it_changes(grad):
    """mode dense (and auto where dense was decided) keeps W⊙M between inference calls
    and builds it per forward in training; an update of W or M must be seen at once (a
    stale copy would be a silent wrong result), also after inference mode."""
    m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="dense")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    def check():
        with torch.set_grad_enabled(grad):
            y = m(x)
        wm = (m.weight.detach() * m.mask).double()
        assert_close(y, x.detach().double() @ wm.t() + m.bias.detach().double(), torch.bfloat16, "fprop")
        if grad:
            x.grad = None
            dy = torch.randn_like(y)
            y.backward(dy)
            assert_close(x.grad, dy.double() @ wm, torch.bfloat16, "bprop")

    check()
    held = m._masked_weight
    if grad:  # training: W⊙M is built per forward (W changes every step), never held across calls
        assert held is None
    else:
        assert held is not None
        check()
        assert m._masked_weight is held, "kept while W and M are unchanged"
    with torch.no_grad():
        m.weight.mul_(-2.0)
    check()
    assert held is None or m._masked_weight is not held
    with torch.no_grad():
        m.update_mask()
    check()
    with torch.inference_mode():  # a copy cached under inference mode must still serve what follows
        m(x.detach())
    check()
    with torch.no_grad():  # inference that runs dense: F.linear on the held W⊙M, same numbers
        wm = (m.weight.detach() * m.mask).double()
        assert_close(m(x.detach()), x.detach().double() @ wm.t() + m.bias.detach().double(), torch.bfloat16, "plain")
    m.densify()
    check()
    assert m._dense_masked("dense", x) is m.weight  # densified: the weight itself, no copy


@pytest.mark.gpu
def test_gpu_auto_training_is_decided_once_with_the_compression_cost(tmp_path, monkeypatch):
    """In training (W changes every step), mode='auto' times repacking + sparse products
    against the dense products once per problem (op train_step_map), caches it, and is right
    either way; in eval it falls back to the per-product decision."""
    monkeypatch.setenv("TILESPARSE_SEMI24_CACHE", str(tmp_path / "c.json"))
    monkeypatch.setattr(dsp, "_DEFAULT", None)
    m = SemiSparseLinear(1024, 512, device="cuda", dtype=torch.bfloat16, mode="auto")
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    m(x).sum().backward()
    d = dsp.default_dispatcher()
    assert [key.split("|")[0] for key in d._load()] == ["train_step_map"]
    timings = d.timings
    y = m(x)
    assert d.timings == timings  # answered from the cache
    wm = (m.weight.detach() * m.mask).double()
    assert_close(y, x.detach().double() @ wm.t() + m.bias.detach().double(), torch.bfloat16, "fprop")
    m.eval()
    with torch.no_grad():
        m(x)
    assert sorted(key.split("|")[0] for key in d._load()) == ["fprop", "train_step_map"]


# --------------------------------------------------------------------------- activation sparsity


def test_squared_relu_ffn_forward_and_backward():
    from tilesparse.semi24 import SquaredReLUFFN

    ffn = SquaredReLUFFN(16, 32)
    x = torch.randn(2, 3, 16, requires_grad=True)
    y = ffn(x)
    # explicit formula: the mask of the hidden activation, fixed, then plain autograd
    x2 = x.detach().clone().requires_grad_()
    h = torch.relu(x2 @ ffn.fc1.weight.t() + ffn.fc1.bias) ** 2
    mask = semi24.prune_24_rows(h.detach().reshape(-1, 32))[1].reshape(h.shape)
    assert is_24(mask.reshape(-1, 32))
    y2 = (h * mask) @ ffn.fc2.weight.t() + ffn.fc2.bias
    torch.testing.assert_close(y, y2)
    dy = torch.randn_like(y)
    y.backward(dy)
    grads = [p.grad.clone() for p in ffn.parameters()]
    ffn.zero_grad()
    y2.backward(dy)
    torch.testing.assert_close(x.grad, x2.grad)
    for g, p in zip(grads, ffn.parameters()):
        torch.testing.assert_close(g, p.grad)
    # the dropped entries get no gradient: dH is zero off the mask
    hh = ffn.hidden_activation(x.detach()).detach().requires_grad_()
    from tilesparse.semi24.ffn import sparsify_24

    sparsify_24(hh).sum().backward()
    assert torch.equal(hh.grad, mask.to(hh.dtype))


def test_squared_relu_ffn_dense_baseline_compile_and_errors():
    from tilesparse.semi24 import SquaredReLUFFN

    ffn = SquaredReLUFFN(8, 16)
    x = torch.randn(5, 8)
    torch.testing.assert_close(torch.compile(ffn, fullgraph=True, backend="aot_eager")(x), ffn(x))
    ffn.sparse = False
    torch.testing.assert_close(ffn(x), ffn.fc2(torch.relu(ffn.fc1(x)) ** 2))
    with pytest.raises(ValueError, match="hidden=6"):
        SquaredReLUFFN(8, 6)
    with pytest.raises(ValueError, match="dim=8"):
        ffn(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"got shape \(\)"):  # (review, 2026-12-04: a raw IndexError)
        ffn(torch.tensor(1.0))
    with pytest.raises(TypeError, match="x has dtype torch.float64"):  # (a raw matmul dtype error)
        ffn(torch.randn(2, 8, dtype=torch.float64))
