"""Drop-in modules with sparse weights, and block-sparse self-attention."""

from .attention import BlockSparseSelfAttention
from .linear import BlockSparseLinear
from .lstm import BlockSparseLSTM

__all__ = ["BlockSparseLinear", "BlockSparseLSTM", "BlockSparseSelfAttention"]
