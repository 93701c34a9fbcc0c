"""block_sparse_attention's two routes to the same functions: the registered custom ops
(what torch.compile, export, dispatch modes and functorch transforms see) and the eager
autograd.Function that plain eager calls take (less host time). Both give the same bits;
compiled forward and backward trace the ops; the eager path refuses what the ops refuse."""

import pytest
import torch

from attention_cases import _seed, make_inputs, padding
from tilesparse.attention import block_sparse_attention, layouts
from tolerances import rel_error

# torch's own inductor import path warns about torch.jit.script_method; not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def test_compiled_matches_eager():
    # fullgraph=True: the op, its fake and the registered backward trace without a break.
    torch._dynamo.reset()
    layout = layouts.bigbird(64, 16, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(), num_heads=2)
    kpm = padding(2, 64, "tail")

    def f(q, k, v):
        return torch.tanh(block_sparse_attention(q, k, v, layout, causal=True, key_padding_mask=kpm)) * 2

    q, k, v = (t.requires_grad_() for t in make_inputs(2, 2, 1, 64, 32, torch.float32))
    grad = torch.randn(2, 2, 64, 32)
    y_eager = f(q, k, v)
    g_eager = torch.autograd.grad(y_eager, (q, k, v), grad)
    y_comp = torch.compile(f, fullgraph=True)(q, k, v)
    g_comp = torch.autograd.grad(y_comp, (q, k, v), grad)
    torch.testing.assert_close(y_comp, y_eager, rtol=1e-5, atol=1e-6)
    # inductor's fused tanh backward rounds in another order: ~1e-6 apart (1.004e-6 in CI)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6)
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd:UserWarning")  # torch's recording backend
def test_compiled_backward_graph_calls_registered_ops():
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    layout = layouts.causal(32, 16)
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 32, 32, torch.float32))
    out = torch.compile(lambda q, k, v: block_sparse_attention(q, k, v, layout), backend=backend,
                        fullgraph=True)(q, k, v)
    out.sum().backward()
    assert "tilesparse.block_sparse_attention_fwd" in "\n".join(g.code for g in backend.fw_graphs)
    assert "tilesparse.block_sparse_attention_bwd" in "\n".join(g.code for g in backend.bw_graphs)
    torch._dynamo.reset()


def _op_path_output_and_grads(q, k, v, layout, causal, kpm, grad, deterministic=True):
    """Forward + backward through the registered ops (what torch.compile traces)."""
    from tilesparse.ops import attention as ops

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    meta = layout.meta_on(q.device, causal)
    out = ops._fwd_op(q, k, v, meta, kpm, layout.layout_heads, layout.block_size, causal, q.shape[-1] ** -0.5,
                      deterministic)[0]
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def _eager_output_and_grads(q, k, v, layout, causal, kpm, grad, deterministic=True):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = block_sparse_attention(q, k, v, layout, causal=causal, key_padding_mask=kpm, deterministic=deterministic)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def test_eager_calls_skip_the_ops_and_give_their_results_bitwise(monkeypatch):
    # eager calls on plain tensors run the kernels under an autograd.Function (less host time
    # than the custom ops' dispatch); the same functions: bitwise the same output and gradients
    from tilesparse.ops import attention as ops

    layout = layouts.bigbird(80, 16, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(), num_heads=4)
    q, k, v = make_inputs(2, 4, 2, 80, 32, torch.float32)
    kpm, grad = padding(2, 80, "tail"), torch.randn(2, 4, 80, 32)
    op_calls = []
    for name in ("_fwd_op", "_bwd_op"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, name=name: op_calls.append(name) or real(*a))
    eager = _eager_output_and_grads(q, k, v, layout, True, kpm, grad)
    assert not op_calls
    want = _op_path_output_and_grads(q, k, v, layout, True, kpm, grad)
    assert op_calls == ["_fwd_op", "_bwd_op"]
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, want):
        assert torch.equal(a, b), name


def test_eager_attention_refuses_a_second_derivative():
    # as the op path: gradients built with create_graph come from the registered backward op,
    # which has no autograd formula, so differentiating them raises (a gradient penalty must
    # not silently lose its dependence on q, k, v)
    layout = layouts.causal(32, 16)
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 32, 16, torch.float32))
    out = block_sparse_attention(q, k, v, layout, causal=True)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        (out.sum() + dq.pow(2).sum()).backward()


def test_traced_and_transformed_calls_see_the_registered_op():
    # meta tensors, fake tensors from a FakeTensorMode, make_fx, a dispatch mode and vmap see
    # the op and its fake, as before eager calls skipped the op
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    layout = layouts.causal(32, 16)
    q, k, v = make_inputs(1, 2, 2, 32, 16, torch.float32)
    out = block_sparse_attention(*(t.to("meta") for t in (q, k, v)), layout, causal=True)
    assert out.device.type == "meta" and out.shape == q.shape
    with FakeTensorMode(allow_non_fake_inputs=True):
        assert type(block_sparse_attention(q, k, v, layout, causal=True)).__name__ == "FakeTensor"
    graph = make_fx(lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True))(q, k, v)
    assert "tilesparse.block_sparse_attention_fwd" in graph.code

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        block_sparse_attention(q, k, v, layout, causal=True)
    assert any("tilesparse" in name for name in Seen.ops)
    batched = torch.func.vmap(lambda q, k, v: block_sparse_attention(q, k, v, layout, causal=True))(
        *(t.unsqueeze(0).expand(2, *t.shape) for t in (q, k, v)))
    assert torch.equal(batched[1], block_sparse_attention(q, k, v, layout, causal=True))


def test_compiled_autograd_traces_the_registered_backward():
    torch._dynamo.reset()
    layout = layouts.causal(32, 16)
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 32, 16, torch.float32))
    want = torch.autograd.grad(block_sparse_attention(q, k, v, layout, causal=True).pow(2).sum(), (q, k, v))
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager", fullgraph=True)):
        block_sparse_attention(q, k, v, layout, causal=True).pow(2).sum().backward()
    for got, w in zip((q.grad, k.grad, v.grad), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_gpu_eager_calls_give_the_ops_results(deterministic):
    # the eager autograd.Function and the registered ops run the same kernels: bitwise the
    # same output, dK and dV (with deterministic=False dQ's adds land in any order: close)
    layout = layouts.bigbird(1000, 128, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(),
                             num_heads=4)
    q, k, v = (t.cuda() for t in make_inputs(2, 4, 2, 1000, 128, torch.bfloat16))
    kpm, grad = padding(2, 1000, "tail").cuda(), torch.randn(2, 4, 1000, 128, device="cuda", dtype=torch.bfloat16)
    eager = _eager_output_and_grads(q, k, v, layout, False, kpm, grad, deterministic)
    want = _op_path_output_and_grads(q, k, v, layout, False, kpm, grad, deterministic)
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, want):
        if name == "dq" and not deterministic:
            assert rel_error(a, b) < 1e-2, name
        else:
            assert torch.equal(a, b), name
