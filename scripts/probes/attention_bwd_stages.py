"""The warp-specialized backward kernels at more ring stages: dK/dV (two consumers) at 2,
3 and 4 stages of query / output-gradient tiles, dQ (two consumers) at key tiles of 128
(2 stages: the most that fit) or of 64 (2-4 stages); each kernel timed with the other at
the default, on the attention suite's patterns (B 4, H 16, S 8192, D 128, blocks of 128,
bf16), one process; gradients must be bitwise the default's (the same products in the
same order).

Why: ncu on local 1024 (1beb88d) found the consumers of both kernels waiting at barriers
52-58 % of their cycles; with 2 stages the producer is at most one tile ahead of a
~1000-cycle step.

    python scripts/probes/attention_bwd_stages.py --out attention-bwd-stages.json
"""

from __future__ import annotations

from attention_bwd_overlap import backward_variants, describe  # (this folder: the probes run as scripts)
from tilesparse.bench.attention import probe_main
from tilesparse.kernels.attention_ws import DkdvWsConfig, DqWsConfig

DKDV = {f"dkdv_s{s}": DkdvWsConfig(64, s, consumers=2) for s in (2, 3, 4)}
DQ = {"dq_n128_s2": DqWsConfig(128, 128, 2, consumers=2),
      **{f"dq_n64_s{s}": DqWsConfig(128, 64, s, consumers=2) for s in (2, 3, 4)}}


def run_pattern(spec: dict, B: int, H: int, S: int, D: int, block: int, flex: bool) -> dict:
    return backward_variants(spec, B, H, S, D, block, DKDV, DQ, (DKDV["dkdv_s2"], DQ["dq_n128_s2"]), {},
                             set(DKDV) | set(DQ))


if __name__ == "__main__":
    probe_main(__doc__.splitlines()[0], run_pattern, describe, "(unused)")
