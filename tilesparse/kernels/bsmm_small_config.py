"""The small-batch kernel's launch parameters (:class:`SmallConfig`) and the rules that pick them:
the heuristic config (:func:`small_config`), chunks for skewed layouts (:func:`auto_chunks`), the grid
(:func:`small_grid`) and the warps for a grid of one wave or less (:func:`warps_for_grid`). The kernel
and its launcher are :mod:`tilesparse.kernels.bsmm_small` (which re-exports these names)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ._l2_prefetch import check_reach
from ._tiles import cdiv, check_bools, check_power_of_two, next_power_of_2, tile_for

__all__ = ["CHUNK_MIN_BYTES", "CHUNK_SKEW", "MAX_CHUNKS", "SmallConfig", "auto_chunks", "rows_per_program",
           "small_config", "small_grid", "warps_for_grid"]


MAX_CHUNKS = 16  # chunks per output slice (the launch's third grid axis)


@dataclass(frozen=True)
class SmallConfig:
    """Launch parameters of the small-batch kernel: ``sub`` output features per program,
    ``block_k`` reduction step, ``block_m`` activation rows per program, ``splits``
    programs per output slice (each summing a run of its blocks into an fp32 workspace;
    for few output slices, e.g. bprop of a small recurrent weight), ``chunks``: at most
    this many programs per output slice, for entry runs longer than the mean only (a
    random layout's longest block-row holds 1.5-2.5x the mean; the kernel waits on it),
    summed in-kernel by the last to finish; ``longest_first``: programs take the output
    slices in order of run length, longest first (a permutation of the tables, built
    once per layout); ``swap``: each step's product with the activation rows as the
    MMA's M side (Hopper's wgmma at ``block_m`` 64 with 32-wide slices; the default for
    16-bit inputs at M > 32, b >= 32); ``m_inner``: the activation row tiles of one weight
    slice are consecutive programs (they share the slice through L2 instead of reading it
    from HBM once per row tile; matters only where M > ``block_m``); ``prefetch``: each
    step's block index and activation tile loaded ahead of it (off the step's critical
    path: with the weight alone streamed by the pipeliner, each step waited on an index
    load and the gather it feeds); ``l2_ahead``: blocks ahead of the step that each
    program asks L2 to fetch (bulk prefetch hints, sm_90+; 0: none), so more weight bytes
    are in flight than the shared-memory ring holds. bprop's steps over several blocks
    (b 16's 64-deep steps) ignore it, as do the interpreter and older GPUs;
    ``spread_index`` (default): steps over several blocks load each block's index (and slot)
    once and spread it over the block's lanes, not once per reduction lane (0-25 % faster at
    every b 8 / 16 point timed, W 4096² and 12288²; forty-first session); ignored by one-block
    steps."""

    sub: int
    block_k: int
    block_m: int
    num_warps: int
    num_stages: int
    splits: int = 1
    chunks: int = 1
    longest_first: bool = False
    swap: bool = False
    m_inner: bool = False
    prefetch: bool = False
    l2_ahead: int = 0
    spread_index: bool = True

    def __post_init__(self):
        check_power_of_two(self, "sub", "block_k", "block_m")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.splits < 1:
            raise ValueError(f"SmallConfig needs num_warps in 1..16 (a power of two), num_stages >= 1 and "
                             f"splits >= 1, got {self.num_warps!r}, {self.num_stages!r}, {self.splits!r}")
        if (isinstance(self.chunks, bool) or not isinstance(self.chunks, int) or not 1 <= self.chunks <= MAX_CHUNKS
                or (self.chunks > 1 and self.splits > 1)):
            raise ValueError(f"SmallConfig.chunks must be an int in 1..{MAX_CHUNKS} and cannot combine with "
                             f"splits > 1, got chunks={self.chunks!r}, splits={self.splits!r}")
        check_bools(self, "longest_first", "swap", "m_inner", "prefetch", "spread_index")
        check_reach(self)


# 16-bit (block_k, num_stages) by tile side, measured on the H200 (W 12288², bf16, M 1
# and 32, density 0.25 and 0.03; `bench/results/2026-11-30-nvidia-h200-small-variants*`):
# b = 16 runs 64-deep steps over 4 consecutive blocks (67.6 -> 42.8 µs at density 0.25,
# M 1: 16-byte loads instead of 4-byte ones); at b = 32 and 64 one block per step with 12
# stages beat the multi-block steps (b = 64 bprop 24.7 vs 36.6 µs); b = 128 streams
# 128-deep steps (22.8 vs 26.5 µs for 64-deep).
_SMALL_16BIT = {16: (64, 8), 32: (32, 12), 64: (64, 12), 128: (128, 8)}


def rows_per_program(m: int) -> int:
    """The small kernel's activation rows per program by default: M's power of two, 16 to 64."""
    return min(64, max(16, next_power_of_2(max(m, 1))))


@functools.lru_cache(maxsize=4096)
def small_config(m: int, block_size: int, dtype: torch.dtype, smem_bytes: int = 1 << 30) -> SmallConfig:
    """Heuristic config: slices of 32 features (16 for blocks of 16), activations padded
    to a power of two >= 16 (at most 64; the swapped orientation above 32; above 64 rows
    at b >= 64, 64-wide slices with the row tiles inner), and a deep
    pipeline: the loop is a stream of independent loads, and HBM needs many bytes in
    flight (on the H200, 8 stages streamed b = 128 at twice the rate of 4). Reduction
    steps and stages per tile side from the H200 sweeps (``_SMALL_16BIT``); fp32 takes
    32-deep steps and 8 stages."""
    tile = tile_for(block_size)
    elt = torch.finfo(dtype).bits // 8
    sub = min(tile, 32)
    if dtype == torch.float32:
        block_k, stages = min(tile, 32), 8
    else:
        block_k, stages = _SMALL_16BIT[min(tile, 128)]
    block_m = rows_per_program(m)
    swap = False
    if dtype != torch.float32 and block_size >= 32 and block_m == 64:
        # M > 32: the swapped orientation (activation rows as the MMA's M: wgmma instead of
        # mma.sync), 32-wide slices, steps of at most 64, 12 stages. H200, M 64, W 12288²
        # (`...-small-swap.json`, same run): b = 128 fprop 31.6 -> 28.8 µs at density 0.25,
        # 17.6 -> 14.5 at 0.1; bprop 34.8 -> 30.8, 18.9 -> 15.7; b = 64 and 32 8-22 % faster
        # (b = 64 bprop at 0.25: 2 %). At M 32 (block_m 32) it was equal for fprop and
        # 50-77 % slower for bprop; at b = 16 slower.
        sub, block_k, stages, swap = 32, min(tile, 64), 12, True
    # 2 warps for 16-bit slices not swapped onto wgmma (which needs the 4 of a warpgroup): H200, W 12288²
    # (`...-small-warps44-*-4d956ce.json`, same run), b 32-128 at one row 1-10 % faster than 4 warps at all
    # 12 forward points (b 32, density 0.25: 24.4 -> 22.4 µs); b 16 at 8 rows up to 22 %. Measured on the
    # H200 only (bf16); the reason (a 16-32-wide tile is too little work for 4 warps) is not Hopper's.
    warps, m_inner = (2 if dtype != torch.float32 and not swap else 4), False
    if swap and m > 64 and block_size >= 64:  # (b 33-63 on 64-wide tiles: not timed)
        # M 65-512, b >= 64: 64-wide slices with a slice's row tiles run together (sharing it
        # through L2), 128-row programs above M 128. H200, W 12288², bf16, fe39cf4
        # (`...-small-mid-*.json`), b 128 at density 0.5: M 128 95.7 -> 61.2 µs (dense 76.8),
        # M 256 117 -> 103 µs (dense 122); b 64 alike; the tile kernel 105-123 µs.
        sub, block_k, m_inner = 64, 64, True
        block_m, warps, stages = (64, 4, 8) if m <= 128 else (128, 8, 6)
    # Fewer stages where shared memory is short (the compiler keeps ~16 KiB for itself).
    per_stage = (sub * block_k + block_k * block_m) * elt
    stages = max(2, min(stages, (smem_bytes - 16384) // per_stage))
    return SmallConfig(sub, block_k, block_m, num_warps=warps, num_stages=stages, swap=swap, m_inner=m_inner)


# Chunks on skewed layouts, measured on the H200 (bf16, W 12288², M 1 and 32;
# `bench/results/2026-11-30-nvidia-h200-small-chunks*.json`). Barabasi-Albert layouts,
# whose hub block-rows hold ~4x the mean: 2 chunks were 3-15 % faster at density 0.1
# (b = 128: 16.7 -> 15.2 µs; b = 32: 20.8 -> 17.6 µs, M 1, fprop), where a program's
# mean run is ~78 KB of weight; at density 0.03 (~23 KB per program, the kernel bound by
# latency) they were up to 13 % slower. Random layouts (longest run 1.5-2.5x the mean):
# 10-40 % slower at every point.
CHUNK_SKEW = 3.0  # the longest run at least this many times the mean
CHUNK_MIN_BYTES = 48 * 1024  # a program's mean run of weight bytes at least this


def auto_chunks(longest: int | None, nnz: int, n_out: int, block_size: int, sub: int, dtype: torch.dtype) -> int:
    """Chunks for the default config: 2 where the layout is skewed (its longest run of
    blocks per output slice ``longest`` >= CHUNK_SKEW x the mean) and the mean run moves
    enough bytes per program to be bandwidth-bound, else 1. ``longest`` None (not known
    without a host sync) or fp32 inputs (not measured): 1."""
    if longest is None or dtype == torch.float32 or nnz == 0 or n_out == 0:
        return 1
    mean = nnz / n_out
    per_program = mean * sub * block_size * (torch.finfo(dtype).bits // 8)
    return 2 if longest >= CHUNK_SKEW * mean and per_program >= CHUNK_MIN_BYTES else 1


def small_grid(n_out: int, block_size: int, m: int, cfg: SmallConfig) -> tuple[int, int, int]:
    """The small kernel's grid (slices, row tiles, splits or chunks) before ``m_inner`` swaps its axes."""
    return n_out * (tile_for(block_size) // cfg.sub), cdiv(m, cfg.block_m), max(cfg.splits, cfg.chunks)


def warps_for_grid(cfg: SmallConfig, programs: int, sms: int) -> SmallConfig:
    """``cfg`` at 4 warps where its grid is one wave or less (``programs`` <= ``sms``): then a program
    has its SM to itself, and 1-2 warps issue too few loads to keep the stream going. The 1-2 warp
    configs (heuristic and table) were measured on W 12288² (384 programs at b >= 32); on the H200 at
    4096² (128 programs, ``...-small-warps46-4096-d8cc2cb.json``, same run) 4 warps were faster at
    b 128 by 3-18 % at most points and at b 32 / 64 fprop with 32 rows by 10-22 % (b 64, density 0.5:
    12.6 -> 9.8 µs; 4 warps lost 3-8 % at b 32 fprop and b 64 bprop at 1-8 rows); at 8192² (256 programs,
    ``...-warps46-8192-*``) 2 warps stayed ahead at b 32 / 64 with one row (3-12 %), and for b 16 at 4096²
    (256 programs) at 8 rows (4-5 %). Other configs are returned as they are. (The dispatcher applies it
    to its heuristic's configs and to table entries not measured on the weight's own shape.)"""
    if cfg.num_warps >= 4 or programs > sms:
        return cfg
    return _at_four_warps(cfg)


@functools.lru_cache(maxsize=256)
def _at_four_warps(cfg: SmallConfig) -> SmallConfig:
    return replace(cfg, num_warps=4)  # (remembered: replace re-validates the config, ~5 µs of host per call)
