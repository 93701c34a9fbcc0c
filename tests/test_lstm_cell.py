"""The fused LSTM cell kernels (tilesparse.kernels.lstm_cell) against their PyTorch
reference: under the Triton interpreter on the CPU, on CUDA under the ``gpu`` mark; the
references against autograd; launcher argument errors."""

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS as interpreter
from tilesparse.kernels import lstm_cell
from tolerances import assert_close, rel_error

F64 = torch.float64

# =========================================================================== fused cell

CELL_SIZES = [(3, 40), (5, 300), (1, 8)]  # odd B and H: masked tiles; 300 spans 3 programs
CELL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CELL_IDS = ["fp32", "fp16", "bf16"]
# Pointwise math, rounded once: far tighter than the matmul tolerances (fp32 ~1e-7).
CELL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _cell_close(out, ref, dtype, what):
    assert out.dtype == dtype, f"{what}: dtype {out.dtype} != {dtype}"
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_error(out, ref)
    assert err <= CELL_TOL[dtype], f"{what}: relative error {err:.2e} > {CELL_TOL[dtype]:.0e}"


def _cell_inputs(batch, hidden, dtype, device="cpu"):
    """Pre-activations spread over the saturating range, states and gradients."""
    def r(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).to(dtype).to(device)
    return dict(gates=r(batch, 4 * hidden, scale=2.0), gates_add=r(batch, 4 * hidden), c_prev=r(batch, hidden),
                dh=r(batch, hidden), dh_add=r(batch, hidden), dc_next=r(batch, hidden))


def _f64(t):
    return None if t is None else t.detach().double().cpu()


def test_cell_backward_reference_is_the_gradient_of_the_forward_reference():
    """The hand-written backward formulas against autograd of the forward math (float64)."""
    B, H = 3, 5
    gates = torch.randn(B, 4 * H, dtype=F64, requires_grad=True)
    c_prev = torch.randn(B, H, dtype=F64, requires_grad=True)
    dh, dc_next = torch.randn(B, H, dtype=F64), torch.randn(B, H, dtype=F64)
    for cp in (c_prev, None):
        h, c, acts = lstm_cell.lstm_cell_forward_reference(gates, cp)
        wrt = (gates, cp) if cp is not None else (gates,)
        auto = torch.autograd.grad((h, c), wrt, (dh, dc_next))
        dgates, dc_prev = lstm_cell.lstm_cell_backward_reference(dh, dc_next, acts.detach(), c.detach(),
                                                                 None if cp is None else cp.detach())
        assert_close(dgates, auto[0], F64, "dgates")
        if cp is not None:
            assert_close(dc_prev, auto[1], F64, "dc_prev")


@pytest.mark.parametrize("dtype", CELL_DTYPES, ids=CELL_IDS)
@pytest.mark.parametrize("batch, hidden", CELL_SIZES)
@pytest.mark.parametrize("with_c_prev", [True, False], ids=["c_prev", "no_c_prev"])
@pytest.mark.parametrize("with_add", [True, False], ids=["add", "no_add"])
@pytest.mark.parametrize("mark", [pytest.param(None, marks=interpreter)], ids=[""])
def test_cell_kernels_match_reference_interpreter(dtype, batch, hidden, with_c_prev, with_add, mark):
    """The Triton launchers on CPU tensors (the interpreter runs them), fresh outputs."""
    inp = _cell_inputs(batch, hidden, dtype)
    c_prev = inp["c_prev"] if with_c_prev else None
    add = inp["gates_add"] if with_add else None
    h, c, acts = lstm_cell.lstm_cell_forward_triton(inp["gates"], c_prev, gates_add=add)
    ref_h, ref_c, ref_acts = lstm_cell.lstm_cell_forward_reference(_f64(inp["gates"]), _f64(c_prev),
                                                                   gates_add=_f64(add))
    _cell_close(h, ref_h, dtype, "h")
    _cell_close(c, ref_c, dtype, "c")
    _cell_close(acts, ref_acts, dtype, "acts")

    dh_add = inp["dh_add"] if with_add else None
    dc_next = inp["dc_next"] if with_c_prev else None  # no dc_next: the sequence's last step
    dgates, dc_prev = lstm_cell.lstm_cell_backward_triton(inp["dh"], dc_next, acts, c, c_prev, dh_add=dh_add)
    ref_dg, ref_dcp = lstm_cell.lstm_cell_backward_reference(_f64(inp["dh"]), _f64(dc_next), _f64(acts), _f64(c),
                                                             _f64(c_prev), dh_add=_f64(dh_add))
    _cell_close(dgates, ref_dg, dtype, "dgates")
    _cell_close(dc_prev, ref_dcp, dtype, "dc_prev")
    if not with_c_prev:  # no previous state: the forget gate gets no gradient
        assert torch.all(dgates[:, hidden:2 * hidden] == 0)


@pytest.mark.parametrize("mark", [pytest.param(None, marks=interpreter)], ids=[""])
def test_cell_kernels_write_into_strided_buffers_and_stay_in_bounds_interpreter(mark):
    """Outputs given as slices of larger sentinel-filled buffers (row stride > width):
    the masked kernels write exactly the slice; inputs may have a row stride too."""
    B, H, dtype = 3, 40, torch.float32
    inp = _cell_inputs(B, H, dtype)
    sentinel = 7.0
    big = {name: torch.full((B + 2, width + 8), sentinel) for name, width in
           (("h", H), ("c", H), ("acts", 4 * H), ("dgates", 4 * H), ("dc", H))}
    big_ht = torch.full((H + 2, B + 8), sentinel)  # h^T [H, B], row stride B + 8
    view = {name: t[1:B + 1, 4:t.shape[1] - 4] for name, t in big.items()}
    gates_strided = torch.zeros(B, 8 * H)[:, :4 * H].copy_(inp["gates"])  # row stride 8H
    lstm_cell.lstm_cell_forward_triton(gates_strided, inp["c_prev"], gates_add=inp["gates_add"],
                                       h_out=view["h"], c_out=view["c"], acts_out=view["acts"],
                                       ht_out=big_ht[1:H + 1, 4:4 + B])
    assert torch.equal(big_ht[1:H + 1, 4:4 + B], view["h"].t())  # the same values, transposed
    outside_ht = big_ht.clone()
    outside_ht[1:H + 1, 4:4 + B] = sentinel
    assert torch.all(outside_ht == sentinel), "ht: the kernel wrote outside its slice"
    lstm_cell.lstm_cell_backward_triton(inp["dh"], inp["dc_next"], view["acts"], view["c"], inp["c_prev"],
                                        dgates_out=view["dgates"], dc_prev_out=view["dc"])
    ref_h, ref_c, ref_acts = lstm_cell.lstm_cell_forward_reference(_f64(inp["gates"]), _f64(inp["c_prev"]),
                                                                   gates_add=_f64(inp["gates_add"]))
    ref_dg, ref_dc = lstm_cell.lstm_cell_backward_reference(_f64(inp["dh"]), _f64(inp["dc_next"]),
                                                            _f64(view["acts"]), _f64(view["c"]),
                                                            _f64(inp["c_prev"]))
    for name, ref in (("h", ref_h), ("c", ref_c), ("acts", ref_acts), ("dgates", ref_dg), ("dc", ref_dc)):
        _cell_close(view[name], ref, dtype, name)
        outside = big[name].clone()
        outside[1:B + 1, 4:outside.shape[1] - 4] = sentinel
        assert torch.all(outside == sentinel), f"{name}: the kernel wrote outside its slice"


def test_cell_launcher_argument_errors():
    g = torch.randn(2, 16)
    with pytest.raises(ValueError, match=r"gates must be \[B, 4H\]"):
        lstm_cell.lstm_cell_forward_triton(torch.randn(2, 10))
    with pytest.raises(ValueError, match=r"c_prev must have shape \(2, 4\)"):
        lstm_cell.lstm_cell_forward_triton(g, torch.randn(2, 5))
    with pytest.raises(TypeError, match="gates_add has dtype torch.float16"):
        lstm_cell.lstm_cell_forward_triton(g, gates_add=g.half())
    with pytest.raises(TypeError, match="float16, bfloat16, float32"):
        lstm_cell.lstm_cell_forward_triton(g.double())
    with pytest.raises(ValueError, match="h_out must be a \\(2, 4\\) buffer"):
        lstm_cell.lstm_cell_forward_triton(g, h_out=torch.empty(4, 2).t())
    with pytest.raises(ValueError, match="ht_out must be a \\(4, 2\\) buffer"):
        lstm_cell.lstm_cell_forward_triton(g, ht_out=torch.empty(2, 4))


def test_cell_reference_dispatch_writes_h_transposed():
    inp = _cell_inputs(3, 8, torch.float32)
    ht = torch.full((8, 3), float("nan"))
    h, _, _ = lstm_cell.lstm_cell_forward(inp["gates"], inp["c_prev"], ht_out=ht)
    assert torch.equal(ht, h.t())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CELL_DTYPES, ids=CELL_IDS)
@pytest.mark.parametrize("batch, hidden", [(3, 40), (32, 1024), (64, 8192)])
def test_cell_kernels_gpu(dtype, batch, hidden):
    """The dispatching entry points pick the compiled Triton kernels on CUDA."""
    inp = _cell_inputs(batch, hidden, dtype, "cuda")
    ht = torch.full((hidden, batch), float("nan"), device="cuda", dtype=dtype)
    h, c, acts = lstm_cell.lstm_cell_forward(inp["gates"], inp["c_prev"], gates_add=inp["gates_add"], ht_out=ht)
    assert torch.equal(ht, h.t())  # h^T for a K-major recurrent product: the same values
    ref_h, ref_c, ref_acts = lstm_cell.lstm_cell_forward_reference(_f64(inp["gates"]), _f64(inp["c_prev"]),
                                                                   gates_add=_f64(inp["gates_add"]))
    assert h.device.type == "cuda"
    _cell_close(h, ref_h, dtype, "h")
    _cell_close(c, ref_c, dtype, "c")
    _cell_close(acts, ref_acts, dtype, "acts")
    dgates, dc_prev = lstm_cell.lstm_cell_backward(inp["dh"], inp["dc_next"], acts, c, inp["c_prev"],
                                                   dh_add=inp["dh_add"])
    ref_dg, ref_dcp = lstm_cell.lstm_cell_backward_reference(_f64(inp["dh"]), _f64(inp["dc_next"]), _f64(acts),
                                                             _f64(c), _f64(inp["c_prev"]), dh_add=_f64(inp["dh_add"]))
    _cell_close(dgates, ref_dg, dtype, "dgates")
    _cell_close(dc_prev, ref_dcp, dtype, "dc_prev")
