"""A model (CPU, no GPU) of a deterministic 5-product attention backward: the dK/dV kernel
adding dQ by TMA reductions, as ``deterministic=False`` does, but each query tile's adds
in a fixed order behind a semaphore (FlashAttention-3's deterministic mode), against the
same kernel without the order.

Why: the deterministic default computes 7 products per block pair (dK/dV, then dQ
recomputing S and dP); ``deterministic=False`` computes 5 and is 7-10 % faster, and only
it reaches 1.3x FlexAttention (issue 6). An ordered add keeps bits reproducible, but a
program that reaches its add before the tile's previous contributor waits, holding its
SM. Whether that costs more than the 2 products it saves depends on the layout's
dependency chains; this model estimates it before any kernel is written.

The order modelled: programs launch key block descending within each (batch, kv head);
a query tile's adds go key block descending (each waits only on programs launched
before it: no deadlock with in-order dispatch); each program walks its query tiles by
its rank in them (the tile where it comes first, first). Costs in µs: ``--tile`` per
query tile of 64 rows (compute, ~3.2 on the H200 from the atomic kernel's 1.67 ms on
local 1024), ``--overhead`` per program, ``--hop`` from one add's issue to the next
contributor seeing its signal (reduce completion + release / acquire).

    python scripts/probes/ordered_dq_model.py [--patterns local1024 bigbird ...] [--hop 2.0]
"""

from __future__ import annotations

import argparse
import heapq
from collections import defaultdict

from tilesparse.bench.attention import build_layout, suite_patterns


def programs_of(layout, batch: int, heads: int, causal: bool):
    """{(bh, key block): [query blocks of its column]} over every (batch, head)."""
    mask = layout.mask.bool()
    if causal:
        mask = mask & ~mask.new_ones(mask.shape[-1], mask.shape[-1]).triu(1).bool()
    cols = {}
    L = mask.shape[0]
    for bh in range(batch * heads):
        m = mask[(bh % heads) % L]
        for c in range(m.shape[1]):
            cols[(bh, c)] = m[:, c].nonzero().flatten().tolist()
    return cols


def simulate(cols: dict, sms: int, tile: float, overhead: float, hop: float, m_steps: int,
             ordered: bool) -> float:
    """Makespan (µs) of the programs on ``sms`` SMs, dispatched in launch order as SMs free."""
    keys = sorted(cols, key=lambda k: (k[0], -k[1] if ordered else k[1]))
    # rank of column c in row r of head bh: how many of the row's columns come before it
    rank = {}
    if ordered:
        rows = defaultdict(list)
        for (bh, c), rs in cols.items():
            for r in rs:
                rows[(bh, r)].append(c)
        for (bh, r), cs in rows.items():
            for k, c in enumerate(sorted(cs, reverse=True)):
                rank[(bh, r, c)] = k
    walks = {}
    for (bh, c), rs in cols.items():
        order = sorted(rs, key=lambda r: (rank.get((bh, r, c), 0), r))
        walks[(bh, c)] = [(r, m) for r in order for m in range(m_steps)]
    signaled = {}  # (bh, r, m) -> (rank signalled so far + 1, time the last signal is visible)
    waiters = defaultdict(list)  # (bh, r, m, rank needed) -> programs parked
    free = [(0.0, s) for s in range(sms)]
    heapq.heapify(free)
    events = []  # (time, seq, program key, next tile index)
    seq = 0
    nxt = 0
    done = 0.0

    def start(t):
        nonlocal nxt, seq
        if nxt < len(keys):
            heapq.heappush(events, (t + overhead, seq, keys[nxt], 0))
            seq += 1
            nxt += 1

    for _ in range(min(sms, len(keys))):
        t, _s = heapq.heappop(free)
        start(t)
    while events:
        t, _, key, j = heapq.heappop(events)
        walk = walks[key]
        if j == len(walk):
            done = max(done, t)
            start(t)
            continue
        bh, c = key
        r, m = walk[j]
        t_ready = t + tile  # the tile computed, its add due
        if ordered:
            k = rank[(bh, r, c)]
            count, seen = signaled.get((bh, r, m), (0, 0.0))
            if count < k:  # the previous contributor has not added yet: park until it does
                waiters[(bh, r, m, k)].append((t_ready, key, j))
                continue
            t_ready = max(t_ready, seen)
            _add(signaled, waiters, events, (bh, r, m), k, t_ready, hop, seq)
            seq += 1
        heapq.heappush(events, (t_ready, seq, key, j + 1))
        seq += 1
    return done


def _add(signaled, waiters, events, tile_key, k, t, hop, seq):
    """Contributor ``k``'s add to ``tile_key`` issued at ``t``: visible to rank k + 1 at t + hop;
    a program parked on it resumes then (its own add issued, chains on)."""
    signaled[tile_key] = (k + 1, t + hop)
    parked = waiters.pop((*tile_key, k + 1), [])
    for t_ready, key, j in parked:
        t2 = max(t_ready, t + hop)
        _add(signaled, waiters, events, tile_key, k + 1, t2, hop, seq)
        heapq.heappush(events, (t2, seq, key, j + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    B, H, S, D, block, specs = suite_patterns()
    parser.add_argument("--patterns", nargs="+", default=list(specs))
    parser.add_argument("--tile", type=float, default=3.2)
    parser.add_argument("--overhead", type=float, default=6.0)
    parser.add_argument("--hop", nargs="+", type=float, default=[1.0, 2.0, 4.0])
    parser.add_argument("--sms", type=int, default=132)
    args = parser.parse_args()
    for name in args.patterns:
        spec = specs[name]
        layout = build_layout(spec, S, block, H)
        cols = programs_of(layout, B, H, bool(spec.get("causal", False)))
        base = simulate(cols, args.sms, args.tile, args.overhead, 0.0, block // 64, ordered=False)
        row = [f"{name:10} unordered {base / 1e3:.3f} ms"]
        for hop in args.hop:
            ordered = simulate(cols, args.sms, args.tile, args.overhead, hop, block // 64, ordered=True)
            row.append(f"ordered hop {hop:g} µs: {ordered / 1e3:.3f} ms ({ordered / base:.2f}x)")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
