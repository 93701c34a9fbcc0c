"""The LSTM sequence Function behind BlockSparseLSTM (tilesparse.ops.lstm) against a dense
float64 recurrence: values and every gradient, states, empty layouts, errors, the no-grad
path; and the structure of its backward (one weight-gradient product over all steps, no
dense W_hh). The module itself is tested in test_lstm.py."""

import copy
import math

import pytest
import torch

from tilesparse import BlockLayout, BlockSparseLSTM, layouts
from tilesparse.kernels import bsmm as kernels_bsmm, bsmm_kmajor, lstm_cell
from tilesparse.ops import bsmm
from tilesparse.ops.lstm import lstm_sequence

from bsmm_cases import INTERPRETER_MARKS as interpreter
from lstm_cases import build_lstm
from tolerances import assert_close

F64 = torch.float64


# =========================================================================== the sequence Function


def _dense_recurrence(xproj, w_dense, h0, c0):
    """nn.LSTM's recurrence written out, on a dense weight (float64 reference)."""
    steps, batch, gates_width = xproj.shape
    h = xproj.new_zeros(batch, gates_width // 4) if h0 is None else h0
    c = xproj.new_zeros(batch, gates_width // 4) if c0 is None else c0
    outs = []
    for t in range(steps):
        i, f, g, o = (xproj[t] + h @ w_dense.t()).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs), h, c


def _sequence_case(steps, batch, hidden, block, states, dtype=F64, layout=None):
    layout = layouts.random(4 * hidden, hidden, block, 0.5) if layout is None else layout
    xproj = torch.randn(steps, batch, 4 * hidden, dtype=dtype, requires_grad=True)
    values = (torch.randn(layout.nnz, block, block, dtype=dtype) / math.sqrt(hidden)).requires_grad_()
    h0 = torch.randn(batch, hidden, dtype=dtype, requires_grad=True) if "h0" in states else None
    c0 = torch.randn(batch, hidden, dtype=dtype, requires_grad=True) if "c0" in states else None
    return layout, xproj, values, h0, c0


@pytest.mark.parametrize("states", ["", "h0", "c0", "h0+c0"], ids=["none", "h0", "c0", "both"])
@pytest.mark.parametrize("steps", [1, 4])
def test_lstm_sequence_matches_dense_recurrence(states, steps):
    """Values and every gradient (xproj, W_hh's blocks, h0, c0), with either state alone."""
    layout, xproj, values, h0, c0 = _sequence_case(steps, 3, 16, 8, states)
    out, h_n, c_n = lstm_sequence(xproj, values, layout, h0, c0)
    leaves = [t for t in (xproj, values, h0, c0) if t is not None]
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref_of = dict(zip(map(id, leaves), ref_leaves))
    rx, rv = ref_of[id(xproj)], ref_of[id(values)]
    ref_out, ref_h, ref_c = _dense_recurrence(rx, layout.to_dense(rv), ref_of.get(id(h0)), ref_of.get(id(c0)))
    for name, a, b in (("output", out, ref_out), ("h_n", h_n, ref_h), ("c_n", c_n, ref_c)):
        assert_close(a, b, F64, name)
    weights = [torch.randn_like(t) for t in (out, h_n, c_n)]
    grads = torch.autograd.grad([out, h_n, c_n], leaves, weights)
    ref_grads = torch.autograd.grad([ref_out, ref_h, ref_c], ref_leaves, weights)
    for leaf, g, rg in zip(leaves, grads, ref_grads):
        assert_close(g, rg, F64, f"grad of a {tuple(leaf.shape)} input")


@pytest.mark.parametrize("states", ["", "h0", "c0"], ids=["none", "h0", "c0"])
def test_lstm_sequence_gradcheck(states):
    layout, xproj, values, h0, c0 = _sequence_case(3, 2, 4, 2, states)
    inputs = [t for t in (xproj, values, h0, c0) if t is not None]

    def fn(*args):
        it = iter(args)
        x, v = next(it), next(it)
        h = next(it) if h0 is not None else None
        c = next(it) if c0 is not None else None
        return lstm_sequence(x, v, layout, h, c)

    assert torch.autograd.gradcheck(fn, inputs)


def test_lstm_sequence_on_an_empty_layout():
    """nnz = 0: no recurrent input at all; W_hh's gradient is an empty [0, b, b]."""
    layout = BlockLayout(torch.zeros(8, 2, dtype=torch.bool), 8)
    _, xproj, values, h0, c0 = _sequence_case(3, 2, 16, 8, "h0+c0", layout=layout)
    out, h_n, c_n = lstm_sequence(xproj, values, layout, h0, c0)
    ref_out, _, _ = _dense_recurrence(xproj.detach(), torch.zeros(64, 16, dtype=F64), h0.detach(), c0.detach())
    assert_close(out, ref_out, F64, "output")
    out.sum().backward()
    assert values.grad.shape == (0, 8, 8) and xproj.grad is not None


def test_lstm_sequence_argument_errors():
    layout = layouts.random(64, 16, 8, 0.5)
    values = torch.randn(layout.nnz, 8, 8)
    x = torch.randn(3, 2, 64)
    with pytest.raises(ValueError, match=r"xproj.shape\[2\]"):
        lstm_sequence(torch.randn(3, 2, 60), values, layout)
    with pytest.raises(ValueError, match="an LSTM's W_hh is"):
        square = layouts.random(16, 16, 8, 0.5)
        lstm_sequence(torch.randn(3, 2, 16), torch.randn(square.nnz, 8, 8), square)
    with pytest.raises(ValueError, match=r"h0 must have shape \(2, 16\)"):
        lstm_sequence(x, values, layout, torch.randn(3, 16))
    with pytest.raises(TypeError, match="c0 has dtype torch.float64 but xproj"):
        lstm_sequence(x, values, layout, torch.randn(2, 16), torch.randn(2, 16, dtype=F64))
    with pytest.raises(ValueError, match="no timesteps"):
        lstm_sequence(torch.randn(0, 2, 64), values, layout)


def test_no_grad_path_keeps_nothing_and_matches():
    layout, xproj, values, h0, c0 = _sequence_case(4, 2, 16, 8, "h0+c0")
    with_grad = lstm_sequence(xproj, values, layout, h0, c0)
    with torch.no_grad():
        without = lstm_sequence(xproj, values, layout, h0, c0)
    assert all(t.grad_fn is None for t in without)
    for a, b in zip(with_grad, without):
        assert torch.equal(a.detach(), b)


def test_modifying_the_output_in_place_fails_backward_loudly():
    """The output is saved for backward (its rows are the next steps' h), as cuDNN saves it."""
    module = build_lstm(8, 16, 8)
    out, _ = module(torch.randn(4, 2, 8, dtype=F64))
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_unbatched_backward_matches_dense():
    module = build_lstm(8, 16, 8, sparse_input=True)
    dense = module.to_dense_lstm()
    x = torch.randn(5, 8, dtype=F64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    h0, c0 = (torch.randn(1, 16, dtype=F64, requires_grad=True) for _ in range(2))
    h0_ref, c0_ref = (t.detach().clone().requires_grad_() for t in (h0, c0))
    out, (h_n, c_n) = module(x, (h0, c0))
    ref, (h_ref, c_ref) = dense(x_ref, (h0_ref, c0_ref))
    (out.square().sum() + h_n.sum() + 2 * c_n.sum()).backward()
    (ref.square().sum() + h_ref.sum() + 2 * c_ref.sum()).backward()
    for name, a, b in (("x", x, x_ref), ("h0", h0, h0_ref), ("c0", c0, c0_ref)):
        assert_close(a.grad, b.grad, F64, f"grad {name}")
    assert_close(module.hh.weight.grad, module.layout.gather(dense.weight_hh_l0.grad), F64, "grad W_hh")


# =========================================================================== one weight-gradient product


def _count_products(monkeypatch):
    """Record (kind, shapes) of every dds / sdd the library computes (the device-dispatching
    impls that every path, eager autograd and the LSTM Function, ends in)."""
    calls = []
    real_dds, real_sdd = bsmm._dds_impl, bsmm._sdd_impl

    def dds(a, *rest):
        calls.append(("dds", tuple(a.shape)))
        return real_dds(a, *rest)

    def sdd(a, b, *rest):
        calls.append(("sdd", tuple(a.shape), tuple(b.shape)))
        return real_sdd(a, b, *rest)

    monkeypatch.setattr(bsmm, "_dds_impl", dds)
    monkeypatch.setattr(bsmm, "_sdd_impl", sdd)
    return calls


@pytest.mark.parametrize("with_state", [True, False], ids=["h0c0", "no_state"])
@pytest.mark.parametrize("sparse_input", [False, True], ids=["dense_in", "sparse_in"])
@pytest.mark.parametrize("steps", [2, 5, 17])
def test_weight_gradient_is_one_sdd_over_all_steps(monkeypatch, steps, sparse_input, with_state):
    """Backward computes W_hh's gradient in ONE sampled product whose reduction runs over
    all T*B rows (T*B - B without h0), however long the sequence; the bprop product is one
    dds per step. (With sparse_input, W_ih's gradient is one more sdd, also over T*B.)"""
    I, H, B = 8, 16, 3
    module = BlockSparseLSTM(I, H, block_size=8, density=0.5, sparse_input=sparse_input, dtype=F64)
    calls = _count_products(monkeypatch)
    x = torch.randn(steps, B, I, dtype=F64)
    hx = tuple(torch.randn(1, B, H, dtype=F64, requires_grad=True) for _ in range(2)) if with_state else None
    out, (h_n, c_n) = module(x, hx)
    recurrent = steps if with_state else steps - 1
    assert [c[0] for c in calls] == ["dds"] * (int(sparse_input) + recurrent)
    calls.clear()
    (out.sum() + c_n.sum()).backward()

    sdds = [c for c in calls if c[0] == "sdd"]
    rows = recurrent * B
    expected = [("sdd", (4 * H, rows), (rows, H))]
    if sparse_input:
        expected.append(("sdd", (4 * H, steps * B), (steps * B, I)))
    assert sorted(sdds) == sorted(expected)
    # bprop: dh_{t-1} = dgates_t W_hh for t = T-1..1, and t = 0 when h0 needs a gradient
    assert [c for c in calls if c[0] == "dds"] == [("dds", (B, 4 * H))] * recurrent


def test_the_recurrence_never_builds_a_dense_w_hh(monkeypatch):
    module = build_lstm(16, 16, 8, sparse_input=True)

    def refuse(self, values):
        raise AssertionError("layout.to_dense called on the training path")

    monkeypatch.setattr(BlockLayout, "to_dense", refuse)
    out, (h_n, c_n) = module(torch.randn(4, 2, 16, dtype=F64), tuple(torch.randn(1, 2, 16, dtype=F64)
                                                                          for _ in range(2)))
    (out.sum() + h_n.sum() + c_n.sum()).backward()
    assert module.hh.weight.grad is not None


@pytest.mark.parametrize("mark", [pytest.param(None, marks=interpreter)], ids=[""])
@pytest.mark.parametrize("batch_first", [False, True])
def test_sequence_with_triton_cells_matches_dense_interpreter(monkeypatch, batch_first, mark):
    """The whole module with the Triton cell kernels (interpreted) in place of the CPU
    reference: the per-step buffers (strided rows with batch_first, the step without
    c_prev, outputs written into the sequence buffers) against float64 nn.LSTM."""
    monkeypatch.setattr(lstm_cell, "_use_triton", lambda t: t.dtype == torch.float32)
    B, T, I, H = 3, 4, 8, 16
    module64 = build_lstm(I, H, 8, batch_first=batch_first)
    module = copy.deepcopy(module64).float()
    dense = module64.to_dense_lstm()
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(shape, dtype=F64)
    for hx in (None, tuple(torch.randn(1, B, H, dtype=F64) for _ in range(2))):
        x32 = x.float().requires_grad_()
        x_ref = x.clone().requires_grad_()
        out, (h_n, c_n) = module(x32, None if hx is None else tuple(t.float() for t in hx))
        ref, (h_ref, c_ref) = dense(x_ref, hx)
        for name, a, b in (("output", out, ref), ("h_n", h_n, h_ref), ("c_n", c_n, c_ref)):
            assert_close(a, b, torch.float32, name)
        (out.square().sum() + c_n.sum()).backward()
        (ref.square().sum() + c_ref.sum()).backward()
        assert_close(x32.grad, x_ref.grad, torch.float32, "grad x")
        assert_close(module.hh.weight.grad, module.layout.gather(dense.weight_hh_l0.grad), torch.float32,
                     "grad W_hh")
        assert_close(module.weight_ih.grad, dense.weight_ih_l0.grad, torch.float32, "grad W_ih")
        module.zero_grad()
        dense.zero_grad()


def _recurrent_inputs(monkeypatch):
    """Spy on the forward's recurrent products: whether each one's activations came K-major (through
    the dispatching impl on the CPU, through the kernels' DdsPlan on CUDA)."""
    seen = []
    real, real_plan = bsmm._dds_impl, kernels_bsmm.DdsPlan.__call__
    monkeypatch.setattr(bsmm, "_dds_impl", lambda a, *rest: (seen.append(bsmm_kmajor.is_kmajor(a)), real(a, *rest))[1]
                        if rest[-1] else real(a, *rest))  # (trans: the forward's h W_hh^T; bprop not counted)
    monkeypatch.setattr(kernels_bsmm.DdsPlan, "__call__", lambda self, a, out=None: (
        seen.append(bsmm_kmajor.is_kmajor(a)) if self.trans else None, real_plan(self, a, out))[1])
    return seen


@pytest.mark.parametrize("states", ["", "h0+c0"], ids=["none", "both"])
def test_the_cell_hands_the_next_product_h_transposed_where_k_major_pays(monkeypatch, states):
    # Where bsmm_kmajor says K-major activations pay (b 16 on Hopper; forced here), the cell writes h^T
    # and every recurrent product but one on the caller's h0 reads it, no copy; the values and every
    # gradient are those of the dense recurrence (the cell reference writes h^T on the CPU).
    monkeypatch.setattr(bsmm_kmajor, "kmajor_inputs_pay", lambda *args: True)
    seen = _recurrent_inputs(monkeypatch)
    layout, xproj, values, h0, c0 = _sequence_case(5, 16, 32, 16, states)
    out, h_n, c_n = lstm_sequence(xproj, values, layout, h0, c0)
    assert seen == ([False] if h0 is not None else []) + [True] * 4
    ref_out, ref_h, ref_c = _dense_recurrence(xproj.detach(), layout.to_dense(values.detach()),
                                              None if h0 is None else h0.detach(), None if c0 is None else c0.detach())
    for name, a, b in (("output", out, ref_out), ("h_n", h_n, ref_h), ("c_n", c_n, ref_c)):
        assert_close(a, b, F64, name)
    leaves = [t for t in (xproj, values, h0, c0) if t is not None]
    grads = torch.autograd.grad(out.square().sum() + c_n.sum(), leaves)
    monkeypatch.setattr(bsmm_kmajor, "kmajor_inputs_pay", lambda *args: False)  # the row-major run
    seen.clear()
    out_rm, _, c_rm = lstm_sequence(xproj, values, layout, h0, c0)
    assert not any(seen)
    for g, g_rm in zip(grads, torch.autograd.grad(out_rm.square().sum() + c_rm.sum(), leaves)):
        assert_close(g, g_rm, F64, "gradient, K-major against row-major products")


def test_no_transposed_h_for_one_step_or_with_k_major_off(monkeypatch):
    monkeypatch.setattr(bsmm_kmajor, "kmajor_inputs_pay", lambda *args: True)
    seen = _recurrent_inputs(monkeypatch)
    layout, xproj, values, h0, _ = _sequence_case(1, 16, 32, 16, "h0")
    lstm_sequence(xproj, values, layout, h0)
    assert seen == [False]  # one step: the only product reads h0
    from tilesparse.kernels import bsmm as kernels
    monkeypatch.setattr(kernels, "KMAJOR_SMALL", False)
    seen.clear()
    layout, xproj, values, _, _ = _sequence_case(3, 16, 32, 16, "")
    lstm_sequence(xproj, values, layout)
    assert seen == [False, False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_products_read_the_cells_h_transposed_and_match_float64(monkeypatch, dtype):
    # b 16, batch 32, density 0.25: on Hopper a K-major point (bsmm_kmajor.KMAJOR_WINS), so every product
    # after the one on h0 reads the cell kernel's h^T; values and gradients against the float64 recurrence
    seen = _recurrent_inputs(monkeypatch)
    layout, xproj, values, h0, c0 = _sequence_case(6, 32, 256, 16, "h0+c0", layout=layouts.random(1024, 256, 16, 0.25))
    leaves = [xproj, values, h0, c0]
    cuda = [t.detach().to("cuda", dtype).requires_grad_() for t in leaves]
    out, h_n, c_n = lstm_sequence(cuda[0], cuda[1], layout.to("cuda"), cuda[2], cuda[3])
    pays = bsmm_kmajor.kmajor_inputs_pay("fprop", out.device, dtype, 32, 16, layout.nnz / (64 * 16))
    assert seen == [False] + [pays] * 5
    ref_out, ref_h, ref_c = _dense_recurrence(xproj, layout.to_dense(values), h0, c0)
    for name, a, b in (("output", out, ref_out), ("h_n", h_n, ref_h), ("c_n", c_n, ref_c)):
        assert_close(a, b, dtype, name)
    weights = [torch.randn_like(t, dtype=F64) for t in (ref_out, ref_h, ref_c)]
    grads = torch.autograd.grad([out, h_n, c_n], cuda, [w.to("cuda", dtype) for w in weights])
    ref_grads = torch.autograd.grad([ref_out, ref_h, ref_c], leaves, weights)
    for leaf, g, rg in zip(leaves, grads, ref_grads):
        assert_close(g, rg, dtype, f"grad of a {tuple(leaf.shape)} input")
