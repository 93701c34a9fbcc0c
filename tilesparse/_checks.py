"""Input validation shared by the public functions: every message names the argument."""

from __future__ import annotations

import torch

from .layout import BlockLayout

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_layout(layout, name: str = "layout") -> BlockLayout:
    if not isinstance(layout, BlockLayout):
        raise TypeError(f"{name} must be a tilesparse.BlockLayout, got {type(layout).__name__}")
    return layout


def check_tensor(t, name: str, *, dim: int | None = None, min_dim: int | None = None,
                 dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES) -> torch.Tensor:
    """``t`` must be a tensor of one of ``dtypes`` (and ``dim`` / at least ``min_dim`` dims)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        supported = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {supported}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if min_dim is not None and t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(t.shape)}")
    return t


def check_same_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; they must match")


def check_same(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    """``t`` must share ``ref``'s dtype and device."""
    if t.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but {ref_name} has {ref.dtype}; they must match")
    check_same_device(t, name, ref, ref_name)


def check_module_input(x: torch.Tensor, name: str, weight: torch.Tensor, module: str) -> None:
    """A module's input ``x`` must be on its weights' device and, outside autocast, of their
    dtype (under autocast the products cast it, as nn.Linear's do)."""
    check_tensor(x, name)
    check_same_device(x, name, weight, f"{module}'s weights")
    if x.dtype != weight.dtype and (x.device.type == "meta" or not torch.is_autocast_enabled(x.device.type)):
        raise TypeError(f"{name} has dtype {x.dtype} but {module}'s weights have {weight.dtype}; cast one of them, "
                        "or run under torch.autocast")


def check_values(values, layout: BlockLayout, name: str = "weight") -> torch.Tensor:
    """``values`` must be [layout.nnz, b, b] for the layout's block size."""
    check_tensor(values, name, dim=3)
    b = layout.block_size
    if values.shape[1] != values.shape[2]:
        raise ValueError(f"{name} must hold square blocks [nnz, b, b], got shape {tuple(values.shape)}")
    if values.shape[1] != b:
        raise ValueError(
            f"{name} holds {values.shape[1]}x{values.shape[2]} blocks but the layout has block_size={b}"
        )
    if values.shape[0] != layout.nnz:
        raise ValueError(f"{name} has {values.shape[0]} blocks but the layout has nnz={layout.nnz}")
    return values


def check_dim(actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"{what} is {actual} but the layout needs {expected}")


def check_loaded_mask(state_dict, key: str, mask: torch.Tensor, what: str, layout_class: str = "BlockLayout") -> None:
    """A checkpoint's layout mask under ``key`` must equal the module's: the module's values
    are stored in its layout's order, so loading them onto another layout would scramble
    them. ``what`` names the layout in the message, ``layout_class`` the class to rebuild it with."""
    if key in state_dict:
        loaded = state_dict[key]
        if loaded.shape != mask.shape or not torch.equal(loaded.to(mask.device, torch.bool), mask):
            raise ValueError(
                f"{key}: the checkpoint's {what} differs from this module's "
                f"({int(loaded.sum())} vs {int(mask.sum())} blocks of "
                f"{tuple(loaded.shape)} vs {tuple(mask.shape)}); build the module "
                f"with the checkpoint's layout ({layout_class}(mask, block_size)) before loading"
            )


def check_flags(**flags) -> None:
    """Each keyword must be a bool (a truthy string such as ``"no"`` would otherwise read as True)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
