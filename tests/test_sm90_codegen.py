"""The new kernel families (attention, 2:4) compile for Hopper (sm_90) on this CPU-only
machine: the interpreter checks their results, this checks the GPU code generation
(scripts/sm90_compile_check.py, in a subprocess without TRITON_INTERPRET)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sm90_compile_check.py"


@pytest.mark.filterwarnings("ignore")
def test_attention_and_2_4_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    compiled = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(compiled) >= 11 and "0 failure(s)" in result.stdout
