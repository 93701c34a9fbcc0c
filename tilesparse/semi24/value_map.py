"""Repack a 2:4 weight for cuSPARSELt with one gather instead of a compression, while its
mask stays the same.

``torch._cslt_compress`` costs ~1.44 ms per 16384x4096 bf16 weight on an H200, and a
training step needs W and Wᵀ of every 2:4 weight again after each optimizer step: more
than the sparse products save (docs/performance.md). But between mask updates only the
kept *values* change; where cuSPARSELt puts each of them, and its metadata, depend on
the mask alone. So, once per mask, learn that placement without knowing cuSPARSELt's
(undocumented) layout: compress a matrix whose kept entries are distinct codes (a kept
entry's flat index in W, 14 bits per pass, written as normal, positive 16-bit floats),
read the codes back from the compressed buffer's value region, and keep the resulting
index map. Each step then packs with ``values = W.flatten()[index]`` next to a copy of the
metadata: a memory-bound gather, no masking pass either.

The map is trusted only after checks on the GPU it runs on: the value region decodes to
exactly the mask's kept entries (a permutation), every pass (one more than the digits
need, re-encoding the first digit with complemented codes, so their order reverses)
produced the same metadata and the same placement, and the codes survived the round
trip. torch allocates the compressed buffer in whole rows, so up to a row's worth of
trailing elements may be uninitialised: metadata differences there are ignored. Otherwise
:func:`build_value_map` returns None and the caller keeps ``_cslt_compress``.

On the H200 (torch 2.11, cuSPARSELt 0.8) the decoded placement was plain row-major: slot
i holds the operand's i-th kept entry, for every shape and mask tried. A shape whose
decoded map came out row-major is remembered, and its later masks are learned in one
compression: kept entries coded by their rank folded to 14 bits, every slot checked
against its rank's code, the metadata taken from that pass. A slot that disagrees sends
that shape back to full decoding. Such a map holds no index: it packs with a Triton
kernel that compacts each row's kept values straight from W and the mask
(:mod:`tilesparse.kernels.semi24_pack`), once that kernel has reproduced the coded value
region on this GPU (else it keeps the index, with a warning). Memory: one int32 (or int64) index per kept value
(for bf16 weights the weight's own size) and the metadata, per orientation; building a
map holds a few int64 temporaries per kept value for a moment.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from .._env import choice
from .packing import DEFAULT_PACKER, PACKERS

_BITS = 14  # code bits per pass
_DIGIT = (1 << _BITS) - 1
_OFFSET = 0x0400  # codes are OFFSET + digit: normal, positive, finite in fp16 and bf16 alike (up to 0x43FF)


def use_value_maps() -> bool:
    """On unless ``TILESPARSE_SEMI24_PACKER`` names another packer (``cslt``, ``tile``)."""
    return choice("TILESPARSE_SEMI24_PACKER", DEFAULT_PACKER, PACKERS) == "map"


@dataclass
class ValueMap:
    """cuSPARSELt's compressed buffer for one mask: its ``shape`` and dtype, the metadata
    ``meta`` (everything after the ``n_values`` value slots), and where each slot's value
    comes from: ``index`` (the flat index in W of each slot's value), or, for a verified
    row-major placement, no index but W's ``mask`` [n, k] itself (slot i holds the i-th
    kept entry of W⊙M, or of (W⊙M)ᵀ when ``transposed``)."""

    shape: tuple
    meta: torch.Tensor
    index: Optional[torch.Tensor]
    n_values: int
    mask: Optional[torch.Tensor] = None
    transposed: bool = False
    mask_version: int = 0  # the mask's version counter when learned (the metadata is a copy)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The compressed buffer of W⊙M (or (W⊙M)ᵀ) for this mask, from W itself."""
        if self.mask is not None and self.mask._version != self.mask_version:
            raise RuntimeError("the mask changed in place since this value map was learned: learn a new one")
        out = torch.empty(self.shape, dtype=self.meta.dtype, device=self.meta.device)
        flat = out.view(-1)
        flat[self.n_values:].copy_(self.meta)
        if self.index is None:
            pack_row_major(weight, self.mask, flat[: self.n_values], self.transposed)
        else:
            torch.index_select(weight.reshape(-1), 0, self.index, out=flat[: self.n_values])
        return out


def pack_row_major(weight: torch.Tensor, mask: torch.Tensor, out: torch.Tensor, transposed: bool) -> None:
    """The kept values of W⊙M (or (W⊙M)ᵀ) row by row into ``out``: the Triton kernel on
    the GPU (or under TRITON_INTERPRET=1), ``torch.masked_select`` elsewhere."""
    if weight.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        from ..kernels.semi24_pack import pack_kept_rows

        pack_kept_rows(weight, mask, out, transposed=transposed)
    else:
        from ..kernels.semi24_pack import pack_kept_rows_reference

        out.copy_(pack_kept_rows_reference(weight, mask, transposed=transposed))


def _same_meta(a: torch.Tensor, b: torch.Tensor, slack: int) -> bool:
    """Equal metadata, except within the last ``slack`` elements (a row's worth of
    allocation padding that torch leaves uninitialised)."""
    differ = (a.view(torch.int16) != b.view(torch.int16)).nonzero()
    return differ.numel() == 0 or int(differ[0]) >= a.numel() - slack


class ValueMapError(RuntimeError):
    """cuSPARSELt's placement could not be learned or verified; the message says which check failed."""


def build_value_map(mask: torch.Tensor, dtype: torch.dtype, *, transposed: bool = False,
                    compress=None) -> Optional[ValueMap]:
    """The value map of W⊙M (``transposed``: of (W⊙M)ᵀ) for W's mask [n, k], 2:4 along
    the rows of the compressed operand with exactly half kept. ``compress`` defaults to
    ``torch._cslt_compress``. None when the placement cannot be learned and verified
    (:func:`learn_value_map` says why)."""
    try:
        return learn_value_map(mask, dtype, transposed=transposed, compress=compress)
    except ValueMapError:
        return None


def learn_value_map(mask: torch.Tensor, dtype: torch.dtype, *, transposed: bool = False,
                    compress=None) -> ValueMap:
    """:func:`build_value_map`, raising :class:`ValueMapError` with the failed check."""
    compress = compress or torch._cslt_compress
    n, k = mask.shape
    operand = mask.t().contiguous() if transposed else mask
    rows, cols = operand.shape
    n_values = rows * cols // 2
    kept = operand.reshape(-1).nonzero().squeeze(1)  # flat positions in the operand
    if kept.numel() != n_values or n_values == 0:
        raise ValueMapError(f"the mask keeps {kept.numel()} of {rows * cols}, not exactly half: placement "
                            f"would depend on which zeros count as kept")
    src = (kept % n) * k + kept // n if transposed else kept  # their flat positions in W
    key = _shape_key(rows, cols, dtype, mask.device, compress)
    if _ROW_MAJOR.get(key):
        value_map = _row_major_map(operand, dtype, kept, src, n * k, compress, mask, transposed)
        if value_map is not None:
            return value_map
        _ROW_MAJOR[key] = False  # this mask broke the pattern: decode every mask of this shape from now on
    value_map = _decoded_map(operand, dtype, kept, src, n * k, compress)
    _ROW_MAJOR[key] = torch.equal(value_map.index.to(torch.int64), src)  # slot i holds the i-th kept entry
    return value_map


# (rows, cols, dtype, device, compress) -> whether a fully decoded map of that shape put the
# kept values in row-major order; the H200 with torch 2.11 did for every shape and mask
# tried (scripts/probes/value_map_structure.py)
_ROW_MAJOR: dict[tuple, bool] = {}


def _shape_key(rows, cols, dtype, device, compress) -> tuple:
    return rows, cols, dtype, str(device), compress


def _index(flat_positions: torch.Tensor, numel: int) -> torch.Tensor:
    """A map's gather index: int32 where W's flat positions fit, else int64."""
    return flat_positions.to(torch.int32) if numel < 2**31 else flat_positions


def _compress_codes(operand, kept, codes_of_kept, dtype, compress):
    """(codes, compressed buffer flattened, its shape): the operand-shaped matrix holding
    ``codes_of_kept`` (int16) at the kept entries, 0 elsewhere, compressed."""
    rows, cols = operand.shape
    codes = torch.zeros(rows * cols, dtype=torch.int16, device=operand.device)
    codes[kept] = codes_of_kept
    packed = compress(codes.view(dtype).view(rows, cols))
    return codes, packed.reshape(-1), tuple(packed.shape)


def learned_in_one_pass(rows: int, cols: int, dtype: torch.dtype, device: torch.device, compress=None) -> bool:
    """Whether a new mask for a [rows, cols] operand would be learned in one compression
    (a map of that shape already decoded row-major in this process)."""
    return bool(_ROW_MAJOR.get(_shape_key(rows, cols, dtype, device, compress or torch._cslt_compress)))


def _row_major_map(operand, dtype, kept, src, numel, compress, mask, transposed) -> Optional[ValueMap]:
    """The map in one compression, for a shape whose decoded placement was row-major:
    code every kept entry by its rank folded to 14 bits (every 14-bit digit XORed in, so
    a slot holding a rank that differs only above bit 14 shows too, unless the digits
    cancel), check that slot i came back with rank i's code, and take the metadata from
    that pass. None if a slot disagrees.
    The map packs through :func:`pack_row_major` (no index) once that has reproduced the
    coded value region here; otherwise it keeps an index."""
    rows, cols = operand.shape
    n_values = kept.numel()
    ranks = torch.arange(n_values, dtype=torch.int64, device=operand.device)
    folded = (ranks ^ (ranks >> _BITS) ^ (ranks >> (2 * _BITS)) ^ (ranks >> (3 * _BITS))) & _DIGIT
    expected = (folded + _OFFSET).to(torch.int16)
    codes, flat, shape = _compress_codes(operand, kept, expected, dtype, compress)
    if flat.numel() <= n_values or not torch.equal(flat[:n_values].view(torch.int16), expected):
        return None
    meta = flat[n_values:].clone()
    coded_w = codes.view(dtype).view(rows, cols)
    coded_w = coded_w.t() if transposed else coded_w  # W's orientation, as pack() receives it
    got = torch.empty(n_values, dtype=dtype, device=operand.device)
    try:
        pack_row_major(coded_w, mask, got, transposed)
        if torch.equal(got.view(torch.int16), expected):
            return ValueMap(shape=shape, meta=meta, index=None, n_values=n_values, mask=mask, transposed=transposed,
                            mask_version=mask._version)
        reason = "it did not reproduce the verified placement"
    except Exception as exc:  # a kernel that fails to build or run here: keep the gather
        reason = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"tilesparse: the row-major 2:4 packing kernel is not used ({reason}); packing by a "
                  f"gather index instead", stacklevel=4)
    return ValueMap(shape=shape, meta=meta, index=_index(src, numel), n_values=n_values)


def _decoded_map(operand, dtype, kept, src, numel, compress) -> ValueMap:
    """The map for any placement: the kept entries' flat indices in W written as codes, 14
    bits per compression, decoded from the value region, then verified."""
    rows = operand.shape[0]
    n_values = kept.numel()
    digits = max(1, math.ceil(math.log2(numel) / _BITS))
    decoded = torch.zeros(n_values, dtype=torch.int64, device=operand.device)
    first, meta, shape = None, None, None
    for step in range(digits + 1):
        check = step == digits  # digit 0 again, complemented
        digit = 0 if check else step
        part = (src >> (_BITS * digit)) & _DIGIT
        code = ((_DIGIT - part if check else part) + _OFFSET).to(torch.int16)
        _, flat, packed_shape = _compress_codes(operand, kept, code, dtype, compress)
        if flat.numel() <= n_values:
            raise ValueMapError(f"the compressed buffer has {flat.numel()} elements, no room for metadata after "
                                f"{n_values} values")
        values = flat[:n_values].view(torch.int16).to(torch.int64) - _OFFSET
        bad = ((values < 0) | (values > _DIGIT)).nonzero()
        if bad.numel():
            raise ValueMapError(f"pass {step}: {bad.numel()} value slots (first {int(bad[0])}) hold no code: the "
                                f"value region is not where it was read, or the codes were altered")
        if check:
            differ = (_DIGIT - values != first).nonzero()
            if differ.numel():
                raise ValueMapError(f"{differ.numel()} slots (first {int(differ[0])}) moved when the codes "
                                    f"changed: the placement depends on the values")
        else:
            decoded |= values << (_BITS * digit)
            first = values if step == 0 else first
        if meta is None:
            meta, shape = flat[n_values:].clone(), packed_shape
        elif meta.numel() != flat.numel() - n_values or not _same_meta(flat[n_values:], meta, rows):
            differ = (flat[n_values:].view(torch.int16) != meta.view(torch.int16)).nonzero()
            raise ValueMapError(f"pass {step}: {differ.numel()} metadata elements of {meta.numel()} (first "
                                f"{int(differ[0]) if differ.numel() else -1}) changed with the values")
    seen = torch.zeros(numel, dtype=torch.bool, device=operand.device)
    seen[decoded] = True  # a permutation of the kept entries: distinct, and every one of them
    if int(seen.sum()) != n_values or not bool(seen[src].all()):
        raise ValueMapError(f"the decoded slots name {int(seen.sum())} distinct entries of W, not the mask's "
                            f"{n_values} kept ones")
    return ValueMap(shape=shape, meta=meta, index=_index(decoded, numel), n_values=n_values)


def maps_for(mask: torch.Tensor, dtype: torch.dtype, want_t: bool, compress=None):
    """(map of W⊙M, map of (W⊙M)ᵀ or None) for a [n, k] mask, or None if W's cannot be
    built; a failed transpose map leaves its slot None (the caller compresses Wᵀ)."""
    forward = build_value_map(mask, dtype, compress=compress)
    if forward is None:
        return None
    backward = build_value_map(mask, dtype, transposed=True, compress=compress) if want_t else None
    return forward, backward
