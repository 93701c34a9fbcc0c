"""Where the host time of attention forward + backward goes, layer by layer, at sizes where
the host rather than the GPU sets the pace.

Twenty-fourth session, H200, B 4, H 16, S 2048, D 128, local 1024: forward + backward
took 1.64 ms per call eagerly (``deterministic=False``) while its kernels summed to 0.52
ms and FlexAttention's whole call to 0.68 ms: the host's 1.66 ms per call, not the GPU,
was timed. This times each layer alone (wall time per call of back-to-back calls,
bench.timing.host_us), checks for host-device synchronizations
(torch.cuda.set_sync_debug_mode) and profiles the backward op's Python by cumulative time:

  kernel_fwd / kernel_bwd_det / kernel_bwd_atomic   tilesparse.kernels.attention's functions
  op_fwd / op_bwd_atomic                            the registered custom ops (no autograd)
  public_fwd                                        block_sparse_attention under no_grad
  public_fwd_bwd_det / public_fwd_bwd_atomic        forward + backward through autograd
  function_fwd_bwd_atomic                           the kernels under a plain autograd.Function
                                                    (and its timeline: host time between marks)
  kernel_fwd_bwd_atomic                             the kernels' forward then backward, no autograd
  engine_only                                       an autograd.Function of one tiny kernel each way
  flex_fwd_bwd                                      FlexAttention compiled, the same mask

    python scripts/probes/attention_host.py --shape 4 16 2048 128 --out attention-host.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import warnings

import torch
from attention_gap import python_profile  # this folder's

from tilesparse.bench.attention import _make_fns, probe_inputs, suite_patterns
from tilesparse.bench.timing import host_us
from tilesparse.kernels import attention as K
from tilesparse.kernels import attention_ws
from tilesparse.ops import attention as ops


def cpu_profile(fn, reps: int = 20, top: int = 25) -> str:
    """torch.profiler's CPU events (ops and CUDA runtime / driver calls) over ``reps`` calls,
    by self CPU time: which calls the host spends its time in (the autograd engine's thread
    included, which cProfile misattributes)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60)


def launch_costs(fn, reps: int = 50) -> dict[str, float]:
    """Mean host microseconds per call of ``fn`` inside each kernel launch
    (tilesparse.kernels._launch.launch: the launch spec, the descriptors' encoding, the
    driver call), by kernel name, and in the Gluon host descriptors' construction."""
    import sys as _sys

    from tilesparse.kernels import _launch, attention_ws_base

    spent: dict[str, float] = {}

    def timed(name, real):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent[name(args)] = spent.get(name(args), 0.0) + time.perf_counter() - t0
        return wrapper

    real_launch, real_desc = _launch.launch, attention_ws_base.host_backward_descs
    patched = [(m, attr, getattr(m, attr)) for m in list(_sys.modules.values())
               if getattr(m, "__name__", "").startswith("tilesparse.kernels")
               for attr in ("launch", "host_backward_descs") if getattr(m, attr, None) in (real_launch, real_desc)]
    for module, attr, real in patched:
        setattr(module, attr, timed((lambda a: f"launch {getattr(getattr(a[0], 'fn', a[0]), '__name__', '?')}") if attr == "launch"
                                    else (lambda a: "host_backward_descs"), real))
    try:
        fn()
        torch.cuda.synchronize()
        spent.clear()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    finally:
        for module, attr, real in patched:
            setattr(module, attr, real)
    return {name: secs / reps * 1e6 for name, secs in spent.items()}


def synchronizations(fn) -> list[str]:
    """The warnings torch raises for host-device synchronizations during one call."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return [str(w.message)[:300] for w in caught]


def main() -> None:
    parser = argparse.ArgumentParser()
    B, H, S, D, block, specs = suite_patterns()
    parser.add_argument("--pattern", default="local1024", choices=sorted(specs))
    parser.add_argument("--shape", type=int, nargs=4, default=[B, H, 2048, D])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--flex", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    B, H, S, D = args.shape
    layout, causal, (q, k, v, g), meta, scale, row = probe_inputs(specs[args.pattern], B, H, S, D, block, tensors=4)
    lh = layout.layout_heads
    out, lse = K.attention_forward(q, k, v, meta, None, lh, block, causal, scale)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    # the deterministic defaults with descriptors built by the kernels instead of the host
    device_descs = tuple(dataclasses.replace(attention_ws.default_config(kind, q, k, v, g, block, lh), host_descs=False)
                         for kind in ("dkdv", "dq"))

    def public_fwd_bwd(deterministic):
        def call():
            o = ops.block_sparse_attention(qg, kg, vg, layout, causal=causal, deterministic=deterministic)
            o.backward(g)
            qg.grad = kg.grad = vg.grad = None
        return call

    marks: list[tuple[str, float]] = []  # (where, perf_counter) of the timeline below

    class Direct(torch.autograd.Function):
        """The kernels under a plain autograd.Function (no custom op): what the ops cost."""

        @staticmethod
        def forward(ctx, q_, k_, v_, deterministic):
            o, l = K.attention_forward(q_, k_, v_, meta, None, lh, block, causal, scale)
            ctx.save_for_backward(q_, k_, v_, o, l)
            ctx.deterministic = deterministic
            return o

        @staticmethod
        def backward(ctx, grad):
            marks.append(("backward entered", time.perf_counter()))
            q_, k_, v_, o, l = ctx.saved_tensors
            grads = K.attention_backward(grad, q_, k_, v_, o, l, meta, None, lh, block, causal, scale,
                                         deterministic=ctx.deterministic)
            marks.append(("kernels launched", time.perf_counter()))
            return (*grads, None)

    def direct_fwd_bwd():
        marks.append(("start", time.perf_counter()))
        o = Direct.apply(qg, kg, vg, False)
        marks.append(("forward returned", time.perf_counter()))
        o.backward(g)
        marks.append(("backward returned", time.perf_counter()))
        qg.grad = kg.grad = vg.grad = None
        marks.append(("grads cleared", time.perf_counter()))

    class Scale(torch.autograd.Function):
        """One elementwise kernel each way: the autograd engine's own cost per call."""

        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    small = torch.randn(1024, device="cuda", requires_grad=True)

    def scale_fwd_bwd():
        Scale.apply(small).backward(torch.ones_like(small))
        small.grad = None

    def kernel_fwd_bwd():
        o, l = K.attention_forward(q, k, v, meta, None, lh, block, causal, scale)
        return K.attention_backward(g, q, k, v, o, l, meta, None, lh, block, causal, scale, deterministic=False)

    def public_fwd():
        with torch.no_grad():
            return ops.block_sparse_attention(q, k, v, layout, causal=causal)

    fns = {
        "kernel_fwd": lambda: K.attention_forward(q, k, v, meta, None, lh, block, causal, scale),
        "kernel_bwd_det": lambda: K.attention_backward(g, q, k, v, out, lse, meta, None, lh, block, causal, scale),
        "kernel_bwd_atomic": lambda: K.attention_backward(g, q, k, v, out, lse, meta, None, lh, block, causal, scale,
                                                          deterministic=False),
        "kernel_bwd_det_device_descs": lambda: K.attention_backward(g, q, k, v, out, lse, meta, None, lh, block,
                                                                    causal, scale, configs=device_descs),
        "op_fwd": lambda: ops._fwd_op(q, k, v, meta, None, lh, block, causal, scale, True),
        "op_bwd_atomic": lambda: ops._bwd_op(g, q, k, v, out, lse, meta, None, lh, block, causal, scale, False),
        "public_fwd": public_fwd,
        "public_fwd_bwd_det": public_fwd_bwd(True),
        "public_fwd_bwd_atomic": public_fwd_bwd(False),
        "function_fwd_bwd_atomic": direct_fwd_bwd,
        "kernel_fwd_bwd_atomic": kernel_fwd_bwd,
        "engine_only": scale_fwd_bwd,
    }
    if args.flex:
        flex = _make_fns("flex", qg, kg, vg, layout, causal, args.pattern, g)[0]
        if flex is not None:
            fns["flex_fwd_bwd"] = flex[1]
    row["shape"] = [B, H, S, D]
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(args.rounds):  # interleaved rounds (reversed every other one), medians: the host drifts
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            samples[name].append(host_us(fns[name], n=args.calls))
    for name, times in samples.items():
        row[f"{name}_host_us"] = statistics.median(times)
        print(f"{name:24} host {row[f'{name}_host_us']:8.1f} us per call (median of {args.rounds})", flush=True)
    # the timeline of function_fwd_bwd_atomic: mean microseconds from each mark to the next
    marks.clear()
    for _ in range(args.calls):
        direct_fwd_bwd()
    torch.cuda.synchronize()
    steps: dict[str, list[float]] = {}
    for (name, t), (next_name, t_next) in zip(marks, marks[1:]):
        if next_name != "start":
            steps.setdefault(f"{name} -> {next_name}", []).append((t_next - t) * 1e6)
    row["timeline_us"] = {step: sum(times) / len(times) for step, times in steps.items()}
    for step, us in row["timeline_us"].items():
        print(f"  {step:45} {us:8.1f} us", flush=True)
    for name in ("kernel_fwd", "kernel_bwd_det", "kernel_bwd_det_device_descs", "kernel_bwd_atomic",
                 "public_fwd_bwd_det"):
        row[f"{name}_launch_us"] = launch_costs(fns[name])
        print(f"{name} host us per call in: " + ", ".join(f"{k} {v:.1f}" for k, v in row[f"{name}_launch_us"].items()),
              flush=True)
    for name in ("kernel_fwd_bwd_atomic", "function_fwd_bwd_atomic", "public_fwd_bwd_atomic"):
        print(f"--- {name}, torch.profiler by self CPU time\n{cpu_profile(fns[name])}", flush=True)
    for name in ("kernel_bwd_atomic", "public_fwd_bwd_atomic", "public_fwd_bwd_det"):
        row[f"{name}_syncs"] = synchronizations(fns[name])
        print(f"{name} synchronizations: {row[f'{name}_syncs']}", flush=True)
    for name in ("kernel_bwd_atomic", "public_fwd_bwd_atomic"):
        print(f"--- {name}, cumulative\n{python_profile(fns[name], top=30, sort='cumulative')}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": [row]}, fh, indent=1)


if __name__ == "__main__":
    main()
