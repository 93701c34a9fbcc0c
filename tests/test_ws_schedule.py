"""The balanced tile schedule of the persistent warp-specialized dds
(tilesparse.kernels.ws_schedule): every tile exactly once, each program's tiles in
grouped order, within Graham's bound of the mean, less busy than round-robin on random
layouts, the block counts it weighs tiles by learned with the layout's tables, and the
cases where the kernel keeps round-robin."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilesparse import layouts
from tilesparse.kernels import ws_schedule as ws
from tilesparse.layout import BlockLayout, block_counts


def _grouped_columns_brute(num_pid_m, n_out, group_m):
    # the kernel's _tile_coords, written out per tile
    out = []
    for tile in range(num_pid_m * n_out):
        per = group_m * n_out
        first = (tile // per) * group_m
        rows = min(num_pid_m - first, group_m)
        out.append(((first + (tile % per) % rows), (tile % per) // rows))
    return out


@pytest.mark.parametrize("num_pid_m,n_out,group_m", [(64, 32, 8), (7, 5, 8), (13, 3, 4), (1, 9, 8)])
def test_grouped_columns_match_the_kernels_tile_order(num_pid_m, n_out, group_m):
    coords = _grouped_columns_brute(num_pid_m, n_out, group_m)
    assert ws.grouped_tile_columns(num_pid_m, n_out, group_m) == [n for _, n in coords]
    assert sorted(coords) == [(m, n) for m in range(num_pid_m) for n in range(n_out)]  # a permutation


@settings(max_examples=60, deadline=None)
@given(work=st.lists(st.integers(0, 50), min_size=0, max_size=300), programs=st.integers(1, 40))
def test_schedule_covers_every_tile_once_in_order_within_grahams_bound(work, programs):
    order, offsets = ws.balanced_schedule(work, programs)
    assert len(offsets) == programs + 1 and offsets[0] == 0 and offsets[-1] == len(work)
    assert sorted(order) == list(range(len(work)))
    for p in range(programs):
        mine = order[offsets[p]:offsets[p + 1]]
        assert mine == sorted(mine)  # grouped order within a program: L2 reuse as before
    # greedy list scheduling (Graham's bound): the busiest program is within one tile of
    # the mean. (It can lose to round-robin on adversarial lists: [1, 0, 1, 2] on two
    # programs is 3 against 2; the layout test below checks the cases it is for.)
    bound = sum(work) / programs + max(work, default=0) * (1 - 1 / programs)
    assert ws.makespan(work, order, offsets) <= bound + 1e-9


@pytest.mark.parametrize("density", [0.5, 0.25, 0.1, 0.05])
def test_schedule_balances_a_random_layouts_main_shape(density):
    # 8192x4096², b 128, 132 programs: the simulation in the module's docstring
    layout = layouts.random(4096, 4096, 128, density, seed=0)
    counts = block_counts(layout.meta)[0]
    work = ws.tile_work(counts, 64, 8, 2)
    order, offsets = ws.balanced_schedule(work, 132)
    mean = sum(work) / 132
    rr, bal = ws.round_robin_makespan(work, 132), ws.makespan(work, order, offsets)
    assert bal < rr and bal / mean < 1.07, (rr / mean, bal / mean)


def test_schedule_is_deterministic():
    rng = random.Random(3)
    work = [rng.randint(1, 30) for _ in range(500)]
    assert ws.balanced_schedule(work, 17) == ws.balanced_schedule(list(work), 17)
    with pytest.raises(ValueError, match="programs"):
        ws.balanced_schedule(work, 0)


def test_block_counts_are_learned_with_the_tables_and_travel_with_them():
    mask = torch.rand(9, 7) < 0.4
    layout = BlockLayout(mask, 16)
    rows, cols = block_counts(layout.meta)
    assert list(rows) == mask.sum(1).tolist() and list(cols) == mask.sum(0).tolist()
    assert block_counts(layout.transpose().meta) == (cols, rows)
    # tables built without a host sync do not know them (learning them would sync)
    quiet = BlockLayout.from_mask_with_nnz(mask, 16, int(mask.sum()))
    assert block_counts(quiet.meta) is None


def test_schedule_tensor_layout_and_cache_and_fallbacks():
    layout = layouts.random(1024, 512, 64, 0.5, seed=1)
    meta = layout.meta
    cpu = torch.device("cpu")
    n_out = layout.block_rows  # fprop: the layout's block-rows are the output's columns
    sched = ws.schedule_tensor(meta, True, n_out, 10, 8, 1, 7, cpu)
    assert sched.dtype == torch.int32 and sched.numel() == 8 + 10 * n_out
    offsets, order = sched[:8].tolist(), sched[8:].tolist()
    work = ws.tile_work(block_counts(meta)[0], 10, 8, 1)
    assert (order, offsets) == ws.balanced_schedule(work, 7)
    assert ws.schedule_tensor(meta, True, n_out, 10, 8, 1, 7, cpu) is sched  # remembered
    bprop = ws.schedule_tensor(meta, False, layout.block_cols, 10, 8, 1, 7, cpu)
    assert bprop.numel() == 8 + 10 * layout.block_cols
    quiet = BlockLayout.from_mask_with_nnz(layout.mask, 64, layout.nnz)
    assert ws.schedule_tensor(quiet.meta, True, n_out, 10, 8, 1, 7, cpu) is None  # counts unknown: round-robin
    assert ws.schedule_tensor(meta, True, n_out, ws.MAX_TILES, 8, 1, 7, cpu) is None  # too many tiles for Python
    assert ws.schedule_tensor(meta, True, n_out + 1, 10, 8, 1, 7, cpu) is None  # another grid than the layout's


def test_schedule_cache_is_bounded_and_never_drops_a_schedule(monkeypatch):
    # a CUDA graph holds only a schedule's address: once handed out it must live as long
    # as the layout, so past the bound new problems run round-robin instead of evicting
    monkeypatch.setattr(ws, "_CACHE_ENTRIES", 3)
    layout = layouts.random(512, 512, 64, 0.5, seed=2)
    meta, cpu = layout.meta, torch.device("cpu")
    first = [ws.schedule_tensor(meta, True, layout.block_rows, m, 8, 1, 4, cpu) for m in (1, 2, 3)]
    assert all(s is not None for s in first)
    assert ws.schedule_tensor(meta, True, layout.block_rows, 4, 8, 1, 4, cpu) is None
    assert [ws.schedule_tensor(meta, True, layout.block_rows, m, 8, 1, 4, cpu) for m in (1, 2, 3)] == first

