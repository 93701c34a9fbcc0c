"""tilesparse: GPU kernels for block-sparse weights in PyTorch, written in Triton."""

from . import attention, layouts, semi24, sparsity
from .layout import BlockLayout
from .nn import BlockSparseLinear, BlockSparseLSTM, BlockSparseSelfAttention, TransposedBlockSparseLinear
from .ops import block_sparse_linear, dds, dsd, sdd
from .semi24 import SemiSparseLinear
from .sparsity import sparsify

__version__ = "0.1.0"

__all__ = [
    "BlockLayout", "BlockSparseLinear", "BlockSparseLSTM", "BlockSparseSelfAttention", "SemiSparseLinear",
    "TransposedBlockSparseLinear",
    "block_sparse_linear", "dds", "dsd", "sdd", "sparsify", "attention", "layouts", "semi24", "sparsity",
    "__version__",
]
