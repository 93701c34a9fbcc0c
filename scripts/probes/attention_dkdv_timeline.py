"""Where a warp-specialized dK/dV program's time goes: every program of one launch stamps
its SM and the GPU's global timer at its start, once its K and V are in, after its column
walk and after its stores (``launch_dkdv_ws(stamps=...)``), on the attention suite's
patterns (B 4, H 16, S 8192, D 128, blocks of 128, bf16), for the shipped modes: the
deterministic two-kernel dK/dV, ``deterministic=False``'s (dQ added by TMA reductions) and,
where the layout takes it, the ordered one.

Why: a model fitted to three layouts' kernel times (twenty-seventh session: local 1024,
strided, causal) gives ~2.7 µs per 64-row step and ~9 µs per program besides, 17 % of
local 1024's programs and 22 % of random 10 %'s; the persistent kernel meant to hide it
lost. The stamps say which part is the fixed cost: the loads before the first product, the
epilogue, or the gap before the SM's next program. Their answer (f6b8622): ~5 µs of ~45 on
local 1024, the epilogue 4 µs where dK / dV left in 4-byte stores (then ``ring_stores``). The
CUDA-event ``kernel_ms`` includes the launcher's host work; the stamps' span is the kernel's.

Read with care: the gaps and the busy share assume one program per SM at a time (true at D 128,
231 KB of shared memory; at D 64 two or three fit, and gaps can read negative), and "stored" is
when consumer 0 has issued its stores, not the program's end.

    python scripts/probes/attention_dkdv_timeline.py --patterns local1024 random10 --out timeline.json
"""

from __future__ import annotations

import statistics

import torch

from tilesparse.attention.layout import attention_table_views
from tilesparse.bench.attention import probe_inputs, probe_main
from tilesparse.kernels import attention as K
from tilesparse.kernels import attention_ws
from tilesparse.kernels._device import sm_count
from tilesparse.kernels._stamps import STAMP_COLUMNS
from tilesparse.kernels.attention_launch_order import launch_order
from tilesparse.kernels.attention_ordered_dq import launch_table_on


def _quantiles(values: list[float]) -> dict:
    """Median and 10th / 90th percentiles, µs."""
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"p10": round(q[0], 3), "median": round(statistics.median(values), 3), "p90": round(q[8], 3)}


def _program_steps(cfg, meta, layout_heads, nb, B, H, hkv, block_m, block) -> list[int]:
    """Each launched program's 64-row steps (its column's query tiles over the group's heads),
    in launch order, as the launcher orders the programs."""
    col_ptr = attention_table_views(meta, layout_heads, nb)[1].cpu().long()
    lengths = (col_ptr[1:] - col_ptr[:-1]).view(layout_heads, nb)
    group = H // hkv
    if cfg.ordered_dq:
        items = launch_table_on(meta, nb, B * hkv).cpu().long().tolist()
    else:
        order = None if not cfg.balanced else launch_order(meta, layout_heads, nb, "dkdv", B, H, hkv, 1,
                                                           sm_count(meta.device), head_major_long=cfg.atomic_dq)
        items = list(range(nb * B * hkv)) if order is None else order.cpu().long().tolist()
    steps = []
    for item in items:
        kblk, bhk = item % nb, item // nb
        heads = [(bhk % hkv) * group + g for g in range(group)]
        steps.append(int(sum(lengths[h % layout_heads, kblk] for h in heads)) * (block // block_m))
    return steps


def _timeline(stamps: torch.Tensor, steps: list[int]) -> dict:
    """The stamps' summary: per-program phases (µs), a linear fit of the walk against its
    steps, the gap between consecutive programs on one SM, and the SMs' busy share."""
    rows = stamps.cpu().tolist()
    sm = [r[0] for r in rows]
    start, kv_in, walked, stored = ([r[i] / 1e3 for r in rows] for i in (1, 2, 3, 4))
    walk = [b - a for a, b in zip(kv_in, walked)]
    n = len(rows)
    mean_s, mean_w = sum(steps) / n, sum(walk) / n
    var = sum((s - mean_s) ** 2 for s in steps)
    per_step = sum((s - mean_s) * (w - mean_w) for s, w in zip(steps, walk)) / var if var else mean_w / max(mean_s, 1)
    gaps = []
    by_sm: dict[int, list[int]] = {}
    for p in range(n):
        by_sm.setdefault(sm[p], []).append(p)
    for programs in by_sm.values():
        programs.sort(key=lambda p: start[p])
        gaps += [start[b] - stored[a] for a, b in zip(programs, programs[1:])]
    span = max(stored) - min(start)
    busy = sum(stored[p] - start[p] for p in range(n)) / (len(by_sm) * span)
    # the tail: from the first SM to run out of programs to the kernel's last store, and the share
    # of SM time idle after each SM's last program
    sm_done = [max(stored[p] for p in programs) for programs in by_sm.values()]
    return {"programs": n, "sms": len(by_sm), "span_us": round(span, 2), "busy_share": round(busy, 4),
            "kv_wait_us": _quantiles([b - a for a, b in zip(start, kv_in)]),
            "walk_us": _quantiles(walk), "epilogue_us": _quantiles([b - a for a, b in zip(walked, stored)]),
            "gap_us": _quantiles(gaps) if gaps else None,
            "walk_fit": {"us_per_step": round(per_step, 4), "us_fixed": round(mean_w - per_step * mean_s, 3)},
            "steps": _quantiles([float(s) for s in steps]),
            "drain_us": round(max(stored) - min(sm_done), 2),
            "tail_idle_share": round(sum(max(stored) - d for d in sm_done) / (len(by_sm) * span), 4)}


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout, causal, (q, k, v, dout), meta, scale, row = probe_inputs(spec, B, H, S, D, block, tensors=4)
    nb, lh, hkv = -(-S // block), layout.layout_heads, k.shape[1]
    out, lse = K.attention_forward(q, k, v, meta, None, lh, block, causal, scale)
    delta = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    K.launch(K._bwd_preprocess_kernel, (K.cdiv(S, 64), B * H), out, dout, delta, S, H, *out.stride()[:3],
             *dout.stride()[:3], D=D, D_TILE=max(16, K.next_power_of_2(D)), BLOCK_M=64)
    _, col_ptr, _, col_rows = attention_table_views(meta, lh, nb)
    modes = {"deterministic": attention_ws.default_config("dkdv", q, k, v, dout, block, lh),
             "atomic": attention_ws.default_config("dkdv", q, k, v, dout, block, lh, deterministic=False),
             "ordered": attention_ws.ordered_default(q, k, v, dout, block, meta, lh, nb)}
    for name, cfg in modes.items():
        if cfg is None:
            row[f"{name}_error"] = "no such default for this layout"
            continue
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        programs = nb * B * hkv
        stamps = torch.zeros(programs, STAMP_COLUMNS, dtype=torch.int64, device=q.device)

        def launch(stamped):
            dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if cfg.atomic_dq else None
            attention_ws.launch_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, None, col_ptr, col_rows, nb, lh, block,
                                        causal, False, scale, cfg, dq_acc=dq_acc, meta=meta,
                                        stamps=stamps if stamped else None)

        for stamped in (False, False, True):  # compiled and warm, then the stamped launch
            launch(stamped)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(False)
        end.record()
        torch.cuda.synchronize()
        row[f"{name}_kernel_ms"] = round(start.elapsed_time(end), 4)
        row[name] = _timeline(stamps, _program_steps(cfg, meta, lh, nb, B, H, hkv, cfg.block_m, block))
    return row


def describe(name: str, row: dict) -> str:
    parts = [f"{name:10} d {row['density']:.3f}"]
    for mode in ("deterministic", "atomic", "ordered"):
        t = row.get(mode)
        if t:
            parts.append(f"{mode}: {row[mode + '_kernel_ms']} ms span {t['span_us']} busy {t['busy_share']} "
                         f"kv {t['kv_wait_us']['median']} walk {t['walk_us']['median']} "
                         f"({t['walk_fit']['us_per_step']}/step + {t['walk_fit']['us_fixed']}) "
                         f"epi {t['epilogue_us']['median']} gap {t['gap_us']['median'] if t['gap_us'] else '-'}"
                         f" drain {t['drain_us']} tail idle {t['tail_idle_share']}")
    return "\n  ".join(parts)


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "(not used: no FlexAttention here)")
