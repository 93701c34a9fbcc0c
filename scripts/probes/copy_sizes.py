"""What bandwidth does a plain copy (or a plain read) reach at the small suite's sizes?

The small suite judges a kernel moving B bytes against the 1 GiB copy bandwidth; its
``copy`` rows time a copy of the same B bytes. This probe times, for traffic sizes from
4 MB to 2 GiB, under CUDA-graph replay with buffers rotated past L2 (as the suite times
its rows) and with do_bench (L2 flushed, host launches):

- ``memcpy``: ``dst.copy_(src)`` (cudaMemcpyAsync; inside a graph a memcpy node, which
  the driver may hand to a copy engine rather than the SMs);
- ``elementwise``: ``torch.bitwise_or(src, 0, out=dst)`` on int32 views, an SM kernel;
- ``triton_copy`` / ``triton_read``: a Triton kernel copying, or only reading (one
  int32 written per program), BLOCK int32s per program.

Traffic counts bytes read plus bytes written (the read kernel: read only).

    python scripts/probes/copy_sizes.py [--mb 4 9 15 30 60 151 302 2048] [--out F]
"""
import argparse
import json

import torch
import triton
import triton.language as tl

from tilesparse.bench._stream_read import stream_read  # the small suite's read reference
from tilesparse.bench.env import clock_state, l2_cache_bytes
from tilesparse.bench.stream_reference import READ_BLOCK
from tilesparse.bench.timing import bench_ms, rotation_copies


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


BLOCK = READ_BLOCK


def methods(src: torch.Tensor, dst: torch.Tensor, sink: torch.Tensor) -> dict:
    n = src.numel()
    grid = (triton.cdiv(n, BLOCK),)
    return {
        "memcpy": lambda: dst.copy_(src),
        "elementwise": lambda: torch.bitwise_or(src, 0, out=dst),
        "triton_copy": lambda: _copy[grid](src, dst, n, BLOCK=BLOCK, num_warps=8),
        "triton_read": lambda: stream_read[grid](src, sink, n, BLOCK=BLOCK, num_warps=8),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, nargs="+", default=[4, 9, 15, 30, 60, 151, 302, 2048])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    print(clock_state(), flush=True)
    for mb in args.mb:
        # the copy's traffic is 2 x its buffer; the read's is 1 x: size both buffers so that
        # each moves mb MB
        for name in ("memcpy", "elementwise", "triton_copy", "triton_read"):
            per = 2 if name != "triton_read" else 1
            n = max(1, int(mb * 1e6 / per) // 4)
            sets = rotation_copies(n * 4 * per, l2_cache_bytes())
            bufs = [(torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda"),
                     torch.empty(n if per == 2 else 1, dtype=torch.int32, device="cuda"),  # the read writes no copy
                     torch.empty(triton.cdiv(n, BLOCK), dtype=torch.int32, device="cuda")) for _ in range(sets)]
            calls = [methods(*b)[name] for b in bufs]
            graph_ms = bench_ms(lambda: [c() for c in calls], cuda=True, graph=True) / sets
            plain_ms = bench_ms(calls[0], cuda=True)
            nbytes = n * 4 * per
            row = {"mb": mb, "method": name, "bytes": nbytes, "sets": sets, "graph_us": graph_ms * 1e3,
                   "graph_gbs": nbytes / graph_ms / 1e6, "do_bench_us": plain_ms * 1e3,
                   "do_bench_gbs": nbytes / plain_ms / 1e6}
            src, dst, sink = bufs[0]
            if name in ("memcpy", "elementwise", "triton_copy"):
                assert torch.equal(dst, src)
            else:  # each program's xor of its BLOCK words
                padded = torch.zeros(sink.numel() * BLOCK, dtype=torch.int32, device="cuda")
                padded[:n] = src
                expected = padded.view(-1, BLOCK)[:, 0].clone()
                for i in range(1, BLOCK):
                    expected ^= padded.view(-1, BLOCK)[:, i]
                assert torch.equal(sink, expected)
            rows.append(row)
            print(f"{mb:7.0f} MB {name:12s} sets {sets:3d}  graph {row['graph_us']:9.1f} us "
                  f"{row['graph_gbs']:7.0f} GB/s   do_bench {row['do_bench_us']:9.1f} us {row['do_bench_gbs']:7.0f} GB/s",
                  flush=True)
            bufs = calls = None
            torch.cuda.empty_cache()
    print(clock_state(), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
