"""Hugging Face transformers models with block-sparse MLPs.

``tilesparse.sparsify`` works on a transformers model like on any nn.Module (it converts
exact ``nn.Linear`` modules: Llama-style MLPs; GPT-2's ``Conv1D`` is not one). Saving
is the model's own ``save_pretrained``; the state dict carries each layer's blocks and
``layout_mask``. Loading needs the sparse modules in place before the weights, which
``from_pretrained`` of a dense class cannot do: :func:`load_sparse_pretrained` builds
the model from the saved config, sparsifies the same modules, adopts the saved layouts
and loads the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..sparsity import adopt_layouts, sparsify

__all__ = ["mlp_filter", "load_sparse_pretrained"]


def mlp_filter(name: str, module: nn.Module) -> bool:
    """Select the MLP projections of transformers decoder blocks (``...mlp.*``)."""
    return ".mlp." in f".{name}."


def _state_dict(path: Path) -> dict:
    safetensors = sorted(path.glob("*.safetensors"))
    if safetensors:
        from safetensors.torch import load_file

        state = {}
        for file in safetensors:
            state.update(load_file(str(file)))
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path}")
    state = {}
    for file in bins:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def load_sparse_pretrained(model_class, path, *, block_size: int, density: float,
                           filter_fn: Callable[[str, nn.Module], bool] = mlp_filter, **model_kwargs):
    """``model_class.from_pretrained`` for a model saved after ``tilesparse.sparsify``:
    build it from the saved config, sparsify the modules ``filter_fn`` selects (with the
    ``block_size`` and ``density`` used before), put the saved layouts in place and load
    the saved weights (strictly: every key must match)."""
    path = Path(path)
    config = model_class.config_class.from_pretrained(path)
    model = model_class(config, **model_kwargs)
    report = sparsify(model, block_size=block_size, density=density, layout="random", filter_fn=filter_fn)
    state = _state_dict(path)
    adopt_layouts(model, state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied weights may be saved once; anything else missing or extra is an error
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match the sparsified model (missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}); converted modules: {len(report.converted)}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model
