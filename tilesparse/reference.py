"""Pure-PyTorch references of the block-sparse kernels, with the kernels' signatures.

They serve three purposes: the CPU path of the registered ops (so the library runs
on any machine), the float64 path for ``gradcheck``, and an independent check of
the Triton kernels in the tests. Like the kernels, they never build a dense copy of
the sparse operand: blocks are gathered, multiplied in batches of at most
``_CHUNK_ELEMENTS`` intermediate elements, and scattered back with ``index_add_``
(deterministic on CPU; on CUDA, only the float64 fallback uses it).

Half-precision inputs are computed in float32 and rounded once at the end, as the
kernels do.
"""

from __future__ import annotations

import functools

import torch

from .layout import split_meta

_CHUNK_ELEMENTS = 1 << 22


def _without_autocast(fn):
    """Run a reference with autocast off for its device: it chooses its own compute dtype
    (float32 or float64), and autocast would re-cast its bmm to bf16/fp16 and then fail
    in index_add_ (float32 target, bf16 source). Callers cast the inputs already."""

    @functools.wraps(fn)
    def wrapper(a, *args, **kwargs):
        device_type = a.device.type
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type, enabled=False):
                return fn(a, *args, **kwargs)
        return fn(a, *args, **kwargs)

    return wrapper


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(nnz: int, per_block: int):
    step = max(1, _CHUNK_ELEMENTS // max(1, per_block))
    for start in range(0, nnz, step):
        yield slice(start, min(nnz, start + step))


@_without_autocast
def dds_reference(
    a: torch.Tensor,
    values: torch.Tensor,
    meta: torch.Tensor,
    bias: torch.Tensor | None,
    block_rows: int,
    block_cols: int,
    trans: bool,
) -> torch.Tensor:
    """C = A @ op(S) (+ bias); same contract as :func:`tilesparse.kernels.bsmm.dds`."""
    tables = split_meta(meta, block_rows, block_cols)
    rows, cols = tables.row_of.long(), tables.row_cols.long()
    b = values.shape[-1]
    m = a.shape[0]
    cd = _compute_dtype(a.dtype)
    # trans: C[:, r] += A[:, c] @ V^T ; else: C[:, c] += A[:, r] @ V
    in_blocks, out_blocks, n_in, n_out = (
        (cols, rows, block_cols, block_rows) if trans else (rows, cols, block_rows, block_cols)
    )
    # Block-major copies, so that each gather below reads contiguous [m, b] slabs.
    a_blocks = a.to(cd).reshape(m, n_in, b).transpose(0, 1).contiguous()  # [n_in, m, b]
    out = torch.zeros(n_out, m, b, dtype=cd, device=a.device)
    for part in _chunks(values.shape[0], m * b):
        v = values[part].to(cd)
        if trans:
            v = v.transpose(1, 2)
        # torch.bmm, not einsum: einsum is ~30x slower on small CPU batches (torch 2.13).
        out.index_add_(0, out_blocks[part], torch.bmm(a_blocks[in_blocks[part]], v))
    out = out.transpose(0, 1).reshape(m, n_out * b)
    if bias is not None:
        out += bias.to(cd)
    return out.to(a.dtype)


@_without_autocast
def sdd_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    meta: torch.Tensor,
    block_size: int,
    block_rows: int,
    block_cols: int,
) -> torch.Tensor:
    """values[z] = (A @ B)[block z]; same contract as :func:`tilesparse.kernels.bsmm.sdd`."""
    tables = split_meta(meta, block_rows, block_cols)
    rows, cols = tables.row_of.long(), tables.row_cols.long()
    m = a.shape[1]
    cd = _compute_dtype(a.dtype)
    a_blocks = a.to(cd).reshape(block_rows, block_size, m)
    b_blocks = b.to(cd).reshape(m, block_cols, block_size).transpose(0, 1).contiguous()  # [C, m, b]
    out = torch.empty(rows.numel(), block_size, block_size, dtype=cd, device=a.device)
    for part in _chunks(rows.numel(), m * block_size):
        out[part] = torch.bmm(a_blocks[rows[part]], b_blocks[cols[part]])
    return out.to(a.dtype)
