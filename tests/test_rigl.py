"""RigL: the sync-free layout constructor, BlockSparseLinear.set_layout, the rewire
(drop by magnitude, grow by dense-gradient block norms, optimizer state remapping), and
training through rewires against a dense masked twin, step for step in float64.

Brute forces use dense autograd and Python sorting, never the library's selection code.
"""

import pytest
import torch
from torch import nn

from tilesparse import BlockLayout, BlockSparseLinear
from tilesparse.sparsity import GatedBlockSparseLinear, RigL, rewire


def random_mask(rows, cols, p):
    return torch.rand(rows, cols) < p


def dense_mask(layout: BlockLayout) -> torch.Tensor:
    b = layout.block_size
    return layout.mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


def dense_block_norms(dw: torch.Tensor, b: int) -> torch.Tensor:
    r, c = dw.shape[0] // b, dw.shape[1] // b
    return dw.reshape(r, b, c, b).pow(2).sum(dim=(1, 3)).sqrt()


def layer(in_f=96, out_f=64, b=16, density=0.4):
    return BlockSparseLinear(
        in_f, out_f, block_size=b, density=density, seed=int(torch.randint(0, 2**30, ())), dtype=torch.float64
    )


def brute_choice(mask: torch.Tensor, values: torch.Tensor, grad_norms: torch.Tensor, n: int):
    """(dropped, grown) sets of (row, col): drop the n smallest block norms (ties: lower
    storage slot), grow the n largest grad norms among inactive blocks (ties: lower
    row-major index)."""
    coords = [tuple(c) for c in mask.nonzero().tolist()]
    mags = values.flatten(1).norm(dim=1).tolist()
    dropped = {coords[s] for s in sorted(range(len(coords)), key=lambda s: (mags[s], s))[:n]}
    cols = mask.shape[1]
    inactive = [i for i in range(mask.numel()) if not mask.flatten()[i]]
    g = grad_norms.flatten().tolist()
    grown = {divmod(i, cols) for i in sorted(inactive, key=lambda i: (-g[i], i))[:n]}
    return dropped, grown


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (8, 8), (5, 16)])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.7, 1.0])
def test_from_mask_with_nnz_equals_block_layout(shape, p):
    mask = random_mask(*shape, p)
    ref = BlockLayout(mask, 16)
    fast = BlockLayout.from_mask_with_nnz(mask, 16, int(mask.sum()))
    assert fast == ref and fast.nnz == ref.nnz
    assert torch.equal(fast.coords, ref.coords)
    assert torch.equal(fast.meta, ref.meta)  # every packed table, bit for bit


def test_from_mask_with_nnz_errors():
    with pytest.raises(TypeError):
        BlockLayout.from_mask_with_nnz(torch.ones(2, 2, dtype=torch.int64), 16, 4)
    with pytest.raises(ValueError):
        BlockLayout.from_mask_with_nnz(torch.ones(2, 2, dtype=torch.bool), 16, 5)


def test_set_layout_keeps_parameter():
    m = layer()
    weight = m.weight
    mask = m.layout_mask.clone()
    new_mask = mask.flip(0)  # same nnz
    new = BlockLayout.from_mask_with_nnz(new_mask, 16, int(mask.sum()))
    values = torch.randn(new.nnz, 16, 16, dtype=torch.float64)
    m.weight.grad = torch.ones_like(m.weight)
    m.set_layout(new, values)
    assert m.weight is weight and torch.equal(m.weight, values) and m.weight.grad is None
    assert torch.equal(m.layout_mask, new_mask) and m.layout == new
    x = torch.randn(5, 96, dtype=torch.float64)
    assert torch.allclose(m(x), x @ new.to_dense(values).t() + m.bias)
    # A different nnz replaces .data, still the same Parameter.
    smaller = BlockLayout(torch.zeros_like(mask).index_fill_(1, torch.tensor([0]), True), 16)
    m.set_layout(smaller, torch.zeros(smaller.nnz, 16, 16, dtype=torch.float64))
    assert m.weight is weight and m.weight.shape == (smaller.nnz, 16, 16)
    with pytest.raises(ValueError):
        m.set_layout(BlockLayout.dense(64, 64, 16), torch.zeros(16, 16, 16))
    with pytest.raises(ValueError):
        m.set_layout(smaller, torch.zeros(1, 16, 16))


# ----------------------------------------------------------------------------- rewire


@pytest.mark.parametrize("opt_kind", ["adamw", "sgd_momentum"])
def test_rewire_matches_brute_force(opt_kind):
    m = layer()
    x = torch.randn(11, 96, dtype=torch.float64)  # odd M
    if opt_kind == "adamw":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    for _ in range(2):  # some optimizer state
        m(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()

    # The dense gradient, by dense autograd.
    w_dense = m.to_dense().requires_grad_()
    (x @ w_dense.t() + m.bias.detach()).pow(2).sum().backward()
    grad_norms = dense_block_norms(w_dense.grad, 16)

    old_mask = m.layout_mask.clone()
    old_coords = [tuple(c) for c in m.layout.coords.tolist()]
    old_w = {c: m.weight[s].detach().clone() for s, c in enumerate(old_coords)}
    state = opt.state[m.weight]
    keys = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.shape == m.weight.shape]
    assert keys
    old_state = {k: {c: state[k][s].clone() for s, c in enumerate(old_coords)} for k in keys}
    state_ids = {k: id(state[k]) for k in keys}
    nnz = m.weight.shape[0]
    n = 3
    dropped, grown = brute_choice(old_mask, m.weight.detach(), grad_norms, n)

    assert rewire(m, grad_norms, n, opt) == n
    assert m.weight.shape[0] == nnz and int(m.layout_mask.sum()) == nnz
    new_coords = [tuple(c) for c in m.layout.coords.tolist()]
    assert set(old_coords) - set(new_coords) == dropped
    assert set(new_coords) - set(old_coords) == grown
    assert m.layout == BlockLayout(m.layout_mask, 16)
    for s, c in enumerate(new_coords):
        if c in grown:
            assert not m.weight[s].any()
            for k in keys:
                assert not state[k][s].any(), f"{k} of a regrown block"
        else:
            assert torch.equal(m.weight[s], old_w[c])
            for k in keys:
                assert torch.equal(state[k][s], old_state[k][c]), f"{k} of a kept block"
    assert {k: id(state[k]) for k in keys} == state_ids  # updated in place


def test_rewire_ties_and_caps():
    m = layer(64, 64, 16, density=0.5)
    with torch.no_grad():
        m.weight.fill_(1.0)  # every block norm equal: drop the first n storage slots
    old_coords = [tuple(c) for c in m.layout.coords.tolist()]
    inactive = [i for i in range(16) if not m.layout_mask.flatten()[i]]
    assert rewire(m, torch.zeros(4, 4, dtype=torch.float64), 2) == 2
    new_coords = set(map(tuple, m.layout.coords.tolist()))
    assert set(old_coords) - new_coords == set(old_coords[:2])
    assert new_coords - set(old_coords) == {divmod(i, 4) for i in inactive[:2]}
    # n is capped by the number of inactive blocks; n = 0 changes nothing.
    mask = m.layout_mask.clone()
    assert rewire(m, torch.rand(4, 4), 0) == 0 and torch.equal(m.layout_mask, mask)
    assert rewire(m, torch.rand(4, 4), 100) == 16 - m.weight.shape[0]


def test_rewire_with_nan_scores_grows_real_scores_first_and_never_an_active_block():
    """(review, 2026-12-04) An overflowed step's NaN norms were mapped to the same floor as the active
    blocks' after they were set: active blocks ranked above inactive NaN ones, were "grown", and the mask
    came out short of nnz (an assert in from_mask_with_nnz)."""
    m = layer(64, 64, 16, density=0.5)
    inactive = [i for i in range(16) if not m.layout_mask.flatten()[i]]
    scores = torch.full((16,), float("nan"))
    scores[inactive[-1]] = 1.0  # one real score among NaNs
    old = set(map(tuple, m.layout.coords.tolist()))
    assert rewire(m, scores.view(4, 4), 3) == 3
    new = set(map(tuple, m.layout.coords.tolist()))
    assert m.layout.nnz == m.weight.shape[0] == 8 and len(new) == 8
    assert divmod(inactive[-1], 4) in new - old and all(divmod(i, 4) in {divmod(j, 4) for j in inactive}
                                                        for i in [r * 4 + c for r, c in new - old])


def test_rewire_moves_adafactors_factored_state_with_the_blocks():
    """(review, 2026-12-04) Only state of the weight's exact shape was moved: Adafactor's per-block
    [nnz, b, 1] / [nnz, 1, b] variances stayed in the old storage order."""
    if not hasattr(torch.optim, "Adafactor"):
        pytest.skip("torch.optim.Adafactor needs torch >= 2.5")
    torch.manual_seed(0)
    m = BlockSparseLinear(16, 16, block_size=4, density=0.5, bias=False)
    opt = torch.optim.Adafactor(m.parameters(), lr=1e-2)
    m(torch.randn(8, 16)).pow(2).sum().backward()
    opt.step()
    state = opt.state[m.weight]
    before = {tuple(c): (state["row_var"][i].clone(), state["col_var"][i].clone())
              for i, c in enumerate(m.layout.coords.tolist())}
    rewire(m, torch.rand(4, 4), 3, opt)
    for i, c in enumerate(map(tuple, m.layout.coords.tolist())):
        row, col = before.get(c, (torch.zeros(4, 1), torch.zeros(1, 4)))  # grown blocks start at zero
        assert torch.equal(state["row_var"][i], row) and torch.equal(state["col_var"][i], col), c


def test_rewire_refuses_gated_layers():
    gated = GatedBlockSparseLinear(16, 16, block_size=4, density=0.5)
    with pytest.raises(TypeError, match="GatedBlockSparseLinear"):
        rewire(gated, torch.rand(4, 4), 2)


# ----------------------------------------------------------------------------- controller


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = layer(48, 64, 16, 0.5)
        self.fc2 = layer(64, 32, 16, 0.5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def test_hooks_only_on_rewire_steps_and_stats():
    model = TwoLayer()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rigl = RigL(model, opt, every=3, drop_fraction=0.5, schedule="constant", total_steps=7)
    armed = []
    for step in range(1, 9):
        armed.append(len(model.fc1._forward_hooks) > 0)
        model(torch.randn(6, 48, dtype=torch.float64)).pow(2).mean().backward()
        opt.step()
        rewired = rigl.step()
        opt.zero_grad()
        assert rewired == (step in (3, 6))
    assert armed == [False, False, True, False, False, True, False, False]
    assert [h["step"] for h in rigl.history] == [3, 6]
    for h in rigl.history:
        for name, mod in (("fc1", model.fc1), ("fc2", model.fc2)):
            nnz = mod.weight.shape[0]
            assert h["changed"][name] == min(round(0.5 * nnz), mod.layout_mask.numel() - nnz)
            assert h["flip_rate"][name] == h["changed"][name] / nnz
    assert len(model.fc1._forward_hooks) == 0


def test_schedule_and_errors():
    m = layer()
    rigl = RigL([m], every=10, drop_fraction=0.4, total_steps=100)
    assert rigl.fraction(0) == pytest.approx(0.4) and rigl.fraction(50) == pytest.approx(0.2)
    assert rigl.fraction(100) == pytest.approx(0.0)
    assert RigL(m, every=1, schedule="linear", total_steps=10, drop_fraction=0.4).fraction(5) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        RigL(m, every=0, total_steps=10)
    with pytest.raises(ValueError):
        RigL(m, every=1, schedule="step", total_steps=10)
    with pytest.raises(ValueError):
        RigL(nn.Linear(4, 4), every=1, total_steps=10)
    with pytest.raises(TypeError):
        RigL(GatedBlockSparseLinear.from_block_sparse(layer()), every=1, total_steps=10)
    # A due rewire without any captured gradient is a usage error.
    rigl = RigL(m, every=1, total_steps=10)
    with pytest.raises(RuntimeError, match="no layer's gradient"):
        rigl.step()


def test_micro_batches_grow_by_summed_gradient():
    m = layer(64, 64, 16, 0.25)
    rigl = RigL(m, every=1, drop_fraction=0.5, schedule="constant", total_steps=10)
    xs = [torch.randn(5, 64, dtype=torch.float64), torch.randn(3, 64, dtype=torch.float64)]
    w_dense = m.to_dense().requires_grad_()
    for x in xs:  # two micro-batches, gradients accumulate
        m(x).pow(3).sum().backward()
        (x @ w_dense.t() + m.bias.detach()).pow(3).sum().backward()
    _, grown = brute_choice(m.layout_mask, m.weight.detach(), dense_block_norms(w_dense.grad, 16), 2)
    old = set(map(tuple, m.layout.coords.tolist()))
    assert rigl.step()
    assert set(map(tuple, m.layout.coords.tolist())) - old == grown


def test_training_matches_dense_masked_twin():
    """fp64 CPU: the block-sparse model with RigL vs a dense nn.Linear twin whose weight
    and gradient are masked by the layout, rewired by a brute-force RigL of its own
    (dense autograd gradient norms, Python sorting, masking weights and Adam state)."""
    b, every, f = 16, 3, 0.3
    sparse = TwoLayer()
    twins = {}
    for name in ("fc1", "fc2"):
        mod = getattr(sparse, name)
        lin = nn.Linear(mod.in_features, mod.out_features, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(mod.to_dense())
            lin.bias.copy_(mod.bias)
        twins[name] = lin
    masks = {name: getattr(sparse, name).layout_mask.clone() for name in twins}
    opt_s = torch.optim.AdamW(sparse.parameters(), lr=3e-2, weight_decay=0.1)
    opt_d = torch.optim.AdamW([p for lin in twins.values() for p in lin.parameters()], lr=3e-2, weight_decay=0.1)
    rigl = RigL(sparse, opt_s, every=every, drop_fraction=f, total_steps=100)

    def twin_forward(x):
        weights = {}
        for name, lin in twins.items():
            weights[name] = lin.weight * dense_mask(BlockLayout(masks[name], b))
            weights[name].retain_grad()  # the dense gradient of the effective weight
        h = torch.tanh(x @ weights["fc1"].t() + twins["fc1"].bias)
        return h @ weights["fc2"].t() + twins["fc2"].bias, weights

    rewires = 0
    for step in range(1, 8):
        x, y = torch.randn(9, 48, dtype=torch.float64), torch.randn(9, 32, dtype=torch.float64)
        loss_s = (sparse(x) - y).pow(2).mean()
        out_d, eff = twin_forward(x)
        loss_d = (out_d - y).pow(2).mean()
        assert torch.allclose(loss_s, loss_d, rtol=1e-10, atol=0), step
        loss_s.backward()
        loss_d.backward()
        opt_s.step()
        opt_d.step()
        if rigl.step():
            rewires += 1
            for name, lin in twins.items():
                mod = getattr(sparse, name)
                nnz = int(masks[name].sum())
                n = round(rigl.fraction(step) * nnz)
                values = BlockLayout(masks[name], b).gather(lin.weight.detach())
                grad_norms = dense_block_norms(eff[name].grad, b)
                dropped, grown = brute_choice(masks[name], values, grad_norms, n)
                for r, c in dropped:
                    masks[name][r, c] = False
                for r, c in grown:
                    masks[name][r, c] = True
                assert torch.equal(mod.layout_mask, masks[name]), (step, name)
                keep = dense_mask(BlockLayout(masks[name], b)).to(torch.float64)
                with torch.no_grad():  # dropped and grown blocks: weight and state zero
                    lin.weight.mul_(keep)
                    for key in ("exp_avg", "exp_avg_sq"):
                        opt_d.state[lin.weight][key].mul_(keep)
        opt_s.zero_grad()
        opt_d.zero_grad()
        for name, lin in twins.items():
            mod = getattr(sparse, name)
            assert torch.allclose(mod.to_dense(), lin.weight * dense_mask(mod.layout), rtol=1e-10, atol=1e-12)
            assert torch.allclose(mod.bias, lin.bias, rtol=1e-10, atol=1e-12)
    assert rewires == 2 and all(sum(h["changed"].values()) > 0 for h in rigl.history)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_rigl_gpu_choice_and_no_host_sync():
    """On CUDA: grad norms come from the Triton kernel; the choice matches the float64 CPU
    brute force, and the rewire step (norms, selection, tables, state) never syncs."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # IEEE fp32: no near-tie flips from TF32
    try:
        m = BlockSparseLinear(512, 256, block_size=32, density=0.3, device="cuda")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        rigl = RigL(m, opt, every=2, drop_fraction=0.3, total_steps=100)
        for step in (1, 2):
            x = torch.randn(300, 512, device="cuda")
            if step == 2:
                w_dense = m.to_dense().double().cpu().requires_grad_()
                (x.double().cpu() @ w_dense.t() + m.bias.detach().double().cpu()).pow(2).sum().backward()
            m(x).pow(2).sum().backward()
            opt.step()
            if step == 2:
                nnz = m.weight.shape[0]
                dropped, grown = brute_choice(
                    m.layout_mask.cpu(), m.weight.detach().double().cpu(),
                    dense_block_norms(w_dense.grad, 32), round(rigl.fraction(2) * nnz),
                )
                old = set(map(tuple, m.layout.coords.tolist()))
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    assert rigl.step()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                new = set(map(tuple, m.layout.coords.tolist()))
                assert old - new == dropped and new - old == grown
                assert m.layout == BlockLayout(m.layout_mask.cpu(), 32)
            else:
                assert not rigl.step()
            opt.zero_grad()
        y = m(torch.randn(7, 512, device="cuda"))
        assert torch.isfinite(y).all()
    finally:
        torch.set_float32_matmul_precision(prev)
