"""A dds kernel's launch built once and run again: one weight, activations of one shape and strides.

The few-row dds kernels (small, FMA, panel) all take ``(a, values, bias or a placeholder, out, ...)``
as their first arguments, the rest (tables, workspaces, sizes, strides, constexprs) fixed for one
weight and one activation shape. :class:`DdsLaunch` holds those arguments: its first run goes through
the module's ``launch`` (Triton's path, which compiles), later runs through a
:class:`~tilesparse.kernels._launch.PreparedLaunch` that swaps in the new activations and output and
checks only their specialization. ``kernels.bsmm.DdsPlan`` keeps one per recurrence (an eager LSTM's
timesteps), so a timestep's product skips the dispatcher and most of Triton's launch.
"""

from __future__ import annotations

import torch

from ._launch import PreparedLaunch

_A, _BIAS, _OUT = 0, 2, 3  # the positions of the activations, bias (or placeholder) and output


class DdsLaunch:
    """One dds kernel's launch: ``kernel[grid](*args, **kwargs)`` with ``args[0]`` the activations
    (shaped and strided as ``a`` was), ``args[3]`` the output C or, with ``partials`` (an fp32
    [splits, M, N] workspace), the partials summed into C in a fixed order after the launch
    (+ ``bias``: deterministic). Without partials the bias (or, absent, the output as its unread
    placeholder) and the output change per call; with them only the activations do. Workspaces in
    ``args`` (chunk partials, arrival counters that reset themselves) are kept between calls:
    launches on one stream never overlap. ``fallback``: the kernel module's own ``launch`` (tests
    replace it), for the first run and for tensors the prepared launch does not take. After the first
    run only the prepared launch's fixed arguments are kept: no activations or outputs of any call."""

    __slots__ = ("kernel", "grid", "args", "kwargs", "bias", "partials", "strides", "fallback", "prepared")

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict, bias: torch.Tensor | None,
                 partials: torch.Tensor | None, fallback):
        if args[_BIAS] is not (bias if bias is not None else args[_OUT]) or (
                partials is not None and args[_OUT] is not partials):
            raise ValueError("args must hold (a, values, bias or the output, the output or partials, ...)")
        self.kernel, self.grid, self.args, self.kwargs = kernel, grid, args, kwargs
        self.bias, self.partials, self.fallback = bias, partials, fallback
        self.strides = args[_A].stride()  # the activations' strides it was built for
        self.prepared = None

    def first(self, c: torch.Tensor) -> DdsLaunch:
        """Runs the launch as built (``c``: the output it was built with); returns itself."""
        self.fallback(self.kernel, self.grid, *self.args, **self.kwargs)
        self.sum_partials(c)
        self._prepare()
        return self

    def _prepare(self) -> PreparedLaunch:
        """The prepared launch of the fixed arguments; the first call's tensors are let go."""
        prepared = self.prepared
        if prepared is None:
            prepared = self.prepared = PreparedLaunch(self.kernel, self.grid, self.args, self.kwargs,
                                                      (_A,) if self.partials is not None else (_A, _BIAS, _OUT),
                                                      self.fallback)
            self.args = None
        return prepared

    def __call__(self, a: torch.Tensor, c: torch.Tensor) -> None:
        """C = A @ op(S) (+ bias) into ``c``, for activations shaped and strided as the first ones."""
        prepared = self._prepare()
        if self.partials is not None:
            prepared(a)
            self.sum_partials(c)
        else:
            prepared(a, c if self.bias is None else self.bias, c)

    def sum_partials(self, c: torch.Tensor) -> None:
        """With partials, c = their fixed-order sum (+ bias); without, nothing to do."""
        if self.partials is None:
            return
        total = self.partials.sum(dim=0)
        if self.bias is not None:
            total += self.bias.float()
        c.copy_(total)
