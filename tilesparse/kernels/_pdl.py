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
The kernel also signals (``griddepcontrol.launch_dependents``) at its start that the
next kernel may be scheduled, which only lets that kernel's programs start early; they
wait for this one to complete in turn.

``TILESPARSE_PDL=1`` turns it on, ``0`` off; :data:`DEFAULT` otherwise.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._device import capability_major

__all__ = ["DEFAULT", "enabled", "pdl_options", "wait_for_previous_kernel"]

DEFAULT = False  # until measured (scripts/probes/small_pdl.py)


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: a CUDA device of compute
    capability 9 or newer, not under the interpreter, and ``TILESPARSE_PDL`` (or
    :data:`DEFAULT`) says so."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or capability_major(device) < 9:
        return False
    setting = os.environ.get("TILESPARSE_PDL")
    return DEFAULT if setting is None else setting == "1"


def pdl_options(device: torch.device) -> dict:
    """The keyword arguments of a launch on ``device``: the kernel's ``PDL`` constexpr
    (always passed: the fast launch path needs every constexpr by keyword) and, where
    :func:`enabled`, Triton's ``launch_pdl`` option."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With ``PDL``: let the next kernel be scheduled, then wait until the previous
    kernel in the stream has completed (its writes visible). Call before the first
    global memory access."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
