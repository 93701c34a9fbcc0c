"""Block-sparse attention's forward: the Triton kernel (the default), the warp-specialized
one (a program per query tile) and the persistent warp-specialized one (a program per
SM, the producer loading the next tile under the current one's tail;
kernels/attention_ws_persistent.py), in one process, on the attention suite's patterns
(B 4, H 16, S 8192, D 128, blocks of 128, bf16), with FlexAttention's forward where it
compiles. The two warp-specialized outputs must agree bitwise.

    python scripts/probes/attention_fwd_persistent.py --out attention-fwd-persistent.json

Since the seventeenth session the persistent configs here take the balanced tile schedule
(``FwdWsConfig.balanced``, default on) where the layout's rows differ; the results
recorded before then used the round-robin.
"""

from __future__ import annotations

import torch

from tilesparse.bench.attention import _make_fns, probe_inputs, probe_main
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import FwdWsConfig

VARIANTS = {
    "triton": None,
    "ws-n128st2": FwdWsConfig(128, 128, 2),
    "persistent-n128st2": FwdWsConfig(128, 128, 2, persistent=True),
    "persistent-n64st3": FwdWsConfig(128, 64, 3, persistent=True),
    "persistent-n64st4": FwdWsConfig(128, 64, 4, persistent=True),
    # each key tile's softmax under the previous tile's P V wgmma (K and V in separate rings)
    "overlap-n128st2": FwdWsConfig(128, 128, 2, persistent=True, overlap=True),
    "overlap-n64st4": FwdWsConfig(128, 64, 4, persistent=True, overlap=True),
    # two consumer warpgroups, half the rows each, synchronized only through the rings
    "two-n128st2": FwdWsConfig(128, 128, 2, persistent=True, consumers=2),
    "two-overlap-n128st2": FwdWsConfig(128, 128, 2, persistent=True, overlap=True, consumers=2),
}


def _time(fn) -> float:
    return bench_ms(fn, cuda=True)


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout, causal, (q, k, v), meta, scale, row = probe_inputs(spec, B, H, S, D, block)
    row.update(B=B, H=H, S=S, D=D, block=block)
    outs = {}
    for name, cfg in VARIANTS.items():
        def fwd(cfg=cfg):
            return K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale, config=cfg)
        try:
            outs[name] = fwd()[0]
            row[f"{name}_ms"] = _time(fwd)
        except Exception as exc:  # noqa: BLE001 (report and go on: a refused or failing variant)
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    ref = outs.get("triton")
    for name, out in outs.items():
        if ref is not None and name != "triton":
            row[f"{name}_rel_err"] = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    if "ws-n128st2" in outs and "persistent-n128st2" in outs:
        row["persistent_bitwise_equal_ws"] = bool(torch.equal(outs["ws-n128st2"], outs["persistent-n128st2"]))
    if flex:
        fns, _ = _make_fns("flex", q, k, v, layout, causal, spec["name"], torch.randn_like(q))
        row["flex_ms"] = _time(fns[0]) if fns else None
    return row


def describe(name: str, row: dict) -> str:
    times = "  ".join(f"{v}: {row[f'{v}_ms']:.3f} ms" for v in VARIANTS if f"{v}_ms" in row)
    errors = "  ".join(f"{v}: {row[f'{v}_error']}" for v in VARIANTS if f"{v}_error" in row)
    return (f"{name:10} density {row['density']:.3f}  {times}  flex: {row.get('flex_ms')}  "
            f"bitwise ws == persistent: {row.get('persistent_bitwise_equal_ws')}  {errors}")


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention's forward (compiles: minutes)")
