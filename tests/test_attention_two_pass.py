"""The two-pass dK/dV kernel (``AttentionConfig.two_pass``, opt-in): each key tile's
column walked twice, dV then dK, so that one fp32 accumulator is live at a time. The
interpreter checks it gives the single pass's bits; a GPU-marked test checks it against
the float64 reference at the measured configs' shape (b 128, D 128, bf16). The kernel
cases of tests/test_attention.py also run it against the reference."""

import pytest
import torch

from attention_cases import _seed, interpreter, make_inputs, padding, reference_with_grads, run_kernels
from tilesparse.attention import layouts
from tilesparse.kernels import attention as kernels
from tolerances import assert_close, rel_error


@interpreter
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic_dq"])
def test_two_pass_gives_the_single_pass_bitwise(deterministic):
    """The two-pass dK/dV walk sums the same terms in the same order as the single pass
    (the interpreter's arithmetic is the same op for op): dK and dV bitwise equal, and
    dQ too where the dQ kernel computes it. GQA, causal, padding, split tiles."""
    layout = layouts.bigbird(96, 32, window_blocks=2, global_blocks=1, random_blocks=1, seed=_seed())
    q, k, v = make_inputs(1, 4, 2, 96, 32, torch.float16)
    grad_out = torch.randn(1, 4, 96, 32).to(torch.float16)
    kpm = padding(1, 96, "tail")
    single, two = (kernels.AttentionConfig(16, 32, two_pass=flag) for flag in (False, True))
    plain = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out, configs=(single, single, single),
                        deterministic=deterministic)
    split = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out, configs=(single, two, single),
                        deterministic=deterministic)
    assert torch.equal(plain[2][1], split[2][1]) and torch.equal(plain[2][2], split[2][2])
    if deterministic:
        assert torch.equal(plain[2][0], split[2][0])
    again = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out, configs=(single, two, single),
                        deterministic=deterministic)
    first = 0 if deterministic else 1  # (atomic dQ: bits depend on the order the adds land in)
    for a, b in zip(split[2][first:], again[2][first:]):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,warps,maxnreg,causal", [
    (64, 128, 8, None, True), (64, 128, 8, None, False), (128, 128, 8, None, True), (64, 64, 4, None, False),
    (64, 64, 8, 128, True)])
def test_gpu_two_pass_dkdv_matches_reference(block_m, block_n, warps, maxnreg, causal):
    """The two-pass dK/dV kernel (AttentionConfig.two_pass) on the GPU at b 128, D 128,
    bf16 (the measured configs' shape), one with a register cap (maxnreg): GQA, odd S,
    padding; against the reference, the single pass and itself (bitwise deterministic)."""
    b, D, S, dtype = 128, 128, 2000, torch.bfloat16
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda")
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, "tail").cuda()
    fwd, dkdv, dq = (kernels.attention_config(kind, b, D, dtype) for kind in ("fwd", "dkdv", "dq"))
    two = kernels.AttentionConfig(block_m, block_n, warps, 2, tma=True, two_pass=True, maxnreg=maxnreg)
    got = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, two, dq))
    again = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, two, dq))
    single = run_kernels(q, k, v, layout, causal, kpm, D ** -0.5, grad_out, configs=(fwd, dkdv, dq))
    assert all(torch.equal(a, b_) for a, b_ in zip(got[2], again[2])), "gradients must be bitwise deterministic"
    assert all(rel_error(a, s) < 1e-2 for a, s in zip(got[2], single[2]))
    _, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                           scale=D ** -0.5, key_padding_mask=kpm.cpu())
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)
