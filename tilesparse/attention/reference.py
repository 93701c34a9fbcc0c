"""Pure-PyTorch block-sparse attention, beside the Triton kernels.

Two paths, for two jobs:

* :func:`attention_reference`: dense-masked attention in float64. It builds the S x S
  token mask from the layout (fine at test sizes, O(S^2) memory), and autograd gives
  the reference gradients. Tests and benchmarks check the kernels against it.
* :func:`attention_forward_blocks` / :func:`attention_backward_blocks`: the registered
  op's CPU implementation. They loop over query blocks and gather only the active key
  blocks from the packed tables, so memory is O(b * S) per head, never S x S, and they
  compute exactly what the kernels compute (same tables, same masks, same saved
  log-sum-exp), in fp32 (fp64 for fp64 inputs).

Semantics shared by all paths: a (query i, key j) pair is kept when its block is in the
layout, j < S, key_padding_mask[batch, j] is False, and (if causal) j <= i. Rows with no
kept key output zeros, have log-sum-exp -inf, and get zero gradients.
"""

from __future__ import annotations

import math

import torch

from ..reference import _without_autocast  # autocast would re-cast the fp32 matmuls below
from .layout import AttentionLayout, attention_table_views

__all__ = ["lse_dtype", "token_mask", "attention_reference", "attention_forward_blocks", "attention_backward_blocks"]


def token_mask(layout: AttentionLayout, S: int, causal: bool = False,
               key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The kept (query, key) pairs as a bool [B or 1, L, S, S] tensor (L = layout heads):
    the layout's blocks expanded to tokens, cut to S, with causality and key padding
    applied. For tests only (S x S)."""
    b = layout.block_size
    tok = layout.block_mask(causal).repeat_interleave(b, 1).repeat_interleave(b, 2)[:, :S, :S]
    if causal:
        tok = tok & torch.ones(S, S, dtype=torch.bool).tril()
    tok = tok.unsqueeze(0)
    if key_padding_mask is not None:
        tok = tok & ~key_padding_mask.cpu().bool()[:, None, None, :]
    return tok


def attention_reference(q, k, v, layout: AttentionLayout, *, causal: bool = False, scale: float | None = None,
                        key_padding_mask: torch.Tensor | None = None, return_lse: bool = False):
    """Dense-masked block-sparse attention in float64 (differentiable; on the CPU).
    q [B, H, S, D], k/v [B, Hkv, S, D]. Returns out [B, H, S, D] float64 (and the
    log-sum-exp [B, H, S] when ``return_lse``)."""
    q, k, v = (t.cpu().double() for t in (q, k, v))  # differentiable casts
    H, S, D = q.shape[1], q.shape[2], q.shape[3]
    G = H // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k_full, v_full = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = (q @ k_full.transpose(-1, -2)) * scale
    keep = token_mask(layout, S, causal, key_padding_mask)
    scores = scores.masked_fill(~keep, float("-inf"))
    mx = scores.amax(-1, keepdim=True).detach()
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)  # rows with nothing kept
    p = torch.exp(scores - mx)
    denom = p.sum(-1, keepdim=True)
    out = (p @ v_full) / torch.where(denom == 0, torch.ones_like(denom), denom)
    if return_lse:
        return out, (mx + torch.log(denom)).squeeze(-1)
    return out


# --------------------------------------------------------------------------- block loop


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the saved log-sum-exp for inputs of ``dtype``: float32, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _head_groups(H: int, Hkv: int, layout_heads: int):
    """(layout head, query-head slice, kv-head slice, heads per kv head) groups that
    share one pattern: all heads at once for a shared layout, else one head at a time."""
    G = H // Hkv
    if layout_heads == 1:
        yield 0, slice(0, H), slice(0, Hkv), G
    else:
        for h in range(H):
            yield h, slice(h, h + 1), slice(h // G, h // G + 1), 1


def _blocks(meta, layout_heads: int, S: int, b: int):
    """For each (layout head l, query block m) with blocks: (l, m, q0, q1, key indices)."""
    nb = -(-S // b)
    row_ptr, _, row_cols, _ = attention_table_views(meta.cpu(), layout_heads, nb)
    row_ptr, row_cols = row_ptr.tolist(), row_cols.tolist()
    for l in range(layout_heads):
        for m in range(nb):
            cols = row_cols[row_ptr[l * nb + m]:row_ptr[l * nb + m + 1]]
            if cols:
                keys = torch.cat([torch.arange(n * b, min(S, (n + 1) * b)) for n in cols]).to(meta.device)
                yield l, m, m * b, min(S, (m + 1) * b), keys


def _scores(q, k, hs, ks, G, q0, q1, keys, kpm, causal, scale, ct):
    """Masked scores [B, nkv, G, bq, n] of one query block against its gathered keys,
    and the gathered k [B, nkv, 1, n, D] (and queries [B, nkv, G, bq, D])."""
    B, D = q.shape[0], q.shape[-1]
    qb = q[:, hs, q0:q1].to(ct)
    kb = k[:, ks][:, :, keys].to(ct).unsqueeze(2)
    nkv = kb.shape[1]
    qg = qb.reshape(B, nkv, G, q1 - q0, D)
    s = (qg @ kb.transpose(-1, -2)) * scale
    keep = torch.ones(q1 - q0, keys.numel(), dtype=torch.bool, device=q.device)
    if causal:
        keep = keys[None, :] <= torch.arange(q0, q1, device=q.device)[:, None]
    keep = keep.expand(B, 1, 1, -1, -1)
    if kpm is not None:
        keep = keep & ~kpm[:, keys].bool()[:, None, None, None, :]
    return s.masked_fill(~keep, float("-inf")), qg, kb


def _tiles(q, k, v, meta, kpm, layout_heads: int, b: int, causal: bool, scale: float, ct):
    """Every (query block, head group) the layout computes, with what both passes need:
    (q0, q1, hs, ks, G, keys, masked scores, gathered q, k and v [B, nkv, 1, n, D])."""
    for l, _, q0, q1, keys in _blocks(meta, layout_heads, q.shape[2], b):
        for _, hs, ks, G in _head_groups(q.shape[1], k.shape[1], layout_heads):
            if layout_heads > 1 and hs.start != l:
                continue
            s, qg, kb = _scores(q, k, hs, ks, G, q0, q1, keys, kpm, causal, scale, ct)
            vb = v[:, ks][:, :, keys].to(ct).unsqueeze(2)
            yield q0, q1, hs, ks, G, keys, s, qg, kb, vb


@_without_autocast
def attention_forward_blocks(q, k, v, meta, key_padding_mask, layout_heads: int, block_size: int, causal: bool,
                             scale: float):
    """Forward on the CPU, one query block at a time over its active key blocks.
    Returns (out [B, H, S, D] in q's dtype, lse [B, H, S] in :func:`lse_dtype`, natural log)."""
    B, H, S, D = q.shape
    ct = _compute_dtype(q.dtype)
    out = torch.zeros(B, H, S, D, dtype=ct, device=q.device)
    lse = torch.full((B, H, S), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    tiles = _tiles(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, ct)
    for q0, q1, hs, _, _, _, s, _, _, vb in tiles:
        mx = s.amax(-1, keepdim=True)
        mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
        p = torch.exp(s - mx)
        denom = p.sum(-1, keepdim=True)
        o = (p @ vb) / torch.where(denom == 0, torch.ones_like(denom), denom)
        nh = hs.stop - hs.start
        out[:, hs, q0:q1] = o.reshape(B, nh, q1 - q0, D)
        lse[:, hs, q0:q1] = (mx + torch.log(denom)).reshape(B, nh, q1 - q0).to(lse.dtype)
    return out.to(q.dtype), lse


@_without_autocast
def attention_backward_blocks(grad_out, q, k, v, out, lse, meta, key_padding_mask, layout_heads: int,
                              block_size: int, causal: bool, scale: float):
    """Backward on the CPU (FlashAttention-2 math: P recomputed from the saved lse,
    delta = rowsum(dO * O)). Returns (dq, dk, dv) in the inputs' dtypes."""
    B, H, S, D = q.shape
    ct = _compute_dtype(q.dtype)
    delta = (grad_out.to(ct) * out.to(ct)).sum(-1)
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).to(ct)
    dq = torch.zeros(B, H, S, D, dtype=ct, device=q.device)
    dk = torch.zeros(k.shape, dtype=ct, device=q.device)
    dv = torch.zeros(v.shape, dtype=ct, device=q.device)
    tiles = _tiles(q, k, v, meta, key_padding_mask, layout_heads, block_size, causal, scale, ct)
    for q0, q1, hs, ks, G, keys, s, qg, kb, vb in tiles:
        nkv, bq = kb.shape[1], q1 - q0
        p = torch.exp(s - lse_safe[:, hs, q0:q1].reshape(B, nkv, G, bq, 1))
        dob = grad_out[:, hs, q0:q1].to(ct).reshape(B, nkv, G, bq, D)
        dp = dob @ vb.transpose(-1, -2)
        ds = p * (dp - delta[:, hs, q0:q1].reshape(B, nkv, G, bq, 1))
        dq[:, hs, q0:q1] = (ds @ kb).reshape(B, G * nkv, bq, D) * scale
        dv[:, ks].index_add_(2, keys, (p.transpose(-1, -2) @ dob).sum(2))
        dk[:, ks].index_add_(2, keys, (ds.transpose(-1, -2) @ qg).sum(2) * scale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
