"""The Hopper warp-specialized dK/dV kernel's atomic-dQ mode (``DkdvWsConfig(atomic_dq=True)``,
``deterministic=False``: each pair's dQ share added by TMA reductions from shared memory,
no dQ kernel) on CUDA: against the float64 reference and the deterministic kernels.
Marked ``gpu``; skipped on GPUs other than sm90."""

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


def _variant(name) -> dict:
    """DkdvWsConfig options of a named variant: "fa3" (FlashAttention-3's order at its
    register split), "staged" (dK and dV stored through the staging tiles), "host"
    (host-built descriptors), "persistent" (items in turn), joined by "+"; anything else
    (the overlap flag's False / True): none."""
    names = name.split("+") if isinstance(name, str) else ()
    return {**(dict(fa3_order=True, mma_regs=240, load_regs=24) if "fa3" in names else {}),
            **(dict(staged_stores=True) if "staged" in names else {}),
            **(dict(host_descs=True) if "host" in names else {}),
            **(dict(persistent=True) if "persistent" in names else {})}


@pytest.mark.parametrize("kpm_kind", [None, "tail", "all"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,D,S,consumers,stages,overlap,stats,per_head,shared_ds", [
    (128, 128, 2000, 2, 2, False, True, False, False), (128, 128, 1024, 2, 2, True, False, True, False),
    (128, 128, 1050, 2, 2, False, True, False, False), (128, 64, 1000, 2, 2, True, False, False, False),
    (128, 64, 1000, 2, 3, False, True, True, False), (64, 64, 1000, 1, 2, False, False, False, False),
    (64, 128, 777, 1, 2, False, False, True, False),
    # the two consumers sharing each dSᵀ tile, each adding half of dQ's columns
    (128, 128, 2000, 2, 2, False, True, True, True), (128, 128, 1050, 2, 2, True, False, False, True),
    (128, 64, 1000, 2, 2, True, True, False, True),
    # overlap "fa3": FlashAttention-3's order of the shared-dS tile (every wgmma asynchronous), 240 / 24 registers;
    # "staged": dK and dV stored through the staging tiles (at S 1050 and 1000 the last key block is partial)
    (128, 128, 2000, 2, 2, "fa3", True, True, True), (128, 128, 1050, 2, 2, "fa3+staged", False, False, True),
    (128, 64, 1000, 2, 2, "fa3+staged", True, False, True), (128, 128, 1050, 2, 2, "staged", True, False, False),
    (64, 64, 1000, 1, 2, "staged", False, True, False),
    # "persistent": a program per SM taking (key block, batch * kv head) items in turn
    (128, 128, 2000, 2, 2, "persistent", True, True, True), (128, 64, 1000, 2, 2, "persistent", True, False, False),
    (64, 64, 1000, 1, 2, "staged+persistent", False, True, False)])
def test_atomic_dq_matches_the_reference_and_the_deterministic_kernels(b, D, S, consumers, stages, overlap, stats,
                                                                       per_head, shared_ds, causal, kpm_kind):
    # BigBird (window, global, random blocks; per head or shared), GQA (4 query heads on 2 kv
    # heads), odd S (the last block partial: the TMA drops its dQ rows past S; at S 1050 a
    # whole 64-row query tile lies past S), key padding (with "all", empty rows: dQ exactly 0)
    dtype = torch.bfloat16
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed(),
                             num_heads=4 if per_head else None)
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, kpm_kind)
    kpm = kpm.cuda() if kpm is not None else None
    fwd, dq = (kernels.attention_config(kind, b, D, dtype) for kind in ("fwd", "dq"))
    options = dict(consumers=consumers, overlap=overlap is True, stats_in_smem=stats)
    ws = attention_ws.DkdvWsConfig(64, stages, atomic_dq=True, shared_ds=shared_ds, **options, **_variant(overlap))
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, ws, dq), deterministic=False)
    exact = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out,
                        configs=(fwd, attention_ws.DkdvWsConfig(64, stages, **options), dq))
    # the same sums in another order (the walk is rotated per key block, and dQ's shares add as they land)
    assert all(rel_error(a, t) < 1e-2 for a, t in zip(got[2], exact[2]))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=None if kpm is None else kpm.cpu())
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)
    if kpm_kind == "all":  # batch element 0: every row empty, nothing added
        assert torch.count_nonzero(got[2][0][0]) == 0


@pytest.mark.parametrize("dtype,H,S,window,seq_major,causal", [
    # H 1 (Triton makes an argument equal to 1 a compile-time constant: the descriptor's
    # strides come from the host)
    (torch.bfloat16, 1, 640, 256, False, False),
    # [B, S, H, D] views (seq-major) and fp16, a causal local window on one layout for all heads
    (torch.float16, 4, 1536, 256, True, True)], ids=["one-head", "fp16-seq-major"])
@pytest.mark.parametrize("shared_ds,variant", [(False, ""), (True, ""), (True, "fa3+staged"), (False, "host"),
                                               (True, "fa3+staged+host")],
                         ids=["own-shares", "shared-ds", "shared-ds-fa3-order-staged", "own-shares-host-descs",
                              "shared-ds-fa3-order-staged-host-descs"])
def test_atomic_dq_one_head_and_strided_fp16(dtype, H, S, window, seq_major, causal, shared_ds, variant):
    b, D = 128, 128
    layout = layouts.local(S, b, window=window)
    q, k, v = make_inputs(1, H, H, S, D, dtype, device="cuda", seq_major=seq_major)
    grad_out = torch.randn(1, H, S, D, device="cuda").to(dtype)
    fwd, dq = (kernels.attention_config(kind, b, D, dtype) for kind in ("fwd", "dq"))
    ws = attention_ws.DkdvWsConfig(64, 2, consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=shared_ds,
                                   **_variant(variant))
    got = run_kernels(q, k, v, layout, causal, None, D ** -0.5, grad_out, configs=(fwd, ws, dq), deterministic=False)
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5)
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["fa3", "staged", "fa3+staged", "host", "fa3+staged+host", "persistent",
                                     "fa3+staged+host+persistent"])
def test_fa3_order_and_staged_stores_leave_dk_dv_bitwise_the_same(variant, causal, monkeypatch):
    # the same products in the same order per tile (FlashAttention-3's order only moves the
    # waits; staged stores only the path to global memory; host descriptors only where the
    # descriptors are built; persistent programs only which program takes a key block):
    # dK and dV bitwise those of the shared-dS kernel, over repeated runs (an intermittent
    # race would show); dQ's adds land in any order, so dQ only close. Persistent: 36 items
    # (9 key blocks x 2 batch x 2 kv heads) on 3 and on 2 programs, so that the state
    # carried from item to item (ring, dS and staging positions, K / V reloads) is exercised
    from tilesparse.kernels import attention_ws_dkdv

    b, D, S = 128, 128, 1050
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(2, 4, 2, S, D, torch.bfloat16, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(torch.bfloat16)
    fwd, dq = (kernels.attention_config(kind, b, D, torch.bfloat16) for kind in ("fwd", "dq"))
    shared = dict(consumers=2, stats_in_smem=True, atomic_dq=True, shared_ds=True)
    want = run_kernels(q, k, v, layout, causal, None, D ** -0.5, grad_out,
                       configs=(fwd, attention_ws.DkdvWsConfig(64, 2, **shared), dq), deterministic=False)[2]
    other = attention_ws.DkdvWsConfig(64, 2, **shared, **_variant(variant))
    for run in range(10):
        if other.persistent:
            monkeypatch.setattr(attention_ws_dkdv, "sm_count", lambda device, n=3 - run % 2: n)
        got = run_kernels(q, k, v, layout, causal, None, D ** -0.5, grad_out, configs=(fwd, other, dq),
                          deterministic=False)[2]
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "dK / dV must be bitwise the same"
        assert rel_error(got[0], want[0]) < 1e-2
