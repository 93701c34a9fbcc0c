"""cuSPARSELt through torch for the 2:4 products: when the sparse path can run, which
algorithm to use (searched once per problem), and the product A (W⊙M)ᵀ on a compressed
weight. The layer (:mod:`tilesparse.semi24.linear`) decides between this and dense."""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from .._env import switch

__all__ = ["cslt_algorithm", "cslt_product", "sparse_unavailable_reason"]

# cuSPARSELt's shape constraints as torch 2.13's SparseSemiStructuredTensorCUSPARSELT
# states them for fp16/bf16 (_DTYPE_SHAPE_CONSTRAINTS): sparse operand rows and columns
# % 16, dense operand rows and columns % 8. The batch is padded to a multiple of 8 here,
# and the dense operand's other side is the sparse one's columns (% 16).
_SPARSE_ROWS, _SPARSE_COLS = 16, 16


def sparse_unavailable_reason(device: torch.device, dtype: torch.dtype, rows: int, cols: int) -> Optional[str]:
    """Why the cuSPARSELt product cannot run for a sparse operand [rows, cols] (2:4 along
    cols), or None when it can."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype} (the cuSPARSELt path takes float16 and bfloat16)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"the GPU is sm{major}{minor}, without sparse tensor cores (they need sm80+)"
    cusparselt = getattr(torch.backends, "cusparselt", None)
    if cusparselt is None or not cusparselt.is_available():
        return "cuSPARSELt is not available in this PyTorch build"
    if rows % _SPARSE_ROWS or cols % _SPARSE_COLS:
        return f"the sparse operand [{rows}, {cols}] is not a multiple of [{_SPARSE_ROWS}, {_SPARSE_COLS}]"
    return None


_ALG_IDS: dict[tuple, int] = {}


def cslt_algorithm(packed: torch.Tensor, dense_b: torch.Tensor, bias: Optional[torch.Tensor]) -> int:
    """cuSPARSELt's fastest algorithm for ``packed @ dense_b`` (transposed result), found
    by ``torch._cslt_sparse_mm_search`` once per problem and remembered. On an H200 the
    default algorithm ran FFN-sized GEMMs at 0.76-1.01x of dense, the searched one at
    1.44-1.58x (/work/shared/anchors/README.md). ``TILESPARSE_CSLT_SEARCH=0`` keeps the
    default (0); a failed search warns once and keeps it too. fp16 keeps the default: on
    the H200 (torch 2.11) every fp16 search failed with an internal cuSPARSELt error that
    left the CUDA context unusable, while the default algorithm ran
    (scripts/probes/cslt_cases.py)."""
    if not switch("TILESPARSE_CSLT_SEARCH", True) or dense_b.dtype == torch.float16:
        return 0
    key = (tuple(packed.shape), tuple(dense_b.shape), dense_b.dtype, bias is not None, str(packed.device))
    alg = _ALG_IDS.get(key)
    if alg is None:
        try:
            with warnings.catch_warnings():  # torch 2.11+ calls this entry point deprecated; it still works
                warnings.filterwarnings("ignore", message=".*_cslt_sparse_mm_search is deprecated")
                alg = int(torch._cslt_sparse_mm_search(packed, dense_b, bias=bias, transpose_result=True))
        except (RuntimeError, TypeError, AttributeError) as exc:
            warnings.warn(f"tilesparse.SemiSparseLinear: cuSPARSELt algorithm search failed ({type(exc).__name__}: "
                          f"{exc}); using its default algorithm for {key[:2]}", stacklevel=3)
            alg = 0
        _ALG_IDS[key] = alg
    return alg


def cslt_product(packed: torch.Tensor, a: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A @ S^T (+ bias) for S compressed by _cslt_compress, A [M, K] dense: computed as
    S @ A^T on cuSPARSELt (sparse operand first) with the result transposed on output
    (transpose_result=True gives [M, rows(S)] directly), with the searched algorithm
    (:func:`cslt_algorithm`). M is padded to a multiple of 8. A is made contiguous
    first: cuSPARSELt reads the dense operand by its leading dimension alone, and a
    broadcast gradient (the stride-0 ones of ``y.sum().backward()``) came out as garbage."""
    a = a.contiguous()
    m = a.shape[0]
    pad = (-m) % 8
    if pad:
        a = F.pad(a, (0, 0, 0, pad))
    b = a.t()
    out = torch._cslt_sparse_mm(packed, b, bias=bias, transpose_result=True, alg_id=cslt_algorithm(packed, b, bias))
    return out[:m] if pad else out
