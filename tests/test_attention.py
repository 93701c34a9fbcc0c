"""Fused block-sparse attention: the Triton kernels (tilesparse.kernels.attention, called
directly on CPU tensors so they run under TRITON_INTERPRET=1), the registered op's CPU
path and autograd, input errors, and GPU-marked cases (the ops, the eager path and
torch.compile: test_attention_ops.py).

Every numeric check is against ``attention_reference``: dense-masked attention in float64
(itself checked against a per-element loop below). Errors are relative Frobenius norms
with the per-dtype tolerances of tests/tolerances.py. TILESPARSE_POISON=1 (conftest)
makes every kernel output start as NaN, so an element a kernel forgets to write fails
the finiteness check in ``assert_close``.

Interpreter dtypes: fp32 and fp16 only (triton 3.6's interpreter gets tl.dot on bf16
wrong); bf16 runs in the GPU-marked tests.
"""

import dataclasses

import pytest
import torch

from attention_cases import _seed, check_case, interpreter, make_inputs, padding, reference_with_grads, run_kernels
from tilesparse.attention import AttentionLayout, block_sparse_attention, layouts
from tilesparse.attention.reference import attention_reference
from tilesparse.kernels import attention as kernels
from tolerances import assert_close, rel_error

# torch's own inductor import path warns about torch.jit.script_method; not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


# --------------------------------------------------------------------------- the reference


def test_reference_matches_per_element_loop():
    # The float64 reference against the definition, one query at a time, on a per-head
    # layout with GQA, causality, padding and an empty row.
    S, b, H, Hkv, D = 20, 16, 2, 1, 8
    mask = torch.tensor([[[1, 0], [1, 1]], [[0, 0], [0, 1]]], dtype=torch.bool)  # head 1: block row 0 empty
    layout = AttentionLayout(mask, b, S)
    q, k, v = (torch.randn(1, h, S, D, dtype=torch.float64) for h in (H, Hkv, Hkv))
    kpm = torch.zeros(1, S, dtype=torch.bool)
    kpm[0, 3] = True
    got = attention_reference(q, k, v, layout, causal=True, key_padding_mask=kpm, scale=0.3)
    want = torch.zeros_like(got)
    for h in range(H):
        for i in range(S):
            keys = [j for j in range(S) if mask[h, i // b, j // b] and j <= i and not kpm[0, j]]
            if keys:
                s = torch.stack([q[0, h, i] @ k[0, 0, j] * 0.3 for j in keys])
                want[0, h, i] = torch.softmax(s, 0) @ v[0, 0, keys]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert bool((got[0, 1, :16] == 0).all())


# --------------------------------------------------------------------------- kernels (interpreter)
# The grid covers every builder once, each with something that can break it: causal and
# not, key padding (tail and whole-sequence), GQA (H = 2 or 4 per kv head), per-head
# layouts, S not a multiple of b, empty rows, empty and full layouts, non-power-of-two
# D (48: D_TILE 64, like 96 -> 128 on the GPU), b = 16 and 32 with one case each of b = 64
# and 128, and
# tiles smaller than b (BLOCK_M = BLOCK_N = 16 at b = 32). Sizes are tiny because the
# interpreter runs each program in Python; B * H <= 4.


def _empty_row_layout():
    mask = torch.rand(5, 5) < 0.6
    mask[2, :] = False  # block row 2 is empty: its queries output zeros
    mask[0, 0] = True
    return AttentionLayout(mask, 16, 70)


def _two_pass_configs(block_m, block_n, tma=False, maxnreg=None):
    """(fwd, dkdv, dq) configs with the two-pass dK/dV kernel (maxnreg: the GPU's register
    cap, which the interpreter ignores; here it must pass through the launchers)."""
    plain = kernels.AttentionConfig(block_m, block_n, tma=tma)
    return plain, dataclasses.replace(plain, two_pass=True, maxnreg=maxnreg), plain


KERNEL_CASES = {
    # id: (layout factory, B, H, Hkv, D, dtype, causal, padding, extra kwargs)
    "causal_b16_fp32": (lambda: layouts.causal(80, 16), 2, 2, 2, 32, torch.float32, True, None, {}),
    "local_causal_gqa_oddS_fp16": (lambda: layouts.local(75, 16, 24, causal=True), 1, 4, 2, 32, torch.float16,
                                   True, None, {}),
    "strided_pad_fp32": (lambda: layouts.strided(96, 16, 32), 2, 2, 1, 32, torch.float32, True, "tail", {}),
    "fixed_fp16": (lambda: layouts.fixed(96, 16, 32), 1, 2, 2, 32, torch.float16, True, None, {}),
    "bigbird_perhead_gqa_oddS_b32_fp32": (
        lambda: layouts.bigbird(100, 32, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(),
                                num_heads=2), 2, 2, 1, 32, torch.float32, False, "tail", {}),
    "longformer_fp16": (lambda: layouts.longformer(64, 16, window=24, global_tokens=[0, 40]), 2, 2, 2, 32,
                        torch.float16, False, None, {"scale": 0.2}),
    "random_b32_D64_seqmajor_fp32": (lambda: layouts.random(128, 32, 0.5, _seed()), 1, 2, 1, 64, torch.float32,
                                     False, None, {"seq_major": True}),
    "empty_rows_allpad_fp32": (_empty_row_layout, 2, 1, 1, 32, torch.float32, False, "all", {}),
    "empty_layout_fp16": (lambda: layouts.random(48, 16, 0.0), 1, 2, 1, 32, torch.float16, False, None, {}),
    "full_b64_oddS_causal_fp32": (lambda: layouts.random(100, 64, 1.0), 1, 2, 2, 32, torch.float32, True, "tail",
                                  {}),
    "full_b128_oddS_fp16": (lambda: layouts.random(130, 128, 1.0), 1, 1, 1, 32, torch.float16, False, None, {}),
    "D48_causal_fp16": (lambda: layouts.local(64, 16, 32), 1, 2, 1, 48, torch.float16, True, None, {}),
    "split_tiles_b32_fp32": (lambda: layouts.random(96, 32, 0.6, _seed(), num_heads=2), 1, 2, 1, 32,
                             torch.float32, True, "tail", {"configs": (kernels.AttentionConfig(16, 16),) * 3}),
    # tensor descriptors (TMA) for the walked operands: zero fill past an odd S, GQA,
    # sequence-major strides, padding
    "tma_local_gqa_oddS_fp16": (lambda: layouts.local(75, 16, 24, causal=True), 1, 4, 2, 32, torch.float16,
                                True, None, {"configs": (kernels.AttentionConfig(16, 16, tma=True),) * 3}),
    "tma_seqmajor_pad_b32_fp32": (lambda: layouts.random(100, 32, 0.5, _seed(), num_heads=2), 2, 2, 1, 32,
                                  torch.float32, False, "tail",
                                  {"seq_major": True, "configs": (kernels.AttentionConfig(32, 16, tma=True),) * 3}),
    # deterministic=False: dQ by atomics in the dK/dV kernel (GQA sums several heads' key tiles)
    "atomic_dq_local_gqa_oddS_fp16": (lambda: layouts.local(75, 16, 24, causal=True), 1, 4, 2, 32, torch.float16,
                                      True, None, {"deterministic": False}),
    "atomic_dq_perhead_tma_pad_fp16": (lambda: layouts.random(80, 16, 0.5, _seed(), num_heads=4), 1, 4, 2, 32,
                                       torch.float16, True, "tail",
                                       {"deterministic": False,
                                        "configs": (kernels.AttentionConfig(16, 16, tma=True),) * 3}),
    "atomic_dq_empty_rows_split_fp32": (_empty_row_layout, 2, 1, 1, 32, torch.float32, False, "all",
                                        {"deterministic": False, "configs": (kernels.AttentionConfig(16, 16),) * 3}),
    # two_pass: the dK/dV kernel walks each column twice (dV, then dK). Causal GQA with an
    # odd S; per-head layout with padding, split tiles and TMA; empty rows and columns
    # (all padding); D 48 on a 64 tile; and with the atomic dQ (which rides the dK pass)
    "two_pass_local_causal_gqa_oddS_fp16": (lambda: layouts.local(75, 16, 24, causal=True), 1, 4, 2, 32,
                                            torch.float16, True, None,
                                            {"configs": _two_pass_configs(16, 16, maxnreg=128)}),
    "two_pass_perhead_gqa_pad_tma_b32_fp32": (lambda: layouts.random(100, 32, 0.5, _seed(), num_heads=2), 2, 2, 1,
                                              32, torch.float32, False, "tail",
                                              {"seq_major": True, "configs": _two_pass_configs(16, 32, tma=True)}),
    "two_pass_empty_rows_allpad_fp32": (_empty_row_layout, 2, 1, 1, 32, torch.float32, False, "all",
                                        {"configs": _two_pass_configs(16, 16)}),
    "two_pass_empty_layout_fp16": (lambda: layouts.random(48, 16, 0.0), 1, 2, 1, 32, torch.float16, False, None,
                                   {"configs": _two_pass_configs(16, 16)}),
    "two_pass_D48_causal_pad_fp16": (lambda: layouts.local(64, 16, 32), 1, 2, 1, 48, torch.float16, True, "tail",
                                     {"configs": _two_pass_configs(16, 16)}),
    "two_pass_atomic_dq_perhead_tma_pad_fp16": (lambda: layouts.random(80, 16, 0.5, _seed(), num_heads=4), 1, 4,
                                                2, 32, torch.float16, True, "tail",
                                                {"deterministic": False,
                                                 "configs": _two_pass_configs(16, 16, tma=True)}),
}


@interpreter
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernels_match_reference(case):
    make, B, H, Hkv, D, dtype, causal, pad, extra = KERNEL_CASES[case]
    empty = check_case(make(), B, H, Hkv, D, dtype, causal, pad, **extra)
    if case.startswith("empty"):
        assert bool(empty.any()), "the case must contain empty rows"


@interpreter
def test_kernel_gradients_are_bitwise_deterministic():
    layout = layouts.bigbird(96, 16, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(1, 4, 2, 96, 32, torch.float16)
    grad_out = torch.randn(1, 4, 96, 32).to(torch.float16)
    kpm = padding(1, 96, "tail")
    first = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out)
    second = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for a, b in zip(first[2], second[2]):
        assert torch.equal(a, b)


@interpreter
def test_tma_loads_give_the_pointer_path_bitwise():
    layout = layouts.strided(80, 16, 32)
    q, k, v = make_inputs(1, 2, 1, 80, 32, torch.float16)
    grad_out = torch.randn(1, 2, 80, 32).to(torch.float16)
    plain = run_kernels(q, k, v, layout, True, None, 0.25, grad_out, configs=(kernels.AttentionConfig(16, 16),) * 3)
    tma = run_kernels(q, k, v, layout, True, None, 0.25, grad_out,
                      configs=(kernels.AttentionConfig(16, 16, tma=True),) * 3)
    assert torch.equal(plain[0], tma[0]) and torch.equal(plain[1], tma[1])
    for a, b in zip(plain[2], tma[2]):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- op: CPU path and autograd
# The public function on CPU tensors runs the block-loop PyTorch path; checked here for
# every builder (cheap: no interpreter), through autograd, in fp32 and fp64.

OP_LAYOUTS = {
    "causal": lambda: layouts.causal(70, 16),
    "local": lambda: layouts.local(70, 16, 20),
    "strided": lambda: layouts.strided(70, 16, 32),
    "fixed": lambda: layouts.fixed(70, 16, 32),
    "bigbird_perhead": lambda: layouts.bigbird(70, 16, window_blocks=3, global_blocks=1, random_blocks=1,
                                               seed=_seed(), num_heads=4),
    "longformer": lambda: layouts.longformer(70, 16, window=16, global_tokens=1),
    "random_b32": lambda: layouts.random(70, 32, 0.5, _seed()),
    "empty_rows": _empty_row_layout,
    "empty": lambda: layouts.random(70, 16, 0.0),
    "full": lambda: layouts.random(70, 16, 1.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(OP_LAYOUTS))
def test_op_cpu_matches_reference(name, causal, dtype):
    layout = OP_LAYOUTS[name]()
    S, B, H, Hkv, D = layout.seq_len, 2, 4, 2, 32
    q, k, v = (t.requires_grad_() for t in make_inputs(B, H, Hkv, S, D, dtype))
    kpm = padding(B, S, "tail")
    out = block_sparse_attention(q, k, v, layout, causal=causal, key_padding_mask=kpm)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref, _, ref_grads = reference_with_grads(q, k, v, layout, grad_out, causal=causal, key_padding_mask=kpm)
    tol_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert_close(out, ref, tol_dtype, "out")
    for n, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(got, want, tol_dtype, n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_op_cpu_16bit_and_gradients_deterministic(dtype):
    # 16-bit inputs on the CPU path compute in fp32 and round once (bf16 is fine here:
    # only the interpreter's tl.dot mishandles it).
    layout = layouts.local(64, 16, 24, causal=True)
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 1, 64, 32, dtype))
    out = block_sparse_attention(q, k, v, layout, causal=True)
    assert out.dtype == dtype
    grad_out = torch.randn_like(out)
    g1 = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
    g2 = torch.autograd.grad(out, (q, k, v), grad_out)
    ref, _, ref_grads = reference_with_grads(q, k, v, layout, grad_out, causal=True)
    assert_close(out, ref, dtype, "out")
    for n, a, b, want in zip(("dq", "dk", "dv"), g1, g2, ref_grads):
        assert torch.equal(a, b), n
        assert_close(a, want, dtype, n)


def test_autocast_runs_in_the_autocast_dtype():
    # fp32 inputs under CPU autocast: computed in bf16 (like SDPA), gradients back in fp32.
    layout = layouts.causal(48, 16)
    q, k, v = (t.requires_grad_() for t in make_inputs(1, 2, 2, 48, 32, torch.float32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block_sparse_attention(q, k, v, layout, causal=True)
    assert out.dtype == torch.bfloat16
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    ref = attention_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), layout, causal=True)
    assert_close(out, ref, torch.bfloat16, "out")


def test_op_cpu_path_never_builds_s_by_s(monkeypatch):
    # The block-loop path at S = 4096 (64 blocks of 64, a 3-block window): every score
    # matrix it forms is [.., b, keys of the active blocks], never S x S. Checked by
    # watching the largest matmul output.
    import tilesparse.attention.reference as ref_mod

    largest = [0]
    real_matmul = torch.Tensor.__matmul__

    def watch(a, b):
        out = real_matmul(a, b)
        largest[0] = max(largest[0], out.shape[-2] * out.shape[-1])
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", watch)
    layout = layouts.local(4096, 64, 65)
    q, k, v = make_inputs(1, 1, 1, 4096, 32, torch.float32)
    out, lse = ref_mod.attention_forward_blocks(q, k, v, layout.meta_on("cpu"), None, 1, 64, False, 0.1)
    assert out.shape == (1, 1, 4096, 32) and torch.isfinite(lse).all()
    assert 0 < largest[0] <= 64 * 3 * 64


# --------------------------------------------------------------------------- errors


def _good():
    layout = layouts.causal(40, 16)
    q, k, v = make_inputs(2, 4, 2, 40, 32, torch.float32)
    return q, k, v, layout


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda q, k, v, L: (q[0], k, v, L, {}), ValueError, "q must be 4-D"),
    (lambda q, k, v, L: (q, k.half(), v, L, {}), TypeError, "k has dtype"),
    (lambda q, k, v, L: (q.int(), k, v, L, {}), TypeError, "q has dtype"),
    (lambda q, k, v, L: (q, k, v[:, :1], L, {}), ValueError, "k and v"),
    (lambda q, k, v, L: (q, k[:, :, :39], v[:, :, :39], L, {}), ValueError, "k/v shape"),
    (lambda q, k, v, L: (q[:, :3], k, v, L, {}), ValueError, "multiple of k/v's 2 heads"),
    (lambda q, k, v, L: (q[..., :24], k[..., :24], v[..., :24], L, {}), ValueError, "head dim D=24"),
    (lambda q, k, v, L: (q, k, v, layouts.causal(80, 16), {}), ValueError, "layout has 5 blocks"),
    (lambda q, k, v, L: (q, k, v, AttentionLayout(torch.ones(3, 3, 3, dtype=torch.bool), 16), {}), ValueError,
     "layout has 3 heads"),
    (lambda q, k, v, L: (q, k, v, AttentionLayout(torch.ones(5, 5, dtype=torch.bool), 8), {}), ValueError,
     "layout.block_size=8"),
    (lambda q, k, v, L: (q, k, v, torch.ones(3, 3, dtype=torch.bool), {}), TypeError, "layout must be"),
    (lambda q, k, v, L: (q, k, v, L, {"key_padding_mask": torch.zeros(2, 39, dtype=torch.bool)}), ValueError,
     "key_padding_mask must have shape"),
    (lambda q, k, v, L: (q, k, v, L, {"key_padding_mask": torch.zeros(2, 40)}), TypeError,
     "key_padding_mask must be bool"),
    (lambda q, k, v, L: (q, k, v, L, {"scale": -1.0}), ValueError, "scale must be"),
    (lambda q, k, v, L: (q, k, v, L, {"causal": 1}), TypeError, "causal must be a bool"),
    (lambda q, k, v, L: (q, k, v, L, {"deterministic": 0}), TypeError, "deterministic must be a bool"),
    # the meta device stands in for a second device on a CPU-only machine
    (lambda q, k, v, L: (q.to("meta"), k, v, L, {}), ValueError, "k is on cpu but q is on meta"),
    (lambda q, k, v, L: (q, k, v, L, {"key_padding_mask": torch.zeros(2, 40, dtype=torch.bool, device="meta")}),
     ValueError, "key_padding_mask is on meta"),
], ids=["q_dim", "k_dtype", "q_int", "v_heads", "kv_seq", "gqa", "head_dim", "layout_blocks", "layout_heads",
        "block_size", "layout_type", "kpm_shape", "kpm_dtype", "scale", "causal_type", "deterministic_type", "device",
        "kpm_device"])
def test_bad_input_names_the_argument(mutate, exc, match):
    q, k, v, layout, kw = mutate(*_good())
    with pytest.raises(exc, match=match):
        block_sparse_attention(q, k, v, layout, **kw)


def test_a_numpy_float_scale_is_taken_as_a_float():
    # (review, 2026-12-04: np.float32 was refused while np.float64, a float subclass, was taken)
    import numpy as np
    q, k, v, layout = _good()
    assert torch.equal(block_sparse_attention(q, k, v, layout, scale=np.float32(0.25)),
                       block_sparse_attention(q, k, v, layout, scale=0.25))


# --------------------------------------------------------------------------- GPU
# Block sizes 64/128 (the fast path), head dims 64, 128 and 96 (padded to a 128 tile),
# S from 1000 (not a multiple of b) to 4096, causal and GQA, bf16 and fp16.

GPU_CASES = [
    # (b, D, S, H, Hkv, causal, dtype)
    (64, 64, 1000, 4, 4, True, torch.bfloat16),
    (128, 128, 2048, 8, 2, True, torch.float16),
    (64, 96, 1531, 4, 1, False, torch.bfloat16),
    (128, 64, 4096, 4, 4, True, torch.bfloat16),
    (128, 96, 1000, 8, 4, False, torch.float16),
    (64, 128, 4096, 2, 2, False, torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("b,D,S,dtype,seq_major", [(128, 128, 2000, torch.bfloat16, True),
                                                   (64, 64, 1000, torch.float16, False)])
def test_gpu_tma_kernels_match_reference(b, D, S, dtype, seq_major):
    """The tensor-descriptor (TMA) loads on the GPU: odd S (zero fill), GQA, padding,
    sequence-major strides; the same as the pointer path, bitwise."""
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(2, 4, 2, S, D, dtype, device="cuda", seq_major=seq_major)
    grad_out = torch.randn(2, 4, S, D, device="cuda").to(dtype)
    kpm = padding(2, S, "tail").cuda()
    base = [dataclasses.replace(kernels.attention_config(kind, b, D, dtype), tma=False)  # the measured ones use TMA
            for kind in ("fwd", "dkdv", "dq")]
    tma = [dataclasses.replace(c, tma=True) for c in base]
    assert kernels._tma_ok(tma[0], D, D, k, v)
    got = run_kernels(q, k, v, layout, True, kpm, D ** -0.5, grad_out, configs=tma)
    plain = run_kernels(q, k, v, layout, True, kpm, D ** -0.5, grad_out, configs=base)
    # the same arithmetic in the same order; allow for a different schedule, not for a different result
    assert rel_error(got[0], plain[0]) < 1e-3 and all(rel_error(a, p) < 1e-3 for a, p in zip(got[2], plain[2]))
    ref, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=True,
                                             scale=D ** -0.5, key_padding_mask=kpm.cpu())
    assert_close(got[0], ref, dtype, "out")
    for name, g, want in zip(("dq", "dk", "dv"), got[2], ref_grads):
        assert_close(g, want, dtype, name)


@pytest.mark.gpu
@pytest.mark.parametrize("b,D,S,H,Hkv,causal,dtype", GPU_CASES)
def test_gpu_matches_reference(b, D, S, H, Hkv, causal, dtype):
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    B = 2
    q, k, v = (t.requires_grad_() for t in make_inputs(B, H, Hkv, S, D, dtype, device="cuda"))
    kpm = padding(B, S, "tail").cuda()
    out = block_sparse_attention(q, k, v, layout, causal=causal, key_padding_mask=kpm)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=causal,
                                             key_padding_mask=kpm.cpu())
    assert_close(out, ref, dtype, "out")
    for n, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(got, want, dtype, n)
    grads2 = torch.autograd.grad(block_sparse_attention(q, k, v, layout, causal=causal, key_padding_mask=kpm),
                                 (q, k, v), grad_out)
    for a, b_ in zip(grads, grads2):
        assert torch.equal(a, b_), "gradients must be bitwise deterministic"
    atomic = torch.autograd.grad(block_sparse_attention(q, k, v, layout, causal=causal, key_padding_mask=kpm,
                                                        deterministic=False), (q, k, v), grad_out)
    for n, got, want in zip(("dq atomic", "dk atomic", "dv atomic"), atomic, ref_grads):
        assert_close(got, want, dtype, n)


@pytest.mark.gpu
def test_gpu_remembered_kernel_choice_follows_the_operands_alignment(monkeypatch):
    # the launchers remember their kernel choice per operand signature: q 16-byte aligned
    # (on Hopper the warp-specialized forward), then at base + 8 bytes (the Triton kernel's
    # pointer path); each remembered, each matching the other's output
    monkeypatch.setattr(kernels, "_PLANS", {})
    layout = layouts.local(1024, 128, 256, causal=True)
    q, k, v = make_inputs(2, 4, 2, 1024, 128, torch.bfloat16, device="cuda")
    buf = torch.empty(q.numel() + 4, dtype=q.dtype, device="cuda")
    shifted = buf[4:].view(q.shape).copy_(q)
    assert shifted.data_ptr() % 16 == 8
    want = block_sparse_attention(q, k, v, layout, causal=True)
    for _ in range(2):
        got = block_sparse_attention(shifted, k, v, layout, causal=True)
        assert rel_error(got, want) < 2e-2
    plans = [plan for key, plan in kernels._PLANS.items() if key[1] == "fwd"]
    assert len(plans) == 2
    if torch.cuda.get_device_capability()[0] == 9:
        assert sorted(plan[1] for plan in plans) == [False, True]  # (cfg, warp-specialized, tma)


@pytest.mark.gpu
def test_gpu_concurrent_dq_gives_the_same_bits(monkeypatch):
    # CONCURRENT_DQ: the deterministic backward's dQ kernel on a side stream beside dK/dV;
    # the same kernels, so bitwise the same gradients, also replayed from a CUDA graph. (The
    # dQ kernel there reads the delta kernel's delta: so does the default it is compared
    # with, not computing delta itself)
    from tilesparse.kernels import attention_ws

    monkeypatch.setattr(attention_ws, "_WS_DEFAULTS", {
        key: dataclasses.replace(cfg, delta=False) if key[0] == "dq" else cfg
        for key, cfg in attention_ws._WS_DEFAULTS.items()})
    monkeypatch.setattr(kernels, "_PLANS", {})  # (kernel choices remembered under the shipped defaults)
    layout = layouts.bigbird(1000, 128, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(), num_heads=4)
    q, k, v, grad = make_inputs(2, 4, 2, 1000, 128, torch.bfloat16, device="cuda") + (
        torch.randn(2, 4, 1000, 128, device="cuda", dtype=torch.bfloat16),)
    meta, scale = layout.meta_on(q.device), 128 ** -0.5
    out, lse = kernels.attention_forward(q, k, v, meta, None, 4, 128, False, scale)
    backward = lambda: kernels.attention_backward(grad, q, k, v, out, lse, meta, None, 4, 128, False, scale)  # noqa: E731
    want = backward()
    monkeypatch.setattr(kernels, "CONCURRENT_DQ", True)
    for _ in range(3):
        assert all(map(torch.equal, backward(), want))
    backward()  # warm (tables built) before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = backward()
    for t in got:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(map(torch.equal, got, want))


@pytest.mark.gpu
def test_gpu_large_sequence_memory_is_linear():
    # S = 131072 at ~2 % density (b = 128: 1024 x 1024 blocks, ~20 per row). The dense
    # S x S scores would take 64 GiB in fp32; the peak must stay O(S * D + nnz).
    S, b, D, H = 131072, 128, 64, 2
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=2, random_blocks=15, seed=_seed())
    assert layout.density < 0.025
    q, k, v = (t.requires_grad_() for t in make_inputs(1, H, H, S, D, torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = block_sparse_attention(q, k, v, layout, causal=True)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    act = q.numel() * q.element_size()  # one [1, H, S, D] tensor: 32 MiB
    # out, grad_out, dq, dk, dv, lse, delta and the tables: about 6 * act; allow 12.
    assert peak < 12 * act, f"peak {peak / 2**20:.0f} MiB for {act / 2**20:.0f} MiB activations"
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


@pytest.mark.gpu
def test_gpu_offsets_past_2_31():
    # q and out hold 144 * 2**24 elements (144 query heads on one kv head, S = 131072,
    # D = 128): the last heads' rows sit past 2**31 elements, where 32-bit offsets would
    # wrap. Their output must equal the same heads computed alone (small offsets).
    S, b, D, H = 131072, 128, 128, 144
    assert (H - 1) * S * D > 2**31
    layout = layouts.local(S, b, 2 * b, causal=True)
    q = torch.randn(1, H, S, D, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(1, 1, S, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out = block_sparse_attention(q, k, v, layout, causal=True)
    for heads in (slice(H - 1, H), slice(0, 1)):
        alone = block_sparse_attention(q[:, heads].contiguous(), k, v, layout, causal=True)
        assert torch.equal(out[:, heads], alone)
