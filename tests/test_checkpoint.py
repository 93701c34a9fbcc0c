"""Checkpoints: save and resume reproduces the uninterrupted run exactly (CPU), also
across RigL rewires (the checkpoint's layouts are adopted before loading), and a wrong
checkpoint gives a clear error."""

import io

import pytest
import torch
from torch import nn

import tilesparse
from tilesparse.sparsity import RigL, adopt_layouts


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        tilesparse.BlockSparseLinear(32, 64, block_size=8, density=0.5, seed=1),
        nn.GELU(),
        tilesparse.BlockSparseLinear(64, 16, block_size=8, density=0.5, seed=2),
    )


def _parts():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rigl = RigL(model, opt, every=3, drop_fraction=0.5, total_steps=100)
    return model, opt, rigl


def _batch(step):
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 32, generator=gen), torch.randn(16, 16, generator=gen)


def _steps(model, opt, rigl, start, stop):
    losses = []
    for step in range(start, stop):
        x, y = _batch(step)
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rigl.step()
        losses.append(loss.item())
    return losses


def test_resume_reproduces_the_uninterrupted_run_across_rewires():
    model, opt, rigl = _parts()
    uninterrupted = _steps(model, opt, rigl, 0, 10)
    assert len(rigl.history) == 3  # rewires at steps 3, 6, 9

    model, opt, rigl = _parts()
    first = _steps(model, opt, rigl, 0, 5)  # one rewire behind it: layouts differ from a fresh model's
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rigl": rigl.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    model, opt, rigl = _parts()  # a fresh process would build these from scratch
    with pytest.raises(ValueError, match="block layout differs"):
        model.load_state_dict(checkpoint["model"])
    changed = adopt_layouts(model, checkpoint["model"])
    assert changed, "the rewire should have changed some layout"
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    rigl.load_state_dict(checkpoint["rigl"])
    resumed = first + _steps(model, opt, rigl, 5, 10)
    assert resumed == uninterrupted  # exactly: same floats, step for step


def test_adopt_layouts_refuses_mismatched_checkpoints():
    model = _model()
    state = model.state_dict()
    bad_shape = dict(state, **{"0.layout_mask": torch.ones(3, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"0.layout_mask: saved shape \(3, 3\)"):
        adopt_layouts(_model(), bad_shape)
    full = torch.ones_like(state["0.layout_mask"])  # every block: more than the saved weight holds
    bad_count = dict(state, **{"0.layout_mask": full})
    with pytest.raises(ValueError, match="0.weight: the checkpoint's blocks"):
        adopt_layouts(_model(), bad_count)
