"""sparsify (dense model -> BlockSparseLinear in place) and block group lasso.

Models are tiny and float64 on the CPU reference path, so "converted == masked dense"
is checked to float64 precision. Layers are 32/64 wide with block_size 8: several
blocks per row and column, and 10-wide layers where a non-divisible case is wanted.
"""

import copy
import io
import math
import warnings

import pytest
import torch
from torch import nn

import tilesparse
from tilesparse import BlockLayout, BlockSparseLinear, layouts
from tilesparse.layouts.magnitude import block_norms as magnitude_block_norms
from tilesparse.sparsity import (
    ConvertedModule,
    GatedBlockSparseLinear,
    SparsifyReport,
    block_norms,
    convertible_linears,
    dense_block_norms,
    dense_group_lasso,
    group_lasso,
    sparsify,
)
from tolerances import assert_close

B = 8


def mlp(dtype=torch.float64) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)
    ).to(dtype)


class AttentionBlock(nn.Module):
    """A transformer-ish block: MultiheadAttention (its out_proj is an nn.Linear subclass
    read directly by the attention) followed by an MLP of plain nn.Linear."""

    def __init__(self, dim=32):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.fc2(torch.relu(self.fc1(x)))


def _expanded(mask, b=B):
    return mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


def masked_dense(original: nn.Module, converted: nn.Module) -> nn.Module:
    """``original`` with each converted Linear's weight multiplied by its layout mask."""
    reference = copy.deepcopy(original)
    modules = dict(converted.named_modules())
    with torch.no_grad():
        for name, linear in reference.named_modules():
            new = modules.get(name)
            if isinstance(new, BlockSparseLinear):
                linear.weight.mul_(_expanded(new.layout_mask, new.block_size).to(linear.weight.dtype))
    return reference


def quiet_sparsify(model, **kwargs) -> SparsifyReport:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sparsify(model, **kwargs)


def custom_layout(out_features, in_features, block_size):
    """Keeps the block diagonal (of the square part) and the first block column."""
    mask = torch.zeros(out_features // block_size, in_features // block_size, dtype=torch.bool)
    mask.diagonal().fill_(True)
    mask[:, 0] = True
    return BlockLayout(mask, block_size)


LAYOUT_OPTIONS = ["magnitude", "random", "balanced", custom_layout]


# --------------------------------------------------------------------------- conversion


class TestConvertMLP:
    @pytest.mark.parametrize("layout", LAYOUT_OPTIONS, ids=["magnitude", "random", "balanced", "callable"])
    def test_forward_and_backward_equal_masked_dense(self, layout):
        original = mlp()
        model = copy.deepcopy(original)
        report = sparsify(model, block_size=B, density=0.5, layout=layout, seed=3)
        assert list(report.converted) == ["0", "2", "4"] and report.skipped == {}
        reference = masked_dense(original, model)

        x = torch.randn(5, 32, dtype=torch.float64, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        y, y_ref = model(x), reference(x_ref)
        assert_close(y, y_ref, torch.float64, "forward")
        grad = torch.randn_like(y)
        y.backward(grad)
        y_ref.backward(grad)
        assert_close(x.grad, x_ref.grad, torch.float64, "grad x")
        for name, new in model.named_modules():
            if isinstance(new, BlockSparseLinear):
                dense = dict(reference.named_modules())[name]
                # Sparse gradients are compared after masking the reference to the layout.
                assert_close(new.weight.grad, new.layout.gather(dense.weight.grad), torch.float64, f"{name} dW")
                assert_close(new.bias.grad, dense.bias.grad, torch.float64, f"{name} db")

    def test_all_three_layers_converted_when_divisible(self):
        model = mlp()
        report = sparsify(model, block_size=B, density=0.5)
        assert list(report.converted) == ["0", "2", "4"]
        assert report.skipped == {} and report.excluded == []
        assert all(isinstance(model[i], BlockSparseLinear) for i in (0, 2, 4))
        assert isinstance(model[1], nn.ReLU)

    def test_magnitude_keeps_strongest_blocks(self):
        original = mlp()
        model = copy.deepcopy(original)
        sparsify(model, block_size=B, density=0.25)
        for i in (0, 2, 4):
            expected = layouts.from_dense(original[i].weight, B, 0.25)
            assert model[i].layout == expected
            assert torch.equal(model[i].to_dense(), original[i].weight.detach() * _expanded(expected.mask))
            assert torch.equal(model[i].bias, original[i].bias)

    @pytest.mark.parametrize("kind", ["random", "balanced"])
    def test_random_layouts_block_counts_and_seeding(self, kind):
        def layouts_of(seed):
            model = mlp()
            sparsify(model, block_size=B, density=0.5, layout=kind, seed=seed)
            return [model[i].layout for i in (0, 2, 4)]

        first, again, other = layouts_of(0), layouts_of(0), layouts_of(1)
        assert first == again  # reproducible
        assert first != other  # the seed matters
        for lay in first:
            assert lay.nnz == round(0.5 * lay.mask.numel())
            if kind == "balanced":
                assert lay.mask.sum(dim=1).unique().numel() == 1

    def test_equal_shapes_get_different_random_layouts(self):
        model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
        sparsify(model, block_size=B, density=0.5, layout="random")
        assert model[0].layout != model[1].layout

    def test_random_layout_copies_kept_blocks(self):
        original = mlp()
        model = copy.deepcopy(original)
        sparsify(model, block_size=B, density=0.5, layout="random")
        for i in (0, 2, 4):
            mask = _expanded(model[i].layout_mask)
            assert torch.equal(model[i].to_dense(), original[i].weight.detach() * mask)

    def test_callable_layout_is_called_with_shape(self):
        calls = []

        def fn(out_features, in_features, block_size):
            calls.append((out_features, in_features, block_size))
            return custom_layout(out_features, in_features, block_size)

        model = mlp()
        report = sparsify(model, block_size=B, density=0.5, layout=fn)
        assert calls == [(64, 32, B), (32, 64, B), (16, 32, B)]
        assert model[0].layout == custom_layout(64, 32, B)
        assert report.layout == "fn"

    @pytest.mark.parametrize("density", [0.0, 1.0])
    def test_density_ends(self, density):
        original = mlp()
        model = copy.deepcopy(original)
        sparsify(model, block_size=B, density=density)
        x = torch.randn(3, 32, dtype=torch.float64)
        assert_close(model(x), masked_dense(original, model)(x), torch.float64)
        assert model[0].layout.nnz == (0 if density == 0 else model[0].layout.mask.numel())

    @pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
    def test_dtype_device_requires_grad_and_mode_preserved(self, dtype):
        model = mlp(dtype)
        model[0].weight.requires_grad_(False)
        model[2].bias.requires_grad_(False)
        model[2].eval()
        sparsify(model, block_size=B, density=0.5)
        for i in (0, 2, 4):
            assert model[i].weight.dtype == dtype and model[i].bias.dtype == dtype
            assert model[i].weight.device.type == "cpu"
            assert model[i].layout_mask.device.type == "cpu"
        assert not model[0].weight.requires_grad and model[0].bias.requires_grad
        assert model[2].weight.requires_grad and not model[2].bias.requires_grad
        assert model[0].training and not model[2].training
        assert model(torch.randn(2, 32, dtype=dtype)).dtype == dtype

    def test_no_bias(self):
        model = nn.Sequential(nn.Linear(32, 32, bias=False, dtype=torch.float64))
        original = copy.deepcopy(model)
        sparsify(model, block_size=B, density=0.5)
        assert model[0].bias is None
        x = torch.randn(3, 32, dtype=torch.float64)
        assert_close(model(x), masked_dense(original, model)(x), torch.float64)


class TestSkips:
    def test_multihead_attention_out_proj_skipped_and_reported(self):
        original = AttentionBlock().double()
        model = copy.deepcopy(original)
        with pytest.warns(UserWarning, match="attn.out_proj"):
            report = sparsify(model, block_size=B, density=0.5)
        assert list(report.converted) == ["fc1", "fc2"]
        assert list(report.skipped) == ["attn.out_proj"]
        assert "MultiheadAttention" in report.skipped["attn.out_proj"]
        assert type(model.attn.out_proj) is type(original.attn.out_proj)
        x = torch.randn(2, 5, 32, dtype=torch.float64)
        assert_close(model(x), masked_dense(original, model)(x), torch.float64)
        model.eval()  # the attention's inference fast path reads out_proj.weight
        with torch.no_grad():
            assert_close(model(x), masked_dense(original, model).eval()(x), torch.float64)

    def test_transformer_encoder_layer_linears_skipped(self):
        # Its eval/no_grad fast path passes linear1.weight to a fused kernel that needs 2-D weights.
        model = nn.Sequential(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), nn.Linear(32, 32))
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert list(report.converted) == ["1"]
        assert set(report.skipped) == {"0.self_attn.out_proj", "0.linear1", "0.linear2"}
        assert "TransformerEncoderLayer" in report.skipped["0.linear1"]
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 5, 32))

    def test_not_divisible_skipped(self):
        model = nn.Sequential(nn.Linear(32, 10), nn.Linear(10, 32), nn.Linear(32, 32))
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert report.skipped == {
            "0": "out_features=10 is not divisible by block_size=8",
            "1": "in_features=10 is not divisible by block_size=8",
        }
        assert list(report.converted) == ["2"]

    def test_linear_subclass_skipped(self):
        class ScaledLinear(nn.Linear):
            def forward(self, x):
                return 2 * super().forward(x)

        model = nn.Sequential(ScaledLinear(32, 32), nn.Linear(32, 32))
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert "ScaledLinear is a subclass of nn.Linear" in report.skipped["0"]
        assert type(model[0]) is ScaledLinear

    def test_tied_weights_skipped(self):
        model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
        model[1].weight = model[0].weight
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert set(report.skipped) == {"0", "1"}
        assert "tied" in report.skipped["0"] and "1.weight" in report.skipped["0"]
        assert model[1].weight is model[0].weight
        assert list(report.converted) == ["2"]

    def test_hooked_module_skipped(self):
        model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
        model[0].register_forward_hook(lambda m, i, o: o * 2)
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert "forward_hooks" in report.skipped["0"]

    def test_root_linear_skipped(self):
        report = quiet_sparsify(nn.Linear(32, 32), block_size=B, density=0.5)
        assert report.converted == {} and "root" in report.skipped[""]

    def test_meta_device_skipped(self):
        model = nn.Sequential(nn.Linear(32, 32, device="meta"))
        report = quiet_sparsify(model, block_size=B, density=0.5)
        assert "meta" in report.skipped["0"]

    def test_strict_raises_and_leaves_model_untouched(self):
        model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 10))
        with pytest.raises(ValueError, match=r"strict=True.*1: out_features=10"):
            sparsify(model, block_size=B, density=0.5, strict=True)
        assert type(model[0]) is nn.Linear

    def test_no_warning_when_nothing_skipped(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sparsify(mlp(), block_size=B, density=0.5)


class TestSelection:
    def test_filter_fn_selects_and_reports_excluded(self):
        seen = []

        def only_first(name, module):
            seen.append((name, type(module)))
            return name == "0"

        model = mlp()
        report = sparsify(model, block_size=B, density=0.5, filter_fn=only_first)
        assert seen == [("0", nn.Linear), ("2", nn.Linear), ("4", nn.Linear)]
        assert list(report.converted) == ["0"] and report.excluded == ["2", "4"]
        assert isinstance(model[0], BlockSparseLinear) and type(model[2]) is nn.Linear

    def test_filter_fn_can_exclude_what_would_be_skipped(self):
        model = AttentionBlock()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            report = sparsify(model, block_size=B, density=0.5, filter_fn=lambda n, m: not n.startswith("attn"))
        assert report.skipped == {} and report.excluded == ["attn.out_proj"]

    def test_shared_module_converted_once_and_replaced_everywhere(self):
        shared = nn.Linear(32, 32)
        model = nn.ModuleDict({"a": nn.Sequential(shared, nn.ReLU()), "b": nn.Sequential(shared)})
        report = sparsify(model, block_size=B, density=0.5)
        assert list(report.converted) == ["a.0"]
        assert report.converted["a.0"].aliases == ("b.0",)
        assert isinstance(model["a"][0], BlockSparseLinear) and model["a"][0] is model["b"][0]

    def test_convertible_linears_matches_sparsify_and_changes_nothing(self):
        model = AttentionBlock()
        found = convertible_linears(model, block_size=B)
        assert list(found) == ["fc1", "fc2"] and all(type(m) is nn.Linear for m in found.values())
        assert list(quiet_sparsify(model, block_size=B, density=0.5).converted) == list(found)

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"density": 1.5}, "density"),
            ({"block_size": 0}, "block_size"),
            ({"layout": "uniform"}, "layout must be one of"),
            ({"layout": lambda o, i, b: layouts.random(o, o, b, 0.5)}, "expected"),
        ],
        ids=["density", "block_size", "layout-name", "layout-shape"],
    )
    def test_bad_arguments_raise(self, kwargs, match):
        args = {"block_size": B, "density": 0.5, **kwargs}
        model = nn.Sequential(nn.Linear(32, 64))
        with pytest.raises(ValueError, match=match):
            sparsify(model, **args)
        assert type(model[0]) is nn.Linear


class TestReport:
    def test_contents_and_str(self):
        model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 10), nn.Linear(64, 64))
        report = quiet_sparsify(model, block_size=B, density=0.25, filter_fn=lambda n, m: n != "2")
        assert report.converted == {
            "0": ConvertedModule("0", in_features=32, out_features=64, nnz_blocks=8, total_blocks=32)
        }
        assert report.converted["0"].density == 0.25
        assert report.weights_before == 32 * 64 and report.weights_after == 8 * B * B
        text = str(report)
        for piece in ("layout=magnitude", "block_size=8", "density=0.25", "converted 1", "2,048 -> 512 (25.0%)",
                      "64x32", "blocks 8/32", "skipped 1", "out_features=10 is not divisible", "excluded by filter_fn"):
            assert piece in text, (piece, text)

    def test_str_of_empty_report(self):
        report = sparsify(nn.Sequential(nn.ReLU()), block_size=B, density=0.5)
        assert "converted 0 module(s); weights 0 -> 0" in str(report)


class TestStateDict:
    def test_round_trip(self):
        original = AttentionBlock().double()
        source, target = copy.deepcopy(original), copy.deepcopy(original)
        quiet_sparsify(source, block_size=B, density=0.5)
        quiet_sparsify(target, block_size=B, density=0.5)  # same weights -> same layouts
        with torch.no_grad():
            for p in source.parameters():
                p.add_(torch.randn_like(p))
        buffer = io.BytesIO()
        torch.save(source.state_dict(), buffer)
        buffer.seek(0)
        target.load_state_dict(torch.load(buffer))
        x = torch.randn(2, 5, 32, dtype=torch.float64)
        assert torch.equal(target(x), source(x))
        assert set(source.state_dict()) >= {"fc1.weight", "fc1.bias", "fc1.layout_mask"}

    def test_load_into_different_layout_raises(self):
        source, target = mlp(), mlp()
        sparsify(source, block_size=B, density=0.5)
        sparsify(target, block_size=B, density=0.5, layout="random")
        with pytest.raises(ValueError, match="layout differs"):
            target.load_state_dict(source.state_dict())


# --------------------------------------------------------------------------- group lasso


def brute_block_norms(dense: torch.Tensor, b: int) -> torch.Tensor:
    rows, cols = dense.shape[0] // b, dense.shape[1] // b
    out = torch.empty(rows, cols, dtype=torch.float64)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = math.sqrt(float((dense[r * b:(r + 1) * b, c * b:(c + 1) * b].double() ** 2).sum()))
    return out


class TestGroupLasso:
    def test_block_norms_vs_brute_force(self):
        values = torch.randn(7, 4, 4, dtype=torch.float64)
        expected = torch.tensor([math.sqrt(float((v**2).sum())) for v in values], dtype=torch.float64)
        assert torch.allclose(block_norms(values), expected, rtol=1e-12, atol=0)

    def test_value_and_gradient_on_values(self):
        values = torch.randn(6, 8, 8, dtype=torch.float64)
        values[2] = 0  # a zero block: subgradient 0
        values.requires_grad_()
        penalty = group_lasso(values)
        norms = values.detach().flatten(1).norm(dim=1)
        assert torch.allclose(penalty, norms.sum(), rtol=1e-12, atol=0)
        penalty.backward()
        expected = values.detach() / norms.clamp(min=1e-300)[:, None, None]
        assert torch.allclose(values.grad, expected, rtol=1e-12, atol=0)
        assert torch.equal(values.grad[2], torch.zeros(8, 8, dtype=torch.float64))

    def test_gradcheck(self):
        values = torch.randn(4, 3, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(group_lasso, (values,))

    def test_model_sums_every_block_sparse_layer(self):
        model = mlp()
        sparsify(model, block_size=B, density=0.5)
        model.append(GatedBlockSparseLinear(16, 16, block_size=B, density=0.5, dtype=torch.float64))
        penalty = group_lasso(model)
        layers = [model[i] for i in (0, 2, 4, 5)]
        expected = sum(brute_block_norms(m.layout.to_dense(m.weight.detach()), B).sum().item() for m in layers)
        assert math.isclose(penalty.item(), expected, rel_tol=1e-12)
        penalty.backward()
        assert all(m.weight.grad is not None for m in layers)
        # An iterable mixes modules and values tensors.
        mixed = group_lasso([model[0], model[2].weight]).item()
        assert math.isclose(mixed, (group_lasso(model[0]) + group_lasso(model[2].weight)).item(), rel_tol=1e-12)

    def test_model_without_block_sparse_layers_raises(self):
        with pytest.raises(ValueError, match="dense_group_lasso"):
            group_lasso(mlp())

    def test_half_precision_does_not_overflow(self):
        values = torch.full((2, 16, 16), 300.0, dtype=torch.float16)  # sum of squares 2.3e7 > fp16 max
        penalty = group_lasso(values)
        assert penalty.dtype == torch.float32 and math.isclose(float(penalty), 2 * 300 * 16, rel_tol=1e-6)

    def test_dense_weight_vs_brute_force_and_gradient(self):
        weight = torch.randn(24, 40, dtype=torch.float64, requires_grad=True)
        norms = dense_block_norms(weight, B)
        assert torch.allclose(norms, brute_block_norms(weight.detach(), B), rtol=1e-12, atol=0)
        # Same numbers as the (detached, float32) norms that magnitude pruning ranks by.
        assert torch.allclose(norms.float(), magnitude_block_norms(weight, B), rtol=1e-5)
        dense_group_lasso(weight, B).backward()
        blockwise = norms.detach().repeat_interleave(B, 0).repeat_interleave(B, 1)
        assert torch.allclose(weight.grad, weight.detach() / blockwise, rtol=1e-12, atol=0)

    def test_dense_model_covers_what_sparsify_converts(self):
        model = AttentionBlock().double()
        penalty = dense_group_lasso(model, B)
        expected = sum(float(brute_block_norms(m.weight.detach(), B).sum()) for m in (model.fc1, model.fc2))
        assert math.isclose(penalty.item(), expected, rel_tol=1e-12)
        only_fc1 = dense_group_lasso(model, B, filter_fn=lambda n, m: n == "fc1")
        assert math.isclose(only_fc1.item(), brute_block_norms(model.fc1.weight.detach(), B).sum().item(), rel_tol=1e-12)
        with pytest.raises(ValueError, match="no nn.Linear"):
            dense_group_lasso(nn.Sequential(nn.Linear(10, 10)), B)

    def test_dense_weight_not_divisible_raises(self):
        with pytest.raises(ValueError, match="not divisible"):
            dense_group_lasso(torch.randn(10, 16), B)


# --------------------------------------------------------------------------- 2:4


def test_sparsify_2_4_converts_linears_to_semi_sparse():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 30), nn.Linear(30, 8))
    dense = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="left 2 module"):
        report = tilesparse.sparsify(model, pattern="2:4", semi24_options={"mask_every": 5})
    assert list(report.converted) == ["0"] and set(report.skipped) == {"2", "3"}
    assert "divisible by the 2:4 group size=4" in report.skipped["2"]
    layer = model[0]
    assert isinstance(layer, tilesparse.SemiSparseLinear) and layer.mask_every == 5
    assert report.weights_after * 2 == report.weights_before and report.converted["0"].density == 0.5
    assert tilesparse.semi24.is_24(layer.mask) and tilesparse.semi24.is_24(layer.mask.t())  # transposable
    x = torch.randn(4, 32)
    w = torch.where(layer.mask, dense[0].weight, torch.zeros(()))
    torch.testing.assert_close(layer(x), x @ w.t() + dense[0].bias)


def test_sparsify_2_4_refuses_block_arguments_and_unknown_patterns():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    with pytest.raises(ValueError, match="takes no block_size"):
        tilesparse.sparsify(model, pattern="2:4", block_size=4, density=0.5)
    with pytest.raises(ValueError, match="pattern must be"):
        tilesparse.sparsify(model, pattern="4:8")
    with pytest.raises(ValueError, match="needs block_size and density"):
        tilesparse.sparsify(model, block_size=4)
    with pytest.raises(ValueError, match="semi24_options"):
        tilesparse.sparsify(model, block_size=4, density=0.5, semi24_options={})
