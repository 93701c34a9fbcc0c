"""Output allocation for the launchers, and the arrival counters of their in-kernel
reductions.

With ``TILESPARSE_POISON=1`` (the test suite sets it), outputs are filled with NaN
before a kernel writes them, so an element the kernel forgets shows up as NaN
instead of passing by luck on recycled memory.
"""

from __future__ import annotations

import torch

from .._env import switch


def poison_enabled() -> bool:
    return switch("TILESPARSE_POISON", False)


def new_output(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(*shape, dtype=dtype, device=device)
    if poison_enabled() and out.numel():
        out.fill_(float("nan"))
    return out


_COUNTERS: dict = {}


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters for a last-to-arrive reduction (the small kernel's chunks, the
    panel's fused split sum, the resident kernel's splits), one per output tile. Every
    launch leaves them zero again, so one buffer per (device, stream) serves every launch
    on that stream (launches on one stream never overlap). Inside a CUDA-graph capture a
    fresh buffer is made (its zeroing is captured) and not kept."""
    if torch.cuda.is_available() and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (device, stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf
