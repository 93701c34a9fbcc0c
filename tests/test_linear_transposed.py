"""TransposedBlockSparseLinear: the same layer as BlockSparseLinear, its blocks stored as Wᵀ's."""

import pytest
import torch
from torch import nn

import tilesparse
from tilesparse import BlockSparseLinear, layouts
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
    with pytest.raises(ValueError, match="layout_mask"):
        other.load_state_dict(layer.state_dict())


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="module must be a tilesparse.nn.BlockSparseLinear"):
        TransposedBlockSparseLinear.from_module(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="layout must be a tilesparse.BlockLayout"):
        TransposedBlockSparseLinear(torch.ones(2, 2))
    layer = TransposedBlockSparseLinear.from_module(_layer())
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(2, 64, dtype=torch.float64))


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
