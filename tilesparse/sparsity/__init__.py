"""Sparsity recipes on top of the block-sparse modules: per-block gates for learned sparsity."""

from .gates import GatedBlockSparseLinear, HardConcreteGate, gated_block_sparse_linear, l0_penalty

__all__ = [
    "GatedBlockSparseLinear",
    "HardConcreteGate",
    "gated_block_sparse_linear",
    "l0_penalty",
]
