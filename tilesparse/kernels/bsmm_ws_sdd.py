"""Hopper (sm90) warp-specialized, persistent sdd, the sampled product of updat
(values[z] = (A @ B)[block z]), written in Gluon: a producer warp streams each block's
two activation panels (M-slices of A^T's and B's block-columns) through the ring of
:mod:`tilesparse.kernels.bsmm_ws`, whose config, ring and MMA helpers it shares, and
consumer warpgroups issue wgmma. Opt-in (a ``WsConfig`` passed to
:func:`tilesparse.kernels.bsmm.sdd`): on the H200 it was within +-4 % of the Triton sdd
at b 128 and 0.68-0.71x of it at b 64 (docs/performance.md, eleventh session).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from ..layout import table_views
from ._device import shared_memory_bytes, sm_count
from ._launch import launch
from .bsmm_tma import ensure_allocator, row_major_tma_ok
from .bsmm_ws import WsConfig, _alloc_ring, _fill_stage, _mma_stages, _nvmma, _warps_per_cta, hopper_reason

__all__ = ["operand_reason", "shared_memory_reason", "density_floor_reason", "sdd_ws_supported", "run_if_supported",
           "launch_sdd_ws"]

KERNEL_NAME = "warp-specialized kernel"  # as bsmm.sdd's errors name it
CONFIG = WsConfig  # the config that asks bsmm.sdd for this kernel


@gluon.jit
def _sdd_ws_load_partition(at_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, rows_ptr, cols_ptr, M, nnz,
                           B: gl.constexpr, BLOCK_M: gl.constexpr):
    """sdd's producer (one warp): for each of this program's blocks z, the M-slices of
    A^T's block-column rows[z] and B's block-column cols[z], into the ring."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for z in range(pid, nnz, nprog):
        r = gl.load(rows_ptr + z)
        c = gl.load(cols_ptr + z)
        for m0 in range(0, M, BLOCK_M):
            _fill_stage(step, at_desc, [m0, r * B], b_desc, [m0, c * B], a_bufs, b_bufs, ready_bars, empty_bars)
            step += 1


@gluon.jit
def _sdd_ws_mma_partition(out_desc, a_bufs, b_bufs, out_smem, ready_bars, empty_bars, M, nnz,
                          B: gl.constexpr, BLOCK_M: gl.constexpr, num_warps: gl.constexpr):
    """sdd's consumers: out[z] = sum over the M-slices of A^T-slice^T @ B-slice (the
    A tile's transposed view is wgmma's A operand), then the block out through TMA."""
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=_warps_per_cta(B, num_warps), instr_shape=[16, B, 16])
    n_steps = gl.cdiv(M, BLOCK_M)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    step = 0
    for z in range(pid, nnz, nprog):
        acc = gl.zeros((B, B), dtype=gl.float32, layout=mma_layout)
        acc = _mma_stages(acc, step, n_steps, a_bufs, b_bufs, ready_bars, empty_bars, True, False)
        step += n_steps
        tma.store_wait(pendings=0)  # the previous block's store has left out_smem
        out_smem.store(acc.to(out_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [z * B, 0], out_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _sdd_ws_kernel(
    at_ptr, b_ptr, out_ptr, rows_ptr, cols_ptr,
    M, R_B, C_B, nnz, stride_atm, stride_bm,
    B: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, LOAD_REGS: gl.constexpr,
    ab_layout: gl.constexpr, out_layout: gl.constexpr, num_warps: gl.constexpr,
):
    """updat's sampled product, persistent and warp-specialized: program p takes blocks
    p, p + P, ... of the layout (table order). ``at`` is the row-major [M, R*B] matrix
    whose transpose is sdd's left operand (dY), ``b`` the row-major [M, C*B] (X); ``out``
    the blocks [nnz, B, B]. Slices past M are zero-filled by TMA."""
    dtype: gl.constexpr = at_ptr.dtype.element_ty
    at_desc = tma.make_tensor_descriptor(at_ptr, [M, R_B], [stride_atm, 1], [BLOCK_M, B], ab_layout)
    b_desc = tma.make_tensor_descriptor(b_ptr, [M, C_B], [stride_bm, 1], [BLOCK_M, B], ab_layout)
    out_desc = tma.make_tensor_descriptor(out_ptr, [nnz * B, B], [B, 1], [B, B], out_layout)
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, B], ab_layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, B], ab_layout)
    out_smem = gl.allocate_shared_memory(dtype, [B, B], out_layout)
    ready_bars, empty_bars = _alloc_ring(STAGES)
    gl.warp_specialize([
        (_sdd_ws_mma_partition, (out_desc, a_bufs, b_bufs, out_smem, ready_bars, empty_bars, M, nnz, B, BLOCK_M,
                                 num_warps)),
        (_sdd_ws_load_partition, (at_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, rows_ptr, cols_ptr, M, nnz,
                                  B, BLOCK_M)),
    ], [1], [LOAD_REGS])


@functools.lru_cache(maxsize=None)
def _sdd_layouts(block_m: int, b: int, dtype: torch.dtype) -> tuple:
    """The sdd kernel's shared-memory layouts: the activation tiles', the output block's."""
    return _nvmma([block_m, b], dtype), _nvmma([b, b], dtype)



def operand_reason(a_t: torch.Tensor, x: torch.Tensor, out: torch.Tensor, blocks: tuple[int, ...]) -> str | None:
    """Why the warp-specialized sdd kernels cannot take these operands (a_t [M, R*b] and
    x [M, C*b], the sampled product's operands with M leading; out [nnz, b, b]): not an
    sm90 GPU or a 16-bit dtype, a block size outside ``blocks``, mixed dtypes, rows TMA
    cannot address. None if they can; each kernel adds its own limits."""
    block = out.shape[-1]
    why = hopper_reason(a_t)
    if why is not None:
        return why
    if block not in blocks:
        return f"needs a block size of {' or '.join(map(str, blocks))}, got {block}"
    if x.dtype != a_t.dtype or out.dtype != a_t.dtype:
        return f"needs one dtype: A is {a_t.dtype}, B {x.dtype}, the blocks {out.dtype}"
    for name, t in (("A (transposed)", a_t), ("B", x)):
        if not row_major_tma_ok(t):
            return f"needs a {name} with M leading and 16-byte-aligned, non-overlapping rows"
    return None


def shared_memory_reason(needed: int, device: torch.device) -> str | None:
    """Why a config needing ``needed`` bytes of shared memory cannot run on ``device``, or
    None if they fit (the warp-specialized sdd kernels' shared check)."""
    if needed > shared_memory_bytes(device):
        return f"needs {needed} bytes of shared memory at this config, more than the GPU has"
    return None


def density_floor_reason(nnz: int, block_rows: int, block_cols: int, min_density: float,
                         tuned_entry: bool) -> str | None:
    """Why a tuned entry (``tuned_entry``) is refused below its kernel's ``min_density``:
    a tuned density bucket's low end, where the kernel was measured slower. None otherwise
    (configs passed explicitly always run)."""
    if tuned_entry and nnz < min_density * block_rows * block_cols:
        return f"is not used below density {min_density} (measured slower)"
    return None


def sdd_ws_supported(a_t: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: WsConfig) -> str | None:
    """Why the sdd kernel cannot run these operands (as :func:`operand_reason`, b 64 or
    128), or None if it can."""
    block = out.shape[-1]
    if cfg.pingpong:
        return "has no ping-pong mode for sdd"
    why = operand_reason(a_t, b, out, (64, 128))
    if why is not None:
        return why
    if 16 * cfg.num_warps > block:
        return f"would compute each {block}-row block more than once with {cfg.num_warps} warps"
    if max(a_t.shape[0], a_t.shape[1], b.shape[1], out.shape[0] * block) >= 1 << 31:
        return "addresses tensors through TMA, whose coordinates are 32-bit"
    return shared_memory_reason(cfg.shared_bytes(block, sdd=True), a_t.device)


def run_if_supported(a_t, b, out, meta, block_rows, block_cols, cfg: WsConfig, tuned_entry: bool) -> str | None:
    """Run the kernel and return None if it can take this call; else say why (the same
    interface as :func:`tilesparse.kernels.bsmm_ws_sdd_group.run_if_supported`)."""
    why = sdd_ws_supported(a_t, b, out, cfg)
    if why is None:
        launch_sdd_ws(a_t, b, out, *table_views(meta, block_rows, block_cols, "row_of", "row_cols"), cfg)
    return why


def launch_sdd_ws(a_t, b, out, rows, cols, cfg: WsConfig) -> None:
    """out[z] = (a_t^T @ b)[block rows[z], cols[z]] for every stored block z, into the
    preallocated contiguous out [nnz, B, B]."""
    block = out.shape[-1]
    nnz = out.shape[0]
    lay = _sdd_layouts(cfg.block_m, block, a_t.dtype)
    ensure_allocator()
    launch(_sdd_ws_kernel, (max(1, min(nnz, sm_count(a_t.device))),),
        a_t, b, out, rows, cols,
        a_t.shape[0], a_t.shape[1], b.shape[1], nnz, a_t.stride(0), b.stride(0),
        B=block, BLOCK_M=cfg.block_m, STAGES=cfg.stages, LOAD_REGS=cfg.load_regs,
        ab_layout=lay[0], out_layout=lay[1], num_warps=cfg.num_warps,
    )
