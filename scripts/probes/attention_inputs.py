"""The inputs the attention probes time (attention_gap.py, attention_profile.py,
attention_drift.py, attention_power.py, sdpa_deterministic.py): one shape, so their numbers
compare, and each method's calls on a suite pattern, built as the suite builds them."""

from __future__ import annotations

import torch


def qkv_and_grad(shape) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g): normal bf16 CUDA tensors of ``shape`` (B, H, S, D); q, k and v require
    grad, g is the output's gradient for the backward."""
    q, k, v, g = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    return q, k, v, g


def pattern_methods(spec: dict, methods, q, k, v, g, block: int):
    """(method, (forward fn, forward + backward fn)) for each of ``methods`` that runs on
    the attention suite's pattern ``spec`` (its layout built for q's heads and length, as
    the suite builds it), printing why any other cannot."""
    from tilesparse.bench.attention import _make_fns, build_layout

    heads, seq = q.shape[1], q.shape[2]
    layout, causal = build_layout(spec, seq, block, heads), bool(spec.get("causal", False))
    for method in methods:
        fns, why = _make_fns(method, q, k, v, layout, causal, spec["name"], g)
        if fns is None:
            print(f"{method} {spec['name']}: {why}")
            continue
        yield method, fns
