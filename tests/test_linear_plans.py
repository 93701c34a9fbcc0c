"""tilesparse.ops.linear_plans: a block-sparse linear layer's forwards without autograd, dispatched
once per activation shape. On the CPU (the interpreter's kernels standing in for CUDA), every call
against the float64 dense product on fresh inputs; one dispatch per key; in-place weight updates
seen; a new layout, weight or setting re-planned; autograd, autocast and the switch unplanned; bad
input still refused with the argument named; copies start empty. On the GPU, the same bits as
``block_sparse_linear`` and the later calls without Triton's launch path."""

import copy
import pickle

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, count_triton_runs
from tilesparse import layouts
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import tuned
from tilesparse.nn import BlockSparseLinear, TransposedBlockSparseLinear
from tilesparse.ops import block_sparse_linear, dense_dispatch, linear_plans
from tolerances import assert_close

F64 = torch.float64


def cpu(test):
    """A test of the plans on the interpreter's CPU tensors."""
    for mark in INTERPRETER_MARKS:
        test = mark(test)
    return test


@pytest.fixture
def on_cpu(monkeypatch):
    """Plans on the interpreter's CPU tensors; the dispatches counted (the activations' row counts)."""
    monkeypatch.setattr(linear_plans, "_on_device", lambda x: True)
    dispatches = []
    real = kernels._dds
    monkeypatch.setattr(kernels, "_dds", lambda *args, **kw: dispatches.append(args[0].shape[0]) or real(*args, **kw))
    return dispatches


def _module(cls=BlockSparseLinear, in_features=64, out_features=96, block=16, density=0.5, bias=True, seed=0):
    torch.manual_seed(seed)
    module = BlockSparseLinear(in_features, out_features, block_size=block, density=density, bias=bias, seed=seed)
    return module if cls is BlockSparseLinear else cls.from_module(module)


def _expected(module, x):
    y = x.double() @ module.to_dense().double().t()
    return y if module.bias is None else y + module.bias.double()


@cpu
@pytest.mark.parametrize("cls, dtype", [(BlockSparseLinear, torch.float32), (BlockSparseLinear, torch.float16),
                                        (TransposedBlockSparseLinear, torch.float16),
                                        (TransposedBlockSparseLinear, torch.float32)],
                         ids=["rows-fp32", "rows-fp16", "transposed-fp16", "transposed-fp32"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_no_grad_calls_dispatch_once_per_shape_and_match_float64(on_cpu, cls, dtype, bias):
    module = _module(cls, bias=bias).to(dtype)
    planned = not (cls is TransposedBlockSparseLinear and dtype == torch.float32)  # (TF32 copies Wᵀ's blocks)
    with torch.no_grad():
        for call in range(3):
            for shape in ((5, 64), (2, 3, 64)):  # 3-D input: its own key, reshaped around the plan
                x = torch.randn(shape, dtype=dtype)
                y = module(x)
                assert y.shape == (*shape[:-1], 96) and y.dtype == dtype
                assert_close(y, _expected(module, x), dtype, f"call {call} {shape}")
    assert on_cpu == ([5, 6] if planned else [])  # planned: the first call of each shape (else the CPU reference)
    assert len(module._plans) == 2 * planned


@cpu
def test_in_place_weight_updates_are_seen(on_cpu):
    module = _module()
    with torch.no_grad():
        for step in range(3):
            module.weight.mul_(0.5).add_(0.1)
            module.bias.add_(1.0)
            x = torch.randn(4, 64)
            assert_close(module(x), _expected(module, x), torch.float32, f"step {step}")
    assert on_cpu == [4]


@cpu
def test_a_new_layout_weight_or_device_move_drops_the_plans(on_cpu):
    module = _module()
    x = torch.randn(4, 64)
    with torch.no_grad():
        module(x)
        other = layouts.random(96, 64, 16, 0.25, seed=5)
        module.set_layout(other, torch.randn(other.nnz, 16, 16))  # another nnz: a new weight tensor too
        assert len(module._plans) == 0
        assert_close(module(x), _expected(module, x), torch.float32, "after set_layout")
        module.weight.data = module.weight.data.clone()  # the same Parameter, another address
        assert_close(module(x), _expected(module, x), torch.float32, "after .data =")
        assert len(module._plans) == 1
        module.to(torch.float32)  # _apply: the plans held the tensors before it
        assert len(module._plans) == 0
    assert on_cpu == [4, 4, 4]


@cpu
def test_settings_the_dispatch_read_make_a_new_plan(on_cpu, monkeypatch):
    module = _module()
    x = torch.randn(3, 64)
    with torch.no_grad():
        module(x)
        module(x)
        tuned.reload()  # the tables read again
        module(x)
        with dense_dispatch.kernels_only():  # dense dispatch off here
            module(x)
        monkeypatch.setattr(kernels, "KMAJOR_SMALL", not kernels.KMAJOR_SMALL)
        module(x)
        precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        try:
            module(x)
        finally:
            torch.set_float32_matmul_precision(precision)
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(not deterministic)
        try:
            module(x)
        finally:
            torch.use_deterministic_algorithms(deterministic)
        assert_close(module(x), _expected(module, x), torch.float32, "last")
    assert on_cpu == [3] * 6


@cpu
def test_where_dense_dispatch_decides_dense_the_plan_runs_dense(on_cpu, monkeypatch):
    module = _module()
    decisions, dense_calls = [], []
    monkeypatch.setattr(dense_dispatch, "run_dense", lambda *args: decisions.append(1) or True)
    real = dense_dispatch.dense_linear
    monkeypatch.setattr(dense_dispatch, "dense_linear", lambda *args: dense_calls.append(1) or real(*args))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(7, 64)
            assert_close(module(x), _expected(module, x), torch.float32, "dense")
    assert (len(decisions), len(dense_calls), on_cpu) == (1, 3, [])


@cpu
def test_autograd_autocast_and_the_switch_are_not_planned(on_cpu, monkeypatch):
    module = _module()
    x = torch.randn(4, 64, requires_grad=True)
    y = module(x)  # recorded for autograd: the checked path each call
    y.sum().backward()
    assert x.grad is not None and len(module._plans) == 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        module(x)
    assert len(module._plans) == 0
    monkeypatch.setattr(linear_plans, "PLANS", False)
    with torch.no_grad():
        module(x)
    assert len(module._plans) == 0


@cpu
def test_bad_input_still_names_the_argument(on_cpu):
    module = _module()
    with torch.no_grad():
        module(torch.randn(4, 64))
        with pytest.raises(ValueError, match="x.shape\\[-1\\]"):
            module(torch.randn(4, 63))
        with pytest.raises((TypeError, ValueError), match="weight"):
            module(torch.randn(4, 64, dtype=F64))  # a new key: checked, the dtype mismatch named


@cpu
def test_a_weight_changed_in_shape_or_dtype_at_its_address_is_checked_again(on_cpu):
    module = _module()
    x = torch.randn(4, 64)
    with torch.no_grad():
        module(x)
        module.weight.data = module.weight.data[:-1]  # the same address, one block fewer
        with pytest.raises(ValueError, match="weight"):
            module(x)
        module.weight.data = torch.randn(module.layout.nnz, 16, 16)
        module.weight.data = module.weight.data.to(torch.float16)
        with pytest.raises((TypeError, ValueError), match="weight"):
            module(x)


@cpu
def test_plans_hold_no_activations_outputs_or_replaced_weights(on_cpu):
    import gc
    import weakref

    module = _module()
    refs = []
    with torch.no_grad():
        for rows in (4, 4, 4, 2, 4):
            x = torch.randn(rows, 64)
            y = module(x)
            refs += [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert all(ref() is None for ref in refs)  # the first call's, the last call's and those between
    old = weakref.ref(module.weight)
    module.weight = torch.nn.Parameter(torch.randn_like(module.weight))
    module(torch.randn(4, 64, requires_grad=True))  # autograd: unplanned, yet the plans of the old weight go
    gc.collect()
    assert old() is None and len(module._plans) == 0


@cpu
def test_at_most_max_plans_least_recently_used_out(on_cpu, monkeypatch):
    monkeypatch.setattr(linear_plans.LinearPlans, "MAX_PLANS", 2)
    module = _module()
    with torch.no_grad():
        for rows in (1, 2, 1, 3, 1, 2):
            module(torch.randn(rows, 64))
    assert on_cpu == [1, 2, 3, 2]  # 2 was the least recently used when 3 came
    assert len(module._plans) == 2


@cpu
def test_copies_of_a_module_start_without_plans(on_cpu):
    module = _module()
    x = torch.randn(4, 64)
    with torch.no_grad():
        module(x)
        for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert len(twin._plans) == 0 and twin._plans is not module._plans
            twin.weight.mul_(2)  # its own weight, not the original's
            assert_close(twin(x), _expected(twin, x), torch.float32, "copy")
            assert_close(module(x), _expected(module, x), torch.float32, "original")


@cpu
def test_the_functional_call_is_unchanged(on_cpu):
    module = _module()
    x = torch.randn(4, 64)
    with torch.no_grad():
        y = block_sparse_linear(x, module.weight, module.layout, module.bias)
    assert_close(y, _expected(module, x), torch.float32, "functional")
    assert len(module._plans) == 0


@cpu
def test_one_weight_read_in_both_storage_orders_gets_a_plan_for_each(on_cpu):
    """LinearPlans called directly with one square weight as W and as Wᵀ (review, 2026-12-04: the storage
    order was missing from the key, and the second call was served the first one's plan)."""
    torch.manual_seed(0)
    layout = layouts.random(64, 64, 16, 0.5, seed=1)
    weight = (torch.randn(layout.nnz, 16, 16) / 8).half()  # (fp16: fp32 with Wᵀ's storage is not planned)
    plans = linear_plans.LinearPlans()
    x = torch.randn(3, 64).half()
    with torch.no_grad():
        for transposed in (False, True, False, True):
            expected = block_sparse_linear(x, weight, layout, transposed_storage=transposed)
            assert_close(plans(x, weight, layout, transposed_storage=transposed), expected, torch.float16,
                         f"transposed_storage={transposed}")
    assert len(plans) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cls", [BlockSparseLinear, TransposedBlockSparseLinear], ids=["rows", "transposed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("block, rows", [(16, 1), (32, 16), (64, 48), (128, 300)])
def test_gpu_plans_are_bitwise_the_checked_call(monkeypatch, cls, dtype, block, rows):
    # the kernels (not dense dispatch): at <= 64 rows a few-row kernel relaunched without Triton's launch
    # path, at 300 rows a kernel dispatched each call; aligned and misaligned activations of one key (the
    # prepared launch's specialization check), every call against the checked call's bits
    module = _module(cls, 1024, 2048, block, 0.25, seed=1).to("cuda", dtype)
    base = torch.randn(6, rows, 1032, device="cuda", dtype=dtype)
    inputs = [base[i, :, :1024] for i in range(4)] + [base[4, :, 1:1025], base[5, :, :1024], base[5, :, 3:1027]]
    planned = cls is BlockSparseLinear or dtype != torch.float32
    with torch.no_grad(), dense_dispatch.kernels_only():
        module(inputs[0])
        assert len(module._plans) == planned
        plan = next(iter(module._plans.plans.values()), None)
        if planned:
            assert isinstance(plan, kernels.DdsPlan) and (plan.run is not None) == (rows <= 64)
        seen = count_triton_runs(monkeypatch)
        for i, x in enumerate(inputs):
            monkeypatch.setattr(linear_plans, "PLANS", False)
            expected = module(x)
            monkeypatch.setattr(linear_plans, "PLANS", True)
            seen.clear()
            got = module(x)
            if planned and plan.run is not None and i < 4:
                assert seen == [], (i, seen)  # relaunched, not through Triton's launch
            assert torch.equal(got, expected), i
        assert len(module._plans) == planned  # one key: the same shape and strides throughout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_each_stream_gets_its_own_plan():
    module = BlockSparseLinear(1024, 1024, block_size=32, density=0.25).to("cuda", torch.bfloat16)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    with torch.no_grad():
        for _ in range(3):
            for s in streams:
                with torch.cuda.stream(s):
                    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
                    results.append((x, module(x)))
        torch.cuda.synchronize()
        assert len(module._plans) == 2
        for x, y in results:
            assert torch.equal(y, block_sparse_linear(x, module.weight, module.layout, module.bias))
