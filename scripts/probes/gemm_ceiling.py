"""What rate can a Triton GEMM mainloop reach on this GPU, and what does block-sparse
indexing cost on top of it?

Times, at X [M, K] @ W[N, K]^T (bf16), in one process: cuBLAS; a plain Triton GEMM with
device-built descriptors at several tile shapes; and the same plain GEMM with the
reduction walking a column-index table (the dds access pattern on a full layout).
Not part of the library: a diagnostic for docs/performance.md.

    python scripts/probes/gemm_ceiling.py --shape 8192x4096x4096
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
import triton.testing

from tilesparse.kernels._tiles import grouped_tile
from tilesparse.kernels.bsmm_tma import ensure_allocator


@triton.jit
def _gemm(a_ptr, w_ptr, c_ptr, idx_ptr, M, N, K,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, INDEXED: tl.constexpr,
          GROUP_M: tl.constexpr, WS: tl.constexpr):
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [K, 1], [BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
        if INDEXED:  # k-block from a table, as dds reads it
            k = tl.load(idx_ptr + t) * BK
        else:
            k = t * BK
        a = a_desc.load([pid_m * BM, k])
        w = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, w.T, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x4096x4096")
    args = p.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    ensure_allocator()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * m * n * k
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731
    dense = bench(lambda: x @ w.t())
    ref = (x @ w.t()).float()
    print(f"cuBLAS {dense:.4f} ms {flops / dense / 1e9:.0f} TFLOP/s")
    for bm, bn, bk, warps, stages in [(128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3),
                                      (256, 128, 64, 8, 3), (128, 128, 128, 4, 3), (128, 256, 64, 8, 4)]:
        for indexed in (False, True):
            for ws in (False, True):
                idx = torch.arange(triton.cdiv(k, bk), device="cuda", dtype=torch.int32)
                c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

                def run():
                    _gemm[grid](x, w, c, idx, m, n, k, BM=bm, BN=bn, BK=bk, INDEXED=indexed, GROUP_M=8, WS=ws,
                                num_warps=warps, num_stages=stages)
                try:
                    run()
                    err = ((c.float() - ref).norm() / ref.norm()).item()
                    ms = bench(run)
                except Exception as exc:  # noqa: BLE001
                    print(f"{bm}x{bn}x{bk} w{warps} s{stages} indexed={indexed} ws={ws}: {type(exc).__name__}")
                    continue
                print(f"{bm}x{bn}x{bk} w{warps} s{stages} indexed={int(indexed)} ws={int(ws)}: {ms:.4f} ms "
                      f"{flops / ms / 1e9:.0f} TFLOP/s {dense / ms:.2f} of cuBLAS (err {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
