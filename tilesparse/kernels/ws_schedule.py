"""A balanced static tile schedule for the persistent warp-specialized dds kernel
(:mod:`tilesparse.kernels.bsmm_ws`, ``WsConfig.balanced``).

Why: the persistent kernel gives program p the tiles p, p + P, p + 2P, ... of the grouped
tile order, and a tile's work is its output block-column's block count, which varies
from column to column (a random layout at density 0.25 with 32 blocks a column: 8 +- 2.4).
The kernel ends when its busiest program does. Simulated for 8192x4096², b 128 (132
programs, 2048 tiles), the busiest program's work is 6 / 14 / 12 / 9 % above the mean at
density 0.5 / 0.25 / 0.1 / 0.05; on 16384x8192² 4-7 %.

Here each tile, taken in grouped order, goes to the program with the least work so far
(ties to the lowest program): what a dynamic, atomic-counter scheduler does when tiles
take the time their block counts predict, without a counter to reset or a tile index to
pass from the producer warp to the consumers. Tiles that run at the same time stay close
in the grouped order, so its L2 reuse is kept. The same simulation puts the busiest
program 3 / 3 / 6 / 4 % above the mean (main shape) and within 1 % (large shape).

The block counts come from the layout's tables (:func:`tilesparse.layout.block_counts`,
learned with them from the mask). Where they are unknown (tables built without a host
sync: ``BlockLayout.from_mask_with_nnz``, so RigL's rewired layouts), while a CUDA graph
is being captured and the schedule is new, or past MAX_TILES, the launcher keeps the
round-robin order. Building a schedule costs Python time once per (layout, M, config):
it suits fixed shapes. Which program computes a tile does not change its arithmetic:
outputs are bitwise equal either way.
"""

from __future__ import annotations

import heapq
import threading

import torch

from ..layout import block_counts
from ._device import build_outside_graph_pools

__all__ = ["grouped_tile_columns", "tile_work", "balanced_schedule", "makespan", "round_robin_makespan",
           "schedule_tensor"]

# A tile's fixed cost (accumulator set-up, epilogue, store) in units of one K step.
EPILOGUE_STEPS = 2
# Schedules are computed in Python, once per (layout, M, config): ~17 ms at 16k tiles on a
# CPU core. Above this the kernel keeps round-robin.
MAX_TILES = 1 << 15
_CACHE = "_tilesparse_ws_schedules"
_CACHE_ENTRIES = 64
_LOCK = threading.Lock()


def grouped_tile_columns(num_pid_m: int, n_out: int, group_m: int) -> list[int]:
    """The output block-column of each tile of the grouped order (as ``_tile_coords``)."""
    cols = []
    per_group = group_m * n_out
    for tile in range(num_pid_m * n_out):
        first_m = (tile // per_group) * group_m
        group_rows = min(num_pid_m - first_m, group_m)
        cols.append((tile % per_group) // group_rows)
    return cols


def tile_work(counts, num_pid_m: int, group_m: int, k_steps: int, epilogue_steps: int = EPILOGUE_STEPS) -> list[int]:
    """Each tile's work in K steps, in grouped order: its column's blocks times the K
    steps per block, plus the fixed cost of a tile."""
    return [counts[col] * k_steps + epilogue_steps for col in grouped_tile_columns(num_pid_m, len(counts), group_m)]


def balanced_schedule(work: list[int], programs: int) -> tuple[list[int], list[int]]:
    """(order, offsets): tile ``t`` (in the order of ``work``) goes to the least-loaded
    program so far; ``order[offsets[p]:offsets[p + 1]]`` are program p's tiles, ascending."""
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    heap = [(0, p) for p in range(programs)]
    owner = []
    for w in work:
        load, p = heapq.heappop(heap)
        owner.append(p)
        heapq.heappush(heap, (load + w, p))
    per_program: list[list[int]] = [[] for _ in range(programs)]
    for tile, p in enumerate(owner):
        per_program[p].append(tile)
    offsets, order = [0], []
    for tiles in per_program:
        order.extend(tiles)
        offsets.append(len(order))
    return order, offsets


def makespan(work: list[int], order: list[int], offsets: list[int]) -> int:
    """The busiest program's work under a schedule."""
    return max((sum(work[t] for t in order[offsets[p]:offsets[p + 1]]) for p in range(len(offsets) - 1)), default=0)


def round_robin_makespan(work: list[int], programs: int) -> int:
    """The busiest program's work when program p takes tiles p, p + P, ... (the default)."""
    return max((sum(work[p::programs]) for p in range(programs)), default=0)


def schedule_tensor(meta: torch.Tensor, trans: bool, n_out: int, num_pid_m: int, group_m: int, k_steps: int,
                    programs: int, device: torch.device) -> torch.Tensor | None:
    """The balanced schedule as one int32 tensor on ``device``: ``programs + 1`` offsets,
    then the tile order; remembered on ``meta`` per problem and never dropped while the
    layout lives (a CUDA graph that captured it holds only its address; at most
    _CACHE_ENTRIES problems per layout, of at most MAX_TILES tiles: 128 KB each). None
    (the kernel keeps its round-robin order) where the layout's block counts are unknown
    or do not match ``n_out``, the problem is too large or one too many, or a CUDA graph
    is being captured and the schedule is new. Meant for fixed shapes: each new M costs
    one schedule (Python, up to ~35 ms)."""
    counts = block_counts(meta)
    if counts is None:
        return None
    out_counts = counts[0] if trans else counts[1]  # fprop's output columns are the layout's rows
    if len(out_counts) != n_out or num_pid_m * n_out > MAX_TILES:
        return None
    key = (trans, num_pid_m, group_m, k_steps, programs, device)
    with _LOCK:
        cache = meta.__dict__.setdefault(_CACHE, {})
        sched = cache.get(key)
        if sched is not None or len(cache) >= _CACHE_ENTRIES:
            return sched
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    order, offsets = balanced_schedule(tile_work(out_counts, num_pid_m, group_m, k_steps), programs)
    sched = _upload(torch.tensor(offsets + order, dtype=torch.int32), device)
    with _LOCK:
        return cache.setdefault(key, sched)


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device``, copied outside any CUDA graph's private pool
    (:func:`tilesparse.kernels._device.build_outside_graph_pools`)."""
    if device.type != "cuda":
        return host.to(device)
    return build_outside_graph_pools(device, lambda: host.pin_memory().to(device, non_blocking=True))
