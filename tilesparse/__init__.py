"""tilesparse: GPU kernels for block-sparse weights in PyTorch, written in Triton."""

from . import attention, layouts, sparsity
from .layout import BlockLayout
from .nn import BlockSparseLinear, BlockSparseLSTM, BlockSparseSelfAttention
from .ops import block_sparse_linear, dds, dsd, sdd
from .sparsity import sparsify

__version__ = "0.1.0"

__all__ = [
    "BlockLayout", "BlockSparseLinear", "BlockSparseLSTM", "BlockSparseSelfAttention", "block_sparse_linear",
    "dds", "dsd", "sdd", "sparsify", "attention", "layouts", "sparsity", "__version__",
]
