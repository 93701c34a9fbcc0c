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

The orders modelled (``--orders``):
- ``key`` (shipped): programs launch key block descending within each (batch, kv head); a
  query tile's adds go key block descending (each waits only on programs launched before
  it: no deadlock with in-order dispatch); each program walks its query tiles by its rank
  in them (the tile where it comes first, first).
- ``key-ready``: the same adds, but each program walks next the tile whose previous
  contributor has already added (else the lowest rank): the best any walk table can do
  under the key order (the walk is recorded as the model runs).
- ``slots``: the adds of each (batch, kv head) ordered by a greedy edge colouring of its
  program x query-tile graph (a slot per share, distinct within a program and within a
  row; programs coloured in key-block order); programs walk in slot order and rows add in slot
  order. Waits can point at programs launched later, so it is deadlock-free only while all
  of a head's programs are resident at once (at most one wave per head): a model of what a
  layout-free order could reach, not a shippable one.

Costs in µs: ``--tile`` per query tile of 64 rows (compute, ~3.2 on the H200 from the
atomic kernel's 1.67 ms on local 1024), ``--overhead`` per program, ``--hop`` from one
add's issue to the next contributor seeing its signal (reduce completion + release /
acquire).

    python scripts/probes/ordered_dq_model.py [--patterns local1024 bigbird ...] [--hop 2.0] [--orders key slots]

Twenty-eighth session (hop 2 µs, S 8192): random 10 % 1.93x the unordered makespan with
``key``, 1.83x ``key-ready``, 1.27x ``slots`` (1.47x colouring the longest columns first);
BigBird 1.61 / 1.60 / 2.46x; local 1024,
fixed, strided and causal 1.00-1.01x with each. The deterministic two-kernel backward runs
random 10 % within 2 % of the unordered kernel on the H200, so no order gains there.
"""

from __future__ import annotations

import argparse
import heapq
from collections import defaultdict

from tilesparse.bench.attention import build_layout, suite_patterns

ORDERS = ("key", "key-ready", "slots")


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


def _rows_of(cols: dict) -> dict:
    """{(bh, query block): [key blocks with a share in it]}."""
    rows = defaultdict(list)
    for (bh, c), rs in cols.items():
        for r in rs:
            rows[(bh, r)].append(c)
    return rows


def key_ranks(cols: dict) -> dict:
    """{(bh, row, key block): rank}: each row's shares key block descending."""
    return {(bh, r, c): k for (bh, r), cs in _rows_of(cols).items() for k, c in enumerate(sorted(cs, reverse=True))}


def slot_colouring(cols: dict) -> dict:
    """{(bh, row, key block): slot}: the lowest slot free in both the share's program and its
    row, programs taken in key-block order (a proper edge colouring of each head's
    bipartite program x row graph, at most 2 * max degree - 1 slots)."""
    slot, used_program, used_row = {}, defaultdict(set), defaultdict(set)
    for key in sorted(cols):
        bh, c = key
        for r in cols[key]:
            s = 0
            while s in used_program[key] or s in used_row[(bh, r)]:
                s += 1
            slot[(bh, r, c)] = s
            used_program[key].add(s)
            used_row[(bh, r)].add(s)
    return slot


def slot_tables(cols: dict, slot: dict):
    """(ranks, walks) of the slot order: rows add by slot, programs walk by slot."""
    ranks = {(bh, r, c): k for (bh, r), cs in _rows_of(cols).items()
             for k, c in enumerate(sorted(cs, key=lambda c, bh=bh, r=r: (slot[(bh, r, c)], -c)))}
    walks = {key: sorted(rs, key=lambda r, key=key: slot[(key[0], r, key[1])]) for key, rs in cols.items()}
    return ranks, walks


def simulate(cols: dict, sms: int, tile: float, overhead: float, hop: float, m_steps: int,
             order: str | None) -> float:
    """Makespan (µs) of the programs on ``sms`` SMs, dispatched in launch order as SMs free;
    ``order`` one of ORDERS, or None for the unordered adds. inf where the programs
    deadlock (``slots`` with a head's programs not all resident)."""
    keys = sorted(cols, key=lambda k: (k[0], -k[1] if order else k[1]))
    ready_walk = order == "key-ready"
    if order == "slots":
        rank, walks = slot_tables(cols, slot_colouring(cols))
    else:
        rank = key_ranks(cols) if order else {}
        walks = {key: sorted(rs, key=lambda r, key=key: (rank.get((key[0], r, key[1]), 0), r))
                 for key, rs in cols.items()}
    remaining = {key: list(w) for key, w in walks.items()}
    current = {}
    signaled = {}  # (bh, r, m) -> (rank signalled so far + 1, time the last signal is visible)
    waiters = defaultdict(list)  # (bh, r, m, rank needed) -> programs parked
    events = []  # (time, seq, program key, next step)
    seq = nxt = finished = 0
    done = 0.0

    def start(t):
        nonlocal nxt, seq
        if nxt < len(keys):
            heapq.heappush(events, (t + overhead, seq, keys[nxt], 0))
            seq += 1
            nxt += 1

    for _ in range(min(sms, len(keys))):
        start(0.0)
    while events:
        t, _, key, j = heapq.heappop(events)
        bh, c = key
        if j == len(walks[key]) * m_steps:
            done = max(done, t)
            finished += 1
            start(t)
            continue
        m = j % m_steps
        if m == 0:  # the next query tile of the walk
            left = remaining[key]
            if ready_walk:
                added = [r for r in left if all(signaled.get((bh, r, mm), (0, 0.0))[0] >= rank[(bh, r, c)]
                                                for mm in range(m_steps))]
                r = min(added or left, key=lambda r: (rank[(bh, r, c)], r))
            else:
                r = left[0]
            left.remove(r)
            current[key] = r
        r = current[key]
        t_ready = t + tile  # the tile computed, its add due
        if order:
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
    return done if finished == len(keys) else float("inf")


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
    parser.add_argument("--orders", nargs="+", choices=ORDERS, default=["key"])
    args = parser.parse_args()
    for name in args.patterns:
        spec = specs[name]
        layout = build_layout(spec, S, block, H)
        cols = programs_of(layout, B, H, bool(spec.get("causal", False)))
        base = simulate(cols, args.sms, args.tile, args.overhead, 0.0, block // 64, order=None)
        row = [f"{name:10} unordered {base / 1e3:.3f} ms"]
        for order in args.orders:
            for hop in args.hop:
                ordered = simulate(cols, args.sms, args.tile, args.overhead, hop, block // 64, order=order)
                row.append(f"{order} hop {hop:g} µs: {ordered / 1e3:.3f} ms ({ordered / base:.2f}x)")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
