"""torch.compile(fullgraph=True) traces the registered ops (CPU: the reference kernel,
inductor generates C++ around it, so gcc is needed) and matches eager, forward and
backward. fullgraph=True turns any graph break into an error.

Each compile costs ~10-20 s on a 2-core CPU, so there are few, small cases.
"""

import copy

import pytest
import torch
from torch import nn

import tilesparse
from tilesparse import BlockSparseLinear

# torch's own inductor import path warns about torch.jit.script_method; not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

# Compiled and eager run the same reference op; only inductor's fusion of the
# surrounding elementwise ops (GELU, bias) can change rounding, by a few ulps of each
# elementwise result. A gradient element sums such results, so its difference is bounded
# by a few ulps of the terms it sums, not of itself: where the terms cancel, an element
# near zero differs by more than ulps of its own value (seen: 1.04e-6 on an element of a
# gradient whose entries reach ~10). The absolute bound is therefore relative to the
# tensor's largest entry: 16 fp32 ulps of it.
RTOL = 1e-5
ATOL_OF_MAX = 16 * torch.finfo(torch.float32).eps


def assert_matches_eager(got: torch.Tensor, want: torch.Tensor, msg: str | None = None) -> None:
    atol = ATOL_OF_MAX * float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=RTOL, atol=atol, msg=msg)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_module_matches_eager():
    eager = nn.Sequential(
        BlockSparseLinear(32, 64, block_size=16, density=0.5, seed=1),
        nn.GELU(),
        BlockSparseLinear(64, 32, block_size=8, density=0.5, seed=2),
    )
    # The compiled copy has never run: its layouts' tables are not cached yet, so the
    # trace also covers building them.
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)

    x = torch.randn(2, 7, 32)
    x_eager = x.clone().requires_grad_()
    x_comp = x.clone().requires_grad_()
    grad = torch.randn(2, 7, 32)

    y_eager = eager(x_eager)
    y_comp = compiled(x_comp)
    assert_matches_eager(y_comp, y_eager)
    y_eager.backward(grad)
    y_comp.backward(grad)
    assert_matches_eager(x_comp.grad, x_eager.grad)
    for (name, p_eager), (_, p_comp) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        assert p_comp.grad is not None, name
        assert_matches_eager(p_comp.grad, p_eager.grad, msg=name)


def test_compiling_a_layer_warns_nothing():
    """Tracing the layer's forward raises no warning (review, 2026-12-04: an lru_cache-wrapped helper in
    the forward made Dynamo warn on every compile, an error under ``-W error``)."""
    import warnings

    m = BlockSparseLinear(32, 64, block_size=16, density=0.5, seed=1)
    x = torch.randn(3, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with torch.no_grad():
            y = torch.compile(m, fullgraph=True, backend="eager")(x)
    assert_matches_eager(y, m(x))


def test_compiled_functional_matches_eager():
    layout = tilesparse.layouts.random(48, 32, 16, 0.5, seed=int(torch.randint(1000, ())))
    weight = torch.randn(layout.nnz, 16, 16, requires_grad=True)
    bias = torch.randn(48, requires_grad=True)
    x = torch.randn(9, 32, requires_grad=True)

    def f(x, weight, bias):
        return torch.nn.functional.gelu(tilesparse.block_sparse_linear(x, weight, layout, bias))

    compiled = torch.compile(f, fullgraph=True)
    grad = torch.randn(9, 48)
    y_comp = compiled(x, weight, bias)
    grads_comp = torch.autograd.grad(y_comp, (x, weight, bias), grad)
    y_eager = f(x, weight, bias)
    grads_eager = torch.autograd.grad(y_eager, (x, weight, bias), grad)
    assert_matches_eager(y_comp, y_eager)
    for name, g_comp, g_eager in zip(("x", "weight", "bias"), grads_comp, grads_eager):
        assert_matches_eager(g_comp, g_eager, msg=name)


def test_compiled_backward_graph_calls_registered_ops():
    # The backward that AOTAutograd traces must call the opaque registered ops: an eager
    # kernel launch there would receive fake tensors (on CUDA, "Cannot access data pointer
    # of Tensor"). On CPU the reference path would trace through silently, so check the
    # recorded graphs instead of relying on an error.
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    backend = AotEagerAndRecordGraphs()
    model = tilesparse.BlockSparseLinear(64, 32, block_size=16, density=0.5)
    x = torch.randn(8, 64, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend, fullgraph=True)(x)
    out.sum().backward()
    forward_code = "\n".join(g.code for g in backend.fw_graphs)
    backward_code = "\n".join(g.code for g in backend.bw_graphs)
    assert "tilesparse.dds" in forward_code
    assert "tilesparse.dds" in backward_code and "tilesparse.sdd" in backward_code


@pytest.mark.parametrize("with_state", [False, True], ids=["no_state", "h0_c0"])
def test_compiled_lstm_module_matches_eager(with_state):
    # Under torch.compile the recurrence is the registered op tilesparse::lstm_forward (its
    # backward tilesparse::lstm_backward), so the whole module traces with fullgraph=True.
    # Regression: dynamo once crashed tracing into the eager path's table cache.
    torch.manual_seed(0)
    eager = tilesparse.BlockSparseLSTM(16, 32, block_size=8, density=0.5, batch_first=True, seed=0)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(2, 5, 16)
    state = (torch.randn(1, 2, 32, requires_grad=True), torch.randn(1, 2, 32, requires_grad=True))
    state_e = tuple(s.detach().clone().requires_grad_() for s in state) if with_state else None
    state_c = tuple(s.detach().clone().requires_grad_() for s in state) if with_state else None
    out_e, (h_e, c_e) = eager(x, state_e)
    out_c, (h_c, c_c) = compiled(x, state_c)
    for got, want in ((out_c, out_e), (h_c, h_e), (c_c, c_e)):
        assert_matches_eager(got, want)
    (out_e.sum() + 2 * h_e.sum() + 3 * c_e.sum()).backward()
    (out_c.sum() + 2 * h_c.sum() + 3 * c_c.sum()).backward()
    for (name, p_e), (_, p_c) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        assert_matches_eager(p_c.grad, p_e.grad, msg=name)
    if with_state:
        for s_c, s_e in zip(state_c, state_e):
            assert_matches_eager(s_c.grad, s_e.grad)


class _EveryModule(nn.Module):
    """One model using each module: a block-sparse linear, a gated one (hard-concrete
    gates, deterministic in eval), block-sparse self-attention, a 2:4 linear, a block-sparse
    LSTM."""

    def __init__(self, features=16, width=32, block_size=8, seq=32):
        super().__init__()
        from tilesparse.attention import layouts as attention_layouts
        from tilesparse.sparsity import GatedBlockSparseLinear

        self.inp = BlockSparseLinear(features, width, block_size=block_size, density=0.5, seed=1)
        self.gated = GatedBlockSparseLinear(width, width, block_size=block_size, density=0.5, seed=2,
                                            gate="hard_concrete")
        self.attn = tilesparse.BlockSparseSelfAttention(width, 2, attention_layouts.local(seq, 16, window=16,
                                                                                          causal=True))
        self.semi = tilesparse.SemiSparseLinear(width, width)
        self.lstm = tilesparse.BlockSparseLSTM(width, width // 2, block_size=block_size, density=0.5,
                                               batch_first=True, seed=3)

    def forward(self, x):
        h = torch.relu(self.gated(self.inp(x)))
        out, _ = self.lstm(self.semi(h + self.attn(h)))
        return out


def test_a_model_using_every_module_compiles_fullgraph():
    torch.manual_seed(0)
    eager = _EveryModule().eval()  # eval: deterministic gates, so both runs see the same ones
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(2, 5, 16)
    y_e, y_c = eager(x), compiled(x)
    assert_matches_eager(y_c, y_e)
    y_e.square().sum().backward()
    y_c.square().sum().backward()
    for (name, p_e), (_, p_c) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        if p_e.grad is None:
            assert p_c.grad is None, name
            continue
        assert_matches_eager(p_c.grad, p_e.grad, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16_autocast"])
def test_gpu_model_using_every_module_compiles_fullgraph(amp):
    """The same model on the GPU (the Triton kernels, cuSPARSELt or its dense fallback),
    in fp32 and under bf16 autocast: compiled fullgraph matches eager, forward and every
    parameter's gradient."""
    import contextlib

    from tolerances import REL_TOL, rel_error

    torch.manual_seed(0)
    eager = _EveryModule(features=64, width=128, block_size=16, seq=64).cuda().eval()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(2, 64, 64, device="cuda")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    tol = REL_TOL[torch.bfloat16 if amp else torch.float32] * 4  # inductor fuses around the ops differently
    with autocast():
        y_e, y_c = eager(x), compiled(x)
    assert y_c.dtype == y_e.dtype and rel_error(y_c, y_e) <= tol
    y_e.float().square().sum().backward()
    y_c.float().square().sum().backward()
    for (name, p_e), (_, p_c) in zip(eager.named_parameters(), compiled_model.named_parameters()):
        if p_e.grad is None:
            assert p_c.grad is None, name
            continue
        assert p_c.grad.dtype == p_e.grad.dtype == torch.float32, name  # fp32 master weights
        assert rel_error(p_c.grad, p_e.grad) <= tol, name
