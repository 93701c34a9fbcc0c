"""Where does the small kernel's time go on a random layout, against a balanced one? (issue 4, density 0.1)

A balanced layout (every block-row the same count) streams 1.17x faster than a random one of the same
density at b 128, M 1 (9.42 against 11.01 µs on the H200, ``...-small-rows-ab-14eed8b.json``), and every
attempt to even the random layout's programs out has lost (bins, chunks, longest first, row groups). This
times a copy of the small kernel's fprop loop (one block-row slice per program, one block per step, the
heuristic's config at M 1: 32-wide slices, 8 stages, 2 warps) that records, per program, the GPU's
nanosecond timer at its start and end and the SM it ran on. Launches are replayed from a CUDA graph over
weight copies rotated past L2 (as the suite times); the stamps of a launch in the middle of the sequence
are summarised: the kernel's span, when programs start (the ramp) and end (the tail), how long a
program takes against its blocks, how busy each SM is, and how many programs run over time.

    python scripts/probes/small_timeline.py --out small_timeline.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

import tilesparse as ts
from tilesparse.bench.env import l2_cache_bytes
from tilesparse.bench.timing import bench_ms, rotation_copies
from tilesparse.kernels import bsmm as K
from tilesparse.layout import table_views


@triton.jit
def _now(dummy):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _sm(dummy):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dummy], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _stamped_fprop(a_ptr, v_ptr, c_ptr, ptr_ptr, idx_ptr, stamp_ptr, M, stride_am, stride_cm,
                   B: tl.constexpr, SUB: tl.constexpr, BLOCK_M: tl.constexpr, STAMPS: tl.constexpr):
    """The small kernel's fprop (C[m, j*B + s*SUB + f] = sum_e V[e][s*SUB + f, :] . A[m, idx e block]), one
    block per step; STAMPS: row pid of stamp_ptr gets (start ns, end ns, SM, blocks)."""
    one = tl.full([1], 0, tl.int32)
    if STAMPS:
        t0 = _now(one)
    SUBS: tl.constexpr = B // SUB
    pid = tl.program_id(0)
    j = pid // SUBS
    s = pid % SUBS
    offs_m = tl.arange(0, BLOCK_M)
    offs_f = s * SUB + tl.arange(0, SUB)
    offs_k = tl.arange(0, B)
    m_ok = offs_m < M
    start = tl.load(ptr_ptr + j)
    end = tl.load(ptr_ptr + j + 1)
    acc = tl.zeros((SUB, BLOCK_M), dtype=tl.float32)
    for e in range(start, end):
        blk = tl.load(idx_ptr + e).to(tl.int64)
        w = tl.load(v_ptr + e.to(tl.int64) * (B * B) + offs_f[:, None] * B + offs_k[None, :])
        x = tl.load(a_ptr + offs_m[None, :] * stride_am + (blk * B + offs_k)[:, None], mask=m_ok[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
    cols = j.to(tl.int64) * B + offs_f
    tl.store(c_ptr + offs_m[None, :] * stride_cm + cols[:, None], acc.to(c_ptr.dtype.element_ty), mask=m_ok[None, :])
    if STAMPS:
        t1 = _now(one)
        sm = _sm(one)
        row = stamp_ptr + pid * 4 + tl.arange(0, 1)
        tl.store(row, t0)
        tl.store(row + 1, t1)
        tl.store(row + 2, sm.to(tl.int64))
        tl.store(row + 3, (end - start).to(tl.int64) + tl.zeros([1], tl.int64))


def summarise(stamps: torch.Tensor) -> dict:
    """The timeline of one launch's programs (rows of start, end, SM, blocks; ns)."""
    st = stamps.cpu().double()
    t0 = st[:, 0].min()
    start, end, sm, blocks = st[:, 0] - t0, st[:, 1] - t0, st[:, 2].long(), st[:, 3]
    dur = end - start
    span = float(end.max())
    ends = end.sort().values
    n = len(ends)
    per_sm = {}
    for i in range(n):
        per_sm.setdefault(int(sm[i]), []).append((float(start[i]), float(end[i]), float(blocks[i])))
    sm_last = [max(e for _, e, _ in v) for v in per_sm.values()]
    sm_blocks = [sum(b for _, _, b in v) for v in per_sm.values()]
    # programs running over time, sampled every 0.25 µs
    grid = torch.arange(0, span + 250, 250, dtype=torch.float64)
    running = ((start[None, :] <= grid[:, None]) & (end[None, :] > grid[:, None])).sum(1)
    ns_per_block = (dur / blocks.clamp(min=1))
    return {
        "programs": n, "span_us": span / 1e3,
        "start_us": {"p50": float(start.median()) / 1e3, "max": float(start.max()) / 1e3},
        "end_us": {"p10": float(ends[n // 10]) / 1e3, "p50": float(ends[n // 2]) / 1e3,
                   "p90": float(ends[9 * n // 10]) / 1e3, "max": span / 1e3},
        "program_us": {"min": float(dur.min()) / 1e3, "p50": float(dur.median()) / 1e3, "max": float(dur.max()) / 1e3},
        "blocks": {"min": float(blocks.min()), "mean": float(blocks.mean()), "max": float(blocks.max())},
        "ns_per_block_p50": float(ns_per_block.median()),
        "corr_duration_blocks": float(torch.corrcoef(torch.stack([dur, blocks]))[0, 1]),
        "sms_used": len(per_sm), "programs_per_sm_max": max(len(v) for v in per_sm.values()),
        "sm_last_end_us": {"min": min(sm_last) / 1e3, "p50": statistics.median(sm_last) / 1e3,
                           "max": max(sm_last) / 1e3},
        "sm_blocks": {"min": min(sm_blocks), "mean": statistics.mean(sm_blocks), "max": max(sm_blocks)},
        "running_every_250ns": running.tolist(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--weight", type=int, default=12288)
    p.add_argument("--blocks", type=int, nargs="+", default=[128])
    p.add_argument("--densities", type=float, nargs="+", default=[0.1])
    p.add_argument("--configs", nargs="+", default=["32,8,2"], help="sub,stages,warps")
    p.add_argument("--out", default="small_timeline.json")
    args = p.parse_args()
    n = k = args.weight
    dev, dt = torch.device("cuda"), torch.bfloat16
    results = []
    x = torch.randn(1, k, device=dev, dtype=dt)
    for b in args.blocks:
        for d in args.densities:
            for kind in ("random", "balanced"):
                layout = getattr(ts.layouts, kind)(n, k, b, d, seed=0, device=dev)
                meta, R, C = layout.meta, layout.block_rows, layout.block_cols
                ptr, idx = table_views(meta, R, C, "row_ptr", "row_cols")
                nbytes = layout.nnz * b * b * 2
                copies = max(3, rotation_copies(nbytes, l2_cache_bytes()))
                values = [torch.randn(layout.nnz, b, b, device=dev, dtype=dt) for _ in range(copies)]
                auto_us = bench_ms(lambda: [K.dds(x, v, meta, None, R, C, True) for v in values], cuda=True,
                                   graph=True, rep_ms=30) / copies * 1e3
                for spec in args.configs:
                    sub, stages, warps = map(int, spec.split(","))
                    programs = R * (b // sub)
                    c = torch.empty(1, n, device=dev, dtype=dt)
                    stamps = torch.zeros(copies, programs, 4, dtype=torch.int64, device=dev)

                    def run(stamped: bool):
                        for i, v in enumerate(values):
                            _stamped_fprop[(programs,)](x, v, c, ptr, idx, stamps[i], 1, x.stride(0), c.stride(0),
                                                        B=b, SUB=sub, BLOCK_M=16, STAMPS=stamped,
                                                        num_warps=warps, num_stages=stages)

                    run(False)
                    ref = K.dds(x, values[-1], meta, None, R, C, True).float()
                    err = ((c.float() - ref).norm() / ref.norm()).item()
                    plain_us = bench_ms(lambda: run(False), cuda=True, graph=True, rep_ms=30) / copies * 1e3
                    stamped_us = bench_ms(lambda: run(True), cuda=True, graph=True, rep_ms=30) / copies * 1e3
                    graph = torch.cuda.CUDAGraph()
                    run(True)
                    torch.cuda.synchronize()
                    with torch.cuda.graph(graph):
                        run(True)
                    for _ in range(3):
                        graph.replay()
                    torch.cuda.synchronize()
                    middle = summarise(stamps[copies // 2])
                    row = {"block": b, "density": d, "layout": kind, "config": spec, "auto_us": auto_us,
                           "copy_us": plain_us, "stamped_us": stamped_us, "rel_err": err, "timeline": middle}
                    results.append(row)
                    tl_ = middle
                    print(f"b{b} d{d} {kind:8} sub,stages,warps {spec}: auto {auto_us:.2f} us, copy {plain_us:.2f}, "
                          f"stamped {stamped_us:.2f} (err {err:.1e}); span {tl_['span_us']:.2f}, starts p50/max "
                          f"{tl_['start_us']['p50']:.2f}/{tl_['start_us']['max']:.2f}, ends p10/p50/p90/max "
                          f"{tl_['end_us']['p10']:.2f}/{tl_['end_us']['p50']:.2f}/{tl_['end_us']['p90']:.2f}/"
                          f"{tl_['end_us']['max']:.2f}; program us min/p50/max {tl_['program_us']['min']:.2f}/"
                          f"{tl_['program_us']['p50']:.2f}/{tl_['program_us']['max']:.2f}, blocks "
                          f"{tl_['blocks']['min']:.0f}/{tl_['blocks']['mean']:.1f}/{tl_['blocks']['max']:.0f}, "
                          f"ns/block {tl_['ns_per_block_p50']:.0f}, corr {tl_['corr_duration_blocks']:.2f}; "
                          f"SMs {tl_['sms_used']} (max {tl_['programs_per_sm_max']} programs), SM last end "
                          f"{tl_['sm_last_end_us']['min']:.2f}/{tl_['sm_last_end_us']['p50']:.2f}/"
                          f"{tl_['sm_last_end_us']['max']:.2f}, SM blocks {tl_['sm_blocks']['min']:.0f}/"
                          f"{tl_['sm_blocks']['mean']:.1f}/{tl_['sm_blocks']['max']:.0f}", flush=True)
                    print("   running (every 0.25 us):", " ".join(map(str, tl_["running_every_250ns"])), flush=True)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "weight": n, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
