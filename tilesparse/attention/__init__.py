"""Fused block-sparse attention (FlashAttention-style forward and backward in Triton).

``block_sparse_attention(q, k, v, layout)`` computes softmax(q k^T * scale) v on the
(query block, key block) pairs an :class:`AttentionLayout` lists, per head or shared,
with grouped-query heads, causal masking and key padding, and never materializes the
S x S matrix. Builders of the usual patterns (local, strided, fixed, BigBird,
Longformer, random) and FlexAttention ``BlockMask`` converters live in
:mod:`tilesparse.attention.layouts`.
"""

from . import layouts
from .layout import AttentionLayout

__all__ = ["block_sparse_attention", "AttentionLayout", "layouts"]


def __getattr__(name):
    # Imported on first use: tilesparse.ops.attention imports this package's layout
    # module, so importing it here would make a cycle for code that imports the ops
    # module first.
    if name == "block_sparse_attention":
        from ..ops.attention import block_sparse_attention

        return block_sparse_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
