"""Launch configs of the fused attention kernels (:mod:`tilesparse.kernels.attention_kernels`):
the config type, the H200-measured configs and the heuristic, and whether a config's
tensor-descriptor (TMA) loads can be honoured for given tensors."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._device import capability_major
from ._tiles import next_power_of_2


@dataclass(frozen=True)
class AttentionConfig:
    """Launch parameters of one pass: BLOCK_M query rows and BLOCK_N key rows per tile
    (each a power of two >= 16 dividing the layout block size b), warps and stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # the walked operands through tensor descriptors (Hopper TMA) where they qualify
    split_last: bool = False  # forward: walk a row's unmasked blocks apart from its last (no key padding)
    # dK/dV: walk the key tile's column twice, dV then dK, so that one fp32 BLOCK_N x D
    # accumulator is live at a time instead of two (5 matmuls per block pair instead of 4;
    # registers for larger tiles or more stages without spilling). Ignored by fwd and dq.
    two_pass: bool = False
    # registers per thread, capped (ptxas .maxnreg; None: ptxas's choice, up to 255): e.g.
    # 128 lets two CTAs of 8 warps share an SM, at the price of spills
    maxnreg: int | None = None

    def check(self, block_size: int) -> None:
        """Raise ValueError unless both tile sides are powers of two >= 16 dividing b (and
        maxnreg, when set, is 32..255)."""
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1) or block_size % value:
                raise ValueError(f"AttentionConfig.{name}={value} must be a power of two >= 16 dividing the "
                                 f"block size {block_size}")
        if self.maxnreg is not None and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"AttentionConfig.maxnreg={self.maxnreg} must be None or 32..255")

    def launch_options(self) -> dict:
        """num_warps, num_stages and, when set, maxnreg: the launch's compile options."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        return options


# Swept on the H200 (scripts/probes/attention_configs.py, bf16, B 4, H 16, S 8192, D 128,
# b 128; causal and local-1024 layouts agreed): forward 128 x 128 tiles (1.27x over the
# heuristic below), dK/dV 64 x 128 with 8 warps (2.0x), dQ 128 x 32 with 8 warps. The
# second sweep (2026-11-30, with tensor-descriptor loads) took TMA for the forward (causal
# 2.76 -> 2.34 ms, local-1024 0.83 -> 0.80 ms) and for dK/dV (1 %); dQ kept pointers.
# A dK/dV config must also fit its deterministic=False variant, whose TMA reduction stages
# BLOCK_M x D fp32 in shared memory (64 x 128: 131.6 -> 180.8 KB of the H200's 227 KB).
_MEASURED = {
    "fwd": AttentionConfig(128, 128, num_warps=8, num_stages=3, tma=True),
    "dkdv": AttentionConfig(64, 128, num_warps=8, num_stages=2, tma=True),
    "dq": AttentionConfig(128, 32, num_warps=8, num_stages=2),
}


@functools.lru_cache(maxsize=256)
def attention_config(kind: str, block_size: int, head_dim: int, dtype: torch.dtype) -> AttentionConfig:
    """Config per pass ("fwd", "dkdv", "dq"). 16-bit inputs with a 128-wide head tile
    (D 96-128) on blocks of 128 or more use the configs measured on the H200
    (``_MEASURED``). Elsewhere a heuristic, from Triton's fused-attention tutorial (triton
    3.x, FlashAttention-2): forward 128 x 64 tiles with 8 warps at D >= 64; backward 32
    query rows x 128 keys for dK/dV and 128 query rows x 32 keys for dQ with 4 warps.
    At D = 128 (and 96, on a 128 tile) the backward's wide side is halved and dK/dV gets
    8 warps, by register arithmetic: two fp32 BLOCK_N x 128 accumulators at BLOCK_N =
    128 would need ~256 registers per thread on 4 warps. fp32 inputs halve the wide
    side (tiles of twice the bytes); tiles under 32 x 64 get 2 warps. Every side is
    capped at b: a tile never spans two blocks."""
    d_tile = max(16, next_power_of_2(head_dim))
    if kind in _MEASURED and dtype != torch.float32 and d_tile == 128 and block_size >= 128:
        return _MEASURED[kind]
    wide = 128 if dtype != torch.float32 else 64
    if d_tile >= 128 and kind != "fwd":
        wide //= 2
    if kind == "fwd":
        bm, bn = wide, wide // 2
    elif kind == "dkdv":
        bm, bn = 32, wide
    elif kind == "dq":
        bm, bn = wide, 32
    else:
        raise ValueError(f"kind must be 'fwd', 'dkdv' or 'dq', got {kind!r}")
    bm, bn = min(bm, block_size), min(bn, block_size)
    if bm * bn < 32 * 64:
        warps = 2
    elif kind == "fwd":
        warps = 8 if bm * bn >= 128 * 64 and d_tile >= 64 else 4
    elif kind == "dkdv":
        warps = 8 if bn * d_tile >= 64 * 128 else 4
    else:
        warps = 4
    stages = 3 if d_tile <= 64 else 2
    return AttentionConfig(bm, bn, warps, stages)


def _tma_ok(cfg: AttentionConfig, head_dim: int, d_tile: int, *tensors: torch.Tensor) -> bool:
    """Whether ``cfg.tma`` can be honoured: a Hopper-class GPU (or the interpreter on the
    CPU), D a power of two (the box is the whole head), and every tensor addressable by a
    descriptor (unit inner stride, 16-byte aligned base and outer strides). Otherwise the
    pointer path runs: a config is a speed hint, never a correctness switch."""
    if not cfg.tma or head_dim != d_tile:
        return False
    device = tensors[0].device
    if device.type == "cuda" and capability_major(device) < 9:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
            return False  # a broadcast (expanded) dimension: not a descriptor's kind of tensor
    return True
