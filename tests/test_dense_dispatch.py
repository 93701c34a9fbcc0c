"""Block-sparse linear layers measured slower than dense (tilesparse.ops.dense_dispatch):
the interpolation of the measured speedups, the crossover densities, where they apply,
the opt-in switch, and that the dense path computes the same layer (values, and the
gradients of x, the blocks and the bias) without keeping a dense weight alive."""

import warnings

import pytest
import torch

import tilesparse as ts
from tilesparse.ops import bsmm as ops
from tilesparse.ops import dense_dispatch as dd
from tolerances import assert_close

H200 = dd.SPEEDUPS["nvidia-h200"]


@pytest.mark.parametrize("op", ["step", "fprop"])
@pytest.mark.parametrize("block", [16, 32, 64, 128])
def test_estimate_passes_through_the_measurements_and_falls_with_density(op, block):
    points = H200[op][block]
    for density, speedup in points:
        assert dd.speedup_estimate(points, density) == pytest.approx(speedup)
    grid = [0.01 * i for i in range(1, 101)]
    estimates = [dd.speedup_estimate(points, d) for d in grid]
    assert all(a >= b for a, b in zip(estimates, estimates[1:]))
    # above the largest density timed: the rate at 0.5 (speedup x density) over the density
    assert dd.speedup_estimate(points, 1.0) == pytest.approx(points[-1][1] * 0.5)


@pytest.mark.parametrize("op", ["step", "fprop"])
@pytest.mark.parametrize("block", [16, 32, 64, 128])
def test_crossover_is_where_the_estimate_crosses_one(op, block):
    points = H200[op][block]
    c = dd.crossover_density(points)
    assert dd.speedup_estimate(points, c) == pytest.approx(1.0, rel=1e-6)
    losing = [d for d, s in points if s < 1]
    winning = [d for d, s in points if s >= 1]
    assert all(d < c for d in winning) and all(d > c for d in losing)


def test_crossovers_of_the_h200_table():
    # b 16 loses from density ~0.10 (training) / ~0.10 (forward); b 32 from ~0.30 / ~0.35;
    # b 64 and 128 only above the densities measured (0.5), by their rate there
    got = {op: {b: round(dd.crossover_density(p), 2) for b, p in H200[op].items()} for op in H200}
    assert got["step"][16] == pytest.approx(0.10, abs=0.01) and got["step"][32] == pytest.approx(0.295, abs=0.01)
    assert got["fprop"][16] == pytest.approx(0.10, abs=0.01) and got["fprop"][32] == pytest.approx(0.35, abs=0.01)
    assert min(got["step"][64], got["step"][128], got["fprop"][64], got["fprop"][128]) > 0.5


def test_measured_only_where_measured():
    args = dict(rows=dd.MIN_ROWS, block_size=16, density=0.5, training=True)
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, **args) == pytest.approx(0.372)
    assert dd.measured_speedup("nvidia-h200", torch.float16, **args) == pytest.approx(0.372)
    assert dd.measured_speedup("nvidia-h200", torch.float32, **args) is None  # TF32: not in the table
    assert dd.measured_speedup("nvidia-a100-sxm4-80gb", torch.bfloat16, **args) is None
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, **{**args, "rows": dd.MIN_ROWS - 1}) is None
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, **{**args, "block_size": 8}) is None
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, **{**args, "training": False}) == pytest.approx(0.285)


def test_cpu_tensors_never_dispatch(monkeypatch):
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "1")
    x = torch.randn(dd.MIN_ROWS, 32, dtype=torch.bfloat16)
    assert not dd.run_dense(x, 16, 0.5, True)


def test_scatter_and_gather_match_the_layouts_own():
    layout = ts.layouts.random(96, 64, 16, 0.4, seed=3)
    values = torch.randn(layout.nnz, 16, 16)
    meta = layout.meta
    dense = dd.scatter_dense(values, meta, layout.block_rows, layout.block_cols)
    assert dense.is_contiguous() and torch.equal(dense, layout.to_dense(values))
    assert torch.equal(dd.gather_blocks(dense, meta, layout.block_rows, layout.block_cols, 16), values)


def test_dense_path_is_twice_differentiable():
    # as the kernels' path is (gradient penalties, Hessian-vector products)
    layout = ts.layouts.random(32, 48, 16, 0.5, seed=4)
    weight = (torch.randn(layout.nnz, 16, 16, dtype=torch.float64) * 0.2).requires_grad_()
    bias = torch.randn(32, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 48, dtype=torch.float64, requires_grad=True)
    meta = layout.meta

    def layer(x, weight, bias):
        return dd.dense_linear(x, weight, meta, bias, layout.block_rows, layout.block_cols)

    assert torch.autograd.gradgradcheck(layer, (x, weight, bias))


def test_dense_path_of_the_transposed_storage_computes_the_same_layer(monkeypatch):
    # W's blocks stored as W^T's (TransposedBlockSparseLinear): the dense path scatters W^T
    layout = ts.layouts.random(48, 64, 16, 0.5, seed=1)
    weight = torch.randn(layout.nnz, 16, 16, dtype=torch.float64) * 0.2
    flipped = layout.transpose()
    weight_t = weight[layout.tables.col_slot.long()].transpose(1, 2).contiguous().requires_grad_()
    weight.requires_grad_()
    bias = torch.randn(48, dtype=torch.float64, requires_grad=True)
    x = torch.randn(9, 64, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(9, 48, dtype=torch.float64)
    want = ops.block_sparse_linear(x, weight, layout, bias)
    want_grads = torch.autograd.grad(want, (x, weight, bias), grad)
    calls = []
    monkeypatch.setattr(dd, "run_dense", lambda *args: calls.append(args) or True)
    got = ops.block_sparse_linear(x, weight_t, flipped, bias, transposed_storage=True)
    got_grads = torch.autograd.grad(got, (x, weight_t, bias), grad)
    assert calls and calls[0][1:] == (16, layout.density, True, layout.shape)  # W's shape, not W^T's
    assert_close(got, want, torch.float64, "dense path output")
    assert_close(got_grads[0], want_grads[0], torch.float64, "dense path dx")
    assert_close(got_grads[1], want_grads[1][layout.tables.col_slot.long()].transpose(1, 2), torch.float64,
                 "dense path dweight (W^T's blocks)")
    assert_close(got_grads[2], want_grads[2], torch.float64, "dense path dbias")
    assert torch.autograd.gradgradcheck(
        lambda x, w: dd.dense_linear(x, w, flipped.meta, None, flipped.block_rows, flipped.block_cols, True),
        (x[:3].detach().requires_grad_(), weight_t.detach().requires_grad_()))


@pytest.mark.parametrize("shape", [(37, 64), (3, 5, 64)])
def test_dense_path_computes_the_same_layer(shape, monkeypatch):
    layout = ts.layouts.random(48, 64, 16, 0.5, seed=0)
    weight = (torch.randn(layout.nnz, 16, 16, dtype=torch.float64) * 0.2).requires_grad_()
    bias = torch.randn(48, dtype=torch.float64, requires_grad=True)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(*shape[:-1], 48, dtype=torch.float64)
    want = ops.block_sparse_linear(x, weight, layout, bias)
    want_grads = torch.autograd.grad(want, (x, weight, bias), grad)
    calls = []
    monkeypatch.setattr(dd, "run_dense", lambda *args: calls.append(args) or True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        got = ops.block_sparse_linear(x, weight, layout, bias)
    assert max(saved) < 48 * 64  # the blocks and x are kept for the backward, never the dense weight
    got_grads = torch.autograd.grad(got, (x, weight, bias), grad)
    assert calls and calls[0][1:] == (16, layout.density, True, layout.shape)
    assert_close(got, want, torch.float64, "dense path output")
    for name, g, w in zip(("dx", "dweight", "dbias"), got_grads, want_grads):
        assert_close(g, w, torch.float64, f"dense path {name}")
    again = torch.autograd.grad(ops.block_sparse_linear(x, weight, layout, bias), (x, weight, bias), grad)
    assert all(torch.equal(a, b) for a, b in zip(again, got_grads))  # deterministic
    with torch.no_grad():
        ops.block_sparse_linear(x, weight, layout, bias)
    assert calls[-1][3] is False  # no gradient wanted: the forward's measurements apply


@pytest.mark.gpu
def test_gpu_warns_by_default_and_dispatches_when_asked(monkeypatch):
    name = dd._gpu(torch.cuda.current_device())
    if name not in dd.SPEEDUPS:
        pytest.skip(f"no measurements for {name}")
    layer = ts.nn.BlockSparseLinear(1024, 1024, block_size=16, density=0.5).cuda().to(torch.bfloat16)
    x = torch.randn(dd.MIN_ROWS, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(dd.MIN_ROWS, 1024, device="cuda", dtype=torch.bfloat16)
    dd._warn_once.cache_clear()
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "0")
    with pytest.warns(UserWarning, match="would be faster as dense"):
        kernel = layer(x)
    kernel_grads = torch.autograd.grad(kernel, (x, layer.weight, layer.bias), grad)
    monkeypatch.delenv("TILESPARSE_DENSE_DISPATCH")  # on by default
    with pytest.warns(UserWarning, match="runs as dense"):
        dense = layer(x)
    dense_grads = torch.autograd.grad(dense, (x, layer.weight, layer.bias), grad)
    assert_close(dense, kernel.double().cpu(), torch.bfloat16, "dense dispatch vs the kernel")
    for n, a, b in zip(("dx", "dweight", "dbias"), dense_grads, kernel_grads):
        assert_close(a, b.double().cpu(), torch.bfloat16, f"dense dispatch {n}")
    with dd.kernels_only(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not dd.run_dense(x, 16, 0.5, True)


def test_dispatch_is_on_by_default_and_kernels_only_turns_it_off(monkeypatch):
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", off)
        assert not dd.enabled(), off
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "1")
    assert dd.enabled()
    monkeypatch.delenv("TILESPARSE_DENSE_DISPATCH")
    assert dd.enabled()
    with dd.kernels_only():
        with dd.kernels_only():
            assert not dd.enabled()
        assert not dd.enabled()
    assert dd.enabled()


def test_compiled_code_keeps_the_kernels(monkeypatch):
    # the decision is skipped while dynamo traces (a device-name lookup would break a full
    # graph); the compiled layer matches the eager one
    layout = ts.layouts.random(32, 32, 16, 0.5, seed=1)
    weight = torch.randn(layout.nnz, 16, 16)
    x = torch.randn(8, 32)
    seen = []
    real = dd.run_dense
    monkeypatch.setattr(dd, "run_dense", lambda *args: seen.append(torch.compiler.is_compiling()) or real(*args))
    compiled = torch.compile(lambda x_: ops.block_sparse_linear(x_, weight, layout), fullgraph=True)
    assert_close(compiled(x), ops.block_sparse_linear(x, weight, layout), torch.float32, "compiled")
    assert True in seen
