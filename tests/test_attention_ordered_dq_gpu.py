"""The deterministic 5-product backward (``DkdvWsConfig.ordered_dq``): the warp-specialized
dK/dV kernel adds each block pair's dQ share by a TMA reduction, each query tile's shares
in a fixed order behind semaphores. On CUDA: bitwise the same gradients run to run,
against the float64 reference and the other kernels; refused where the order would make
programs wait. Marked ``gpu``; skipped on GPUs other than sm90."""

import dataclasses

import pytest
import torch

from attention_cases import _seed, make_inputs, padding, reference_with_grads, run_kernels
from tilesparse.attention import layouts
from tilesparse.kernels import attention as kernels
from tilesparse.kernels import attention_ws
from tolerances import assert_close, rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
    reason="the Gluon kernel is written for sm90")]

_ORDERED = attention_ws.DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=True,
                                     fa3_order=True, mma_regs=240, load_regs=24, host_descs=True, ordered_dq=True)


def _empty_row_layout(S):
    """A 512-wide window with query block 3 emptied."""
    from tilesparse.attention import AttentionLayout

    mask = layouts.local(S, 128, 512).mask[0].clone()
    mask[3] = False
    return AttentionLayout(mask[None], 128, seq_len=S)


def _layout(name, S):
    return {"local": lambda: layouts.local(S, 128, 512),
            "empty-row": lambda: _empty_row_layout(S),
            "local-causal": lambda: layouts.local(S, 128, 512, causal=True),
            "causal": lambda: layouts.causal(S, 128),
            "strided": lambda: layouts.strided(S, 128, 256),
            "fixed": lambda: layouts.fixed(S, 128, 512)}[name]()


def _gqa_case(name, S, D, kpm_kind):
    """(layout, q, k, v, grad_out, key padding): 2 batches, 4 query heads on 2 kv heads, bf16."""
    q, k, v = make_inputs(2, 4, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(torch.bfloat16)
    kpm = padding(2, S, kpm_kind)
    return _layout(name, S), q, k, v, grad_out, kpm.cuda() if kpm is not None else None


@pytest.mark.parametrize("kpm_kind", [None, "tail"])
@pytest.mark.parametrize("name,causal,D,S,fa3", [
    ("local", False, 128, 2000, True), ("local-causal", True, 128, 1050, True), ("causal", True, 128, 2000, True),
    ("strided", True, 128, 1000, False), ("fixed", True, 64, 1500, True), ("local", False, 64, 777, False)])
def test_ordered_dq_is_bitwise_reproducible_and_matches_the_reference(name, causal, D, S, fa3, kpm_kind):
    # GQA (4 query heads on 2 kv heads), odd S (at 1050 a whole 64-row query tile lies past
    # S), key padding; FlashAttention-3's order or the plain shared-dS mode
    dtype = torch.bfloat16
    layout, q, k, v, grad_out, kpm = _gqa_case(name, S, D, kpm_kind)
    cfg = _ORDERED if fa3 else dataclasses.replace(_ORDERED, fa3_order=False, mma_regs=232, load_regs=40)
    fwd = kernels.attention_config("fwd", 128, D, dtype)
    dq_cfg = kernels.attention_config("dq", 128, D, dtype)
    runs = [run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, cfg, dq_cfg))[2]
            for _ in range(4)]
    for again in runs[1:]:
        assert all(map(torch.equal, again, runs[0])), "ordered dQ adds must give the same bits every run"
    two_kernels = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out)[2]
    assert all(rel_error(a, t) < 1e-2 for a, t in zip(runs[0], two_kernels))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for grad_name, g, want in zip(("dq", "dk", "dv"), runs[0], ref_grads):
        assert_close(g, want, dtype, grad_name)


def test_ordered_dq_refuses_layouts_whose_order_would_wait():
    # BigBird's global rows: every key block adds into them, each after the one before it
    # in a chain no program reaches early; the launcher says so instead of running slowly
    S, D = 1024, 128
    layout = layouts.bigbird(S, 128, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed())
    q, k, v = make_inputs(1, 2, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn_like(q)
    fwd = kernels.attention_config("fwd", 128, D, torch.bfloat16)
    with pytest.raises(ValueError, match="cannot be ordered cheaply"):
        run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out,
                    configs=(fwd, _ORDERED, kernels.attention_config("dq", 128, D, torch.bfloat16)))


def test_ordered_dq_with_more_programs_than_sms():
    # 512 programs (64 key blocks x 2 batches x 4 kv heads) on 132 SMs: programs wait on
    # shares of programs that finished long before or run beside them, never on one not
    # yet started (the launch order); bitwise the same over runs, close to the two kernels
    S, D = 8192, 128
    layout = layouts.causal(S, 128)
    q, k, v = make_inputs(2, 8, 4, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn_like(q)
    fwd = kernels.attention_config("fwd", 128, D, torch.bfloat16)
    configs = (fwd, _ORDERED, kernels.attention_config("dq", 128, D, torch.bfloat16))
    runs = [run_kernels(q, k, v, layout, True, None, D ** -0.5, grad_out, configs=configs)[2] for _ in range(3)]
    for again in runs[1:]:
        assert all(map(torch.equal, again, runs[0]))
    two_kernels = run_kernels(q, k, v, layout, True, None, D ** -0.5, grad_out)[2]
    assert all(rel_error(a, t) < 1e-2 for a, t in zip(runs[0], two_kernels))


def _recorded_dkdv_configs(monkeypatch):
    """The dK/dV configs the backward launches, recorded."""
    seen = []
    real = attention_ws.launch_dkdv_ws
    monkeypatch.setattr(attention_ws, "launch_dkdv_ws", lambda *a, **kw: seen.append(a[17]) or real(*a, **kw))
    return seen


@pytest.mark.parametrize("name,causal,S,kpm_kind", [("local", False, 2000, "tail"), ("causal", True, 1050, None),
                                                    ("strided", True, 2000, "tail")])
def test_deterministic_default_orders_dq_where_the_layout_takes_it(name, causal, S, kpm_kind, monkeypatch):
    # D 128 on Hopper, no configs: the deterministic backward runs the ordered mode (one
    # dK/dV kernel, no dQ kernel) on local, causal and strided layouts; the same bits every
    # run, and the reference's gradients (GQA, odd S, key padding)
    seen = _recorded_dkdv_configs(monkeypatch)
    D, dtype = 128, torch.bfloat16
    layout, q, k, v, grad_out, kpm = _gqa_case(name, S, D, kpm_kind)
    runs = [run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out)[2] for _ in range(3)]
    assert seen and all(cfg.ordered_dq for cfg in seen)
    for again in runs[1:]:
        assert all(map(torch.equal, again, runs[0]))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for grad_name, g, want in zip(("dq", "dk", "dv"), runs[0], ref_grads):
        assert_close(g, want, dtype, grad_name)


@pytest.mark.parametrize("case", ["fixed-skewed", "bigbird", "d64"])
def test_deterministic_default_keeps_two_kernels_elsewhere(case, monkeypatch):
    # a column skew above the cut (the fixed pattern's summary columns), an order that would
    # wait (BigBird), D 64 (measured slower ordered): the two-kernel backward
    seen = _recorded_dkdv_configs(monkeypatch)
    D = 64 if case == "d64" else 128
    S = 4096 if case == "fixed-skewed" else 1024
    layout = {"fixed-skewed": lambda: layouts.fixed(S, 128, 512),
              "bigbird": lambda: layouts.bigbird(S, 128, window_blocks=3, global_blocks=1, random_blocks=1,
                                                 seed=_seed()),
              "d64": lambda: layouts.local(S, 128, 512)}[case]()
    q, k, v = make_inputs(1, 2, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn_like(q)
    run_kernels(q, k, v, layout, case == "fixed-skewed", None, D ** -0.5, grad_out)
    assert seen and not any(cfg.ordered_dq for cfg in seen)


def test_deterministic_default_ordered_in_a_cuda_graph(monkeypatch):
    # warmed eagerly (the order's tables built), then captured: the graph runs the ordered
    # mode too and replays the eager bits
    seen = _recorded_dkdv_configs(monkeypatch)
    S, D = 2000, 128
    layout = layouts.local(S, 128, 512)
    q, k, v = make_inputs(1, 4, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn_like(q)
    want = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out)[2]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out)[2]
    for t in got:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(map(torch.equal, got, want))
    assert len(seen) == 2 and all(cfg.ordered_dq for cfg in seen)


def test_deterministic_default_ordered_on_seq_major_inputs(monkeypatch):
    # q, k, v and dO as [B, S, H, D] memory seen as [B, H, S, D] (a GPT block's views): the
    # same descriptors' strides as the two kernels'; the same bits as contiguous copies
    seen = _recorded_dkdv_configs(monkeypatch)
    S, D = 1000, 128
    layout = layouts.local(S, 128, 512)
    q, k, v = make_inputs(2, 4, 2, S, D, torch.bfloat16, seq_major=True, device="cuda")
    grad_out = torch.randn(2, S, 4, D, device="cuda").to(torch.bfloat16).transpose(1, 2)
    got = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out)[2]
    want = run_kernels(*(t.contiguous() for t in (q, k, v)), layout, False, None, D ** -0.5,
                       grad_out.contiguous())[2]
    assert seen and all(cfg.ordered_dq for cfg in seen)
    assert all(map(torch.equal, got, want))


@pytest.mark.parametrize("name", ["local", "empty-row"])
def test_deterministic_default_ordered_in_fp16(name, monkeypatch):
    # fp16 takes the ordered default (first share stored; with an empty query block dQ's
    # buffer is zeroed instead): the bits of the explicit ordered config without the store
    seen = _recorded_dkdv_configs(monkeypatch)
    S, D, dtype = 1000, 128, torch.float16
    layout = _layout(name, S)
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    got = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out)[2]
    assert seen and all(cfg.ordered_dq and cfg.first_share_stored for cfg in seen)
    configs = (kernels.attention_config("fwd", 128, D, dtype), _ORDERED, kernels.attention_config("dq", 128, D, dtype))
    want = run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out, configs=configs)[2]
    assert all(map(torch.equal, got, want))


@pytest.mark.parametrize("case", ["per-head", "fp16"])
def test_ordered_dq_on_per_head_layouts_and_fp16(case):
    # per-head windows of 1-3 blocks with GQA (which the default does not take: not timed),
    # and fp16, with the explicit config; bitwise reproducible and the reference's gradients
    from tilesparse.attention import AttentionLayout

    S, D = 1000, 128
    dtype = torch.float16 if case == "fp16" else torch.bfloat16
    if case == "per-head":
        layout = AttentionLayout(torch.stack([layouts.local(S, 128, 128 * w).mask[0] for w in (1, 2, 3, 2)]), 128,
                                 seq_len=S)
    else:
        layout = layouts.local(S, 128, 512)
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    configs = (kernels.attention_config("fwd", 128, D, dtype), _ORDERED, kernels.attention_config("dq", 128, D, dtype))
    runs = [run_kernels(q, k, v, layout, False, None, D ** -0.5, grad_out, configs=configs)[2] for _ in range(3)]
    for again in runs[1:]:
        assert all(map(torch.equal, again, runs[0]))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), scale=D ** -0.5)
    for grad_name, g, want in zip(("dq", "dk", "dv"), runs[0], ref_grads):
        assert_close(g, want, dtype, grad_name)


@pytest.mark.parametrize("option,name,causal,S,kpm_kind", [
    ("staged_stores", "local", False, 2000, "tail"), ("staged_stores", "causal", True, 1050, None),
    ("first_share_stored", "local", False, 2000, "tail"), ("first_share_stored", "causal", True, 1050, None),
    ("first_share_stored", "empty-row", False, 1000, None),
    ("last_share_uncounted", "local", False, 2000, "tail"), ("last_share_uncounted", "causal", True, 1050, None),
    ("last_share_uncounted", "strided", True, 2000, None), ("last_share_uncounted", "empty-row", False, 1000, None),
    ("shipped+last_share_uncounted", "local", False, 2000, "tail"),
    ("shipped+last_share_uncounted", "causal", True, 1050, None),
    ("staged+last_share_uncounted", "local", False, 2000, "tail"),
    ("staged+last_share_uncounted", "empty-row", False, 1000, None)])
def test_ordered_dq_options_give_the_same_bits(option, name, causal, S, kpm_kind):
    # staged_stores: dK and dV leave through the staging tiles once the dQ writer has freed
    # them, the same values as the direct stores. first_share_stored: each query tile's
    # rank-0 share stored by a TMA copy into an unzeroed (under the tests' poison: NaN)
    # buffer, the rest added after it, the same values as the adds onto zeros (0 + x = x); a
    # layout with an empty query block keeps the zeroed buffer (its rows get no share).
    # last_share_uncounted: each row's last share added but not counted (nothing waits for
    # it); "shipped+": on the shipped ordered default (first share stored, ring stores),
    # "staged+": with staged_stores (dK / dV through the staging tiles the writer frees).
    # Against the plain ordered mode, every run (GQA, odd S, padding)
    D, dtype = 128, torch.bfloat16
    layout, q, k, v, grad_out, kpm = _gqa_case(name, S, D, kpm_kind)
    fwd = kernels.attention_config("fwd", 128, D, dtype)
    dq_cfg = kernels.attention_config("dq", 128, D, dtype)
    want = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, _ORDERED, dq_cfg))[2]
    base, option = option.split("+") if "+" in option else ("", option)
    cfg = dataclasses.replace({"shipped": attention_ws._ORDERED_DQ_CONFIG,
                               "staged": dataclasses.replace(_ORDERED, staged_stores=True)}.get(base, _ORDERED),
                              **{option: True})
    for _ in range(3):
        got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, cfg, dq_cfg))[2]
        assert all(map(torch.equal, got, want))


@pytest.mark.parametrize("uncounted", [False, True])
@pytest.mark.parametrize("name,causal,S,kpm_kind", [("local", False, 2000, "tail"), ("causal", True, 1050, None),
                                                    ("empty-row", False, 1000, None)])
def test_ordered_dq_counters_end_at_the_shares_counted(monkeypatch, uncounted, name, causal, S, kpm_kind):
    # every (batch * head, 64-row query tile, consumer) counter ends at its row's shares, and
    # with last_share_uncounted at one less (a row's last is not counted): the option takes
    # effect (its gradients are bitwise those of the counted run, above)
    from tilesparse.attention.layout import attention_table_views
    from tilesparse.kernels import attention_ws_dkdv

    made = []

    def recorded(n, device):
        made.append(torch.zeros(n, dtype=torch.int32, device=device))
        return made[-1]

    monkeypatch.setattr(attention_ws_dkdv, "semaphores", recorded)
    D, dtype = 128, torch.bfloat16
    layout, q, k, v, grad_out, kpm = _gqa_case(name, S, D, kpm_kind)
    cfg = dataclasses.replace(attention_ws._ORDERED_DQ_CONFIG, last_share_uncounted=uncounted)
    configs = (kernels.attention_config("fwd", 128, D, dtype), cfg, kernels.attention_config("dq", 128, D, dtype))
    run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=configs)
    torch.cuda.synchronize()
    assert len(made) == 1
    B, H, nb = q.shape[0], q.shape[1], layout.num_blocks
    row_ptr = attention_table_views(layout.meta_on(q.device, causal), layout.layout_heads, nb)[0].long()
    shares = (row_ptr[1:] - row_ptr[:-1]).view(layout.layout_heads, nb)
    counted = (shares - 1).clamp_min(0) if uncounted else shares
    heads = torch.arange(H, device=q.device) % layout.layout_heads
    want = counted[heads].repeat_interleave(2, dim=1)[None, :, :, None].expand(B, H, 2 * nb, 2)
    assert torch.equal(made[0].view(B, H, 2 * nb, 2), want.to(torch.int32))
