"""SASS of the FMA kernel's main loop (``kernels/bsmm_gemv.py``) against a form with one
2-D accumulator per activation row (rows unrolled, a tuple of [sub, block_k] tiles) instead
of the shipped 3-D [rows, sub, block_k] one, b 16 fprop, compiled for sm_90 on the CPU.

The thirty-fourth session's plan was to drop the 3-D broadcast's shared-memory layout
conversions (2-6 barriers a step) this way. The per-row form has no barriers but more
instructions per step at every row count (per-row masked loads and addresses), so it
was never timed: ``python scripts/probes/gemv_rows_sass.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sm90_compile_check as check  # noqa: E402  (the scripts folder's)
from sm90_cases import TARGET, bf16_signature  # noqa: E402
from ptxas_report import loop_report  # noqa: E402
from tilesparse.kernels import bsmm_gemv  # noqa: E402


@triton.jit
def _add_rows(acc, w, a_ptr, cols, stride_am, stride_ak, ok, M, M_PAD: tl.constexpr):
    out = ()
    for r in tl.static_range(M_PAD):
        x = tl.load(a_ptr + r * stride_am + cols * stride_ak, mask=ok & (r < M), other=0.0)
        out = out + (acc[r] + w * x.to(tl.float32)[None, :],)
    return out


@triton.jit
def _dds_gemv_rows_kernel(a_ptr, v_ptr, c_ptr, ptr_ptr, idx_ptr, M, stride_am, stride_ak, stride_cm, stride_cn,
                          B: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, M_PAD: tl.constexpr):
    """fprop, BLOCK_K a multiple of B: each step takes BLOCK_K // B consecutive entries of
    the block-row's table (no prefetch: the count is of the arithmetic, not the loads ahead)."""
    SUBS: tl.constexpr = B // SUB
    STEP: tl.constexpr = BLOCK_K // B
    pid = tl.program_id(0)
    j = pid // SUBS
    offs_f = (pid % SUBS) * SUB + tl.arange(0, SUB)
    lanes = tl.arange(0, BLOCK_K)
    start = tl.load(ptr_ptr + j)
    end = tl.load(ptr_ptr + j + 1)
    acc = ()
    for r in tl.static_range(M_PAD):
        acc = acc + (tl.zeros((SUB, BLOCK_K), dtype=tl.float32),)
    for t in range(start, end, STEP):
        e = t + lanes // B
        ok = e < end
        blk = tl.load(idx_ptr + e, mask=ok, other=0).to(tl.int64)
        w = tl.load(v_ptr + e.to(tl.int64)[None, :] * (B * B) + offs_f[:, None] * B + (lanes % B)[None, :],
                    mask=ok[None, :], other=0.0).to(tl.float32)
        acc = _add_rows(acc, w, a_ptr, blk * B + lanes % B, stride_am, stride_ak, ok, M, M_PAD)
    cols = j.to(tl.int64) * B + offs_f
    for r in tl.static_range(M_PAD):
        tl.store(c_ptr + r * stride_cm + cols * stride_cn, tl.sum(acc[r], axis=1).to(c_ptr.dtype.element_ty),
                 mask=r < M)


def _loop(fn, const: dict) -> str:
    sig, aligned = bf16_signature(fn, const, ("ptr_ptr", "idx_ptr", "slot_ptr"))
    compiled = triton.compile(ASTSource(fn, sig, const, aligned), target=TARGET,
                              options={"num_warps": 4, "num_stages": 1})
    return loop_report(check._sass(compiled.asm["cubin"]))


def main() -> None:
    for m_pad, block_k in ((1, 128), (2, 64), (4, 64), (8, 32), (8, 64)):
        shipped = dict(B=16, TILE_B=16, SUB=16, BLOCK_K=block_k, M_PAD=m_pad, TRANS_V=True, HAS_SLOT=False,
                       HAS_BIAS=False, REDUCE_EACH_STEP=False, stride_ak=1, stride_cn=1, PDL=0)
        rows = dict(B=16, SUB=16, BLOCK_K=block_k, M_PAD=m_pad, stride_ak=1, stride_cn=1)
        print(f"M {m_pad}, {block_k}-wide steps: 3-D accumulator {_loop(bsmm_gemv._dds_gemv_kernel, shipped)}")
        print(f"M {m_pad}, {block_k}-wide steps: one per row    {_loop(_dds_gemv_rows_kernel, rows)}")


if __name__ == "__main__":
    main()
