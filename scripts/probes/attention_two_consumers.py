"""The warp-specialized attention kernels with one consumer partition of two warpgroups
against two consumer partitions of one warpgroup each (half the rows or keys each;
``consumers=2``): forward (the persistent kernel, softmax under P V), dK/dV and dQ, on the
attention suite's patterns (B 4, H 16, S 8192, D 128 or ``--head-dim``, blocks of 128,
bf16), one process, beside the Triton kernels at their heuristic configs and the
library's default. Each kernel is timed alone (the backward with the other kernel at its
one-consumer config); outputs and gradients of the two versions must be bitwise equal.

Why: ncu on the persistent forward (707fe2b) found 39 % of the warps' stall cycles at
the 256-thread sync that precedes each mbarrier arrival of an 8-warp consumer.

    python scripts/probes/attention_two_consumers.py --out attention-two-consumers.json

Since the seventeenth session the persistent configs here take the balanced tile schedule
(``FwdWsConfig.balanced``, default on) where the layout's rows differ; the results
recorded before then used the round-robin.
"""

from __future__ import annotations

import torch

from tilesparse.bench.attention import build_layout, probe_flex_times, probe_main, probe_times
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import DkdvWsConfig, DqWsConfig, FwdWsConfig

FWD = {"default": None, "one": FwdWsConfig(128, 128, 2, persistent=True, overlap=True),
       "two": FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2)}
DKDV = {"one": DkdvWsConfig(64, 2), "two": DkdvWsConfig(64, 2, consumers=2)}
DQ = {"one": DqWsConfig(128, 128, 2), "two": DqWsConfig(128, 128, 2, consumers=2)}


def _time(fn) -> float:
    return bench_ms(fn, cuda=True)


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout = build_layout(spec, S, block, H)
    causal = bool(spec.get("causal", False))
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    meta = layout.meta_on(q.device, causal)
    scale = D ** -0.5
    row = {"pattern": spec["name"], "density": layout.density}

    def fwd(cfg):
        return K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale, config=cfg)

    outs = {}
    row["fwd_triton_ms"] = _time(lambda: fwd(K.attention_config("fwd", block, D, q.dtype)))
    for name, cfg in FWD.items():
        outs[name] = fwd(cfg)
        row[f"fwd_{name}_ms"] = _time(lambda cfg=cfg: fwd(cfg))
    row["fwd_bitwise"] = all(torch.equal(outs["one"][i], outs["two"][i]) for i in range(2))
    out, lse = outs["one"]

    def bwd(dkdv, dq):
        return K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                                    configs=(dkdv, dq))

    grads = {}
    for kind, table in (("dkdv", DKDV), ("dq", DQ)):
        for name, cfg in table.items():
            pair = (cfg, DQ["one"]) if kind == "dkdv" else (DKDV["one"], cfg)
            grads[(kind, name)] = bwd(*pair)
            row[f"bwd_{kind}_{name}_ms"] = _time(lambda pair=pair: bwd(*pair))
    row["bwd_both_two_ms"] = _time(lambda: bwd(DKDV["two"], DQ["two"]))
    triton_pair = tuple(K.attention_config(kind, block, D, q.dtype) for kind in ("dkdv", "dq"))
    row["bwd_triton_ms"] = _time(lambda: bwd(*triton_pair))  # both Triton kernels at their heuristic configs
    both = bwd(DKDV["two"], DQ["two"])
    row["bwd_bitwise"] = all(torch.equal(a, b) for a, b in zip(both, grads[("dkdv", "one")]))
    if flex:
        probe_flex_times(row, q, k, v, layout, causal, spec["name"], dout)
    return row


def describe(name: str, row: dict) -> str:
    times = probe_times(row)
    return f"{name:10} d {row['density']:.3f}  {times}  bitwise fwd {row['fwd_bitwise']} bwd {row['bwd_bitwise']}"


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention (compiles: minutes)")
