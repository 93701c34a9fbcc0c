"""Builders of common block-sparse attention patterns, each returning an
:class:`~tilesparse.attention.AttentionLayout` over S tokens in blocks of b, and the
converters to and from FlexAttention's ``BlockMask``.

The patterns are block-level: a block is computed when any (query, key) pair inside it
belongs to the token-level pattern, so the block pattern covers the token pattern
(block-sparse attention computes whole blocks; pass ``causal=True`` to the attention
call to mask inside the diagonal blocks). Random builders take a ``seed`` and are
reproducible on every machine (a CPU ``torch.Generator``).
"""

from __future__ import annotations

import operator
import numbers
from typing import Iterable

import torch

from .._counts import check_count
from ..layouts._common import check_seed
from .layout import AttentionLayout

__all__ = ["causal", "local", "strided", "fixed", "bigbird", "longformer", "random",
           "to_block_mask", "from_block_mask"]


def _check(S: int, b: int) -> int:
    return -(-check_count("S", S, 1) // check_count("b", b, 1))


def _check_heads(num_heads) -> int:
    """How many patterns to draw: 1 for None (shared), else a positive int."""
    if num_heads is None:
        return 1
    return check_count("num_heads", num_heads, 1, or_none=True)


def _block_ranges(S: int, b: int):
    """First and last token of each block (the last block may be short)."""
    nb = -(-S // b)
    start = torch.arange(nb) * b
    end = torch.clamp(start + b, max=S) - 1
    return start, end


def causal(S: int, b: int) -> AttentionLayout:
    """Lower-triangular blocks: every key block at or before the query block. Use with
    ``causal=True`` in the attention call for token-level causality."""
    nb = _check(S, b)
    return AttentionLayout(torch.ones(nb, nb, dtype=torch.bool).tril(), b, S)


def local(S: int, b: int, window: int, *, causal: bool = False) -> AttentionLayout:
    """Sliding window of ``window`` tokens: query i sees keys j with |i - j| < window
    (0 <= i - j < window when ``causal``). Blocks holding any such pair are computed."""
    _check(S, b)
    window = check_count("window", window, 1)
    qs, qe = _block_ranges(S, b)
    ks, ke = qs, qe
    # smallest i - j over the block pair is qs - ke, largest is qe - ks
    lo, hi = qs[:, None] - ke[None, :], qe[:, None] - ks[None, :]
    if causal:  # some pair with 0 <= i - j < window
        mask = (hi >= 0) & (lo < window)
    else:  # some pair with |i - j| < window
        mask = (hi > -window) & (lo < window)
    return AttentionLayout(mask, b, S)


def _stride_blocks(stride: int, b: int, name: str = "stride") -> int:
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or stride < 1 or stride % b:
        raise ValueError(f"{name} must be a positive multiple of the block size b={b}, got {stride!r}")
    return int(stride) // b


def strided(S: int, b: int, stride: int, *, causal: bool = True) -> AttentionLayout:
    """The Sparse Transformer's strided pattern (Child et al. 2019) in blocks: query i
    sees the previous ``stride`` tokens (i - j < stride) and every ``stride``-th token
    before it ((i - j) % stride == 0). ``stride`` is a multiple of b. Not causal: the
    same pattern mirrored (|i - j|)."""
    nb = _check(S, b)
    l = _stride_blocks(stride, b)
    d = torch.arange(nb)[:, None] - torch.arange(nb)[None, :]
    dist = d if causal else d.abs()
    mask = (dist >= 0) & ((dist < l) | (dist % l == 0))
    return AttentionLayout(mask, b, S)


def fixed(S: int, b: int, stride: int, *, summary: int | None = None, causal: bool = True) -> AttentionLayout:
    """The Sparse Transformer's fixed pattern (Child et al. 2019): query i sees the keys
    of its own chunk of ``stride`` tokens, and the last ``summary`` tokens (default b) of
    every chunk (the "summary" cells). ``stride`` is a multiple of b, 1 <= summary <=
    stride. ``causal`` keeps only keys at or before the query block."""
    nb = _check(S, b)
    l = _stride_blocks(stride, b)
    summary = b if summary is None else summary
    if isinstance(summary, bool) or not isinstance(summary, numbers.Integral) or not 1 <= summary <= stride:
        raise ValueError(f"summary must be an int in [1, stride={stride}], got {summary!r}")
    summary = int(summary)
    blocks = torch.arange(nb)
    same_chunk = (blocks[:, None] // l) == (blocks[None, :] // l)
    ks, ke = _block_ranges(S, b)
    # key block holds a summary token when its last token is in the chunk's last `summary`
    is_summary = (ke % stride) >= stride - summary
    mask = same_chunk | is_summary[None, :]
    if causal:
        mask &= blocks[:, None] >= blocks[None, :]
    return AttentionLayout(mask, b, S)


def _generator(seed) -> torch.Generator:
    return torch.Generator().manual_seed(check_seed(seed))


def bigbird(S: int, b: int, *, window_blocks: int = 3, global_blocks: int = 1, random_blocks: int = 2,
            seed: int = 0, num_heads: int | None = None) -> AttentionLayout:
    """BigBird (Zaheer et al. 2020) in blocks: a sliding window of ``window_blocks``
    blocks centred on the diagonal (|m - n| <= window_blocks // 2), the first
    ``global_blocks`` blocks attending to and attended by everything, and
    ``random_blocks`` extra key blocks per query block drawn without replacement from
    those not yet computed (fewer when none are left). ``num_heads`` draws a different
    random part per head (a per-head layout); None shares one."""
    nb = _check(S, b)
    window_blocks = check_count("window_blocks", window_blocks)
    global_blocks = check_count("global_blocks", global_blocks)
    random_blocks = check_count("random_blocks", random_blocks)
    gen = _generator(seed)
    blocks = torch.arange(nb)
    base = (blocks[:, None] - blocks[None, :]).abs() <= window_blocks // 2
    if window_blocks == 0:
        base[:] = False
    base[:global_blocks, :] = True
    base[:, :global_blocks] = True
    heads = _check_heads(num_heads)
    masks = []
    for _ in range(heads):
        mask = base.clone()
        for m in range(nb):
            free = (~mask[m]).nonzero().flatten()
            pick = free[torch.randperm(free.numel(), generator=gen)[:random_blocks]]
            mask[m, pick] = True
        masks.append(mask)
    return AttentionLayout(masks[0] if num_heads is None else torch.stack(masks), b, S)


def longformer(S: int, b: int, *, window: int, global_tokens: int | Iterable[int] = ()) -> AttentionLayout:
    """Longformer (Beltagy et al. 2020) in blocks: a sliding window where query i sees
    keys with |i - j| <= window // 2, plus global tokens that attend to everything and
    are attended by everything. ``global_tokens`` is a count n (the first n tokens) or
    an iterable of token indices; the whole block row and column of each are computed."""
    _check(S, b)
    window = check_count("window", window)
    mask = local(S, b, window // 2 + 1).mask[0].clone()
    if isinstance(global_tokens, bool):
        raise ValueError(f"global_tokens must be a count or token indices, got {global_tokens!r}")
    if isinstance(global_tokens, numbers.Integral):
        if not 0 <= global_tokens <= S:
            raise ValueError(f"global_tokens must be a count of tokens in [0, S={S}], got {global_tokens}")
        tokens = list(range(int(global_tokens)))
    else:
        tokens = []
        for t in global_tokens:
            try:  # ints, numpy integers and integer 0-d tensors; not floats or bools
                if isinstance(t, bool):
                    raise TypeError
                tokens.append(operator.index(t))
            except TypeError:
                raise ValueError(f"global_tokens must hold int token indices, got {t!r}") from None
    for t in tokens:
        if not 0 <= t < S:
            raise ValueError(f"global_tokens holds {t}, outside [0, S={S})")
        mask[t // b, :] = True
        mask[:, t // b] = True
    return AttentionLayout(mask, b, S)


def random(S: int, b: int, density: float, seed: int = 0, *, num_heads: int | None = None) -> AttentionLayout:
    """Exactly round(density * nb^2) blocks per head, uniformly at random (seeded).
    ``num_heads`` draws an independent pattern per head; None shares one."""
    nb = _check(S, b)
    if not isinstance(density, (int, float)) or isinstance(density, bool) or not 0.0 <= density <= 1.0:
        raise ValueError(f"density must be in [0, 1], got {density!r}")
    heads = _check_heads(num_heads)
    gen = _generator(seed)
    count = round(density * nb * nb)
    masks = []
    for _ in range(heads):
        flat = torch.zeros(nb * nb, dtype=torch.bool)
        flat[torch.randperm(nb * nb, generator=gen)[:count]] = True
        masks.append(flat.reshape(nb, nb))
    return AttentionLayout(masks[0] if num_heads is None else torch.stack(masks), b, S)


# --------------------------------------------------------------------------- FlexAttention


def to_block_mask(layout: AttentionLayout, B: int | None = None, *, device=None):
    """The layout as a ``torch.nn.attention.flex_attention.BlockMask`` [B or 1, L, S, S]
    with BLOCK_SIZE = b, built with ``BlockMask.from_kv_blocks`` on ``device`` (default
    CPU; the mask_mod below reads a tensor on that device, so build it where
    flex_attention will run). S is ``layout.seq_len`` (nb * b if unset); L is 1 for a
    shared layout.

    Every computed block is listed as a *full* block, and the BlockMask also carries a
    mask_mod that looks the block up in the layout: torch 2.13's eager (unfused)
    flex_attention ignores the block tables and applies only the mask_mod (measured:
    with the default no-op mask_mod it returned dense attention), while the fused
    kernels skip unlisted blocks and run no mask_mod on full ones. Both then compute
    the layout's attention."""
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(layout, AttentionLayout):
        raise TypeError(f"layout must be an AttentionLayout, got {type(layout).__name__}")
    batch = 1 if B is None else check_count("B", B, 1, or_none=True)
    mask = layout.mask.to("cpu" if device is None else device)  # [L, nb, nb]
    nb, b = layout.num_blocks, layout.block_size
    num = mask.sum(-1).to(torch.int32)
    # active key blocks first, in increasing order (a stable sort of ~mask), then the rest
    indices = torch.argsort((~mask).to(torch.uint8), dim=-1, stable=True).to(torch.int32)
    S = layout.seq_len if layout.seq_len is not None else nb * b
    shared = layout.shared

    def block_lookup(batch_idx, head_idx, q_idx, kv_idx):
        return mask[0 if shared else head_idx, q_idx // b, kv_idx // b]

    def expand(t):
        return t.unsqueeze(0).expand(batch, *t.shape).contiguous()

    return BlockMask.from_kv_blocks(
        expand(torch.zeros_like(num)), expand(indices),
        full_kv_num_blocks=expand(num), full_kv_indices=expand(indices),
        BLOCK_SIZE=b, mask_mod=block_lookup, seq_lengths=(S, S),
    )


def from_block_mask(block_mask) -> AttentionLayout:
    """An AttentionLayout from a FlexAttention ``BlockMask`` (its ``to_dense()`` block
    pattern, partial and full blocks alike). The BlockMask's query and key BLOCK_SIZE
    must be equal and its batch entries identical; a single head gives a shared layout.
    A mask_mod is not carried over: pass ``causal=True`` to the attention call for the
    causal one."""
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a flex_attention.BlockMask, got {type(block_mask).__name__}")
    q_block, kv_block = block_mask.BLOCK_SIZE
    if q_block != kv_block:
        raise ValueError(f"block_mask.BLOCK_SIZE must have equal query and key sizes, got {block_mask.BLOCK_SIZE}")
    q_len, kv_len = block_mask.seq_lengths
    if q_len != kv_len:
        raise ValueError(f"block_mask.seq_lengths must be equal (self-attention), got {block_mask.seq_lengths}")
    dense = block_mask.to_dense().to(device="cpu", dtype=torch.bool)  # [B, H, nq, nk]
    if not bool((dense == dense[:1]).all()):
        raise ValueError("block_mask differs between batch entries; an AttentionLayout is per head only")
    mask = dense[0]
    nb = -(-q_len // q_block)
    mask = mask[:, :nb, :nb]
    return AttentionLayout(mask[0] if mask.shape[0] == 1 else mask, int(q_block), int(q_len))
