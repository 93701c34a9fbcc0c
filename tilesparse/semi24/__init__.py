"""2:4 semi-structured sparsity: masks, the fused mask-and-transpose pass, and the
SemiSparseLinear training module.

Public functions (each checks its input and names the offending argument):

* :func:`prune_24_rows` -- (W * M, M) keeping the 2 largest |w| of every 4 along rows;
* :func:`transposable_mask` -- M 2:4 along rows *and* columns of every 4x4 tile
  (``method="optimal"`` or ``"greedy"``);
* :func:`transposable_prune` -- fused: (W * M, (W * M)^T, M) in one pass;
* :func:`apply_mask_and_transpose` -- (W * M, (W * M)^T) in one pass.

``PATTERNS`` is the [90, 4, 4] bool table of the 4x4 masks that are 2:4 in every row and
column (the optimal transposable search's candidates, in index order).

Modules: :class:`SemiSparseLinear` (2:4 weights, trained with STE / SR-STE) and
:class:`SquaredReLUFFN` (2:4 activations, Haziza et al. 2025).

``backend``: ``"auto"`` runs the Triton kernel on CUDA and the PyTorch reference
(:mod:`tilesparse.semi24.reference`) on the CPU; ``"triton"`` forces the kernel (on CPU
tensors only under ``TRITON_INTERPRET=1``); ``"reference"`` forces the reference. Kernel
and reference make identical selections (the tests compare them with torch.equal).
"""

from __future__ import annotations

import os

import torch

from .._checks import check_tensor
from . import reference

__all__ = [
    "SemiSparseLinear",
    "SquaredReLUFFN",
    "apply_mask_and_transpose",
    "is_24",
    "prune_24_rows",
    "transposable_mask",
    "transposable_prune",
]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
METHODS = ("optimal", "greedy")
BACKENDS = ("auto", "triton", "reference")

PATTERNS = reference.pattern_masks()
"""The 90 transposable 4x4 patterns, bool [90, 4, 4], in the kernel's index order."""

is_24 = reference.is_24


def _check_weight(w, name: str, *, transposable: bool) -> None:
    check_tensor(w, name, dtypes=DTYPES)
    if w.dim() != 2:
        raise ValueError(f"{name} must be 2-D [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    if k % 4:
        raise ValueError(f"{name}.shape[1] (K={k}) must be a multiple of 4 for 2:4 groups")
    if transposable and n % 4:
        raise ValueError(f"{name}.shape[0] (N={n}) must be a multiple of 4 for 4x4 transposable tiles")


def _use_triton(w: torch.Tensor, backend: str) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return False
    if backend == "auto":
        return w.device.type == "cuda"
    if w.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors); w is on {w.device}"
        )
    return True


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def prune_24_rows(w: torch.Tensor, *, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the 2 largest-|w| entries of every 4 consecutive ones of each row of ``w``
    [N, K] (K % 4 == 0); ties go to the lower index, NaN counts as +inf.
    Returns (pruned weight [N, K] contiguous, bool mask [N, K])."""
    _check_weight(w, "w", transposable=False)
    if _use_triton(w, backend):
        from ..kernels import semi24 as kernels

        return kernels.prune_24_rows(w)
    return reference.prune_24_rows_reference(w)


def transposable_mask(w: torch.Tensor, method: str = "optimal", *, backend: str = "auto") -> torch.Tensor:
    """Bool mask [N, K] (N % 4 == K % 4 == 0) that keeps at most 2 of every 4 along rows and
    along columns in every 4x4 tile, so that both W * M and (W * M)^T are 2:4.

    ``optimal``: the best of the 90 patterns with exactly 2 per row and column by kept
    |w| (fp32 sums; the lowest pattern index on ties). ``greedy``: keep the largest entry
    whose row and column hold fewer than 2, until none is left; >= 1/2 of the optimal
    kept magnitude by construction (greedy b-matching), about 0.99 measured on Gaussian
    weights (tests/test_semi24_kernels.py), and a row or column can end with 1 kept."""
    _check_weight(w, "w", transposable=True)
    _check_method(method)
    if _use_triton(w, backend):
        from ..kernels import semi24 as kernels

        return kernels.transposable_mask(w, method)
    return reference.transposable_mask_reference(w, method)


def transposable_prune(
    w: torch.Tensor, method: str = "optimal", *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused :func:`transposable_mask` + :func:`apply_mask_and_transpose`: returns
    (W * M [N, K], (W * M)^T [K, N], M), both value tensors contiguous."""
    _check_weight(w, "w", transposable=True)
    _check_method(method)
    if _use_triton(w, backend):
        from ..kernels import semi24 as kernels

        return kernels.transposable_prune(w, method)
    mask = reference.transposable_mask_reference(w, method)
    return (*reference.apply_mask_and_transpose_reference(w, mask), mask)


def apply_mask_and_transpose(
    w: torch.Tensor, mask: torch.Tensor, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W * M [N, K], (W * M)^T [K, N]) in one pass, both contiguous (the transposed copy
    is bprop's weight). Masked-out entries are exactly 0."""
    check_tensor(w, "w", dtypes=DTYPES)
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if mask.shape != w.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but w has {tuple(w.shape)}; they must match")
    if mask.device != w.device:
        raise ValueError(f"mask is on {mask.device} but w is on {w.device}; they must match")
    if _use_triton(w, backend):
        from ..kernels import semi24 as kernels

        return kernels.apply_mask_and_transpose(w, mask)
    return reference.apply_mask_and_transpose_reference(w, mask)


from .ffn import SquaredReLUFFN  # noqa: E402  (these use the functions above)
from .linear import SemiSparseLinear  # noqa: E402
