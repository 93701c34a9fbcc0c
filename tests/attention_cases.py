"""Shared by the attention kernel tests: inputs, key padding, the float64 reference with
gradients, and one call of the kernels' forward and backward (tilesparse.kernels.attention
called directly, so on CPU tensors they run under the Triton interpreter)."""

import functools
import math

import torch

from bsmm_cases import INTERPRETER_MARKS
from tilesparse.attention.reference import attention_reference, token_mask
from tilesparse.kernels import attention as kernels
from tolerances import assert_close


def interpreter(test):
    """Mark a test that runs the Triton kernels on CPU tensors (the interpreter)."""
    return functools.reduce(lambda t, mark: mark(t), INTERPRETER_MARKS, test)


def _seed() -> int:
    return int(torch.randint(0, 2**31 - 1, ()))  # the conftest seeds the generator per test


def make_inputs(B, H, Hkv, S, D, dtype, device="cpu", seq_major=False):
    """q [B, H, S, D], k, v [B, Hkv, S, D]. ``seq_major``: views of [B, S, H, D] tensors
    (the usual projection output), so the kernels see non-contiguous strides."""
    def one(heads):
        if seq_major:
            return torch.randn(B, S, heads, D, device=device).to(dtype).transpose(1, 2)
        return torch.randn(B, heads, S, D, device=device).to(dtype)
    return one(H), one(Hkv), one(Hkv)


def padding(B, S, kind):
    """key_padding_mask: None, 'tail' (batch element 1 keeps only its first 2/3 of keys),
    or 'all' (batch element 0 entirely padding: every row empty)."""
    if kind is None:
        return None
    kpm = torch.zeros(B, S, dtype=torch.bool)
    if kind == "tail":
        kpm[-1, (2 * S) // 3:] = True
    elif kind == "all":
        kpm[0, :] = True
    return kpm


def reference_with_grads(q, k, v, layout, grad_out, **kw):
    """(out, lse, (dq, dk, dv)) of the float64 reference, on the inputs as rounded."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = attention_reference(q64, k64, v64, layout, return_lse=True, **kw)
    grads = torch.autograd.grad(out, (q64, k64, v64), grad_out.double())
    return out.detach(), lse.detach(), grads


def empty_rows(layout, S, causal, kpm, H):
    """[B or 1, H, S] bool: queries with no kept key."""
    keep = token_mask(layout, S, causal, kpm)
    return ~keep.any(-1).expand(-1, H, -1)


def run_kernels(q, k, v, layout, causal, kpm, scale, grad_out, configs=None, deterministic=True):
    meta = layout.meta_on(q.device, causal)
    fwd_cfg, bwd_cfgs = (None, None) if configs is None else (configs[0], configs[1:])
    out, lse = kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, layout.block_size, causal, scale,
                                         config=fwd_cfg)
    grads = kernels.attention_backward(grad_out, q, k, v, out, lse, meta, kpm, layout.layout_heads,
                                       layout.block_size, causal, scale, configs=bwd_cfgs,
                                       deterministic=deterministic)
    return out, lse, grads


def check_case(layout, B, H, Hkv, D, dtype, causal, kpm_kind, *, scale=None, seq_major=False, configs=None,
               deterministic=True):
    S = layout.seq_len
    q, k, v = make_inputs(B, H, Hkv, S, D, dtype, seq_major=seq_major)
    kpm = padding(B, S, kpm_kind)
    scale_ = 1.0 / math.sqrt(D) if scale is None else scale
    grad_out = torch.randn(B, H, S, D).to(dtype)
    out, lse, grads = run_kernels(q, k, v, layout, causal, kpm, scale_, grad_out, configs, deterministic)
    ref, ref_lse, ref_grads = reference_with_grads(q, k, v, layout, grad_out, causal=causal, scale=scale_,
                                                   key_padding_mask=kpm)
    assert_close(out, ref, dtype, "out")
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(got, want, dtype, name)
    # lse: -inf exactly on the empty rows, close elsewhere
    empty = empty_rows(layout, S, causal, kpm, H).expand(B, -1, -1)
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.allclose(lse[~empty].double(), ref_lse[~empty], atol=1e-3, rtol=1e-3)
    # empty rows: exact zeros in out and dq (never NaN)
    assert bool((out[empty] == 0).all()) and bool((grads[0][empty] == 0).all())
    return empty
