#!/usr/bin/env bash
# Create .venv and install tilesparse with its test extras.
# torch is installed explicitly first, pinned to the CPU build that lies on this kind of
# machine's disk: a plain `torch` requirement would pull a multi-GB CUDA build. Where a
# torch is already importable (a GPU machine's image), the venv sees it and keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv --system-site-packages .venv
fi
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q torch==2.13.0
fi
if ! "$VPY" -c "import triton" 2>/dev/null; then
  # Same triton as the H200 image (3.6); its CPU interpreter needs numpy < 2.3.
  "$VPY" -m pip install -q triton==3.6.0
fi
"$VPY" -m pip install -q 'numpy<2.3' -e '.[test]'
# The Hugging Face example's test needs transformers; best effort, so that a machine
# without it still runs everything else (the test then reports itself skipped).
"$VPY" -m pip install -q -e '.[hf]' 2>/dev/null || echo "setup.sh: transformers not installed; the Hugging Face test will be skipped"
