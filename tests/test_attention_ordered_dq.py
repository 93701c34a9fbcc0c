"""The order of the deterministic 5-product backward's dQ adds (CPU:
tilesparse.kernels.attention_ordered_dq): the walk and ranks it hands the dK/dV kernel,
the layouts it takes and refuses, and its launch order."""

import pytest
import torch

from tilesparse.attention import AttentionLayout, layouts
from tilesparse.attention.layout import attention_table_views
from tilesparse.kernels import attention_ordered_dq as ordered
from tilesparse.kernels import attention_ws


def _per_head_windows():
    """Three heads with windows of 1, 2 and 3 blocks (a per-head layout: each head's own tables)."""
    from tilesparse.attention import AttentionLayout

    masks = [layouts.local(1000, 128, 128 * w).mask[0] for w in (1, 2, 3)]
    return AttentionLayout(torch.stack(masks), 128, seq_len=1000)


def _mask(layout, causal):
    mask = layout.mask.bool()
    if causal:
        mask = mask & torch.ones_like(mask[0]).tril()
    return mask


@pytest.mark.parametrize("name,causal,make", [
    ("local", False, lambda: layouts.local(2000, 128, 512)),
    ("local-causal", True, lambda: layouts.local(1050, 128, 512, causal=True)),
    ("causal", True, lambda: layouts.causal(2000, 128)),
    ("strided", True, lambda: layouts.strided(1000, 128, 256)),
    ("fixed", True, lambda: layouts.fixed(1500, 128, 512)),
    ("fixed-64", True, lambda: layouts.fixed(8192, 64, 1024)),
    ("one block", False, lambda: layouts.local(128, 128, 128)),
    ("per-head windows", False, lambda: _per_head_windows()),
    ("widest window taken", False, lambda: layouts.local(128 * 60, 128, 128 * ordered.MAX_TIGHT_CHAIN))])
def test_walk_and_ranks_of_the_layouts_it_takes(name, causal, make):
    # each key block walks exactly its column's query blocks; in every query block's row the
    # ranks are 0..n-1 with key blocks descending (each row's last flagged in the flagged
    # ranks); every share's predecessor in its row
    # comes no later in its own walk (a symmetric window's first rows: at the same step, in
    # short runs; elsewhere at least one step earlier)
    layout = make()
    meta = layout.meta_on(torch.device("cpu"), causal)
    tables = ordered.ordered_tables(meta, layout.layout_heads, layout.num_blocks)
    assert tables is not None, f"{name}: should be taken"
    walk, ranks = (t.long() for t in tables)
    flagged = ordered.last_flagged_ranks(meta, layout.layout_heads, layout.num_blocks).long()
    mask = _mask(layout, causal)
    nb = layout.num_blocks
    col_ptr = torch.cat([torch.zeros(1, dtype=torch.long), mask.transpose(1, 2).sum(2).flatten().cumsum(0)])
    position = {}
    for lh in range(mask.shape[0]):
        for c in range(nb):
            seg = slice(int(col_ptr[lh * nb + c]), int(col_ptr[lh * nb + c + 1]))
            rows = walk[seg].tolist()
            assert sorted(rows) == mask[lh, :, c].nonzero().flatten().tolist()
            for p, (r, k, f) in enumerate(zip(rows, ranks[seg].tolist(), flagged[seg].tolist())):
                cols = sorted(mask[lh, r].nonzero().flatten().tolist(), reverse=True)
                assert cols[k] == c, (lh, r, c, k)
                # (last_share_uncounted) the flag on exactly the row's last share
                assert f == k + ordered.LAST_SHARE_FLAG * (k == len(cols) - 1), (lh, r, c, k, f)
                position[(lh, r, c)] = p
        for (lh_, r, c), p in list(position.items()):
            cols = sorted(mask[lh_, r].nonzero().flatten().tolist(), reverse=True)
            k = cols.index(c)
            if k:
                assert position[(lh_, r, cols[k - 1])] <= p


@pytest.mark.parametrize("make", [
    lambda: layouts.bigbird(2048, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=3),
    lambda: layouts.random(2048, 128, 0.2, seed=1)])
def test_layouts_whose_order_would_wait_are_refused(make):
    # a global row (BigBird) or random blocks: some share's predecessor reaches the query
    # tile no earlier in its own walk; chains of such waits cost 1.3-2x in the model
    layout = make()
    meta = layout.meta_on(torch.device("cpu"))
    assert ordered.ordered_tables(meta, layout.layout_heads, layout.num_blocks) is None


def test_a_layout_without_blocks_has_nothing_to_order():
    # no key block adds anything: tables that are not the refusal (the launch runs no walk)
    empty = AttentionLayout(torch.zeros(1, 4, 4, dtype=torch.bool), 128, seq_len=512)
    meta = empty.meta_on(torch.device("cpu"))
    assert attention_table_views(meta, 1, empty.num_blocks)[3].numel() == 0
    assert ordered.ordered_tables(meta, 1, empty.num_blocks) is not None
    assert ordered.last_flagged_ranks(meta, 1, empty.num_blocks) is not None


def test_longest_tight_chain():
    assert ordered._longest_tight_chain(torch.tensor([False, True, True, False, True, True, True, False])) == 3
    assert ordered._longest_tight_chain(torch.tensor([], dtype=torch.bool)) == 0
    # a symmetric window: runs of its width in the first rows, taken; the layout refused once the
    # runs pass MAX_TIGHT_CHAIN
    wide = layouts.local(128 * 80, 128, 128 * (ordered.MAX_TIGHT_CHAIN + 2))
    assert ordered.ordered_tables(wide.meta_on(torch.device("cpu")), 1, wide.num_blocks) is None


def test_launch_order_is_key_block_descending_per_kv_head():
    got = ordered.launch_table(3, 2, "cpu").tolist()
    assert got == [2, 1, 0, 5, 4, 3]  # item = kv item * num_blocks + key block


def test_ordered_dq_config_checks():
    with pytest.raises(ValueError, match="ordered_dq needs shared_ds"):
        attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, ordered_dq=True)
    with pytest.raises(ValueError, match="ordered_dq needs shared_ds"):
        attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True, balanced=True)
    with pytest.raises(ValueError, match="ordered_dq"):
        attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=1)
    attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True)
    attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True, staged_stores=True)
    with pytest.raises(ValueError, match="first_share_stored needs ordered_dq"):
        attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, first_share_stored=True)
    attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True,
                              first_share_stored=True)
    with pytest.raises(ValueError, match="last_share_uncounted needs ordered_dq"):
        attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, last_share_uncounted=True)
    attention_ws.DkdvWsConfig(64, 2, consumers=2, atomic_dq=True, shared_ds=True, ordered_dq=True,
                              first_share_stored=True, last_share_uncounted=True, ring_stores=True)


def _skew(layout, causal=False):
    return ordered.column_skew(layout.meta_on(torch.device("cpu"), causal), layout.layout_heads,
                               -(-layout.seq_len // layout.block_size))


def test_column_skew_is_the_longest_column_over_the_mean():
    # a hand-made mask: key-block columns of 4, 1, 1 and 1 blocks -> 4 / 1.75
    from tilesparse.attention import AttentionLayout

    mask = torch.eye(4, dtype=torch.bool)
    mask[1:, 0] = True
    assert _skew(AttentionLayout(mask[None], 16, seq_len=64)) == pytest.approx(4 / 1.75)
    assert _skew(layouts.random(64, 16, 0.0)) == 0.0  # no blocks: nothing skewed


def test_the_default_skew_cut_separates_the_measured_layouts():
    # the suite's S 8192 patterns the cut was set on: the ordered mode won on local 1024,
    # strided and causal, and lost on the fixed pattern (its summary columns)
    cut = ordered.MAX_DEFAULT_COLUMN_SKEW
    assert _skew(layouts.local(8192, 128, 1024)) <= cut
    assert _skew(layouts.strided(8192, 128, 1024), causal=True) <= cut
    assert _skew(layouts.causal(8192, 128), causal=True) <= cut
    assert _skew(layouts.fixed(8192, 128, 1024), causal=True) > cut


def test_ordered_default_needs_a_hopper_gpu():
    # CPU tensors (and any device the warp-specialized kernels cannot run): the two kernels
    layout = layouts.local(1024, 128, 512)
    q = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    meta = layout.meta_on(q.device, False)
    assert attention_ws.ordered_default(q, q, q, q, 128, meta, layout.layout_heads, 8) is None


@pytest.mark.parametrize("case,want", [("local", True), ("causal", True), ("fixed-skewed", False), ("bigbird", False),
                                       ("d64", False), ("fp16", True), ("per-head", False), ("no-meta", False)])
def test_which_inputs_take_the_ordered_default(case, want, monkeypatch):
    # the kernel's own operand check passed by hand (no Hopper GPU here): the gates of the
    # default itself, by layout (order, skew), head dim, dtype and per-head layouts
    monkeypatch.setattr(attention_ws, "ws_supported", lambda *a: None)
    S = 4096 if case == "fixed-skewed" else 1024
    layout = {"causal": lambda: layouts.causal(S, 128),
              "fixed-skewed": lambda: layouts.fixed(S, 128, 512),
              "bigbird": lambda: layouts.bigbird(S, 128, window_blocks=3, global_blocks=1, random_blocks=1, seed=3),
              "per-head": _per_head_windows}.get(case, lambda: layouts.local(S, 128, 512))()
    causal = case in ("causal", "fixed-skewed")
    D = 64 if case == "d64" else 128
    dtype = torch.float16 if case == "fp16" else torch.bfloat16
    q = torch.zeros(1, layout.layout_heads if layout.layout_heads > 1 else 2, layout.seq_len, D, dtype=dtype)
    meta = None if case == "no-meta" else layout.meta_on(q.device, causal)
    nb = -(-layout.seq_len // 128)
    got = attention_ws.ordered_default(q, q, q, q, 128, meta, layout.layout_heads, nb)
    assert (got is not None) == want
    if want:
        assert got.ordered_dq and got.atomic_dq and got.shared_ds and got.first_share_stored


@pytest.mark.parametrize("case,ordered_dq", [("local", True), ("fixed-skewed", False)])
def test_the_backward_launches_the_ordered_default(case, ordered_dq, monkeypatch):
    # the dispatch on the CPU: the warp-specialized defaults forced (no Hopper here), the
    # dK/dV launch recorded and stopped; the plan remembers the candidate, the layout decides
    from tilesparse.kernels import attention as kernels

    class Stop(Exception):
        pass

    seen = []

    def stop(*args, **kwargs):
        seen.append(args[17])
        raise Stop

    monkeypatch.setattr(kernels, "_PLANS", {})
    monkeypatch.setattr(attention_ws, "ws_supported", lambda *a: None)
    monkeypatch.setattr(attention_ws, "default_config",
                        lambda kind, *a, **kw: attention_ws._WS_DEFAULTS[(kind, 128, 128)])
    monkeypatch.setattr(attention_ws, "launch_dq_ws", lambda *a, **kw: None)
    monkeypatch.setattr(attention_ws, "launch_dkdv_ws", stop)
    S = 4096 if case == "fixed-skewed" else 1024
    layout = layouts.fixed(S, 128, 512) if case == "fixed-skewed" else layouts.local(S, 128, 512)
    causal = case == "fixed-skewed"
    q, k, v, out, grad = (torch.randn(1, 2, S, 128).to(torch.bfloat16) for _ in range(5))
    lse = torch.zeros(1, 2, S)
    meta = layout.meta_on(q.device, causal)
    with pytest.raises(Stop):
        kernels.attention_backward(grad, q, k, v, out, lse, meta, None, 1, 128, causal, 128 ** -0.5)
    assert len(seen) == 1 and seen[0].ordered_dq == ordered_dq


def test_every_row_has_shares():
    # a query block without blocks (here row 2 of 4) means dQ rows no share writes: zeroed
    from tilesparse.attention import AttentionLayout

    def full_rows(layout, causal=False):
        return ordered.every_row_has_shares(layout.meta_on(torch.device("cpu"), causal), layout.layout_heads,
                                            -(-layout.seq_len // layout.block_size))

    assert full_rows(layouts.local(1000, 128, 512)) and full_rows(layouts.causal(1000, 128), True)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    assert not full_rows(AttentionLayout(mask[None], 16, seq_len=64))
    assert not full_rows(layouts.random(64, 16, 0.0))
