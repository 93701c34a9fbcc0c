"""block_sparse_attention hands plain (causal) attention to SDPA on the GPU
(``dense_fallback``): which layouts count as dense, that SDPA computes the same function
there (checked on the CPU against the library's own path), when the hand-off happens,
and, on the GPU, that it does."""

import types

import pytest
import torch
from torch.nn import functional as F

from tilesparse.attention import AttentionLayout, block_sparse_attention, layouts
from tilesparse.ops import attention as attention_ops
from tolerances import assert_close


def _inputs(B, H, S, D, dtype=torch.float64, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(int(torch.randint(2**31 - 1, ())))
    return [torch.randn(B, H, S, D, generator=gen, device=device, dtype=torch.float32).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("S, b", [(64, 16), (70, 16)], ids=["whole_blocks", "partial_last_block"])
def test_dense_layouts_are_recognised(S, b):
    nb = -(-S // b)
    full = AttentionLayout(torch.ones(nb, nb, dtype=torch.bool), b, S)
    assert full.is_dense(False) and full.is_dense(True)
    causal = layouts.causal(S, b)
    assert causal.is_dense(True) and not causal.is_dense(False)
    per_head = torch.ones(3, nb, nb, dtype=torch.bool)
    assert AttentionLayout(per_head, b, S).is_dense(False)
    per_head[1, 0, nb - 1] = False  # one block of one head missing
    assert not AttentionLayout(per_head, b, S).is_dense(False)
    assert AttentionLayout(per_head, b, S).is_dense(True)  # the missing block lies above the diagonal
    assert not layouts.local(S, b, 2 * b, causal=True).is_dense(True)


def test_is_dense_is_settled_before_a_compiled_trace_asks():
    layout = layouts.causal(64, 16)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        return x * 2 if layout.is_dense(True) else x

    assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))


# (the causal builder's pattern without causal masking keeps whole diagonal blocks: not dense)
@pytest.mark.parametrize("pattern, causal", [("full", False), ("full", True), ("causal_builder", True),
                                             ("full_per_head", False), ("full_per_head", True)])
@pytest.mark.parametrize("S", [64, 70])
def test_sdpa_computes_the_dense_layouts_function(pattern, causal, S):
    """The library's CPU path (never handed off) on a dense layout equals SDPA, in
    float64, with gradients: what the hand-off relies on."""
    b = 16
    nb = -(-S // b)
    if pattern == "causal_builder":
        layout = layouts.causal(S, b)
    else:
        layout = AttentionLayout(torch.ones(*((3,) if pattern == "full_per_head" else ()), nb, nb, dtype=torch.bool),
                                 b, S)
    assert layout.is_dense(causal)
    q, k, v = (t.requires_grad_() for t in _inputs(2, 3, S, 32))
    grad = torch.randn(2, 3, S, 32, dtype=torch.float64)
    ours = block_sparse_attention(q, k, v, layout, causal=causal, scale=0.2)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2)
    assert_close(ours, sdpa.detach(), torch.float64, "out")
    for a, r in zip(torch.autograd.grad(ours, (q, k, v), grad), torch.autograd.grad(sdpa, (q, k, v), grad)):
        assert_close(a, r.detach(), torch.float64, "grad")


def _stand_in(dtype=torch.bfloat16, heads=4, cuda=True, requires_grad=False):
    return types.SimpleNamespace(is_cuda=cuda, shape=(2, heads, 64, 32), dtype=dtype, requires_grad=requires_grad)


@pytest.mark.parametrize("case, expected", [
    ({}, True),
    ({"cpu": True}, False),
    ({"dtype": torch.float32}, False),
    ({"kv_heads": 2}, False),
    ({"padding": True}, False),
    ({"layout": "local"}, False),
    ({"grad": True}, False),  # deterministic gradients wanted: SDPA's backward is not bitwise reproducible
    ({"grad": True, "deterministic": False}, True),
    ({"grad": True, "no_grad_mode": True}, True),
    ({"v_grad": True}, False),  # a gradient wanted for v alone counts too
    ({"v_grad": True, "deterministic": False}, True),
    ({"causal": False}, False),  # the causal block pattern without causal masking is not dense
    ({"causal": False, "layout": "full"}, True),
])
def test_when_the_call_is_handed_to_sdpa(case, expected):
    q = _stand_in(dtype=case.get("dtype", torch.bfloat16), cuda=not case.get("cpu"), requires_grad=case.get("grad"))
    k = _stand_in(heads=case.get("kv_heads", 4))
    v = _stand_in(heads=case.get("kv_heads", 4), requires_grad=case.get("v_grad"))
    layout = {"local": layouts.local(64, 16, 32, causal=True), "full": AttentionLayout(
        torch.ones(4, 4, dtype=torch.bool), 16, 64)}.get(case.get("layout"), layouts.causal(64, 16))
    padding = torch.zeros(2, 64, dtype=torch.bool) if case.get("padding") else None
    with torch.set_grad_enabled(not case.get("no_grad_mode")):
        got = attention_ops._runs_as_sdpa(q, k, v, layout, case.get("causal", True), padding,
                                          case.get("deterministic", True))
    assert got is expected


def test_dense_fallback_must_be_a_bool():
    q, k, v = _inputs(1, 1, 32, 16, torch.float32)
    with pytest.raises(TypeError, match="dense_fallback"):
        block_sparse_attention(q, k, v, layouts.causal(32, 16), causal=True, dense_fallback=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_dense_layout_runs_as_sdpa_and_matches_the_kernel(monkeypatch, dtype):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(attention_ops.F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or sdpa(*a, **kw))
    layout = layouts.causal(1000, 64)
    q, k, v = _inputs(2, 4, 1000, 64, dtype, "cuda")
    with torch.no_grad():
        handed = block_sparse_attention(q, k, v, layout, causal=True)
        kernel = block_sparse_attention(q, k, v, layout, causal=True, dense_fallback=False)
    assert len(calls) == 1 and calls[0]["is_causal"] is True
    assert_close(handed, kernel.float().double().cpu(), dtype, "SDPA against the block-sparse kernel")
    q.requires_grad_()
    block_sparse_attention(q, k, v, layout, causal=True)  # deterministic gradients wanted: the kernels
    assert len(calls) == 1
    block_sparse_attention(q, k, v, layout, causal=True, deterministic=False)
    assert len(calls) == 2
