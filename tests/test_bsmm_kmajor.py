"""The small kernel on K-major activations (``tilesparse.kernels.bsmm_kmajor``): where the dispatcher
transposes, that it leaves K-major inputs and a caller's config alone, and (GPU) that the products
match a float64 reference and the row-major dispatch, bitwise reproducibly."""

import pytest
import torch

from bsmm_cases import dense_of, make_layout, random_values
from tilesparse import layouts
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_kmajor, bsmm_small
from tolerances import assert_close

CUDA = torch.cuda.is_available()


def test_is_kmajor_and_as_kmajor_on_the_cpu():
    a = torch.randn(32, 48)
    assert not bsmm_kmajor.is_kmajor(a)
    km = bsmm_kmajor.as_kmajor(a)
    assert bsmm_kmajor.is_kmajor(km) and torch.equal(km, a) and km.stride() == (1, 32)
    assert bsmm_kmajor.as_kmajor(km) is km  # no second copy
    assert not bsmm_kmajor.is_kmajor(torch.randn(1, 48))  # one row: both strides say nothing
    assert not bsmm_kmajor.is_kmajor(torch.randn(48, 64).t()[:32])  # unit stride, but gaps along K


@pytest.mark.parametrize("op, block_size, m, density, expected", [
    ("fprop", 16, 64, 0.1, True), ("fprop", 16, 64, 0.03, True), ("fprop", 16, 64, 0.01, False),
    ("fprop", 16, 48, 0.1, True),
    ("fprop", 16, 48, 0.25, False), ("fprop", 16, 32, 0.03, False), ("fprop", 16, 16, 0.1, True),
    ("fprop", 16, 64, 0.5, False), ("fprop", 16, 8, 0.1, False), ("fprop", 16, 40, 0.1, False),
    ("fprop", 16, 128, 0.1, False), ("bprop", 16, 16, 0.25, True), ("bprop", 16, 16, 0.1, False),
    ("bprop", 16, 32, 0.25, True), ("bprop", 16, 64, 0.25, True), ("bprop", 16, 64, 0.5, False),
    ("fprop", 16, 16, 0.5, True), ("fprop", 16, 32, 0.5, False), ("fprop", 32, 64, 0.5, True), ("fprop", 32, 64, 0.25, False),
    ("fprop", 32, 32, 0.5, False), ("fprop", 64, 64, 0.25, False), ("fprop", 128, 64, 0.1, False),
])
def test_kmajor_wins_reads_the_measured_table(op, block_size, m, density, expected):
    assert bsmm_kmajor.kmajor_wins(op, block_size, m, density) is expected


@pytest.mark.parametrize("m, block_size", [(16, 16), (64, 16), (64, 32)])
@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
def test_interpreter_kmajor_path_runs_the_heuristics_config_not_the_tables(monkeypatch, m, block_size):
    # the table's entries were tuned on row-major activations: where K-major pays (forced here; on the CPU it
    # never does), dds runs the heuristic's config (2 warps unswapped) on the K-major copy, whatever the table says
    table_entry = bsmm_small.SmallConfig(16, 16, 16, 4, 2)
    monkeypatch.setattr(kernels.tuned, "lookup", lambda *args, **kw: table_entry)
    monkeypatch.setattr(bsmm_kmajor, "kmajor_pays", lambda *args: True)
    ran = []
    launch = bsmm_small.launch_dds_small
    monkeypatch.setattr(bsmm_small, "launch_dds_small",
                        lambda a_in, *rest: ran.append((bsmm_kmajor.is_kmajor(a_in), rest[-1])) or launch(a_in, *rest))
    layout = _random_layout(6, 5, block_size, 0.5, seed=m)
    rows, cols = layout.shape
    a = torch.randn(m, cols, dtype=torch.float16)
    values = random_values(layout, torch.float16)
    out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True)
    expected = bsmm_kmajor.kmajor_config(m, block_size, torch.float16, 1 << 30)
    assert ran == [(True, expected)] and expected != table_entry
    assert expected == bsmm_small.small_config(m, block_size, torch.float16, 1 << 30)
    assert expected.num_warps == (4 if expected.swap else 2)
    assert_close(out, a.double() @ dense_of(values, layout).t(), torch.float16, "dds K-major")


BIG = bsmm_kmajor.MEASURED_WEIGHT_ELEMENTS


def test_kmajor_pays_only_for_16_bit_cuda_activations_and_copies_only_for_large_weights():
    # (the table says yes for each; the activations' device and dtype, or the copy's cost, say no)
    assert not bsmm_kmajor.kmajor_pays("fprop", torch.randn(64, 256).bfloat16(), 16, 0.1, BIG)  # CPU
    if CUDA:
        a = torch.randn(64, 256, device="cuda").bfloat16()
        assert bsmm_kmajor.kmajor_pays("fprop", a, 16, 0.1, BIG)
        assert not bsmm_kmajor.kmajor_pays("fprop", a.float(), 16, 0.1, BIG)  # fp32
        assert not bsmm_kmajor.kmajor_pays("fprop", a, 16, 0.1, BIG - 1)  # the copy would cost more than it gains
        assert bsmm_kmajor.kmajor_pays("fprop", bsmm_kmajor.as_kmajor(a), 16, 0.1, 1024)  # no copy: any size


@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("m", [16, 32, 48])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")
def test_interpreter_small_kernel_on_kmajor_activations(trans, m, dtype):
    # the small kernel reads A through its strides: K-major (unit stride along M, M a multiple of 16,
    # the vector loads the dispatcher's K-major path relies on) gives the row-major product
    layout = make_layout("empty_rows_cols", 3, 5, 16)
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows).to(dtype)
    values = random_values(layout, dtype)
    config = bsmm_small.small_config(m, 16, dtype)
    out = kernels.dds(bsmm_kmajor.as_kmajor(a), values, layout.meta, None, layout.block_rows,
                      layout.block_cols, trans, config=config)
    s = dense_of(values, layout)
    assert_close(out, a.double() @ (s.t() if trans else s), dtype, "dds on K-major activations")


def _random_layout(block_rows, block_cols, block_size, density, seed):
    return layouts.random(block_rows * block_size, block_cols * block_size, block_size, density, seed=seed)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block_size, m, density", [(16, 64, 0.1), (16, 32, 0.25), (16, 48, 0.1), (32, 64, 0.5),
                                                    (16, 16, 0.25)])
def test_gpu_dispatcher_runs_kmajor_where_it_pays(monkeypatch, trans, dtype, block_size, m, density):
    monkeypatch.setenv("TILESPARSE_TUNED", "off")  # the heuristic's choice below, whatever the user's table
    monkeypatch.setattr(bsmm_kmajor, "MEASURED_WEIGHT_ELEMENTS", 0)  # a test-sized weight takes the copy
    layout = _random_layout(48, 40, block_size, density, seed=m)
    op = "fprop" if trans else "bprop"
    pays = bsmm_kmajor.kmajor_wins(op, block_size, m, layout.nnz / (48 * 40))
    meta = layout.meta_on("cuda")
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows, device="cuda").to(dtype)
    values = random_values(layout, dtype, "cuda")
    bias = torch.randn(rows if trans else cols, device="cuda").to(dtype)
    seen = []
    launch = bsmm_small.launch_dds_small
    monkeypatch.setattr(bsmm_small, "launch_dds_small",
                        lambda a_in, *rest: seen.append(bsmm_kmajor.is_kmajor(a_in)) or launch(a_in, *rest))
    out = kernels.dds(a, values, meta, bias, 48, 40, trans)
    assert (seen[-1:] == [True]) == pays  # K-major into the small kernel exactly where the table says
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s) + bias.double().cpu()
    assert_close(out, expected, dtype, f"dds {op} K-major")
    for _ in range(2):  # bitwise reproducible, and the same from activations already K-major
        assert torch.equal(kernels.dds(a, values, meta, bias, 48, 40, trans), out)
    assert torch.equal(kernels.dds(bsmm_kmajor.as_kmajor(a), values, meta, bias, 48, 40, trans), out)
    monkeypatch.setattr(kernels, "KMAJOR_SMALL", False)  # the row-major dispatch: the same product
    assert_close(kernels.dds(a, values, meta, bias, 48, 40, trans), expected, dtype, f"dds {op} row-major")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_kmajor_leaves_a_callers_config_other_rows_and_small_weights_alone(monkeypatch):
    monkeypatch.setenv("TILESPARSE_TUNED", "off")
    layout = _random_layout(48, 40, 16, 0.1, seed=3)
    meta = layout.meta_on("cuda")
    values = random_values(layout, torch.bfloat16, "cuda")
    copies = []
    as_kmajor = bsmm_kmajor.as_kmajor
    monkeypatch.setattr(bsmm_kmajor, "as_kmajor", lambda a: copies.append(a.shape) or as_kmajor(a))
    a64 = torch.randn(64, 640, device="cuda", dtype=torch.bfloat16)
    kernels.dds(a64, values, meta, None, 48, 40, True, config=bsmm_small.small_config(64, 16, torch.bfloat16))
    kernels.dds(torch.randn(8, 640, device="cuda", dtype=torch.bfloat16), values, meta, None, 48, 40, True)
    kernels.dds(a64, values, meta, None, 48, 40, True)
    assert copies == []  # a caller's config; 8 rows; a weight smaller than the one measured
    monkeypatch.setattr(bsmm_kmajor, "MEASURED_WEIGHT_ELEMENTS", 768 * 640)
    kernels.dds(a64, values, meta, None, 48, 40, True)
    assert copies == [(64, 640)]


@pytest.mark.parametrize("value, expected", [("off", False), (None, True)])
def test_tilesparse_kmajor_environment_sets_the_switch_at_import(value, expected):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TILESPARSE_KMAJOR"}
    if value is not None:
        env["TILESPARSE_KMAJOR"] = value
    code = "import tilesparse.kernels.bsmm as b; print(b.KMAJOR_SMALL)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


def test_a_tilesparse_kmajor_value_it_does_not_know_is_an_error_naming_it():
    import os
    import subprocess
    import sys
    env = dict(os.environ, TILESPARSE_KMAJOR="maybe")
    out = subprocess.run([sys.executable, "-c", "import tilesparse.kernels.bsmm"], env=env, capture_output=True,
                         text=True)
    assert out.returncode != 0 and "TILESPARSE_KMAJOR must be" in out.stderr and "'maybe'" in out.stderr
