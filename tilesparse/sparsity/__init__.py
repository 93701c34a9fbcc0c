"""Sparsity recipes on top of the block-sparse modules: converting dense models
(:func:`sparsify`), block group lasso, per-block gates for learned sparsity, and RigL
(dynamic sparsity: drop weak blocks, regrow by dense-gradient block norms), and
resuming checkpoints whose layouts were rewired (:func:`adopt_layouts`)."""

from .checkpoint import adopt_layouts
from .convert import ConvertedModule, SparsifyReport, convertible_linears, sparsify
from .gates import GatedBlockSparseLinear, HardConcreteGate, gated_block_sparse_linear, l0_penalty
from .group_lasso import block_norms, dense_block_norms, dense_group_lasso, group_lasso
from .rigl import RigL, rewire
from ..kernels.block_norms import block_grad_norms

__all__ = [
    "sparsify",
    "SparsifyReport",
    "ConvertedModule",
    "convertible_linears",
    "group_lasso",
    "block_norms",
    "dense_group_lasso",
    "dense_block_norms",
    "GatedBlockSparseLinear",
    "HardConcreteGate",
    "gated_block_sparse_linear",
    "l0_penalty",
    "RigL",
    "rewire",
    "block_grad_norms",
    "adopt_layouts",
]
