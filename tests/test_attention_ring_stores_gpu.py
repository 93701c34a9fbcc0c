"""Outputs stored through idle shared memory on CUDA: dK and dV through the drained Q / dO
ring (``DkdvWsConfig.ring_stores``), the bits of each shipped dK/dV mode's own stores (the
deterministic two-kernel backward's, ``deterministic=False``'s and the ordered one's); dQ
through the consumers' rows of the Q tile (``DqWsConfig.staged_stores``) and the forward's
O through its Q buffers (``FwdWsConfig.staged_stores``), the bits of their own stores. With
GQA, odd S, key padding and an empty query block, and the float64 reference's gradients.
Marked ``gpu``; skipped off sm90."""

import dataclasses

import pytest
import torch

from attention_cases import _seed, make_inputs, padding, reference_with_grads, run_kernels
from tilesparse.attention import layouts
from tilesparse.kernels import attention as kernels
from tilesparse.kernels import attention_ws
from tolerances import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon kernel is written for sm90")]


def _layout(name, S, causal=False):
    """The tests' layouts: BigBird (random blocks), a 512-wide window (causal or not), causal,
    and a window with query block 3 emptied (its rows: O 0, lse -inf, dQ 0)."""
    if name == "empty-row":
        from tilesparse.attention import AttentionLayout

        mask = layouts.local(S, 128, 512).mask[0].clone()
        mask[3] = False
        return AttentionLayout(mask[None], 128, seq_len=S)
    return {"bigbird": lambda: layouts.bigbird(S, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed()),
            "local": lambda: layouts.local(S, 128, 512, causal=causal),
            "causal": lambda: layouts.causal(S, 128)}[name]()


def _case(name, S, D, causal, kpm_kind, seq_major=False, dtype=torch.bfloat16):
    """(layout, q, k, v, grad_out, key padding) on CUDA: 2 batches, 4 query heads on 2 kv heads."""
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, seq_major=seq_major, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, kpm_kind)
    return _layout(name, S, causal), q, k, v, grad_out, None if kpm is None else kpm.cuda()


def _assert_reference_grads(grads, q, k, v, layout, grad_out, causal, kpm):
    """``grads`` (dq, dk, dv) against the float64 reference's."""
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=q.shape[-1] ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for grad_name, g, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(g, want, q.dtype, grad_name)


def _shipped(mode, q, layout, causal):
    """The dK/dV config the backward runs in ``mode`` for these inputs (D 128 or 64)."""
    v = q
    nb = -(-layout.seq_len // layout.block_size)
    if mode == "ordered":
        meta = layout.meta_on(q.device, causal)
        return attention_ws.ordered_default(q, v, v, v, layout.block_size, meta, layout.layout_heads, nb)
    return attention_ws.default_config("dkdv", q, v, v, v, layout.block_size, layout.layout_heads,
                                       deterministic=mode == "deterministic")


@pytest.mark.parametrize("mode,name,causal,S,D,kpm_kind", [
    ("deterministic", "bigbird", False, 1000, 128, "tail"), ("deterministic", "local", True, 1050, 128, None),
    ("deterministic", "local", False, 2000, 64, "tail"),
    ("atomic", "bigbird", False, 1000, 128, "tail"), ("atomic", "local", True, 1050, 128, None),
    ("atomic", "local", False, 2000, 64, None),
    ("ordered", "local", False, 2000, 128, "tail"), ("ordered", "causal", True, 1050, 128, None)])
def test_ring_stores_give_the_same_bits(mode, name, causal, S, D, kpm_kind):
    dtype = torch.bfloat16
    layout, q, k, v, grad_out, kpm = _case(name, S, D, causal, kpm_kind)
    cfg = _shipped(mode, q, layout, causal)
    assert cfg is not None and not cfg.persistent
    ring = dataclasses.replace(cfg, staged_stores=False, ring_stores=True)
    cfg = dataclasses.replace(cfg, ring_stores=False)  # (the stores ring_stores replaced)
    fwd = kernels.attention_config("fwd", 128, D, dtype)
    deterministic = mode != "atomic"  # (deterministic=False: no dQ kernel; the Triton config stands in)
    dq_cfg = (attention_ws.default_config("dq", q, k, v, grad_out, 128, layout.layout_heads) if deterministic
              else None) or kernels.attention_config("dq", 128, D, dtype)
    runs = [run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, c, dq_cfg),
                        deterministic=deterministic)[2] for c in (cfg, ring, ring)]
    for got in runs[1:]:  # dK and dV always; dQ where its adds are ordered or made by the dQ kernel
        assert torch.equal(got[1], runs[0][1]) and torch.equal(got[2], runs[0][2])
        if deterministic:
            assert torch.equal(got[0], runs[0][0])
    _assert_reference_grads(runs[1], q, k, v, layout, grad_out, causal, kpm)



@pytest.mark.parametrize("name,causal,S,D,kpm_kind,seq_major,dtype", [
    ("bigbird", False, 1000, 128, "tail", False, torch.bfloat16),
    ("local", True, 1050, 128, None, False, torch.bfloat16),
    ("local", False, 2000, 64, "tail", False, torch.bfloat16),
    ("empty-row", False, 1000, 128, None, False, torch.bfloat16),
    # the defaults (D 128 and 64) take staged stores in fp16 and on [B, S, H, D] inputs too
    ("bigbird", True, 1000, 128, "tail", False, torch.float16), ("local", True, 1050, 128, None, True, torch.bfloat16),
    ("bigbird", True, 1000, 64, "tail", False, torch.float16), ("local", True, 1050, 64, None, True, torch.bfloat16)])
def test_dq_staged_stores_give_the_same_bits(name, causal, S, D, kpm_kind, seq_major, dtype):
    layout, q, k, v, grad_out, kpm = _case(name, S, D, causal, kpm_kind, seq_major=seq_major, dtype=dtype)
    fwd = kernels.attention_config("fwd", 128, D, dtype)
    dkdv = attention_ws.default_config("dkdv", q, k, v, grad_out, 128, layout.layout_heads)
    dq_cfg = attention_ws.default_config("dq", q, k, v, grad_out, 128, layout.layout_heads)
    assert dkdv is not None and dq_cfg is not None
    plain, staged = (dataclasses.replace(dq_cfg, staged_stores=flag) for flag in (False, True))
    runs = [run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, c))[2]
            for c in (plain, staged, staged)]
    for got in runs[1:]:
        assert all(map(torch.equal, got, runs[0]))
    _assert_reference_grads(runs[1], q, k, v, layout, grad_out, causal, kpm)


@pytest.mark.parametrize("name,causal,S,D,kpm_kind,seq_major,dtype", [
    ("bigbird", False, 1000, 128, "tail", False, torch.bfloat16), ("local", True, 1050, 128, None, True, torch.bfloat16),
    ("local", False, 2000, 64, "tail", False, torch.bfloat16), ("empty-row", False, 1000, 128, None, False, torch.bfloat16),
    ("bigbird", True, 1000, 128, "tail", False, torch.float16), ("local", False, 2000, 64, None, True, torch.float16)])
def test_forward_staged_stores_give_the_same_bits(name, causal, S, D, kpm_kind, seq_major, dtype):
    # the persistent forward with each tile's O through the consumers' Q rows: O and lse of
    # its own stores (Q, K, V also as [B, S, H, D] memory seen as [B, H, S, D]); then O written
    # into such a view too (row stride H * D), the same values
    from tilesparse.attention.layout import attention_table_views

    layout, q, k, v, _, kpm = _case(name, S, D, causal, kpm_kind, seq_major, dtype)
    meta = layout.meta_on(q.device, causal)
    cfg = dataclasses.replace(attention_ws._WS_DEFAULTS[("fwd", 128, D)], staged_stores=False)
    assert cfg.persistent
    staged = dataclasses.replace(cfg, staged_stores=True)
    runs = [kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, 128, causal, D ** -0.5, config=c)
            for c in (cfg, staged, staged)]
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])
    want, _, _ = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, torch.zeros_like(q).cpu(), causal=causal,
                                      scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    assert_close(runs[1][0], want, dtype, "out")
    nb = -(-S // 128)
    row_ptr, _, row_cols, _ = attention_table_views(meta, layout.layout_heads, nb)
    out = torch.full((2, S, 4, D), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
    lse = torch.full((2, 4, S), float("nan"), device="cuda")
    attention_ws.launch_fwd_ws(q, k, v, out, lse, kernels._kpm_bytes(kpm, row_ptr), row_ptr, row_cols, nb,
                               layout.layout_heads, 128, causal, kpm is not None, D ** -0.5, staged, meta)
    assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])
