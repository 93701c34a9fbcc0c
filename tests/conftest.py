"""Test set-up: run Triton kernels under the interpreter when there is no GPU.

TRITON_INTERPRET must be set before any kernel is decorated, i.e. before tilesparse's
kernel modules are imported, so it is set here, at collection start.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Kernel outputs start as NaN, so an element a kernel forgets to write fails the test.
os.environ.setdefault("TILESPARSE_POISON", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_interp = pytest.mark.skip(reason="needs TRITON_INTERPRET=1 (CPU interpreter run)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "interpreter" in item.keywords and not INTERPRET:
            item.add_marker(skip_interp)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """A different but reproducible seed per test: fresh random inputs, replayable failures."""
    seed = abs(hash(request.node.nodeid)) % (2**31)
    torch.manual_seed(seed)
    yield
