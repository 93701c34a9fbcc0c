"""TMA (bulk tensor) reductions from shared memory for Gluon kernels on Hopper:
``cp.reduce.async.bulk.tensor`` adds a shared-memory tile into global memory through a
tensor descriptor, elementwise, without the issuing threads holding the values or the
addresses in registers.

Why: triton 3.6's Gluon builder has the operation (``create_async_tma_reduce``, the one
Triton's own ``desc.atomic_add`` lowers to) but its Hopper ``tma`` module exposes only
the copies. The warp-specialized attention backward adds each block pair's dQ share this
way when ``deterministic=False`` (:mod:`tilesparse.kernels.attention_ws_dkdv`); adds from
registers (``red.v4`` through inline PTX) ran at ~1.2 TB/s there and lost to recomputing
dQ (docs/performance.md, seventeenth session). Completion is tracked like a TMA store's:
:func:`triton.experimental.gluon.language.nvidia.hopper.tma.store_wait` before the
source tile is written again.
"""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin

__all__ = ["async_reduce_add"]


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Global ``tensor_desc[coord ...] += src`` (a shared-memory tile in the descriptor's
    block shape and layout), issued asynchronously; elements outside the tensor's bounds
    are dropped, as a TMA store drops them."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)
