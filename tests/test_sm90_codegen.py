"""The newer kernel families (attention, 2:4, the small-batch dds, the warp-specialized dds) compile for Hopper (sm_90) on this CPU-only
machine: the interpreter checks their results, this checks the GPU code generation
(scripts/sm90_compile_check.py, in a subprocess without TRITON_INTERPRET)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sm90_compile_check.py"


@pytest.mark.filterwarnings("ignore")
def test_attention_2_4_small_batch_and_ws_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    compiled = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) >= 15 and "0 failure(s)" in result.stdout
    # the small-batch kernel at M 64: 32-wide slices run mma.sync; swapped, the batch
    # rows are the MMA's M side and Hopper's wgmma is used
    small = {line.split(":")[0]: line for line in compiled if "small dds" in line}
    assert small and all(("wgmma 0," in line) != ("swap=True" in line) for line in small.values())
    # the Gluon warp-specialized dds and sdd: wgmma in the consumers, registers moved
    # between the partitions (setmaxnreg)
    ws = [line for line in compiled if line.startswith("ok    ws ")]
    assert any("ws sdd" in line for line in ws) and all("wgmma 0," not in line and "setmaxnreg" in line for line in ws)
    # the column-grouped dds: both activation paths compiled, and ptxas kept its wgmma
    # asynchronous (the script fails a grouped case whose ptxas report says C7512)
    grouped = [line for line in ws if line.startswith("ok    ws group")]
    assert {("a_from_registers=True" in line) for line in grouped} == {True, False}


def test_every_compile_case_has_a_label_of_its_own():
    # the PTX fingerprints are keyed by label: a repeated one would hide a case (the attention preprocess
    # kernel was listed once per block size with the same constants)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import collections; from sm90_cases import all_cases; "
            "labels = [case[0] for case in all_cases(False)]; "
            "print(len(labels), [k for k, n in collections.Counter(labels).items() if n > 1])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                            cwd=SCRIPT.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    count, repeated = result.stdout.split(" ", 1)
    assert int(count) > 500 and repeated.strip() == "[]"


def test_ptx_fingerprint_ignores_debug_information_only():
    # scripts/sm90_ptx_fingerprints.py: a refactor that moves lines or adds helper functions
    # changes .loc lines, inlined-scope labels and the DWARF sections, not the fingerprint;
    # a changed instruction changes it
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from sm90_ptx_fingerprints import fingerprint
    finally:
        sys.path.remove(str(SCRIPT.parent))
    ptx = ("\t.loc\t1 317 0   // k.py:317:0\n$L__tmp9:\n\tadd.s32 \t%r1, %r2, %r3;  // k.py:317\n"
           "\tbra.uni \t$L__tmp9;\n\t.file\t1 \"/a/k.py\"\n.b8 83  // DW_AT_call_line\n")
    moved = ("\t.loc\t1 314 0   // k.py:314:0\n$L__tmp12:\n\tadd.s32 \t%r1, %r2, %r3;  // k.py:314\n"
             "\tbra.uni \t$L__tmp12;\n\t.file\t1 \"/b/k.py\"\n.b8 80  // DW_AT_call_line\n")
    assert fingerprint(ptx) == fingerprint(moved)
    assert fingerprint(ptx) != fingerprint(ptx.replace("add.s32", "sub.s32"))


def test_spill_report_reads_ptxas_last_kernel_line():
    # scripts/sm90_compile_check.py --spills: the last 'stack frame, spill stores, spill
    # loads' line of ptxas -v (its per-kernel summary), shortened
    from script_modules import load_script

    report = load_script("scripts/ptxas_report.py")
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for helper\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Function properties for k\n"
           "    80 bytes stack frame, 132 bytes spill stores, 124 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 3 barriers, 80 bytes cumulative stack size\n")
    assert report.spill_report(log) == "stack 80 B, spill stores 132 B, spill loads 124 B"
    assert report.spill_report("ptxas info    : Used 32 registers\n") == "spills: no report"


def test_loop_report_counts_the_longest_loop_of_an_nvdisasm_listing():
    # scripts/sm90_compile_check.py --sass-loop: the span from a label to the last branch
    # back to it; a forward branch is not a loop, and the longer of two loops is reported
    from script_modules import load_script

    report = load_script("scripts/ptxas_report.py")
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FFMA R2, R3, R4, R2 ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
        /*0030*/                   BRA `(.L_x_2) ;
.L_x_1:
        /*0040*/                   PRMT R5, R6, 0x7632, R5 ;
        /*0050*/                   FFMA.FTZ R2, R3, R4, R2 ;
        /*0060*/                   FFMA R7, R3, R4, R7 ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @!P1 BRA `(.L_x_1) ;
.L_x_2:
        /*0090*/                   EXIT ;
"""
    assert report.loop_report(sass) == "loop 5 instructions: FFMA 2, BAR 1, BRA 1, PRMT 1"
    assert report.loop_report(sass, top=1) == "loop 5 instructions: FFMA 2"
    assert report.loop_report("        /*0000*/                   EXIT ;\n") == "loop: none found"
