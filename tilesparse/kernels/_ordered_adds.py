"""Semaphores that put TMA reductions from different programs in a fixed order, for Gluon
kernels on Hopper: a program adds into a tile only once the tile's counter says every
contribution before its own has landed, then, after its own has, counts it.

Why: the attention backward's dK/dV kernel can add each block pair's dQ share by TMA
reductions (5 products per pair instead of 7), but adds landing in any order make dQ's
bits vary run to run. In a fixed order they do not (FlashAttention-3's deterministic
mode). :mod:`tilesparse.kernels.attention_ordered_dq` picks the order and says where it
costs little.

Memory model: the reductions are the async proxy's writes. :func:`count_done` waits for
every bulk operation its thread issued to complete (``cp.async.bulk.wait_group 0``, not
the ``.read`` form a store's staging reuse needs), fences the proxies and adds with
release semantics; :func:`wait_turn` reads with acquire semantics until the count is
reached and fences before the thread's next reduction. Both run in every thread of the
calling partition; each warp's lane 0 adds, after a warp sync that orders it behind the
elected lane that issued the reductions (Triton elects one lane of warp 0; FlashAttention-3
syncs the warp the same way), so a contribution counts ``num_warps`` (the attention's dQ
writer is one warp: one each).

Measured (H200, twenty-fifth session): run in the consumer warpgroups, before each of
their reductions, the fences and the acquire's round trip cost 20-30 % of the dK/dV
kernel; in a warp of their own, off the consumers' path, 0-10 %.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["count_done", "count_pair_done", "read_turn", "reads_done", "wait_turn", "wait_turn_from"]


@gluon.jit
def _per_thread(num_warps: gl.constexpr):
    """int32 zeros, one per thread of a ``num_warps``-warp partition."""
    return gl.zeros([32 * num_warps], gl.int32, gl.BlockedLayout([1], [32], [num_warps], [0]))


@gluon.jit
def count_done(sem_ptr, inc, num_warps: gl.constexpr):
    """Wait until this thread's bulk asynchronous operations (TMA reductions) are complete,
    fence, sync the warp (the lane that issued them, elected, need not be lane 0), then lane
    0 of each warp adds ``inc`` (0 or 1) to ``*sem_ptr`` with release semantics."""
    zeros = _per_thread(num_warps)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 lane; cp.async.bulk.wait_group 0; fence.proxy.async.global; "
        "bar.warp.sync -1; mov.u32 lane, %laneid; setp.eq.u32 p, lane, 0; "
        "@p red.release.gpu.global.add.u32 [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [sem_ptr + zeros, zeros + inc], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_turn(sem_ptr, count, num_warps: gl.constexpr):
    """Spin until ``*sem_ptr`` (read with acquire semantics) reaches ``count``; then fence,
    so that this thread's next TMA reduction comes after the counted ones."""
    zeros = _per_thread(num_warps)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 v; WAIT_TURN: ld.acquire.gpu.global.u32 v, [$1]; setp.lt.u32 p, v, $2; "
        "@p bra WAIT_TURN; fence.proxy.async.global; mov.u32 $0, v; }",
        "=r,l,r", [sem_ptr + zeros, zeros + count], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def count_pair_done(sem_ptr, inc, num_warps: gl.constexpr):
    """:func:`count_done` for the two adjacent counters ``sem_ptr[0]`` and ``sem_ptr[1]``
    after one completion wait, one fence and one warp sync (the dQ writer counts both
    consumers' shares of a tile at once)."""
    zeros = _per_thread(num_warps)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 lane; cp.async.bulk.wait_group 0; fence.proxy.async.global; "
        "bar.warp.sync -1; mov.u32 lane, %laneid; setp.eq.u32 p, lane, 0; "
        "@p red.release.gpu.global.add.u32 [$1], $2; @p red.release.gpu.global.add.u32 [$1+4], $2; "
        "mov.u32 $0, 0; }",
        "=r,l,r", [sem_ptr + zeros, zeros + inc], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def reads_done(num_warps: gl.constexpr):
    """Wait until this thread's bulk asynchronous operations have read their shared-memory
    sources (``cp.async.bulk.wait_group.read 0``: not that they have landed), then sync the
    warp, so that what any lane does next (freeing those tiles) comes after the elected lane
    that issued them. For a share no later one waits for: nothing to count."""
    zeros = _per_thread(num_warps)
    gl.inline_asm_elementwise("{ cp.async.bulk.wait_group.read 0; bar.warp.sync -1; mov.u32 $0, $1; }", "=r,r",
                              [zeros], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def read_turn(sem_ptr, num_warps: gl.constexpr):
    """``*sem_ptr`` read once with acquire semantics, no wait: a look ahead, taken while the
    caller waits for something else, that :func:`wait_turn_from` need not repeat."""
    zeros = _per_thread(num_warps)
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [sem_ptr + zeros],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_turn_from(sem_ptr, count, seen, num_warps: gl.constexpr):
    """:func:`wait_turn` that first looks at ``seen`` (:func:`read_turn`'s earlier read of
    ``*sem_ptr``): where it already reaches ``count`` no read is repeated, only the fence."""
    zeros = _per_thread(num_warps)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 v; mov.u32 v, $3; setp.lt.u32 p, v, $2; @!p bra TURN_SEEN; "
        "TURN_SPIN: ld.acquire.gpu.global.u32 v, [$1]; setp.lt.u32 p, v, $2; @p bra TURN_SPIN; "
        "TURN_SEEN: fence.proxy.async.global; mov.u32 $0, v; }",
        "=r,l,r,r", [sem_ptr + zeros, zeros + count, seen], dtype=gl.int32, is_pure=False, pack=1)
