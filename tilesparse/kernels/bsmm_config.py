"""Launch configs of the tile kernels of :mod:`tilesparse.kernels.bsmm` and the heuristics
that pick a kernel and a config where no measured choice (``tuned``) is known: which M
runs the small-batch kernel, the tile shapes of dds and sdd, TF32 or IEEE fp32."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._device import sm_count
from ._tiles import cdiv, check_power_of_two, next_power_of_2, tile_for


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters. ``block_k`` is the reduction step of dds (unused by sdd);
    ``splits`` cuts sdd's M reduction into that many slices (1 for dds). ``tma`` picks
    the Hopper TMA kernels where the operands allow (dds's always build their descriptors
    on the device); ``device_desc`` makes sdd build its descriptors inside the kernel too.
    (Triton's warp specialization was tried and dropped: no gain at any swept config, and
    one, 128x64x64 with 5 stages, returned NaN on the H200; docs/performance.md.)"""

    block_m: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    splits: int = 1
    tma: bool = False
    device_desc: bool = False

    def __post_init__(self):
        check_power_of_two(self, "block_m", "block_k")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"KernelConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        for name in ("num_stages", "group_m", "splits"):
            if getattr(self, name) < 1:
                raise ValueError(f"KernelConfig.{name} must be >= 1, got {getattr(self, name)!r}")




def _input_precision(dtype: torch.dtype) -> str:
    """fp32 operands use TF32 unless PyTorch is set to 'highest' float32 matmul precision,
    the same switch that governs dense cuBLAS."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee"


SMALL_M_MAX = 64
"""Largest M the small-batch dds kernel takes when no measured choice is known (fp32, or
blocks of 16). The H200's shipped table holds the measured faster kernel for M 16-512 per
op, block size and density (``scripts/measure_small_crossover.py``)."""

# 16-bit, by block size (powers of two only: others were not timed): the largest M where the
# small kernel's configs (``small_config``) beat the large-batch tiles at every density timed
# (H200, W 12288² and 4096², bf16, fe39cf4, `...-small-mid-*.json`): b 32 at M 128 (130 vs
# 155 µs at density 0.5); b 64 to M 512 (202 vs 226); b 128 to M 256 (at M 512 the tiles won
# at density >= 0.25: 140 vs 196).
_MID_M_MAX = {32: 128, 64: 512, 128: 256}


def use_small_kernel(m: int, block_size: int, dtype: torch.dtype) -> bool:
    """Whether dds with M rows of activations runs the small-batch (weight-streaming)
    kernel rather than the large-batch tiles, where no measured config says."""
    if m <= SMALL_M_MAX:
        return True
    return dtype != torch.float32 and m <= _MID_M_MAX.get(block_size, 0)


@functools.lru_cache(maxsize=4096)
def dds_config(m: int, block_size: int, dtype: torch.dtype) -> KernelConfig:
    """Deterministic heuristic config for dds, from the H200 sweeps of 2026-11-29
    (docs/performance.md): 128-row tiles, 4 warps, 4 stages for 16-bit types; TMA only
    at b = 128 (at b = 64 the pointer kernel was as fast at density 0.5 and faster at 0.05),
    with descriptors built on the device (0.463 vs 0.517 ms on a full 4096² layout, 0.252
    vs 0.282 ms at density 0.5; within noise at 0.1)."""
    tile = tile_for(block_size)
    block_m = 128 if m >= 128 else max(16, next_power_of_2(m))
    wide = dtype != torch.float32
    block_k = min(tile, 64 if wide else 32)  # fp32 tiles are twice the bytes: halve k
    num_warps = 8 if block_m * tile >= 128 * 128 and not wide else 4
    stages = 4 if wide and tile >= 64 else 3
    return KernelConfig(block_m, block_k, num_warps, stages, tma=wide and tile >= 128)


@functools.lru_cache(maxsize=4096)
def sdd_config(m: int, block_size: int, nnz: int, dtype: torch.dtype, device: torch.device) -> KernelConfig:
    """Deterministic heuristic config for sdd. The M reduction is split only when the
    layout has far fewer blocks than the GPU has SMs: on the H200, splitting 51 blocks
    of 128 three ways ran at 0.060 ms against 0.054 ms unsplit (fp32 workspace traffic)."""
    tile = tile_for(block_size)
    wide = dtype != torch.float32
    block_m = 128 if tile == 32 and wide else (64 if wide else 32)
    stages = 4 if wide and tile >= 64 else 3
    sms = sm_count(device)
    splits = 1
    if 4 * nnz < sms:
        splits = max(1, min(cdiv(sms, max(1, nnz)), m // (8 * block_m)))
    return KernelConfig(block_m, tile, 4, stages, splits=splits, tma=wide)
