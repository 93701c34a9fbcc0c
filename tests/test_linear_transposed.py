"""TransposedBlockSparseLinear: the same layer as BlockSparseLinear, its blocks stored as Wᵀ's."""

import pytest
import torch
from torch import nn

import tilesparse
from tilesparse import BlockLayout, BlockSparseLinear, layouts
from tilesparse.nn import TransposedBlockSparseLinear, store_transposed
from tolerances import assert_close


def _layer(in_features=96, out_features=64, block_size=16, density=0.5, bias=True, dtype=torch.float64):
    seed = int(torch.randint(1000, ()))
    return BlockSparseLinear(in_features, out_features, block_size=block_size, density=density, bias=bias,
                             seed=seed, dtype=dtype)


@pytest.mark.parametrize("density", [0.0, 0.3, 1.0], ids=["empty", "d0.3", "full"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_same_function_and_gradients_as_the_row_stored_layer(block_size, density, bias):
    rows_layer = _layer(block_size=block_size, density=density, bias=bias)
    layer = TransposedBlockSparseLinear.from_module(rows_layer)
    assert layer.layout == rows_layer.layout.transpose()
    assert (layer.in_features, layer.out_features) == (96, 64)
    assert torch.equal(layer.to_dense(), rows_layer.to_dense())
    x = torch.randn(3, 5, 96, dtype=torch.float64)
    x_rows, x_t = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_rows, y_t = rows_layer(x_rows), layer(x_t)
    assert y_t.shape == (3, 5, 64)
    assert_close(y_t, y_rows, torch.float64, "forward")
    assert_close(y_t, x @ rows_layer.to_dense().t() + (rows_layer.bias.detach() if bias else 0), torch.float64,
                 "forward against the dense product")
    grad = torch.randn_like(y_rows)
    y_rows.backward(grad)
    y_t.backward(grad)
    assert_close(x_t.grad, x_rows.grad, torch.float64, "dX")
    # Wᵀ's block gradients are W's, transposed and in Wᵀ's order
    col_slot = rows_layer.layout.tables.col_slot.long()
    assert_close(layer.weight.grad, rows_layer.weight.grad[col_slot].transpose(1, 2), torch.float64, "dW")
    if bias:
        assert_close(layer.bias.grad, rows_layer.bias.grad, torch.float64, "db")


def test_the_round_trip_gives_back_the_same_blocks_bitwise():
    rows_layer = _layer(dtype=torch.float32)
    back = TransposedBlockSparseLinear.from_module(rows_layer).to_block_sparse_linear()
    assert isinstance(back, BlockSparseLinear)
    assert back.layout == rows_layer.layout
    assert torch.equal(back.weight, rows_layer.weight)
    assert torch.equal(back.bias, rows_layer.bias)


def test_the_functional_form_takes_the_transposed_layout():
    layout = layouts.random(48, 32, 16, 0.5, seed=int(torch.randint(1000, ())))
    weight = torch.randn(layout.nnz, 16, 16, dtype=torch.float64)
    bias = torch.randn(48, dtype=torch.float64)
    x = torch.randn(7, 32, dtype=torch.float64)
    flipped = layout.transpose()
    weight_t = weight[layout.tables.col_slot.long()].transpose(1, 2)
    got = tilesparse.block_sparse_linear(x, weight_t, flipped, bias, transposed_storage=True)
    assert_close(got, tilesparse.block_sparse_linear(x, weight, layout, bias), torch.float64, "functional")
    with pytest.raises(ValueError, match="in_features"):  # the layout read as Wᵀ's: in = 48 rows
        tilesparse.block_sparse_linear(x, weight, layout, bias, transposed_storage=True)
    with pytest.raises(TypeError, match="transposed_storage"):
        tilesparse.block_sparse_linear(x, weight_t, flipped, bias, transposed_storage=1)


def test_store_transposed_converts_every_layer_of_a_model_in_place():
    model = nn.Sequential(_layer(96, 64), nn.GELU(), nn.Sequential(_layer(64, 32, block_size=8)),
                          nn.Linear(32, 4, dtype=torch.float64))
    x = torch.randn(6, 96, dtype=torch.float64)
    want = model(x)
    assert store_transposed(model) is model
    assert isinstance(model[0], TransposedBlockSparseLinear) and isinstance(model[2][0], TransposedBlockSparseLinear)
    assert isinstance(model[3], nn.Linear)
    assert_close(model(x), want, torch.float64, "converted model")
    single = _layer()
    assert isinstance(store_transposed(single), TransposedBlockSparseLinear)


def test_state_dict_round_trip_and_a_different_layout_is_refused():
    layer = TransposedBlockSparseLinear.from_module(_layer(dtype=torch.float32))
    fresh = TransposedBlockSparseLinear(layer.layout, dtype=torch.float32)
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(4, 96)
    assert torch.equal(fresh(x), layer(x))
    mask = layer.layout.mask.clone()
    mask[0, 0] = not mask[0, 0]
    other = TransposedBlockSparseLinear(tilesparse.BlockLayout(mask, 16), dtype=torch.float32)
    with pytest.raises(ValueError, match="transposed_layout_mask"):
        other.load_state_dict(layer.state_dict())


def test_a_checkpoint_of_the_other_storage_order_is_refused():
    # a symmetric layout of a square W would load silently as the wrong function: the mask keys differ
    rows_layer = BlockSparseLinear(64, 64, block_size=16, density=1.0, dtype=torch.float32)
    layer = TransposedBlockSparseLinear.from_module(rows_layer)
    with pytest.raises(RuntimeError, match="transposed_layout_mask"):
        layer.load_state_dict(rows_layer.state_dict())
    with pytest.raises(RuntimeError, match="layout_mask"):
        rows_layer.load_state_dict(layer.state_dict())


def test_frozen_parameters_stay_frozen_and_tables_are_built():
    rows_layer = _layer(dtype=torch.float32)
    rows_layer.weight.requires_grad_(False)
    layer = TransposedBlockSparseLinear.from_module(rows_layer)
    assert not layer.weight.requires_grad and layer.bias.requires_grad
    assert layer.layout._meta_by_device  # the tables, built at conversion
    back = layer.to_block_sparse_linear()
    assert not back.weight.requires_grad and back.bias.requires_grad


def test_built_from_a_layout_it_draws_the_row_stored_layers_init():
    layout = layouts.random(128, 64, 16, 0.5, seed=7)  # W [128, 64]: Wᵀ's layout is its transpose
    layer = TransposedBlockSparseLinear(layout.transpose(), dtype=torch.float64)
    assert (layer.in_features, layer.out_features) == (64, 128)
    fan_in = layout.mask.sum(dim=1).clamp(min=1) * 16  # per output block of W
    bound = fan_in.double().rsqrt()
    w = layer.to_dense()  # [out, in]
    per_output = w.abs().amax(dim=1).view(-1, 16).amax(dim=1)
    assert bool((per_output <= bound).all()) and bool((per_output[layout.mask.any(dim=1)] > bound / 2).all())
    assert bool((layer.bias.abs().view(-1, 16).amax(dim=1) <= bound).all())
    assert layer.double().weight.dtype == torch.float64
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        TransposedBlockSparseLinear(layout.transpose(), dtype=torch.int32)


def test_store_transposed_leaves_lstms_and_subclasses_alone():
    from tilesparse.sparsity import GatedBlockSparseLinear

    lstm = tilesparse.BlockSparseLSTM(32, 32, block_size=16, density=0.5)
    gated = GatedBlockSparseLinear(32, 32, block_size=16, density=0.5)
    model = nn.ModuleDict({"lstm": lstm, "gated": gated, "plain": _layer(32, 32)})
    store_transposed(model)
    assert model["lstm"] is lstm and isinstance(lstm.hh, BlockSparseLinear)
    assert model["gated"] is gated
    assert isinstance(model["plain"], TransposedBlockSparseLinear)
    with pytest.raises(TypeError, match="not a subclass"):
        TransposedBlockSparseLinear.from_module(gated)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="module must be a tilesparse.nn.BlockSparseLinear"):
        TransposedBlockSparseLinear.from_module(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="layout must be a tilesparse.BlockLayout"):
        TransposedBlockSparseLinear(torch.ones(2, 2))
    layer = TransposedBlockSparseLinear.from_module(_layer())
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(2, 64, dtype=torch.float64))
    for empty in (torch.zeros(0, 2, dtype=torch.bool), torch.zeros(2, 0, dtype=torch.bool)):  # as BlockSparseLinear
        with pytest.raises(ValueError, match="features .* must be a positive int"):
            TransposedBlockSparseLinear(BlockLayout(empty, 4))


def test_compiled_layer_matches_eager():
    torch._dynamo.reset()
    layer = TransposedBlockSparseLinear.from_module(_layer(dtype=torch.float32))
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(5, 96)
    assert_close(compiled(x), layer(x), torch.float32, "compiled")
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8, 40])
def test_gpu_forward_and_backward_match_the_row_stored_layer(rows):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    rows_layer = BlockSparseLinear(1024, 768, block_size=16, density=0.5, seed=5, device="cuda", dtype=torch.bfloat16)
    layer = TransposedBlockSparseLinear.from_module(rows_layer)
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    x_rows, x_t = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_rows, y_t = rows_layer(x_rows), layer(x_t)
    reference = x.double() @ rows_layer.to_dense().double().t() + rows_layer.bias.double()
    assert_close(y_t, reference, torch.bfloat16, "forward")
    grad = torch.randn_like(y_rows)
    y_rows.backward(grad)
    y_t.backward(grad)
    assert_close(x_t.grad, x_rows.grad.double(), torch.bfloat16, "dX")
    col_slot = rows_layer.layout.tables.col_slot.long()
    assert_close(layer.weight.grad, rows_layer.weight.grad[col_slot].transpose(1, 2).double(), torch.bfloat16, "dW")
