"""BlockSparseLinear: construction, init, dense conversion, state_dict, dtype moves, training."""

import pytest
import torch
from torch import nn

from tilesparse import BlockLayout, BlockSparseLinear, layouts
from tolerances import assert_close


def _expanded(mask: torch.Tensor, b: int) -> torch.Tensor:
    return mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


# --------------------------------------------------------------------------- construction


class TestConstruction:
    # Densities whose block counts are exact (8 x 16 = 128 blocks): the ends and two in between.
    @pytest.mark.parametrize("density, nnz", [(0.0, 0), (0.25, 32), (0.5, 64), (1.0, 128)])
    def test_density_gives_random_layout_of_that_count(self, density, nnz):
        m = BlockSparseLinear(128, 64, block_size=8, density=density, seed=3)
        assert m.layout.nnz == nnz
        assert m.layout.density == density
        assert m.layout.shape == (64, 128)
        assert m.layout == layouts.random(64, 128, 8, density, seed=3)
        assert m.weight.shape == (nnz, 8, 8)
        assert m.bias.shape == (64,)

    def test_explicit_layout_is_used(self):
        layout = layouts.balanced(48, 32, 16, 0.5, seed=1)
        m = BlockSparseLinear(32, 48, block_size=16, layout=layout)
        assert m.layout == layout
        assert torch.equal(m.layout_mask, layout.mask)
        assert m.weight.shape == (layout.nnz, 16, 16)

    def test_seed_changes_layout(self):
        a = BlockSparseLinear(128, 128, block_size=8, density=0.3, seed=0)
        b = BlockSparseLinear(128, 128, block_size=8, density=0.3, seed=1)
        assert a.layout != b.layout

    def test_no_bias(self):
        m = BlockSparseLinear(32, 32, block_size=8, density=0.5, bias=False)
        assert m.bias is None
        assert [name for name, _ in m.named_parameters()] == ["weight"]

    def test_dtype_argument(self):
        m = BlockSparseLinear(32, 32, block_size=8, density=0.5, dtype=torch.float64)
        assert m.weight.dtype == torch.float64 and m.bias.dtype == torch.float64

    def test_both_density_and_layout_raises(self):
        layout = layouts.random(32, 32, 8, 0.5)
        with pytest.raises(ValueError, match="not both"):
            BlockSparseLinear(32, 32, block_size=8, density=0.5, layout=layout)

    def test_neither_density_nor_layout_raises(self):
        with pytest.raises(ValueError, match="density or layout"):
            BlockSparseLinear(32, 32, block_size=8)

    def test_layout_shape_mismatch_raises(self):
        layout = layouts.random(32, 64, 8, 0.5)  # (out=32, in=64)
        with pytest.raises(ValueError, match="out_features, in_features"):
            BlockSparseLinear(32, 64, block_size=8, layout=layout)  # wants (64, 32)

    def test_layout_block_size_mismatch_raises(self):
        layout = layouts.random(32, 32, 16, 0.5)
        with pytest.raises(ValueError, match="block_size"):
            BlockSparseLinear(32, 32, block_size=8, layout=layout)

    def test_layout_of_wrong_type_raises(self):
        with pytest.raises(TypeError, match="layout"):
            BlockSparseLinear(32, 32, block_size=8, layout=torch.ones(4, 4, dtype=torch.bool))

    @pytest.mark.parametrize(
        "in_features, out_features, name", [(30, 32, "in_features"), (32, 36, "out_features")], ids=["in", "out"]
    )
    def test_non_divisible_features_raise(self, in_features, out_features, name):
        with pytest.raises(ValueError, match=f"{name}=\\d+ is not divisible by block_size=8"):
            BlockSparseLinear(in_features, out_features, block_size=8, density=0.5)

    def test_extra_repr(self):
        m = BlockSparseLinear(64, 32, block_size=16, density=0.5)
        text = repr(m)
        assert "block_size=16" in text
        assert "density=0.500" in text
        assert "in_features=64" in text and "out_features=32" in text


# --------------------------------------------------------------------------- init


def test_init_variance_follows_actual_fan_in():
    """Weights are U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the row's actual fan-in
    (stored blocks in its block-row times b), so Var = 1 / (3 fan_in)."""
    b, n_cols = 16, 16
    blocks_per_row = [1, 4, 16, 8]  # very different fan-ins: 16, 64, 256, 128
    mask = torch.zeros(len(blocks_per_row), n_cols, dtype=torch.bool)
    for r, k in enumerate(blocks_per_row):
        mask[r, torch.randperm(n_cols)[:k]] = True
    layout = BlockLayout(mask, b)
    m = BlockSparseLinear(n_cols * b, len(blocks_per_row) * b, block_size=b, layout=layout)
    dense = m.to_dense()
    for r, k in enumerate(blocks_per_row):
        fan_in = k * b
        rows = dense[r * b:(r + 1) * b]
        samples = rows[_expanded(mask, b)[r * b:(r + 1) * b]]
        assert samples.numel() == k * b * b
        bound = fan_in ** -0.5
        assert samples.abs().max() <= bound * (1 + 1e-6)
        # Sample variance of n uniforms has relative std sqrt(0.8 / n) (<= 0.056 at the
        # smallest n = 256 here): a 30% band is > 5 sigma.
        var = samples.double().var().item()
        expected = 1.0 / (3 * fan_in)
        assert abs(var / expected - 1) < 0.3, (r, var, expected)
        # bias of this block-row uses the same bound
        assert m.bias[r * b:(r + 1) * b].abs().max() <= bound * (1 + 1e-6)


def test_init_output_variance_matches_dense_linear():
    # The point of the per-row fan-in: unit-variance input gives output variance ~1/3
    # (the same as nn.Linear's weight term) whatever the density.
    m = BlockSparseLinear(512, 256, block_size=16, density=0.25, bias=False)
    x = torch.randn(2048, 512)
    with torch.no_grad():
        var = m(x).var().item()
    assert abs(var * 3 - 1) < 0.15, var


def test_reset_parameters_redraws():
    m = BlockSparseLinear(64, 64, block_size=8, density=0.5)
    before = m.weight.detach().clone()
    m.reset_parameters()
    assert not torch.equal(before, m.weight)


# --------------------------------------------------------------------------- dense conversions


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_to_dense_matches_forward(with_bias):
    m = BlockSparseLinear(64, 48, block_size=16, density=0.5, bias=with_bias, dtype=torch.float64)
    x = torch.randn(5, 7, 64, dtype=torch.float64)
    dense = m.to_dense()
    assert dense.shape == (48, 64)
    assert (dense[~_expanded(m.layout_mask, 16)] == 0).all()  # zeros off the layout
    expected = x @ dense.t() + (m.bias if with_bias else 0)
    assert_close(m(x), expected, torch.float64)


def test_from_dense_keeps_strongest_blocks_and_equals_masked_linear():
    b = 16
    linear = nn.Linear(96, 64, dtype=torch.float64)
    with torch.no_grad():  # uneven block norms so the choice is clear
        linear.weight.mul_(torch.rand(64 // b, 96 // b, dtype=torch.float64).repeat_interleave(b, 0).repeat_interleave(b, 1))
    m = BlockSparseLinear.from_dense(linear, block_size=b, density=0.5)
    assert m.weight.dtype == torch.float64
    assert m.layout == layouts.from_dense(linear.weight, b, 0.5)
    assert m.layout.nnz == 12
    norms = linear.weight.detach().reshape(4, b, 6, b).pow(2).sum(dim=(1, 3))
    assert norms[m.layout_mask].min() >= norms[~m.layout_mask].max()
    # forward equals nn.Linear with the dropped blocks zeroed
    masked = linear.weight.detach() * _expanded(m.layout_mask, b)
    x = torch.randn(9, 96, dtype=torch.float64)
    assert_close(m(x), nn.functional.linear(x, masked, linear.bias), torch.float64)
    assert torch.equal(m.bias, linear.bias)
    assert torch.equal(m.to_dense(), masked)


def test_from_dense_without_bias_and_full_density():
    linear = nn.Linear(32, 32, bias=False)
    m = BlockSparseLinear.from_dense(linear, block_size=8, density=1.0)
    assert m.bias is None
    x = torch.randn(4, 32)
    assert_close(m(x), linear(x), torch.float32)


def test_from_dense_rejects_non_linear():
    with pytest.raises(TypeError, match="linear"):
        BlockSparseLinear.from_dense(nn.Conv1d(4, 4, 1), block_size=8, density=0.5)


# --------------------------------------------------------------------------- state_dict


def test_state_dict_round_trip():
    src = BlockSparseLinear(64, 32, block_size=8, density=0.4, seed=7)
    state = src.state_dict()
    assert set(state) == {"weight", "bias", "layout_mask"}
    dst = BlockSparseLinear(64, 32, block_size=8, layout=BlockLayout(state["layout_mask"], 8))
    assert not torch.equal(dst.weight, src.weight)  # fresh init differs before loading
    dst.load_state_dict(state)
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)
    x = torch.randn(3, 64)
    assert torch.equal(dst(x), src(x))


def test_state_dict_round_trip_through_density_and_seed():
    src = BlockSparseLinear(64, 32, block_size=8, density=0.4, seed=7)
    dst = BlockSparseLinear(64, 32, block_size=8, density=0.4, seed=7)
    dst.load_state_dict(src.state_dict())
    x = torch.randn(3, 64)
    assert torch.equal(dst(x), src(x))


@pytest.mark.parametrize("other", ["other_seed", "other_grid"])
def test_loading_a_different_layout_raises(other):
    src = BlockSparseLinear(64, 32, block_size=8, density=0.4, seed=7)
    state = src.state_dict()
    if other == "other_seed":
        dst = BlockSparseLinear(64, 32, block_size=8, density=0.4, seed=8)
    else:  # same features, other block size: a different mask shape
        dst = BlockSparseLinear(64, 32, block_size=16, density=0.4, seed=7)
    with pytest.raises(ValueError, match="layout_mask"):
        dst.load_state_dict(state)


def test_loading_a_different_layout_in_a_submodule_names_the_key():
    src = nn.Sequential(BlockSparseLinear(32, 32, block_size=8, density=0.5, seed=1))
    dst = nn.Sequential(BlockSparseLinear(32, 32, block_size=8, density=0.5, seed=2))
    with pytest.raises(ValueError, match=r"0\.layout_mask"):
        dst.load_state_dict(src.state_dict())


# --------------------------------------------------------------------------- dtype and training


def test_to_float64():
    m = BlockSparseLinear(32, 16, block_size=8, density=0.5)
    x = torch.randn(4, 32, dtype=torch.float64)
    expected = x @ m.to_dense().double().t() + m.bias.double()
    m = m.to(torch.float64)
    assert m.weight.dtype == torch.float64 and m.bias.dtype == torch.float64
    assert m.layout_mask.dtype == torch.bool  # buffers of the mask are not cast
    y = m(x)
    assert y.dtype == torch.float64
    assert_close(y, expected, torch.float64)


def test_half_module_forward():
    m = BlockSparseLinear(32, 16, block_size=8, density=0.5).to(torch.bfloat16)
    x = torch.randn(4, 32).to(torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16
    assert_close(y, x.double() @ m.to_dense().double().t() + m.bias.double(), torch.bfloat16)


def test_sgd_reduces_loss_on_toy_regression():
    # Target: a random block-sparse linear map on the same layout, so the loss can go to 0.
    model = BlockSparseLinear(64, 32, block_size=8, density=0.5)
    teacher = BlockSparseLinear(64, 32, block_size=8, layout=model.layout)
    x = torch.randn(256, 64)
    with torch.no_grad():
        y = teacher(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        assert model.weight.grad.shape == model.weight.shape
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], losses


def test_gradient_only_on_stored_blocks_matches_masked_dense():
    m = BlockSparseLinear(48, 32, block_size=16, density=0.5, dtype=torch.float64)
    x = torch.randn(6, 48, dtype=torch.float64)
    m(x).pow(2).sum().backward()
    w = m.to_dense().requires_grad_()
    (x @ w.t() + m.bias.detach()).pow(2).sum().backward()
    assert_close(m.weight.grad, m.layout.gather(w.grad), torch.float64)


def test_from_dense_on_a_given_layout():
    linear = nn.Linear(64, 32)
    layout = layouts.balanced(32, 64, 16, 0.5, seed=3)
    module = BlockSparseLinear.from_dense(linear, block_size=16, layout=layout)
    assert module.layout == layout
    assert torch.equal(module.weight.detach(), layout.gather(linear.weight.detach()))
    with pytest.raises(ValueError, match="exactly one of density or layout"):
        BlockSparseLinear.from_dense(linear, block_size=16)
    with pytest.raises(ValueError, match="exactly one of density or layout"):
        BlockSparseLinear.from_dense(linear, block_size=16, density=0.5, layout=layout)


@pytest.mark.parametrize("which", ["weight", "bias"])
def test_a_parametrization_of_the_weight_or_bias_is_what_the_forward_uses(which):
    """The forward reads the Parameters from their dict (faster than attribute access) only where
    nothing else answers for the name: a parametrization's property does."""
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, t):
            return 2 * t

    m = BlockSparseLinear(64, 48, block_size=16, density=0.5, seed=2).double()
    x = torch.randn(5, 64, dtype=torch.float64)
    plain = m(x)
    parametrize.register_parametrization(m, which, Doubled())
    # weight doubled: 2 (Y - b) + b; bias doubled (m.bias now reads 2 b): Y + b
    expected = 2 * plain - m.bias if which == "weight" else plain + m.bias / 2
    assert_close(m(x), expected, torch.float64)

