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
index map. Each step then packs with ``values = W.flatten()[index]`` into a copy of the
template (metadata included): a memory-bound gather, no masking pass either.

The map is trusted only after checks on the GPU it runs on: the value region decodes to
exactly the mask's kept entries (a permutation), every pass (one more than the digits
need, re-encoding the first digit with other codes) produced the same metadata and the
same placement, and the codes survived the round trip. Otherwise :func:`build_value_map` returns None and
the caller keeps ``_cslt_compress``. Memory: one int32 (or int64) index per kept value:
for bf16 weights the same bytes as the weight itself, per orientation.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

_BITS = 14  # code bits per pass
_OFFSET = 0x0400  # codes are OFFSET + digit: normal, positive, finite in fp16 and bf16 alike
_CHECK_OFFSET = 0x0800  # a last pass re-encodes digit 0 with other codes (and values): same answer


def use_value_maps() -> bool:
    """On unless ``TILESPARSE_SEMI24_PACKER`` names another packer (``cslt``, ``tile``)."""
    return os.environ.get("TILESPARSE_SEMI24_PACKER", "map") == "map"


@dataclass
class ValueMap:
    """cuSPARSELt's compressed buffer for one mask: ``template`` (values region, then
    metadata) and ``index`` (for each value slot, the flat index in W of its value)."""

    template: torch.Tensor
    index: torch.Tensor
    n_values: int

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The compressed buffer of W⊙M (or (W⊙M)ᵀ) for this mask, from W itself."""
        out = self.template.clone()
        flat = out.view(-1)
        torch.index_select(weight.reshape(-1), 0, self.index, out=flat[: self.n_values])
        return out


def _codes(n_elements: int, kept: torch.Tensor, src: torch.Tensor, digit: int, dtype: torch.dtype,
           offset: int) -> torch.Tensor:
    code = torch.zeros(n_elements, dtype=torch.int16, device=kept.device)
    code[kept] = (((src >> (_BITS * digit)) & ((1 << _BITS) - 1)) + offset).to(torch.int16)
    return code.view(dtype)


def build_value_map(mask: torch.Tensor, source_index: torch.Tensor, dtype: torch.dtype,
                    compress=None) -> Optional[ValueMap]:
    """The value map of the sparse operand whose kept entries are ``mask`` ([rows, cols],
    2:4 along cols, exactly half kept). ``source_index`` [rows, cols] gives each entry's
    flat index in W (``arange(W.numel()).view(W.shape)`` for W, its transpose for Wᵀ).
    ``compress`` defaults to ``torch._cslt_compress``. None when the placement cannot be
    learned and verified."""
    compress = compress or torch._cslt_compress
    rows, cols = mask.shape
    n_values = rows * cols // 2
    kept = mask.reshape(-1).nonzero().squeeze(1)
    if kept.numel() != n_values or n_values == 0:
        return None  # not exactly 2 of every 4: placement would depend on which zeros are "kept"
    src = source_index.reshape(-1)[kept].to(torch.int64)
    top = int(src.max()) + 1
    digits = max(1, math.ceil(math.log2(top) / _BITS)) if top > 1 else 1
    decoded = torch.zeros(n_values, dtype=torch.int64, device=mask.device)
    template, first_digit = None, None
    for step in range(digits + 1):
        digit, offset = (step, _OFFSET) if step < digits else (0, _CHECK_OFFSET)
        packed = compress(_codes(rows * cols, kept, src, digit, dtype, offset).view(rows, cols))
        flat = packed.reshape(-1)
        if flat.numel() <= n_values:
            return None
        values = flat[:n_values].view(torch.int16).to(torch.int64) - offset
        if bool(((values < 0) | (values >= (1 << _BITS))).any()):
            return None  # the value region is not where we read it, or codes were altered
        if step < digits:
            decoded |= values << (_BITS * digit)
            first_digit = values if step == 0 else first_digit
        elif not torch.equal(values, first_digit):
            return None  # other codes, other placement: the placement depends on the values
        meta = flat[n_values:]
        if template is None:
            template = packed
        elif not torch.equal(meta.view(torch.int16), template.reshape(-1)[n_values:].view(torch.int16)):
            return None  # metadata must depend on the mask only
    if not torch.equal(torch.sort(decoded).values, torch.sort(src).values):
        return None
    index = decoded.to(torch.int32) if top < 2**31 else decoded
    return ValueMap(template=template, index=index, n_values=n_values)


def maps_for(mask: torch.Tensor, dtype: torch.dtype, want_t: bool, compress=None):
    """(map of W⊙M, map of (W⊙M)ᵀ or None) for a [n, k] mask, or None if W's cannot be
    built; a failed transpose map leaves its slot None (the caller compresses Wᵀ)."""
    n, k = mask.shape
    index = torch.arange(n * k, device=mask.device).view(n, k)
    forward = build_value_map(mask, index, dtype, compress)
    if forward is None:
        return None
    backward = build_value_map(mask.t(), index.t(), dtype, compress) if want_t else None
    return forward, backward
