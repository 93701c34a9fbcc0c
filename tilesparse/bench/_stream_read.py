"""The read-only stream kernel of :mod:`tilesparse.bench.stream_reference`."""

import triton
import triton.language as tl


@triton.jit
def stream_read(src, sink, n, BLOCK: tl.constexpr):
    """Read BLOCK int32 words of ``src`` per program (int64 offsets) and store their xor
    to ``sink[program]``, so that the loads cannot be dropped."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(src + offs, mask=offs < n, other=0)
    tl.store(sink + tl.program_id(0), tl.xor_sum(words, axis=0))
