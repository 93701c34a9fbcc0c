"""The inputs the attention probes time (attention_gap.py, attention_profile.py,
sdpa_deterministic.py): one shape, so their numbers compare."""

from __future__ import annotations

import torch


def qkv_and_grad(shape) -> tuple[torch.Tensor, ...]:
    """(q, k, v, g): normal bf16 CUDA tensors of ``shape`` (B, H, S, D); q, k and v require
    grad, g is the output's gradient for the backward."""
    q, k, v, g = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    return q, k, v, g
