"""The warp-specialized backward kernels with their elementwise work under asynchronous
wgmma (``DkdvWsConfig(overlap=True)``: sT and dPᵀ issued together, Pᵀ under dPᵀ, dSᵀ under
dV; ``DqWsConfig(overlap=True)``: S and dP together, P under dP) against the synchronous
defaults, each kernel alone and both, on the attention suite's patterns (B 4, H 16,
S 8192, D 128 or ``--head-dim``, blocks of 128, bf16), one process; gradients must be
bitwise the default's (the same products in the same order).

Why: ncu on local 1024 (1beb88d) found the backward's tensor pipes busy ~half the time
and more ring stages changed nothing (``attention_bwd_stages.py``).

    python scripts/probes/attention_bwd_overlap.py --out attention-bwd-overlap.json
"""

from __future__ import annotations

import torch

from tilesparse.bench.attention import build_layout, probe_main
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import DkdvWsConfig, DqWsConfig

DKDV = {"dkdv_sync": DkdvWsConfig(64, 2, consumers=2), "dkdv_overlap": DkdvWsConfig(64, 2, consumers=2, overlap=True),
        # query tiles of 32 rows: sT and dPᵀ half the size, no spills with overlap at D 128
        "dkdv_m32_sync": DkdvWsConfig(32, 2, consumers=2),
        "dkdv_m32_overlap": DkdvWsConfig(32, 2, consumers=2, overlap=True),
        "dkdv_m32_s3_overlap": DkdvWsConfig(32, 3, consumers=2, overlap=True)}
DQ = {"dq_sync": DqWsConfig(128, 128, 2, consumers=2), "dq_overlap": DqWsConfig(128, 128, 2, consumers=2, overlap=True)}


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout = build_layout(spec, S, block, H)
    causal = bool(spec.get("causal", False))
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    meta = layout.meta_on(q.device, causal)
    scale = D ** -0.5
    out, lse = K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)
    row = {"pattern": spec["name"], "density": layout.density}

    def bwd(dkdv, dq):
        return K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                                    configs=(dkdv, dq))

    base = (DKDV["dkdv_sync"], DQ["dq_sync"])
    want = bwd(*base)
    row["bitwise"] = True
    for table, index in ((DKDV, 0), (DQ, 1)):
        for name, cfg in table.items():
            pair = tuple(cfg if i == index else base[i] for i in range(2))
            got = bwd(*pair)
            row[f"{name}_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, want))
            if name.startswith("dkdv_m32"):  # other query tiles: other sums, compared to the default by size
                row[f"{name}_max_rel"] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                                             for a, b in zip(got, want))
            else:
                row["bitwise"] &= row[f"{name}_bitwise"]
            row[f"{name}_ms"] = bench_ms(lambda pair=pair: bwd(*pair), cuda=True)
    triton = tuple(K.attention_config(kind, block, D, q.dtype) for kind in ("dkdv", "dq"))
    row["triton_ms"] = bench_ms(lambda: bwd(*triton), cuda=True)  # both Triton kernels, heuristic configs
    both = (DKDV["dkdv_overlap"], DQ["dq_overlap"])
    row["bitwise"] &= all(torch.equal(a, b) for a, b in zip(bwd(*both), want))
    row["both_overlap_ms"] = bench_ms(lambda: bwd(*both), cuda=True)
    return row


def describe(name: str, row: dict) -> str:
    times = "  ".join(f"{key[:-3]}: {value:.3f}" for key, value in row.items() if key.endswith("_ms"))
    return f"{name:10} d {row['density']:.3f}  {times}  bitwise {row['bitwise']}"


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "(unused)")
