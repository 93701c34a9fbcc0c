"""The user guide's code runs as written (on the CPU path), so the documentation
cannot drift from the API."""

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_guide_has_code():
    assert len(BLOCKS) >= 5


def test_guide_code_runs_in_order(tmp_path, monkeypatch):
    # One namespace for the whole page: later blocks use names defined earlier.
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(BLOCKS):
        try:
            exec(compile(block, f"{GUIDE.name} block {i + 1}", "exec"), namespace)
        except Exception as exc:  # name the block that broke
            pytest.fail(f"docs/guide.md python block {i + 1} failed: {type(exc).__name__}: {exc}")


def test_api_reference_is_up_to_date_and_complete():
    # docs/api.md is generated from the docstrings; every public name and method has one.
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_api_docs.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
