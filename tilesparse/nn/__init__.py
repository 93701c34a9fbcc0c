"""Drop-in modules with sparse weights, and block-sparse self-attention."""

from .attention import BlockSparseSelfAttention
from .linear import BlockSparseLinear
from .linear_transposed import TransposedBlockSparseLinear, store_transposed
from .lstm import BlockSparseLSTM

__all__ = ["BlockSparseLinear", "BlockSparseLSTM", "BlockSparseSelfAttention", "TransposedBlockSparseLinear",
           "store_transposed"]
