"""Shared parts of the Hopper warp-specialized attention kernels
(:mod:`tilesparse.kernels.attention_ws`, :mod:`tilesparse.kernels.attention_ws_dkdv`):
their launch configs, the Gluon helpers for head descriptors and masks, and their
shared-memory layouts."""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .bsmm_ws import _fill_stage, _nvmma
from ._tiles import check_bools

__all__ = ["LOG2E", "DkdvWsConfig", "DqWsConfig", "FwdWsConfig", "check_dq_acc"]

LOG2E = 1.4426950408889634


@gluon.jit
def _head_desc(ptr, B, HEADS, S, D: gl.constexpr, stride_b, stride_h, stride_s, ROWS: gl.constexpr,
               layout: gl.constexpr):
    """A TMA descriptor over [B, HEADS, S, D] (unit stride along D) with [1, 1, ROWS, D]
    boxes: each head's rows past S are zero-filled on load."""
    return tma.make_tensor_descriptor(ptr, [B, HEADS, S, D], [stride_b, stride_h, stride_s, 1], [1, 1, ROWS, D],
                                      layout)


def host_head_desc(t: torch.Tensor, rows: int, layout, cols: int | None = None):
    """A host-built TMA descriptor over a [B, HEADS, S, D] tensor (unit stride along D) with
    [1, 1, rows, cols or D] boxes in shared-memory ``layout``: the device-built
    :func:`_head_desc`'s twin."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols or t.shape[-1]], layout)


def tma_operand_reason(name: str, t: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Why a TMA descriptor cannot read ``t`` (a [B, heads, S, D] operand named ``name``) in
    ``dtype`` (the kernels' one dtype), or None: unit stride along D, a 16-byte-aligned base
    and strides, no broadcast (zero-stride) dimension."""
    if t.dtype != dtype:
        return f"needs one dtype: {name} is {t.dtype}, q is {dtype}"
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:3]):
        return f"needs {name} with unit stride along D and 16-byte-aligned strides"
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return f"needs {name} without broadcast (zero-stride) dimensions"
    return None


@gluon.jit
def _qkv_descs(q_ptr, k_ptr, v_ptr, B, S, H, HKV, D: gl.constexpr, q_strides, k_strides, v_strides,
               Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, qo_layout: gl.constexpr, kv_layout: gl.constexpr):
    """(Q, K, V) descriptors of one launch: Q over [B, H, S, D] in Q_ROWS-row boxes, K and V
    over [B, Hkv, S, D] in KV_ROWS-row boxes; strides as (batch, head, row) triples."""
    return (_head_desc(q_ptr, B, H, S, D, q_strides[0], q_strides[1], q_strides[2], Q_ROWS, qo_layout),
            _head_desc(k_ptr, B, HKV, S, D, k_strides[0], k_strides[1], k_strides[2], KV_ROWS, kv_layout),
            _head_desc(v_ptr, B, HKV, S, D, v_strides[0], v_strides[1], v_strides[2], KV_ROWS, kv_layout))


@gluon.jit
def _backward_descs(q_ptr, k_ptr, v_ptr, do_ptr, B, S, H, HKV, D: gl.constexpr, q_strides, k_strides, v_strides,
                    do_strides, Q_ROWS: gl.constexpr, KV_ROWS: gl.constexpr, qo_layout: gl.constexpr,
                    kv_layout: gl.constexpr, HOST_DESCS: gl.constexpr):
    """(Q, K, V, dO) descriptors of a backward kernel (dK/dV, dQ): built here as
    :func:`_qkv_descs` and :func:`_head_desc` build them, or (HOST_DESCS) the arguments
    themselves, host-built by :func:`host_backward_descs`."""
    if HOST_DESCS:
        q_desc, k_desc, v_desc, do_desc = q_ptr, k_ptr, v_ptr, do_ptr
    else:
        q_desc, k_desc, v_desc = _qkv_descs(q_ptr, k_ptr, v_ptr, B, S, H, HKV, D, q_strides, k_strides, v_strides,
                                            Q_ROWS, KV_ROWS, qo_layout, kv_layout)
        do_desc = _head_desc(do_ptr, B, H, S, D, do_strides[0], do_strides[1], do_strides[2], Q_ROWS, qo_layout)
    return q_desc, k_desc, v_desc, do_desc


def host_backward_descs(q, k, v, grad_out, q_rows: int, kv_rows: int, qo_layout, kv_layout) -> tuple:
    """The host-built (Q, K, V, dO) descriptors :func:`_backward_descs` takes with HOST_DESCS."""
    return (host_head_desc(q, q_rows, qo_layout), host_head_desc(k, kv_rows, kv_layout),
            host_head_desc(v, kv_rows, kv_layout), host_head_desc(grad_out, q_rows, qo_layout))


@gluon.constexpr_function
def _wgmma_layout(n, num_warps):
    """The wgmma accumulator layout of a [16 * num_warps rows, ``n``] tile (16 rows per warp)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _a_operand(accumulator_layout):
    """A 16-bit wgmma A operand from registers, for the product accumulating in ``accumulator_layout``."""
    return gl.DotOperandLayout(operand_index=0, parent=accumulator_layout, k_width=2)


@gluon.jit
def _one_shot_barrier():
    """An mbarrier completed by one arrival (with its expected bytes): a tile loaded once
    (or once per item of a persistent program, one phase each)."""
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return bar


@gluon.jit
def _needs_mask(kblk, qblk, S, BS: gl.constexpr, HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether block pair (qblk, kblk) needs the element mask, as the Triton kernels'
    ``_needs_mask``: always with key padding, else the last key block when S is not a
    multiple of the block and, if causal, the diagonal block."""
    need = (kblk + 1) * BS > S
    if CAUSAL:
        need = need | (kblk == qblk)
    if HAS_KPM:
        need = need | (kblk == kblk)
    return need


@gluon.jit
def _probabilities(sT, lse, qk_scale, kblk, qblk, S, offs_n, offs_m, n_keep, m_ok, BS: gl.constexpr,
                   HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """Pᵀ = exp2(Sᵀ · scale · log2 e - lse) of a key tile against a query tile, with the
    element mask where the Triton kernel needs one (``_needs_mask``: key padding, the last
    key block when S is not a multiple of the block, the causal diagonal). The dK/dV kernel's
    tiles are key-major: rows ``offs_n`` (keys), columns ``offs_m`` (queries)."""
    pT = gl.exp2(sT * qk_scale - lse[None, :])
    if _needs_mask(kblk, qblk, S, BS, HAS_KPM, CAUSAL):
        keep = n_keep[:, None] & m_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
        pT = gl.where(keep, pT, 0.0)
    return pT


@gluon.jit
def _row_keep(offs_m, offs_n, m_ok, kpm_ptr, bz, S, HAS_KPM: gl.constexpr, CAUSAL: gl.constexpr):
    """[queries, keys] bool of a row walk's tile: query < S, key < S and not padding, key
    <= query when causal (the Triton kernels' ``_tile_mask``)."""
    n_ok = offs_n < S
    if HAS_KPM:
        pad = gl.load(kpm_ptr + bz.to(gl.int64) * S + offs_n, mask=n_ok, other=1)
        n_ok = n_ok & (pad == 0)
    keep = m_ok[:, None] & n_ok[None, :]
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


def _check_consumers(cfg, consumers) -> None:
    if isinstance(consumers, bool) or consumers not in (1, 2):
        raise ValueError(f"{type(cfg).__name__}.consumers must be 1 or 2, got {consumers!r}")
    # with two consumers the first (the default partition) gets 504 (three warpgroups of 168)
    # - 232 (the other consumer's) - load_regs registers per thread: more for the producer starves it
    if consumers == 2 and cfg.load_regs > 40:
        raise ValueError(f"{type(cfg).__name__}.load_regs must be <= 40 with two consumers, got {cfg.load_regs!r}")


@dataclasses.dataclass(frozen=True)
class DkdvWsConfig:
    """Launch parameters of the warp-specialized dK/dV kernel: ``block_m`` query rows per
    step (the key tile is the whole layout block, 16 rows per consumer warp), ``stages``
    of query / output-gradient tiles in flight, the producer warp's ``load_regs``;
    ``consumers`` 2 (blocks of 128): two consumer warpgroups with half the keys each,
    each synchronizing only itself before its barrier arrivals; ``overlap``: the elementwise
    work of a query tile under its wgmma (asynchronous sT / dPᵀ, then dV / dK);
    ``stats_in_smem``: the producer copies each query tile's lse and delta into its ring
    stage (cp.async, tracked by the stage's barrier) and the consumers read them from
    shared memory where they are used, instead of holding global loads in registers
    across the tile's first wgmma; ``atomic_dq``: the kernel also adds each pair's dQ share
    into an fp32 buffer by TMA reductions (5 products per pair, no dQ kernel; not bitwise
    reproducible: ``deterministic=False`` only); ``shared_ds`` (with ``atomic_dq``, two
    consumers): the consumers share each dSᵀ tile through shared memory and each adds half
    of dQ's columns for the whole key block (half the reduction bytes); ``fa3_order`` (with
    ``shared_ds``): FlashAttention-3's order of a tile's wgmmas, all asynchronous (Sᵀ and dPᵀ
    together, the exponentials under dPᵀ, the dS exchange under dV, dK issued while dQ runs,
    the reduction under dK) instead of five waited-for groups; ``mma_regs``: each consumer
    warpgroup's registers per thread with two consumers (the first, the default partition,
    gets 504 - ``mma_regs`` - ``load_regs``: keep them equal; 240 with ``load_regs`` 24 is
    FlashAttention-3's split, which ``fa3_order`` compiles into without spilling in its loop);
    ``staged_stores`` (with ``atomic_dq``): dK and dV leave through the consumer's idle dQ
    staging tiles in 16-byte stores (the accumulator layout stores 4 bytes at a time);
    ``host_descs``: the TMA descriptors (Q, K, V, dO, dQ's buffer) are built on the host and
    passed in, instead of by every program on the device before its first load;
    ``persistent``: a program per SM at most, taking (key block, batch * kv head) items in
    turn, its descriptors built once and the next item's K and V loaded while the consumers
    store the last one's dK and dV; ``balanced``: the programs launch in
    the order of :mod:`tilesparse.kernels.attention_launch_order` (long columns first) where
    the layout's column lengths make the grid's order end on a few long programs (with
    ``persistent``: each program takes its share of a schedule handed out in that order,
    ``attention_launch_order.persistent_items``, instead of every P-th item);
    ``ordered_dq`` (with ``shared_ds``): the shares of dQ added in a fixed order behind
    semaphores by a dQ writer warp (:mod:`tilesparse.kernels.attention_ordered_dq`), so
    dQ's bits are reproducible: a deterministic 5-product backward, for the layouts whose
    order costs little (the launcher refuses the others), launched in its own order (not
    ``balanced`` or ``persistent``; with ``staged_stores`` dK and dV wait for the dQ writer to
    free the staging tiles: the same bits, mixed timings, not in the default). The
    deterministic backward's default at D 128 where the layout takes it
    (``attention_ws.ordered_default``): on the H200 3-11 % faster than the two-kernel
    backward on local windows, strided and causal layouts, 9 % slower on the fixed pattern.
    ``first_share_stored`` (with ``ordered_dq``): the share ranked first in its query tile is
    stored by a TMA copy instead of added, so dQ's fp32 buffer needs no zeros beforehand
    where every query block has a share (the launcher zeroes it otherwise): one pass over
    4 bytes x B H S D less (H200: the ordered backward 0.05-0.06 ms faster at S 8192; in the
    default). ``ring_stores``: dK and dV leave through the Q / dO ring's buffers once both
    consumers have released them (16-byte stores, as ``staged_stores``, but waiting on no dQ
    add; any mode but persistent; a stage holds a consumer's [block / consumers, D] tile:
    block_m >= block / consumers, which the launcher checks). ``last_share_uncounted`` (with
    ``ordered_dq``): a query tile's last-ranked share is not counted (no share waits for it),
    so the dQ writer waits only for its source tile to be read, not for the add to land: no
    round trip to L2 at the end of a program, whose last tile is mostly its row's last."""

    block_m: int = 64
    stages: int = 2
    load_regs: int = 40
    consumers: int = 1
    overlap: bool = False
    stats_in_smem: bool = False
    atomic_dq: bool = False
    shared_ds: bool = False
    fa3_order: bool = False
    mma_regs: int = 232
    staged_stores: bool = False
    host_descs: bool = False
    persistent: bool = False
    balanced: bool = False
    ordered_dq: bool = False
    first_share_stored: bool = False
    ring_stores: bool = False
    last_share_uncounted: bool = False

    def __post_init__(self):
        if self.block_m not in (32, 64, 128):
            raise ValueError(f"DkdvWsConfig.block_m must be 32, 64 or 128, got {self.block_m!r}")
        check_bools(self, "overlap", "stats_in_smem", "atomic_dq", "shared_ds", "fa3_order", "staged_stores",
                    "host_descs", "persistent", "balanced", "ordered_dq", "first_share_stored",
                    "ring_stores", "last_share_uncounted")
        if self.last_share_uncounted and not self.ordered_dq:
            raise ValueError("DkdvWsConfig.last_share_uncounted needs ordered_dq=True (the share ranked last in its "
                             "query tile is known only in the ordered mode)")
        if self.first_share_stored and not self.ordered_dq:
            raise ValueError("DkdvWsConfig.first_share_stored needs ordered_dq=True (the share ranked first in its "
                             "query tile is known only in the ordered mode)")
        if self.ordered_dq and not (self.shared_ds and not self.persistent and not self.balanced):
            raise ValueError("DkdvWsConfig.ordered_dq needs shared_ds=True (the adds it orders), and neither "
                             "persistent nor balanced (it launches in its own order)")
        if self.ring_stores and (self.staged_stores or self.persistent or self.stages < self.consumers):
            raise ValueError("DkdvWsConfig.ring_stores: not with staged_stores (another way to stage dK / dV) nor "
                             "persistent (the ring takes the next item), and stages >= consumers")
        if self.staged_stores and not self.atomic_dq:
            raise ValueError("DkdvWsConfig.staged_stores needs atomic_dq=True (it reuses the dQ staging tiles)")
        if self.shared_ds and not (self.atomic_dq and self.consumers == 2):
            raise ValueError("DkdvWsConfig.shared_ds needs atomic_dq=True and consumers=2 (the two share each dS tile)")
        if self.fa3_order and not (self.shared_ds and not self.overlap):
            raise ValueError("DkdvWsConfig.fa3_order needs shared_ds=True and overlap=False (it is its own overlapped order)")
        if isinstance(self.mma_regs, bool) or not isinstance(self.mma_regs, int) or not (
                24 <= self.mma_regs <= 256 and self.mma_regs % 8 == 0):
            raise ValueError(f"DkdvWsConfig.mma_regs must be a multiple of 8 in 24..256, got {self.mma_regs!r}")
        if self.atomic_dq and self.block_m != 64:
            raise ValueError(f"DkdvWsConfig.atomic_dq needs block_m=64 (dS as one wgmma's 64 rows beside dK and dV), "
                             f"got {self.block_m!r}")
        if self.stages < 2:
            raise ValueError(f"DkdvWsConfig.stages must be >= 2, got {self.stages!r}")
        _check_consumers(self, self.consumers)
        if self.consumers == 1 and self.mma_regs != 232:
            raise ValueError(f"DkdvWsConfig.mma_regs applies to two consumers (one consumer is the default "
                             f"partition and takes what the producer leaves), got {self.mma_regs} with consumers=1")
        if self.consumers == 2 and 2 * self.mma_regs + self.load_regs > 504:
            raise ValueError(f"DkdvWsConfig: 2 * mma_regs + load_regs must be <= 504 (3 warpgroups of 168 registers "
                             f"per thread; the first consumer gets the rest), got {self.mma_regs} and {self.load_regs}")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """K and V tiles, plus the ring of query and output-gradient tiles (and of the
        tiles' lse and delta, fp32, where ``stats_in_smem``; and two fp32 staging tiles of
        dQ's share per consumer and dS's transpose where ``atomic_dq``)."""
        stats = self.stages * 2 * self.block_m * 4 if self.stats_in_smem else 0
        # atomic_dq: the staging tiles, and the scratch of the layout conversion that transposes
        # dS (every consumer's keys x block_m, 16-bit; ptxas-measured within 1 KB at D 128)
        staging = (2 * self.consumers * self.block_m * min(64, head_dim) * 4
                   + block_size * self.block_m * element_bytes) if self.atomic_dq else 0
        if self.shared_ds:  # half of D per consumer's staging tile; two dSᵀ tiles, no transpose scratch
            staging = 2 * self.consumers * self.block_m * (head_dim // 2) * 4 + 2 * block_size * self.block_m * element_bytes
        barriers = 8 if self.persistent else 0  # kv_free
        return ((2 * block_size + 2 * self.stages * self.block_m) * head_dim * element_bytes + stats + staging
                + barriers + 1024)


@dataclasses.dataclass(frozen=True)
class _RowWalkConfig:
    """Launch parameters of a row-walking kernel (forward, dQ): ``block_m`` query rows per
    program (16 per consumer warp), ``block_n`` key rows per step, ``stages`` of K / V
    tiles in flight, the producer warp's ``load_regs``; ``consumers`` 2 (block_m 128): two
    consumer warpgroups with half the rows each, each synchronizing only itself before
    its barrier arrivals (the forward: only the persistent kernel)."""

    block_m: int = 128
    block_n: int = 64
    stages: int = 2
    load_regs: int = 40
    consumers: int = 1
    _QUERY_TILES = 1  # query-side tiles held in shared memory (Q; dQ also dO)

    def __post_init__(self):
        name = type(self).__name__
        if self.block_m not in (64, 128) or self.block_n not in (32, 64, 128):
            raise ValueError(f"{name}.block_m must be 64 or 128 and block_n 32, 64 or 128, "
                             f"got {self.block_m!r}, {self.block_n!r}")
        if self.stages < 2:
            raise ValueError(f"{name}.stages must be >= 2, got {self.stages!r}")
        _check_consumers(self, self.consumers)
        if self.consumers == 2 and self.block_m != 128:
            raise ValueError(f"{name}.consumers=2 needs block_m=128 (a warpgroup each), got {self.block_m!r}")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """The query-side tiles, plus the ring of K and V tiles."""
        return (self._QUERY_TILES * self.block_m + 2 * self.stages * self.block_n) * head_dim * element_bytes + 1024


@dataclasses.dataclass(frozen=True)
class DqWsConfig(_RowWalkConfig):
    """The warp-specialized dQ kernel's launch parameters (see ``_RowWalkConfig``);
    ``overlap``: S and dP as asynchronous wgmma, P computed under dP's; ``host_descs``: the
    TMA descriptors (Q, K, V, dO) built on the host and passed in, instead of by every
    program on the device before its first load; ``balanced``: the programs launch in the
    order of :mod:`tilesparse.kernels.attention_launch_order` (long rows first) where the
    layout's row lengths make the grid's order end on a few long programs; ``delta``: each
    program computes its rows' delta = rowsum(dO · O) itself from O (its dO tile is in
    shared memory already) and writes it for the dK/dV kernel, which then runs after this
    one: the backward's separate delta kernel (a pass over O and dO) is gone;
    ``staged_stores``: dQ leaves through each consumer's own rows of the Q tile, idle once its
    walk is done, in 16-byte stores instead of the accumulator layout's 4-byte ones (the dK/dV
    kernel's epilogue took 4 µs that way against 1.5 staged)."""

    overlap: bool = False
    host_descs: bool = False
    balanced: bool = False
    delta: bool = False
    staged_stores: bool = False
    _QUERY_TILES = 2

    def __post_init__(self):
        super().__post_init__()
        check_bools(self, "overlap", "host_descs", "balanced", "delta", "staged_stores")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """As ``_RowWalkConfig``'s, plus the output's tile with ``delta``."""
        extra = self.block_m * head_dim * element_bytes if self.delta else 0
        return super().shared_bytes(block_size, head_dim, element_bytes) + extra


@dataclasses.dataclass(frozen=True)
class FwdWsConfig(_RowWalkConfig):
    """The warp-specialized forward's launch parameters (see ``_RowWalkConfig``);
    ``persistent``: one program per SM walks many query tiles, its producer loading the
    next tile's Q (double-buffered) and K / V under the current one's tail
    (:mod:`tilesparse.kernels.attention_ws_persistent`); ``overlap`` (persistent only):
    each key tile's softmax runs under the previous tile's P V wgmma; ``consumers`` 2
    (persistent, block_m 128): two consumer warpgroups, each with half the rows, not held
    in step with each other; ``balanced`` (persistent; ignored by the one-tile kernel): the
    programs take the tiles of a schedule balanced by row length
    (:mod:`tilesparse.kernels.attention_schedule`) where the round-robin's rows differ
    enough, not a round-robin; ``staged_stores`` (persistent): each tile's O leaves through the
    consumer's rows of its Q buffer, idle after the tile's last S wgmma, in 16-byte stores
    instead of the accumulator layout's 4-byte ones, before the buffer is released."""

    block_n: int = 128
    persistent: bool = False
    overlap: bool = False
    balanced: bool = True
    staged_stores: bool = False

    def __post_init__(self):
        super().__post_init__()
        check_bools(self, "persistent", "overlap", "balanced", "staged_stores")
        if self.staged_stores and not self.persistent:
            raise ValueError("FwdWsConfig.staged_stores needs persistent=True (only the persistent kernel has it)")
        if self.overlap and not self.persistent:
            raise ValueError("FwdWsConfig.overlap needs persistent=True (only the persistent kernel has it)")
        if self.consumers == 2 and not self.persistent:
            raise ValueError("FwdWsConfig.consumers=2 needs persistent=True (the one-tile forward has one consumer)")

    def shared_bytes(self, block_size: int, head_dim: int, element_bytes: int = 2) -> int:
        """As ``_RowWalkConfig``'s, plus the second Q buffer of the persistent kernel."""
        return super().shared_bytes(block_size, head_dim, element_bytes) + \
            self.persistent * self.block_m * head_dim * element_bytes


@functools.lru_cache(maxsize=None)
def _layouts(query_rows: int, key_rows: int, head_dim: int, dtype: torch.dtype):
    """(query-side, key-side) shared-memory layouts of [1, 1, rows, D] tiles (remembered:
    a launch asks every call)."""
    return _nvmma([1, 1, query_rows, head_dim], dtype), _nvmma([1, 1, key_rows, head_dim], dtype)


@gluon.jit
def _store_through(out_ptr, tile, buf, base_row, first_row, S, row_stride, D: gl.constexpr, KEYS: gl.constexpr,
                   num_warps: gl.constexpr):
    """Store ``tile`` ([KEYS, D]: sequence rows first_row.., rows past S dropped; a head's row
    r at ``out_ptr`` + (base_row + r) * ``row_stride``) through ``buf`` (idle shared memory of
    its shape and dtype): written in the tile's own layout, read back as 8 consecutive columns
    (16 bytes) per thread, whole rows per warp, and stored from there (the accumulator layout
    would store 4-byte pieces). D <= 256."""
    buf.store(tile)
    rows_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // (D // 8), D // 8],
                                                 warps_per_cta=[num_warps, 1], order=[1, 0])
    vals = buf.load(rows_layout)
    offs_n = first_row + gl.arange(0, KEYS, layout=gl.SliceLayout(1, rows_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, rows_layout))
    off = (base_row + offs_n.to(gl.int64))[:, None] * row_stride + offs_d[None, :]
    gl.store(out_ptr + off, vals, mask=(offs_n < S)[:, None] & (offs_d < D)[None, :])


@gluon.jit
def _grid_item(order_ptr, extent, ORDERED: gl.constexpr):
    """A program's (first, second) grid coordinates: its own, or (ORDERED: a 1-D grid) those
    of entry program_id(0) of the launch-order table, numbered second * ``extent`` + first
    (:mod:`tilesparse.kernels.attention_launch_order`)."""
    if ORDERED:
        item = gl.load(order_ptr + gl.program_id(0))
        return item % extent, item // extent
    else:
        return gl.program_id(0), gl.program_id(1)


@gluon.jit
def _row_ws_load(descs, bufs, bars, tables, sizes,
                 BS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, LOAD_DO: gl.constexpr,
                 ORDERED: gl.constexpr = False, o_desc=None, LOAD_O: gl.constexpr = False):
    """Producer (one warp) of the row walks (forward, dQ): the query tile's Q (and dO)
    once, then for each key block of the query block's CSR row, its K and V tiles.
    ORDERED (dQ): the program's tile from the launch-order table, ``tables[6]``. LOAD_O
    (dQ computing delta): after Q and dO, the output's tile by ``o_desc`` into ``bufs[4]``
    on barrier ``bars[3]``."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs = bufs[0], bufs[1], bufs[2], bufs[3]
    q_bar, ready_bars, empty_bars = bars[0], bars[1], bars[2]
    row_ptr_ptr, row_cols_ptr = tables[0], tables[1]
    H, GROUP, NB, L_HEADS = sizes[1], sizes[2], sizes[3], sizes[4]
    M_SPLIT: gl.constexpr = BS // BLOCK_M
    if ORDERED:
        pid, bh = _grid_item(tables[6], NB * M_SPLIT, True)
    else:
        pid = gl.program_id(0)
        bh = gl.program_id(1)
    qblk = pid // M_SPLIT
    bz = bh // H
    h = bh % H
    row0 = qblk * BS + (pid % M_SPLIT) * BLOCK_M
    if LOAD_DO:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [bz, h, row0, 0], q_bar, do_smem)
        if LOAD_O:
            mbarrier.expect(bars[3], o_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(o_desc, [bz, h, row0, 0], bars[3], bufs[4])
    else:
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bz, h, row0, 0], q_bar, q_smem)
    _row_kv_fill(0, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, ready_bars, empty_bars, row_ptr_ptr, row_cols_ptr,
                 GROUP, NB, L_HEADS, BS, BLOCK_N)


@gluon.jit
def _row_kv_fill(step, qblk, bz, h, k_desc, v_desc, k_bufs, v_bufs, ready_bars, empty_bars, row_ptr_ptr,
                 row_cols_ptr, GROUP, NB, L_HEADS, BS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Producer: the K and V tiles of query block ``qblk``'s CSR row (head ``h``), into
    the ring from its position ``step`` on; returns the position after them."""
    N_STEPS: gl.constexpr = BS // BLOCK_N
    step = gl.to_tensor(step)  # a literal 0 from the caller is a constexpr; the loop carries a tensor
    lh = h % L_HEADS
    start = gl.load(row_ptr_ptr + lh * NB + qblk)
    end = gl.load(row_ptr_ptr + lh * NB + qblk + 1)
    for t in range(start * N_STEPS, end * N_STEPS):
        kblk = gl.load(row_cols_ptr + t // N_STEPS)
        key0 = kblk * BS + (t % N_STEPS) * BLOCK_N
        _fill_stage(step, k_desc, [bz, h // GROUP, key0, 0], v_desc, [bz, h // GROUP, key0, 0], k_bufs, v_bufs,
                    ready_bars, empty_bars)
        step += 1
    return step


def check_dq_acc(q, cfg: DkdvWsConfig, dq_acc, ds) -> None:
    """The dK/dV launcher's dQ buffer: given exactly with ``cfg.atomic_dq``, not with a
    stored-dS workspace ``ds``, and a contiguous float32 tensor of q's shape."""
    if (dq_acc is not None) != cfg.atomic_dq:
        raise ValueError(f"cfg={cfg}: dq_acc must be given exactly when atomic_dq is set")
    if dq_acc is not None and ds is not None:
        raise ValueError("dq_acc and ds: dQ either added by reductions or read back from stored dS, not both")
    if dq_acc is not None and not (dq_acc.dtype == torch.float32 and dq_acc.is_contiguous()
                                   and dq_acc.shape == q.shape):
        raise ValueError(f"dq_acc must be a contiguous float32 tensor of q's shape {tuple(q.shape)}, got "
                         f"{dq_acc.dtype} {tuple(dq_acc.shape)}")
