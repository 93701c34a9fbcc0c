"""The attention backward with dQ added by atomics (``deterministic=False``: 5 products
per block pair, no dQ kernel) against the deterministic default (dK/dV then dQ: 7
products), on the attention suite's patterns (B 4, H 16, S 8192, D 128 or
``--head-dim``, blocks of 128, bf16), one process: the warp-specialized dK/dV kernel
with ``atomic_dq`` at one and two consumers, and the Triton kernel's atomic mode. The
atomic gradients are compared with the deterministic ones (max |difference| over max
|gradient|; not bitwise: the adds land in any order).

Why: the backward's 7 products at ~440 TF/s kept forward + backward at ~1.0x Flex
(sixteenth session); issue 6 asks 1.3x.

    python scripts/probes/attention_atomic_dq.py --out attention-atomic-dq.json
"""

from __future__ import annotations

import torch

from tilesparse.bench.attention import _make_fns, build_layout, probe_main
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention as K
from tilesparse.kernels.attention_ws import DkdvWsConfig

ATOMIC = {"ws_atomic_two": DkdvWsConfig(64, 2, consumers=2, atomic_dq=True),
          "ws_atomic_one": DkdvWsConfig(64, 2, atomic_dq=True),
          "ws_atomic_two_s3": DkdvWsConfig(64, 3, consumers=2, atomic_dq=True)}


def _time(fn) -> float:
    return bench_ms(fn, cuda=True)


def _relative_error(got, want) -> float:
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(got, want))


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    layout = build_layout(spec, S, block, H)
    causal = bool(spec.get("causal", False))
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    meta = layout.meta_on(q.device, causal)
    scale = D ** -0.5
    row = {"pattern": spec["name"], "density": layout.density}
    fwd = lambda: K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)  # noqa: E731
    out, lse = fwd()
    row["fwd_default_ms"] = _time(fwd)

    def bwd(configs=None, deterministic=True):
        return K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                                    configs=configs, deterministic=deterministic)

    want = bwd()
    row["bwd_default_ms"] = _time(bwd)
    row["bwd_default_atomic_ms"] = _time(lambda: bwd(deterministic=False))
    triton = tuple(K.attention_config(kind, block, D, q.dtype) for kind in ("dkdv", "dq"))
    row["bwd_triton_atomic_ms"] = _time(lambda: bwd(triton, False))
    for name, cfg in ATOMIC.items():  # (the Triton dQ config is not run with atomics)
        try:
            got = bwd((cfg, triton[1]), False)
        except Exception as exc:  # noqa: BLE001 (a probe: record and go on)
            row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        row[f"{name}_rel_err"] = _relative_error(got, want)
        row[f"bwd_{name}_ms"] = _time(lambda cfg=cfg: bwd((cfg, triton[1]), False))
    if flex:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fns, _ = _make_fns("flex", *leaves, layout, causal, spec["name"], dout)
        if fns:
            row["flex_fwd_ms"], row["flex_fwd_bwd_ms"] = _time(fns[0]), _time(fns[1])
    return row


def describe(name: str, row: dict) -> str:
    times = "  ".join(f"{key[:-3]}: {value:.3f}" for key, value in row.items() if key.endswith("_ms"))
    errs = "  ".join(f"{key}: {value:.2e}" if isinstance(value, float) else f"{key}: {value}"
                     for key, value in row.items() if key.endswith(("_rel_err", "_error")))
    return f"{name:10} d {row['density']:.3f}  {times}  {errs}"


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention (compiles: minutes)")
