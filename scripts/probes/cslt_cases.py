"""Which cuSPARSELt calls (through torch) work on this GPU: dtype x bias x M x algorithm
(searched or the default), each in its own process, because a crash inside cuSPARSELt
(an illegal instruction) poisons the CUDA context for the rest of a process.

The GPU suite found `torch._cslt_sparse_mm_search` on an fp16 weight with bias and
transpose_result=True crashing the context on the H200 (bf16 passed). This probe maps
where it happens so that `semi24.cusparselt.cslt_algorithm` can avoid it. Not part of the
library; its findings go into semi24/linear.py with a line in docs/notes.md.

    python scripts/probes/cslt_cases.py --out /tmp/cslt-cases.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys

CASE = r"""
import sys, torch
dtype = getattr(torch, sys.argv[1]); bias = sys.argv[2] == "1"; m = int(sys.argv[3]); search = sys.argv[4] == "1"
n, k = 512, 1024
w = torch.randn(n, k, device="cuda", dtype=dtype)
w = w * torch.tensor([1, 1, 0, 0], device="cuda", dtype=dtype).repeat(k // 4)  # 2:4 in rows
packed = torch._cslt_compress(w)
b = torch.randn(m, k, device="cuda", dtype=dtype).t()
bvec = torch.randn(n, device="cuda", dtype=dtype) if bias else None
alg = int(torch._cslt_sparse_mm_search(packed, b, bias=bvec, transpose_result=True)) if search else 0
out = torch._cslt_sparse_mm(packed, b, bias=bvec, transpose_result=True, alg_id=alg)
want = b.t().float() @ w.float().t() + (bvec.float() if bias else 0)
err = ((out.float() - want).norm() / want.norm()).item()
torch.cuda.synchronize()
print(f"alg={alg} err={err:.2e}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for dtype, bias, m, search in itertools.product(["float16", "bfloat16"], ["0", "1"], [104, 4096], ["0", "1"]):
        proc = subprocess.run([sys.executable, "-c", CASE, dtype, bias, str(m), search],
                              capture_output=True, text=True, timeout=120)
        ok = proc.returncode == 0
        detail = proc.stdout.strip() if ok else (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        rows.append(dict(dtype=dtype, bias=bias == "1", m=m, search=search == "1", ok=ok, detail=detail))
        print(f"{dtype:9s} bias={bias} M={m:5d} search={search}: {'ok ' if ok else 'FAIL'} {detail}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
