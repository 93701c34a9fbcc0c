"""Programmatic dependent launch (PDL, Hopper and newer) for the memory-bound kernels.

A kernel launched with PDL may be scheduled while the kernel before it in the stream is
still finishing: its programs start, then wait (``griddepcontrol.wait``) until that
kernel has completed and its writes are visible, so launch latency and program start-up
overlap the previous kernel's tail instead of following it. The small-batch kernels
stream a few MB in a few µs, where that latency is a large share of a call inside a
CUDA graph (an RNN's timesteps, a decoder's layers).

Safety: every global load and store of a PDL kernel comes after the wait (the previous
kernel may have written any input: an optimizer step the weights, a layout update the
tables), so results are the same as without PDL; only index arithmetic runs before it.

When a kernel lets the next one be scheduled (``griddepcontrol.launch_dependents``) is
the mode, ``TILESPARSE_PDL``: 0 off, 1 right after its own wait, 2 after its main loop
(before the stores; the default), 3 never explicitly (at its completion).
The next kernel's programs then occupy SM slots while they wait in turn. A first try
signalled before the wait and ran 1.3-3.7x slower (H200, scripts/probes/small_pdl.py):
our reading, not profiled, is that each waiting kernel let the next one in, so a chain
of launches piled up in the SMs.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._device import capability_major

__all__ = ["DEFAULT", "MODES", "mode", "pdl_options", "reload", "wait_for_previous_kernel", "let_next_kernel_start"]

# Measured on the H200 (scripts/probes/small_pdl.py, CUDA-graph chains, W 12288², fprop;
# the LSTM suite, --quick --cuda-graph): mode 2 took 0.2-0.5 µs off a call at density 0.03
# (6.38 -> 6.02 µs at b 128, M 1; 6.81 -> 6.34 at b 32, M 32), and within 2 % of mode 0
# elsewhere; the LSTM's forward per timestep 5.9 -> 5.2 µs at H 2048, d 0.03. Mode 1 lost
# up to 1.4x at M 32 (b 64 / 128), its waiting programs taking SM slots in the main loop.
DEFAULT = 2
MODES = (0, 1, 2, 3)
_OFF = {"PDL": 0}
_BY_DEVICE: dict = {}  # CUDA device index -> launch options (read on every launch: no env or device queries)


def _setting() -> int:
    """``TILESPARSE_PDL`` as a mode (:data:`DEFAULT` when unset); a clear error otherwise."""
    setting = os.environ.get("TILESPARSE_PDL")
    if setting is None:
        return DEFAULT
    if setting.strip() not in tuple(map(str, MODES)):
        raise ValueError(f"TILESPARSE_PDL must be one of {', '.join(map(str, MODES))}, got {setting!r}")
    return int(setting)


def mode(device: torch.device) -> int:
    """The PDL mode of launches on ``device``: 0 (off) unless it is an NVIDIA GPU (not
    ROCm, whose Triton backend has no PDL) of compute capability 9 or newer and the
    kernels are not interpreted; then ``TILESPARSE_PDL`` (or :data:`DEFAULT`). A bad
    setting is refused whatever the device."""
    setting = _setting()
    if (device.type != "cuda" or torch.version.hip is not None or triton.knobs.runtime.interpret
            or capability_major(device) < 9):
        return 0
    return setting


def pdl_options(t: torch.Tensor) -> dict:
    """The keyword arguments of a launch whose tensors are on ``t``'s device: the kernel's
    ``PDL`` constexpr (always passed: the fast launch path needs every constexpr by
    keyword) and, when the mode is not 0, Triton's ``launch_pdl`` option. Remembered per
    device; :func:`reload` after changing ``TILESPARSE_PDL``."""
    if not t.is_cuda:
        return _OFF
    index = t.get_device()
    options = _BY_DEVICE.get(index)
    if options is None:
        pdl = mode(t.device)
        options = _BY_DEVICE[index] = {"PDL": pdl, "launch_pdl": True} if pdl else _OFF
    return options


def reload() -> None:
    """Forget the remembered launch options: the next launches read ``TILESPARSE_PDL`` again."""
    _BY_DEVICE.clear()


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL on: wait until the previous kernel in the stream has completed (its
    writes visible); in mode 1 then let the next kernel be scheduled. Call before the
    first global memory access."""
    if PDL != 0:
        gdc_wait()
        if PDL == 1:
            gdc_launch_dependents()


@triton.jit
def let_next_kernel_start(PDL: tl.constexpr):
    """In mode 2: let the next kernel be scheduled (call after the main loop)."""
    if PDL == 2:
        gdc_launch_dependents()
