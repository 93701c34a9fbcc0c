"""Compile Triton kernels for Hopper (sm_90) on a machine without a GPU.

The CPU test suite runs the kernels under the Triton interpreter, which checks their
results but not that they compile for a GPU (layouts, shared memory, tuple returns...).
This script compiles them with ``triton.compile(ASTSource(...), target=sm_90)``, which
needs only the ptxas bundled with Triton, and exits 1 if any fails. It must run without
TRITON_INTERPRET (the interpreter replaces the JIT functions). The cases live in
``sm90_cases.py`` beside it (the attention kernels' in ``sm90_attention_cases.py``).

    python scripts/sm90_compile_check.py            # the attention, 2:4 and small-batch kernels, all variants
    python scripts/sm90_compile_check.py --quick    # one variant of each (tests/test_sm90_codegen.py)
    python scripts/sm90_compile_check.py --spills --match "dK/dV"   # with ptxas's spill bytes per case
    python scripts/sm90_compile_check.py --sass-loop --match gemv     # the main loop's SASS instruction mix
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the interpreter replaces the kernels being compiled")

import triton  # noqa: E402
from triton.backends.nvidia import compiler as nv_compiler  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ptxas_report import loop_report, spill_report  # noqa: E402  (this folder's)
from sm90_cases import TARGET, all_cases  # noqa: E402  (this folder's)


def _ptxas_log(ptx: str) -> str:
    """The bundled ptxas's -v report on ``ptx``, with Triton's own flags for sm_90
    (-lineinfo, --gpu-name=sm_90a): registers, spills, and performance notes such as
    C7512 (wgmma serialized), which appear only there."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([nv_compiler.get_ptxas(TARGET.arch).path, "-lineinfo", "-v",
                              f"--gpu-name={nv_compiler.sm_arch_from_capability(TARGET.arch)}", str(src),
                              "-o", str(Path(tmp) / "k.o")], capture_output=True, text=True, check=True)
    return res.stdout + res.stderr


def _sass(cubin: bytes) -> str:
    """The bundled nvdisasm's listing of a compiled kernel (labels and branch targets kept)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([triton.knobs.nvidia.nvdisasm.path, "-c", str(path)], capture_output=True, text=True,
                              check=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one variant of each kernel")
    parser.add_argument("--spills", action="store_true",
                        help="also run ptxas -v on each case and print its stack frame and spill bytes")
    parser.add_argument("--sass-loop", action="store_true",
                        help="also disassemble each case (nvdisasm) and print its longest loop's instruction mix")
    parser.add_argument("--match", default="", help="only the cases whose label contains this")
    args = parser.parse_args()
    failures = 0
    for label, fn, sig, constexprs, warps, stages, *extra in all_cases(args.quick):
        if args.match not in label:
            continue
        try:
            attrs = extra[0] if extra else None
            source_kind = extra[1] if len(extra) > 1 else ASTSource
            source = source_kind(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
            compiled = triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})
            ptx = compiled.asm["ptx"]
            mma = f"wgmma {ptx.count('wgmma.mma_async')}, mma.sync {ptx.count('mma.sync')}, cp.async {ptx.count('cp.async')}"
            if "setmaxnreg" in ptx:
                mma += f", setmaxnreg {ptx.count('setmaxnreg')}"
            if label.endswith(" pdl"):
                if not ("griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx):
                    raise RuntimeError("a PDL kernel without griddepcontrol.wait / launch_dependents in its PTX")
                first_access = min((i for i in (ptx.find(op) for op in ("ld.global", "st.global", "atom.", "cp.async"))
                                    if i >= 0), default=len(ptx))
                if ptx.index("griddepcontrol.wait") > first_access:
                    raise RuntimeError("a PDL kernel touches global memory before griddepcontrol.wait")
            if label.startswith("ws attention") and (" staged" in label or " ring_stores" in label):
                # outputs staged through shared memory leave in 16-byte stores (the point of staging)
                if "st.global.v4" not in ptx:
                    raise RuntimeError("a staged-stores attention case without 16-byte global stores")
                mma += f", st.global.v4 {ptx.count('st.global.v4')}"
            if "griddepcontrol" in ptx:
                mma += f", griddepcontrol {ptx.count('griddepcontrol')}"
            if " atomic_dq " in label:  # dQ's shares leave by TMA reductions
                if "cp.reduce.async.bulk.tensor" not in ptx:
                    raise RuntimeError("an atomic-dQ kernel without cp.reduce.async.bulk.tensor in its PTX")
                mma += f", cp.reduce.async.bulk.tensor {ptx.count('cp.reduce.async.bulk.tensor')}"
            # the kernels whose wgmmas take A from registers: ptxas must keep them asynchronous
            register_a = label.startswith(("ws group", "resident columns"))
            log = _ptxas_log(ptx) if args.spills or register_a else ""  # ptxas once per case
            if register_a and "instructions are serialized" in log:
                raise RuntimeError("ptxas serializes the wgmma (C7511 / C7512): an operand held in flight it "
                                   "cannot keep")
            if args.spills:
                mma += ", " + spill_report(log)
            if args.sass_loop:
                mma += ", " + loop_report(_sass(compiled.asm["cubin"]))
            print(f"ok    {label}: shared memory {compiled.metadata.shared} B, {mma}")
        except Exception as exc:  # noqa: BLE001 (report every failure, then exit 1)
            failures += 1
            cause = f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
            print(f"FAIL  {label}: {type(exc).__name__}: {str(exc)[-1500:]}{cause[:1500]}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
