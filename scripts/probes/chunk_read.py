"""What bandwidth does a read reach when it takes the buffer in runs of C bytes in random order?

The b 16 kernels read a weight stored block by block (512 B per bf16 block). How long a
run of consecutive stored bytes one request stream takes depends on the kernel and on the
storage order: a deep panel's fprop reads ~1 KB per block-row per step at density 0.5, its
bprop ~2 KB, the one-block-row kernels whole block-rows. If HBM's rate falls with the
run length, that sets those kernels' floor, whatever their pipelining. This probe reads a
151 MB buffer (rotated past L2, CUDA-graph replay) in runs of C bytes visited in a random
permutation, each program loading ``--per-program`` bytes (all of its runs in one load,
so they are in flight together), and reports GB/s per run length. ``C`` = the whole buffer's
order (``--sequential``) is the plain read.

    python scripts/probes/chunk_read.py [--runs 256 512 1024 2048 4096 16384] [--out F]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

from tilesparse.bench.env import clock_state, l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies


@triton.jit
def _chunk_read(src, perm, sink, RUNS: tl.constexpr, WORDS: tl.constexpr):
    """Program p: the xor of runs perm[p*RUNS : (p+1)*RUNS] of src, WORDS int32 each."""
    pid = tl.program_id(0).to(tl.int64)
    runs = tl.load(perm + pid * RUNS + tl.arange(0, RUNS)).to(tl.int64)
    offs = runs[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
    words = tl.load(src + offs)
    tl.store(sink + pid, tl.xor_sum(tl.xor_sum(words, axis=1), axis=0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=151.0)
    p.add_argument("--runs", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 16384])
    p.add_argument("--per-program", type=int, default=16384, help="bytes per program")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    print(clock_state(), flush=True)
    n_words = int(args.mb * 1e6) // args.per_program * args.per_program // 4
    sets = rotation_copies(n_words * 4, l2_cache_bytes())
    srcs = [torch.randint(-2**31, 2**31 - 1, (n_words,), dtype=torch.int32, device="cuda") for _ in range(sets)]
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for run in args.runs:
        words = run // 4
        n_runs = n_words // words
        per = args.per_program // run
        for order in ("random", "sequential"):
            perm = (torch.randperm(n_runs, generator=gen) if order == "random" else torch.arange(n_runs))
            perm = perm.to(torch.int32).cuda()
            sink = torch.empty(n_runs // per, dtype=torch.int32, device="cuda")
            calls = [lambda s=s: _chunk_read[(n_runs // per,)](s, perm, sink, RUNS=per, WORDS=words, num_warps=8)
                     for s in srcs]
            ms = bench_ms(lambda: [c() for c in calls], cuda=True, graph=True) / len(calls)
            row = {"run_bytes": run, "order": order, "bytes": n_words * 4, "us": ms * 1e3,
                   "gbs": n_words * 4 / ms / 1e6}
            rows.append(row)
            print(f"run {run:6d} B {order:10s} {row['us']:8.1f} us {row['gbs']:7.0f} GB/s", flush=True)
    print(clock_state(), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
