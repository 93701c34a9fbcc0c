"""How many bytes per second can the SMs take in when part of them comes from L2?

Issue 4's small-batch kernels stream the weight from HBM once, but every stored block
also brings an activation tile [M, b] that lives in L2 (at b 16 and 32-64 rows,
1-2 KB per 512 B block, shared by the blocks of a union entry). If the SMs' intake from
L2 (HBM bytes plus L2 hits) has a ceiling near HBM's rate, that activation traffic is
not free and sets the b 16 kernels' floor. This probe times a read kernel that takes
BLOCK int32 words per program from a buffer larger than L2 (the "weight", rotated as the
suite rotates its operands) and ``ratio`` x as many from a small L2-resident buffer
(the "activations"), under CUDA-graph replay:

- ``hbm_gbs``: the weight's bytes over the time (the number the suite's goal counts);
- ``intake_gbs``: all bytes read over the time.

Rows with ``hbm_mb`` 0 read only the small buffer: the plain L2 read rate.

    python scripts/probes/l2_ingest.py [--hbm-mb 151] [--l2-mb 1 4 16] [--ratios 0 0.5 1 2 4] [--out F]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

from tilesparse.bench.env import clock_state, l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies

BLOCK = 4096  # int32 words per load (16 KB)


@triton.jit
def _mixed_read(big, small, sink, n_small_blocks, HAS_BIG: tl.constexpr, SMALL_NUM: tl.constexpr,
                SMALL_DEN: tl.constexpr, BLOCK: tl.constexpr):
    """Program p: xor of big's p-th BLOCK (if HAS_BIG) and, if p % SMALL_DEN < SMALL_NUM
    (SMALL_NUM <= SMALL_DEN) or always SMALL_NUM // SMALL_DEN blocks, of small's blocks
    at a stride that walks all of it: ``SMALL_NUM / SMALL_DEN`` small blocks per big one."""
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    if HAS_BIG:
        acc ^= tl.load(big + pid * BLOCK + offs)
    if SMALL_NUM >= SMALL_DEN:
        for r in tl.static_range(SMALL_NUM // SMALL_DEN):
            s = (pid * (SMALL_NUM // SMALL_DEN) + r) % n_small_blocks
            acc ^= tl.load(small + s * BLOCK + offs)
    else:
        if pid % SMALL_DEN < SMALL_NUM:
            s = pid % n_small_blocks
            acc ^= tl.load(small + s * BLOCK + offs)
    tl.store(sink + pid, tl.xor_sum(acc, axis=0))


def _ratio(r: float) -> tuple[int, int]:
    if r >= 1:
        assert r == int(r), "ratios >= 1 must be whole"
        return int(r), 1
    den = round(1 / r)
    assert abs(1 / den - r) < 1e-9, "ratios < 1 must be 1/n"
    return 1, den


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hbm-mb", type=float, default=151.0)
    p.add_argument("--l2-mb", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    p.add_argument("--ratios", type=float, nargs="+", default=[0, 0.5, 1, 2, 4])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    print(clock_state(), flush=True)
    n_big_blocks = int(args.hbm_mb * 1e6) // (BLOCK * 4)
    sets = rotation_copies(n_big_blocks * BLOCK * 4, l2_cache_bytes())
    bigs = [torch.randint(-2**31, 2**31 - 1, (n_big_blocks * BLOCK,), dtype=torch.int32, device="cuda")
            for _ in range(sets)]
    rows = []
    for l2_mb in args.l2_mb:
        n_small_blocks = max(1, int(l2_mb * 1e6) // (BLOCK * 4))
        small = torch.randint(-2**31, 2**31 - 1, (n_small_blocks * BLOCK,), dtype=torch.int32, device="cuda")
        sink = torch.empty(n_big_blocks * 4, dtype=torch.int32, device="cuda")
        cases = [(True, r) for r in args.ratios] + [(False, 1.0)]
        for has_big, ratio in cases:
            num, den = _ratio(ratio) if ratio > 0 else (0, 1)
            # the small-only rows read as many small blocks as the big buffer has
            grid = (n_big_blocks,)

            def call(big, num=num, den=den, has_big=has_big):
                _mixed_read[grid](big, small, sink, n_small_blocks, HAS_BIG=has_big, SMALL_NUM=num,
                                  SMALL_DEN=den, BLOCK=BLOCK, num_warps=8)

            calls = [lambda b=b: call(b) for b in (bigs if has_big else bigs[:1])]
            ms = bench_ms(lambda: [c() for c in calls], cuda=True, graph=True) / len(calls)
            big_bytes = n_big_blocks * BLOCK * 4 if has_big else 0
            small_bytes = n_big_blocks * BLOCK * 4 * num // den
            row = {"hbm_mb": big_bytes / 1e6, "l2_mb": l2_mb, "ratio": ratio if has_big else None,
                   "us": ms * 1e3, "hbm_gbs": big_bytes / ms / 1e6,
                   "intake_gbs": (big_bytes + small_bytes) / ms / 1e6}
            rows.append(row)
            print(f"L2 buffer {l2_mb:5.1f} MB  hbm {row['hbm_mb']:6.0f} MB  ratio {str(row['ratio']):5s}"
                  f"  {row['us']:8.1f} us  hbm {row['hbm_gbs']:6.0f} GB/s  intake {row['intake_gbs']:6.0f} GB/s",
                  flush=True)
    print(clock_state(), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "block_words": BLOCK, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
