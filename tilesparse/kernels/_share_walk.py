"""A persistent Gluon kernel's walk over its share of the work items: positions p, p + P,
... (round-robin), or its segment of a host-built schedule [seg (P + 1 offsets) | items]
(:func:`tilesparse.kernels.attention_schedule.pack_lists`). The persistent attention
forward walks its query tiles this way, the persistent dK/dV kernel its (key block,
batch * kv head) items."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["_share_bounds", "_share_item"]


@gluon.jit
def _share_bounds(sched_ptr, n_items, SCHEDULED: gl.constexpr):
    """(first, end, stride) of this program's walk: over its segment of the schedule
    (entries seg[pid] .. seg[pid + 1] of the item list, which starts after the P + 1 segment
    offsets), or the items pid, pid + P, ... below ``n_items``."""
    pid = gl.program_id(0)
    if SCHEDULED:
        first = gl.load(sched_ptr + pid) + gl.num_programs(0) + 1
        end = gl.load(sched_ptr + pid + 1) + gl.num_programs(0) + 1
        return first, end, 1
    else:
        return pid, n_items, gl.num_programs(0)


@gluon.jit
def _share_item(position, sched_ptr, SCHEDULED: gl.constexpr):
    """The item at walk position ``position`` (see :func:`_share_bounds`)."""
    if SCHEDULED:
        return gl.load(sched_ptr + position)
    else:
        return position
