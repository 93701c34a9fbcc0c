"""The order of the dQ adds in the deterministic 5-product attention backward
(``DkdvWsConfig.ordered_dq``): the warp-specialized dK/dV kernel adds each block pair's dQ
share by a TMA reduction, as ``deterministic=False`` does, but every query tile receives
its shares in one fixed order (:mod:`tilesparse.kernels._ordered_adds`), so dQ's bits are
the same run to run.

The order: in each query block's row, key blocks descending; programs launch key block
descending within each (batch, kv head), so a program only ever waits for programs
launched before it (no deadlock while the hardware starts programs in grid order); each
program walks its column's query blocks by its rank in their rows (first where it comes
first). Where every share's predecessor in its row reaches that row at least one step
earlier in its own walk (local windows, causal, the Sparse Transformer's strided and
fixed patterns), or at the same step in runs of at most ``MAX_TIGHT_CHAIN`` (a symmetric
window's first rows), the waits cost ~1-2 % in the model of
``scripts/probes/ordered_dq_model.py``; where some come later or the runs are longer
(random blocks, BigBird's global rows: 1.3-2x there), :func:`ordered_tables` says None and
the launcher refuses the config.

Measured (H200, twenty-fifth session, S 8192, D 128, backward alone; the dQ writer warp of
:func:`attention_ws_dkdv._dkdv_dq_writer`): causal 6.41 -> 6.02 ms and strided 2.46 -> 2.36
against the deterministic two-kernel backward, local 1024 equal (1.93), the fixed pattern
slower (1.92 -> 2.17); the unordered adds (``deterministic=False``) 1.76 / 2.21 / 1.84 /
5.82. The same walk and launch order without the semaphores: within 1 % of the unordered
kernel, so the order's waits cost the rest, more than the model's ~1 %. Twenty-sixth
session: the writer reads each tile's counters ahead of the hand-over (LOOK_AHEAD), 5 %
faster: local 1024 1.818, strided 2.254, fixed 2.057, causal 5.719 ms against the two-kernel
1.878 / 2.417 / 1.882 / 6.403 and the unordered 1.728 / 2.176 / 1.847 / 5.740; the
deterministic backward's default at D 128 where :func:`column_skew` is at most
``MAX_DEFAULT_COLUMN_SKEW`` (``attention_ws.ordered_default``). At D 64 (shared dS) it lost
to the two-kernel backward on all four (1.34 vs 1.23 ms on local 1024): opt-in there.
Twenty-seventh session: with each tile's first share stored (no zeroed buffer, the default)
local 1024 1.770, strided 2.192, causal 5.711 ms; fp16 local 1024 1.766 against the two
kernels' 1.905.
"""

from __future__ import annotations

import torch

from ..attention.layout import attention_table_views
from ._device import cached_table

__all__ = ["ordered_tables", "last_flagged_ranks", "LAST_SHARE_FLAG", "semaphores", "launch_table",
           "launch_table_on", "column_skew", "MAX_DEFAULT_COLUMN_SKEW", "every_row_has_shares"]

_TABLES = "_ordered_dq_tables"
# added to a share's rank in :func:`last_flagged_ranks`' table where it is its row's last
# (``DkdvWsConfig.last_share_uncounted``); ranks stay below it (a row has at most nb shares,
# and nb < 2**24 wherever the tables fit in memory)
LAST_SHARE_FLAG = 1 << 24


def ordered_tables(meta: torch.Tensor, layout_heads: int, num_blocks: int):
    """(walk_rows, ranks): int32 on meta's device, indexed as the CSC ``col_rows`` (each key
    block's entries stay in its segment): the query blocks in the order the key block's
    program walks them, and the rank of its share in each one's row (the number of shares
    added before it). None where the order would make programs wait (see the module
    docstring), or while a CUDA graph is captured before the tables were built. Remembered
    on ``meta``; built with one copy of the tables to the host."""
    tables = _tables(meta, layout_heads, num_blocks)
    return None if tables is None else tables[:2]


def last_flagged_ranks(meta: torch.Tensor, layout_heads: int, num_blocks: int):
    """:func:`ordered_tables`' ranks with ``LAST_SHARE_FLAG`` added where the share is the
    last of its row (``DkdvWsConfig.last_share_uncounted``: the dQ writer does not count
    it); None where :func:`ordered_tables` is."""
    tables = _tables(meta, layout_heads, num_blocks)
    return None if tables is None else tables[2]


def _tables(meta: torch.Tensor, layout_heads: int, num_blocks: int):
    """(walk rows, ranks, last-flagged ranks), remembered on ``meta``; None where refused."""
    tables = cached_table(meta, _TABLES, (layout_heads, num_blocks), lambda: _build(meta, layout_heads, num_blocks),
                          build_while_capturing=False)
    return None if tables is None or tables[0].numel() == 0 else tables


def semaphores(n: int, device) -> torch.Tensor:
    """int32 [n] zeros: the ordered mode's counters for one launch, one per (batch * head,
    query tile, consumer); each ends at the shares counted into it (a row's shares, or one
    less with ``DkdvWsConfig.last_share_uncounted``)."""
    return torch.zeros(n, dtype=torch.int32, device=device)


def launch_table(num_blocks: int, kv_items: int, device) -> torch.Tensor:
    """int32 [kv_items * num_blocks]: program p's item (batch * kv head) * num_blocks + key block,
    key blocks descending within each (batch, kv head)."""
    key_blocks = torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32, device=device)
    items = torch.arange(kv_items, dtype=torch.int32, device=device)[:, None] * num_blocks + key_blocks[None, :]
    return items.flatten()


def launch_table_on(meta: torch.Tensor, num_blocks: int, kv_items: int) -> torch.Tensor:
    """:func:`launch_table` on meta's device, remembered on ``meta`` (built outside any CUDA
    graph capture's memory pool; inside one, built without a host copy)."""
    return cached_table(meta, "_ordered_dq_launch", (num_blocks, kv_items),
                        lambda: launch_table(num_blocks, kv_items, meta.device))


# The deterministic backward takes the ordered mode by default (attention_ws.ordered_default)
# only where the longest key-block column is at most this many times the mean: the fixed
# pattern (longest 7.1x the mean: its summary columns) ran 9 % slower ordered than the
# two-kernel backward, local 1024 (1.07x), strided (1.36x) and causal (1.97x) 3-11 % faster
# (twenty-sixth session, ...-attention-ordered-writer-d128-*.json). The cut between 2 and 7
# is not measured more finely, nor at other lengths: the fixed pattern's skew grows with S
# (S 2048: 3.25, taken; S 4096: 4.2-4.8 for strides 1024 / 512; S 8192: 7.1).
MAX_DEFAULT_COLUMN_SKEW = 4.0


def column_skew(meta: torch.Tensor, layout_heads: int, num_blocks: int) -> float | None:
    """The longest key-block column (blocks in it) over the mean column, over every head's
    layout (0 for a layout without blocks); remembered on ``meta`` (None while a CUDA graph
    is captured before it was: it reads the tables to the host)."""
    def build():
        _, col_ptr, _, _ = attention_table_views(meta, layout_heads, num_blocks)
        lengths = (col_ptr[1:] - col_ptr[:-1]).cpu().float()
        mean = float(lengths.mean()) if lengths.numel() else 0.0
        return float(lengths.max()) / mean if mean > 0 else 0.0

    return cached_table(meta, "_ordered_dq_skew", (layout_heads, num_blocks), build, build_while_capturing=False)


def every_row_has_shares(meta: torch.Tensor, layout_heads: int, num_blocks: int) -> bool:
    """Whether every query block of every head's layout has at least one block (so with
    ``DkdvWsConfig.first_share_stored`` every dQ row is written by a store before any add,
    and dQ's buffer needs no zeros); remembered on ``meta``. False while a CUDA graph is
    captured before it was computed (it reads the tables to the host)."""
    def build():
        row_ptr = attention_table_views(meta, layout_heads, num_blocks)[0]
        return bool(((row_ptr[1:] - row_ptr[:-1]) > 0).all())

    return cached_table(meta, "_ordered_dq_full_rows", (layout_heads, num_blocks), build,
                        build_while_capturing=False) is True


# a share whose predecessor in its row reaches the row at the same step of its own walk waits
# for it (a "tight" link); runs of them chain their waits. A symmetric window's first rows
# make runs of its width (modelled +1-2 %); BigBird's global rows, runs of the whole sequence
MAX_TIGHT_CHAIN = 16


def _longest_tight_chain(tight: torch.Tensor) -> int:
    """The longest run of consecutive True in ``tight`` (the shares of each row in rank
    order; a row's first share is never tight, so runs stay within rows)."""
    if tight.numel() == 0:
        return 0
    index = torch.arange(tight.numel())
    last_break = torch.cummax(torch.where(tight, torch.full_like(index, -1), index), 0).values
    return int((index - last_break).max())


def _build(meta: torch.Tensor, layout_heads: int, nb: int):
    _, col_ptr, _, col_rows = (t.cpu().long() for t in attention_table_views(meta, layout_heads, nb))
    nnz = col_rows.numel()
    refused = (torch.empty(0, dtype=torch.int32, device=meta.device),) * 3  # (remembered too)
    if nnz == 0:  # nothing to walk or order (one-entry tables: not the refusal)
        return (torch.zeros(1, dtype=torch.int32, device=meta.device),) * 3
    assert nb < LAST_SHARE_FLAG, "a rank must stay below LAST_SHARE_FLAG"
    segment = torch.repeat_interleave(torch.arange(layout_heads * nb), col_ptr[1:] - col_ptr[:-1])
    head, key, query = segment // nb, segment % nb, col_rows
    # rank: within each (head, query block) row, key blocks descending
    by_row = torch.argsort(((head * nb + query) * nb + (nb - 1 - key)), stable=True)
    row_id = (head * nb + query)[by_row]
    first = torch.ones(nnz, dtype=torch.bool)
    first[1:] = row_id[1:] != row_id[:-1]
    starts = torch.cummax(torch.where(first, torch.arange(nnz), torch.zeros(nnz, dtype=torch.long)), 0).values
    rank = torch.empty(nnz, dtype=torch.long)
    rank[by_row] = torch.arange(nnz) - starts
    predecessor = torch.full((nnz,), -1, dtype=torch.long)  # the share added just before, in the same row
    predecessor[by_row[1:][~first[1:]]] = by_row[:-1][~first[1:]]
    # walk: within each key block's segment, by rank, then query block
    walk = torch.argsort((segment * (nb + 1) + rank) * nb + query, stable=True)
    position = torch.empty(nnz, dtype=torch.long)
    position[walk] = torch.arange(nnz) - col_ptr[segment[walk]]
    has = predecessor >= 0
    lag = torch.full((nnz,), -1, dtype=torch.long)  # steps by which a share's predecessor comes later
    lag[has] = position[predecessor[has]] - position[has]
    if bool((lag > 0).any()) or _longest_tight_chain(lag[by_row] >= 0) > MAX_TIGHT_CHAIN:
        return refused
    row_len = torch.bincount(row_id, minlength=layout_heads * nb)[head * nb + query]
    flagged = rank + LAST_SHARE_FLAG * (rank == row_len - 1)
    return tuple(t[walk].to(torch.int32).to(meta.device) for t in (query, rank, flagged))
