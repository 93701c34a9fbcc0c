"""Registered block-sparse attention ops, their autograd, and the public function.

Layers: Triton kernels (:mod:`tilesparse.kernels.attention`) on CUDA, or the block-loop
PyTorch path (:mod:`tilesparse.attention.reference`) on the CPU and for float64 ->
``torch.library`` custom ops ``tilesparse::block_sparse_attention_fwd`` (out, lse) and
``tilesparse::block_sparse_attention_bwd`` (dq, dk, dv), with fakes, so
``torch.compile(fullgraph=True)`` traces them -> ``register_autograd``, whose backward
calls the registered backward op (what AOTAutograd traces; see docs/notes.md). Eager
calls on plain tensors take :class:`_EagerAttention` instead, an autograd.Function over
the same functions without the custom-op dispatch (less host time) -> the public
:func:`block_sparse_attention`, which checks its input and names the argument in every
error.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
from torch.nn import functional as F

from .._checks import check_same, check_tensor
from ..attention.layout import AttentionLayout
from ..attention.reference import attention_backward_blocks, attention_forward_blocks, lse_dtype
from .bsmm import _autocast

__all__ = ["block_sparse_attention"]

SUPPORTED_BLOCK_SIZES = (16, 32, 64, 128)
MAX_HEAD_DIM = 128


def _use_triton(t: torch.Tensor) -> bool:
    """Triton on CUDA; the block-loop reference on the CPU and for float64 (no fp64 dot)."""
    return t.device.type == "cuda" and t.dtype != torch.float64


# --------------------------------------------------------------------------- registered ops


def _forward(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale):
    """(out, lse): the Triton kernels on CUDA, the block-loop path on the CPU / float64."""
    if _use_triton(q):
        from ..kernels import attention as kernels

        return kernels.attention_forward(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale)
    return attention_forward_blocks(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale)


def _backward_grads(grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads, block_size, causal, scale,
                    deterministic):
    """(dq, dk, dv): the Triton kernels on CUDA, the block-loop path on the CPU / float64."""
    args = (grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads, block_size, causal, scale)
    if _use_triton(q):
        from ..kernels import attention as kernels

        return kernels.attention_backward(*args, deterministic=deterministic)
    return attention_backward_blocks(*args)


@torch.library.custom_op("tilesparse::block_sparse_attention_fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],
    layout_heads: int,
    block_size: int,
    causal: bool,
    scale: float,
    deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H, S, D], lse [B, H, S]) of block-sparse attention on the packed tables
    (``deterministic`` is the backward's: carried here for autograd)."""
    return _forward(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, deterministic=True):
    B, H, S, _ = q.shape
    return q.new_empty(q.shape), q.new_empty(B, H, S, dtype=lse_dtype(q.dtype))


@torch.library.custom_op("tilesparse::block_sparse_attention_bwd", mutates_args=())
def _bwd_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    meta: torch.Tensor,
    key_padding_mask: Optional[torch.Tensor],
    layout_heads: int,
    block_size: int,
    causal: bool,
    scale: float,
    deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of block-sparse attention, FlashAttention-2 style from the saved lse;
    ``deterministic=False`` lets the Triton path accumulate dQ by atomics."""
    return _backward_grads(grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads, block_size, causal,
                           scale, deterministic)


@_bwd_op.register_fake
def _bwd_fake(grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads, block_size, causal, scale,
              deterministic=True):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, meta, key_padding_mask)
    ctx.params = (layout_heads, block_size, causal, scale, deterministic)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, meta, key_padding_mask = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = _bwd_op(grad_out, q, k, v, out, lse, meta, key_padding_mask, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------- eager autograd


class _EagerAttention(torch.autograd.Function):
    """The registered ops' forward and backward without the custom-op dispatch, for eager
    calls on plain tensors: ``torch.library``'s Python layers (dispatch, autograd wrapper,
    argument checks, aliasing checks) cost the H200 host ~0.4 ms per forward + backward,
    a quarter of the whole call at B 4, H 16, S 2048 (twenty-fourth session,
    scripts/probes/attention_host.py). The same functions run: the results are the ops'."""

    @staticmethod
    def forward(ctx, q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, deterministic):
        out, lse = _forward(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse, meta, key_padding_mask)
        ctx.params = (layout_heads, block_size, causal, scale, deterministic)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        # with create_graph (a gradient penalty) or under compiled autograd: the op path's backward
        # (the registered backward op; its ctx is saved the same way): traced by compiled autograd,
        # and its gradients refuse to be differentiated (no autograd formula) instead of silently
        # dropping the penalty's dependence on q, k, v
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return _backward(ctx, grad_out, None)
        q, k, v, out, lse, meta, key_padding_mask = ctx.saved_tensors
        dq, dk, dv = _backward_grads(grad_out, q, k, v, out, lse, meta, key_padding_mask, *ctx.params)
        return dq, dk, dv, None, None, None, None, None, None, None


def _eager_eligible(q, k, v) -> bool:
    """Whether a call may skip the registered op: plain CPU / CUDA tensors, run eagerly. Not
    while torch.compile / export traces, under a dispatch mode (fake tensors, make_fx, a
    logging mode) or a torch.func transform (vmap, grad), nor for tensor subclasses or meta
    tensors: those see the op and its fake."""
    return (not torch.compiler.is_compiling() and all(type(t) is torch.Tensor for t in (q, k, v))
            and q.device.type in ("cpu", "cuda") and not torch._C._len_torch_dispatch_stack()
            and not torch._C._are_functorch_transforms_active())


def _attend(q, k, v, meta, key_padding_mask, layout_heads: int, block_size: int, causal: bool, scale: float,
            deterministic: bool) -> torch.Tensor:
    """The attention output through :class:`_EagerAttention` (the same kernels, less host
    time) where :func:`_eager_eligible`, else through the registered op."""
    args = (q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, deterministic)
    if _eager_eligible(q, k, v):
        return _EagerAttention.apply(*args)
    return _fwd_op(*args)[0]


# --------------------------------------------------------------------------- checks


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, seq_len, head_dim], got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        check_same(t, name, q, "q")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    B, H, S, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, S, D):
        raise ValueError(f"k/v shape {tuple(k.shape)} must be [B={B}, Hkv, S={S}, D={D}] to match q "
                         f"{tuple(q.shape)}")
    Hkv = k.shape[1]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"q's {H} heads must be a multiple of k/v's {Hkv} heads (grouped-query attention)")
    if not (16 <= D <= MAX_HEAD_DIM and D % 16 == 0):
        raise ValueError(f"q's head dim D={D} is unsupported: it must be a multiple of 16 in [16, {MAX_HEAD_DIM}] "
                         "(32, 64, 96 and 128 are the tested ones)")


def _check_layout(layout, H: int, S: int) -> None:
    if not isinstance(layout, AttentionLayout):
        raise TypeError(f"layout must be a tilesparse.attention.AttentionLayout, got {type(layout).__name__}")
    b = layout.block_size
    if b not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"layout.block_size={b} is unsupported; supported: {SUPPORTED_BLOCK_SIZES}")
    nb = -(-S // b)
    if layout.num_blocks != nb:
        raise ValueError(f"layout has {layout.num_blocks} blocks per side but seq_len S={S} with block_size={b} "
                         f"needs ceil(S/b)={nb}")
    if layout.seq_len is not None and layout.seq_len != S:
        # a builder's pattern depends on S itself (strides, windows, summary tokens), not only on nb
        raise ValueError(f"layout was built for seq_len={layout.seq_len} but q has S={S}; build it for S={S}, "
                         f"or make an AttentionLayout(layout.mask, block_size) without seq_len to reuse its blocks")
    if layout.layout_heads not in (1, H):
        raise ValueError(f"layout has {layout.layout_heads} heads but q has {H}; use one pattern per query head "
                         "or a shared [nb, nb] mask")


def _check_padding(key_padding_mask, B: int, S: int, device) -> None:
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a torch.Tensor or None, got {type(key_padding_mask).__name__}")
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask must be bool (True = padding), got {key_padding_mask.dtype}")
    if tuple(key_padding_mask.shape) != (B, S):
        raise ValueError(f"key_padding_mask must have shape [B, S] = {(B, S)}, got {tuple(key_padding_mask.shape)}")
    if key_padding_mask.device != device:
        raise ValueError(f"key_padding_mask is on {key_padding_mask.device} but q is on {device}; they must match")


# --------------------------------------------------------------------------- public function


def _runs_as_sdpa(q, k, v, layout, causal, key_padding_mask, deterministic) -> bool:
    """Whether the call is plain (causal) attention that SDPA's fused GPU kernels compute
    as well: the layout computes every block, no key padding, as many kv heads as query
    heads, a 16-bit dtype on CUDA, and either no gradient wanted or ``deterministic`` off."""
    if not (q.is_cuda and key_padding_mask is None and k.shape[1] == q.shape[1]
            and q.dtype in (torch.float16, torch.bfloat16) and layout.is_dense(causal)):
        return False
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return not (wants_grad and deterministic)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    key_padding_mask: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    dense_fallback: bool = True,
) -> torch.Tensor:
    """softmax(q k^T * scale) v computed only on the layout's (query block, key block)
    pairs, fused (FlashAttention-style: no S x S matrix in memory), differentiable in
    q, k and v.

    Args:
        q: [B, H, S, D]; k, v: [B, Hkv, S, D] with H % Hkv == 0 (grouped-query
            attention: query head h uses kv head h // (H / Hkv)). float16, bfloat16 or
            float32 (fp32 accumulation); float64 runs the PyTorch path.
        layout: an :class:`~tilesparse.attention.AttentionLayout` with ceil(S / b)
            blocks per side, one pattern per query head or shared; b in 16, 32, 64, 128.
        causal: also mask keys after the query (inside diagonal blocks; blocks above
            the diagonal are skipped).
        scale: softmax scale, default 1 / sqrt(D).
        key_padding_mask: bool [B, S], True = that key is padding and ignored
            (nn.MultiheadAttention's convention; gives per-sequence lengths).
        deterministic: True (default) gives bitwise-reproducible gradients (on Hopper at
            D 128, bf16 or fp16, for layouts shared by the heads whose order allows it, such
            as local windows, strided and causal: one dK/dV kernel adding dQ's shares in a
            fixed order, 5 matmuls per block pair; elsewhere a separate dQ kernel, 7; the two
            give different bits, and a CUDA graph captured before a layout's first eager
            backward takes the second). False lets
            the GPU backward accumulate dq in fp32 inside the dK/dV kernel (on Hopper at
            blocks of 128 and D 64 / 128 by TMA reductions, elsewhere by atomics;
            FlashAttention's way: 5 matmuls per block pair instead of 7), so dq may
            differ in its last bits from run to run (dk and dv are summed in another, fixed
            order: reproducible, but not bitwise those of ``deterministic=True``); ignored (deterministic) while
            ``torch.use_deterministic_algorithms(True)`` is on when this is called (the
            forward fixes the backward's mode), and on the CPU path.
        dense_fallback: True (default): a layout that computes every block (every block
            on or below the diagonal with ``causal``) is plain attention, and on the GPU,
            for fp16/bf16 without key padding or grouped heads, it runs as
            ``F.scaled_dot_product_attention`` (FlashAttention), which was faster than
            this library's kernel on the H200 (causal S 8192: 1.93 against 2.33 ms forward);
            while gradients are wanted, only with ``deterministic=False`` (SDPA's backward
            is not bitwise reproducible). So calls without gradients (eval) and with
            deterministic ones (training, and a checkpoint's recompute) may differ in
            their last bits, and SDPA's output may be a non-contiguous view. False always
            runs the block-sparse kernels.

    Returns [B, H, S, D] in q's dtype (the autocast dtype under autocast). A query with
    no kept key outputs zeros (and gets zero gradients). CUDA tensors run the Triton
    kernels, CPU tensors the block-loop PyTorch path (same semantics, O(b * S) memory
    per head).
    """
    _check_qkv(q, k, v)
    q, k, v = _autocast(q, k, v)  # under autocast, attention runs in its 16-bit dtype (as SDPA does)
    B, H, S, D = q.shape
    _check_layout(layout, H, S)
    _check_padding(key_padding_mask, B, S, q.device)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    scale = float(scale)  # (numpy floats too)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
    if not isinstance(dense_fallback, bool):
        raise TypeError(f"dense_fallback must be a bool, got {type(dense_fallback).__name__}")
    if dense_fallback and _runs_as_sdpa(q, k, v, layout, causal, key_padding_mask, deterministic):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=float(scale))
    meta = layout.meta_on(q.device, causal)
    return _attend(q, k, v, meta, key_padding_mask, layout.layout_heads, layout.block_size, causal, float(scale),
                   deterministic)
