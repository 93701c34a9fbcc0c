"""An eager LSTM sequence's time loop, replayed from a CUDA graph.

Eagerly, every timestep pays host time for its launches: on the H200's host, with the step plans,
~80 µs per forward timestep at batch 32 against ~13 µs of kernels at H 2048 (``scripts/probes/
lstm_step_profile.py``), so the loop runs at the host's pace, well behind cuDNN's fused LSTM. A
CUDA graph of the whole loop launches all its kernels in one call.

:func:`run` runs a time loop (``ops.lstm``'s forward or backward) under a key (the loop's options,
its inputs' shapes and dtypes, the weight's address, shape, strides and dtype, the device and the
caller's stream): the first call with a key runs the loop on contiguous copies of its inputs (as the
graph will see them: compiling the kernels, building the layout's tables, the warm-up a capture
needs), the second captures it into a graph whose tensor inputs are static contiguous buffers, and
from then on a call copies its inputs in, replays the graph and returns copies of its outputs (a
sequence's outputs are saved for backward while the next call overwrites the graph's). The result is
bitwise the Python loop's on contiguous inputs: the same kernels run on the same values.

The graph reads the weight and the layout's tables where they were at capture: the key holds the
weight's address, so a call with another weight tensor gets its own graph, and an optimizer's
in-place updates are read at the next replay. Graphs are kept per layout table tensor (``meta``,
weakly: they go with the layout), at most :data:`MAX_LOOPS` each, least recently used out; each
holds about twice a sequence's activations (its static inputs and outputs). :func:`clear` drops
them all. Captures run on a side stream of the layout's device, with the statics allocated there
(outside any memory pool the caller's stream is routed to); a call's copy-in, replay and copy-out
are enqueued under a lock, so threads sharing a key do not interleave them.

The eager Function and the ops ``torch.compile`` traces both run their loops here. Not used while a
CUDA graph is being captured already (``torch.compile``'s reduce-overhead mode records the loop into
its own graph, as ``make_graphed_callables`` does), on the CPU, for one timestep, or with
``TILESPARSE_LSTM_GRAPHS=off`` (read at import; ``GRAPHS`` at call time). A loop whose capture fails
runs eagerly from then on, with one warning (out of memory: eagerly this time, captured again later).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .._env import switch
from ..kernels._device import current_stream_handle, side_stream

__all__ = ["GRAPHS", "MAX_LOOPS", "clear", "run"]

GRAPHS = switch("TILESPARSE_LSTM_GRAPHS", True)
MAX_LOOPS = 6  # graphs kept per layout table: forward with and without saving and backward, each with and
# without initial states
MAX_WARM = 16  # keys seen once per layout table (the next call with one captures it)

_LOCK = threading.RLock()  # the caches, captures, and each call's copy-in / replay / copy-out


class _Loops:
    """One layout table's loops: graphs (LRU), keys seen once, keys whose capture failed."""

    __slots__ = ("graphs", "warm", "failed")

    def __init__(self):
        self.graphs: OrderedDict = OrderedDict()
        self.warm: OrderedDict = OrderedDict()
        self.failed: set = set()


_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()  # meta -> _Loops (not in meta.__dict__: copies of a
# layout must not share or deep-copy graphs)


def clear() -> None:
    """Drops every captured loop (their graphs and buffers are freed once nothing else holds them)."""
    with _LOCK:
        _CACHE.clear()


def static_copies(inputs: tuple) -> tuple:
    """Contiguous copies of the tensors in ``inputs`` (None stays None), made outside inference mode so
    later calls in any mode may copy into them."""
    with torch.inference_mode(False), torch.no_grad():
        return tuple(None if t is None else torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)
                     for t in inputs)


class _Loop:
    """One captured loop: its graph, static inputs (None where the loop got None) and outputs."""

    __slots__ = ("graph", "inputs", "outputs", "device")

    def __init__(self, fn, inputs: tuple, device: torch.device):
        self.device = device
        caller = torch.cuda.current_stream(device)
        side = side_stream(device, "lstm-capture")
        side.wait_stream(caller)  # the inputs' producers before the static copies
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.stream(side), torch.inference_mode(False), torch.no_grad():
            self.inputs = static_copies(inputs)  # on the side stream: not in a pool the caller's stream feeds
            # thread-local: autograd's worker thread captures the backward while the caller's thread waits
            self.graph.capture_begin(capture_error_mode="thread_local")
            ended = False
            try:
                self.outputs = fn(*self.inputs)
                ended = True
                self.graph.capture_end()  # (raises where the loop broke the capture)
            except BaseException:
                if not ended:
                    try:
                        self.graph.capture_end()
                    except Exception:
                        pass  # (the capture is over either way)
                _leave_generator_capture_mode(device)
                raise
        caller.wait_stream(side)  # (the stream context restored the caller's stream, error or not)
        for t in (*self.inputs, *self.outputs):  # made on the side stream, used by replays on the caller's:
            if isinstance(t, torch.Tensor):  # once dropped, not reused until the caller's work on them is done
                t.record_stream(caller)

    def __call__(self, inputs: tuple) -> tuple:
        if torch.cuda.current_device() != self.device.index:
            with torch.cuda.device(self.device):
                return self(inputs)
        for static, t in zip(self.inputs, inputs):
            if static is not None:
                static.copy_(t)
        self.graph.replay()
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in self.outputs)


def _leave_generator_capture_mode(device: torch.device) -> None:
    """After a capture that failed: ``capture_end`` raised before taking the CUDA random generators out of
    capture mode (PyTorch 2.11), so the next random op outside a capture would raise ("Offset increment
    outside graph capture encountered unexpectedly"). A one-op capture that ends cleanly takes them out."""
    scratch = torch.zeros(1, device=device)
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(capture_error_mode="thread_local")
    scratch.add_(1)
    graph.capture_end()


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
           weight.dtype, meta.device, _stream_of(meta))
    with _LOCK:
        loops = _CACHE.get(meta)
        if loops is None:
            loops = _CACHE[meta] = _Loops()
        loop = loops.graphs.get(key)
        if loop is not None:  # copy-in, replay and copy-out enqueued together
            loops.graphs.move_to_end(key)
            return loop(inputs)
        if key in loops.failed:
            loop = None
        elif key not in loops.warm:  # first call: the loop on what the graph will see
            loops.warm[key] = None
            while len(loops.warm) > MAX_WARM:
                loops.warm.popitem(last=False)
            inputs = static_copies(inputs)
        else:
            del loops.warm[key]
            try:
                loop = _capture(fn, inputs, meta.device)
            except torch.OutOfMemoryError:
                pass  # eagerly now; the next call with the key warms it again
            except Exception as exc:  # (an op the capture does not allow): eager is still right
                loops.failed.add(key)
                warnings.warn(f"tilesparse: the LSTM time loop could not be captured in a CUDA graph and runs "
                              f"eagerly ({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=3)
            if loop is not None:
                loops.graphs[key] = loop
                while len(loops.graphs) > MAX_LOOPS:
                    loops.graphs.popitem(last=False)
                return loop(inputs)
    return fn(*inputs)  # (eager runs outside the lock)


def _stream_of(meta: torch.Tensor) -> int | None:
    """The caller's stream on ``meta``'s device (a graph's static buffers serve one stream)."""
    return current_stream_handle(meta.device) if meta.is_cuda else None


def _replayable(meta: torch.Tensor, steps: int) -> bool:
    """Whether a loop on ``meta``'s device may run from a graph (see the module docstring)."""
    return GRAPHS and steps > 1 and meta.is_cuda and not torch.cuda.is_current_stream_capturing()


def _capture(fn, inputs: tuple, device: torch.device) -> _Loop:
    """The captured loop (a separate function, so tests can stand in for CUDA graphs)."""
    return _Loop(fn, inputs, device)
