"""Hopper (sm90+) variants of the block-sparse kernels: tensor-memory-accelerator
(TMA) tile loads. dds builds its descriptors in the kernel (faster on the H200 than
host-built ones, and no per-launch host encoding; a persistent host-descriptor variant
lost 30 % and was removed, docs/performance.md); sdd takes host-built descriptors
(device-built ones were 5-15 % slower there) or device-built ones by config.

Same math and tables as :mod:`tilesparse.kernels.bsmm` (read its docstring); these
need 16-byte-aligned, row-major operands and b >= 16, and the launchers there fall
back to the pointer kernels otherwise. TMA zero-fills rows past M on load and clips
them on store, so odd M needs no masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import _allocation  # private: where triton.set_allocator keeps its per-thread setting
from triton.tools.tensor_descriptor import TensorDescriptor

from ._device import capability_major
from ._launch import launch
from ._tiles import cdiv, grouped_tile


@triton.jit
def _sdd_tma_kernel(
    at_desc, b_desc, out_ptr, rows_ptr, cols_ptr,
    M, m_per_split, nnz,
    B: tl.constexpr, BLOCK_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Program (z, s): out[s, z] = A^T[M-slice s, rows[z]-block]^T @ B[M-slice s, cols[z]-block]
    where A^T is the row-major [M, R*B] matrix whose transpose is the sdd lhs."""
    _sdd_block(at_desc, b_desc, out_ptr, rows_ptr, cols_ptr, M, m_per_split, nnz, B, BLOCK_M, INPUT_PRECISION)


@triton.jit
def _sdd_block(at_desc, b_desc, out_ptr, rows_ptr, cols_ptr, M, m_per_split, nnz,
               B: tl.constexpr, BLOCK_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Program (z, s) of the descriptor sdd kernels (host- or device-built descriptors):
    stored block z's product over M-slice s, into out[s, z]."""
    z = tl.program_id(0)
    split = tl.program_id(1)
    r = tl.load(rows_ptr + z)
    c = tl.load(cols_ptr + z)
    m_start = split * m_per_split
    m_end = tl.minimum(m_start + m_per_split, M)
    acc = tl.zeros((B, B), dtype=tl.float32)
    for m0 in tl.range(m_start, m_end, BLOCK_M):
        a = at_desc.load([m0, r * B])
        b = b_desc.load([m0, c * B])
        acc = tl.dot(a.T, b, acc, input_precision=INPUT_PRECISION)
    offs = tl.arange(0, B)
    slot = split.to(tl.int64) * nnz + z
    out_ptrs = out_ptr + slot * (B * B) + offs[:, None] * B + offs[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _dds_desc_kernel(
    a_ptr, v_ptr, c_ptr, bias_ptr,
    ptr_ptr, idx_ptr, slot_ptr,
    M, K_A, n_out_blocks, nnz, stride_am, stride_cm,
    B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    TRANS_V: tl.constexpr, HAS_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """dds with tensor descriptors built on the device: same tiles as _dds_tma_kernel
    (one per program), without the host encoding three descriptors per launch."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), n_out_blocks, GROUP_M)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K_A], [stride_am, 1], [BLOCK_M, BLOCK_K])
    if TRANS_V:
        v_desc = tl.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [B, BLOCK_K])
    else:
        v_desc = tl.make_tensor_descriptor(v_ptr, [nnz * B, B], [B, 1], [BLOCK_K, B])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, n_out_blocks * B], [stride_cm, 1], [BLOCK_M, B])
    K_STEPS: tl.constexpr = B // BLOCK_K
    start = tl.load(ptr_ptr + pid_n)
    end = tl.load(ptr_ptr + pid_n + 1)
    row0 = pid_m * BLOCK_M
    acc = tl.zeros((BLOCK_M, B), dtype=tl.float32)
    for t in tl.range(start * K_STEPS, end * K_STEPS):
        e = t // K_STEPS
        kk = (t % K_STEPS) * BLOCK_K
        blk = tl.load(idx_ptr + e)
        if HAS_SLOT:
            slot = tl.load(slot_ptr + e)
        else:
            slot = e
        a = a_desc.load([row0, blk * B + kk])
        if TRANS_V:
            v = v_desc.load([slot * B, kk]).T
        else:
            v = v_desc.load([slot * B + kk, 0])
        acc = tl.dot(a, v, acc, input_precision=INPUT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + pid_n * B + tl.arange(0, B)).to(tl.float32)[None, :]
    c_desc.store([row0, pid_n * B], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def _sdd_desc_kernel(
    at_ptr, b_ptr, out_ptr, rows_ptr, cols_ptr,
    M, R_B, C_B, m_per_split, nnz, stride_atm, stride_bm,
    B: tl.constexpr, BLOCK_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """sdd with device-built descriptors; same math as _sdd_tma_kernel."""
    at_desc = tl.make_tensor_descriptor(at_ptr, [M, R_B], [stride_atm, 1], [BLOCK_M, B])
    b_desc = tl.make_tensor_descriptor(b_ptr, [M, C_B], [stride_bm, 1], [BLOCK_M, B])
    _sdd_block(at_desc, b_desc, out_ptr, rows_ptr, cols_ptr, M, m_per_split, nnz, B, BLOCK_M, INPUT_PRECISION)


# --------------------------------------------------------------------------- eligibility


def tma_supported(device: torch.device) -> bool:
    """TMA needs a Hopper-class GPU (compute capability >= 9)."""
    return capability_major(device) >= 9


def row_major_tma_ok(t: torch.Tensor) -> bool:
    """A tensor a TMA descriptor can address as a 2-D row-major matrix: unit inner stride,
    16-byte aligned base and row pitch, rows that do not overlap (an expanded view's zero
    row stride cannot be described), nothing empty. A 3-D tensor must be contiguous
    (blocks [nnz, b, b], addressed as [nnz * b, b])."""
    if t.numel() == 0 or t.data_ptr() % 16:
        return False
    size = t.element_size()
    if t.dim() == 3:
        return t.is_contiguous() and (t.shape[-1] * size) % 16 == 0
    return (t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0
            and (t.shape[0] <= 1 or t.stride(0) >= t.shape[1]))


def descriptor(t: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block_shape)


def launch_sdd(a_t, b, out, rows, cols, m, m_per_split, nnz, splits, cfg, block_size, precision):
    at_desc = descriptor(a_t, [cfg.block_m, block_size])
    b_desc = descriptor(b, [cfg.block_m, block_size])
    launch(_sdd_tma_kernel, (nnz, splits),
        at_desc, b_desc, out, rows, cols,
        m, m_per_split, nnz,
        B=block_size, BLOCK_M=cfg.block_m, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )



def _torch_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """Device-built descriptors need a little global scratch per launch, which Triton
    takes from the allocator set with triton.set_allocator. Set a torch one unless the
    caller already set theirs (the setting is per thread: autograd's backward threads
    start without one)."""
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


def launch_dds_device_desc(a, values, c, bias, ptr, idx, slot, n_out, cfg, trans, precision):
    b = values.shape[-1]
    ensure_allocator()
    launch(_dds_desc_kernel, (cdiv(a.shape[0], cfg.block_m) * n_out,),
        a, values, c, bias if bias is not None else c,
        ptr, idx, slot if slot is not None else ptr,
        a.shape[0], a.shape[1], n_out, values.shape[0], a.stride(0), c.stride(0),
        B=b, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
        TRANS_V=trans, HAS_SLOT=slot is not None, HAS_BIAS=bias is not None,
        GROUP_M=cfg.group_m, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def launch_sdd_device_desc(a_t, b, out, rows, cols, m, m_per_split, nnz, splits, cfg, block_size, precision):
    ensure_allocator()
    launch(_sdd_desc_kernel, (nnz, splits),
        a_t, b, out, rows, cols,
        m, a_t.shape[1], b.shape[1], m_per_split, nnz, a_t.stride(0), b.stride(0),
        B=block_size, BLOCK_M=cfg.block_m, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
