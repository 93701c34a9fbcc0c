"""TransposedBlockSparseLinear: BlockSparseLinear with W's blocks stored in Wᵀ's order.

Which of a block-sparse layer's two products is fast at few rows depends on the stored
order, not on the product. A deep panel whose output features are block-*columns* of
the stored matrix reads, per reduction step, blocks that lie side by side in one stored
block-row; one whose features are block-*rows* reads separate short runs. BlockSparseLinear
stores W by block-rows, so its backward dX = dY W is the fast form and its forward
Y = X Wᵀ the slow one. Stored as Wᵀ the forward is the fast form: on an H200 (W 12288²,
bf16, 16x16 blocks at density 0.5) the forward at 8 / 16 / 32 / 64 rows took 68 / 73 /
91 / 102 µs stored by rows and 64 / 64 / 72 / 84 µs stored transposed (dense 76-79 µs),
with the backward slower by as much (``scripts/probes/transposed_storage.py``,
``bench/results/2026-12-02-nvidia-h200-transposed-storage-ea44b38.json``). At density 0.25
the gain starts at 32 rows; with 32x32 blocks or density 0.1 the rows order is as fast or
1-3 µs faster. So this is for layers that run mostly forward at 17-64 rows: decoding.
Dense dispatch decides as for BlockSparseLinear (its measurements are of the rows order).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layout import BlockLayout
from ..ops.bsmm import block_sparse_linear
from .linear import BlockSparseLinear, check_loaded_mask


def _transposed_values(layout: BlockLayout, values: torch.Tensor) -> torch.Tensor:
    """``values`` of W on ``layout`` as Wᵀ's blocks in ``layout.transpose()``'s order."""
    col_slot = layout.tables.col_slot.to(values.device).long()
    return values[col_slot].transpose(1, 2).contiguous()


class TransposedBlockSparseLinear(nn.Module):
    """y = x Wᵀ + b, with W [out_features, in_features] stored as Wᵀ's blocks.

    Built from a :class:`BlockSparseLinear` (:meth:`from_module`) and turned back into one
    (:meth:`to_block_sparse_linear`); the same function, stored in the other order.
    ``weight`` is a Parameter [nnz, b, b] holding Wᵀ's blocks in ``layout.coords`` order,
    where ``layout`` (shape (in_features, out_features)) is Wᵀ's layout; it trains like
    BlockSparseLinear's. The layout is saved in the state_dict as ``layout_mask`` (Wᵀ's).
    Use :func:`store_transposed` to convert every BlockSparseLinear of a model.
    """

    def __init__(self, layout: BlockLayout, *, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if not isinstance(layout, BlockLayout):
            raise TypeError(f"layout must be a tilesparse.BlockLayout (Wᵀ's), got {type(layout).__name__}")
        self.in_features, self.out_features = layout.shape
        self.block_size = layout.block_size
        layout = layout.to(device if device is not None else "cpu")
        self._layout = layout
        self.register_buffer("layout_mask", layout.mask.clone())
        factory = {"device": device, "dtype": dtype}
        b = layout.block_size
        self.weight = nn.Parameter(torch.zeros(layout.nnz, b, b, **factory))
        self.bias = nn.Parameter(torch.zeros(self.out_features, **factory)) if bias else None

    @property
    def layout(self) -> BlockLayout:
        """Wᵀ's layout, on the module's current device."""
        if self._layout.device != self.layout_mask.device:
            self._layout = self._layout.to(self.layout_mask.device)
        return self._layout

    def _apply(self, fn, recurse=True):
        """After ``.to()`` / ``.cuda()``: build the layout's tables on the new device now,
        outside any compiled region (as BlockSparseLinear does)."""
        result = super()._apply(fn, recurse)
        if self.layout_mask.device.type != "meta":
            self.layout.meta  # noqa: B018 (builds and caches the tables on the mask's device)
        return result

    @classmethod
    def from_module(cls, module: BlockSparseLinear) -> "TransposedBlockSparseLinear":
        """The same layer with its blocks (and their layout) stored as Wᵀ's; a copy."""
        if not isinstance(module, BlockSparseLinear):
            raise TypeError(f"module must be a tilesparse.nn.BlockSparseLinear, got {type(module).__name__}")
        weight = module.weight.detach()
        out = cls(module.layout.transpose(), bias=module.bias is not None, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            out.weight.copy_(_transposed_values(module.layout, weight))
            if module.bias is not None:
                out.bias.copy_(module.bias.detach())
        return out

    def to_block_sparse_linear(self) -> BlockSparseLinear:
        """The same layer stored by W's block-rows again (a BlockSparseLinear; a copy)."""
        weight = self.weight.detach()
        layout = self.layout.transpose()  # W's
        out = BlockSparseLinear(self.in_features, self.out_features, block_size=self.block_size, layout=layout,
                                bias=self.bias is not None, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            out.weight.copy_(_transposed_values(self.layout, weight))
            if self.bias is not None:
                out.bias.copy_(self.bias.detach())
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Y = X Wᵀ + bias; X [..., in_features]."""
        return block_sparse_linear(x, self.weight, self.layout, self.bias, transposed_storage=True)

    def to_dense(self) -> torch.Tensor:
        """The dense [out_features, in_features] weight W (a copy, for inspection)."""
        return self.layout.to_dense(self.weight.detach()).t()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        check_loaded_mask(state_dict, prefix + "layout_mask", self.layout_mask, "block layout (of Wᵀ)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        """Sizes, block size, density, stored block count and the storage order, for print(module)."""
        layout = self._layout
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"block_size={self.block_size}, density={layout.density:.3f}, nnz_blocks={layout.nnz}, "
            f"bias={self.bias is not None}, stored=transposed"
        )


def store_transposed(model: nn.Module) -> nn.Module:
    """Replace every BlockSparseLinear in ``model`` (in place, the model itself too) by its
    :class:`TransposedBlockSparseLinear`; returns the model (or the replacement when
    ``model`` is one). Make optimizers after converting: the Parameters are new."""
    if isinstance(model, BlockSparseLinear):
        return TransposedBlockSparseLinear.from_module(model)
    for name, child in list(model.named_children()):
        converted = store_transposed(child)
        if converted is not child:
            setattr(model, name, converted)
    return model
