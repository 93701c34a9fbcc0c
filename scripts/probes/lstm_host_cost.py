"""Our Python's host time per LSTM timestep, measured on the CPU as host_python_cost.py measures a
product's: every Triton launch replaced by a no-op and the CUDA-only paths forced onto the kernels'
wrappers (the recurrent product through kernels.bsmm, the cell through its Triton launcher), so what
remains is dispatch, checks, plans and buffers. ``lstm.STEP_PLANS`` off and on in the same run
(off: each step dispatches in full; on: the per-sequence plans).

    python scripts/probes/lstm_host_cost.py              # B 32, H 2048, b 16, density 0.25, T 32
    python scripts/probes/lstm_host_cost.py --hidden 4096 --block 32
"""

from __future__ import annotations

import argparse
import os

os.environ.pop("TRITON_INTERPRET", None)  # the launches are stubbed: nothing is interpreted

import torch  # noqa: E402
from host_python_cost import per_call_us, stub_launches  # noqa: E402

import tilesparse as ts  # noqa: E402
from tilesparse.kernels import bsmm as K  # noqa: E402
from tilesparse.kernels import lstm_cell  # noqa: E402
from tilesparse.ops import bsmm as O  # noqa: E402
from tilesparse.ops import lstm as L  # noqa: E402


def stub_everything() -> None:
    """host_python_cost's stubs, plus the cell's launches, and the plans made on CPU tensors too."""
    stub_launches()
    lstm_cell.launch = lambda *args, **kwargs: None
    lstm_cell._use_triton = lambda t: True
    real_plan = O._dds_plan

    def plan_on_cpu(values, meta, bias, rows, cols, trans, like, plan=True):
        if plan:
            return K.DdsPlan(values, meta, bias, rows, cols, trans)
        return real_plan(values, meta, bias, rows, cols, trans, like, plan)
    O._dds_plan = plan_on_cpu


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--density", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args()
    stub_everything()
    hidden, batch, steps = args.hidden, args.batch, args.steps
    layout = ts.layouts.random(4 * hidden, hidden, args.block, args.density, seed=0)
    w = torch.randn(layout.nnz, args.block, args.block, dtype=torch.bfloat16)
    xproj = torch.randn(steps, batch, 4 * hidden, dtype=torch.bfloat16)
    meta, rows, cols = layout.meta, layout.block_rows, layout.block_cols
    h0 = torch.randn(batch, hidden, dtype=torch.bfloat16)
    out, cbuf, acts = L._run_forward(xproj, w, meta, rows, cols, h0, h0, save=True)
    d_out = torch.randn_like(out)
    cases = {
        "forward, no grad": lambda: L._run_forward(xproj, w, meta, rows, cols, h0, h0, save=False),
        "forward, saving": lambda: L._run_forward(xproj, w, meta, rows, cols, h0, h0, save=True),
        "backward (BPTT, one sdd)": lambda: L._run_backward(w, meta, rows, cols, args.block, True, h0, out, cbuf, acts,
                                                            d_out, h0, h0, True, True, True, True),
    }
    print(f"B {batch}, H {hidden}, b {args.block}, density {args.density}, T {steps}: µs per timestep")
    for name, fn in cases.items():
        timings = {}
        for plans in (False, True):
            L.STEP_PLANS = plans
            timings[plans] = per_call_us(fn, 5, 15) / steps
        print(f"{name:28s} plans off {timings[False]:6.1f}  on {timings[True]:6.1f}")


if __name__ == "__main__":
    main()
