"""The order in which the warp-specialized backward kernels' programs launch
(``DkdvWsConfig.balanced``, ``DqWsConfig.balanced``), balanced by the programs' lengths.

Why: the dK/dV kernel's grid is (key block, batch * kv head) and the dQ kernel's (query
tile, batch * head); the hardware starts programs in that order as SMs free up. Where
columns (rows) differ in length, the last (batch, head)'s long ones start near the end and
run alone: on the attention suite (B 4, H 16, S 8192, blocks of 128, 132 SMs) a model of
that greedy start put the busiest SM 15-20 % above the mean on BigBird (its global
blocks' columns and rows are the whole sequence) and the Sparse Transformer's "fixed"
pattern (dK/dV), 4-5 % on random 10 %, 3-4 % on causal. Here the host models the start
once per layout and, where that gains, gives the kernel a table of program numbers in
:func:`attention_schedule.balanced_order`'s order: long programs first, the last rounds
longest first, the rest in grid order (programs running at once keep sharing Q / dO or
K / V in L2). Modelled busiest SM: within 1-2 % of the mean on those patterns.

Measured (H200, twenty-third session): the deterministic backward 8 % faster on BigBird,
2-4 % on fixed, random 10 % and causal, bitwise the same. The dK/dV kernel adding dQ by
TMA reductions (``deterministic=False``) gained on BigBird but lost 5 % on fixed, whose
many long columns, longest first, start together from different heads (a guess: their Q /
dO reads and dQ adds then miss L2). For that kernel the long programs start first in grid
order instead (``head_major_long``), each head's long columns together. Twenty-fourth
session, timed in interleaved rounds: BigBird 7 % faster, fixed 2 %, random 10 % and causal
unchanged (D 128); at D 64 BigBird 12 %, fixed 6 %, random 10 % 2 %, and the deterministic
kernels 10 / 3 / 0.4 %. Used by default at D 128 and 64.
"""

from __future__ import annotations

import heapq

import torch

from ..attention.layout import attention_table_views
from ._device import cached_table
from .attention_schedule import MAX_SCHEDULED_TILES, TILE_FIXED_COST, balanced_order, schedule_tensor, tile_costs

__all__ = ["backward_costs", "modelled_makespan", "launch_order", "persistent_items", "MIN_MODELLED_GAIN",
           "PROGRAM_FIXED_COST"]

_ORDERS = "_backward_launch_orders"
# a program's own cost (descriptors, K / V or Q / dO loads, the epilogue) in block pairs: as
# the forward's tiles (dQ's programs cost as tile_costs says)
PROGRAM_FIXED_COST = TILE_FIXED_COST
# the table is used where the modelled makespan drops by at least this factor
MIN_MODELLED_GAIN = 1.02
_LONG_FACTOR = 2.0  # programs longer than this many times the mean start first
_TAIL_ROUNDS = 4  # the last rounds start longest first


def backward_costs(meta: torch.Tensor, layout_heads: int, num_blocks: int, kind: str, batch: int, heads: int,
                   kv_heads: int, m_split: int = 1) -> list[float]:
    """Each program's modelled cost in grid order (item = second coordinate * first extent
    + first coordinate): ``kind`` "dkdv", program (key block, batch * kv head), its key
    block's column over the kv head's query heads; "dq", program (query tile, batch *
    head), its query block's row (``m_split`` tiles per block): the persistent forward's
    :func:`attention_schedule.tile_costs`, whose tile order is this grid's. Reads the table
    pointers to the host."""
    if kind == "dq":
        return tile_costs(meta, layout_heads, num_blocks, batch, heads, m_split)
    col_ptr = attention_table_views(meta, layout_heads, num_blocks)[1].cpu().long()
    lengths = (col_ptr[1:] - col_ptr[:-1]).view(layout_heads, num_blocks).double()
    group = heads // kv_heads
    q_heads = torch.arange(batch * kv_heads)[:, None] % kv_heads * group + torch.arange(group)[None, :]
    per_item = lengths[q_heads % layout_heads].sum(dim=1)  # [B * Hkv, nb]
    return (per_item.flatten() + PROGRAM_FIXED_COST).tolist()


def modelled_makespan(costs: list[float], order, programs: int) -> float:
    """The busiest SM's modelled time when programs start in ``order`` (indices into
    ``costs``), each on whichever of ``programs`` SMs frees first."""
    busy = [0.0] * programs
    for t in order:
        heapq.heappush(busy, heapq.heappop(busy) + costs[t])
    return max(busy)


def launch_order(meta: torch.Tensor, layout_heads: int, num_blocks: int, kind: str, batch: int, heads: int,
                 kv_heads: int, m_split: int, programs: int, head_major_long: bool = False) -> torch.Tensor | None:
    """int32 [n programs] on meta's device: the grid-order numbers of the programs in the
    order to launch them (see :func:`backward_costs`; ``head_major_long``: the long ones in
    grid order rather than longest first), or None (the grid's own order) where
    the model gains less than MIN_MODELLED_GAIN, above MAX_SCHEDULED_TILES programs, or
    while a CUDA graph is being captured before the table was built. Remembered on
    ``meta`` per key: built once with one device-to-host copy of the table pointers."""
    n = batch * (kv_heads if kind == "dkdv" else heads) * num_blocks * m_split
    if n > MAX_SCHEDULED_TILES:
        return None
    key = (kind, layout_heads, num_blocks, batch, heads, kv_heads, m_split, programs, bool(head_major_long))
    order = cached_table(meta, _ORDERS, key, lambda: _build(meta, *key), build_while_capturing=False)
    return None if order is None or order.numel() == 0 else order


def _build(meta, kind, layout_heads, num_blocks, batch, heads, kv_heads, m_split, programs,
           head_major_long) -> torch.Tensor:
    """The order's int32 tensor on meta's device; empty where the grid's order is kept."""
    costs = backward_costs(meta, layout_heads, num_blocks, kind, batch, heads, kv_heads, m_split)
    order = balanced_order(costs, programs, _LONG_FACTOR, _TAIL_ROUNDS, longest_first=not head_major_long)
    natural = modelled_makespan(costs, range(len(costs)), programs)
    if natural < MIN_MODELLED_GAIN * modelled_makespan(costs, order, programs):
        return torch.empty(0, dtype=torch.int32, device=meta.device)
    return torch.tensor(order, dtype=torch.int32).to(meta.device)


def persistent_items(meta: torch.Tensor, layout_heads: int, num_blocks: int, batch: int, heads: int, kv_heads: int,
                     programs: int, head_major_long: bool = False) -> torch.Tensor | None:
    """The persistent dK/dV kernel's schedule (``DkdvWsConfig.persistent`` with ``balanced``):
    int32 [programs + 1 + n items] on meta's device, program p taking items seg[p] ..
    seg[p + 1] of the list after the offsets (:func:`attention_schedule.schedule_tensor`), items
    numbered as the kernel's round-robin numbers them (batch * kv head major, then key
    block). Items are handed out in the order :func:`launch_order` would launch them (its
    long factor and tail rounds; ``head_major_long`` as there) to whichever program the
    model frees first (:func:`attention_schedule.tile_order`), so that the persistent
    kernel's overlap of one item's epilogue with the next one's loads keeps the grid's
    balance (round-robin shares lost to it wherever columns differ in length: twenty-seventh
    session). None (the round-robin) where the round-robin's modelled busiest program is
    within ROUND_ROBIN_SLACK of the mean (as the persistent forward: near-equal columns keep
    running in lockstep), above MAX_SCHEDULED_TILES items, or while a CUDA graph is being
    captured before the schedule was built. Remembered on ``meta`` per key."""
    n = batch * kv_heads * num_blocks
    if n > MAX_SCHEDULED_TILES:
        return None
    key = ("persistent_dkdv", layout_heads, num_blocks, batch, heads, kv_heads, programs, bool(head_major_long))

    def build():
        costs = backward_costs(meta, layout_heads, num_blocks, "dkdv", batch, heads, kv_heads)
        return schedule_tensor(costs, programs, meta.device, long_factor=_LONG_FACTOR, tail_rounds=_TAIL_ROUNDS,
                               longest_first=not head_major_long)

    sched = cached_table(meta, _ORDERS, key, build, build_while_capturing=False)
    return None if sched is None or sched.numel() == 0 else sched
