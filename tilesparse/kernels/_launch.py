"""Kernel launches with less host time: a Triton kernel's compiled form, remembered per
argument specialization, launched through its own launcher.

``kernel[grid](*args, **kw)`` binds every argument, builds a cache key from the
specialization of each (a string of the options included) and looks the compiled kernel
up: on the H200's host 32 µs per launch of the dds kernel, against 13 µs for the
compiled kernel's launcher alone (``scripts/profile_host.py``). Our products are three
launches per training step and two per recurrent timestep, so that difference is a
large part of an eager step's host time (docs/performance.md).

:func:`launch` keys the compiled kernel on what Triton specializes on, computed here
more cheaply (a tensor's dtype and 16-byte alignment; an int's 32- or 64-bit range,
divisibility by 16 and equality to 1; a host TMA descriptor's dtype, alignment, block
shape and padding, its sizes and strides by those int classes; the constexprs, launch
options and Triton's compile settings by value), and launches it directly from the
second call with that key on: 6-9 µs less host time per product call on the H200
(``scripts/probes/launch_ab.py``). The first call with a new key, and every call Triton
must see (launch or pre-run hooks, e.g. a profiler's; the interpreter; CPU tensors;
constexprs passed by position; argument kinds not handled here) take Triton's path.
``TILESPARSE_FAST_LAUNCH=0`` turns it off.

Triton launches on the current CUDA device's stream. Every launch here runs on the device
of its first argument (a tensor or a host TMA descriptor) instead, entering that device
only when it is not already the current one, so a layer on ``cuda:1`` works while
``cuda:0`` is current, as PyTorch's own operations do.
"""

from __future__ import annotations

import os

import torch
import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from .._env import switch

_INT32 = (-(1 << 31), 1 << 31)
_DESCRIPTORS = (TensorDescriptor, GluonTensorDescriptor)  # host-built TMA descriptors (Triton's, Gluon's)
_COMPILED: dict = {}  # key -> CompiledKernel
_TAIL: dict = {}  # (kernel, n positional, keyword names) -> constexpr names in order, or None
_OPTIONS = frozenset(("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl"))


def enabled() -> bool:
    """On unless TILESPARSE_FAST_LAUNCH=0, under the interpreter, or on ROCm (whose backend
    also specializes tensors on their size, which the key here does not cover)."""
    return (switch("TILESPARSE_FAST_LAUNCH", True) and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.version.hip is None)


_ENABLED = enabled()


class _Unhandled(Exception):
    """An argument whose specialization this module does not compute."""


def arg_spec(arg) -> object:
    """What Triton's compiled kernel depends on for one runtime argument: at least as fine
    as Triton's own specialization, so equal specs never share a wrongly specialized
    kernel (finer only costs an extra compile)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    kind = type(arg)
    if kind is bool:
        return bool
    if kind is int:
        return _INT32[0] <= arg < _INT32[1], arg % 16 == 0, arg == 1
    if kind is float:
        return float
    if arg is None:
        return None
    if kind in _DESCRIPTORS:  # a host-built TMA descriptor: its sizes by class, the rest by value (a Gluon
        # one also by the shared-memory layout its boxes land in)
        return (kind, arg.base.dtype, arg.base.data_ptr() % 16 == 0, _int_specs(arg.shape), _int_specs(arg.strides),
                tuple(arg.block_shape), getattr(arg, "layout", None), arg.padding)
    raise _Unhandled(kind)


def _int_specs(values) -> tuple:
    """:func:`arg_spec` of each of a descriptor's sizes or strides (ints), in one pass: a
    backward launch has eight descriptors of four of each."""
    if not all(type(x) is int for x in values):
        raise _Unhandled(type(values))
    lo, hi = _INT32
    return tuple([(lo <= x < hi, x % 16 == 0, x == 1) for x in values])


_GIVEN = object()  # in a constexpr tail: the value is the call's keyword


def _constexpr_tail(kernel: JITFunction, n_positional: int, names: tuple) -> tuple | None:
    """The constexpr parameters after the positional ones, in the kernel's order, as (name,
    default) pairs (default ``_GIVEN`` where a keyword gives the value; the compiled
    launcher takes every parameter in order), when the keywords are exactly such
    parameters (and launch options) and every one not given has a default; else None."""
    key = (kernel, n_positional, names)
    if key not in _TAIL:
        params = kernel.params[n_positional:]
        tail, given = {p.name for p in params}, set(names)
        # every keyword is a constexpr parameter after the positional ones or a launch option;
        # a Gluon kernel also declares its option ``num_warps`` as a constexpr parameter
        fits = (all(p.is_constexpr for p in params) and not any(p.is_constexpr for p in kernel.params[:n_positional])
                and all(p.name in given or p.has_default for p in params) and given - tail <= _OPTIONS)
        _TAIL[key] = tuple((p.name, _GIVEN if p.name in given else p.default) for p in params) if fits else None
    return _TAIL[key]


def _compile_knobs() -> tuple:
    """Triton settings its own launch folds into the compiled kernel's options each call."""
    knobs = triton.knobs
    return (knobs.runtime.debug, knobs.compilation.instrumentation_mode, knobs.language.default_fp_fusion,
            knobs.runtime.override_arch)


def _cuda_index(arg) -> int | None:
    """The CUDA device index of a tensor or host TMA descriptor; None for anything else."""
    tensor = arg.base if type(arg) in _DESCRIPTORS else arg
    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
        return tensor.get_device()  # no torch.device object: this runs on every launch
    return None


def _hooks_set() -> bool:
    """Whether launch hooks are registered (a profiler's): they need Triton's own path."""
    runtime = triton.knobs.runtime
    return any(getattr(hook, "calls", hook is not None) for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook))


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` on the device of ``args[0]``, launched through the
    remembered compiled kernel where one fits (see the module docstring). ``grid``: a tuple
    of 1-3 ints."""
    index = _cuda_index(args[0]) if args else None
    if index is None:
        kernel[grid](*args, **kwargs)
        return
    current = torch.cuda.current_device()
    if index == current:
        _launch_current(kernel, grid, current, args, kwargs)
        return
    if torch.cuda.is_current_stream_capturing():
        # the other device's stream is not being captured: the kernel would run once now
        # and be missing from the graph's replays
        raise RuntimeError(f"a tilesparse kernel's tensors are on cuda:{index} while a CUDA graph is being "
                           f"captured on cuda:{current}; capture on the device that holds them")
    with torch.cuda.device(index):
        _launch_current(kernel, grid, index, args, kwargs)


def _launch_current(kernel, grid: tuple, device: int, args: tuple, kwargs: dict):
    """The launch on ``device``, already the current CUDA device. Returns (compiled kernel, its
    constexpr tail's values) where it went through a remembered compiled kernel, else None."""
    if not (_ENABLED and isinstance(kernel, JITFunction) and type(grid) is tuple
            and not kernel.pre_run_hooks and not _hooks_set()):
        kernel[grid](*args, **kwargs)
        return None
    tail_names = _constexpr_tail(kernel, len(args), tuple(kwargs))
    try:
        spec = tuple(map(arg_spec, args))
    except _Unhandled:
        tail_names = None
    if tail_names is None:
        kernel[grid](*args, **kwargs)
        return None
    key = (kernel, device, spec, tuple(kwargs.items()), _compile_knobs())
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None and not hasattr(compiled, "result"):  # not an async compile
            _COMPILED[key] = compiled
        return None
    tail = [kwargs[name] if default is _GIVEN else default for name, default in tail_names]
    _run(compiled, grid, device, args, tail)
    return compiled, tail


def _run(compiled, grid: tuple, device: int, args, tail) -> None:
    g0, g1, g2 = grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1
    compiled.run(g0, g1, g2, driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *tail)


class PreparedLaunch:
    """Repeated launches of one kernel whose grid, keywords and positional arguments stay the same
    except the tensors at positions ``varying`` (a recurrence's per-timestep inputs and outputs):
    from the first call that finds the compiled kernel on, a call checks only those tensors'
    specialization (dtype, 16-byte alignment) and launches it directly, with no key built from
    every argument (~6 µs of host per launch on this project's CPU). Any change :func:`launch`
    would see (another specialization, device, launch hooks, Triton's settings) takes its path.

    The caller guarantees that the tensors passed have the shapes and strides of the first ones
    (their strides are among the fixed arguments). ``fallback``: what launches tensors not on the
    current CUDA device (the interpreter's CPU tensors, another GPU's; default :func:`launch`; a
    module passes its own name for it, so tests that replace the module's ``launch`` see those)."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "varying", "fallback", "device", "compiled", "tail", "specs",
                 "knobs")

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict, varying: tuple, fallback=None):
        self.kernel, self.grid, self.kwargs, self.varying = kernel, grid, kwargs, varying
        self.fallback = fallback or launch
        self.args = list(args)
        self.device = _cuda_index(args[0]) if args else None
        for position in varying:  # filled per call, held by the caller only
            self.args[position] = None
        self.compiled = None

    def __call__(self, *tensors) -> None:
        args = self.args
        for position, tensor in zip(self.varying, tensors):
            args[position] = tensor
        try:
            self._launch(args, tensors)
        finally:
            for position in self.varying:  # the caller's tensors are not held past the call
                args[position] = None

    def _launch(self, args: list, tensors: tuple) -> None:
        compiled = self.compiled
        if (compiled is not None and tuple(map(arg_spec, tensors)) == self.specs
                and torch.cuda.current_device() == self.device and self.knobs == _compile_knobs()
                and not _hooks_set()):
            _run(compiled, self.grid, self.device, args, self.tail)
            return
        if self.device is None or torch.cuda.current_device() != self.device:
            self.fallback(self.kernel, self.grid, *args, **self.kwargs)
            return
        found = _launch_current(self.kernel, self.grid, self.device, tuple(args), self.kwargs)
        if found is not None:
            self.compiled, self.tail = found
            self.specs = tuple(map(arg_spec, tensors))
            self.knobs = _compile_knobs()
