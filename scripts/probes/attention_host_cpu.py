"""The attention launchers' own Python per call, on this CPU: the kernel layer
(tilesparse.kernels.attention's forward and deterministic backward) with every launch
going through tilesparse.kernels._launch's fast path up to, not including, Triton's
compiled launcher (a stand-in takes the call), on CPU tensors passed off as an H200's
(sm90 checks, 132 SMs, 227 KB of shared memory). No GPU: for changes to the launchers'
host code, measured where the device's time is short. The H200 machine's host ran this
Python ~1.5-4x slower than this CPU in the twenty-fourth session (attention_host.py there).

    python scripts/probes/attention_host_cpu.py [--pattern local1024] [--seq 2048] [--no-plans]
        [--profile tottime|cumulative]

Twenty-fourth session (this CPU, local 1024, S 2048): forward 84 -> 64-75 µs, deterministic
backward 248 -> 191-194 µs with the remembered kernel choice and the one-pass descriptor
specs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import types

import torch

from tilesparse.bench.attention import build_layout, suite_patterns
from tilesparse.kernels import _launch
from tilesparse.kernels import attention as K


class _NoLaunch:
    """Stands in for a compiled kernel: ``run`` takes the launch's arguments and returns."""

    function = packed_metadata = None

    @staticmethod
    def run(*args):
        return None


class _EveryKey(dict):
    """_launch's table of compiled kernels, answering every key with :class:`_NoLaunch`."""

    def get(self, key, default=None):
        return _NoLaunch


def pass_off_as_hopper() -> None:
    """Patch the device queries and the launch's last step (see the module docstring)."""
    _launch._COMPILED = _EveryKey()
    _launch._cuda_index = lambda arg: 0
    _launch.driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_stream=lambda device: 0))
    torch.cuda.current_device = lambda: 0
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("tilesparse"):
            continue
        for name, stand_in in (("hopper_reason", lambda t, fp32=False: None), ("sm_count", lambda device: 132),
                               ("shared_memory_bytes", lambda device: 232448), ("capability_major", lambda d: 9)):
            if hasattr(module, name):
                setattr(module, name, stand_in)


def best_us(fn, calls: int = 100, repeats: int = 7) -> float:
    """The fastest of ``repeats`` means over ``calls`` back-to-back calls (this machine's
    other load only ever adds time)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    _, H, _, D, block, specs = suite_patterns()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pattern", default="local1024", choices=sorted(specs))
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--no-plans", action="store_true", help="choose the kernels on every call")
    p.add_argument("--profile", choices=["tottime", "cumulative"], help="also cProfile the backward")
    args = p.parse_args()
    pass_off_as_hopper()
    K._plans_apply = lambda q: not args.no_plans
    B, S = args.batch, args.seq
    q, k, v, g, out = (torch.randn(B, H, S, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.randn(B, H, S)
    spec = specs[args.pattern]
    layout, causal = build_layout(spec, S, block, H), bool(spec.get("causal", False))
    meta, heads, scale = layout.meta_on("cpu", causal), layout.layout_heads, D ** -0.5

    def backward():
        return K.attention_backward(g, q, k, v, out, lse, meta, None, heads, block, causal, scale)

    print(f"forward  {best_us(lambda: K.attention_forward(q, k, v, meta, None, heads, block, causal, scale)):7.1f} µs")
    print(f"backward {best_us(backward):7.1f} µs (deterministic)")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            backward()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(args.profile).print_stats(25)
        print(text.getvalue())


if __name__ == "__main__":
    main()
