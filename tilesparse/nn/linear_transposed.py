"""TransposedBlockSparseLinear: BlockSparseLinear with W's blocks stored in Wᵀ's order.

The same function as BlockSparseLinear, the forward run as X @ Wᵀ on Wᵀ's block-rows. It
was built (thirty-seventh session) when the deep panel's forward on W's block-rows ran
1.2-1.3x slower than the same product on Wᵀ's (b 16, 17-64 rows). The fortieth session
found that gap in the kernel, not in the order: the forward's slot table was loaded with
16 four-byte loads per slot; loaded once per step, the forward on W's rows runs as fast
(H200, W 12288², 16x16 blocks at density 0.5, 8 / 16 / 32 / 64 rows: 57.5 / 58.2 / 65.0 /
79.8 µs stored by rows, 55.7 / 57.5 / 65.1 / 79.9 µs stored transposed,
``bench/results/2026-12-03-nvidia-h200-small-b16-m2-64-e5c45a1.csv``; at 2 rows the rows
order is faster, 49.5 against 56.2 µs, its FMA kernel prefetching ahead). So it no longer
buys speed; it stays for models and checkpoints that hold Wᵀ's blocks, with converters both
ways. Dense dispatch decides as for BlockSparseLinear (its measurements are of the rows order).
"""

from __future__ import annotations

import torch
from torch import nn

from .._counts import check_count
from ..layout import BlockLayout
from .linear import BlockSparseLinear, _BlockStoredLinear


def _copy_flipped(source: nn.Module, target: nn.Module) -> None:
    """``source``'s blocks into ``target`` in the other storage order (both layers compute
    the same function), its bias, and each Parameter's ``requires_grad``."""
    with torch.no_grad():
        target.weight.copy_(source.layout.transposed_values(source.weight.detach()))
        if source.bias is not None:
            target.bias.copy_(source.bias.detach())
    target.weight.requires_grad_(source.weight.requires_grad)
    if source.bias is not None:
        target.bias.requires_grad_(source.bias.requires_grad)


class TransposedBlockSparseLinear(_BlockStoredLinear):
    """y = x Wᵀ + b, with W [out_features, in_features] stored as Wᵀ's blocks.

    Built from a :class:`BlockSparseLinear` (:meth:`from_module`) and turned back into one
    (:meth:`to_block_sparse_linear`); the same function, stored in the other order. Built
    from a layout, it draws BlockSparseLinear's init (uniform, bound 1/sqrt(fan-in) per output).
    ``weight`` is a Parameter [nnz, b, b] holding Wᵀ's blocks in ``layout.coords`` order,
    where ``layout`` (shape (in_features, out_features)) is Wᵀ's layout; it trains like
    BlockSparseLinear's (16-bit: in fp32 the TF32 kernels copy each block transposed per
    call). The layout is saved in the state_dict as ``transposed_layout_mask``, so that a
    checkpoint of the other storage order is refused, not loaded as the wrong function:
    load a BlockSparseLinear checkpoint first, then convert. RigL and group lasso work on
    BlockSparseLinear: convert after training. Use :func:`store_transposed` to convert a model.
    """

    MASK_BUFFER = "transposed_layout_mask"
    OUT_AXIS = 1  # an output is a column of Wᵀ
    LAYOUT_WHAT = "block layout (of Wᵀ)"

    def __init__(self, layout: BlockLayout, *, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if not isinstance(layout, BlockLayout):
            raise TypeError(f"layout must be a tilesparse.BlockLayout (Wᵀ's), got {type(layout).__name__}")
        self.in_features, self.out_features = layout.shape
        check_count("in_features (the layout's rows)", self.in_features, 1)  # as BlockSparseLinear's
        check_count("out_features (the layout's columns)", self.out_features, 1)
        self.block_size = layout.block_size
        self._make_blocks(layout, bias, device, dtype)

    @classmethod
    def from_module(cls, module: BlockSparseLinear) -> "TransposedBlockSparseLinear":
        """The same layer with its blocks (and their layout) stored as Wᵀ's; a copy (with
        the Parameters' ``requires_grad``). Only a plain BlockSparseLinear: a subclass
        (e.g. a gated one) computes more than its blocks, which this would drop."""
        if type(module) is not BlockSparseLinear:
            raise TypeError(f"module must be a tilesparse.nn.BlockSparseLinear (not a subclass), "
                            f"got {type(module).__name__}")
        weight = module.weight.detach()
        out = cls(module.layout.transpose(), bias=module.bias is not None, device=weight.device, dtype=weight.dtype)
        _copy_flipped(module, out)
        if weight.device.type != "meta":
            out.layout.meta  # noqa: B018 (the tables now, not inside a compiled region)
        return out

    def to_block_sparse_linear(self) -> BlockSparseLinear:
        """The same layer stored by W's block-rows again (a BlockSparseLinear; a copy)."""
        weight = self.weight.detach()
        layout = self.layout.transpose()  # W's
        out = BlockSparseLinear(self.in_features, self.out_features, block_size=self.block_size, layout=layout,
                                bias=self.bias is not None, device=weight.device, dtype=weight.dtype)
        _copy_flipped(self, out)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Y = X Wᵀ + bias; X [..., in_features]."""
        return self._forward(x, True)

    def to_dense(self) -> torch.Tensor:
        """The dense [out_features, in_features] weight W (a copy, for inspection)."""
        return self.layout.to_dense(self.weight.detach()).t()

    def extra_repr(self) -> str:
        """Sizes, block size, density, stored block count and the storage order, for print(module)."""
        layout = self._layout
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"block_size={self.block_size}, density={layout.density:.3f}, nnz_blocks={layout.nnz}, "
            f"bias={self.bias is not None}, stored=transposed"
        )


def store_transposed(model: nn.Module) -> nn.Module:
    """Replace every plain BlockSparseLinear in ``model`` (in place, the model itself too)
    by its :class:`TransposedBlockSparseLinear`; returns the model (or the replacement when
    ``model`` is one). Inside tilesparse.nn's other modules (BlockSparseLSTM reads its
    sublayers' blocks itself) nothing is converted, nor are BlockSparseLinear's subclasses.
    Make optimizers after converting: the Parameters are new."""
    if type(model) is BlockSparseLinear:
        return TransposedBlockSparseLinear.from_module(model)
    if type(model).__module__.startswith("tilesparse.nn."):
        return model  # its own code reads the sublayers' storage
    for name, child in list(model.named_children()):
        converted = store_transposed(child)
        if converted is not child:
            setattr(model, name, converted)
    return model
