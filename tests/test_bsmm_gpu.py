"""The real Triton kernels on CUDA, at realistic sizes, against float64 CPU references.

Marked ``gpu``: skipped without a CUDA device (conftest). On a GPU, conftest leaves
TRITON_INTERPRET unset, so the compiled kernels run; TILESPARSE_POISON=1 still fills
outputs with NaN first, so an unwritten element fails ``assert_close``'s finiteness check.

References: inputs are drawn on the GPU in the test dtype, then copied with
``.double().cpu()``; the dense float64 math (``layout.to_dense``) runs on the CPU, so
no GPU code is trusted by the reference.

Most Triton compile time is spent on the first case of each (block size, dtype, M-tile)
combination; a fresh machine compiles ~150 kernel variants.
"""

import copy
import dataclasses

import pytest
import torch
from torch import nn

import tilesparse
from bsmm_cases import LAYOUT_KINDS, dense_of, linear_reference, make_input, make_layout, random_values
from tilesparse import BlockLayout, BlockSparseLinear
from tilesparse.kernels import bsmm as kernels
from tolerances import REL_TOL, assert_close, rel_error

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BLOCK_SIZES = [8, 16, 32, 64, 128]  # 8 runs on masked 16-wide tiles; 128 the largest tile
DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # bf16 numerics are only checkable here
DTYPE_IDS = ["fp32", "fp16", "bf16"]
# A transformer-like projection: in 1024, out 768, both divisible by every block size.
IN_FEATURES, OUT_FEATURES = 1024, 768
# M: one row (decode), 37 (a multiple of no tile: 64-row tile, masked), 1000 (8 tiles of
# 128, the last partial, one full GROUP_M group), 4096 (32 tiles: several groups; sdd
# may split its reduction).
MS = [1, 37, 1000, 4096]


def _grid(block_size):
    return OUT_FEATURES // block_size, IN_FEATURES // block_size


def _linear_inputs(block_size, dtype, layout_kind, input_kind, m):
    layout = make_layout(layout_kind, *_grid(block_size), block_size)
    x = make_input(input_kind, m, IN_FEATURES, dtype, DEVICE)
    weight = random_values(layout, dtype, DEVICE).requires_grad_()
    bias = torch.randn(OUT_FEATURES, device=DEVICE).to(dtype).requires_grad_()
    return layout, x, weight, bias


def _check_linear(layout, x, weight, bias, dtype):
    y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    assert y.device.type == "cuda" and y.dtype == dtype
    assert y.shape == (*x.shape[:-1], OUT_FEATURES)
    grad_y = torch.randn(y.shape, device=DEVICE).to(dtype)
    dx, dw, db = torch.autograd.grad(y, (x, weight, bias), grad_y)
    ref_y, ref_dx, ref_dw, ref_db = linear_reference(x, weight, layout, bias, grad_y)
    assert_close(y, ref_y, dtype, "y")
    assert_close(dx, ref_dx, dtype, "dx")
    assert_close(dw, ref_dw, dtype, "dweight")
    assert_close(db, ref_db, dtype, "dbias")


# --------------------------------------------------------------------------- block_sparse_linear


@pytest.mark.parametrize("layout_kind", LAYOUT_KINDS)
@pytest.mark.parametrize("m", MS, ids=lambda m: f"m{m}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
def test_linear(block_size, dtype, m, layout_kind):
    _check_linear(*_linear_inputs(block_size, dtype, layout_kind, "contiguous", m), dtype)


# 3-D batches and non-contiguous activations (column-major, column-sliced, a transposed
# 3-D view): the kernels take strides, and the 3-D reshape may or may not copy.
@pytest.mark.parametrize("input_kind", ["transposed", "sliced", "3d", "3d_strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [8, 32, 128], ids=lambda b: f"b{b}")
def test_linear_input_layouts(block_size, dtype, input_kind):
    m = 500 if input_kind.startswith("3d") else 1000
    _check_linear(*_linear_inputs(block_size, dtype, "empty_rows_cols", input_kind, m), dtype)


@pytest.mark.parametrize("kind", ["random", "empty_rows_cols"])
@pytest.mark.parametrize("block_size", [8, 64, 128], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("precision", ["high", "medium"])
def test_linear_fp32_tf32(precision, block_size, kind):
    # With float32 matmul precision below 'highest' the kernels use TF32 (like cuBLAS);
    # the fp32 tolerance allows for it. TF32 bprop runs on per-block transposed values
    # and updat on M-contiguous copies of the activations: forward and backward checked.
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        assert kernels._input_precision(torch.float32) == "tf32"
        _check_linear(*_linear_inputs(block_size, torch.float32, kind, "transposed", 1000), torch.float32)
    finally:
        torch.set_float32_matmul_precision(old)


def test_linear_float64_on_cuda():
    # No fp64 tensor-core path: float64 on CUDA runs the reference code on the GPU.
    _check_linear(*_linear_inputs(32, torch.float64, "empty_rows_cols", "contiguous", 37), torch.float64)


def test_linear_without_bias():
    layout, x, weight, _ = _linear_inputs(32, torch.float16, "random", "contiguous", 1000)
    y = tilesparse.block_sparse_linear(x, weight, layout)
    grad_y = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, weight), grad_y)
    ref_y, ref_dx, ref_dw, _ = linear_reference(x, weight, layout, None, grad_y)
    assert_close(y, ref_y, torch.float16, "y")
    assert_close(dx, ref_dx, torch.float16, "dx")
    assert_close(dw, ref_dw, torch.float16, "dweight")


# --------------------------------------------------------------------------- dds / dsd / sdd

TRANS = [(False, False), (False, True), (True, False), (True, True)]
TRANS_IDS = ["NN", "NT", "TN", "TT"]
OPS_M = 1000


def _stored(logical, transposed):
    """Store an operand so that op(stored) is the logical matrix."""
    return logical.t().contiguous() if transposed else logical


# Each op x transpose combination x block size x dtype on a 768 x 1024 layout with empty
# block-rows and block-cols; M = 1000.
@pytest.mark.parametrize("trans_a, trans_b", TRANS, ids=TRANS_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
@pytest.mark.parametrize("op", ["dds", "dsd", "sdd"])
def test_ops(op, block_size, dtype, trans_a, trans_b):
    layout = make_layout("empty_rows_cols", *_grid(block_size), block_size)
    rows, cols = layout.shape

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE).to(dtype)

    if op == "dds":  # op(A) @ op(S)
        values = random_values(layout, dtype, DEVICE)
        a = randn(OPS_M, cols if trans_b else rows)
        out = tilesparse.dds(_stored(a, trans_a), values, layout, trans_a=trans_a, trans_b=trans_b)
        s = dense_of(values, layout)
        expected = a.double().cpu() @ (s.t() if trans_b else s)
    elif op == "dsd":  # op(S) @ op(B)
        values = random_values(layout, dtype, DEVICE)
        b = randn(rows if trans_a else cols, OPS_M)
        out = tilesparse.dsd(values, layout, _stored(b, trans_b), trans_a=trans_a, trans_b=trans_b)
        s = dense_of(values, layout)
        expected = (s.t() if trans_a else s) @ b.double().cpu()
    else:  # op(A) @ op(B) sampled on the layout
        a, b = randn(rows, OPS_M), randn(OPS_M, cols)
        out = tilesparse.sdd(_stored(a, trans_a), _stored(b, trans_b), layout, trans_a=trans_a, trans_b=trans_b)
        expected = layout.gather(a.double().cpu() @ b.double().cpu())
    assert out.device.type == "cuda" and out.dtype == dtype
    assert_close(out, expected, dtype, op)


# --------------------------------------------------------------------------- determinism


# density 0.5: one program per sdd block; density 0.02 at M=4096: few blocks, so the sdd
# heuristic splits the M reduction over an fp32 workspace (the path most at risk).
@pytest.mark.parametrize("density", [0.5, 0.02], ids=["dense-ish", "split-sdd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_is_bitwise_deterministic(dtype, density):
    b = 32
    layout = tilesparse.layouts.random(OUT_FEATURES, IN_FEATURES, b, density, seed=1)
    x = torch.randn(4096, IN_FEATURES, device=DEVICE).to(dtype).requires_grad_()
    weight = random_values(layout, dtype, DEVICE).requires_grad_()
    bias = torch.randn(OUT_FEATURES, device=DEVICE).to(dtype).requires_grad_()
    grad_y = torch.randn(4096, OUT_FEATURES, device=DEVICE).to(dtype)

    def run():
        y = tilesparse.block_sparse_linear(x, weight, layout, bias)
        return (y, *torch.autograd.grad(y, (x, weight, bias), grad_y))

    first, second = run(), run()
    for name, u, v in zip(("y", "dx", "dweight", "dbias"), first, second):
        assert torch.equal(u, v), f"{name} differs between two identical runs"
    # and the results are right, not just repeatable
    ref = linear_reference(x, weight, layout, bias, grad_y)
    for name, got, want in zip(("y", "dx", "dweight", "dbias"), first, ref):
        assert_close(got, want, dtype, name)


# --------------------------------------------------------------------------- module and compile


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_module_matches_eager(dtype):
    torch._dynamo.reset()
    eager = nn.Sequential(
        BlockSparseLinear(IN_FEATURES, OUT_FEATURES, block_size=64, density=0.25, seed=1),
        nn.GELU(),
        BlockSparseLinear(OUT_FEATURES, IN_FEATURES, block_size=32, density=0.25, seed=2),
    ).to(DEVICE, dtype)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(4, 250, IN_FEATURES, device=DEVICE).to(dtype)
    grad = torch.randn(4, 250, IN_FEATURES, device=DEVICE).to(dtype)
    x_eager, x_comp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_eager, y_comp = eager(x_eager), compiled(x_comp)
    y_eager.backward(grad)
    y_comp.backward(grad)
    # Same kernels both ways; only inductor's fused GELU may round differently, by ulps.
    tol = 1e-5 if dtype == torch.float32 else REL_TOL[dtype]
    pairs = [("y", y_comp, y_eager), ("dx", x_comp.grad, x_eager.grad)]
    pairs += [(n, pc.grad, pe.grad) for (n, pe), (_, pc) in zip(eager.named_parameters(), compiled_model.named_parameters())]
    for name, got, want in pairs:
        assert got is not None, name
        err = rel_error(got, want)
        assert err <= tol, f"{name}: compiled vs eager relative error {err:.2e} > {tol:.0e}"
    torch._dynamo.reset()


def test_reduce_overhead_training_steps_match_eager():
    # torch.compile(mode="reduce-overhead") replays CUDA graphs: our launches (device-built
    # TMA descriptors take scratch memory from the allocator; panel and layout tables are
    # built before capture) must replay correctly across steps with fresh inputs.
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(
        BlockSparseLinear(IN_FEATURES, OUT_FEATURES, block_size=128, density=0.25, seed=1),
        nn.GELU(),
        BlockSparseLinear(OUT_FEATURES, IN_FEATURES, block_size=64, density=0.25, seed=2),
    ).to(DEVICE, torch.bfloat16)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # graphs are recorded after warm-up steps, then replayed
        x = torch.randn(512, IN_FEATURES, device=DEVICE, dtype=torch.bfloat16)
        grad = torch.randn(512, IN_FEATURES, device=DEVICE, dtype=torch.bfloat16)
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
        y_eager = eager(x)
        y_comp = compiled(x)
        y_eager.backward(grad)
        y_comp.backward(grad)
        assert rel_error(y_comp, y_eager) <= REL_TOL[torch.bfloat16], f"step {step}: y"
        for (name, pe), (_, pc) in zip(eager.named_parameters(), compiled_model.named_parameters()):
            assert rel_error(pc.grad, pe.grad) <= REL_TOL[torch.bfloat16], f"step {step}: {name}"
    torch._dynamo.reset()


def test_module_moved_to_cuda_matches_cpu():
    cpu = BlockSparseLinear(IN_FEATURES, OUT_FEATURES, block_size=32, density=0.3, dtype=torch.float64)
    gpu = copy.deepcopy(cpu).to(DEVICE, torch.float32)
    assert gpu.layout.device.type == "cuda" and gpu.layout == cpu.layout
    x = torch.randn(37, IN_FEATURES, dtype=torch.float64)
    assert_close(gpu(x.to(DEVICE, torch.float32)), cpu(x), torch.float32)


def test_module_built_on_cuda():
    m = BlockSparseLinear(IN_FEATURES, OUT_FEATURES, block_size=64, density=0.25, device=DEVICE, dtype=torch.float16)
    assert m.weight.device.type == "cuda" and m.layout_mask.device.type == "cuda"
    x = torch.randn(100, IN_FEATURES, device=DEVICE).half()
    expected = x.double().cpu() @ m.to_dense().double().cpu().t() + m.bias.double().cpu()
    assert_close(m(x), expected, torch.float16)


# --------------------------------------------------------------------------- layout on the device


def test_layout_tables_on_cuda_match_cpu():
    layout = make_layout("empty_rows_cols", *_grid(16), 16)
    cpu_meta = layout.meta_on("cpu")
    cuda_meta = layout.meta_on(DEVICE)
    assert cuda_meta.device.type == "cuda" and cuda_meta.dtype == torch.int32
    assert torch.equal(cuda_meta.cpu(), cpu_meta)
    assert layout.meta_on("cuda:0") is layout.meta_on("cuda")  # one cache entry per device
    moved = layout.to(DEVICE)
    assert moved.device.type == "cuda" and moved == layout
    assert torch.equal(moved.meta.cpu(), cpu_meta)


def test_device_mismatch_is_value_error():
    layout = make_layout("random", *_grid(32), 32)
    x = torch.randn(4, IN_FEATURES, device=DEVICE)
    weight = random_values(layout, torch.float32)  # on the CPU
    with pytest.raises(ValueError, match=r"weight is on cpu but x is on cuda"):
        tilesparse.block_sparse_linear(x, weight, layout)
    with pytest.raises(ValueError, match=r"weight is on cuda:0 but x is on cpu"):
        tilesparse.block_sparse_linear(x.cpu(), weight.to(DEVICE), layout)


# --------------------------------------------------------------------------- launcher configs


def _need_hopper():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA kernels need sm90+")


# The Hopper TMA kernels, driven through the launchers by config. M=1000 leaves a
# partial last tile (TMA zero-fills and clips it).
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 64, 128], ids=lambda b: f"b{b}")
def test_dds_tma(block_size, dtype, trans):
    _need_hopper()
    layout = make_layout("empty_rows_cols", *_grid(block_size), block_size)
    rows, cols = layout.shape
    a = torch.randn(1000, cols if trans else rows, device=DEVICE).to(dtype)
    values = random_values(layout, dtype, DEVICE)
    bias = torch.randn(rows if trans else cols, device=DEVICE).to(dtype)
    cfg = dataclasses.replace(kernels.dds_config(1000, block_size, dtype), tma=True)
    assert kernels._use_tma(cfg, block_size, a, values), "operands should be TMA-eligible"
    meta = layout.meta_on(DEVICE)
    out = kernels.dds(a, values, meta, bias, layout.block_rows, layout.block_cols, trans, config=cfg)
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s) + bias.double().cpu()
    assert_close(out, expected, dtype, "dds tma")


@pytest.mark.parametrize("variant", ["host", "devdesc"])
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 64, 128], ids=lambda b: f"b{b}")
def test_sdd_tma(block_size, dtype, splits, variant):
    _need_hopper()
    layout = make_layout("empty_rows_cols", *_grid(block_size), block_size)
    rows, cols = layout.shape
    g = torch.randn(1000, rows, device=DEVICE).to(dtype)  # as in the backward: A = dY^T
    b = torch.randn(1000, cols, device=DEVICE).to(dtype)
    a = g.t()
    cfg = dataclasses.replace(
        kernels.sdd_config(1000, block_size, layout.nnz, dtype, a.device), tma=True, splits=splits,
        device_desc=variant != "host",
    )
    assert kernels._use_tma(cfg, block_size, a.t(), b), "operands should be TMA-eligible"
    meta = layout.meta_on(DEVICE)
    out = kernels.sdd(a, b, meta, block_size, layout.block_rows, layout.block_cols, config=cfg)
    assert_close(out, layout.gather(a.double().cpu() @ b.double().cpu()), dtype, "sdd tma")


# Explicit split counts on the pointer kernel (the default picks them from the SM count).
@pytest.mark.parametrize("splits", [2, 7, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sdd_split_configs(dtype, splits):
    layout = make_layout("random", *_grid(32), 32)
    rows, cols = layout.shape
    a = torch.randn(rows, 4096, device=DEVICE).to(dtype)
    b = torch.randn(4096, cols, device=DEVICE).to(dtype)
    cfg = dataclasses.replace(kernels.sdd_config(4096, 32, layout.nnz, dtype, a.device), splits=splits)
    out = kernels.sdd(a, b, layout.meta_on(DEVICE), 32, layout.block_rows, layout.block_cols, config=cfg)
    assert_close(out, layout.gather(a.double().cpu() @ b.double().cpu()), dtype, "sdd split")


# --------------------------------------------------------------------------- large index


@pytest.mark.slow
def test_large_index_rows():
    """x has more than 2**31 elements: row offsets must be computed in int64. Only the
    first and last 64 rows of x are nonzero, so the float64 references stay cheap."""
    b, dtype, in_features = 64, torch.float16, 1024
    m = 2**21 + 37  # m * in_features > 2**31
    layout = tilesparse.layouts.random(256, in_features, b, 0.25, seed=3)
    weight = random_values(layout, dtype, DEVICE).requires_grad_()
    bias = torch.randn(256, device=DEVICE).to(dtype).requires_grad_()
    x = torch.zeros(m, in_features, device=DEVICE, dtype=dtype)
    assert x.numel() > 2**31
    x[:64] = torch.randn(64, in_features, device=DEVICE).to(dtype)
    x[-64:] = torch.randn(64, in_features, device=DEVICE).to(dtype)
    x.requires_grad_()
    grad_y = torch.zeros(m, 256, device=DEVICE, dtype=dtype)
    grad_y[:64] = torch.randn(64, 256, device=DEVICE).to(dtype)
    grad_y[-64:] = torch.randn(64, 256, device=DEVICE).to(dtype)

    y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    dx, dw = torch.autograd.grad(y, (x, weight), grad_y)

    w = dense_of(weight, layout)
    edges = torch.cat([torch.arange(64), torch.arange(m - 64, m)]).to(DEVICE)
    xe, ge = x.detach()[edges].double().cpu(), grad_y[edges].double().cpu()
    assert_close(y[edges], xe @ w.t() + bias.detach().double().cpu(), dtype, "y edge rows")
    assert_close(dx[edges], ge @ w, dtype, "dx edge rows")
    assert_close(dw, layout.gather(ge.t() @ xe), dtype, "dweight")
    # a row in the zero middle is bias only
    assert torch.equal(y[m // 2], bias.detach())


# --------------------------------------------------------------------------- regressions


def test_non_contiguous_bias():
    # Regression: a strided bias was once read with unit stride by the kernel.
    layout, x, weight, _ = _linear_inputs(32, torch.float32, "random", "contiguous", 37)
    bias = torch.randn(2 * OUT_FEATURES, device=DEVICE)[::2]
    assert not bias.is_contiguous()
    y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    ref_y, *_ = linear_reference(x, weight, layout, bias, torch.zeros_like(y))
    assert_close(y, ref_y, torch.float32, "y with strided bias")


# Regression: block sizes that are not powers of two (accepted by BlockLayout) once
# failed to compile; they run on the next power-of-two tile, masked. 12 < 16; 24 and 48
# between powers of two. Features 768 divide by all three.
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [12, 24, 48], ids=lambda b: f"b{b}")
def test_non_power_of_two_block_sizes(block_size, dtype):
    features = 768
    layout = make_layout("empty_rows_cols", features // block_size, features // block_size, block_size)
    x = make_input("contiguous", 1000, features, dtype, DEVICE)
    weight = random_values(layout, dtype, DEVICE).requires_grad_()
    bias = torch.randn(features, device=DEVICE).to(dtype).requires_grad_()
    y = tilesparse.block_sparse_linear(x, weight, layout, bias)
    grad_y = torch.randn(y.shape, device=DEVICE).to(dtype)
    dx, dw, db = torch.autograd.grad(y, (x, weight, bias), grad_y)
    ref = linear_reference(x, weight, layout, bias, grad_y)
    for name, got, want in zip(("y", "dx", "dweight", "dbias"), (y, dx, dw, db), ref):
        assert_close(got, want, dtype, name)


def test_block_layout_from_cuda_mask():
    mask = torch.rand(_grid(16), device=DEVICE) < 0.3
    layout = BlockLayout(mask, 16)
    assert layout.device.type == "cuda"
    x = torch.randn(37, IN_FEATURES, device=DEVICE)
    weight = random_values(layout, torch.float32, DEVICE)
    y = tilesparse.block_sparse_linear(x, weight, layout)
    assert_close(y, x.double().cpu() @ dense_of(weight, layout).t(), torch.float32)
