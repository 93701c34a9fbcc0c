"""BlockSparseSelfAttention: multi-head self-attention whose score matrix is computed
only on a block layout's (query block, key block) pairs, by the fused kernels of
:mod:`tilesparse.attention`. A drop-in attention layer for a GPT block."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_loaded_mask, check_module_input
from .._counts import check_count
from ..attention import AttentionLayout

__all__ = ["BlockSparseSelfAttention"]


class BlockSparseSelfAttention(nn.Module):
    """Self-attention over a block-sparse pattern, with its projections.

    Args:
        embed_dim: model width E (= num_heads * head_dim).
        num_heads: query heads H.
        layout: an :class:`~tilesparse.attention.AttentionLayout` for the longest sequence
            the module will see ([H, nb, nb] per head or [nb, nb] shared), e.g.
            ``tilesparse.attention.layouts.local(4096, 64, window=512, causal=True)``.
            Shorter sequences use its top-left ceil(S / b) blocks (the usual prefix of a
            causal or banded pattern).
        num_kv_heads: K/V heads (grouped-query attention); default H. Must divide H.
        causal: mask future keys inside the computed blocks (and drop blocks above the
            diagonal).
        bias: biases on the projections.
        deterministic: bitwise-reproducible gradients (default); False lets the GPU
            backward accumulate dq by atomics (fewer matmuls; see
            :func:`~tilesparse.attention.block_sparse_attention`).

    ``forward(x, key_padding_mask=None)``: x [B, S, E] -> [B, S, E]; key_padding_mask
    [B, S] bool, True = a padding key to ignore (nn.MultiheadAttention's convention).
    There is no attention-probability dropout (the fused kernel has none); put dropout
    on the output if the model wants it.
    """

    def __init__(self, embed_dim: int, num_heads: int, layout: AttentionLayout, *, num_kv_heads: int | None = None,
                 causal: bool = True, bias: bool = True, deterministic: bool = True, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        embed_dim = check_count("embed_dim", embed_dim, 1)
        num_heads = check_count("num_heads", num_heads, 1)
        num_kv_heads = check_count("num_kv_heads", num_kv_heads, 1)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
        if not isinstance(layout, AttentionLayout):
            raise TypeError(f"layout must be a tilesparse.attention.AttentionLayout, got {type(layout).__name__}")
        if not layout.shared and layout.layout_heads != num_heads:
            raise ValueError(f"layout has {layout.layout_heads} heads but num_heads={num_heads}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        if not isinstance(deterministic, bool):
            raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
        self.deterministic = deterministic
        self.layout = layout
        self._prefix_layouts: dict[int, AttentionLayout] = {}
        # In the state_dict, so a checkpoint says which pattern it was trained with.
        self.register_buffer("layout_mask", layout.mask.clone())
        factory = {"device": device, "dtype": dtype}
        kv_dim = num_kv_heads * self.head_dim
        self.qkv = nn.Linear(embed_dim, embed_dim + 2 * kv_dim, bias=bias, **factory)
        self.out = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the layout covers."""
        return self.layout.seq_len or self.layout.num_blocks * self.layout.block_size

    def layout_for(self, seq_len: int) -> AttentionLayout:
        """The layout for a sequence of ``seq_len`` tokens: the module's, or its top-left
        ceil(seq_len / b) blocks (cached; without a ``seq_len`` of their own, since they
        serve every length with that many blocks)."""
        seq_len = check_count("seq_len", seq_len, 1)
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds the layout's {self.max_seq_len} tokens")
        blocks = -(-seq_len // self.layout.block_size)
        whole = blocks == self.layout.num_blocks and self.layout.seq_len in (None, seq_len)
        layout = self.layout if whole else self._prefix_layouts.get(blocks)
        if not torch.compiler.is_compiling() and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            device = self.qkv.weight.device
            if layout is None or not layout.has_tables(device, self.causal):
                raise RuntimeError(
                    f"BlockSparseSelfAttention: sequence length {seq_len} was first seen while a CUDA graph was "
                    f"being captured, where its layout tables cannot be built; call module.prepare({seq_len}) "
                    f"(every length you will use) before capturing")
        if layout is None:
            mask = self.layout.mask[:, :blocks, :blocks]
            layout = AttentionLayout(mask[0] if self.layout.shared else mask, self.layout.block_size)
            self._prefix_layouts[blocks] = layout
        return layout

    def prepare(self, *seq_lens: int) -> None:
        """Build the layouts of these sequence lengths and their tables on the module's
        device now, before capturing CUDA graphs (``torch.compile(mode="reduce-overhead")``,
        ``make_graphed_callables``), which must not build them; the full length's too."""
        device = self.qkv.weight.device
        for seq_len in (self.max_seq_len, *seq_lens):
            layout = self.layout_for(seq_len)
            if device.type != "meta":
                layout.meta_on(device, self.causal)

    def _apply(self, fn, recurse=True):
        """After ``.to()`` / ``.cuda()``: build the layout's tables on the new device now,
        outside any compiled region (a CUDA-graph replay must not own them)."""
        result = super()._apply(fn, recurse)
        device = self.qkv.weight.device
        if device.type not in ("cpu", "meta"):
            for layout in (self.layout, *self._prefix_layouts.values()):
                layout.meta_on(device, self.causal)
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        check_loaded_mask(state_dict, prefix + "layout_mask", self.layout_mask, "attention layout", "AttentionLayout")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, S, E] -> [B, S, E]."""
        from ..attention import block_sparse_attention

        check_module_input(x, "x", self.qkv.weight, "BlockSparseSelfAttention")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must be [batch, seq, {self.embed_dim}], got shape {tuple(x.shape)}")
        batch, seq, _ = x.shape
        kv_dim = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([self.embed_dim, kv_dim, kv_dim], dim=-1)
        q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        attn = block_sparse_attention(q, k, v, self.layout_for(seq), causal=self.causal,
                                      key_padding_mask=key_padding_mask, deterministic=self.deterministic)
        return self.out(attn.transpose(1, 2).reshape(batch, seq, self.embed_dim))

    def extra_repr(self) -> str:
        """Sizes, heads and the layout, for print(module)."""
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"causal={self.causal}, deterministic={self.deterministic}, layout={self.layout!r}")
