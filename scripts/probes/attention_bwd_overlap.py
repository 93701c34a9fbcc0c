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

from tilesparse.bench.attention import probe_inputs, probe_main, probe_times
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import DkdvWsConfig, DqWsConfig

DKDV = {"dkdv_sync": DkdvWsConfig(64, 2, consumers=2), "dkdv_overlap": DkdvWsConfig(64, 2, consumers=2, overlap=True),
        # query tiles of 32 rows: sT and dPᵀ half the size, no spills with overlap at D 128
        "dkdv_m32_sync": DkdvWsConfig(32, 2, consumers=2),
        "dkdv_m32_overlap": DkdvWsConfig(32, 2, consumers=2, overlap=True),
        "dkdv_m32_s3_overlap": DkdvWsConfig(32, 3, consumers=2, overlap=True),
        # lse and delta copied into the ring stage and read from shared memory where used:
        # at D 128 the synchronous consumer's spills 220 -> 0 B, the overlapped one's 608 -> 84 B
        "dkdv_stats_sync": DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True),
        "dkdv_stats_overlap": DkdvWsConfig(64, 2, consumers=2, overlap=True, stats_in_smem=True)}
DQ = {"dq_sync": DqWsConfig(128, 128, 2, consumers=2), "dq_overlap": DqWsConfig(128, 128, 2, consumers=2, overlap=True)}


def backward_variants(spec: dict, B: int, H: int, S: int, D: int, block: int, dkdv: dict, dq: dict,
                      base: tuple, pairs: dict, exact: set) -> dict:
    """A pattern's row: the backward timed with each dK/dV config of ``dkdv`` (dQ at
    ``base[1]``), each dQ config of ``dq`` (dK/dV at ``base[0]``), each (dK/dV, dQ) of
    ``pairs`` and both Triton kernels; gradients compared with ``base``'s, bitwise for the
    names in ``exact`` (the same products in the same order), by size for the others."""
    layout, causal, (q, k, v, dout), meta, scale, row = probe_inputs(spec, B, H, S, D, block, tensors=4)
    out, lse = K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)
    row["bitwise"] = True

    def bwd(dkdv_cfg, dq_cfg):
        return K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                                    configs=(dkdv_cfg, dq_cfg))

    want = bwd(*base)
    variants = {**{name: (cfg, base[1]) for name, cfg in dkdv.items()},
                **{name: (base[0], cfg) for name, cfg in dq.items()}, **pairs}
    for name, pair in variants.items():
        got = bwd(*pair)
        row[f"{name}_bitwise"] = all(torch.equal(a, b) for a, b in zip(got, want))
        if name in exact:
            row["bitwise"] &= row[f"{name}_bitwise"]
        else:
            row[f"{name}_max_rel"] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                                         for a, b in zip(got, want))
        row[f"{name}_ms"] = bench_ms(lambda pair=pair: bwd(*pair), cuda=True)
    triton = tuple(K.attention_config(kind, block, D, q.dtype) for kind in ("dkdv", "dq"))
    row["triton_ms"] = bench_ms(lambda: bwd(*triton), cuda=True)  # both Triton kernels, heuristic configs
    return row


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    both = (DKDV["dkdv_overlap"], DQ["dq_overlap"])
    exact = {name for name in (*DKDV, *DQ, "both_overlap") if not name.startswith("dkdv_m32")}
    return backward_variants(spec, B, H, S, D, block, DKDV, DQ, (DKDV["dkdv_sync"], DQ["dq_sync"]),
                             {"both_overlap": both}, exact)


def describe(name: str, row: dict) -> str:
    times = probe_times(row)
    return f"{name:10} d {row['density']:.3f}  {times}  bitwise {row['bitwise']}"


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "(unused)")
