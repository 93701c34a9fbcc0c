"""The persistent attention forward with its tiles balanced by row length
(``FwdWsConfig.balanced``, :mod:`tilesparse.kernels.attention_schedule`) against the
round-robin, on the attention suite's patterns (B 4, H 16, S 8192, D 128 or
``--head-dim``, blocks of 128, bf16), one process, beside the Triton forward at its
heuristic config; outputs must be bitwise equal. Also the modelled busiest program
(row length + 1 per tile) over the mean, for both orders.

Why: the round-robin left the busiest program 20-35 % above the mean on the per-head
BigBird and random layouts and on "fixed" (modelled), where the persistent forward lost
to or barely beat the Triton one.

    python scripts/probes/attention_balanced.py --out attention-balanced.json [--head-dim 64] [--flex]
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from tilesparse.bench.attention import _make_fns, probe_inputs, probe_main, probe_times
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels import attention_schedule, attention_ws
from tilesparse.kernels._device import sm_count

ROUNDS = 3


def _modelled(meta, layout, B, H, programs) -> tuple[float, float]:
    costs = attention_schedule.tile_costs(meta, layout.layout_heads, layout.num_blocks, B, H, 1)
    mean = sum(costs) / programs
    balanced = max(sum(costs[t] for t in tiles) for tiles in attention_schedule.tile_order(costs, programs))
    return balanced / mean, attention_schedule.round_robin_imbalance(costs, programs)


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout, causal, (q, k, v), meta, scale, row = probe_inputs(spec, B, H, S, D, block)
    row["model_balanced"], row["model_round_robin"] = _modelled(meta, layout, B, H, sm_count(q.device))
    base = attention_ws.FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2)
    cfgs = {"triton": K.attention_config("fwd", block, D, q.dtype), "balanced": base,
            "round_robin": dataclasses.replace(base, balanced=False)}
    outs, fns = {}, {}
    for name, cfg in cfgs.items():
        fns[name] = functools.partial(K.attention_forward, q, k, v, meta, None, layout.layout_heads, block, causal,
                                      scale, config=cfg)
        outs[name] = fns[name]()
    # timed in turn, ROUNDS times (the GPU's clocks drift by several % within a process):
    # the median of each
    times = {name: [] for name in cfgs}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            times[name].append(bench_ms(fn, cuda=True))
    for name, values in times.items():
        row[f"fwd_{name}_ms"] = sorted(values)[len(values) // 2]
        row[f"fwd_{name}_all"] = values
    row["bitwise"] = all(torch.equal(outs["balanced"][i], outs["round_robin"][i]) for i in range(2))
    if flex:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fns, _ = _make_fns("flex", *leaves, layout, causal, spec["name"], torch.randn_like(q))
        if fns:
            row["flex_fwd_ms"] = bench_ms(fns[0], cuda=True)
    return row


def describe(name: str, row: dict) -> str:
    times = probe_times(row)
    return (f"{name:10} d {row['density']:.3f}  model {row['model_balanced']:.3f} / {row['model_round_robin']:.3f}  "
            f"{times}  bitwise {row['bitwise']}")


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention's forward (compiles)")
