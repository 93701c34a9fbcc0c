"""Resuming from checkpoints whose layouts changed during training (RigL rewires).

``model.load_state_dict`` refuses a block-sparse layer whose saved layout differs from
the module's (the stored blocks would mean different places). A run that rewired its
layouts must therefore put the checkpoint's layouts in place first:

    adopt_layouts(model, checkpoint["model"])
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])   # after: parameters keep their identity
"""

from __future__ import annotations

import torch
from torch import nn

from ..layout import BlockLayout
from ..nn import BlockSparseLinear

__all__ = ["adopt_layouts"]


def adopt_layouts(model: nn.Module, state_dict: dict) -> list[str]:
    """Give every :class:`BlockSparseLinear` in ``model`` the layout saved for it in
    ``state_dict`` (its ``<name>.layout_mask``), with the saved blocks as its values.
    Returns the names of the layers whose layout changed. The weight Parameters stay
    the same objects, so an optimizer built on the model can load its saved state next.

    Raises ValueError naming the layer if a saved mask has the wrong shape or its block
    count does not match the saved weight."""
    changed = []
    for name, module in model.named_modules():
        if not isinstance(module, BlockSparseLinear):
            continue
        prefix = f"{name}." if name else ""
        mask = state_dict.get(prefix + "layout_mask")
        if mask is None:
            continue
        mask = mask.to(torch.bool)
        if mask.shape != module.layout_mask.shape:
            raise ValueError(f"{prefix}layout_mask: saved shape {tuple(mask.shape)}, the module's is "
                             f"{tuple(module.layout_mask.shape)} (a different layer size or block size)")
        if torch.equal(mask.to(module.layout_mask.device), module.layout_mask):
            continue
        values = state_dict.get(prefix + "weight")
        nnz = int(mask.sum())
        if values is None or values.shape[0] != nnz:
            raise ValueError(f"{prefix}weight: the checkpoint's blocks ({None if values is None else values.shape[0]}) "
                             f"do not match its layout_mask ({nnz} blocks)")
        device, dtype = module.weight.device, module.weight.dtype
        layout = BlockLayout(mask.to(device), module.block_size)
        module.set_layout(layout, values.to(device=device, dtype=dtype))
        changed.append(name)
    return changed
