"""The Hopper warp-specialized dK/dV and dQ kernels (``tilesparse.kernels.attention_ws``,
Gluon) on CUDA, chosen by their configs: against the float64 reference, the Triton
kernels and themselves (bitwise deterministic). Marked ``gpu``; skipped on GPUs other than sm90."""

import dataclasses

import pytest
import torch

from attention_cases import _seed, make_inputs, padding, reference_with_grads, run_kernels
from tilesparse.attention import AttentionLayout, layouts
from tilesparse.kernels import attention as kernels
from tilesparse.kernels import attention_ws
from tolerances import assert_close, rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon kernel is written for sm90")]


@pytest.mark.parametrize("kpm_kind", [None, "tail"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,D,S,block_m,stages", [
    (128, 128, 2000, 64, 2), (128, 128, 1024, 64, 3), (128, 64, 1000, 64, 2), (64, 64, 1000, 32, 2),
    (64, 128, 777, 64, 2)])
def test_ws_backward_matches_reference_and_the_triton_kernels(b, D, S, block_m, stages, causal, kpm_kind):
    # BigBird (window, global, random blocks), GQA (4 query heads on 2 kv heads), odd S
    # (the last block partial), key padding at the tail of one batch element
    dtype = torch.bfloat16
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, kpm_kind)
    kpm = kpm.cuda() if kpm is not None else None
    fwd, dkdv, dq = (kernels.attention_config(kind, b, D, dtype) for kind in ("fwd", "dkdv", "dq"))
    ws = attention_ws.DkdvWsConfig(block_m, stages)
    ws_q = attention_ws.DqWsConfig(b, 64, stages)
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, ws, ws_q))
    again = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, ws, ws_q))
    triton_grads = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, dq))[2]
    assert all(torch.equal(a, b_) for a, b_ in zip(got[2], again[2])), "gradients must be bitwise deterministic"
    assert all(rel_error(a, t) < 1e-2 for a, t in zip(got[2], triton_grads))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)


def test_ws_dkdv_strided_inputs_and_refusals():
    # q, k, v as views of [B, S, H, D] projections (non-contiguous heads): the
    # descriptors take the strides; fp32 and the atomic dQ mode are refused by name
    dtype, b, D, S = torch.float16, 128, 128, 1536
    layout = layouts.local(S, b, window=512)
    q, k, v = make_inputs(1, 4, 4, S, D, dtype, device="cuda", seq_major=True)
    grad_out = torch.randn(1, 4, S, D, device="cuda").to(dtype)
    fwd, dq = (kernels.attention_config(kind, b, D, dtype) for kind in ("fwd", "dq"))
    ws = attention_ws.DkdvWsConfig()
    got = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out, configs=(fwd, ws, attention_ws.DqWsConfig()))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=False,
                                           scale=D ** -0.5)
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)
    with pytest.raises(ValueError, match="atomic-dQ"):
        run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out, configs=(fwd, ws, dq), deterministic=False)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        run_kernels(q.float(), k.float(), v.float(), layout, False, None, D ** -0.5, grad_out.float(),
                    configs=(kernels.attention_config("fwd", b, D, torch.float32), ws,
                             kernels.attention_config("dq", b, D, torch.float32)))


@pytest.mark.parametrize("kpm_kind", [None, "tail", "all"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,D,S,block_m,block_n,per_head,seq_major", [
    (128, 128, 2000, 128, 128, False, False), (128, 128, 1024, 128, 64, True, False),
    (128, 64, 1500, 64, 32, False, True), (64, 64, 1000, 64, 64, True, True)])
def test_ws_forward_and_backward_match_the_reference(b, D, S, block_m, block_n, per_head, seq_major, causal,
                                                     kpm_kind):
    # all three warp-specialized kernels together; 'all': batch element 0 entirely padding
    # (every row empty: out and dq exactly 0, lse -inf, never NaN); per_head: a layout per
    # head; seq_major: q, k, v as views of [B, S, H, D]; block_m < b: two query tiles a block
    from attention_cases import empty_rows

    dtype = torch.bfloat16
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed(),
                             num_heads=4 if per_head else None)
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda", seq_major=seq_major)
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, kpm_kind)
    configs = (attention_ws.FwdWsConfig(block_m, block_n), attention_ws.DkdvWsConfig(min(64, b)),
               attention_ws.DqWsConfig(block_m, min(64, block_n)))
    out, lse, grads = run_kernels(q, k, v, layout, causal, None if kpm is None else kpm.cuda(), D ** -0.5, grad_out,
                                  configs=configs)
    ref, ref_lse, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                                   scale=D ** -0.5, key_padding_mask=kpm)
    assert_close(out, ref, dtype, "out")
    for name, g, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(g, want, dtype, name)
    empty = empty_rows(layout, S, causal, kpm, 4).expand(2, -1, -1)
    lse = lse.cpu()
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.allclose(lse[~empty].double(), ref_lse[~empty], atol=1e-3, rtol=1e-3)
    assert bool((out.cpu()[empty] == 0).all()) and bool((grads[0].cpu()[empty] == 0).all())
    triton_out = run_kernels(q, k, v, layout, causal, None if kpm is None else kpm.cuda(), D ** -0.5, grad_out)[0]
    assert rel_error(out, triton_out) < 1e-2


def _rows_with_gaps(S, b, single_block_row=False):
    """A per-head layout (4 heads) of ~30 % of blocks plus the diagonal, with head 0's
    block-row 1 empty (a tile that walks no key block, between tiles that do) and, if
    asked, head 1's block-row 2 a single block."""
    nb = -(-S // b)
    mask = torch.rand(4, nb, nb, generator=torch.Generator().manual_seed(_seed())) < 0.3
    mask |= torch.eye(nb, dtype=torch.bool)
    mask[0, 1] = False
    if single_block_row:
        mask[1, 2] = False
        mask[1, 2, 0] = True
    return AttentionLayout(mask, b, S)


def _assert_forward_matches_reference(out, lse, q, k, v, layout, causal, kpm, what):
    """out within the dtype's tolerance of the float64 reference; lse finite exactly where
    the reference's is, and close there."""
    from tilesparse.attention.reference import attention_reference

    ref, ref_lse = attention_reference(q, k, v, layout, causal=causal, scale=q.shape[-1] ** -0.5,
                                       key_padding_mask=kpm.cpu(), return_lse=True)
    assert_close(out, ref, q.dtype, what)
    lse = lse.cpu()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite].double(), ref_lse[finite], atol=1e-3, rtol=1e-3)
    return finite


@pytest.mark.parametrize("programs", [5, None], ids=["5-programs", "one-per-sm"])
@pytest.mark.parametrize("b,D,S,block_m,block_n,stages", [(128, 128, 2000, 128, 128, 2), (128, 128, 1500, 128, 64, 3),
                                                          (64, 64, 1000, 64, 64, 2)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_forward_equals_the_one_tile_kernel(b, D, S, block_m, block_n, stages, causal, programs,
                                                       monkeypatch):
    # the same tile computation (_fwd_row) in another program order: bitwise equal, and the
    # reference's. 5 programs: each walks 38-39 tiles, so both Q buffers are reused many
    # times (their release and refill waits run); head 0 has an empty block-row (a tile
    # whose row walks no key block, between tiles that do); batch element 0 all padding
    from tilesparse.kernels import attention_ws_persistent

    if programs is not None:
        monkeypatch.setattr(attention_ws_persistent, "programs", lambda *args: programs)
    dtype = torch.bfloat16
    layout = _rows_with_gaps(S, b)
    q, k, v = make_inputs(3, 4, 2, S, D, dtype, device="cuda")
    kpm = padding(3, S, "all").cuda()
    one = attention_ws.FwdWsConfig(block_m, block_n, stages)
    persistent = attention_ws.FwdWsConfig(block_m, block_n, stages, persistent=True)
    meta = layout.meta_on(q.device, causal)
    outs = [kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, b, causal, D ** -0.5, config=cfg)
            for cfg in (one, persistent)]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    _assert_forward_matches_reference(*outs[1], q, k, v, layout, causal, kpm, "persistent out")


@pytest.mark.parametrize("b,D,S,block_n,stages,consumers", [(128, 128, 2000, 128, 2, 1), (128, 128, 1500, 64, 4, 1),
                                                              (64, 64, 1000, 64, 2, 1), (128, 128, 2000, 128, 2, 2),
                                                              (128, 64, 1300, 64, 3, 2)])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_overlapped_persistent_forward_matches_the_reference(b, D, S, block_n, stages, consumers, overlap, causal,
                                                             monkeypatch):
    # the softmax under the previous tile's P V (K and V in separate rings) and / or two
    # consumer warpgroups with half the rows each: the same operations on O in the same
    # order as the synchronous kernel (add P_0 V_0, rescale, add P_1 V_1, ...), so bitwise
    # equal to it, and the reference's output and lse. 5
    # programs walk many tiles each (rings and Q buffers reused); an empty block-row,
    # single-block rows and padded batch elements
    from tilesparse.kernels import attention_ws_persistent

    if not overlap and consumers == 1:
        pytest.skip("the synchronous one-consumer kernel is the baseline itself")
    monkeypatch.setattr(attention_ws_persistent, "programs", lambda *args: 5)
    dtype = torch.bfloat16
    layout = _rows_with_gaps(S, b, single_block_row=True)
    q, k, v = make_inputs(3, 4, 2, S, D, dtype, device="cuda")
    kpm = padding(3, S, "all").cuda()
    meta = layout.meta_on(q.device, causal)
    cfgs = (attention_ws.FwdWsConfig(128 if b == 128 else 64, block_n, stages, persistent=True),
            attention_ws.FwdWsConfig(128 if b == 128 else 64, block_n, stages, persistent=True, overlap=overlap,
                                     consumers=consumers))
    outs = [kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, b, causal, D ** -0.5, config=cfg)
            for cfg in (*cfgs, cfgs[1])]
    for other in (outs[0], outs[2]):
        assert torch.equal(outs[1][0], other[0]) and torch.equal(outs[1][1], other[1])
    finite = _assert_forward_matches_reference(*outs[1], q, k, v, layout, causal, kpm, "overlapped out")
    assert bool((outs[1][0].cpu()[~finite] == 0).all())


def _bigbird_gqa_case(S, D, kpm_kind):
    """BigBird (blocks of 128) with GQA (4 query heads on 2 kv heads), batch 2, bf16 on the
    GPU: layout, q, k, v, an output gradient and the key padding (or None)."""
    layout = layouts.bigbird(S, 128, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(2, 4, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(torch.bfloat16)
    kpm = padding(2, S, kpm_kind)
    return layout, q, k, v, grad_out, kpm.cuda() if kpm is not None else None


@pytest.mark.parametrize("kpm_kind", [None, "tail"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S,dq_block_n,stages", [(128, 2000, 128, 2), (64, 1000, 64, 3)])
def test_two_consumer_and_overlapped_backward_kernels_equal_the_one_consumer_ones(D, S, dq_block_n, stages, causal,
                                                                                  kpm_kind):
    # dK/dV with two warpgroups of 64 keys, dQ with two of 64 queries (each synchronizing
    # only itself before its ring arrivals): the same products per row and key in the same
    # order, so the gradients are bitwise those of the one-consumer kernels (and the
    # reference's); BigBird with GQA, odd S, key padding
    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, kpm_kind)
    fwd = kernels.attention_config("fwd", b, D, dtype)
    one = (fwd, attention_ws.DkdvWsConfig(64, stages), attention_ws.DqWsConfig(128, dq_block_n, stages))
    two = (fwd, attention_ws.DkdvWsConfig(64, stages, consumers=2),
           attention_ws.DqWsConfig(128, dq_block_n, stages, consumers=2))
    # and with the elementwise work under asynchronous wgmma (overlap): the same again
    overlapped = (fwd, attention_ws.DkdvWsConfig(64, stages, consumers=2, overlap=True),
                  attention_ws.DqWsConfig(128, dq_block_n, stages, consumers=2, overlap=True))
    got_one = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=one)[2]
    got_two = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=two)[2]
    got_overlapped = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=overlapped)[2]
    for name, a, b_, c in zip(("dq", "dk", "dv"), got_two, got_one, got_overlapped):
        assert torch.equal(a, b_) and torch.equal(c, b_), name
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for name, g, want in zip(("dq", "dk", "dv"), got_two, ref_grads):
        assert_close(g, want, dtype, name)


@pytest.mark.parametrize("kpm_kind", [None, "tail"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S", [(128, 2000), (64, 1000)])
def test_dq_kernel_computing_delta(D, S, causal, kpm_kind):
    # DqWsConfig.delta: the dQ kernel computes delta = rowsum(dO · O) and writes it for the
    # dK/dV kernel after it (no delta kernel). Against the reference and the configs that read
    # the delta kernel's; bitwise deterministic; a row's sum takes the same additions for one
    # or two consumers and any tile rows, so those configs give the same bits
    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, kpm_kind)
    fwd = kernels.attention_config("fwd", b, D, dtype)
    dkdv = attention_ws.DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, host_descs=True, balanced=True)
    dq = attention_ws.DqWsConfig(128, 128, 2, consumers=2, overlap=True, host_descs=True, balanced=True)
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out,
                      configs=(fwd, dkdv, dataclasses.replace(dq, delta=True)))[2]
    again = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out,
                        configs=(fwd, dkdv, dataclasses.replace(dq, delta=True)))[2]
    assert all(map(torch.equal, got, again)), "gradients must be bitwise deterministic"
    for other in (attention_ws.DqWsConfig(128, 64, 2, delta=True), attention_ws.DqWsConfig(64, 64, 3, delta=True)):
        got_other = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, other))[2]
        assert all(map(torch.equal, got_other, got)), f"{other}: not the same bits"
    read = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, dq))[2]
    assert all(rel_error(a, r) < 1e-2 for a, r in zip(got, read))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for name, g, want in zip(("dq", "dk", "dv"), got, ref_grads):
        assert_close(g, want, dtype, name)


def test_dq_kernel_delta_matches_the_delta_kernel():
    # the delta it writes: rowsum(dO · O) in fp32, as the delta kernel's to rounding; the
    # buffer poisoned beforehand, nothing written past its end (a row past S of the last
    # head would land there; one of another head would overwrite the next head's row 0)
    from tilesparse.kernels.attention_ws_dq import launch_dq_ws

    S, D, b = 1000, 128, 128
    layout, q, k, v, grad_out, _ = _bigbird_gqa_case(S, D, None)
    meta = layout.meta_on(q.device)
    out, lse = kernels.attention_forward(q, k, v, meta, None, layout.layout_heads, b, False, D ** -0.5)
    want = (out.double() * grad_out.double()).sum(-1)
    poisoned = torch.full((q.shape[0] * q.shape[1] * S + 256,), float("nan"), device="cuda")
    delta = poisoned[:-256].view(*q.shape[:2], S)
    dq = torch.empty_like(q)
    views = kernels.attention_table_views(meta, layout.layout_heads, layout.num_blocks)
    with pytest.raises(ValueError, match="out must be given exactly when delta is set"):
        launch_dq_ws(q, k, v, grad_out, lse, delta, dq, None, views[0], views[2], layout.num_blocks,
                     layout.layout_heads, b, False, False, D ** -0.5, attention_ws.DqWsConfig(128, 128, 2, delta=True))
    launch_dq_ws(q, k, v, grad_out, lse, delta, dq, None, views[0], views[2], layout.num_blocks, layout.layout_heads,
                 b, False, False, D ** -0.5, attention_ws.DqWsConfig(128, 128, 2, delta=True), out=out)
    torch.cuda.synchronize()
    assert torch.isfinite(delta).all()
    assert torch.allclose(delta.double(), want, rtol=1e-5, atol=1e-4)
    assert torch.isnan(poisoned[-256:]).all(), "rows past S written"


@pytest.mark.parametrize("block_m,overlap,consumers", [(128, True, 2), (128, False, 1), (64, False, 1)],
                         ids=["overlap-two-consumers", "sync", "two-row-tiles-per-block"])
@pytest.mark.parametrize("programs", [5, None], ids=["5-programs", "one-per-sm"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_balanced_persistent_forward_equals_the_round_robin(causal, programs, block_m, overlap, consumers,
                                                            monkeypatch):
    # the schedule only moves tiles between programs: each tile is computed as before, so
    # the output is bitwise the round-robin's (per-head BigBird: global rows, rows of
    # different lengths; GQA; key padding)
    from tilesparse.kernels import attention_schedule, attention_ws_persistent

    monkeypatch.setattr(attention_schedule, "ROUND_ROBIN_SLACK", 0.0)  # a schedule however balanced the rows
    if programs is not None:
        monkeypatch.setattr(attention_ws_persistent, "programs", lambda *args: programs)
    dtype, b, D, S = torch.bfloat16, 128, 128, 3000
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=3, seed=_seed(), num_heads=4)
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    kpm = padding(2, S, "tail").cuda()
    meta = layout.meta_on(q.device, causal)
    cfgs = [attention_ws.FwdWsConfig(block_m, block_m, 2, persistent=True, overlap=overlap, consumers=consumers,
                                     balanced=balanced) for balanced in (True, False)]
    outs = [kernels.attention_forward(q, k, v, meta, kpm, layout.layout_heads, b, causal, D ** -0.5, config=cfg)
            for cfg in cfgs]
    kept = meta.__dict__["_persistent_schedules"]  # the balanced launch built (and kept) a schedule, not empty
    assert len(kept) == 1 and next(iter(kept.values())).numel() > 0
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    _assert_forward_matches_reference(*outs[0], q, k, v, layout, causal, kpm, "balanced out")


@pytest.mark.parametrize("kpm_kind", [None, "tail"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S,stages,consumers,overlap", [(128, 2000, 2, 2, False), (128, 1000, 3, 2, True),
                                                          (64, 1000, 2, 1, False), (64, 2000, 2, 2, True)])
def test_dkdv_with_lse_and_delta_in_shared_memory_is_bitwise_the_same(D, S, stages, consumers, overlap, causal,
                                                                      kpm_kind):
    # stats_in_smem only changes where each query tile's lse and delta are read from (a
    # cp.async copy in the ring stage instead of global loads): the gradients are bitwise
    # the same; BigBird with GQA, odd S (the copies zero-fill past S), key padding
    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, kpm_kind)
    fwd = kernels.attention_config("fwd", b, D, dtype)
    dq = kernels.attention_config("dq", b, D, dtype)
    plain = (fwd, attention_ws.DkdvWsConfig(64, stages, consumers=consumers, overlap=overlap), dq)
    stats = (fwd, attention_ws.DkdvWsConfig(64, stages, consumers=consumers, overlap=overlap, stats_in_smem=True), dq)
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=plain)[2]
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=stats)[2]
    for name, a, b_ in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(a, b_), name
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for name, g, w in zip(("dq", "dk", "dv"), got, ref_grads):
        assert_close(g, w, dtype, name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S,consumers", [(128, 2000, 2), (64, 1000, 1)])
def test_backward_with_host_descriptors_is_bitwise_the_same(D, S, consumers, causal):
    # host_descs (dK/dV and dQ kernels) only changes where the TMA descriptors are built
    # (once on the host instead of in every program): the deterministic gradients are
    # bitwise the same; BigBird with GQA, odd S, key padding
    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, "tail")
    fwd = kernels.attention_config("fwd", b, D, dtype)
    device = attention_ws.DkdvWsConfig(64, 2, consumers=consumers, stats_in_smem=True)
    dq_ws = attention_ws.DqWsConfig(128, 128, 2, consumers=consumers, overlap=consumers == 2)
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, device, dq_ws))[2]
    host = (fwd, dataclasses.replace(device, host_descs=True), dataclasses.replace(dq_ws, host_descs=True))
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=host)[2]
    for name, a, b_ in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(a, b_), name


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S,consumers", [(128, 2000, 2), (64, 1000, 1)])
@pytest.mark.parametrize("balanced", [False, True], ids=["round_robin", "scheduled"])
def test_persistent_dkdv_is_bitwise_the_same(D, S, consumers, causal, balanced, monkeypatch):
    # persistent: a program per SM takes (key block, batch * kv head) items in turn, the
    # ring positions carried across items and K / V reloaded once the consumers release
    # them; the same products in the same order per item, so bitwise the same gradients.
    # BigBird with GQA, odd S, key padding: 16 (S 2000) or 8 (S 1000) key blocks x 2 batch x
    # 2 kv heads items, on every SM (at most one item each), then on 3 programs (~11-22 each).
    # balanced: each program takes its share of the host's balanced schedule (forced where the
    # round-robin would do: ROUND_ROBIN_SLACK 0; checked used)
    from tilesparse.kernels import attention_launch_order, attention_schedule, attention_ws_dkdv

    monkeypatch.setattr(attention_schedule, "ROUND_ROBIN_SLACK", 0.0)
    used = []

    def spy(*args, **kwargs):
        used.append(attention_launch_order.persistent_items(*args, **kwargs))
        return used[-1]

    monkeypatch.setattr(attention_ws_dkdv, "persistent_items", spy)

    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, "tail")
    fwd = kernels.attention_config("fwd", b, D, dtype)
    dq = kernels.attention_config("dq", b, D, dtype)
    plain = attention_ws.DkdvWsConfig(64, 2, consumers=consumers, stats_in_smem=True)
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, plain, dq))[2]
    persistent = (fwd, dataclasses.replace(plain, persistent=True, balanced=balanced), dq)
    for programs in (None, 3):
        if programs is not None:
            monkeypatch.setattr(attention_ws_dkdv, "sm_count", lambda device: programs)
        got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=persistent)[2]
        for name, a, b_ in zip(("dq", "dk", "dv"), got, want):
            assert torch.equal(a, b_), f"{name} ({programs or 'every SM'} programs)"
    assert (len(used) == 2 and all(t is not None for t in used)) == balanced


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,S", [(128, 2000), (64, 1000)])
def test_balanced_launch_order_is_bitwise_the_same(D, S, causal, monkeypatch):
    # balanced: the dK/dV and dQ programs launch in the host's order (long columns / rows
    # first), each computing what its grid position would: bitwise the same deterministic
    # gradients as the grid order, and with deterministic=False bitwise the same dK / dV
    # (dQ's adds land in any order: close). The shipped configs, with balanced off for the
    # reference; the table forced (MIN_MODELLED_GAIN 0) and checked to be used.
    # BigBird with GQA, odd S, key padding.
    from tilesparse.kernels import attention_launch_order, attention_ws_dkdv, attention_ws_dq

    monkeypatch.setattr(attention_launch_order, "MIN_MODELLED_GAIN", 0.0)
    used = []
    for module in (attention_ws_dkdv, attention_ws_dq):
        monkeypatch.setattr(module, "launch_order",
                            lambda *a, real=module.launch_order, **kw: used.append(real(*a, **kw)) or used[-1])
    dtype, b = torch.bfloat16, 128
    layout, q, k, v, grad_out, kpm = _bigbird_gqa_case(S, D, "tail")
    fwd = kernels.attention_config("fwd", b, D, dtype)
    dkdv, dq_ws = (dataclasses.replace(attention_ws._WS_DEFAULTS[(kind, b, D)], balanced=False)
                   for kind in ("dkdv", "dq"))
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, dq_ws))[2]
    assert not used
    balanced = (fwd, dataclasses.replace(dkdv, balanced=True), dataclasses.replace(dq_ws, balanced=True))
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=balanced)[2]
    for name, a, b_ in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(a, b_), name
    assert len(used) == 2 and all(order is not None for order in used)
    atomic = dataclasses.replace(dkdv, atomic_dq=True,
                                 **dict(attention_ws._ATOMIC_DQ_DEFAULTS[("dkdv", b, D)], balanced=False))
    dq_triton = kernels.attention_config("dq", b, D, dtype)
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, atomic, dq_triton),
                       deterministic=False)[2]
    assert len(used) == 2
    for _ in range(3):
        got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out,
                          configs=(fwd, dataclasses.replace(atomic, balanced=True), dq_triton), deterministic=False)[2]
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "dK / dV must be bitwise the same"
        assert rel_error(got[0], want[0]) < 1e-2
    assert len(used) == 5 and used[-1] is not None
