"""kernels.bsmm.DdsPlan (one weight's product over many activations of one shape, dispatched once)
and the PreparedLaunch it and the LSTM cell launch through: every call against the float64 dense
product, on fresh activations each time; workspaces (splits, chunks) kept between calls; other
shapes or strides going back to dds; and on the GPU the same bits as dds, with the later calls
skipping Triton's launch."""

import dataclasses

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, count_triton_runs, dense_of, random_values
from tilesparse import BlockLayout, layouts
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_gemv, bsmm_panel, bsmm_small, tuned
from tilesparse.kernels._launch import launch
from tolerances import assert_close

F64 = torch.float64


def _expected(a, values, layout, trans):
    dense = dense_of(values, layout)
    return a.double().cpu() @ (dense.t() if trans else dense)


def _layout(block_size=16, seed=0):
    mask = torch.rand(6, 5, generator=torch.Generator().manual_seed(seed)) < 0.5
    mask[0, 0] = True
    return BlockLayout(mask, block_size)


# the dispatcher's kernel for the plan, as a tuned entry would name it (the FMA and panel kernels)
TABLE_CONFIGS = {
    "gemv": bsmm_gemv.GemvConfig(8, 32),
    "gemv-bias": bsmm_gemv.GemvConfig(8, 32),
    "panel": bsmm_panel.PanelConfig(2, block_m=16),
    "panel-splits-bias": bsmm_panel.PanelConfig(2, block_m=16, splits=3),  # partials summed after the kernel
    "panel-fused": bsmm_panel.PanelConfig(4, block_m=16, splits=2, entries=2, swap=True, fused_sum=True),
    "panel-fused-bias": bsmm_panel.PanelConfig(4, block_m=16, splits=2, entries=2, swap=True, fused_sum=True),
}


@pytest.mark.parametrize("mark", [pytest.param(None, marks=INTERPRETER_MARKS)], ids=[""])
@pytest.mark.parametrize("trans", [True, False], ids=["fprop", "bprop"])
@pytest.mark.parametrize("setting", ["default", "bias", "splits", "chunks", *TABLE_CONFIGS])
def test_plan_matches_float64_on_every_call(monkeypatch, trans, setting, mark):
    layout = _layout()
    values = random_values(layout, torch.float32)
    width_in = layout.shape[1] if trans else layout.shape[0]
    if setting in ("splits", "chunks"):  # the small kernel's workspaces, made once and kept between calls
        real = bsmm_small.small_config
        extra = {"splits": 2} if setting == "splits" else {"chunks": 2}
        monkeypatch.setattr(bsmm_small, "small_config",
                            lambda *args, **kw: dataclasses.replace(real(*args, **kw), **extra))
    kernel = {"gemv": bsmm_gemv, "panel": bsmm_panel}.get(setting.split("-")[0], bsmm_small)
    if setting in TABLE_CONFIGS:
        monkeypatch.setattr(tuned, "lookup", lambda *args: TABLE_CONFIGS[setting])
    launched = []
    monkeypatch.setattr(kernel, "launch", lambda fn, *args, **kw: launched.append(fn) or launch(fn, *args, **kw))
    width_out = layout.shape[0] if trans else layout.shape[1]
    bias = torch.randn(width_out) if "bias" in setting else None
    plan = kernels.DdsPlan(values, layout.meta, bias, layout.block_rows, layout.block_cols, trans)
    out = torch.full((5, plan.width), float("nan"))
    for step in range(3):
        a = torch.randn(5, width_in)
        got = plan(a, out if step == 2 else None)
        assert plan.run is not None  # the small kernel, remembered from the first call
        expected = _expected(a, values, layout, trans) + (0 if bias is None else bias.double())
        assert_close(got, expected, torch.float32, f"step {step}")
    assert got is out
    assert len(launched) == 3 and launched[0].fn.__module__ == kernel.__name__  # the kernel chosen, every call


@pytest.mark.parametrize("mark", [pytest.param(None, marks=INTERPRETER_MARKS)], ids=[""])
def test_other_strides_or_shapes_go_back_to_dds(monkeypatch, mark):
    layout = _layout()
    values = random_values(layout, torch.float32)
    plan = kernels.DdsPlan(values, layout.meta, None, layout.block_rows, layout.block_cols, True)
    calls = []
    real = kernels._dds
    monkeypatch.setattr(kernels, "_dds", lambda *args: calls.append(args[0].shape) or real(*args))
    a = torch.randn(4, layout.shape[1])
    for x in (a, torch.randn(layout.shape[1], 4).t(), torch.randn(7, layout.shape[1]), a[:3]):
        assert_close(plan(x), _expected(x, values, layout, True), torch.float32, f"{tuple(x.shape)}")
    assert len(calls) == 4  # the first call, then each new stride / shape
    plan(torch.randn(4, layout.shape[1]))
    assert len(calls) == 4  # the first one's shape again: the remembered launch
    for x in (torch.randn(layout.shape[1], 4).t(), torch.randn(7, layout.shape[1]), torch.randn(3, layout.shape[1])):
        assert_close(plan(x), _expected(x, values, layout, True), torch.float32, f"again {tuple(x.shape)}")
    assert len(calls) == 4  # each of the four remembered (an LSTM's h0, then the cell's h^T)
    for _ in range(2):
        x = torch.randn(9, layout.shape[1])
        assert_close(plan(x), _expected(x, values, layout, True), torch.float32, "a fifth")
    assert len(calls) == 6  # past MAX_SIGNATURES: dispatched each call


def test_out_must_be_a_contiguous_buffer_of_the_products_shape():
    layout = _layout()
    values = random_values(layout, torch.float32)
    plan = kernels.DdsPlan(values, layout.meta, None, layout.block_rows, layout.block_cols, True)
    a = torch.randn(4, layout.shape[1])
    for out, why in ((torch.empty(4, plan.width + 1), "shape"), (torch.empty(plan.width, 4).t(), "strides"),
                     (torch.empty(4, plan.width, dtype=F64), "dtype")):
        with pytest.raises(ValueError, match="out must be a contiguous"):
            plan(a, out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("block_size, batch", [(16, 32), (32, 8), (64, 1)])
def test_gpu_plan_is_bitwise_dds_and_skips_tritons_launch(monkeypatch, dtype, block_size, batch):
    layout = layouts.random(1024, 512, block_size, 0.25, seed=1, device="cuda")
    values = random_values(layout, dtype, device="cuda")
    for trans, width_in in ((True, 512), (False, 1024)):
        plan = kernels.DdsPlan(values, layout.meta, None, layout.block_rows, layout.block_cols, trans)
        inputs = [torch.randn(batch, width_in, device="cuda", dtype=dtype) for _ in range(4)]
        plan(inputs[0])  # compiles and remembers
        plan(inputs[1])
        seen = count_triton_runs(monkeypatch)
        for a in inputs:
            expected = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans)
            seen.clear()
            got = plan(a)
            if plan.run is not None:
                assert seen == [], seen  # launched through the remembered compiled kernel
            assert torch.equal(got, expected)
        monkeypatch.undo()
    if batch == 32 and dtype != torch.float32:  # K-major activations (the LSTM cell's h^T), where they pay
        plan = kernels.DdsPlan(values, layout.meta, None, layout.block_rows, layout.block_cols, True)
        for _ in range(3):
            a = torch.randn(512, batch, device="cuda", dtype=dtype).t()
            expected = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True)
            assert torch.equal(plan(a), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("setting", list(TABLE_CONFIGS))
def test_gpu_plan_of_the_fma_and_panel_kernels_is_bitwise_dds(monkeypatch, setting, dtype):
    # the FMA (1-8 rows) and panel kernels as a tuned entry names them: the plan's later calls skip
    # Triton's launch and give dds's bits (the panel's partials and fused-sum workspaces reused)
    layout = layouts.random(1024, 512, 16, 0.5, seed=2, device="cuda")
    values = random_values(layout, dtype, device="cuda")
    cfg = TABLE_CONFIGS[setting]
    batch = 8 if setting.startswith("gemv") else 24
    for trans, width_in, width_out in ((True, 512, 1024), (False, 1024, 512)):
        bias = torch.randn(width_out, device="cuda", dtype=dtype) if "bias" in setting else None
        monkeypatch.setattr(tuned, "lookup", lambda *args: cfg)
        kernel = bsmm_gemv if setting.startswith("gemv") else bsmm_panel
        launched = []
        monkeypatch.setattr(kernel, "launch", lambda fn, *args, **kw: launched.append(fn) or launch(fn, *args, **kw))
        plan = kernels.DdsPlan(values, layout.meta, bias, layout.block_rows, layout.block_cols, trans)
        inputs = [torch.randn(batch, width_in, device="cuda", dtype=dtype) for _ in range(4)]
        plan(inputs[0])
        plan(inputs[1])
        assert plan.run is not None and launched[0].fn.__module__ == kernel.__name__  # the table's kernel
        assert [kmajor for _, kmajor in plan.runs.values()] == [False]
        seen = count_triton_runs(monkeypatch)
        for a in inputs:
            expected = kernels.dds(a, values, layout.meta, bias, layout.block_rows, layout.block_cols, trans,
                                   config=cfg)
            out = torch.full_like(expected, float("nan"))
            seen.clear()
            assert plan(a, out) is out
            assert seen == [], seen
            assert torch.equal(out, expected)
        monkeypatch.undo()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_cell_steps_match_the_checked_launcher_when_alignment_changes():
    # The cell's remembered launches against lstm_cell_forward_triton, bitwise, on operands 16-byte
    # aligned, then 2 bytes off (another specialization: the prepared launch must not reuse its kernel)
    from tilesparse.kernels import lstm_cell

    batch, hidden = 5, 48
    steps = lstm_cell.CellSteps()
    flat = torch.randn(3, batch * 4 * hidden + 1, device="cuda", dtype=torch.bfloat16)
    for offset in (0, 0, 1, 1, 0):
        gates, gates_add, c_prev = (flat[i, offset:offset + batch * 4 * hidden].view(batch, 4 * hidden)
                                    for i in range(3))
        c_prev = c_prev[:, :hidden]
        outs = [torch.full((batch, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                for n in (hidden, hidden, 4 * hidden)]
        steps.forward(gates, c_prev, gates_add, *outs, None)
        expected = lstm_cell.lstm_cell_forward_triton(gates, c_prev, gates_add=gates_add)
        for got, want in zip(outs, expected):
            assert torch.equal(got, want), offset
