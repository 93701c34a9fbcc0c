"""Output allocation for the launchers.

With ``TILESPARSE_POISON=1`` (the test suite sets it), outputs are filled with NaN
before a kernel writes them, so an element the kernel forgets shows up as NaN
instead of passing by luck on recycled memory.
"""

from __future__ import annotations

import os

import torch


def poison_enabled() -> bool:
    return os.environ.get("TILESPARSE_POISON") == "1"


def new_output(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(*shape, dtype=dtype, device=device)
    if poison_enabled() and out.numel():
        out.fill_(float("nan"))
    return out
