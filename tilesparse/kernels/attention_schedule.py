"""Which query tiles each program of the persistent attention forward takes
(:mod:`tilesparse.kernels.attention_ws_persistent`), balanced by the tiles' lengths.

Why: with a static round-robin (program p takes tiles p, p + P, ...), programs whose
tiles have long rows finish late: the BigBird, random and Sparse-Transformer "fixed"
patterns, where row lengths differ by head and block, left the busiest program 20-35 %
above the mean on the attention suite (B 4, H 16, S 8192, blocks of 128, 132 SMs), and
the persistent forward lost to the Triton one (whose grid the hardware schedules as
programs finish). Here the host simulates that scheduling once per layout: tiles in
order (head by head, so the tiles running at once share K and V in L2), each to the
program that would be free first; rows much longer than the mean (BigBird's global
rows) go first, and the last two rounds longest first, so that no long tile starts last.
Modelled busiest program: 0.3-1.5 % above the mean on those patterns. Where the rows are
near-equal (local windows, strided), the round-robin is kept: measured 2 % faster there.
"""

from __future__ import annotations

import heapq

import torch

from ..attention.layout import attention_table_views
from ._device import cached_table

__all__ = ["persistent_schedule", "tile_costs", "tile_order", "balanced_order", "round_robin_imbalance",
           "pack_lists", "schedule_tensor", "MAX_SCHEDULED_TILES", "ROUND_ROBIN_SLACK"]

_SCHEDULES = "_persistent_schedules"
# above this many tiles the host's one-time simulation (~0.5 µs a tile) is skipped: round-robin
MAX_SCHEDULED_TILES = 1 << 17
_LONG = 4.0  # a tile longer than this many times the mean goes first
_TAIL_ROUNDS = 2  # the last rounds of tiles go longest first
# the schedule is used where the round-robin's modelled busiest program is this far above
# the mean: on local 1024 (1.05) and strided (1.05) the round-robin measured 2 % faster
# (its tiles in lockstep keep K and V in L2), on causal (1.08) 4 % slower, on fixed,
# BigBird and random 10 % (1.2-1.35) 9-12 % slower
ROUND_ROBIN_SLACK = 1.06
TILE_FIXED_COST = 1.0  # a tile's own work beside its row's key blocks, in key blocks


def tile_costs(meta: torch.Tensor, layout_heads: int, num_blocks: int, batch: int, heads: int,
               m_split: int) -> list[float]:
    """Each tile's modelled cost, in the persistent kernel's tile order (batch * head major,
    then query block, then its ``m_split`` row tiles): its row's key blocks plus one (the
    per-tile work, TILE_FIXED_COST: Q's load, O's store). Reads the row pointers to the host."""
    row_ptr = attention_table_views(meta, layout_heads, num_blocks)[0].cpu().long()
    lengths = (row_ptr[1:] - row_ptr[:-1]).view(layout_heads, num_blocks)
    per_head = lengths[torch.arange(batch * heads) % heads % layout_heads]  # [B * H, nb]
    return (per_head.repeat_interleave(m_split, dim=1).flatten().double() + TILE_FIXED_COST).tolist()


def round_robin_imbalance(costs: list[float], programs: int) -> float:
    """The round-robin's busiest program over the mean (modelled by ``costs``)."""
    mean = sum(costs) / programs
    return max(sum(costs[p::programs]) for p in range(programs)) / mean if mean > 0 else 1.0


def balanced_order(costs: list[float], programs: int, long_factor: float = _LONG,
                   tail_rounds: int = _TAIL_ROUNDS, longest_first: bool = True) -> list[int]:
    """The tiles (indices into ``costs``) in the order to hand them out: those longer than
    ``long_factor`` times the mean first (longest first; ``longest_first=False``: in their
    own order, so that long tiles starting together stay neighbours), then the rest in
    order, the last ``tail_rounds`` rounds of ``programs`` longest first; the order
    otherwise kept, so that tiles running at once still share operands in L2."""
    n = len(costs)
    mean = sum(costs) / max(1, n)
    long = [t for t in range(n) if costs[t] > long_factor * mean]
    if longest_first:
        long.sort(key=lambda t: -costs[t])
    rest = [t for t in range(n) if costs[t] <= long_factor * mean]
    cut = max(0, len(rest) - tail_rounds * programs)
    return long + rest[:cut] + sorted(rest[cut:], key=lambda t: -costs[t])


def tile_order(costs: list[float], programs: int, **order_options) -> list[list[int]]:
    """Each program's tiles (indices into ``costs``, in the order it runs them): the
    tiles of :func:`balanced_order` (with ``order_options``: its long_factor, tail_rounds,
    longest_first) handed out to whichever program is free first."""
    order = balanced_order(costs, programs, **order_options)
    busy = [(0.0, p) for p in range(programs)]  # (finish time, program); ties: the lower program
    lists: list[list[int]] = [[] for _ in range(programs)]
    for t in order:
        load, p = heapq.heappop(busy)
        lists[p].append(t)
        heapq.heappush(busy, (load + costs[t], p))
    return lists


def persistent_schedule(meta: torch.Tensor, layout_heads: int, num_blocks: int, batch: int, heads: int,
                        m_split: int, programs: int) -> torch.Tensor | None:
    """int32 [programs + 1 + n_tiles] on meta's device: program p runs the tiles
    ``list[seg[p]:seg[p + 1]]`` with ``seg`` the first programs + 1 entries and ``list``
    the rest; tile numbers as the persistent kernel orders them (batch * head major, then
    query block, then its ``m_split`` row tiles), balanced by :func:`tile_costs`.
    Remembered on ``meta`` per key (one per
    batch size and grid met: each up to 4 * (programs + 1 + n_tiles) bytes on the device,
    built once with one device-to-host copy of the row pointers). None (the
    kernel's round-robin) where the round-robin is within ROUND_ROBIN_SLACK of the mean,
    above MAX_SCHEDULED_TILES tiles, or while a CUDA graph is being captured before the
    schedule was built."""
    n_tiles = batch * heads * num_blocks * m_split
    if n_tiles > MAX_SCHEDULED_TILES:
        return None
    key = (layout_heads, num_blocks, batch, heads, m_split, programs)
    sched = cached_table(meta, _SCHEDULES, key, lambda: _build(meta, *key), build_while_capturing=False)
    return None if sched is None or sched.numel() == 0 else sched


def _build(meta, layout_heads, num_blocks, batch, heads, m_split, programs) -> torch.Tensor:
    """The schedule's int32 tensor on meta's device; empty where the round-robin is kept."""
    return schedule_tensor(tile_costs(meta, layout_heads, num_blocks, batch, heads, m_split), programs, meta.device)


def schedule_tensor(costs: list[float], programs: int, device, **order_options) -> torch.Tensor:
    """The persistent kernels' schedule as :func:`pack_lists` packs it: :func:`tile_order`'s
    lists (``order_options`` passed on), or an empty tensor (the round-robin) where the
    round-robin's modelled busiest program is within ROUND_ROBIN_SLACK of the mean."""
    if round_robin_imbalance(costs, programs) <= ROUND_ROBIN_SLACK:
        return torch.empty(0, dtype=torch.int32, device=device)
    return pack_lists(tile_order(costs, programs, **order_options), device)


def pack_lists(lists: list[list[int]], device) -> torch.Tensor:
    """Each program's items as one int32 tensor on ``device``: programs + 1 offsets, then the
    items, program by program (what a persistent kernel's share walk reads)."""
    seg = [0]
    for items in lists:
        seg.append(seg[-1] + len(items))
    return torch.tensor(seg + [t for items in lists for t in items], dtype=torch.int32).to(device)

