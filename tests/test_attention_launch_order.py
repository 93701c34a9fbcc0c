"""The backward kernels' launch order (tilesparse.kernels.attention_launch_order): every
program exactly once, long programs first, used only where the model gains, remembered per
key, and costs that follow the layout's columns / rows. CPU only (the kernels' use of it is
in tests/test_attention_ws_gpu.py)."""

import pytest
import torch

from tilesparse.attention import AttentionLayout, layouts
from tilesparse.kernels import attention_launch_order as order_mod


def _order(layout, kind, batch, heads, kv_heads, m_split=1, programs=132, causal=False):
    meta = layout.meta_on("cpu", causal)
    return meta, order_mod.launch_order(meta, layout.layout_heads, layout.num_blocks, kind, batch, heads, kv_heads,
                                        m_split, programs)


@pytest.mark.parametrize("kind,m_split", [("dkdv", 1), ("dq", 1), ("dq", 2)])
@pytest.mark.parametrize("programs", [3, 132])
def test_order_is_a_permutation_with_long_programs_first(kind, m_split, programs, monkeypatch):
    monkeypatch.setattr(order_mod, "MIN_MODELLED_GAIN", 0.0)  # always a table
    S, b, B, H, Hkv = 4096, 128, 2, 4, 2
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2,
                             seed=int(torch.randint(0, 1 << 30, ())), num_heads=H)
    meta, order = _order(layout, kind, B, H, Hkv, m_split, programs)
    n = B * (Hkv if kind == "dkdv" else H) * layout.num_blocks * m_split
    assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(n))
    costs = order_mod.backward_costs(meta, layout.layout_heads, layout.num_blocks, kind, B, H, Hkv, m_split)
    mean = sum(costs) / len(costs)
    first = [costs[t] for t in order.tolist()]
    long = [c for c in first if c > 2 * mean]
    assert long and first[:len(long)] == sorted(long, reverse=True)  # the long ones first, longest first
    # remembered on meta: the same tensor again
    assert order_mod.launch_order(meta, layout.layout_heads, layout.num_blocks, kind, B, H, Hkv, m_split,
                                  programs) is order


@pytest.mark.parametrize("trial", range(20))
def test_costs_follow_the_kernels_numbering(trial):
    # each program's cost, in the order the kernels decode a table entry: dK/dV item =
    # (batch * kv head) * NB + key block, the sum over the kv head's query heads of the key
    # block's column length; dQ item = (batch * head) * NB * m_split + query tile, the row
    # length; per-head layouts (head h uses layout h % layout_heads), GQA, batches
    gen = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ())))
    nb, B, Hkv, group = (int(torch.randint(1, hi, (), generator=gen)) for hi in (10, 4, 4, 4))
    H = Hkv * group
    lanes = [d for d in range(1, H + 1) if H % d == 0]
    L = lanes[int(torch.randint(0, len(lanes), (), generator=gen))]
    mask = torch.rand(L, nb, nb, generator=gen) < 0.4
    meta = AttentionLayout(mask, 64).meta_on("cpu", False)
    fixed = order_mod.PROGRAM_FIXED_COST
    dkdv = order_mod.backward_costs(meta, L, nb, "dkdv", B, H, Hkv)
    assert len(dkdv) == B * Hkv * nb
    for item, cost in enumerate(dkdv):
        kblk, hkv = item % nb, item // nb % Hkv
        column = sum(int(mask[(hkv * group + g) % L, :, kblk].sum()) for g in range(group))
        assert cost == column + fixed, item
    m_split = int(torch.randint(1, 3, (), generator=gen))
    dq = order_mod.backward_costs(meta, L, nb, "dq", B, H, Hkv, m_split)
    assert len(dq) == B * H * nb * m_split
    for item, cost in enumerate(dq):
        qblk, h = item % (nb * m_split) // m_split, item // (nb * m_split) % H
        assert cost == int(mask[h % L, qblk].sum()) + fixed, item


def test_no_table_where_the_grid_order_is_already_balanced():
    # local windows: columns of (near-)equal length, the model gains nothing
    layout = layouts.local(8192, 128, 1024, causal=True)
    assert _order(layout, "dkdv", 4, 16, 16, causal=True)[1] is None
    assert _order(layout, "dq", 4, 16, 16, causal=True)[1] is None
    # BigBird (global blocks: whole-sequence columns and rows) gets one, and it gains
    bigbird = layouts.bigbird(8192, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=0)
    meta, order = _order(bigbird, "dkdv", 4, 16, 16)
    assert order is not None
    costs = order_mod.backward_costs(meta, 1, 64, "dkdv", 4, 16, 16)
    natural = order_mod.modelled_makespan(costs, range(len(costs)), 132)
    assert order_mod.modelled_makespan(costs, order.tolist(), 132) * order_mod.MIN_MODELLED_GAIN <= natural


def test_above_the_limit_no_table(monkeypatch):
    monkeypatch.setattr(order_mod, "MIN_MODELLED_GAIN", 0.0)  # a table wherever one is allowed
    layout = layouts.bigbird(2048, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=0)
    assert _order(layout, "dq", 1, 1, 1)[1] is not None  # 16 programs
    monkeypatch.setattr(order_mod, "MAX_SCHEDULED_TILES", 10)
    layout = layouts.bigbird(2048, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=0)
    assert _order(layout, "dq", 1, 1, 1)[1] is None


def test_modelled_makespan_is_greedy_list_scheduling():
    # two SMs: 3 then 1, 1, 1 -> SM0 3, SM1 1 + 1 + 1 = 3; the long one last: 1 + 1 | 1 + 3 -> 4
    assert order_mod.modelled_makespan([3.0, 1.0, 1.0, 1.0], [0, 1, 2, 3], 2) == 3.0
    assert order_mod.modelled_makespan([3.0, 1.0, 1.0, 1.0], [1, 2, 3, 0], 2) == 4.0


def test_head_major_long_keeps_the_long_programs_in_grid_order(monkeypatch):
    # deterministic=False's dK/dV order: the long columns first but in grid order (each
    # head's together), then as balanced_order (grid order, the last rounds longest first);
    # a different table, remembered apart
    monkeypatch.setattr(order_mod, "MIN_MODELLED_GAIN", 0.0)
    layout = layouts.fixed(4096, 128, 1024)
    meta = layout.meta_on("cpu", True)
    args = (meta, layout.layout_heads, layout.num_blocks, "dkdv", 2, 4, 4, 1, 16)
    sorted_first, head_major = order_mod.launch_order(*args), order_mod.launch_order(*args, head_major_long=True)
    costs = order_mod.backward_costs(*args[:-2], 1)
    mean = sum(costs) / len(costs)
    long = [t for t in head_major.tolist() if costs[t] > 2 * mean]
    assert long and long == sorted(long) and head_major.tolist()[:len(long)] == long
    assert sorted(head_major.tolist()) == sorted(sorted_first.tolist()) == list(range(len(costs)))
    assert not torch.equal(head_major, sorted_first)


def test_while_capturing_a_table_is_only_looked_up(monkeypatch):
    # the launch order reads the table pointers to the host, which a CUDA-graph capture
    # forbids: during one, cached_table(build_while_capturing=False) returns what is
    # remembered or None, never building (the default builds in place, unremembered)
    from types import SimpleNamespace

    from tilesparse.kernels._device import cached_table

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    owner = SimpleNamespace(is_cuda=True, device=torch.device("cuda"))
    built = []
    build = lambda: built.append(1) or torch.ones(1)  # noqa: E731
    assert cached_table(owner, "_t", "k", build, build_while_capturing=False) is None and not built
    assert torch.equal(cached_table(owner, "_t", "k", build), torch.ones(1)) and built == [1]
    assert "_t" not in owner.__dict__
    owner.__dict__["_t"] = {"k": torch.zeros(1)}
    assert torch.equal(cached_table(owner, "_t", "k", build, build_while_capturing=False), torch.zeros(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_table_remembers_host_values_on_cuda():
    # a value read from the tables to the host (a skew, a flag) is built on the side stream
    # like a table and remembered; only tensors are recorded on the current stream
    from tilesparse.kernels._device import cached_table

    owner = torch.zeros(4, device="cuda")
    built = []
    build = lambda: built.append(1) or float(owner.sum()) + 2.5  # noqa: E731
    assert cached_table(owner, "_host", "k", build) == 2.5
    assert cached_table(owner, "_host", "k", build) == 2.5 and built == [1]
    assert cached_table(owner, "_flag", "k", lambda: False) is False


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("programs", [1, 5, 37, 100])
@pytest.mark.parametrize("head_major_long", [False, True])
def test_persistent_items_share_every_item_once_and_balance_the_columns(seed, programs, head_major_long,
                                                                      monkeypatch):
    # the persistent dK/dV kernel's schedule: programs + 1 offsets, then each program's items;
    # every (batch * kv head, key block) item once; the model's busiest program within list
    # scheduling's bound (the mean plus the longest item) and below the round-robin's on
    # BigBird's uneven columns (fixed seeds; the slack forced to 0 so that a table is built)
    from tilesparse.kernels import attention_schedule

    monkeypatch.setattr(attention_schedule, "ROUND_ROBIN_SLACK", 0.0)
    S, b, B, H, Hkv = 4096, 128, 2, 4, 2
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed, num_heads=H)
    meta = layout.meta_on("cpu", False)
    args = (meta, layout.layout_heads, layout.num_blocks, B, H, Hkv, programs)
    sched = order_mod.persistent_items(*args, head_major_long=head_major_long)
    n = B * Hkv * layout.num_blocks
    assert sched.dtype == torch.int32 and sched.numel() == programs + 1 + n
    seg, items = sched[:programs + 1].tolist(), sched[programs + 1:].tolist()
    assert seg[0] == 0 and seg[-1] == n and seg == sorted(seg)
    assert sorted(items) == list(range(n))
    costs = order_mod.backward_costs(meta, layout.layout_heads, layout.num_blocks, "dkdv", B, H, Hkv)
    busiest = max(sum(costs[t] for t in items[seg[p]:seg[p + 1]]) for p in range(programs))
    assert busiest <= sum(costs) / programs + max(costs)
    if programs in (5, 37):
        assert busiest < max(sum(costs[p::programs]) for p in range(programs))
    assert order_mod.persistent_items(*args, head_major_long=head_major_long) is sched  # remembered
    assert order_mod.persistent_items(*args, head_major_long=not head_major_long) is not sched


def test_persistent_items_keep_the_round_robin_where_the_columns_are_even():
    # local windows: every column nearly as long (the round-robin within ROUND_ROBIN_SLACK)
    layout = layouts.local(8192, 128, 1024)
    meta = layout.meta_on("cpu", False)
    assert order_mod.persistent_items(meta, 1, layout.num_blocks, 4, 16, 16, 132) is None


def test_persistent_items_above_the_limit_is_the_round_robin(monkeypatch):
    monkeypatch.setattr(order_mod, "MAX_SCHEDULED_TILES", 3)
    layout = layouts.local(1024, 128, 256)
    assert order_mod.persistent_items(layout.meta_on("cpu", False), 1, layout.num_blocks, 1, 1, 1, 4) is None
