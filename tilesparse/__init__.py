"""tilesparse: GPU kernels for block-sparse weights in PyTorch, written in Triton."""

from . import layouts
from .layout import BlockLayout
from .nn import BlockSparseLinear
from .ops import block_sparse_linear, dds, dsd, sdd

__version__ = "0.1.0"

__all__ = ["BlockLayout", "BlockSparseLinear", "block_sparse_linear", "dds", "dsd", "sdd", "layouts", "__version__"]
