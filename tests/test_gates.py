"""Per-block gates: the gated product (gradcheck in float64 on the CPU reference path),
GatedBlockSparseLinear, and the hard-concrete L0 gate.

Shapes are small (48 x 32, block 8: 6 x 4 blocks, some empty block-rows at density 0.5)
because every check here is about the gate algebra, which the kernels never see.
"""

import copy
import math

import pytest
import torch
from torch import nn

from tilesparse import BlockSparseLinear, block_sparse_linear, layouts
from tilesparse.sparsity import (
    GatedBlockSparseLinear,
    HardConcreteGate,
    gated_block_sparse_linear,
    l0_penalty,
)
from tolerances import assert_close

B, OUT, IN = 8, 48, 32
F64 = torch.float64


def gated_layer(**kwargs) -> GatedBlockSparseLinear:
    return GatedBlockSparseLinear(IN, OUT, block_size=B, density=0.5, seed=1, dtype=F64, **kwargs)


def dense_reference(x, weight, gates, layout, bias):
    dense = layout.to_dense(weight * gates[:, None, None])
    return x @ dense.t() + bias


# --------------------------------------------------------------------------- the gated product


class TestGatedProduct:
    def test_gradcheck(self):
        # Smaller than the other cases (a 3 x 2 grid of 4 x 4 blocks): gradcheck perturbs
        # every input element, and one block left out still covers the sparse case.
        layout = layouts.random(12, 8, 4, 5 / 6, seed=2)
        x = torch.randn(3, 8, dtype=F64, requires_grad=True)
        weight = torch.randn(layout.nnz, 4, 4, dtype=F64, requires_grad=True)
        gates = torch.rand(layout.nnz, dtype=F64, requires_grad=True)
        bias = torch.randn(12, dtype=F64, requires_grad=True)
        fn = lambda x, w, g, b: gated_block_sparse_linear(x, w, g, layout, b)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, weight, gates, bias))

    def test_matches_dense_reference(self):
        layout = layouts.balanced(OUT, IN, B, 0.5, seed=3)
        x = torch.randn(2, 5, IN, dtype=F64)
        weight = torch.randn(layout.nnz, B, B, dtype=F64)
        gates, bias = torch.randn(layout.nnz, dtype=F64), torch.randn(OUT, dtype=F64)
        out = gated_block_sparse_linear(x, weight, gates, layout, bias)
        assert_close(out, dense_reference(x, weight, gates, layout, bias), F64)

    def test_wrong_gate_shape_raises(self):
        layout = layouts.random(OUT, IN, B, 0.5)
        weight = torch.randn(layout.nnz, B, B)
        with pytest.raises(ValueError, match="gates must have shape"):
            gated_block_sparse_linear(torch.randn(2, IN), weight, torch.ones(layout.nnz + 1), layout)


# --------------------------------------------------------------------------- the module


class TestGatedModule:
    def test_gates_start_at_one_and_layer_equals_ungated(self):
        m = gated_layer()
        assert isinstance(m.gates, nn.Parameter) and m.gates.shape == (m.layout.nnz,)
        assert torch.equal(m.gates, torch.ones_like(m.gates)) and m.gates.dtype == F64
        assert m.gate is None
        x = torch.randn(4, IN, dtype=F64)
        assert torch.equal(m(x), block_sparse_linear(x, m.weight, m.layout, m.bias))
        assert {n for n, _ in m.named_parameters()} == {"weight", "bias", "gates"}

    def test_gradients_reach_gates(self):
        m = gated_layer()
        with torch.no_grad():
            m.gates.uniform_(0.5, 1.5)
        x = torch.randn(4, IN, dtype=F64)
        grad = torch.randn(4, OUT, dtype=F64)
        m(x).backward(grad)
        # Reference: the gradient of the ungated weight W' = W * g, then the chain rule.
        w_eff = (m.weight.detach() * m.gates.detach()[:, None, None]).requires_grad_()
        block_sparse_linear(x, w_eff, m.layout, m.bias.detach()).backward(grad)
        assert_close(m.gates.grad, (w_eff.grad * m.weight.detach()).sum(dim=(1, 2)), F64, "d gates")
        assert_close(m.weight.grad, w_eff.grad * m.gates.detach()[:, None, None], F64, "d weight")

    def test_zero_gate_removes_block_exactly(self):
        m = gated_layer()
        closed = 1
        with torch.no_grad():
            m.gates[closed] = 0.0
        x = torch.randn(6, IN, dtype=F64)
        out = m(x)
        # Bitwise: the same product with that block's values zeroed.
        zeroed = m.weight.detach().clone()
        zeroed[closed] = 0
        assert torch.equal(out, block_sparse_linear(x, zeroed, m.layout, m.bias))
        # The closed block's values never reach the output: changing them changes nothing.
        with torch.no_grad():
            m.weight[closed] = torch.randn(B, B, dtype=F64) * 1e6
        assert torch.equal(m(x), out)
        # And equal to the layout without that block.
        pruned = m.to_block_sparse()
        assert pruned.layout.nnz == m.layout.nnz - 1
        assert_close(pruned(x), out, F64)
        # The closed block gets no weight gradient; its gate does (it can reopen).
        m(x).sum().backward()
        assert torch.equal(m.weight.grad[closed], torch.zeros(B, B, dtype=F64))
        assert m.gates.grad[closed] != 0

    def test_to_block_sparse_folds_gates_and_keeps_order(self):
        m = gated_layer()
        with torch.no_grad():
            m.gates.copy_(torch.randn(m.layout.nnz, dtype=F64))
            m.gates[::3] = 0
        pruned = m.to_block_sparse()
        assert type(pruned) is BlockSparseLinear and pruned.weight.dtype == F64
        assert pruned.layout.nnz == int((m.gates != 0).sum())
        assert torch.equal(pruned.to_dense(), m.to_dense())
        x = torch.randn(3, IN, dtype=F64)
        assert_close(pruned(x), m(x), F64)
        assert m.to_block_sparse(threshold=math.inf).layout.nnz == 0

    def test_from_block_sparse_and_from_dense(self):
        plain = BlockSparseLinear(IN, OUT, block_size=B, density=0.5, dtype=F64)
        gated = GatedBlockSparseLinear.from_block_sparse(plain)
        x = torch.randn(3, IN, dtype=F64)
        assert gated.layout == plain.layout and torch.equal(gated(x), plain(x))
        linear = nn.Linear(IN, OUT, dtype=F64)
        from_dense = GatedBlockSparseLinear.from_dense(linear, block_size=B, density=0.25)
        assert isinstance(from_dense, GatedBlockSparseLinear)
        assert torch.equal(from_dense.gates, torch.ones(from_dense.layout.nnz, dtype=F64))
        assert torch.equal(from_dense(x), BlockSparseLinear.from_dense(linear, block_size=B, density=0.25)(x))

    def test_state_dict_round_trip(self):
        source = gated_layer()
        with torch.no_grad():
            source.gates.uniform_()
        target = gated_layer()
        target.load_state_dict(source.state_dict())
        assert "gates" in source.state_dict()
        x = torch.randn(2, IN, dtype=F64)
        assert torch.equal(target(x), source(x))

    def test_low_precision_weight_with_float32_gate(self):
        m = GatedBlockSparseLinear(IN, OUT, block_size=B, density=0.5, gate="hard_concrete", dtype=torch.bfloat16)
        assert m.gate.log_alpha.dtype == torch.float32
        out = m.eval()(torch.randn(2, IN, dtype=torch.bfloat16))
        assert out.dtype == torch.bfloat16

    def test_reset_parameters_reopens_gates(self):
        m = gated_layer()
        with torch.no_grad():
            m.gates.zero_()
        m.reset_parameters()
        assert torch.equal(m.gates, torch.ones_like(m.gates))

    def test_bad_gate_argument(self):
        with pytest.raises(TypeError, match="gate must be"):
            gated_layer(gate="l0")


# --------------------------------------------------------------------------- hard concrete


class TestHardConcrete:
    def test_sample_range_and_exact_ends(self):
        gate = HardConcreteGate(50_000, droprate_init=0.5)  # log_alpha = 0
        z = gate.sample()
        assert z.min() >= 0 and z.max() <= 1
        # The stretch puts mass on exactly 0 and exactly 1.
        assert (z == 0).any() and (z == 1).any() and ((z > 0) & (z < 1)).any()
        # P(z != 0) matches prob_open (binomial std ~ 0.002).
        assert abs((z != 0).double().mean().item() - gate.prob_open()[0].item()) < 0.01

    def test_train_samples_eval_is_deterministic(self):
        gate = HardConcreteGate(64)
        with torch.no_grad():
            gate.log_alpha.copy_(torch.linspace(-6, 6, 64))
        assert not torch.equal(gate(), gate())  # training: fresh noise each call
        gate.eval()
        first = gate()
        assert torch.equal(first, gate())
        expected = (torch.sigmoid(gate.log_alpha) * 1.2 - 0.1).clamp(0, 1)
        assert torch.allclose(first, expected)
        assert first[0] == 0 and first[-1] == 1

    def test_seeded_sample_is_reproducible(self):
        gate = HardConcreteGate(16)
        a = gate.sample(torch.Generator().manual_seed(5))
        assert torch.equal(a, gate.sample(torch.Generator().manual_seed(5)))

    def test_default_init_starts_nearly_open(self):
        z = HardConcreteGate(4).eval()()
        assert torch.allclose(z, torch.full((4,), 0.9 * 1.2 - 0.1))

    def test_l0_penalty_monotone_in_log_alpha(self):
        gate = HardConcreteGate(8)
        values = []
        for log_alpha in torch.linspace(-8, 8, 17):
            with torch.no_grad():
                gate.log_alpha.fill_(log_alpha)
            values.append(gate.l0_penalty().item())
        assert all(a < b for a, b in zip(values, values[1:]))
        assert 0 < values[0] < 0.01 * 8 and 0.99 * 8 < values[-1] < 8
        with torch.no_grad():
            gate.log_alpha.zero_()
        expected = 8 / (1 + math.exp(-(0 - 2 / 3 * math.log(0.1 / 1.1))))
        assert math.isclose(gate.l0_penalty().item(), expected, rel_tol=1e-6)

    def test_gradients_of_sample_and_penalty(self):
        gate = HardConcreteGate(32, droprate_init=0.5, dtype=F64)
        gate.sample().sum().backward()
        assert gate.log_alpha.grad is not None and (gate.log_alpha.grad >= 0).all()
        gate.log_alpha.grad = None
        gate.l0_penalty().backward()
        assert (gate.log_alpha.grad > 0).all()

    @pytest.mark.parametrize("kwargs", [{"droprate_init": 0.0}, {"beta": 0.0}, {"limits": (0.0, 1.1)}])
    def test_bad_arguments(self, kwargs):
        with pytest.raises(ValueError):
            HardConcreteGate(4, **kwargs)

    def test_gated_layer_with_hard_concrete(self):
        m = gated_layer(gate="hard_concrete")
        assert m.gates is None and isinstance(m.gate, HardConcreteGate) and m.gate.n == m.layout.nnz
        x = torch.randn(4, IN, dtype=F64)
        assert not torch.equal(m(x), m(x))  # training: stochastic
        m.eval()
        out = m(x)
        assert torch.equal(out, m(x))
        assert_close(m.to_block_sparse()(x), out, F64)
        m.train()
        (m(x).pow(2).mean() + 0.1 * l0_penalty(m)).backward()
        assert m.gate.log_alpha.grad is not None and m.weight.grad is not None

    def test_l0_penalty_sums_over_model(self):
        model = nn.Sequential(gated_layer(gate="hard_concrete"), nn.ReLU(), copy.deepcopy(gated_layer(gate="hard_concrete")))
        total = l0_penalty(model)
        assert math.isclose(total.item(), (model[0].gate.l0_penalty() + model[2].gate.l0_penalty()).item(), rel_tol=1e-6)
        with pytest.raises(ValueError, match="no HardConcreteGate"):
            l0_penalty(gated_layer())


def test_compile_fullgraph_matches_eager():
    # Conventions: modules are also tested under torch.compile(fullgraph=True).
    m = gated_layer()
    with torch.no_grad():
        m.gates.uniform_()
    x = torch.randn(4, IN, dtype=F64)
    compiled = torch.compile(m, fullgraph=True)
    out = compiled(x)
    assert_close(out, m(x), F64)
    out.sum().backward()
    assert m.gates.grad is not None and m.gates.grad.shape == (m.layout.nnz,)
