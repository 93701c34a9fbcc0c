"""The ordered-dQ scheduling model (scripts/probes/ordered_dq_model.py) on small layouts:
its slot colouring is a proper edge colouring, the key order's ranks go key block
descending, an order never beats the unordered adds, a window costs the order nothing at
zero hop, and a made-up case whose waits are worked out by hand."""

import pytest
import torch

from script_modules import load_script
from tilesparse.attention import AttentionLayout, layouts


@pytest.fixture(scope="module")
def model():
    return load_script("scripts/probes/ordered_dq_model.py")


def _random_cols(model, seed=0, nb=12, heads=2, density=0.3):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(heads, nb, nb, generator=g) < density
    return model.programs_of(AttentionLayout(mask, 16, seq_len=nb * 16), 1, heads, causal=False)


def test_slot_colouring_is_proper(model):
    cols = _random_cols(model)
    slot = model.slot_colouring(cols)
    assert len(slot) == sum(len(rs) for rs in cols.values())
    for (bh, c), rs in cols.items():  # distinct within each program
        assert len({slot[(bh, r, c)] for r in rs}) == len(rs)
    for (bh, r), cs in model._rows_of(cols).items():  # and within each row
        assert len({slot[(bh, r, c)] for c in cs}) == len(cs)
    degree = max(max(len(v) for v in cols.values()), max(len(v) for v in model._rows_of(cols).values()))
    assert max(slot.values()) + 1 <= 2 * degree - 1
    ranks, walks = model.slot_tables(cols, slot)
    for key, walk in walks.items():  # programs walk in slot order, rows add in slot order
        assert sorted(walk) == sorted(cols[key])
        assert [slot[(key[0], r, key[1])] for r in walk] == sorted(slot[(key[0], r, key[1])] for r in walk)
    for (bh, r), cs in model._rows_of(cols).items():
        by_rank = sorted(cs, key=lambda c: ranks[(bh, r, c)])
        assert [slot[(bh, r, c)] for c in by_rank] == sorted(slot[(bh, r, c)] for c in cs)


def test_key_ranks_go_key_descending(model):
    cols = _random_cols(model, seed=1)
    ranks = model.key_ranks(cols)
    for (bh, r), cs in model._rows_of(cols).items():
        assert [ranks[(bh, r, c)] for c in sorted(cs, reverse=True)] == list(range(len(cs)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_orders_never_beat_unordered(model, seed):
    cols = _random_cols(model, seed=seed)
    base = model.simulate(cols, 4, 3.0, 1.0, 0.0, 2, order=None)
    assert base > 0
    for order in model.ORDERS:
        assert model.simulate(cols, 4, 3.0, 1.0, 2.0, 2, order=order) >= base - 1e-9


def test_window_costs_no_wait_at_zero_hop(model):
    # a 3-block band: every share's predecessor (the next key block) reaches the row a step
    # earlier in its walk, so with free signals the order adds no time
    layout = layouts.local(16 * 10, 16, 48)
    cols = model.programs_of(layout, 1, 1, causal=False)
    base = model.simulate(cols, 3, 2.0, 1.0, 0.0, 1, order=None)
    assert model.simulate(cols, 3, 2.0, 1.0, 0.0, 1, order="key") == pytest.approx(base)


def test_a_wait_worked_out_by_hand(model):
    # one SM per program; key block 1's program walks rows 0 then 1, key block 0's program
    # row 1 only, which it adds after key block 1 (key descending). Tile 1 µs, overhead 0,
    # hop 0.5: key block 1 adds row 0 at 1, row 1 at 2 (visible 2.5); key block 0's tile is
    # ready at 1 but waits to 2.5, so the makespan is 2.5 against 2 unordered
    cols = {(0, 1): [0, 1], (0, 0): [1]}
    assert model.simulate(cols, 2, 1.0, 0.0, 0.0, 1, order=None) == pytest.approx(2.0)
    assert model.simulate(cols, 2, 1.0, 0.0, 0.5, 1, order="key") == pytest.approx(2.5)
