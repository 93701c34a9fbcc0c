"""AttentionLayout: which (query block, key block) pairs of an S x S attention matrix
are computed, per head or shared by all heads, and the packed tables the kernels walk.

A layout is a bool block mask ``[H, nb, nb]`` (one per head) or ``[nb, nb]`` (shared),
nb = ceil(S / b), plus the block size b. Storage is row-major over (head, query block,
key block), the order of ``mask.nonzero()``.

The kernels take the tables in one packed int32 tensor, ``meta`` (see
:func:`attention_table_views`), of ``2 * (L * nb + 1) + 2 * nnz`` entries for L layout
heads, so memory is O(L * nb + nnz), never O(S^2):

    row_ptr  [L*nb + 1]  CSR: key blocks of (head l, query block m) are
                         row_cols[row_ptr[l*nb + m] : row_ptr[l*nb + m + 1]]
    col_ptr  [L*nb + 1]  CSC: query blocks of (head l, key block n) are
                         col_rows[col_ptr[l*nb + n] : col_ptr[l*nb + n + 1]]
    row_cols [nnz]       key block of each block, (head, query block) order
    col_rows [nnz]       query block of each block, (head, key block) order

The forward and dQ kernels walk the CSR half, the dK/dV kernel the CSC half, so the
backward needs no transposition on the fly. With ``causal=True`` the tables hold only the
blocks on or below the diagonal (blocks above it contribute nothing), so the kernels
never visit them.
"""

from __future__ import annotations

import torch

from .._counts import check_count
from ..layout import cache_device, check_mask_values

__all__ = ["AttentionLayout", "attention_table_views", "attention_meta_nnz"]


def attention_meta_nnz(meta: torch.Tensor, layout_heads: int, num_blocks: int) -> int:
    """Number of blocks in a packed ``meta`` (from its length; no device access)."""
    return (meta.numel() - 2 * (layout_heads * num_blocks + 1)) // 2


def attention_table_views(meta: torch.Tensor, layout_heads: int, num_blocks: int):
    """(row_ptr, col_ptr, row_cols, col_rows): views into a packed ``meta``."""
    n_ptr = layout_heads * num_blocks + 1
    nnz = attention_meta_nnz(meta, layout_heads, num_blocks)
    return (meta.narrow(0, 0, n_ptr), meta.narrow(0, n_ptr, n_ptr),
            meta.narrow(0, 2 * n_ptr, nnz), meta.narrow(0, 2 * n_ptr + nnz, nnz))


def _build_meta(mask: torch.Tensor) -> torch.Tensor:
    """Packed tables of a bool mask [L, nb, nb] (on the mask's device)."""
    L, nb, _ = mask.shape
    zero = torch.zeros(1, dtype=torch.long, device=mask.device)
    row_ptr = torch.cat([zero, mask.sum(dim=2).flatten().cumsum(0)])
    maskT = mask.transpose(1, 2)
    col_ptr = torch.cat([zero, maskT.sum(dim=2).flatten().cumsum(0)])
    row_cols = mask.nonzero()[:, 2]
    col_rows = maskT.nonzero()[:, 2]
    return torch.cat([row_ptr, col_ptr, row_cols, col_rows]).to(torch.int32)


class AttentionLayout:
    """A block-sparse attention pattern: the (query block, key block) pairs computed.

    Args:
        mask: bool (or 0/1 integer) tensor ``[H, nb, nb]`` (one pattern per head) or
            ``[nb, nb]`` (shared by all heads); True marks a computed block.
        block_size: b, the side of a block in tokens (16, 32, 64 or 128 for the kernels).
        seq_len: optional S the pattern was built for (nb must be ceil(S / b)); the
            builders set it, and :func:`tilesparse.attention.block_sparse_attention`
            checks it against the inputs when given.

    Attributes:
        mask ([L, nb, nb] bool, on the CPU), block_size, seq_len, layout_heads (L: 1 when
        shared), shared, num_blocks (nb), nnz, density.
    """

    def __init__(self, mask: torch.Tensor, block_size: int, seq_len: int | None = None):
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dim() not in (2, 3) or mask.shape[-1] != mask.shape[-2]:
            raise ValueError(f"mask must be [H, nb, nb] or [nb, nb] (square per head), got shape "
                             f"{tuple(mask.shape)}")
        check_mask_values(mask)
        block_size = check_count("block_size", block_size, 1)
        nb = mask.shape[-1]
        if seq_len is not None:
            seq_len = check_count("seq_len", seq_len, 1)
            if -(-seq_len // block_size) != nb:
                raise ValueError(f"mask has {nb} blocks per side but seq_len={seq_len} with "
                                 f"block_size={block_size} needs ceil(S/b)={-(-seq_len // block_size)}")
        self.shared = mask.dim() == 2
        self.mask = (mask.unsqueeze(0) if self.shared else mask).to(device="cpu", dtype=torch.bool).contiguous()
        self.block_size = block_size
        self.seq_len = seq_len
        self._meta: dict[tuple[torch.device, bool], torch.Tensor] = {}
        # The CPU tables and whether the pattern is dense are settled now, so a
        # torch.compile trace only looks them up.
        self._is_dense: dict[bool, bool] = {}
        for causal in (False, True):
            self.meta_on("cpu", causal)
            self.is_dense(causal)

    @property
    def layout_heads(self) -> int:
        """L: 1 for a pattern shared by all heads, else the number of heads."""
        return self.mask.shape[0]

    @property
    def num_blocks(self) -> int:
        """nb: blocks per side (ceil(S / b))."""
        return self.mask.shape[-1]

    @property
    def nnz(self) -> int:
        """Number of computed blocks, over all layout heads (without causal trimming)."""
        return attention_meta_nnz(self._meta[(torch.device("cpu"), False)], self.layout_heads, self.num_blocks)

    @property
    def density(self) -> float:
        """Fraction of the L * nb * nb blocks that are computed."""
        return self.nnz / max(1, self.mask.numel())

    def block_mask(self, causal: bool = False) -> torch.Tensor:
        """The [L, nb, nb] bool mask, lower-triangular in blocks when ``causal``."""
        if not causal:
            return self.mask
        return self.mask & torch.ones(self.num_blocks, self.num_blocks, dtype=torch.bool).tril()

    def is_dense(self, causal: bool = False) -> bool:
        """Whether every block is computed (with ``causal``, every block on or below the
        diagonal): the pattern is plain full (or causal) attention, which
        :func:`~tilesparse.attention.block_sparse_attention` may hand to SDPA's fused
        kernels. Computed at construction (and cached); False for a layout constructed
        inside a torch.compile trace (its kernels run)."""
        cache = getattr(self, "_is_dense", None)  # set in __init__; absent on objects unpickled from older versions
        key = bool(causal)
        if (cache is None or key not in cache) and torch.compiler.is_compiling():
            return False  # a layout built inside a compiled region: reading its mask there is data-dependent
        if cache is None:
            cache = self._is_dense = {}
        if key not in cache:
            expected = torch.ones(self.num_blocks, self.num_blocks, dtype=torch.bool)
            cache[key] = bool(torch.equal(self.block_mask(key), (expected.tril() if key else expected).expand_as(
                self.mask)))
        return cache[key]

    def meta_on(self, device, causal: bool = False) -> torch.Tensor:
        """The packed int32 tables on ``device`` (blocks above the diagonal dropped when
        ``causal``), built once per (device, causal) and cached."""
        device = cache_device(device)
        key = (device, bool(causal))
        meta = self._meta.get(key)
        if meta is None:
            cpu = self._meta.get((torch.device("cpu"), bool(causal)))
            meta = cpu.to(device) if cpu is not None else _build_meta(self.block_mask(causal))
            self._meta[key] = meta
        return meta

    def has_tables(self, device, causal: bool = False) -> bool:
        """Whether ``meta_on(device, causal)`` is built already (no host work left)."""
        return (cache_device(device), bool(causal)) in self._meta

    def tables(self, causal: bool = False) -> tuple[torch.Tensor, ...]:
        """(row_ptr, col_ptr, row_cols, col_rows) on the CPU, as views of ``meta_on``."""
        return attention_table_views(self.meta_on("cpu", causal), self.layout_heads, self.num_blocks)

    def __eq__(self, other) -> bool:
        if not isinstance(other, AttentionLayout):
            return NotImplemented
        return (self.block_size == other.block_size and self.shared == other.shared
                and self.mask.shape == other.mask.shape and bool(torch.equal(self.mask, other.mask)))

    __hash__ = None  # holds tensors: not hashable

    def __repr__(self) -> str:
        heads = "shared" if self.shared else f"heads={self.layout_heads}"
        return (f"AttentionLayout(num_blocks={self.num_blocks}, block_size={self.block_size}, {heads}, "
                f"seq_len={self.seq_len}, nnz={self.nnz}, density={self.density:.3f})")
