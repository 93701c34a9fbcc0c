"""Bad input to the public ops raises the documented error type, and the message names
the offending argument.

Each case is a function of a fresh fixture set ``f`` (a layout with block size 8 on a
2 x 3 grid, i.e. W is [16, 24], plus valid x / weight / bias / a / b), so every case
changes exactly one thing from a valid call.

Device mismatches use the 'meta' device as the "other" device (there is no GPU here).
"""

from types import SimpleNamespace

import pytest
import torch

import tilesparse
from tilesparse import layouts

B = 8


@pytest.fixture
def f():
    layout = layouts.random(16, 24, B, 0.5, seed=int(torch.randint(1000, ())))
    rows, cols = layout.shape
    return SimpleNamespace(
        layout=layout,
        x=torch.randn(5, cols),
        weight=torch.randn(layout.nnz, B, B),
        bias=torch.randn(rows),
        a_dds=torch.randn(5, rows),  # dds: a @ S
        b_dsd=torch.randn(cols, 5),  # dsd: S @ b
        a_sdd=torch.randn(rows, 5),  # sdd: a @ b sampled on the layout
        b_sdd=torch.randn(5, cols),
    )


def linear(f, **changes):
    kwargs = dict(x=f.x, weight=f.weight, layout=f.layout, bias=f.bias)
    kwargs.update(changes)
    return tilesparse.block_sparse_linear(kwargs["x"], kwargs["weight"], kwargs["layout"], kwargs["bias"])


def meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


# (id, call, exception, message pattern)
LINEAR_CASES = [
    ("x_int", lambda f: linear(f, x=f.x.long()), TypeError, r"^x has dtype torch\.int64"),
    ("x_not_tensor", lambda f: linear(f, x=f.x.tolist()), TypeError, r"^x must be a torch\.Tensor"),
    ("x_0d", lambda f: linear(f, x=torch.tensor(1.0)), ValueError, r"^x must have at least 1 dims"),
    ("x_features", lambda f: linear(f, x=torch.randn(5, 32)), ValueError, r"^x\.shape\[-1\] \(in_features\) is 32"),
    ("weight_int", lambda f: linear(f, weight=f.weight.int()), TypeError, r"^weight has dtype torch\.int32"),
    ("weight_dtype_vs_x", lambda f: linear(f, weight=f.weight.double()), TypeError,
     r"^weight has dtype torch\.float64 but x has torch\.float32"),
    ("weight_2d", lambda f: linear(f, weight=f.weight[0]), ValueError, r"^weight must be 3-D"),
    ("weight_nnz", lambda f: linear(f, weight=torch.randn(f.layout.nnz + 1, B, B)), ValueError,
     r"^weight has \d+ blocks but the layout has nnz="),
    ("weight_not_square", lambda f: linear(f, weight=torch.randn(f.layout.nnz, B, B + 1)), ValueError,
     r"^weight must hold square blocks"),
    ("weight_block_size", lambda f: linear(f, weight=torch.randn(f.layout.nnz, 16, 16)), ValueError,
     r"^weight holds 16x16 blocks but the layout has block_size=8"),
    ("layout_block_size", lambda f: linear(
        f, layout=layouts.random(16, 32, 16, 0.5), weight=torch.randn(1, B, B), x=torch.randn(5, 32),
        bias=torch.randn(16)), ValueError, r"^weight holds 8x8 blocks but the layout has block_size=16"),
    ("layout_not_layout", lambda f: linear(f, layout=f.layout.mask), TypeError,
     r"^layout must be a tilesparse\.BlockLayout"),
    ("bias_size", lambda f: linear(f, bias=torch.randn(17)), ValueError, r"^bias\.shape\[0\] \(out_features\) is 17"),
    ("bias_2d", lambda f: linear(f, bias=f.bias[None]), ValueError, r"^bias must be 1-D"),
    ("bias_dtype", lambda f: linear(f, bias=f.bias.half()), TypeError, r"^bias has dtype torch\.float16 but x has"),
    ("bias_int", lambda f: linear(f, bias=f.bias.long()), TypeError, r"^bias has dtype torch\.int64"),
    ("weight_device", lambda f: linear(f, weight=meta(f.weight)), ValueError, r"^weight is on meta but x is on cpu"),
    ("bias_device", lambda f: linear(f, bias=meta(f.bias)), ValueError, r"^bias is on meta but x is on cpu"),
]

DDS_CASES = [
    ("a_int", lambda f: tilesparse.dds(f.a_dds.long(), f.weight, f.layout), TypeError, r"^a has dtype"),
    ("a_3d", lambda f: tilesparse.dds(f.a_dds[None], f.weight, f.layout), ValueError, r"^a must be 2-D"),
    ("values_dtype", lambda f: tilesparse.dds(f.a_dds, f.weight.half(), f.layout), TypeError,
     r"^values has dtype torch\.float16 but a has"),
    ("values_nnz", lambda f: tilesparse.dds(f.a_dds, f.weight[1:], f.layout), ValueError, r"^values has \d+ blocks"),
    ("values_block_size", lambda f: tilesparse.dds(f.a_dds, torch.randn(f.layout.nnz, 4, 4), f.layout), ValueError,
     r"^values holds 4x4 blocks but the layout has block_size=8"),
    ("inner_dim", lambda f: tilesparse.dds(f.a_dds, f.weight, f.layout, trans_b=True), ValueError,
     r"^the inner dimension of op\(a\) is 16 but the layout needs 24"),
    ("inner_dim_trans_a", lambda f: tilesparse.dds(f.a_dds, f.weight, f.layout, trans_a=True), ValueError,
     r"^the inner dimension of op\(a\) is 5"),
    ("layout", lambda f: tilesparse.dds(f.a_dds, f.weight, "layout"), TypeError, r"^layout must be a tilesparse"),
    ("values_device", lambda f: tilesparse.dds(f.a_dds, meta(f.weight), f.layout), ValueError,
     r"^values is on meta but a is on cpu"),
    ("a_device", lambda f: tilesparse.dds(meta(f.a_dds), f.weight, f.layout), ValueError,
     r"^values is on cpu but a is on meta"),
]

DSD_CASES = [
    ("b_int", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd.int()), TypeError, r"^b has dtype"),
    ("b_1d", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd[:, 0]), ValueError, r"^b must be 2-D"),
    ("values_dtype", lambda f: tilesparse.dsd(f.weight.double(), f.layout, f.b_dsd), TypeError,
     r"^values has dtype torch\.float64 but b has"),
    ("values_3d_shape", lambda f: tilesparse.dsd(f.weight.flatten(1), f.layout, f.b_dsd), ValueError,
     r"^values must be 3-D"),
    ("inner_dim", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd, trans_a=True), ValueError,
     r"^the inner dimension of op\(b\) is 24 but the layout needs 16"),
    ("inner_dim_trans_b", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd, trans_b=True), ValueError,
     r"^the inner dimension of op\(b\) is 5"),
    ("layout", lambda f: tilesparse.dsd(f.weight, None, f.b_dsd), TypeError, r"^layout must be a tilesparse"),
    ("values_device", lambda f: tilesparse.dsd(meta(f.weight), f.layout, f.b_dsd), ValueError,
     r"^values is on meta but b is on cpu"),
]

SDD_CASES = [
    ("layout", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout.mask), TypeError, r"^layout must be a tilesparse"),
    ("a_int", lambda f: tilesparse.sdd(f.a_sdd.long(), f.b_sdd, f.layout), TypeError, r"^a has dtype"),
    ("b_int", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd.long(), f.layout), TypeError, r"^b has dtype"),
    ("b_dtype", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd.bfloat16(), f.layout), TypeError,
     r"^b has dtype torch\.bfloat16 but a has"),
    ("a_3d", lambda f: tilesparse.sdd(f.a_sdd[None], f.b_sdd, f.layout), ValueError, r"^a must be 2-D"),
    ("a_rows", lambda f: tilesparse.sdd(f.a_sdd[:8], f.b_sdd, f.layout), ValueError,
     r"^op\(a\)\.shape\[0\] is 8 but the layout needs 16"),
    ("a_rows_trans", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout, trans_a=True), ValueError,
     r"^op\(a\)\.shape\[0\] is 5"),
    ("b_cols", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd[:, :8], f.layout), ValueError,
     r"^op\(b\)\.shape\[1\] is 8 but the layout needs 24"),
    ("inner_dim", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd[:4], f.layout), ValueError,
     r"^op\(b\)\.shape\[0\] \(must equal op\(a\)\.shape\[1\]\); it is 4"),
    ("b_device", lambda f: tilesparse.sdd(f.a_sdd, meta(f.b_sdd), f.layout), ValueError,
     r"^b is on meta but a is on cpu"),
]


def _params(cases):
    return pytest.mark.parametrize("call, exc, pattern", [c[1:] for c in cases], ids=[c[0] for c in cases])


@_params(LINEAR_CASES)
def test_block_sparse_linear_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(DDS_CASES)
def test_dds_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(DSD_CASES)
def test_dsd_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(SDD_CASES)
def test_sdd_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


def test_block_sparse_linear_x_on_other_device(f):
    # Devices are checked before the autocast probe (which has no 'meta' device type).
    with pytest.raises(ValueError, match=r"weight is on cpu but x is on meta"):
        linear(f, x=meta(f.x))


def test_valid_fixture_calls_succeed(f):
    # The baseline every error case departs from must itself be valid.
    assert linear(f).shape == (5, 16)
    assert tilesparse.dds(f.a_dds, f.weight, f.layout).shape == (5, 24)
    assert tilesparse.dsd(f.weight, f.layout, f.b_dsd).shape == (16, 5)
    assert tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout).shape == f.weight.shape
