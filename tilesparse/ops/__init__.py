"""Registered ops, autograd and the public functional API."""

from .bsmm import block_sparse_linear, dds, dsd, sdd

__all__ = ["block_sparse_linear", "dds", "dsd", "sdd"]
