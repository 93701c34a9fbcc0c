"""Test set-up: run Triton kernels under the interpreter when there is no GPU.

TRITON_INTERPRET must be set before any kernel is decorated, i.e. before tilesparse's
kernel modules are imported, so it is set here, at collection start.
"""

import os
import random
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Kernel outputs start as NaN, so an element a kernel forgets to write fails the test.
os.environ.setdefault("TILESPARSE_POISON", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()


# Fresh inputs every run, replayable: the run's base seed is printed in the header and
# TILESPARSE_TEST_SEED=<seed> replays it.
BASE_SEED = int(os.environ.get("TILESPARSE_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"tilesparse: TILESPARSE_TEST_SEED={BASE_SEED}, TRITON_INTERPRET={int(INTERPRET)}, cuda={HAS_CUDA}"


def pytest_collection_modifyitems(config, items):
    # TILESPARSE_SHARD=i/n keeps every n-th test (by a stable hash of its id), so n
    # processes can share the GPU suite and compile kernels in parallel.
    shard = os.environ.get("TILESPARSE_SHARD")
    if shard:
        index, count = map(int, shard.split("/"))
        keep = [it for it in items if zlib.crc32(it.nodeid.encode()) % count == index]
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
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
    seed = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % (2**31)
    torch.manual_seed(seed)
    yield
