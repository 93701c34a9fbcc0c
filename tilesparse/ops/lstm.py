"""The LSTM recurrence over a whole sequence as one autograd Function.

What the 2017 blocksparse paper did for sparse RNNs, and why: per-step autograd of
``h_{t-1} W_hh^T`` launches one small weight-gradient product (sdd) per timestep, each
reading a [B, 4H] x [B, H] slab far too thin to fill a GPU, and then sums T weight-shaped
gradients. This Function instead

* forward, t = 0..T-1: gates_t = xproj_t + h_{t-1} W_hh^T (one ``dds`` per step; the
  input projection xproj [T, B, 4H] of all steps is computed before, in one large
  product; where the product runs faster on K-major activations, b 16 on Hopper (b 32 at 64
  rows and density >= 0.35), the cell
  also writes h^T and the next step's product reads that, with no transposing copy)
  and the fused cell (one launch per step), saving the outputs (whose rows
  are h_{t-1} of the next steps, so H_prev_all is a [T*B, H] view of them, or one copy
  with h0 in front when h0 is given), the cell states and the activated gates;
* backward, t = T-1..0: the fused cell backward gives dgates_t, written into one
  [T, B, 4H] buffer, and dh_{t-1} = dgates_t W_hh (one ``dds`` per step, the bprop);
* after the loop, dW_hh = dgates_all^T H_prev_all on W_hh's blocks: ONE ``sdd`` over
  all T*B rows (the paper's ``group_param_grads``), and d(xproj) = dgates_all, so the
  input weight's gradient is one product too (through ordinary autograd).

No dense copy of W_hh exists at any point. The products call the device-dispatching
impls of :mod:`tilesparse.ops.bsmm` (Triton on CUDA, the PyTorch reference on the CPU
and for float64), the cell :mod:`tilesparse.kernels.lstm_cell` (likewise).
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _checks
from .._env import switch
from ..kernels._alloc import new_output
from ..kernels import bsmm as _kernels  # (its KMAJOR_SMALL switch, read at call time)
from ..kernels import bsmm_kmajor
from ..kernels.lstm_cell import CellSteps
from ..layout import BlockLayout
from . import bsmm as _bsmm  # attribute access at call time, so tests can count the calls
from . import lstm_graphs

__all__ = ["lstm_sequence"]

# The time loops' per-step launches through plans made once per sequence (the recurrent product's
# kernels.bsmm.DdsPlan, the cell's CellSteps): less host time per eager timestep. False (the
# environment's TILESPARSE_STEP_PLANS=off, read at import): each step dispatches and checks in full,
# for A/B runs.
STEP_PLANS = switch("TILESPARSE_STEP_PLANS", True)


def _buffer(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """A sequence buffer the steps fill (NaN-poisoned under TILESPARSE_POISON=1, so a step
    that fails to write its slice shows up in the tests)."""
    return new_output(*shape, dtype=like.dtype, device=like.device)


def _transposed_h(xproj, weight, rows, cols):
    """A [H, B] buffer for the cell to write each step's h^T into, where the recurrent product runs
    faster on K-major activations (``bsmm_kmajor.kmajor_inputs_pay``: b 16 at 16-64 rows on Hopper,
    16-bit, b 32 at 64 rows and density 0.35-0.71; the cell writes h^T for the cost of a second small
    store, no transposing copy); else None."""
    steps, batch, gates_width = xproj.shape
    density = weight.shape[0] / max(1, rows * cols)
    if steps < 2 or not _kernels.KMAJOR_SMALL or not bsmm_kmajor.kmajor_inputs_pay(
            "fprop", xproj.device, xproj.dtype, batch, weight.shape[-1], density):
        return None
    return _buffer(xproj, gates_width // 4, batch)


def _run_forward(xproj, weight, meta, rows, cols, h0, c0, save: bool):
    """The time loop. Returns (out [T, B, H], cbuf, acts): out[t] is step t's h; with
    ``save``, cbuf [T+1, B, H] holds c0 (zeros when absent) then every step's c, and acts
    [T, B, 4H] the activated gates; without, cbuf [1, B, H] is the last c, acts None.

    Every step writes into buffers made once (the recurrent product into one [B, 4H] buffer, c
    without ``save`` into two in turn), so the product's plan and the cell's launches, keyed on
    the first steps, serve the rest with little host time (``DdsPlan``, ``CellSteps``)."""
    steps, batch, gates_width = xproj.shape
    hidden = gates_width // 4
    out = _buffer(xproj, steps, batch, hidden)
    ht = _transposed_h(xproj, weight, rows, cols)  # one buffer: step t + 1's product reads it before the cell rewrites it
    if save:
        cbuf = _buffer(xproj, steps + 1, batch, hidden)
        cbuf[0] = 0 if c0 is None else c0
        acts = _buffer(xproj, steps, batch, gates_width)
    else:
        cbuf, acts = _buffer(xproj, 2, batch, hidden), None  # c of the last two steps, in turn
    product = _bsmm._dds_plan(weight, meta, None, rows, cols, True, xproj, STEP_PLANS)
    gates_buf = _buffer(xproj, batch, gates_width)
    cell = CellSteps(remember=STEP_PLANS)
    h = h0
    for t in range(steps):
        if h is None:  # h_{-1} = 0: no recurrent product
            gates, gates_add = xproj[0], None
        else:
            h_in = ht.t() if ht is not None and t > 0 else h  # (h0 is the caller's, row-major)
            gates, gates_add = product(h_in, gates_buf), xproj[t]
        if save:
            c_prev, c_out = (None if t == 0 and c0 is None else cbuf[t]), cbuf[t + 1]
        else:
            c_prev, c_out = (c0 if t == 0 else cbuf[(t - 1) % 2]), cbuf[t % 2]
        h = out[t]
        cell.forward(gates, c_prev, gates_add, h, c_out, acts[t] if save else None,
                     ht if t < steps - 1 else None)
    if not save:
        cbuf = cbuf[(steps - 1) % 2].unsqueeze(0)
    return out, cbuf, acts


def _forward_loop(xproj, weight, meta, rows, cols, h0, c0, save: bool):
    """:func:`_run_forward`, replayed from a CUDA graph where ``lstm_graphs.run`` says."""
    return lstm_graphs.run(lambda x, h, c: _run_forward(x, weight, meta, rows, cols, h, c, save), (xproj, h0, c0),
                           weight, meta, ("forward", save, rows, cols, STEP_PLANS, _kernels.KMAJOR_SMALL),
                           xproj.shape[0])


def _backward_loop(weight, meta, rows, cols, block_size, has_c0, h0, out, cbuf, acts, d_out, d_hn, d_cn,
                   need_x, need_w, need_h0, need_c0):
    """:func:`_run_backward`, replayed from a CUDA graph where ``lstm_graphs.run`` says."""
    needs = (need_x, need_w, need_h0, need_c0)
    return lstm_graphs.run(
        lambda *tensors: _run_backward(weight, meta, rows, cols, block_size, has_c0, *tensors, *needs),
        (h0, out, cbuf, acts, d_out, d_hn, d_cn), weight, meta,
        ("backward", has_c0, needs, rows, cols, block_size, STEP_PLANS, _kernels.KMAJOR_SMALL), out.shape[0])


class _LSTMSequence(torch.autograd.Function):
    """(xproj [T, B, 4H], W_hh values [nnz, b, b], h0 [B, H] or None, c0 [B, H] or None,
    layout) -> (output [T, B, H], h_n [B, H], c_n [B, H]). See the module docstring.

    ``output`` is saved for backward (its rows are the next steps' h_{t-1}), as cuDNN's
    LSTM saves it: modifying it in place before backward is an error."""

    @staticmethod
    def forward(ctx, xproj, weight, h0, c0, layout):
        meta = layout.meta_on(xproj.device)
        out, cbuf, acts = _forward_loop(xproj, weight, meta, layout.block_rows, layout.block_cols, h0, c0, save=True)
        ctx.save_for_backward(weight, h0, out, cbuf, acts)
        ctx.tables = (meta, layout.block_rows, layout.block_cols, layout.block_size)
        ctx.has_c0 = c0 is not None
        return out, out[-1].clone(), cbuf[-1].clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_hn, d_cn):
        weight, h0, out, cbuf, acts = ctx.saved_tensors
        need_x, need_w, need_h0, need_c0, _ = ctx.needs_input_grad
        return _backward_loop(weight, *ctx.tables, ctx.has_c0, h0, out, cbuf, acts, d_out, d_hn, d_cn,
                              need_x, need_w, need_h0, need_c0) + (None,)


def _run_backward(weight, meta, rows, cols, block_size, has_c0, h0, out, cbuf, acts, d_out, d_hn, d_cn,
                  need_x, need_w, need_h0, need_c0):
    """BPTT over the saved sequence: (d xproj, d W_hh, d h0, d c0), None where not needed."""
    steps, batch, gates_width = acts.shape
    hidden = gates_width // 4
    dtype = acts.dtype
    # contiguous once here, not per step (out.sum() gives a zero-stride d_out)
    d_out, d_hn, d_cn = (g.to(dtype).contiguous() for g in (d_out, d_hn, d_cn))

    dgates = _buffer(acts, steps, batch, gates_width)
    bprop = _bsmm._dds_plan(weight, meta, None, rows, cols, False, acts, STEP_PLANS)
    dh_buf = _buffer(acts, batch, hidden)  # each step's dh_{t-1}, read by the next step's cell
    dc_bufs = _buffer(acts, 2, batch, hidden)  # dc_{t-1} of the last two steps, in turn
    cell = CellSteps(remember=STEP_PLANS)
    dh_rec, dc = d_hn, d_cn  # gradients arriving at step t from step t + 1
    for t in range(steps - 1, -1, -1):
        has_prev_c = t > 0 or has_c0
        dc_out = dc_bufs[t % 2] if t > 0 or need_c0 else None
        cell.backward(d_out[t], dc, acts[t], cbuf[t + 1], cbuf[t] if has_prev_c else None, dh_rec, dgates[t], dc_out)
        dc = dc_out
        if t > 0 or (h0 is not None and need_h0):  # bprop: dh_{t-1} = dgates_t W_hh
            dh_rec = bprop(dgates[t], dh_buf)

    grad_w = None
    if need_w:  # updat, once for the whole sequence: dW = dgates_all^T H_prev_all
        if h0 is not None:
            h_prev = torch.cat([h0.unsqueeze(0), out[:-1]]) if steps > 1 else h0.unsqueeze(0)
            d_rec = dgates
        else:  # step 0 had no recurrent input
            h_prev, d_rec = out[:-1], dgates[1:]
        if d_rec.shape[0]:
            grad_w = _bsmm._sdd_impl(
                d_rec.reshape(-1, gates_width).t(), h_prev.reshape(-1, hidden),
                meta, block_size, rows, cols,
            )
        else:  # T = 1 without h0: W_hh was never used
            grad_w = torch.zeros_like(weight)
    return (
        dgates if need_x else None,
        grad_w,
        dh_rec if need_h0 and h0 is not None else None,
        dc if need_c0 and has_c0 else None,
    )


# --------------------------------------------------------------------------- registered ops
# What torch.compile sees (fullgraph tracing never breaks): the recurrence forward and its
# BPTT as opaque ops with fakes; eager mode uses the Function above (no dispatcher cost).
# Ops cannot return None: absent gradients come back as empty tensors.


@torch.library.custom_op("tilesparse::lstm_forward", mutates_args=())
def _lstm_forward_op(
    xproj: torch.Tensor, weight: torch.Tensor, meta: torch.Tensor, h0: Optional[torch.Tensor],
    c0: Optional[torch.Tensor], block_rows: int, block_cols: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output [T, B, H], cell states [T+1, B, H] with c0 first, activated gates [T, B, 4H])."""
    return _forward_loop(xproj, weight, meta, block_rows, block_cols, h0, c0, save=True)


@_lstm_forward_op.register_fake
def _lstm_forward_fake(xproj, weight, meta, h0, c0, block_rows, block_cols):
    steps, batch, gates_width = xproj.shape
    hidden = gates_width // 4
    return (xproj.new_empty(steps, batch, hidden), xproj.new_empty(steps + 1, batch, hidden),
            xproj.new_empty(steps, batch, gates_width))


@torch.library.custom_op("tilesparse::lstm_backward", mutates_args=())
def _lstm_backward_op(
    weight: torch.Tensor, meta: torch.Tensor, h0: Optional[torch.Tensor], out: torch.Tensor, cbuf: torch.Tensor,
    acts: torch.Tensor, d_out: torch.Tensor, d_cn: torch.Tensor, block_rows: int, block_cols: int,
    block_size: int, has_c0: bool, need_h0: bool, need_c0: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d xproj, d W_hh, d h0 or empty, d c0 or empty); h_n's gradient arrives in d_out[-1]."""
    grads = _backward_loop(weight, meta, block_rows, block_cols, block_size, has_c0, h0, out, cbuf, acts,
                           d_out, torch.zeros_like(d_cn), d_cn, True, True, need_h0, need_c0)
    return tuple(g if g is not None else weight.new_empty(0) for g in grads)  # distinct: outputs may not alias


@_lstm_backward_op.register_fake
def _lstm_backward_fake(weight, meta, h0, out, cbuf, acts, d_out, d_cn, block_rows, block_cols, block_size,
                        has_c0, need_h0, need_c0):
    steps, batch, hidden = out.shape
    state = out.new_empty(batch, hidden)
    return (acts.new_empty(acts.shape), weight.new_empty(weight.shape),
            state if need_h0 and h0 is not None else weight.new_empty(0),
            out.new_empty(batch, hidden) if need_c0 and has_c0 else weight.new_empty(0))


def _lstm_forward_setup(ctx, inputs, output):
    xproj, weight, meta, h0, c0, block_rows, block_cols = inputs
    out, cbuf, acts = output
    ctx.save_for_backward(weight, meta, h0, out, cbuf, acts)
    ctx.grid = (block_rows, block_cols)
    ctx.has_c0 = c0 is not None
    ctx.block_size = weight.shape[-1]


def _lstm_forward_backward(ctx, d_out, d_cbuf, d_acts):
    weight, meta, h0, out, cbuf, acts = ctx.saved_tensors
    d_out = torch.zeros_like(out) if d_out is None else d_out
    d_cn = torch.zeros_like(cbuf[-1]) if d_cbuf is None else d_cbuf[-1]
    need_h0, need_c0 = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
    dx, dw, dh0, dc0 = _lstm_backward_op(weight, meta, h0, out, cbuf, acts, d_out, d_cn, *ctx.grid, ctx.block_size,
                                         ctx.has_c0, need_h0, need_c0)
    return (dx, dw, None, dh0 if need_h0 and h0 is not None else None,
            dc0 if need_c0 and ctx.has_c0 else None, None, None)


_lstm_forward_op.register_autograd(_lstm_forward_backward, setup_context=_lstm_forward_setup)


def lstm_sequence(
    xproj: torch.Tensor,
    weight: torch.Tensor,
    layout: BlockLayout,
    h0: Optional[torch.Tensor] = None,
    c0: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the LSTM recurrence over a sequence: returns (output [T, B, H], h_n [B, H],
    c_n [B, H]).

    Args:
        xproj: [T, B, 4H] input projection of every step (x_t W_ih^T + bias), gate order
            i, f, g, o like nn.LSTM.
        weight: W_hh's blocks [nnz, b, b] on ``layout``, of shape (4H, H).
        h0, c0: [B, H] initial states, or None for zeros.

    Under autocast every floating input is cast to the autocast dtype (as nn.Linear's
    inputs are); otherwise all must share one dtype. Differentiable in every tensor
    argument (first order); without grad, no activations are kept.
    """
    _checks.check_layout(layout)
    _checks.check_tensor(xproj, "xproj", dim=3)
    _checks.check_values(weight, layout, "weight")
    gates_rows, hidden = layout.shape
    if gates_rows != 4 * hidden:
        raise ValueError(f"layout has shape {layout.shape}; an LSTM's W_hh is (4H, H) = ({4 * hidden}, {hidden})")
    steps, batch = xproj.shape[0], xproj.shape[1]
    _checks.check_dim(xproj.shape[2], gates_rows, "xproj.shape[2] (4 * hidden)")
    if steps == 0:
        raise ValueError("xproj has no timesteps (T = 0)")
    for name, state in (("h0", h0), ("c0", c0)):
        if state is not None:
            _checks.check_tensor(state, name, dim=2)
            if tuple(state.shape) != (batch, hidden):
                raise ValueError(f"{name} must have shape ({batch}, {hidden}), got {tuple(state.shape)}")
    named = [("weight", weight), ("h0", h0), ("c0", c0)]
    for name, t in named:
        if t is not None:
            _checks.check_same_device(t, name, xproj, "xproj")
    xproj, weight, h0, c0 = _bsmm._autocast(xproj, weight, h0, c0)
    for name, t in (("weight", weight), ("h0", h0), ("c0", c0)):
        if t is not None:
            _checks.check_same(t, name, xproj, "xproj")

    if torch.compiler.is_compiling():  # the registered op: traced whole by torch.compile
        meta = layout.meta_on(xproj.device)
        out, cbuf, _ = _lstm_forward_op(xproj, weight, meta, h0, c0, layout.block_rows, layout.block_cols)
        return out, out[-1].clone(), cbuf[-1].clone()
    tensors = (xproj, weight, h0, c0)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        output, h_n, c_n = _LSTMSequence.apply(xproj, weight, h0, c0, layout)
        return output, h_n, c_n
    meta = layout.meta_on(xproj.device)
    out, cbuf, _ = _forward_loop(xproj, weight, meta, layout.block_rows, layout.block_cols, h0, c0, save=False)
    return out, out[-1].clone(), cbuf[-1]
