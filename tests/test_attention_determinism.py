"""block_sparse_attention's ``deterministic`` switch: what reaches the op, torch's
deterministic mode overriding an opt-out, and the module passing it through. (The
atomic-dQ kernels themselves are checked against the float64 reference in
test_attention.py, under the interpreter and on the GPU.)"""

from __future__ import annotations

import pytest
import torch

from tilesparse import BlockSparseSelfAttention
from tilesparse.attention import block_sparse_attention, layouts
from tilesparse.ops import attention as ops


@pytest.fixture
def seen(monkeypatch):
    """The ``deterministic`` argument of every attention call (eager autograd or the op)."""
    calls = []
    real = ops._attend
    monkeypatch.setattr(ops, "_attend", lambda *args: calls.append(args[-1]) or real(*args))
    return calls


def _inputs():
    return [torch.randn(1, 2, 32, 16) for _ in range(3)], layouts.causal(32, 16)


def test_default_is_deterministic_and_an_opt_out_reaches_the_op(seen):
    (q, k, v), layout = _inputs()
    block_sparse_attention(q, k, v, layout)
    block_sparse_attention(q, k, v, layout, deterministic=False)
    assert seen == [True, False]


def test_torch_deterministic_mode_overrides_an_opt_out(seen):
    (q, k, v), layout = _inputs()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        block_sparse_attention(q, k, v, layout, deterministic=False)
    finally:
        torch.use_deterministic_algorithms(before)
    assert seen == [True]


def test_the_module_passes_it_through(seen):
    layout = layouts.local(32, 16, 16, causal=True)
    module = BlockSparseSelfAttention(32, 2, layout, deterministic=False)
    out = module(torch.randn(2, 32, 32))
    out.sum().backward()
    assert seen == [False] and module.qkv.weight.grad is not None
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        BlockSparseSelfAttention(32, 2, layout, deterministic="no")
