"""The LSTM cell's pointwise math, fused: one launch per timestep forward and backward.

Gates are laid out as nn.LSTM's: pre-activations ``gates`` [B, 4H] hold the input,
forget, cell and output gates (i, f, g, o) in column blocks of H. Forward, per element:

    i, f, o = sigmoid(.),  g = tanh(.)
    c = f * c_prev + i * g          (c_prev = 0 when there is no previous state)
    h = o * tanh(c)

and the activated gates [B, 4H] (i, f, g, o) are saved for backward, which with
tc = tanh(c) computes

    dc      = dc_next + dh * o * (1 - tc^2)
    do_pre  = dh * tc * o * (1 - o)
    di_pre  = dc * g * i * (1 - i)
    df_pre  = dc * c_prev * f * (1 - f)
    dg_pre  = dc * i * (1 - g^2)
    dc_prev = dc * f

Unfused, these are ~15 elementwise PyTorch launches per step each way, which at the
small batches an RNN step runs at cost more than the recurrent product itself.

The sums that surround the cell in a sequence are fused in as optional second operands:
forward takes ``gates_add`` (the input projection x_t W_ih^T + b, added to the
recurrent product), backward takes ``dh_add`` (the output's gradient, added to the
gradient arriving through the recurrence). Outputs may be written into given buffers
(one timestep's slice of a [T, B, *] buffer), so a sequence needs no stack or copy.

Everything is computed in float32 (float64 in the float64 reference) and stored in the
inputs' dtype (fp16, bf16 or fp32). Layers:

* ``_lstm_cell_fwd_kernel`` / ``_lstm_cell_bwd_kernel`` (Triton) and their launchers
  :func:`lstm_cell_forward_triton` / :func:`lstm_cell_backward_triton`;
* :func:`lstm_cell_forward_reference` / :func:`lstm_cell_backward_reference` (PyTorch),
  the same math in the same rounding order;
* :func:`lstm_cell_forward` / :func:`lstm_cell_backward`: dispatch (CUDA and not
  float64 -> Triton; CPU or float64 -> the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._alloc import new_output
from ._launch import PreparedLaunch, launch
from ._pdl import pdl_options, wait_for_previous_kernel
from ._tiles import cdiv, next_power_of_2

__all__ = [
    "lstm_cell_forward", "lstm_cell_backward",
    "lstm_cell_forward_triton", "lstm_cell_backward_triton",
    "lstm_cell_forward_reference", "lstm_cell_backward_reference", "CellSteps",
]

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _tanh(x):
    """tanh from one exp of a non-positive argument (no overflow for any x). Near 0,
    where (1 - e) / (1 + e) cancels, the odd Taylor series x - x^3/3 + 2x^5/15 (error
    below fp32 rounding for |x| < 0.04)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(x < 0, -t, t)
    x2 = x * x
    series = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0)))
    return tl.where(tl.abs(x) < 0.04, series, t)


@triton.jit
def _tile(B, H, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (pid_b, pid_h)'s tile of both kernels: (its rows [BLOCK_B, 1] as int64, its
    hidden units [1, BLOCK_H], the mask of those inside [B, H])."""
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (rows < B)[:, None] & (cols < H)[None, :]
    return rows.to(tl.int64)[:, None], cols[None, :], mask


@triton.jit
def _load_gates(ptr, H, mask):
    """The four gates at ``ptr`` (gate k at column offset k*H) as fp32, masked loads."""
    return (tl.load(ptr, mask=mask, other=0.0).to(tl.float32),
            tl.load(ptr + H, mask=mask, other=0.0).to(tl.float32),
            tl.load(ptr + 2 * H, mask=mask, other=0.0).to(tl.float32),
            tl.load(ptr + 3 * H, mask=mask, other=0.0).to(tl.float32))


@triton.jit
def _store_gates(ptr, H, mask, i, f, g, o):
    """Store the four gates at ``ptr`` (gate k at column offset k*H) in ``ptr``'s dtype."""
    ty = ptr.dtype.element_ty
    tl.store(ptr, i.to(ty), mask=mask)
    tl.store(ptr + H, f.to(ty), mask=mask)
    tl.store(ptr + 2 * H, g.to(ty), mask=mask)
    tl.store(ptr + 3 * H, o.to(ty), mask=mask)


@triton.jit
def _lstm_cell_fwd_kernel(
    g_ptr, g2_ptr, cp_ptr, h_ptr, c_ptr, acts_ptr, ht_ptr,
    B, H,
    stride_g, stride_g2, stride_cp, stride_h, stride_c, stride_acts, stride_ht,
    HAS_G2: tl.constexpr, HAS_C_PREV: tl.constexpr, SAVE_ACTS: tl.constexpr, WRITE_HT: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0,
):
    """Program (pid_b, pid_h) does rows [pid_b*BLOCK_B, +BLOCK_B) and hidden units
    [pid_h*BLOCK_H, +BLOCK_H) of one step. Every tensor is [rows, cols] with the given
    row stride and unit column stride; gate k of unit j is column k*H + j; ``ht`` (WRITE_HT)
    is h transposed, [H, B] with row stride ``stride_ht`` (unit j's row). PDL: the
    programmatic-dependent-launch mode (``tilesparse.kernels._pdl``; no main loop here,
    so mode 2 never signals early)."""
    wait_for_previous_kernel(PDL)
    r, j, mask = _tile(B, H, BLOCK_B, BLOCK_H)

    pi, pf, pg, po = _load_gates(g_ptr + r * stride_g + j, H, mask)
    if HAS_G2:  # each add right after its load (through _load_gates the adds move in the PTX)
        g2 = g2_ptr + r * stride_g2 + j
        pi += tl.load(g2, mask=mask, other=0.0).to(tl.float32)
        pf += tl.load(g2 + H, mask=mask, other=0.0).to(tl.float32)
        pg += tl.load(g2 + 2 * H, mask=mask, other=0.0).to(tl.float32)
        po += tl.load(g2 + 3 * H, mask=mask, other=0.0).to(tl.float32)

    i = tl.sigmoid(pi)
    f = tl.sigmoid(pf)
    gg = _tanh(pg)
    o = tl.sigmoid(po)
    c = i * gg
    if HAS_C_PREV:
        cp = tl.load(cp_ptr + r * stride_cp + j, mask=mask, other=0.0).to(tl.float32)
        c += f * cp
    h = o * _tanh(c)

    tl.store(c_ptr + r * stride_c + j, c.to(c_ptr.dtype.element_ty), mask=mask)
    tl.store(h_ptr + r * stride_h + j, h.to(h_ptr.dtype.element_ty), mask=mask)
    if WRITE_HT:  # h^T: the next step's recurrent product reads it K-major (bsmm_kmajor)
        tl.store(ht_ptr + j.to(tl.int64) * stride_ht + r, h.to(ht_ptr.dtype.element_ty), mask=mask)
    if SAVE_ACTS:
        _store_gates(acts_ptr + r * stride_acts + j, H, mask, i, f, gg, o)


@triton.jit
def _lstm_cell_bwd_kernel(
    dh_ptr, dh2_ptr, dc_ptr, acts_ptr, c_ptr, cp_ptr, dg_ptr, dcp_ptr,
    B, H,
    stride_dh, stride_dh2, stride_dc, stride_acts, stride_c, stride_cp, stride_dg, stride_dcp,
    HAS_DH2: tl.constexpr, HAS_DC: tl.constexpr, HAS_C_PREV: tl.constexpr, WRITE_DC_PREV: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0,
):
    """Backward of one step over the same tiles as the forward kernel: writes
    dgates [B, 4H] (pre-activation gradients, all four gates) and dc_prev [B, H]."""
    wait_for_previous_kernel(PDL)
    r, j, mask = _tile(B, H, BLOCK_B, BLOCK_H)

    dh = tl.load(dh_ptr + r * stride_dh + j, mask=mask, other=0.0).to(tl.float32)
    if HAS_DH2:
        dh += tl.load(dh2_ptr + r * stride_dh2 + j, mask=mask, other=0.0).to(tl.float32)
    i, f, gg, o = _load_gates(acts_ptr + r * stride_acts + j, H, mask)
    c = tl.load(c_ptr + r * stride_c + j, mask=mask, other=0.0).to(tl.float32)
    tc = _tanh(c)

    dc = dh * o * (1.0 - tc * tc)
    if HAS_DC:
        dc += tl.load(dc_ptr + r * stride_dc + j, mask=mask, other=0.0).to(tl.float32)
    d_o = dh * tc * o * (1.0 - o)
    d_i = dc * gg * i * (1.0 - i)
    d_g = dc * i * (1.0 - gg * gg)
    if HAS_C_PREV:
        cp = tl.load(cp_ptr + r * stride_cp + j, mask=mask, other=0.0).to(tl.float32)
        d_f = dc * cp * f * (1.0 - f)
    else:
        d_f = tl.zeros_like(dc)

    _store_gates(dg_ptr + r * stride_dg + j, H, mask, d_i, d_f, d_g, d_o)
    if WRITE_DC_PREV:
        tl.store(dcp_ptr + r * stride_dcp + j, (dc * f).to(dcp_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def _tiles(batch: int, hidden: int) -> tuple[int, int, tuple[int, int]]:
    """(BLOCK_B, BLOCK_H, grid): up to 128 units wide and ~1024 elements per program
    (four gates each), so a program keeps ~16 fp32 values per thread live."""
    block_h = min(128, next_power_of_2(hidden))
    block_b = min(next_power_of_2(batch), max(1, 1024 // block_h))
    return block_b, block_h, (cdiv(batch, block_b), cdiv(hidden, block_h))


def _operand(t: torch.Tensor | None, name: str, rows: int, cols: int, dtype: torch.dtype | None = None):
    """A 2-D [rows, cols] operand with unit column stride (copied if it has another)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != (rows, cols):
        raise ValueError(f"{name} must have shape ({rows}, {cols}), got {tuple(t.shape)}")
    if t.dtype not in _KERNEL_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; the Triton cell kernels take float16, bfloat16, float32")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but the gates are {dtype}; they must match")
    return t if t.stride(1) == 1 or cols == 1 else t.contiguous()


def _out(t: torch.Tensor | None, name: str, rows: int, cols: int, like: torch.Tensor) -> torch.Tensor:
    """A given output buffer (checked: it is written in place, so it must be unit-strided
    along columns) or a fresh one."""
    if t is None:
        return new_output(rows, cols, dtype=like.dtype, device=like.device)
    if tuple(t.shape) != (rows, cols) or (t.stride(1) != 1 and cols != 1):
        raise ValueError(f"{name} must be a ({rows}, {cols}) buffer with unit column stride, "
                         f"got shape {tuple(t.shape)} strides {t.stride()}")
    if t.dtype != like.dtype or t.device != like.device:
        raise TypeError(f"{name} must be {like.dtype} on {like.device}, got {t.dtype} on {t.device}")
    return t


def _check_gates(gates: torch.Tensor, name: str = "gates") -> tuple[int, int]:
    if not isinstance(gates, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(gates).__name__}")
    if gates.dim() != 2 or gates.shape[1] % 4:
        raise ValueError(f"{name} must be [B, 4H], got shape {tuple(gates.shape)}")
    return gates.shape[0], gates.shape[1] // 4


def lstm_cell_forward_triton(
    gates: torch.Tensor,
    c_prev: torch.Tensor | None = None,
    *,
    gates_add: torch.Tensor | None = None,
    h_out: torch.Tensor | None = None,
    c_out: torch.Tensor | None = None,
    acts_out: torch.Tensor | None = None,
    save_acts: bool = True,
    ht_out: torch.Tensor | None = None,
):
    """Launch the forward kernel: returns (h [B, H], c [B, H], acts [B, 4H] or None).

    ``gates`` [B, 4H] pre-activations (+ ``gates_add`` of the same shape); ``c_prev``
    [B, H] or None for a zero state. All operands share one dtype (fp16/bf16/fp32).
    ``ht_out`` [H, B]: also write h transposed there (for a K-major recurrent product)."""
    h, c, acts, call = _forward_launch(gates, c_prev, gates_add, h_out, c_out, acts_out, save_acts, ht_out)
    if call is not None:
        kernel, grid, args, kwargs = call
        launch(kernel, grid, *args, **kwargs)
    return h, c, acts


def _forward_launch(gates, c_prev, gates_add, h_out, c_out, acts_out, save_acts, ht_out):
    """The forward's checked operands: (h, c, acts, (kernel, grid, args, kwargs), or None where
    there is nothing to compute); its first 7 arguments are the tensors (placeholders included)."""
    batch, hidden = _check_gates(gates)
    gates = _operand(gates, "gates", batch, 4 * hidden)
    gates_add = _operand(gates_add, "gates_add", batch, 4 * hidden, gates.dtype)
    c_prev = _operand(c_prev, "c_prev", batch, hidden, gates.dtype)
    h = _out(h_out, "h_out", batch, hidden, gates)
    c = _out(c_out, "c_out", batch, hidden, gates)
    save_acts = save_acts or acts_out is not None
    acts = _out(acts_out, "acts_out", batch, 4 * hidden, gates) if save_acts else None
    ht = _out(ht_out, "ht_out", hidden, batch, gates) if ht_out is not None else None
    if batch == 0 or hidden == 0:
        return h, c, acts, None
    block_b, block_h, grid = _tiles(batch, hidden)
    return h, c, acts, (_lstm_cell_fwd_kernel, grid, (
        *_forward_tensors(gates, gates_add, c_prev, h, c, acts, ht),
        batch, hidden,
        gates.stride(0), 0 if gates_add is None else gates_add.stride(0),
        0 if c_prev is None else c_prev.stride(0), h.stride(0), c.stride(0),
        0 if acts is None else acts.stride(0), 0 if ht is None else ht.stride(0)), dict(
        HAS_G2=gates_add is not None, HAS_C_PREV=c_prev is not None, SAVE_ACTS=acts is not None,
        WRITE_HT=ht is not None, BLOCK_B=block_b, BLOCK_H=block_h, num_warps=4, **pdl_options(h)))


def _forward_tensors(gates, gates_add, c_prev, h, c, acts, ht) -> tuple:
    """The forward kernel's tensor arguments, absent ones replaced by placeholders it never reads."""
    return (gates, gates if gates_add is None else gates_add, gates if c_prev is None else c_prev,
            h, c, h if acts is None else acts, h if ht is None else ht)


def lstm_cell_backward_triton(
    dh: torch.Tensor,
    dc_next: torch.Tensor | None,
    acts: torch.Tensor,
    c: torch.Tensor,
    c_prev: torch.Tensor | None,
    *,
    dh_add: torch.Tensor | None = None,
    dgates_out: torch.Tensor | None = None,
    dc_prev_out: torch.Tensor | None = None,
    need_dc_prev: bool = True,
):
    """Launch the backward kernel: returns (dgates [B, 4H], dc_prev [B, H] or None).

    ``dh`` [B, H] (+ ``dh_add``) is the gradient of h, ``dc_next`` [B, H] (or None: zero)
    the gradient of c arriving from the next step; ``acts``, ``c``, ``c_prev`` are what
    the forward saved / read (``c_prev`` None: the zero initial state)."""
    dgates, dc_prev, call = _backward_launch(dh, dc_next, acts, c, c_prev, dh_add, dgates_out, dc_prev_out,
                                             need_dc_prev)
    if call is not None:
        kernel, grid, args, kwargs = call
        launch(kernel, grid, *args, **kwargs)
    return dgates, dc_prev


def _backward_launch(dh, dc_next, acts, c, c_prev, dh_add, dgates_out, dc_prev_out, need_dc_prev):
    """The backward's checked operands: (dgates, dc_prev, (kernel, grid, args, kwargs), or None where
    there is nothing to compute); its first 8 arguments are the tensors (placeholders included)."""
    batch, hidden = _check_gates(acts, "acts")
    acts = _operand(acts, "acts", batch, 4 * hidden)
    dh = _operand(dh, "dh", batch, hidden, acts.dtype)
    dh_add = _operand(dh_add, "dh_add", batch, hidden, acts.dtype)
    dc_next = _operand(dc_next, "dc_next", batch, hidden, acts.dtype)
    c = _operand(c, "c", batch, hidden, acts.dtype)
    c_prev = _operand(c_prev, "c_prev", batch, hidden, acts.dtype)
    dgates = _out(dgates_out, "dgates_out", batch, 4 * hidden, acts)
    need_dc_prev = need_dc_prev or dc_prev_out is not None
    dc_prev = _out(dc_prev_out, "dc_prev_out", batch, hidden, acts) if need_dc_prev else None
    if batch == 0 or hidden == 0:
        return dgates, dc_prev, None
    block_b, block_h, grid = _tiles(batch, hidden)
    return dgates, dc_prev, (_lstm_cell_bwd_kernel, grid, (
        *_backward_tensors(dh, dh_add, dc_next, acts, c, c_prev, dgates, dc_prev),
        batch, hidden,
        dh.stride(0), 0 if dh_add is None else dh_add.stride(0), 0 if dc_next is None else dc_next.stride(0),
        acts.stride(0), c.stride(0), 0 if c_prev is None else c_prev.stride(0), dgates.stride(0),
        0 if dc_prev is None else dc_prev.stride(0)), dict(
        HAS_DH2=dh_add is not None, HAS_DC=dc_next is not None, HAS_C_PREV=c_prev is not None,
        WRITE_DC_PREV=dc_prev is not None,
        BLOCK_B=block_b, BLOCK_H=block_h, num_warps=4, **pdl_options(dgates)))


def _backward_tensors(dh, dh_add, dc_next, acts, c, c_prev, dgates, dc_prev) -> tuple:
    """The backward kernel's tensor arguments, absent ones replaced by placeholders it never reads."""
    return (dh, dh if dh_add is None else dh_add, dh if dc_next is None else dc_next,
            acts, c, c if c_prev is None else c_prev, dgates, dgates if dc_prev is None else dc_prev)


class CellSteps:
    """One sequence's cell launches, forward (:meth:`forward`) or backward (:meth:`backward`), every
    operand and output given: each kind of step (which operands are absent, the strides) is checked
    and keyed once, and its later steps launch through a :class:`PreparedLaunch` (~25 µs of host per
    call -> a few on this project's CPU). A kind whose first step copied an operand (one not unit-strided
    along columns) keeps the checked path. Off CUDA the dispatching functions run; ``remember=False``:
    every step takes the checked path (the A/B baseline). One sequence: one batch, hidden size, dtype."""

    def __init__(self, remember: bool = True):
        self.launches: dict = {}
        self.remember = remember

    def forward(self, gates, c_prev, gates_add, h_out, c_out, acts_out, ht_out):
        """:func:`lstm_cell_forward` into the given buffers (``acts_out`` None: not saved)."""
        given = (gates, gates_add, c_prev, h_out, c_out, acts_out, ht_out)
        if not _use_triton(gates):
            lstm_cell_forward(gates, c_prev, gates_add=gates_add, h_out=h_out, c_out=c_out, acts_out=acts_out,
                              save_acts=acts_out is not None, ht_out=ht_out)
            return
        self._step("forward", given, lambda: _forward_launch(gates, c_prev, gates_add, h_out, c_out, acts_out,
                                                             acts_out is not None, ht_out)[3], _forward_tensors)

    def backward(self, dh, dc_next, acts, c, c_prev, dh_add, dgates_out, dc_prev_out):
        """:func:`lstm_cell_backward` into the given buffers (``dc_prev_out`` None: not computed)."""
        given = (dh, dh_add, dc_next, acts, c, c_prev, dgates_out, dc_prev_out)
        if not _use_triton(acts):
            lstm_cell_backward(dh, dc_next, acts, c, c_prev, dh_add=dh_add, dgates_out=dgates_out,
                               dc_prev_out=dc_prev_out, need_dc_prev=dc_prev_out is not None)
            return
        self._step("backward", given, lambda: _backward_launch(dh, dc_next, acts, c, c_prev, dh_add, dgates_out,
                                                               dc_prev_out, dc_prev_out is not None)[2],
                   _backward_tensors)

    def _step(self, kind, given, checked, tensors_of) -> None:
        key = (kind, *[None if t is None else t.stride() for t in given])
        prepared = self.launches.get(key)
        if prepared is not None:
            prepared(*tensors_of(*given))
            return
        call = checked()
        if call is None:
            return
        kernel, grid, args, kwargs = call
        tensors = tensors_of(*given)
        launch(kernel, grid, *args, **kwargs)
        if self.remember and all(a is t for a, t in zip(args, tensors)):  # no operand copied: the given strides
            self.launches[key] = PreparedLaunch(kernel, grid, args, kwargs, tuple(range(len(tensors))),
                                                lambda *a, **k: launch(*a, **k))


# --------------------------------------------------------------------------- references


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lstm_cell_forward_reference(
    gates: torch.Tensor,
    c_prev: torch.Tensor | None = None,
    *,
    gates_add: torch.Tensor | None = None,
    save_acts: bool = True,
):
    """PyTorch reference of the forward kernel (same contract, fresh outputs): float32
    math (float64 for float64 input), results rounded once to the gates' dtype."""
    _check_gates(gates)
    cd = _compute_dtype(gates.dtype)
    pre = gates.to(cd)
    if gates_add is not None:
        pre = pre + gates_add.to(cd)
    i, f, g, o = pre.chunk(4, dim=-1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c = i * g
    if c_prev is not None:
        c = c + f * c_prev.to(cd)
    h = o * torch.tanh(c)
    acts = torch.cat([i, f, g, o], dim=-1).to(gates.dtype) if save_acts else None
    return h.to(gates.dtype), c.to(gates.dtype), acts


def lstm_cell_backward_reference(
    dh: torch.Tensor,
    dc_next: torch.Tensor | None,
    acts: torch.Tensor,
    c: torch.Tensor,
    c_prev: torch.Tensor | None,
    *,
    dh_add: torch.Tensor | None = None,
    need_dc_prev: bool = True,
):
    """PyTorch reference of the backward kernel (same contract, fresh outputs)."""
    _check_gates(acts, "acts")
    cd = _compute_dtype(acts.dtype)
    dh = dh.to(cd)
    if dh_add is not None:
        dh = dh + dh_add.to(cd)
    i, f, g, o = acts.to(cd).chunk(4, dim=-1)
    tc = torch.tanh(c.to(cd))
    dc = dh * o * (1 - tc * tc)
    if dc_next is not None:
        dc = dc + dc_next.to(cd)
    d_o = dh * tc * o * (1 - o)
    d_i = dc * g * i * (1 - i)
    d_g = dc * i * (1 - g * g)
    d_f = dc * c_prev.to(cd) * f * (1 - f) if c_prev is not None else torch.zeros_like(dc)
    dgates = torch.cat([d_i, d_f, d_g, d_o], dim=-1).to(acts.dtype)
    dc_prev = (dc * f).to(acts.dtype) if need_dc_prev else None
    return dgates, dc_prev


# --------------------------------------------------------------------------- dispatch


def _use_triton(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype in _KERNEL_DTYPES


def _into(out: torch.Tensor | None, value: torch.Tensor | None) -> torch.Tensor | None:
    if out is None or value is None:
        return value
    out.copy_(value)
    return out


def lstm_cell_forward(
    gates, c_prev=None, *, gates_add=None, h_out=None, c_out=None, acts_out=None, save_acts=True, ht_out=None,
):
    """One step of the cell forward: the Triton kernel on CUDA (fp16/bf16/fp32), the
    PyTorch reference on the CPU and for float64. Returns (h, c, acts or None), written
    into ``h_out`` / ``c_out`` / ``acts_out`` when given; with ``ht_out`` [H, B], h^T too."""
    if _use_triton(gates):
        return lstm_cell_forward_triton(gates, c_prev, gates_add=gates_add, h_out=h_out, c_out=c_out,
                                        acts_out=acts_out, save_acts=save_acts, ht_out=ht_out)
    save_acts = save_acts or acts_out is not None
    h, c, acts = lstm_cell_forward_reference(gates, c_prev, gates_add=gates_add, save_acts=save_acts)
    if ht_out is not None:
        _into(_out(ht_out, "ht_out", h.shape[1], h.shape[0], h), h.t())
    return _into(h_out, h), _into(c_out, c), _into(acts_out, acts)


def lstm_cell_backward(
    dh, dc_next, acts, c, c_prev, *, dh_add=None, dgates_out=None, dc_prev_out=None, need_dc_prev=True,
):
    """One step of the cell backward, dispatched like :func:`lstm_cell_forward`.
    Returns (dgates, dc_prev or None), written into the given buffers when given."""
    if _use_triton(acts):
        return lstm_cell_backward_triton(dh, dc_next, acts, c, c_prev, dh_add=dh_add, dgates_out=dgates_out,
                                         dc_prev_out=dc_prev_out, need_dc_prev=need_dc_prev)
    need_dc_prev = need_dc_prev or dc_prev_out is not None
    dgates, dc_prev = lstm_cell_backward_reference(dh, dc_next, acts, c, c_prev, dh_add=dh_add,
                                                   need_dc_prev=need_dc_prev)
    return _into(dgates_out, dgates), _into(dc_prev_out, dc_prev)
