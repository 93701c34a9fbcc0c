"""Drop-in modules with sparse weights."""

from .linear import BlockSparseLinear
from .lstm import BlockSparseLSTM

__all__ = ["BlockSparseLinear", "BlockSparseLSTM"]
