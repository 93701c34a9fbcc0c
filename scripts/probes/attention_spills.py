"""Registers, spills, shared memory and MMA instructions of the fused attention kernels
compiled for Hopper (sm_90), on a machine without a GPU.

Each case is compiled as ``scripts/sm90_compile_check.py`` does (``triton.compile`` of an
``ASTSource`` for ``GPUTarget("cuda", 90, 32)``). The compiled kernel's metadata carries
no register count without a driver (``n_regs``/``n_spills`` are filled in when a CUDA
context loads the binary), so the PTX goes through Triton's bundled ptxas again with
Triton's flags and ``-v``: registers per thread, stack frame and spill store/load bytes.
The cubin's SASS (bundled cuobjdump) gives the local-memory instructions (STL/LDL);
shared memory is the compiled metadata's ``shared``; wgmma and mma.sync are counted in
the PTX (static instructions, not executions). Not part of the library: a diagnostic.
Must run without TRITON_INTERPRET=1.

    python scripts/probes/attention_spills.py                  # the default table (dK/dV variants)
    python scripts/probes/attention_spills.py --case dkdv:64x128:w8:s2:tma:two_pass --causal 1
    python scripts/probes/attention_spills.py --json /tmp/spills.json --jobs 2

A case is KIND:BMxBN:wWARPS:sSTAGES[:rMAXNREG][:tma][:two_pass][:atomic_dq][:split_last],
KIND one of fwd, dkdv, dq (KIND alone, ``--case dkdv``: attention_config's config);
rMAXNREG caps the registers per thread (AttentionConfig.maxnreg, e.g. r128: two CTAs of
8 warps per SM).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the interpreter replaces the kernels being compiled")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.nvidia import compiler as nv_compiler  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sm90_attention_cases import _attention_signature  # noqa: E402
from sm90_compile_check import TARGET, _ptxas_log  # noqa: E402
from tilesparse.kernels import attention as attn  # noqa: E402

KERNELS = {"fwd": attn._fwd_kernel, "dkdv": attn._bwd_dkdv_kernel, "dq": attn._bwd_dq_kernel}
FLAGS = ("tma", "two_pass", "atomic_dq", "split_last", "store_ds")

# The default table: the measured (default) config of each pass at b 128, D 128, and
# dK/dV variants around it: the single pass (two fp32 accumulators) and TWO_PASS (one),
# at BLOCK_N 128 and 64, 4 and 8 warps, with register caps, and the atomic-dQ opt-out.
DEFAULT_CASES = (
    "fwd", "dq", "dkdv",
    "dkdv:64x128:w8:s2:tma:two_pass",
    "dkdv:64x128:w8:s3:tma:two_pass",
    "dkdv:64x128:w4:s2:tma",
    "dkdv:64x128:w4:s2:tma:two_pass",
    "dkdv:128x128:w8:s2:tma:two_pass",
    "dkdv:32x128:w8:s2:tma:two_pass",
    "dkdv:32x128:w4:s2:tma:two_pass",
    "dkdv:64x64:w4:s2:tma",
    "dkdv:64x64:w4:s2:tma:two_pass",
    "dkdv:64x64:w8:s2:tma",
    "dkdv:64x64:w8:s2:tma:two_pass",
    "dkdv:128x64:w8:s2:tma:two_pass",
    # register caps (AttentionConfig.maxnreg) for more CTAs per SM: 2 x 8 warps, 3 x 4 warps
    "dkdv:64x64:w8:s2:r128:tma",
    "dkdv:64x64:w8:s2:r128:tma:two_pass",
    "dkdv:32x64:w4:s2:r168:tma:two_pass",
    "dkdv:64x128:w8:s2:tma:atomic_dq",
    "dkdv:64x128:w8:s2:tma:two_pass:atomic_dq",
)


def parse_case(text: str, block: int, head_dim: int, dtype: torch.dtype) -> tuple[str, attn.AttentionConfig, set]:
    """(kind, config, flags) of a case string (see the module docstring)."""
    kind, *rest = text.split(":")
    if kind not in KERNELS:
        raise ValueError(f"kind must be one of {sorted(KERNELS)}, got {kind!r}")
    if not rest:
        cfg = attn.attention_config(kind, block, head_dim, dtype)
        return kind, cfg, {"tma"} if cfg.tma else set()
    bm, bn = (int(v) for v in rest[0].split("x"))
    warps, stages, maxnreg, flags = 4, 2, None, set()
    for item in rest[1:]:
        if item.startswith("w") and item[1:].isdigit():
            warps = int(item[1:])
        elif item.startswith("s") and item[1:].isdigit():
            stages = int(item[1:])
        elif item.startswith("r") and item[1:].isdigit():
            maxnreg = int(item[1:])
        elif item in FLAGS:
            flags.add(item)
        else:
            raise ValueError(f"unknown case field {item!r} in {text!r}")
    cfg = attn.AttentionConfig(bm, bn, warps, stages, tma="tma" in flags, split_last="split_last" in flags,
                               two_pass="two_pass" in flags, maxnreg=maxnreg)
    return kind, cfg, flags


def case_label(kind: str, cfg: attn.AttentionConfig, flags: set) -> str:
    extra = "".join(f"+{f}" for f in FLAGS if f in flags)
    regs = f" r{cfg.maxnreg}" if cfg.maxnreg else ""
    return f"{kind} {cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}{regs}{extra}"


def constexprs(kind: str, cfg: attn.AttentionConfig, flags: set, block: int, head_dim: int, causal: bool,
               kpm: bool) -> dict:
    """The launcher's constexprs for this case (every constexpr given: one left out would
    compile as a runtime int)."""
    d_tile = max(16, triton.next_power_of_2(head_dim))
    tma = "tma" in flags and head_dim == d_tile
    const = dict(BS=block, D=head_dim, D_TILE=d_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
                 HAS_KPM=kpm, INPUT_PRECISION="ieee", TMA=tma)
    if kind == "dkdv":
        atomic = "atomic_dq" in flags
        const.update(ATOMIC_DQ=atomic, TMA_REDUCE=atomic and tma, TWO_PASS=cfg.two_pass, STORE_DS="store_ds" in flags)
    elif kind == "fwd":
        const.update(SPLIT_LAST=cfg.split_last and not kpm)
    return const


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_usage(ptx: str) -> dict:
    """Registers per thread, stack frame and spill bytes from the bundled ptxas -v
    (``sm90_compile_check._ptxas_log``: Triton's own flags for sm_90)."""
    log = _ptxas_log(ptx)
    regs = _PTXAS_REGS.search(log)
    stack = _PTXAS_STACK.search(log)
    return {"regs": int(regs.group(1)) if regs else None,
            "stack_B": int(stack.group(1)) if stack else None,
            "spill_store_B": int(stack.group(2)) if stack else None,
            "spill_load_B": int(stack.group(3)) if stack else None}


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
_LOCAL = re.compile(r"\b(STL|LDL)[.\s]")
_MMA = re.compile(r"\b(HGMMA|HMMA)\.")
_EXIT = re.compile(r"\bEXIT\b")


def sass_local_ops(cubin: bytes) -> dict:
    """Static counts in the SASS (bundled cuobjdump): local-memory stores/loads (STL/LDL:
    spills and their reloads) in the whole kernel and inside its MMA loops (the innermost
    backward-branch ranges holding an HGMMA/HMMA: the per-block-pair work; spills outside
    them are paid once per program), and HGMMA instructions."""
    cuobjdump = Path(nv_compiler.get_ptxas(TARGET.arch).path).with_name("cuobjdump")
    if not cuobjdump.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True)
    if res.returncode:
        return {}
    code = [(int(m.group(1), 16), m.group(2)) for m in _SASS_LINE.finditer(res.stdout)]
    loops = []  # (start, end) of each backward branch's range
    for addr, text in code:
        br = _BRANCH.search(text)
        if br and int(br.group(1), 16) <= addr:
            loops.append((int(br.group(1), 16), addr))

    def count(pattern, lo=-1, hi=1 << 62):
        return sum(1 for addr, text in code if lo <= addr <= hi and pattern.search(text))

    # out-of-line blocks placed after EXIT branch back into the body: not loops
    hot = [(lo, hi) for lo, hi in loops if count(_MMA, lo, hi) and not count(_EXIT, lo, hi)]
    inner = [(lo, hi) for lo, hi in hot if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in hot)]
    in_loops = sum(count(_LOCAL, lo, hi) for lo, hi in inner)
    return {"sass_local": count(_LOCAL), "sass_local_in_mma_loops": in_loops, "mma_loops": len(inner),
            "sass_HGMMA": sum(1 for _, text in code if text.lstrip("@!P0123456789T ").startswith("HGMMA"))}


def measure(job: tuple) -> dict:
    """Compile one case and read its resource use (run in a worker process)."""
    kind, cfg, flags, block, head_dim, dtype_name, causal, kpm = job
    fn = KERNELS[kind]
    const = constexprs(kind, cfg, flags, block, head_dim, causal, kpm)
    row = {"kernel": kind, "case": case_label(kind, cfg, flags), "block": block, "head_dim": head_dim,
           "dtype": dtype_name, "causal": causal, "kpm": kpm}
    try:
        source = ASTSource(fn=fn, signature=_attention_signature(fn, dtype_name, const), constexprs=const)
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        if cfg.maxnreg:
            options["maxnreg"] = cfg.maxnreg
        compiled = triton.compile(source, target=TARGET, options=options)
    except Exception as exc:  # noqa: BLE001 (report, keep going)
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        return row
    ptx = compiled.asm["ptx"]
    row.update(ptxas_usage(ptx))
    row.update(sass_local_ops(compiled.asm["cubin"]))
    row.update(shared_B=compiled.metadata.shared, wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"))
    return row


def fmt(row: dict) -> str:
    head = f"{row['case']:42} causal={int(row['causal'])} kpm={int(row['kpm'])}"
    if "error" in row:
        return f"{head}  FAILED {row['error']}"
    local = (f"  STL+LDL {row['sass_local']:4} ({row['sass_local_in_mma_loops']} in {row['mma_loops']} MMA loops)"
             if "sass_local" in row else "")
    return (f"{head}  regs {row['regs']:3}  stack {row['stack_B']:5} B  spill st/ld {row['spill_store_B']:5}/"
            f"{row['spill_load_B']:5} B{local}  smem {row['shared_B'] / 1024:6.1f} KB  wgmma {row['wgmma']:3}  "
            f"mma.sync {row['mma_sync']:3}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="KIND[:BMxBN:wW:sS[:tma][:two_pass]...] (repeatable; "
                        "default: the table in DEFAULT_CASES)")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--causal", choices=("0", "1", "both"), default="both")
    parser.add_argument("--kpm", action="store_true", help="with a key padding mask")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cases = [parse_case(c, args.block, args.head_dim, dtype) for c in (args.case or DEFAULT_CASES)]
    causals = {"0": (False,), "1": (True,), "both": (False, True)}[args.causal]
    jobs = [(kind, cfg, flags, args.block, args.head_dim, args.dtype, causal, args.kpm)
            for kind, cfg, flags in cases for causal in causals]
    print(f"sm_90, b {args.block}, D {args.head_dim}, {args.dtype}, kpm={args.kpm}; ptxas -v (regs per thread, "
          f"stack/spills per thread), SASS local-memory instructions, shared memory, PTX MMA instructions")
    rows = []
    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            for row in pool.map(measure, jobs):
                print(fmt(row), flush=True)
                rows.append(row)
    else:
        for job in jobs:
            rows.append(measure(job))
            print(fmt(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
