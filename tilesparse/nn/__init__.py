"""Drop-in modules with sparse weights."""

from .linear import BlockSparseLinear

__all__ = ["BlockSparseLinear"]
