"""Blocks to dense and back (tilesparse.kernels.block_scatter), the dense path's copies:
exact (no arithmetic) against the PyTorch-indexing references and the layout's own
to_dense / gather, over block sizes (powers of two and not), ragged block grids, empty and
full layouts and every dtype, under the interpreter and on the GPU; and the autograd pair
of the dense path (each the other's backward)."""

import pytest
import torch

import tilesparse as ts
from tilesparse.kernels import block_scatter as bs
from tilesparse.ops import dense_dispatch as dd

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (block, block rows, block cols, density): a grid narrower than one strip, ragged strips,
# non-power-of-two blocks, an empty and a full layout
CASES = [(16, 3, 11, 0.4), (32, 5, 7, 0.5), (24, 4, 9, 0.3), (64, 2, 3, 1.0), (128, 2, 2, 0.5), (16, 4, 20, 0.0),
         (8, 6, 40, 0.25), (48, 3, 5, 0.6)]


def _case(block, rows, cols, density, dtype, device="cpu", seed=0):
    layout = ts.layouts.random(rows * block, cols * block, block, density, seed=seed)
    values = torch.randn(layout.nnz, block, block).to(dtype).to(device)
    return layout, layout.meta_on(device), values


def _poisoned_like(dense):
    # a strided, NaN-filled matrix around the dense one: the gather must read only its blocks
    wide = torch.full((dense.shape[0], dense.shape[1] + 7), float("nan"), dtype=dense.dtype, device=dense.device)
    wide[:, 3:3 + dense.shape[1]] = dense
    return wide[:, 3:3 + dense.shape[1]]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}-{c[1]}x{c[2]}-d{c[3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_interpreter_are_exact(case, dtype):
    layout, meta, values = _case(*case, dtype)
    rows, cols = layout.block_rows, layout.block_cols
    dense = bs.scatter_blocks(values, meta, rows, cols, interpret=True)
    assert dense.shape == layout.shape and dense.is_contiguous()
    assert torch.equal(dense, bs.scatter_reference(values, meta, rows, cols))
    assert torch.equal(dense, layout.to_dense(values))
    back = bs.gather_blocks(_poisoned_like(dense), meta, rows, cols, case[0], interpret=True)
    assert torch.equal(back, values)


def test_slot_map_names_every_stored_block_once():
    layout, meta, _ = _case(16, 7, 9, 0.4, torch.float32)
    slots = bs.slot_map(meta, layout.block_rows, layout.block_cols).view(layout.block_rows, layout.block_cols)
    assert torch.equal(slots >= 0, layout.mask)
    coords = layout.coords
    assert torch.equal(slots[coords[:, 0], coords[:, 1]], torch.arange(layout.nnz, dtype=torch.int32))
    assert bs.slot_map(meta, layout.block_rows, layout.block_cols) is bs.slot_map(meta, layout.block_rows,
                                                                                   layout.block_cols)


def test_wrong_shapes_are_refused_by_name():
    layout, meta, values = _case(16, 4, 4, 0.5, torch.float32)
    rows, cols = layout.block_rows, layout.block_cols
    with pytest.raises(ValueError, match="values must have shape"):
        bs.scatter_blocks(values[:-1], meta, rows, cols, interpret=True)
    with pytest.raises(ValueError, match="dense must have shape"):
        bs.gather_blocks(torch.zeros(32, 64), meta, rows, cols, 16, interpret=True)


def test_references_serve_cpu_and_float64():
    layout, meta, values = _case(16, 3, 5, 0.5, torch.float64)
    dense = bs.scatter_blocks(values, meta, layout.block_rows, layout.block_cols)
    assert torch.equal(dense, layout.to_dense(values))
    assert torch.equal(bs.gather_blocks(dense, meta, layout.block_rows, layout.block_cols, 16), values)


def test_dense_path_pair_is_each_others_adjoint():
    # <scatter(v), D> == <v, gather(D)>, and the autograd pair gives exactly that gradient
    layout, meta, values = _case(16, 4, 6, 0.5, torch.float64)
    rows, cols = layout.block_rows, layout.block_cols
    values.requires_grad_(True)
    probe = torch.randn(*layout.shape, dtype=torch.float64)
    (grad_values,) = torch.autograd.grad((dd.scatter_dense(values, meta, rows, cols) * probe).sum(), values)
    assert torch.equal(grad_values, layout.gather(probe))
    dense = torch.randn(*layout.shape, dtype=torch.float64, requires_grad=True)
    probe_values = torch.randn_like(values)
    (grad_dense,) = torch.autograd.grad((dd.gather_blocks(dense, meta, rows, cols, 16) * probe_values).sum(), dense)
    assert torch.equal(grad_dense, layout.to_dense(probe_values))
    # the second order on a smaller case (numerical Jacobians: the cost grows with the square of the values)
    small, small_meta, small_values = _case(16, 2, 3, 0.5, torch.float64)
    small_values.requires_grad_(True)
    assert small.nnz > 0
    assert torch.autograd.gradgradcheck(
        lambda v: dd.scatter_dense(v, small_meta, small.block_rows, small.block_cols) ** 2, (small_values,))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES + [(16, 768, 768, 0.5), (128, 96, 97, 0.1)],
                         ids=lambda c: f"b{c[0]}-{c[1]}x{c[2]}-d{c[3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_gpu_are_exact(case, dtype, monkeypatch):
    monkeypatch.setenv("TILESPARSE_POISON", "1")  # outputs NaN-filled first: every element must be written
    layout, meta, values = _case(*case, dtype, device="cuda")
    rows, cols = layout.block_rows, layout.block_cols
    dense = bs.scatter_blocks(values, meta, rows, cols)
    assert torch.equal(dense, bs.scatter_reference(values, meta, rows, cols))
    assert torch.equal(bs.gather_blocks(_poisoned_like(dense), meta, rows, cols, case[0]), values)
