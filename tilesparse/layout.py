"""BlockLayout: which b x b blocks of a [rows, cols] matrix are stored, and the
lookup tables the kernels walk.

Storage order is row-major over blocks (block-row, then block-col), the order of
``mask.nonzero()``. A block-sparse matrix is a pair (values [nnz, b, b], layout):
block ``i`` of ``values`` covers rows ``coords[i, 0] * b ...`` and columns
``coords[i, 1] * b ...`` of the dense matrix.

The kernels take every table in one packed int32 tensor, ``meta`` (see
:func:`split_meta`), so that a registered op has one tensor argument for the
layout and backward needs no copies: the row table serves ``A @ S^T`` and the
column table ``A @ S``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ._counts import check_count

__all__ = ["BlockLayout", "LayoutTables", "split_meta", "table_views", "meta_numel", "coords_with_nnz", "longest_runs",
           "block_counts"]


@dataclass(frozen=True)
class LayoutTables:
    """Named views into a packed ``meta`` tensor (all int32).

    row_ptr  [R+1]  CSR offsets: blocks of block-row r are storage slots row_ptr[r]:row_ptr[r+1]
    row_cols [nnz]  block-col of each stored block (storage order)
    row_of   [nnz]  block-row of each stored block (storage order)
    col_ptr  [C+1]  CSC offsets into the column-ordered lists below
    col_rows [nnz]  block-row of each block, column-major order
    col_slot [nnz]  storage slot of each block, column-major order
    """

    row_ptr: torch.Tensor
    row_cols: torch.Tensor
    row_of: torch.Tensor
    col_ptr: torch.Tensor
    col_rows: torch.Tensor
    col_slot: torch.Tensor


def meta_numel(block_rows: int, block_cols: int, nnz: int) -> int:
    """Length of the packed ``meta`` tensor for a layout of this size."""
    return (block_rows + 1) + (block_cols + 1) + 4 * nnz


def split_meta(meta: torch.Tensor, block_rows: int, block_cols: int) -> LayoutTables:
    """Slice a packed ``meta`` tensor into its tables (views, no copies)."""
    return LayoutTables(*table_views(meta, block_rows, block_cols, *_TABLE_ORDER))


_TABLE_ORDER = ("row_ptr", "row_cols", "row_of", "col_ptr", "col_rows", "col_slot")


def table_views(meta: torch.Tensor, block_rows: int, block_cols: int, *names: str) -> list[torch.Tensor]:
    """Just the named tables of a packed ``meta`` (cheaper than :func:`split_meta` on a
    launch path: one ``narrow`` per table). The views are remembered on the ``meta``
    tensor object itself (layout tables are never written after they are built), so a
    launcher pays for them once per layout, not once per call."""
    cache = meta.__dict__.setdefault("_tilesparse_table_views", {})
    key = (block_rows, block_cols, names)
    views = cache.get(key)
    if views is None:
        nnz = (meta.numel() - block_rows - block_cols - 2) // 4
        sizes = dict(zip(_TABLE_ORDER, (block_rows + 1, nnz, nnz, block_cols + 1, nnz, nnz)))
        offsets, start = {}, 0
        for name in _TABLE_ORDER:
            offsets[name] = start
            start += sizes[name]
        views = cache[key] = [meta.narrow(0, offsets[name], sizes[name]) for name in names]
    return views


def _build_meta(mask: torch.Tensor) -> torch.Tensor:
    """Build the packed tables from a bool mask, on the mask's device (``nonzero`` syncs
    with the host once to learn nnz; see :func:`_build_meta_with_nnz` for the sync-free
    path when nnz is known). The longest block-row and block-column are learned in the
    same go (one more small sync) with every block-row's and block-column's count, and
    remembered on the tensor: :func:`longest_runs`, :func:`block_counts`."""
    meta = _build_meta_with_nnz(mask, mask.nonzero())
    if mask.numel() and not torch.compiler.is_compiling():  # dynamo cannot trace a tensor's __dict__
        sums = torch.cat([mask.sum(dim=1), mask.sum(dim=0)]).tolist()
        counts = (tuple(sums[:mask.shape[0]]), tuple(sums[mask.shape[0]:]))
        _remember_runs(meta, (max(counts[0]), max(counts[1])), counts)
    return meta


_LONGEST_RUNS = "_tilesparse_longest_runs"
_BLOCK_COUNTS = "_tilesparse_block_counts"


def _remember_runs(meta: torch.Tensor, runs: tuple[int, int] | None, counts: tuple | None = None) -> None:
    if runs is not None and not torch.compiler.is_compiling():
        meta.__dict__[_LONGEST_RUNS] = runs
    if counts is not None and not torch.compiler.is_compiling():
        meta.__dict__[_BLOCK_COUNTS] = counts


def longest_runs(meta: torch.Tensor) -> tuple[int, int] | None:
    """(blocks in the longest block-row, in the longest block-column) of a packed ``meta``
    built by :class:`BlockLayout` from its mask, or None where they were not learned: tables
    built without a host sync (:meth:`BlockLayout.from_mask_with_nnz` unless given them),
    built inside ``torch.compile`` tracing, or a ``meta`` tensor copied by other means
    (``clone``). The small-batch kernel cuts long runs in chunks when a layout is skewed
    (``tilesparse.kernels.bsmm_small.auto_chunks``); where the runs are unknown it keeps
    them whole, so such a layout's small-batch products may differ in the last bits
    from one whose runs are known."""
    return meta.__dict__.get(_LONGEST_RUNS)


def block_counts(meta: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(blocks in each block-row, blocks in each block-column) of a packed ``meta``, known
    where :func:`longest_runs` is learned from the mask (None otherwise, and for tables
    given their runs without the mask's counts). The Hopper kernel's balanced tile
    schedule (``tilesparse.kernels.ws_schedule``) weighs each output tile by them."""
    return meta.__dict__.get(_BLOCK_COUNTS)


def coords_with_nnz(mask: torch.Tensor, nnz: int) -> torch.Tensor:
    """``mask.nonzero()`` for a mask known to hold exactly ``nnz`` True entries, without a
    host sync: a stable argsort of ``~mask`` puts the True entries first, in row-major
    order, and the first ``nnz`` are kept (``nonzero`` must sync to learn its output
    size; here the size is given). ``nnz`` is trusted, not checked (checking would sync)."""
    flat = (~mask.to(torch.bool)).flatten().to(torch.uint8)
    idx = torch.argsort(flat, stable=True)[:nnz]
    n_cols = mask.shape[1]
    return torch.stack([idx // n_cols, idx % n_cols], dim=1)


def _build_meta_with_nnz(mask: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """:func:`_build_meta` given the coords (so nothing in it syncs with the host)."""
    rows, cols = coords[:, 0], coords[:, 1]
    zero = torch.zeros(1, dtype=torch.long, device=mask.device)
    row_ptr = torch.cat([zero, mask.sum(dim=1).cumsum(0)])
    col_ptr = torch.cat([zero, mask.sum(dim=0).cumsum(0)])
    col_slot = torch.argsort(cols * mask.shape[0] + rows, stable=True)
    col_rows = rows[col_slot]
    return torch.cat([row_ptr, cols, rows, col_ptr, col_rows, col_slot]).to(torch.int32)


def cache_device(device) -> torch.device:
    """``device`` as a key of the per-device table caches: a bare "cuda" names the
    current CUDA device, so "cuda" and "cuda:0" share one entry."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_mask_values(mask: torch.Tensor) -> None:
    """A block mask must be bool, or integer holding only 0 and 1."""
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            raise TypeError(f"mask must be bool or integer 0/1, got {mask.dtype}")
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("mask must hold only 0 and 1")


class BlockLayout:
    """Which ``block_size`` x ``block_size`` blocks of a matrix are nonzero.

    Args:
        mask: bool (or 0/1) tensor [rows / b, cols / b]; True marks a stored block.
        block_size: b, the side of a square block (>= 1).

    Attributes:
        block_size, shape (rows, cols in elements), mask, nnz, density, coords [nnz, 2].
    """

    def __init__(self, mask: torch.Tensor, block_size: int):
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dim() != 2:
            raise ValueError(f"mask must be 2-D [block_rows, block_cols], got shape {tuple(mask.shape)}")
        check_mask_values(mask)
        # a copy: the layout's count, coords and tables are learned from the mask at different times, so a
        # caller's later edit of its own tensor would leave them disagreeing (tables naming blocks that the
        # values do not hold)
        self.mask = mask.to(torch.bool, copy=True).contiguous()
        self.block_size = check_count("block_size", block_size, 1)
        self._meta_by_device: dict[torch.device, torch.Tensor] = {}
        self._coords: torch.Tensor | None = None
        self._nnz: int | None = None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_coords(cls, coords, block_rows: int, block_cols: int, block_size: int) -> "BlockLayout":
        """Build from (block-row, block-col) pairs. Storage order is always row-major:
        values for this layout must follow ``layout.coords``, not the input order."""
        block_rows = check_count("block_rows", block_rows)
        block_cols = check_count("block_cols", block_cols)
        given = torch.as_tensor(coords)
        if given.numel() and (given.is_floating_point() or given.is_complex() or given.dtype == torch.bool):
            raise TypeError(f"coords must hold integer block indices, got dtype {given.dtype}")
        coords = given.to(torch.long)
        if coords.numel() == 0:
            coords = coords.reshape(0, 2)
        if coords.dim() != 2 or coords.shape[1] != 2:
            raise ValueError(f"coords must be [nnz, 2], got shape {tuple(coords.shape)}")
        if coords.numel() and (
            coords.min() < 0 or coords[:, 0].max() >= block_rows or coords[:, 1].max() >= block_cols
        ):
            raise ValueError(f"coords out of range for a {block_rows}x{block_cols} block grid")
        mask = torch.zeros(block_rows, block_cols, dtype=torch.bool, device=coords.device)
        mask[coords[:, 0], coords[:, 1]] = True
        if int(mask.sum()) != coords.shape[0]:
            raise ValueError("coords contain duplicate blocks")
        return cls(mask, block_size)

    @classmethod
    def from_mask_with_nnz(cls, mask: torch.Tensor, block_size: int, nnz: int,
                           runs: tuple[int, int] | None = None) -> "BlockLayout":
        """A layout from a bool ``mask`` known to hold exactly ``nnz`` blocks, with its
        coords and packed tables built on the mask's device without a host sync (for
        rewiring a layout on the GPU every few steps, where nnz is fixed). Equal to
        ``BlockLayout(mask, block_size)`` except that the longest block-row and
        block-column (:func:`longest_runs`) are unknown unless given as ``runs``
        (learning them would sync). ``nnz`` is checked on the device (``torch._assert_async``:
        on the CPU a RuntimeError, on a GPU a device-side assert instead of tables that point
        past the weight's blocks); ``runs`` is trusted."""
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool, got {mask.dtype}")
        if isinstance(nnz, bool) or not isinstance(nnz, numbers.Integral) or not 0 <= nnz <= mask.numel():
            raise ValueError(f"nnz must be an int in [0, {mask.numel()}], got {nnz!r}")
        nnz = int(nnz)
        torch._assert_async(mask.sum() == nnz, f"from_mask_with_nnz: the mask does not hold nnz={nnz} blocks")
        layout = cls(mask, block_size)
        coords = coords_with_nnz(layout.mask, nnz)
        layout._nnz = nnz
        layout._coords = coords
        device = cache_device(layout.mask.device)
        meta = layout._meta_by_device[device] = _build_meta_with_nnz(layout.mask, coords)
        _remember_runs(meta, runs)
        return layout

    @classmethod
    def dense(cls, rows: int, cols: int, block_size: int, device=None) -> "BlockLayout":
        """A full layout (every block stored)."""
        check_divisible(rows, cols, block_size)
        return cls(torch.ones(rows // block_size, cols // block_size, dtype=torch.bool, device=device), block_size)

    # ----------------------------------------------------------------- properties
    @property
    def block_rows(self) -> int:
        """Number of block-rows (rows / block_size)."""
        return self.mask.shape[0]

    @property
    def block_cols(self) -> int:
        """Number of block-columns (cols / block_size)."""
        return self.mask.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the matrix in elements."""
        return (self.block_rows * self.block_size, self.block_cols * self.block_size)

    @property
    def device(self) -> torch.device:
        """The mask's device (tables may also be cached on others: meta_on)."""
        return self.mask.device

    @property
    def nnz(self) -> int:
        """Number of stored blocks (one host sync the first time, unless known at construction)."""
        if self._nnz is None:
            self._nnz = int(self.mask.sum())
        return self._nnz

    @property
    def density(self) -> float:
        """Fraction of blocks stored, nnz / (block_rows * block_cols)."""
        total = self.mask.numel()
        return self.nnz / total if total else 0.0

    @property
    def coords(self) -> torch.Tensor:
        """[nnz, 2] int64 (block-row, block-col) of each stored block, in storage order."""
        if self._coords is None:
            self._coords = self.mask.nonzero()
        return self._coords

    @property
    def meta(self) -> torch.Tensor:
        """Packed int32 lookup tables on the layout's device (built once, cached)."""
        return self.meta_on(self.device)

    def meta_on(self, device) -> torch.Tensor:
        """The packed tables on ``device``, built once per device and cached (with the
        longest runs, :func:`longest_runs`, where they are known)."""
        meta = self._meta_by_device.get(device)  # a tensor's own (indexed) device: no normalizing
        if meta is not None:
            return meta
        device = cache_device(device)
        meta = self._meta_by_device.get(device)
        if meta is None:
            source = next(iter(self._meta_by_device.values()), None)
            if source is None:
                meta = _build_meta(self.mask.to(device))
            else:
                meta = source.to(device)
                _remember_runs(meta, longest_runs(source), block_counts(source))
            self._meta_by_device[device] = meta
        return meta

    @property
    def tables(self) -> LayoutTables:
        """The packed tables as named views (LayoutTables) on the layout's device."""
        return split_meta(self.meta, self.block_rows, self.block_cols)

    # ----------------------------------------------------------------- transforms
    def to(self, device) -> "BlockLayout":
        """The same layout on another device (tables are rebuilt there lazily)."""
        device = torch.device(device)
        if device == self.device:
            return self
        moved = BlockLayout(self.mask.to(device), self.block_size)
        moved._nnz = self._nnz
        moved._meta_by_device = self._meta_by_device  # share the per-device cache
        return moved

    def transpose(self) -> "BlockLayout":
        """Layout of the transposed matrix. Its storage order differs: the values of W^T are
        :meth:`transposed_values` of W's."""
        return BlockLayout(self.mask.t(), self.block_size)

    def transposed_values(self, values: torch.Tensor) -> torch.Tensor:
        """W^T's blocks in :meth:`transpose`'s storage order, from W's ``values`` [nnz, b, b]
        on this layout (each block transposed; a contiguous copy)."""
        b = self.block_size
        if not isinstance(values, torch.Tensor) or values.shape != (self.nnz, b, b):
            raise ValueError(f"values must have shape {(self.nnz, b, b)}, got "
                             f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}")
        return values[self.tables.col_slot.to(values.device).long()].transpose(1, 2).contiguous()

    def to_dense(self, values: torch.Tensor) -> torch.Tensor:
        """Scatter ``values`` [nnz, b, b] into a dense [rows, cols] tensor (for tests and
        inspection; the kernels never do this)."""
        b = self.block_size
        if values.shape != (self.nnz, b, b):
            raise ValueError(f"values must have shape {(self.nnz, b, b)}, got {tuple(values.shape)}")
        dense = values.new_zeros(self.block_rows, self.block_cols, b, b)
        coords = self.coords.to(values.device)
        dense[coords[:, 0], coords[:, 1]] = values
        return dense.permute(0, 2, 1, 3).reshape(self.shape)

    def gather(self, dense: torch.Tensor) -> torch.Tensor:
        """The stored blocks of a dense [rows, cols] tensor, as values [nnz, b, b]."""
        if tuple(dense.shape) != self.shape:
            raise ValueError(f"dense must have shape {self.shape}, got {tuple(dense.shape)}")
        b = self.block_size
        blocks = dense.reshape(self.block_rows, b, self.block_cols, b).permute(0, 2, 1, 3)
        coords = self.coords.to(dense.device)
        return blocks[coords[:, 0], coords[:, 1]].contiguous()

    # ----------------------------------------------------------------- comparisons
    def __eq__(self, other) -> bool:
        if not isinstance(other, BlockLayout):
            return NotImplemented
        return (
            self.block_size == other.block_size
            and self.mask.shape == other.mask.shape
            and bool(torch.equal(self.mask.cpu(), other.mask.cpu()))
        )

    __hash__ = None  # mutable tensors inside: not hashable

    def __repr__(self) -> str:
        rows, cols = self.shape
        return (
            f"BlockLayout(shape=({rows}, {cols}), block_size={self.block_size}, "
            f"nnz={self.nnz}, density={self.density:.3f}, device={self.device})"
        )


def check_divisible(rows: int, cols: int, block_size: int) -> None:
    """rows and cols non-negative ints, block_size a positive one dividing both."""
    check_count("block_size", block_size, minimum=1)
    for name, value in (("rows", rows), ("cols", cols)):
        check_count(name, value)
        if value % block_size:
            raise ValueError(f"{name}={value} is not divisible by block_size={block_size}")
