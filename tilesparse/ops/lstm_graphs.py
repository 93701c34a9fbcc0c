"""An eager LSTM sequence's time loop, replayed from a CUDA graph.

Eagerly, every timestep pays host time for its launches: on the H200's host, with the step plans,
~80 µs per forward timestep at batch 32 against ~13 µs of kernels at H 2048 (``scripts/probes/
lstm_step_profile.py``), so the loop runs at the host's pace, well behind cuDNN's fused LSTM. A
CUDA graph of the whole loop launches all its kernels in one call.

:func:`run` runs a time loop (``ops.lstm``'s forward or backward) under a key (the loop's options,
its inputs' shapes and dtypes, the weight's address and strides): the first call with a key runs
it eagerly (compiling the kernels, building the layout's tables, the warm-up a capture needs), the
second captures it into a graph whose tensor inputs are static copies, and from then on a call
copies its inputs in, replays the graph and returns copies of its outputs (a sequence's outputs are
saved for backward while the next call overwrites the graph's). The result is bitwise the eager
loop's: the same kernels run on the same inputs.

The graph reads the weight and the layout's tables where they were at capture; the key holds the
weight's address, so a call with another weight tensor gets its own graph, and the graphs live on
the layout's table tensor (``meta``), at most :data:`MAX_LOOPS` per table, least recently used
first out. The eager Function and the ops ``torch.compile`` traces both run their loops here; not used
while a CUDA graph is being captured already (``torch.compile``'s reduce-overhead mode records the loop
into its own graph, as ``make_graphed_callables`` does), on the CPU, for one timestep, or with
``TILESPARSE_LSTM_GRAPHS=off`` (read at import; ``GRAPHS`` at call time). A loop whose capture
fails runs eagerly from then on, with a warning.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict

import torch

from .._env import switch

__all__ = ["GRAPHS", "MAX_LOOPS", "run"]

GRAPHS = switch("TILESPARSE_LSTM_GRAPHS", True)
MAX_LOOPS = 6  # graphs kept per layout table: forward with and without saving and backward, each with and
# without initial states (each graph keeps its static buffers, about a sequence's activations)

_CACHE = "_tilesparse_lstm_loops"
_WARM = object()  # the key's first call ran eagerly: the next one captures
_FAILED = object()  # the capture raised: eager from then on


class _Loop:
    """One captured loop: its graph, static inputs (None where the loop got None) and outputs."""

    __slots__ = ("graph", "inputs", "outputs")

    def __init__(self, fn, inputs: tuple):
        self.inputs = tuple(None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)
                            for t in inputs)
        self._copy_in(inputs)
        self.graph = torch.cuda.CUDAGraph()
        # thread-local: autograd's worker thread captures the backward while the caller's thread waits
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.outputs = fn(*self.inputs)

    def _copy_in(self, inputs: tuple) -> None:
        for static, t in zip(self.inputs, inputs):
            if static is not None:
                static.copy_(t)

    def __call__(self, inputs: tuple) -> tuple:
        self._copy_in(inputs)
        self.graph.replay()
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in self.outputs)


def _spec(t) -> tuple | None:
    return None if t is None else (tuple(t.shape), t.dtype)


def run(fn, inputs: tuple, weight: torch.Tensor, meta: torch.Tensor, options: tuple, steps: int) -> tuple:
    """``fn(*inputs)``: a time loop of ``steps`` timesteps over ``inputs`` (tensors or None; copied
    into the graph's static inputs) that also reads ``weight`` and ``meta`` in place, ``options``
    (hashable) whatever else shapes the loop; returns its tuple of outputs (tensors or None), from a
    CUDA-graph replay where the module docstring says."""
    if not _replayable(meta, steps):
        return fn(*inputs)
    key = (options, tuple(map(_spec, inputs)), weight.data_ptr(), tuple(weight.shape), weight.stride(),
           weight.dtype)
    loops = meta.__dict__.get(_CACHE)
    if loops is None:
        loops = meta.__dict__[_CACHE] = OrderedDict()
    loop = loops.get(key)
    if loop is None or loop is _FAILED:
        if loop is None:
            loops[key] = _WARM
            while len(loops) > MAX_LOOPS:
                loops.popitem(last=False)
        return fn(*inputs)
    loops.move_to_end(key)
    if loop is _WARM:
        try:
            loop = loops[key] = _capture(fn, inputs)
        except Exception as exc:  # (an op the capture does not allow): eager is still right
            loops[key] = _FAILED
            warnings.warn(f"tilesparse: the LSTM time loop could not be captured in a CUDA graph and runs "
                          f"eagerly ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=3)
            return fn(*inputs)
    return loop(inputs)


def _replayable(meta: torch.Tensor, steps: int) -> bool:
    """Whether a loop on ``meta``'s device may run from a graph (see the module docstring)."""
    return GRAPHS and steps > 1 and meta.is_cuda and not torch.cuda.is_current_stream_capturing()


def _capture(fn, inputs: tuple) -> _Loop:
    """The captured loop (a separate function, so tests can stand in for CUDA graphs)."""
    return _Loop(fn, inputs)
