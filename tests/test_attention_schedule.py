"""The persistent attention forward's tile schedule (tilesparse.kernels.attention_schedule):
every tile exactly once, segments that add up, long rows first, and a busiest program
close to the mean where a round-robin is not. CPU only (the kernel's use of it is in
tests/test_attention_ws_gpu.py)."""

import pytest
import torch

from tilesparse.attention import layouts
from tilesparse.kernels import attention_schedule


def _costs(layout, batch, heads, m_split, causal=False):
    return attention_schedule.tile_costs(layout.meta_on("cpu", causal), layout.layout_heads, layout.num_blocks, batch,
                                         heads, m_split)


def _unpack(sched, programs):
    flat = sched.tolist()
    seg, tiles = flat[:programs + 1], flat[programs + 1:]
    return [tiles[seg[p]:seg[p + 1]] for p in range(programs)], seg


@pytest.mark.parametrize("programs", [1, 5, 132])
@pytest.mark.parametrize("m_split", [1, 2])
def test_schedule_covers_every_tile_once_and_its_segments_add_up(programs, m_split, monkeypatch):
    monkeypatch.setattr(attention_schedule, "ROUND_ROBIN_SLACK", 0.0)  # always a schedule
    S, b, B, H = 2048, 128, 2, 4
    seed = int(torch.randint(0, 1 << 30, ()))
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed,
                             num_heads=H)
    meta = layout.meta_on("cpu")
    sched = attention_schedule.persistent_schedule(meta, layout.layout_heads, layout.num_blocks, B, H, m_split,
                                                   programs)
    assert sched.dtype == torch.int32 and sched.numel() == programs + 1 + B * H * layout.num_blocks * m_split
    lists, seg = _unpack(sched, programs)
    assert seg[0] == 0 and seg == sorted(seg) and seg[-1] == B * H * layout.num_blocks * m_split
    assert sorted(t for tiles in lists for t in tiles) == list(range(seg[-1]))
    # remembered on meta, per key
    assert attention_schedule.persistent_schedule(meta, layout.layout_heads, layout.num_blocks, B, H, m_split,
                                                  programs) is sched


def test_long_rows_go_first_and_the_busiest_program_is_near_the_mean():
    # BigBird per head: global rows walk every key block; random 10 %: rows differ by head
    S, b, B, H, P = 8192, 128, 4, 16, 132
    for layout, n_long in ((layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=3, seed=1,
                                            num_heads=H), B * H),  # a global row per (batch, head)
                           (layouts.random(S, b, density=0.1, seed=2, num_heads=H), 0)):
        costs = _costs(layout, B, H, 1)
        lists = attention_schedule.tile_order(costs, P)
        loads = [sum(costs[t] for t in tiles) for tiles in lists]
        robin = [sum(costs[p::P]) for p in range(P)]
        mean = sum(costs) / P
        assert max(loads) <= 1.05 * mean < max(robin)
        long = {t for t, c in enumerate(costs) if c > 4 * sum(costs) / len(costs)}
        # each long tile (BigBird's global rows) starts its program's walk
        assert all(tiles.index(t) == 0 for tiles in lists for t in long.intersection(tiles))
        assert len(long) == n_long


def test_schedule_is_skipped_above_its_tile_limit(monkeypatch):
    # a layout that would be scheduled (any imbalance counts): above the limit, nothing is built
    layout = layouts.random(1024, 64, density=0.3, seed=4, num_heads=2)
    monkeypatch.setattr(attention_schedule, "ROUND_ROBIN_SLACK", 0.0)
    meta = layout.meta_on("cpu")
    assert attention_schedule.persistent_schedule(meta, 2, layout.num_blocks, 1, 2, 1, 4) is not None
    monkeypatch.setattr(attention_schedule, "MAX_SCHEDULED_TILES", 10)
    other = layout.meta_on("cpu", causal=True)
    assert attention_schedule.persistent_schedule(other, 2, layout.num_blocks, 1, 2, 1, 4) is None
    assert "_persistent_schedules" not in other.__dict__


def test_near_equal_rows_keep_the_round_robin():
    # a local window shared by all heads: the round-robin is within ROUND_ROBIN_SLACK of the
    # mean (measured faster there); the decision is remembered like a schedule
    S, b, B, H, P = 8192, 128, 4, 16, 132
    layout = layouts.local(S, b, window=1024)
    costs = _costs(layout, B, H, 1)
    assert attention_schedule.round_robin_imbalance(costs, P) <= attention_schedule.ROUND_ROBIN_SLACK
    meta = layout.meta_on("cpu")
    assert attention_schedule.persistent_schedule(meta, 1, layout.num_blocks, B, H, 1, P) is None
    assert meta.__dict__["_persistent_schedules"][(1, layout.num_blocks, B, H, 1, P)].numel() == 0
    random10 = layouts.random(S, b, density=0.1, seed=3, num_heads=H)
    assert attention_schedule.round_robin_imbalance(_costs(random10, B, H, 1), P) > 1.1
    assert attention_schedule.persistent_schedule(random10.meta_on("cpu"), H, random10.num_blocks, B, H, 1,
                                                  P) is not None
