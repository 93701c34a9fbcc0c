"""The public ops on CPU tensors (the pure-PyTorch path) against float64 dense math.

block_sparse_linear forward and backward, dds / dsd / sdd with every transpose
combination, gradcheck / gradgradcheck in float64. References are built from
``layout.to_dense(values)`` in float64; comparisons use tests/tolerances.py.
"""

import pytest
import torch

import tilesparse
from bsmm_cases import LAYOUT_KINDS, dense_of, linear_reference, make_input, make_layout, random_values
from tilesparse import BlockLayout
from tolerances import assert_close

# Block sizes: 8 is the paper's smallest (runs on 16-wide tiles on GPU), 128 the largest
# the kernels target; 16/32/64 are the common ones.
BLOCK_SIZES = [8, 16, 32, 64, 128]
# Every dtype the ops accept; half types compute in fp32 and round once.
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "fp64", "bf16", "fp16"]

# A 3 x 4 block grid: out != in, so a swapped transpose changes shapes and fails loudly;
# big enough for an empty block-row and block-col plus stored blocks, small enough for CPU.
GRID = (3, 4)

# (input kind, M): M=1 (a single row, the decode case), M=37 (a multiple of no tile
# size), 3-D batches and non-contiguous views (transposed, column-sliced, 3-D strided).
LINEAR_INPUTS = [
    ("contiguous", 1),
    ("contiguous", 37),
    ("transposed", 37),
    ("sliced", 37),
    ("3d", 5),
    ("3d_strided", 5),
]
LINEAR_INPUT_IDS = [f"{kind}-m{m}" for kind, m in LINEAR_INPUTS]


def _linear_case(block_size, dtype, layout_kind, input_kind, m, with_bias=True):
    layout = make_layout(layout_kind, *GRID, block_size)
    out_features, in_features = layout.shape
    x = make_input(input_kind, m, in_features, dtype)
    weight = random_values(layout, dtype).requires_grad_()
    bias = torch.randn(out_features).to(dtype).requires_grad_() if with_bias else None
    return layout, x, weight, bias


def _check_linear(layout, x, weight, bias, dtype):
    y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    assert y.dtype == dtype
    assert y.shape == (*x.shape[:-1], layout.shape[0])
    grad_y = torch.randn(y.shape).to(dtype)
    y.backward(grad_y)
    ref_y, ref_dx, ref_dw, ref_db = linear_reference(x, weight, layout, bias, grad_y)
    assert_close(y, ref_y, dtype, "y")
    assert_close(x.grad, ref_dx, dtype, "dx")
    assert weight.grad.shape == weight.shape  # the layout's blocks only
    assert_close(weight.grad, ref_dw, dtype, "dweight")
    if bias is not None:
        assert_close(bias.grad, ref_db, dtype, "dbias")


# --------------------------------------------------------------------------- block_sparse_linear


@pytest.mark.parametrize("input_kind, m", LINEAR_INPUTS, ids=LINEAR_INPUT_IDS)
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
def test_linear_forward_backward(block_size, dtype, layout_kind, input_kind, m):
    layout, x, weight, bias = _linear_case(block_size, dtype, layout_kind, input_kind, m)
    _check_linear(layout, x, weight, bias, dtype)


# Without bias, across layouts and dtypes (the bias path is exercised above); one block
# size suffices because bias handling does not depend on it.
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_linear_without_bias(dtype, layout_kind):
    layout, x, weight, bias = _linear_case(16, dtype, layout_kind, "contiguous", 37, with_bias=False)
    _check_linear(layout, x, weight, bias, dtype)


# Block sizes that are not powers of two are valid layouts: the CPU path takes any b.
@pytest.mark.parametrize("block_size", [1, 3, 12, 24], ids=lambda b: f"b{b}")
def test_linear_odd_block_sizes(block_size):
    layout, x, weight, bias = _linear_case(block_size, torch.float64, "empty_rows_cols", "contiguous", 37)
    _check_linear(layout, x, weight, bias, torch.float64)


def test_linear_empty_layout_is_bias_broadcast():
    layout = make_layout("empty", *GRID, 8)
    x = torch.randn(4, layout.shape[1])
    bias = torch.randn(layout.shape[0])
    y = tilesparse.block_sparse_linear(x, torch.empty(0, 8, 8), layout, bias)
    assert torch.equal(y, bias.expand(4, -1))


def test_linear_1d_input():
    # nn.Linear accepts a single vector [in]; so does block_sparse_linear.
    layout = make_layout("random", *GRID, 8)
    weight = random_values(layout, torch.float64)
    x = torch.randn(layout.shape[1], dtype=torch.float64)
    y = tilesparse.block_sparse_linear(x, weight, layout)
    assert y.shape == (layout.shape[0],)
    assert_close(y, dense_of(weight, layout) @ x, torch.float64)


def test_linear_zero_rows():
    layout = make_layout("random", *GRID, 8)
    weight = random_values(layout, torch.float32).requires_grad_()
    x = torch.randn(0, layout.shape[1], requires_grad=True)
    y = tilesparse.block_sparse_linear(x, weight, layout)
    assert y.shape == (0, layout.shape[0])
    y.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


@pytest.mark.parametrize("shape", [(2, 3, 0), (0,), (4, 0)])
def test_linear_without_input_features_gives_the_bias(shape):
    """A layout with no block-columns (in_features 0) at 1-D and 3-D inputs (review, 2026-12-04: the rows'
    reshape(-1, 0) raised a raw error)."""
    layout = BlockLayout(torch.ones(2, 0, dtype=torch.bool), 4)
    bias = torch.randn(8, dtype=torch.float64)
    y = tilesparse.block_sparse_linear(torch.randn(*shape, dtype=torch.float64),
                                       torch.zeros(0, 4, 4, dtype=torch.float64), layout, bias)
    assert y.shape == (*shape[:-1], 8)
    assert torch.equal(y, bias.expand_as(y))


@pytest.mark.parametrize("op", ["dds", "dsd", "sdd"])
@pytest.mark.parametrize("flag", ["trans_a", "trans_b"])
def test_transpose_flags_must_be_bools(op, flag):
    # (review, 2026-12-04: trans_a="no" transposed)
    layout = make_layout("random", *GRID, 8)
    values = random_values(layout, torch.float64)
    rows, cols = layout.shape
    args = {"dds": (torch.randn(3, rows, dtype=torch.float64), values, layout),
            "dsd": (values, layout, torch.randn(cols, 3, dtype=torch.float64)),
            "sdd": (torch.randn(rows, 3, dtype=torch.float64), torch.randn(3, cols, dtype=torch.float64), layout)}[op]
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        getattr(tilesparse, op)(*args, **{flag: "no"})


def test_linear_matches_nn_linear_for_full_layout():
    # With every block stored, the op is nn.functional.linear on the dense weight.
    layout = make_layout("full", 2, 3, 16)
    weight = random_values(layout, torch.float64)
    bias = torch.randn(layout.shape[0], dtype=torch.float64)
    x = torch.randn(7, layout.shape[1], dtype=torch.float64)
    expected = torch.nn.functional.linear(x, layout.to_dense(weight), bias)
    assert_close(tilesparse.block_sparse_linear(x, weight, layout, bias), expected, torch.float64)


# --------------------------------------------------------------------------- dds / dsd / sdd

TRANS = [(False, False), (False, True), (True, False), (True, True)]
TRANS_IDS = ["NN", "NT", "TN", "TT"]
M = 37  # the dense operand's free dimension: a multiple of no tile size


def _maybe_t(t, flag):
    """Store an operand so that op(stored) is the logical matrix: transposed when flag."""
    return t.t().contiguous() if flag else t


def _dds_case(layout, dtype, trans_a, trans_b):
    rows, cols = layout.shape
    inner = cols if trans_b else rows
    a_logical = torch.randn(M, inner).to(dtype)
    return _maybe_t(a_logical, trans_a), a_logical


def _dsd_case(layout, dtype, trans_a, trans_b):
    rows, cols = layout.shape
    inner = rows if trans_a else cols
    b_logical = torch.randn(inner, M).to(dtype)
    return _maybe_t(b_logical, trans_b), b_logical


def _sdd_case(layout, dtype, trans_a, trans_b):
    rows, cols = layout.shape
    a_logical = torch.randn(rows, M).to(dtype)
    b_logical = torch.randn(M, cols).to(dtype)
    return _maybe_t(a_logical, trans_a), _maybe_t(b_logical, trans_b), a_logical, b_logical


def _check_dds(layout, dtype, trans_a, trans_b):
    a, a_logical = _dds_case(layout, dtype, trans_a, trans_b)
    values = random_values(layout, dtype)
    out = tilesparse.dds(a, values, layout, trans_a=trans_a, trans_b=trans_b)
    s = dense_of(values, layout)
    expected = a_logical.double() @ (s.t() if trans_b else s)
    assert out.dtype == dtype
    assert_close(out, expected, dtype, "dds")


def _check_dsd(layout, dtype, trans_a, trans_b):
    b, b_logical = _dsd_case(layout, dtype, trans_a, trans_b)
    values = random_values(layout, dtype)
    out = tilesparse.dsd(values, layout, b, trans_a=trans_a, trans_b=trans_b)
    s = dense_of(values, layout)
    expected = (s.t() if trans_a else s) @ b_logical.double()
    assert out.dtype == dtype
    assert_close(out, expected, dtype, "dsd")


def _check_sdd(layout, dtype, trans_a, trans_b):
    a, b, a_logical, b_logical = _sdd_case(layout, dtype, trans_a, trans_b)
    out = tilesparse.sdd(a, b, layout, trans_a=trans_a, trans_b=trans_b)
    expected = layout.gather(a_logical.double() @ b_logical.double())
    assert out.dtype == dtype
    assert out.shape == (layout.nnz, layout.block_size, layout.block_size)
    assert_close(out, expected, dtype, "sdd")


CHECKS = {"dds": _check_dds, "dsd": _check_dsd, "sdd": _check_sdd}


# Every op x transpose combination x block size x dtype, on the layout with empty
# block-rows and block-cols (the table shape most likely to expose an indexing slip).
@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
@pytest.mark.parametrize("op", list(CHECKS))
def test_ops_all_transposes(op, block_size, dtype, trans_a, trans_b):
    CHECKS[op](make_layout("empty_rows_cols", *GRID, block_size), dtype, trans_a, trans_b)


# Every layout class for each op and transpose combination, at one size and dtype.
@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
@pytest.mark.parametrize("op", list(CHECKS))
def test_ops_all_layouts(op, layout_kind, trans_a, trans_b):
    CHECKS[op](make_layout(layout_kind, *GRID, 16), torch.float32, trans_a, trans_b)


@pytest.mark.parametrize("op", list(CHECKS))
def test_ops_non_contiguous_dense_operands(op):
    # Column-sliced dense operands (inner stride 2), not just transposes.
    layout = make_layout("random", *GRID, 8)
    rows, cols = layout.shape
    values = random_values(layout, torch.float64)
    s = dense_of(values, layout)
    if op == "dds":
        a = torch.randn(M, 2 * rows, dtype=torch.float64)[:, ::2]
        out, expected = tilesparse.dds(a, values, layout), a @ s
    elif op == "dsd":
        b = torch.randn(cols, 2 * M, dtype=torch.float64)[:, ::2]
        out, expected = tilesparse.dsd(values, layout, b), s @ b
    else:
        a = torch.randn(rows, 2 * M, dtype=torch.float64)[:, ::2]
        b = torch.randn(M, 2 * cols, dtype=torch.float64)[:, 1::2]
        out, expected = tilesparse.sdd(a, b, layout), layout.gather(a @ b)
    assert_close(out, expected, torch.float64, op)


# --------------------------------------------------------------------------- gradcheck (float64)

# Tiny shapes: gradcheck perturbs every input element. Block size 8 on a 2 x 3 grid with
# empty rows/cols keeps the layout non-trivial.
GC_GRID = (2, 3)


def _gc_layout():
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.bool)  # block-col 1 and part of row 1 empty
    return BlockLayout(mask, 4)


def test_gradcheck_linear_with_bias():
    layout = make_layout("empty_rows_cols", *GC_GRID, 8)
    x = torch.randn(3, layout.shape[1], dtype=torch.float64, requires_grad=True)
    w = torch.randn(layout.nnz, 8, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(layout.shape[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: tilesparse.block_sparse_linear(x, w, layout, b), (x, w, bias))


def test_gradcheck_linear_3d_input():
    layout = _gc_layout()
    x = torch.randn(2, 2, layout.shape[1], dtype=torch.float64, requires_grad=True)
    w = torch.randn(layout.nnz, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: tilesparse.block_sparse_linear(x, w, layout), (x, w))


@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
def test_gradcheck_dds(trans_a, trans_b):
    layout = _gc_layout()
    a, _ = _dds_case(layout, torch.float64, trans_a, trans_b)
    a = a[:3] if not trans_a else a[:, :3]  # 3 rows of M
    a = a.detach().requires_grad_()
    v = torch.randn(layout.nnz, 4, 4, dtype=torch.float64, requires_grad=True)
    fn = lambda a, v: tilesparse.dds(a, v, layout, trans_a=trans_a, trans_b=trans_b)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, v))


@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
def test_gradcheck_dsd(trans_a, trans_b):
    layout = _gc_layout()
    b, _ = _dsd_case(layout, torch.float64, trans_a, trans_b)
    b = b[:, :3] if not trans_b else b[:3]
    b = b.detach().requires_grad_()
    v = torch.randn(layout.nnz, 4, 4, dtype=torch.float64, requires_grad=True)
    fn = lambda v, b: tilesparse.dsd(v, layout, b, trans_a=trans_a, trans_b=trans_b)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (v, b))


@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
def test_gradcheck_sdd(trans_a, trans_b):
    layout = _gc_layout()
    rows, cols = layout.shape
    a = _maybe_t(torch.randn(rows, 3, dtype=torch.float64), trans_a).requires_grad_()
    b = _maybe_t(torch.randn(3, cols, dtype=torch.float64), trans_b).requires_grad_()
    fn = lambda a, b: tilesparse.sdd(a, b, layout, trans_a=trans_a, trans_b=trans_b)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b))


def test_gradgradcheck_linear():
    layout = _gc_layout()
    x = torch.randn(3, layout.shape[1], dtype=torch.float64, requires_grad=True)
    w = torch.randn(layout.nnz, 4, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(layout.shape[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: tilesparse.block_sparse_linear(x, w, layout, b), (x, w, bias))


def test_gradgradcheck_sdd():
    layout = _gc_layout()
    a = torch.randn(layout.shape[0], 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, layout.shape[1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, b: tilesparse.sdd(a, b, layout), (a, b))


# Regression: under CPU autocast the reference's inner bmm was re-cast to bf16 and
# index_add_ then refused a bf16 source into its float32 accumulator.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_sparse_linear_under_cpu_autocast(dtype):
    layout = tilesparse.layouts.random(64, 96, 16, 0.5, seed=0)
    x = torch.randn(5, 96, requires_grad=True)
    weight = torch.randn(layout.nnz, 16, 16, requires_grad=True)
    bias = torch.randn(64, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    assert y.dtype == dtype
    y.float().sum().backward()
    ref = x.detach().to(dtype).double() @ layout.to_dense(weight.detach().to(dtype)).double().t() + bias.detach().to(dtype).double()
    assert_close(y, ref, dtype, "autocast forward")
    assert x.grad is not None and weight.grad is not None and bias.grad is not None
    assert torch.isfinite(weight.grad).all()


def test_autograd_records_only_when_a_gradient_is_needed():
    # Inference calls skip the autograd.Function (host cost); training calls must not.
    layout = tilesparse.layouts.random(32, 48, 16, 0.5, seed=0)
    x = torch.randn(3, 48)
    weight = torch.randn(layout.nnz, 16, 16)
    assert tilesparse.block_sparse_linear(x, weight, layout).grad_fn is None
    with torch.inference_mode():
        assert tilesparse.block_sparse_linear(x, weight, layout).grad_fn is None
    weight.requires_grad_()
    with torch.no_grad():
        assert tilesparse.block_sparse_linear(x, weight, layout).grad_fn is None
    y = tilesparse.block_sparse_linear(x, weight, layout)
    assert y.grad_fn is not None
    (grad,) = torch.autograd.grad(y.sum(), weight)
    assert grad.shape == weight.shape
    out = tilesparse.sdd(x.t(), torch.randn(3, 48), tilesparse.layouts.random(48, 48, 16, 0.5, seed=1))
    assert out.grad_fn is None
