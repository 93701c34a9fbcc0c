"""Bad input to the public ops raises the documented error type, and the message names
the offending argument.

Each case is a function of a fresh fixture set ``f`` (a layout with block size 8 on a
2 x 3 grid, i.e. W is [16, 24], plus valid x / weight / bias / a / b), so every case
changes exactly one thing from a valid call.

Device mismatches use the 'meta' device as the "other" device (there is no GPU here).
"""

from types import SimpleNamespace

import pytest
import torch

import tilesparse
from tilesparse import layouts

B = 8


@pytest.fixture
def f():
    layout = layouts.random(16, 24, B, 0.5, seed=int(torch.randint(1000, ())))
    rows, cols = layout.shape
    return SimpleNamespace(
        layout=layout,
        x=torch.randn(5, cols),
        weight=torch.randn(layout.nnz, B, B),
        bias=torch.randn(rows),
        a_dds=torch.randn(5, rows),  # dds: a @ S
        b_dsd=torch.randn(cols, 5),  # dsd: S @ b
        a_sdd=torch.randn(rows, 5),  # sdd: a @ b sampled on the layout
        b_sdd=torch.randn(5, cols),
    )


def linear(f, **changes):
    kwargs = dict(x=f.x, weight=f.weight, layout=f.layout, bias=f.bias)
    kwargs.update(changes)
    return tilesparse.block_sparse_linear(kwargs["x"], kwargs["weight"], kwargs["layout"], kwargs["bias"])


def meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


# (id, call, exception, message pattern)
LINEAR_CASES = [
    ("x_int", lambda f: linear(f, x=f.x.long()), TypeError, r"^x has dtype torch\.int64"),
    ("x_not_tensor", lambda f: linear(f, x=f.x.tolist()), TypeError, r"^x must be a torch\.Tensor"),
    ("x_0d", lambda f: linear(f, x=torch.tensor(1.0)), ValueError, r"^x must have at least 1 dims"),
    ("x_features", lambda f: linear(f, x=torch.randn(5, 32)), ValueError, r"^x\.shape\[-1\] \(in_features\) is 32"),
    ("weight_int", lambda f: linear(f, weight=f.weight.int()), TypeError, r"^weight has dtype torch\.int32"),
    ("weight_dtype_vs_x", lambda f: linear(f, weight=f.weight.double()), TypeError,
     r"^weight has dtype torch\.float64 but x has torch\.float32"),
    ("weight_2d", lambda f: linear(f, weight=f.weight[0]), ValueError, r"^weight must be 3-D"),
    ("weight_nnz", lambda f: linear(f, weight=torch.randn(f.layout.nnz + 1, B, B)), ValueError,
     r"^weight has \d+ blocks but the layout has nnz="),
    ("weight_not_square", lambda f: linear(f, weight=torch.randn(f.layout.nnz, B, B + 1)), ValueError,
     r"^weight must hold square blocks"),
    ("weight_block_size", lambda f: linear(f, weight=torch.randn(f.layout.nnz, 16, 16)), ValueError,
     r"^weight holds 16x16 blocks but the layout has block_size=8"),
    ("layout_block_size", lambda f: linear(
        f, layout=layouts.random(16, 32, 16, 0.5), weight=torch.randn(1, B, B), x=torch.randn(5, 32),
        bias=torch.randn(16)), ValueError, r"^weight holds 8x8 blocks but the layout has block_size=16"),
    ("layout_not_layout", lambda f: linear(f, layout=f.layout.mask), TypeError,
     r"^layout must be a tilesparse\.BlockLayout"),
    ("bias_size", lambda f: linear(f, bias=torch.randn(17)), ValueError, r"^bias\.shape\[0\] \(out_features\) is 17"),
    ("bias_2d", lambda f: linear(f, bias=f.bias[None]), ValueError, r"^bias must be 1-D"),
    ("bias_dtype", lambda f: linear(f, bias=f.bias.half()), TypeError, r"^bias has dtype torch\.float16 but x has"),
    ("bias_int", lambda f: linear(f, bias=f.bias.long()), TypeError, r"^bias has dtype torch\.int64"),
    ("weight_device", lambda f: linear(f, weight=meta(f.weight)), ValueError, r"^weight is on meta but x is on cpu"),
    ("bias_device", lambda f: linear(f, bias=meta(f.bias)), ValueError, r"^bias is on meta but x is on cpu"),
]

DDS_CASES = [
    ("a_int", lambda f: tilesparse.dds(f.a_dds.long(), f.weight, f.layout), TypeError, r"^a has dtype"),
    ("a_3d", lambda f: tilesparse.dds(f.a_dds[None], f.weight, f.layout), ValueError, r"^a must be 2-D"),
    ("values_dtype", lambda f: tilesparse.dds(f.a_dds, f.weight.half(), f.layout), TypeError,
     r"^values has dtype torch\.float16 but a has"),
    ("values_nnz", lambda f: tilesparse.dds(f.a_dds, f.weight[1:], f.layout), ValueError, r"^values has \d+ blocks"),
    ("values_block_size", lambda f: tilesparse.dds(f.a_dds, torch.randn(f.layout.nnz, 4, 4), f.layout), ValueError,
     r"^values holds 4x4 blocks but the layout has block_size=8"),
    ("inner_dim", lambda f: tilesparse.dds(f.a_dds, f.weight, f.layout, trans_b=True), ValueError,
     r"^the inner dimension of op\(a\) is 16 but the layout needs 24"),
    ("inner_dim_trans_a", lambda f: tilesparse.dds(f.a_dds, f.weight, f.layout, trans_a=True), ValueError,
     r"^the inner dimension of op\(a\) is 5"),
    ("layout", lambda f: tilesparse.dds(f.a_dds, f.weight, "layout"), TypeError, r"^layout must be a tilesparse"),
    ("values_device", lambda f: tilesparse.dds(f.a_dds, meta(f.weight), f.layout), ValueError,
     r"^values is on meta but a is on cpu"),
    ("a_device", lambda f: tilesparse.dds(meta(f.a_dds), f.weight, f.layout), ValueError,
     r"^values is on cpu but a is on meta"),
]

DSD_CASES = [
    ("b_int", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd.int()), TypeError, r"^b has dtype"),
    ("b_1d", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd[:, 0]), ValueError, r"^b must be 2-D"),
    ("values_dtype", lambda f: tilesparse.dsd(f.weight.double(), f.layout, f.b_dsd), TypeError,
     r"^values has dtype torch\.float64 but b has"),
    ("values_3d_shape", lambda f: tilesparse.dsd(f.weight.flatten(1), f.layout, f.b_dsd), ValueError,
     r"^values must be 3-D"),
    ("inner_dim", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd, trans_a=True), ValueError,
     r"^the inner dimension of op\(b\) is 24 but the layout needs 16"),
    ("inner_dim_trans_b", lambda f: tilesparse.dsd(f.weight, f.layout, f.b_dsd, trans_b=True), ValueError,
     r"^the inner dimension of op\(b\) is 5"),
    ("layout", lambda f: tilesparse.dsd(f.weight, None, f.b_dsd), TypeError, r"^layout must be a tilesparse"),
    ("values_device", lambda f: tilesparse.dsd(meta(f.weight), f.layout, f.b_dsd), ValueError,
     r"^values is on meta but b is on cpu"),
]

SDD_CASES = [
    ("layout", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout.mask), TypeError, r"^layout must be a tilesparse"),
    ("a_int", lambda f: tilesparse.sdd(f.a_sdd.long(), f.b_sdd, f.layout), TypeError, r"^a has dtype"),
    ("b_int", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd.long(), f.layout), TypeError, r"^b has dtype"),
    ("b_dtype", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd.bfloat16(), f.layout), TypeError,
     r"^b has dtype torch\.bfloat16 but a has"),
    ("a_3d", lambda f: tilesparse.sdd(f.a_sdd[None], f.b_sdd, f.layout), ValueError, r"^a must be 2-D"),
    ("a_rows", lambda f: tilesparse.sdd(f.a_sdd[:8], f.b_sdd, f.layout), ValueError,
     r"^op\(a\)\.shape\[0\] is 8 but the layout needs 16"),
    ("a_rows_trans", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout, trans_a=True), ValueError,
     r"^op\(a\)\.shape\[0\] is 5"),
    ("b_cols", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd[:, :8], f.layout), ValueError,
     r"^op\(b\)\.shape\[1\] is 8 but the layout needs 24"),
    ("inner_dim", lambda f: tilesparse.sdd(f.a_sdd, f.b_sdd[:4], f.layout), ValueError,
     r"^op\(b\)\.shape\[0\] \(must equal op\(a\)\.shape\[1\]\); it is 4"),
    ("b_device", lambda f: tilesparse.sdd(f.a_sdd, meta(f.b_sdd), f.layout), ValueError,
     r"^b is on meta but a is on cpu"),
]


def _params(cases):
    return pytest.mark.parametrize("call, exc, pattern", [c[1:] for c in cases], ids=[c[0] for c in cases])


@_params(LINEAR_CASES)
def test_block_sparse_linear_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(DDS_CASES)
def test_dds_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(DSD_CASES)
def test_dsd_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


@_params(SDD_CASES)
def test_sdd_errors(f, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(f)


def test_block_sparse_linear_x_on_other_device(f):
    # Devices are checked before the autocast probe (which has no 'meta' device type).
    with pytest.raises(ValueError, match=r"weight is on cpu but x is on meta"):
        linear(f, x=meta(f.x))


def test_valid_fixture_calls_succeed(f):
    # The baseline every error case departs from must itself be valid.
    assert linear(f).shape == (5, 16)
    assert tilesparse.dds(f.a_dds, f.weight, f.layout).shape == (5, 24)
    assert tilesparse.dsd(f.weight, f.layout, f.b_dsd).shape == (16, 5)
    assert tilesparse.sdd(f.a_sdd, f.b_sdd, f.layout).shape == f.weight.shape


# ----------------------------------------------------------------------------- modules, layouts
# (from an audit of the public entry points with bad input, thirty-third session)

def _attention_inputs(S, D=16, H=2, B=1):
    return [torch.randn(B, H, S, D) for _ in range(3)]


def test_attention_refuses_a_layout_built_for_another_length():
    from tilesparse.attention import AttentionLayout, block_sparse_attention
    from tilesparse.attention import layouts as attention_layouts

    layout = attention_layouts.fixed(64, 16, 32, summary=8, causal=False)  # built for S = 64
    q, k, v = _attention_inputs(50)  # same 4 blocks, another S: the pattern's strides differ
    with pytest.raises(ValueError, match=r"built for seq_len=64 but q has S=50"):
        block_sparse_attention(q, k, v, layout)
    # the same blocks without a seq_len of their own run
    shared = AttentionLayout(layout.mask[0], layout.block_size)
    assert block_sparse_attention(q, k, v, shared).shape == q.shape


def test_self_attention_module_runs_shorter_sequences_on_its_blocks():
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.nn import BlockSparseSelfAttention

    module = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, 2, causal=True))
    for seq in (64, 50, 17):  # 50: the module's 4 blocks, another S
        assert module(torch.randn(1, seq, 32)).shape == (1, seq, 32)
        assert module.layout_for(seq).seq_len in (None, seq)


@pytest.mark.parametrize("change, exc, pattern", [
    (dict(causal="no"), TypeError, "causal must be a bool"),
])
def test_self_attention_module_constructor_errors(change, exc, pattern):
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.nn import BlockSparseSelfAttention

    with pytest.raises(exc, match=pattern):
        BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, 2, causal=True), **change)


@pytest.mark.parametrize("bad", [-40, 0, 2.5, True])
def test_self_attention_module_refuses_bad_lengths(bad):
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.nn import BlockSparseSelfAttention

    module = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, 2, causal=True))
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        module.layout_for(bad)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        module.prepare(bad)


@pytest.mark.parametrize("module_kind", ["attention", "lstm"])
@pytest.mark.parametrize("x_change, exc, pattern", [
    (lambda x: x.half(), TypeError, r"x has dtype torch.float16 but .*'s weights have torch.float32"),
    (lambda x: x.long(), TypeError, r"x has dtype torch.int64"),
    (lambda x: x.to("meta"), ValueError, r"x is on meta but .*'s weights is on cpu"),
])
def test_modules_name_a_bad_input(module_kind, x_change, exc, pattern):
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.nn import BlockSparseLSTM, BlockSparseSelfAttention

    if module_kind == "attention":
        module, x = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, 2, causal=True)), torch.randn(1, 64, 32)
    else:
        module, x = BlockSparseLSTM(16, 32, block_size=16, density=0.5), torch.randn(3, 2, 16)
    with pytest.raises(exc, match=pattern):
        module(x_change(x))


def test_modules_take_other_dtypes_under_autocast():
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.nn import BlockSparseSelfAttention

    module = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, 2, causal=True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module(torch.randn(1, 64, 32).half()).shape == (1, 64, 32)


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda: tilesparse.BlockLayout.dense(32, 32, 0), ValueError, "block_size must be a positive int"),
    (lambda: tilesparse.BlockLayout.dense(-32, 32, 16), ValueError, "rows must be a non-negative int"),
    (lambda: tilesparse.BlockLayout.from_coords([[0.5, 0]], 2, 2, 16), TypeError, "coords must hold integer"),
    (lambda: tilesparse.BlockLayout.from_coords([[0, 0]], -1, 2, 16), ValueError, "block_rows must be"),
    (lambda: tilesparse.BlockLayout.from_mask_with_nnz(torch.eye(4, dtype=torch.bool), 16, 2), RuntimeError,
     "does not hold nnz=2"),
    (lambda: layouts.random(64, 64, 16, 0.5, seed=1.5), ValueError, "seed must be an int"),
    (lambda: layouts.balanced(64, 64, 16, 0.5, seed="a"), ValueError, "seed must be an int"),
    (lambda: layouts.random(64, 64, 16, None), ValueError, "density must be in"),
    (lambda: layouts.from_dense(torch.ones(32, 32, dtype=torch.int32), 16, 0.5), TypeError, "floating-point"),
    (lambda: tilesparse.nn.BlockSparseLinear(32, 64, block_size=0, density=0.5), ValueError,
     "block_size must be a positive int"),
    (lambda: tilesparse.nn.BlockSparseLinear(0, 64, block_size=16, density=0.5), ValueError,
     "in_features must be a positive int"),
    (lambda: tilesparse.nn.BlockSparseLinear(32, 64, block_size=16, density=0.5, dtype=torch.int32), TypeError,
     "dtype must be a floating-point"),
], ids=["dense-b0", "dense-negative", "coords-float", "coords-negative-grid", "nnz-wrong", "seed-float",
        "seed-str", "density-none", "from-dense-int", "linear-b0", "linear-zero-features", "linear-int-dtype"])
def test_layout_and_module_constructor_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.parametrize("call, pattern", [
    (lambda L: L.bigbird(256, 64, num_heads=0), "num_heads must be a positive int"),
    (lambda L: L.random(256, 64, 0.5, num_heads=2.0), "num_heads must be a positive int"),
    (lambda L: L.longformer(256, 64, window=64, global_tokens=-3),
     r"global_tokens must be a count of tokens in \[0, S=256\], got -3"),
    (lambda L: L.longformer(256, 64, window=64, global_tokens=[1.7]), "int token indices"),
    (lambda L: L.longformer(256, 64, window=64, global_tokens=True), "count or token indices"),
], ids=["bigbird-heads-0", "random-heads-float", "longformer-negative", "longformer-float", "longformer-bool"])
def test_attention_layout_builder_errors(call, pattern):
    from tilesparse.attention import layouts as attention_layouts

    with pytest.raises(ValueError, match=pattern):
        call(attention_layouts)


def test_counts_take_numpy_ints_and_store_python_ints():
    # one count check (tilesparse/_counts.py) at the layout, layout-generator, module and
    # attention-layout entry points: numpy's integers are counts, bools and floats are not
    import numpy as np

    from tilesparse.attention import layouts as attention_layouts

    linear = tilesparse.nn.BlockSparseLinear(np.int64(32), np.int32(64), block_size=np.int64(16), density=0.5)
    assert (linear.in_features, linear.out_features) == (32, 64)
    assert all(type(v) is int for v in (linear.in_features, linear.out_features))
    block = tilesparse.BlockLayout(torch.eye(2, dtype=torch.bool), np.int64(16))
    assert type(block.block_size) is int
    assert tilesparse.layouts.random(64, 64, np.int64(16), 0.5, seed=0).block_size == 16
    assert torch.equal(tilesparse.BlockLayout.from_coords([[0, 1]], np.int64(2), np.int64(2), 16).mask,
                       torch.tensor([[False, True], [False, False]]))
    assert torch.equal(attention_layouts.longformer(256, 64, window=64, global_tokens=np.int64(2)).mask,
                       attention_layouts.longformer(256, 64, window=64, global_tokens=2).mask)
    layout = attention_layouts.local(np.int64(256), np.int64(64), np.int64(64))
    assert type(layout.block_size) is int and type(layout.seq_len) is int
    assert torch.equal(layout.mask, attention_layouts.local(256, 64, 64).mask)
    assert torch.equal(attention_layouts.bigbird(256, 64, window_blocks=np.int64(3), seed=np.int64(1)).mask,
                       attention_layouts.bigbird(256, 64, window_blocks=3, seed=1).mask)
    for bad in (True, 16.0, -16):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            tilesparse.nn.BlockSparseLinear(32, 64, block_size=bad, density=0.5)
    with pytest.raises(ValueError, match=r"window must be a non-negative int, got 2\.0"):
        attention_layouts.longformer(256, 64, window=2.0)


def test_longformer_takes_numpy_and_tensor_token_indices():
    import numpy as np

    from tilesparse.attention import layouts as attention_layouts

    want = attention_layouts.longformer(256, 64, window=64, global_tokens=[1, 70]).mask
    for tokens in (np.array([1, 70]), torch.tensor([1, 70])):
        assert torch.equal(attention_layouts.longformer(256, 64, window=64, global_tokens=tokens).mask, want)


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda: tilesparse.sparsity.HardConcreteGate(-1), ValueError, "number of gates"),
    (lambda: tilesparse.sparsity.HardConcreteGate(2.5), ValueError, "number of gates"),
    (lambda: tilesparse.sparsity.rewire(_linear(), None, 1), TypeError, "grad_norms must be a floating-point"),
    (lambda: tilesparse.sparsity.rewire(_linear(), torch.ones(4, 2, dtype=torch.long), 1), TypeError,
     "grad_norms must be a floating-point"),
    (lambda: tilesparse.sparsity.rewire(_linear(), torch.ones(4, 2), -1), ValueError, "n must be a non-negative"),
    (lambda: tilesparse.sparsity.rewire(torch.nn.Linear(4, 4), torch.ones(4, 2), 1), TypeError,
     "module must be a tilesparse.nn.BlockSparseLinear"),
], ids=["gate-negative", "gate-float", "rewire-none", "rewire-long", "rewire-negative-n", "rewire-linear"])
def test_sparsity_helper_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def _linear():
    return tilesparse.nn.BlockSparseLinear(32, 64, block_size=16, density=0.5)
