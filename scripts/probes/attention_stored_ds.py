"""Block-sparse attention's backward: dQ recomputed (the default: the warp-specialized
kernels on Hopper at b 128 / D 128, else Triton's) against dQ from stored dS
(kernels/attention_stored_ds.py, TILESPARSE_STORED_DS=on), forward + backward, in one
process, on the attention suite's patterns (B 4, H 16, S 8192, D 128, blocks of 128,
bf16), with FlexAttention's time where it compiles; gradients compared between the modes.

    python scripts/probes/attention_stored_ds.py --out attention-stored-ds.json

STORED_DS_ENERGY=<seconds>: each mode is also called back to back for that long with
nvidia-smi sampling (attention_power.sustained): energy per call, SM clock and ms at the
board's power cap, where the suite's rows run. Stored dS trades two of the dQ kernel's
three products for HBM traffic. It lost at full clock; at the cap energy decides
(twenty-ninth session).
"""

from __future__ import annotations

import os

import torch
from attention_power import sustained  # this folder's

from tilesparse.attention import block_sparse_attention
from tilesparse.bench.attention import _make_fns, build_layout, probe_main
from tilesparse.bench.timing import bench_ms
from tilesparse.kernels import attention_stored_ds as stored


ENERGY_S = float(os.environ.get("STORED_DS_ENERGY", "0"))


def _time(fn) -> float:
    return bench_ms(fn, cuda=True)


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    """Both modes (and Flex if asked) on one pattern; the row of results."""
    layout = build_layout(spec, S, block, H)
    causal = bool(spec.get("causal", False))
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)

    def fwd_bwd():
        out = block_sparse_attention(q, k, v, layout, causal=causal, dense_fallback=False)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    nbytes = stored.workspace_bytes(B, H, layout.layout_heads, layout.nnz, block, torch.bfloat16)
    row = {"pattern": spec["name"], "density": layout.density, "B": B, "H": H, "S": S, "D": D, "block": block,
           "workspace_bytes": nbytes}
    grads = {}
    before = os.environ.get("TILESPARSE_STORED_DS")
    try:
        for mode in ("off", "on"):
            os.environ["TILESPARSE_STORED_DS"] = mode
            if mode == "on":  # how many chunks of heads (None: over the budget, dQ recomputed)
                plan = stored.plan(B, H, H, layout.layout_heads, layout.nnz, block, torch.bfloat16,
                                   q.numel() * q.element_size(), q.device)
                row["stored_ds_chunks"] = None if plan is None else len(plan[0])
            grads[mode] = fwd_bwd()
            row[f"fwd_bwd_ms_{mode}"] = _time(fwd_bwd)
            if ENERGY_S > 0:
                got = sustained(fwd_bwd, ENERGY_S)
                row[f"fwd_bwd_mj_{mode}"], row[f"fwd_bwd_mhz_{mode}"] = got["mj_per_call"], got["sm_mhz"]
                row[f"fwd_bwd_sustained_ms_{mode}"] = got["ms_per_call"]
    finally:
        if before is None:
            os.environ.pop("TILESPARSE_STORED_DS", None)
        else:
            os.environ["TILESPARSE_STORED_DS"] = before
    row["rel_diff"] = {n: ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
                       for n, a, b in zip(("dq", "dk", "dv"), grads["on"], grads["off"])}
    row["speedup_on_over_off"] = row["fwd_bwd_ms_off"] / row["fwd_bwd_ms_on"]
    if flex:
        fns, _ = _make_fns("flex", q, k, v, layout, causal, spec["name"], grad_out)
        row["flex_fwd_bwd_ms"] = _time(fns[1]) if fns else None
    return row


def describe(name: str, row: dict) -> str:
    chunks = row["stored_ds_chunks"]
    plan = "over the budget: both modes recompute" if chunks is None else f"{chunks} chunk(s)"
    return (f"{name:10} density {row['density']:.3f} (dS workspace {row['workspace_bytes'] / 2**30:.2f} GiB, {plan}): "
            f"recompute {row['fwd_bwd_ms_off']:.3f} ms, stored dS {row['fwd_bwd_ms_on']:.3f} ms "
            f"({row['speedup_on_over_off']:.2f}x)"
            + (f", flex {row['flex_fwd_bwd_ms']:.3f} ms" if row.get("flex_fwd_bwd_ms") else "")
            + f"; grads differ by {max(row['rel_diff'].values()):.1e}"
            + (f"; at the cap {row['fwd_bwd_mj_off']:.0f} -> {row['fwd_bwd_mj_on']:.0f} mJ per call, "
               f"{row['fwd_bwd_sustained_ms_off']:.3f} -> {row['fwd_bwd_sustained_ms_on']:.3f} ms"
               if "fwd_bwd_mj_on" in row else ""))


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "also time FlexAttention (compiles: minutes)")
