"""Block-sparse attention's dQ from stored dS: 5 matmuls per block pair in the backward
instead of 7, deterministic.

The default backward computes dK/dV over the layout's columns (S, dP, dV, dK: 4
matmuls per block pair) and dQ over its rows (S and dP again, then dQ: 3 more), because
dQ sums over key blocks that different dK/dV programs own. Summing dQ by atomics in the
dK/dV kernel (``deterministic=False``) saves the recomputation but not the order. Here
the dK/dV kernel stores each pair's dS tile (``STORE_DS``, in the inputs' dtype: the
value its dK product uses) into a workspace, and dQ is one product per pair over each
row, in table order:

    dQ[i] = scale * sum over the key blocks j of row i of dS[i, j] @ K[j]

so the backward does 5 matmuls per pair and the dS bytes cross HBM twice (written once,
read once). On issue 6's local-1024 case (B 4, H 16, S 8192, blocks of 128: 540 pairs
per (batch, head), 34.5k in all) that is 1.1 GB of workspace in bf16. It is used where
the workspace's budget allows, in chunks of heads where it is larger (``plan``); where not
even one unit fits (long sequences: the goal of 131072 keys at 2-5 % of blocks), dQ is
recomputed and the backward's memory stays O(S * D).

Status: interpreter-tested; off by default (``MODE``) until timed on a GPU against the
recomputing kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._env import ON, switch
from ..attention.layout import attention_table_views
from ._device import cached_table
from .attention_kernels import _query_tile

__all__ = ["MODE", "MAX_WORKSPACE_BYTES", "ACTIVATION_FACTOR", "FREE_FRACTION", "Chunk", "workspace_bytes",
           "enabled", "budget_bytes", "plan", "row_entry_slots", "_bwd_dq_from_ds_kernel"]

# "off": always recompute dQ's S and dP; "on": store dS wherever the workspace fits;
# TILESPARSE_STORED_DS (on / 1 / true / yes, or off / 0 / false / no) overrides. Off until
# timed on the GPU (docs/performance.md).
MODE = "off"
# The workspace's budget (budget_bytes): at most this many bytes, ACTIVATION_FACTOR times
# one [B, H, S, D] activation, and on CUDA FREE_FRACTION of the device memory free at the
# call. A backward whose workspace is larger runs in chunks of heads (plan); where one
# unit does not fit, dQ is recomputed. Issue 6's local-1024 case needs 1.1 GB (8.6x its
# 128 MiB activations: one chunk), causal at S 8192 4.4 GB (3 chunks), S 131072 at 2 %
# with 2 heads 1.3 GB per head against 32 MiB activations (recomputed: memory O(S * D)).
MAX_WORKSPACE_BYTES = 8 << 30
ACTIVATION_FACTOR = 16
FREE_FRACTION = 0.25


def workspace_bytes(batch: int, heads: int, layout_heads: int, nnz: int, block_size: int,
                    dtype: torch.dtype) -> int:
    """Bytes of the dS workspace: one [b, b] tile per stored block pair of every (batch,
    head); heads sharing one layout (``layout_heads`` 1) each need their own."""
    heads_per_layout = heads // layout_heads
    return batch * heads_per_layout * nnz * block_size * block_size * torch.finfo(dtype).bits // 8


def enabled() -> bool:
    """MODE, or TILESPARSE_STORED_DS where set, is on."""
    return switch("TILESPARSE_STORED_DS", MODE.strip().lower() in ON)


def budget_bytes(activation_bytes: int, device: torch.device | None = None) -> int:
    """The workspace's budget: MAX_WORKSPACE_BYTES, ACTIVATION_FACTOR times one [B, H, S, D]
    activation (so the backward's memory stays O(S * D)), and on CUDA FREE_FRACTION of the
    device's free memory, whichever is least."""
    budget = int(min(MAX_WORKSPACE_BYTES, ACTIVATION_FACTOR * activation_bytes))
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(budget, int(FREE_FRACTION * free))
    return budget


@dataclass(frozen=True)
class Chunk:
    """One launch pair of the stored-dS backward: the dK/dV kernel over the flat (batch,
    kv head) range [kv_first, kv_end), then the dQ kernel over the (batch, head) range
    [q_first, q_end), whose workspace rows start at ``row_first``."""

    kv_first: int
    kv_end: int
    q_first: int
    q_end: int
    row_first: int


def plan(batch: int, heads: int, kv_heads: int, layout_heads: int, nnz: int, block_size: int,
         dtype: torch.dtype, activation_bytes: int, device: torch.device | None = None
         ) -> tuple[list[Chunk], int] | None:
    """(chunks, workspace rows) for a backward with stored dS, or None (recompute dQ): off,
    nothing stored, or not even one unit fits :func:`budget_bytes`. A unit is one kv head's
    query heads where the layout is shared (their rows are their own), else one batch
    element (with a layout per head its heads share one row: their slots differ)."""
    row_bytes = nnz * block_size * block_size * (torch.finfo(dtype).bits // 8)
    if not enabled() or row_bytes == 0:
        return None
    group = heads // kv_heads
    if layout_heads == 1:  # a kv head's query heads: rows bh = (batch * kv heads + kv head) * group + g
        unit_rows, units, unit_kv = group, batch * kv_heads, 1
    else:  # a batch element: rows batch * heads_per_layout + h // layout_heads
        unit_rows, units, unit_kv = heads // layout_heads, batch, kv_heads
    per_chunk = min(units, budget_bytes(activation_bytes, device) // (unit_rows * row_bytes))
    if per_chunk < 1:
        return None
    chunks = [Chunk(u * unit_kv, min(units, u + per_chunk) * unit_kv, u * unit_kv * group,
                    min(units, u + per_chunk) * unit_kv * group, u * unit_rows)
              for u in range(0, units, per_chunk)]
    return chunks, per_chunk * unit_rows


_SLOTS = "_tilesparse_attention_row_entry_slots"


def row_entry_slots(meta: torch.Tensor, layout_heads: int, num_blocks: int) -> torch.Tensor:
    """int32 [nnz]: for each CSR entry (layout head l, query block m, key block n) of the
    packed attention tables, its CSC position, where the dK/dV kernel stored that pair's
    dS. Built on meta's device and remembered on ``meta``: once, on a side stream outside
    CUDA graphs' private pools that the host waits for; while a CUDA graph is being
    captured, in place and not remembered."""

    def build():
        row_ptr, _, row_cols, _ = attention_table_views(meta, layout_heads, num_blocks)
        nnz = row_cols.numel()
        lanes = torch.arange(layout_heads * num_blocks, device=meta.device)
        lm = torch.repeat_interleave(lanes, (row_ptr[1:] - row_ptr[:-1]).long(), output_size=nnz)
        layout_head, m = lm // num_blocks, lm % num_blocks
        csc_key = (layout_head * num_blocks + row_cols.long()) * num_blocks + m  # CSC order: (l, n, m)
        order = torch.argsort(csc_key, stable=True)
        slots = torch.empty(nnz, dtype=torch.int32, device=meta.device)
        slots[order] = torch.arange(nnz, dtype=torch.int32, device=meta.device)
        return slots

    return cached_table(meta, _SLOTS, (layout_heads, num_blocks), build)


@triton.jit
def _bwd_dq_from_ds_kernel(
    ds_ptr, k_ptr, dq_ptr, row_ptr_ptr, row_cols_ptr, slots_ptr,
    S, H, GROUP, NB, L_HEADS, NNZ, BH_OFFSET, DS_ROW_OFFSET, scale, skb, skh, sks,
    BS: tl.constexpr, D: tl.constexpr, D_TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """dQ of one query tile: scale * sum over its block row (table order) of the stored
    dS pieces times K. dq is contiguous [B, H, S, D]; ds as the dK/dV kernels' STORE_DS
    wrote it, keys-major [rows, NNZ, BS keys, BS queries] (zeros wherever the masks removed
    a score)."""
    N_STEPS: tl.constexpr = BS // BLOCK_N
    bh = tl.program_id(1) + BH_OFFSET  # the launch may cover a chunk of the (batch, head) pairs
    qblk, bz, h, hkv, lh, offs_m = _query_tile(bh, H, GROUP, L_HEADS, BS, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    d_ok = offs_d < D
    m_ok = offs_m < S
    m_in = offs_m - qblk * BS  # rows within the block
    HPL = H // L_HEADS
    ds_row = ds_ptr + (bz * HPL + h // L_HEADS - DS_ROW_OFFSET) * NNZ * (BS * BS)
    k_base = k_ptr + bz * skb + hkv.to(tl.int64) * skh
    dq = tl.zeros((BLOCK_M, D_TILE), dtype=tl.float32)
    start = tl.load(row_ptr_ptr + lh * NB + qblk)
    end = tl.load(row_ptr_ptr + lh * NB + qblk + 1)
    for t in range(start * N_STEPS, end * N_STEPS):
        e = t // N_STEPS
        kblk = tl.load(row_cols_ptr + e).to(tl.int64)
        slot = tl.load(slots_ptr + e).to(tl.int64)
        n_in = (t % N_STEPS) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_n = kblk * BS + n_in
        dsT = tl.load(ds_row + slot * (BS * BS) + n_in[:, None] * BS + m_in[None, :])  # stored keys-major
        k = tl.load(k_base + offs_n[:, None] * sks + offs_d[None, :], mask=(offs_n < S)[:, None] & d_ok[None, :],
                    other=0.0)
        dq += tl.dot(tl.trans(dsT), k, input_precision=INPUT_PRECISION)
    tl.store(dq_ptr + bh.to(tl.int64) * S * D + offs_m[:, None] * D + offs_d[None, :],
             (dq * scale).to(dq_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
