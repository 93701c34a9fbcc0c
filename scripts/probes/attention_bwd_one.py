"""The attention backward alone, a few times, on one of the suite's patterns: a target for
ncu (``STEPS=attn-bwd-ncu``), which profiles one launch of the dK/dV kernel after the
warm-up ones. ``--atomic``: ``deterministic=False`` (dQ added by the dK/dV kernel's TMA
reductions, no dQ kernel), else the deterministic default (dK/dV, then dQ).

Why: the backward decides issue 6's forward + backward ratio (local 1024: 1.97 ms with
``deterministic=False``, 2.12 ms deterministic; 1.3x Flex needs ~1.77 ms), and its
kernels were last profiled at 1beb88d, before the two-consumer split, the stats in shared
memory and the TMA-reduction dQ.

    python scripts/probes/attention_bwd_one.py --pattern local1024 --atomic --calls 4
"""

from __future__ import annotations

import argparse

import torch

from tilesparse.bench.attention import probe_inputs, suite_patterns
from tilesparse.kernels import attention as K


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pattern", default="local1024")
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--atomic", action="store_true", help="deterministic=False")
    p.add_argument("--calls", type=int, default=4, help="backward calls (ncu skips the first ones)")
    args = p.parse_args()
    if args.calls < 1:
        p.error(f"--calls must be at least 1, got {args.calls}")
    B, H, S, D, block, specs = suite_patterns()
    if args.pattern not in specs:
        p.error(f"--pattern: one of {sorted(specs)}, got {args.pattern!r}")
    D = args.head_dim or D
    layout, causal, (q, k, v, dout), meta, scale, row = probe_inputs(specs[args.pattern], B, H, S, D, block,
                                                                     tensors=4)
    out, lse = K.attention_forward(q, k, v, meta, None, layout.layout_heads, block, causal, scale)
    for _ in range(args.calls):
        K.attention_backward(dout, q, k, v, out, lse, meta, None, layout.layout_heads, block, causal, scale,
                             deterministic=not args.atomic)
    torch.cuda.synchronize()
    print(f"{args.pattern} (density {row['density']:.3f}), D {D}, deterministic={not args.atomic}: "
          f"{args.calls} backward calls")


if __name__ == "__main__":
    main()
