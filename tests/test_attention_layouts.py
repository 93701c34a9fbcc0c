"""Attention layout builders (tilesparse.attention.layouts), AttentionLayout's tables, and
the FlexAttention BlockMask converters.

Each token-level pattern is checked against a brute-force O(S^2) predicate: a block is
computed exactly when some (query, key) pair inside it belongs to the pattern. Sizes
are odd (S not a multiple of b) where the builder allows it, so the short last block
is covered.
"""

import warnings

import pytest
import torch

from tilesparse.attention import AttentionLayout, layouts
from tilesparse.attention.layout import attention_table_views


def _seed() -> int:
    return int(torch.randint(0, 2**31 - 1, ()))  # the conftest seeds the generator per test


def block_cover(S: int, b: int, pred) -> torch.Tensor:
    """[nb, nb] bool: block (m, n) holds some pair (i, j) with pred(i, j) (brute force)."""
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    tok = pred(i, j)
    nb = -(-S // b)
    pad = torch.zeros(nb * b, nb * b, dtype=torch.bool)
    pad[:S, :S] = tok
    return pad.reshape(nb, b, nb, b).any(dim=3).any(dim=1)


def test_causal_is_lower_triangular():
    layout = layouts.causal(100, 16)
    assert layout.mask.shape == (1, 7, 7) and layout.shared and layout.seq_len == 100
    assert torch.equal(layout.mask[0], torch.ones(7, 7, dtype=torch.bool).tril())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S,b,window", [(100, 16, 20), (64, 16, 1), (75, 32, 40)])
def test_local_matches_token_window(S, b, window, causal):
    layout = layouts.local(S, b, window, causal=causal)
    if causal:
        want = block_cover(S, b, lambda i, j: (i - j >= 0) & (i - j < window))
    else:
        want = block_cover(S, b, lambda i, j: (i - j).abs() < window)
    assert torch.equal(layout.mask[0], want)


@pytest.mark.parametrize("S,b,stride", [(100, 16, 32), (96, 16, 16), (130, 32, 64)])
def test_strided_matches_sparse_transformer(S, b, stride):
    layout = layouts.strided(S, b, stride)
    want = block_cover(S, b, lambda i, j: (i >= j) & (((i - j) < stride) | ((i - j) % stride == 0)))
    assert torch.equal(layout.mask[0], want)
    sym = layouts.strided(S, b, stride, causal=False)
    assert torch.equal(sym.mask[0], want | want.t())


@pytest.mark.parametrize("S,b,stride,summary", [(100, 16, 32, 16), (128, 16, 64, 8), (90, 32, 64, 64)])
def test_fixed_matches_sparse_transformer(S, b, stride, summary):
    layout = layouts.fixed(S, b, stride, summary=summary)
    want = block_cover(S, b, lambda i, j: (i >= j) & (((i // stride) == (j // stride))
                                                      | ((j % stride) >= stride - summary)))
    assert torch.equal(layout.mask[0], want)
    assert layouts.fixed(S, b, stride, summary=summary, causal=False).mask[0].triu(1).any()


def test_longformer_window_and_global_tokens():
    S, b, window, glob = 100, 16, 24, [0, 41]
    layout = layouts.longformer(S, b, window=window, global_tokens=glob)
    g = torch.zeros(S, dtype=torch.bool)
    g[glob] = True
    want = block_cover(S, b, lambda i, j: ((i - j).abs() <= window // 2) | g[i.flatten()][:, None]
                       | g[j.flatten()][None, :])
    assert torch.equal(layout.mask[0], want)
    assert torch.equal(layouts.longformer(S, b, window=window, global_tokens=2).mask,
                       layouts.longformer(S, b, window=window, global_tokens=[0, 1]).mask)


def test_bigbird_structure_and_seed():
    S, b, seed = 200, 16, _seed()
    layout = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed)
    mask = layout.mask[0]
    nb = 13
    base = (torch.arange(nb)[:, None] - torch.arange(nb)[None, :]).abs() <= 1
    base[0, :] = True
    base[:, 0] = True
    assert bool((mask | ~base).all()), "window and global blocks must all be present"
    extra = (mask & ~base).sum(1)
    free = (~base).sum(1)
    assert torch.equal(extra, torch.clamp(free, max=2)), "each row gets min(random_blocks, free) random blocks"
    again = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed)
    assert layout == again
    other = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed + 1)
    assert layout != other  # 11 rows x C(9..10, 2) choices: a collision is ~impossible
    per_head = layouts.bigbird(S, b, window_blocks=3, global_blocks=1, random_blocks=2, seed=seed, num_heads=4)
    assert per_head.mask.shape == (4, nb, nb) and not per_head.shared
    assert not all(torch.equal(per_head.mask[0], per_head.mask[h]) for h in range(1, 4))


@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_random_density_and_seed(density):
    seed = _seed()
    layout = layouts.random(100, 16, density, seed)
    assert layout.mask.shape == (1, 7, 7)
    assert layout.nnz == round(density * 49)
    assert layout == layouts.random(100, 16, density, seed)
    if 0 < density < 1:
        assert layout != layouts.random(100, 16, density, seed + 1)
    heads = layouts.random(100, 16, density, seed, num_heads=3)
    assert heads.mask.shape == (3, 7, 7) and heads.nnz == 3 * round(density * 49)


def test_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="stride"):
        layouts.strided(64, 16, 24)
    with pytest.raises(ValueError, match="window"):
        layouts.local(64, 16, 0)
    with pytest.raises(ValueError, match="density"):
        layouts.random(64, 16, 1.5)
    with pytest.raises(ValueError, match="global_tokens"):
        layouts.longformer(64, 16, window=8, global_tokens=[64])
    with pytest.raises(ValueError, match="seq_len"):
        AttentionLayout(torch.ones(3, 3, dtype=torch.bool), 16, seq_len=100)
    with pytest.raises(ValueError, match="mask"):
        AttentionLayout(torch.ones(3, 4, dtype=torch.bool), 16)


@pytest.mark.parametrize("per_head", [False, True])
def test_tables_list_rows_and_columns(per_head):
    # The packed CSR/CSC tables against the mask, causal and not.
    mask = torch.rand(3 if per_head else 1, 6, 6) < 0.5
    mask[0, 2, :] = False  # an empty block row
    mask[-1, :, 4] = False  # an empty block column
    layout = AttentionLayout(mask if per_head else mask[0], 32)
    for causal in (False, True):
        m = layout.block_mask(causal)
        row_ptr, col_ptr, row_cols, col_rows = layout.tables(causal)
        assert row_ptr.dtype == torch.int32
        assert row_cols.numel() == col_rows.numel() == int(m.sum())
        for l in range(m.shape[0]):
            for r in range(6):
                got = row_cols[row_ptr[l * 6 + r]:row_ptr[l * 6 + r + 1]].tolist()
                assert got == m[l, r].nonzero().flatten().tolist()
                got = col_rows[col_ptr[l * 6 + r]:col_ptr[l * 6 + r + 1]].tolist()
                assert got == m[l, :, r].nonzero().flatten().tolist()
        assert layout.meta_on("cpu", causal) is layout.meta_on("cpu", causal)  # cached
        views = attention_table_views(layout.meta_on("cpu", causal), layout.layout_heads, 6)
        assert all(torch.equal(a, b) for a, b in zip(views, (row_ptr, col_ptr, row_cols, col_rows)))


# --------------------------------------------------------------------------- FlexAttention


@pytest.mark.parametrize("make", [
    lambda: layouts.bigbird(100, 16, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed()),
    lambda: layouts.random(128, 32, 0.4, _seed(), num_heads=3),
    lambda: layouts.local(70, 16, 20, causal=True),
], ids=["bigbird_odd_S", "random_per_head", "local_causal"])
def test_block_mask_round_trip(make):
    layout = make()
    bm = layouts.to_block_mask(layout, B=2)
    assert bm.BLOCK_SIZE == (layout.block_size, layout.block_size)
    assert tuple(bm.seq_lengths) == (layout.seq_len, layout.seq_len)
    dense = bm.to_dense()
    assert dense.shape == (2, layout.layout_heads, layout.num_blocks, layout.num_blocks)
    assert torch.equal(dense.bool(), layout.mask.unsqueeze(0).expand(2, -1, -1, -1))
    back = layouts.from_block_mask(bm)
    assert back == layout and back.seq_len == layout.seq_len and back.shared == layout.shared


def test_from_block_mask_of_flex_causal_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 96, 96, device="cpu", BLOCK_SIZE=32)
    assert layouts.from_block_mask(bm) == layouts.causal(96, 32)
    with pytest.raises(ValueError, match="BLOCK_SIZE"):
        layouts.from_block_mask(create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 96, 96, device="cpu",
                                                  BLOCK_SIZE=(32, 16)))


def test_block_mask_attends_like_flex_attention():
    # FlexAttention with our BlockMask (no mask_mod: whole blocks kept) computes the same
    # attention as our float64 dense reference. It runs here in eager mode on the CPU
    # (unfused: it warns that it materializes the scores).
    from torch.nn.attention.flex_attention import flex_attention

    from tilesparse.attention.reference import attention_reference

    layout = layouts.bigbird(96, 16, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(), num_heads=2)
    q, k, v = (torch.randn(1, 2, 96, 32, dtype=torch.float64) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = flex_attention(q, k, v, block_mask=layouts.to_block_mask(layout))
    want = attention_reference(q, k, v, layout)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_block_mask_attends_like_compiled_flex_attention():
    # The fused (compiled) FlexAttention path skips unlisted blocks and trusts full
    # blocks; it must agree with the eager path above. ~13 s of inductor on 2 cores.
    from torch.nn.attention.flex_attention import flex_attention

    from tilesparse.attention.reference import attention_reference

    torch._dynamo.reset()
    layout = layouts.bigbird(128, 32, window_blocks=3, global_blocks=1, random_blocks=1, seed=_seed(), num_heads=2)
    q, k, v = (torch.randn(1, 2, 128, 32) for _ in range(3))
    got = torch.compile(flex_attention)(q, k, v, block_mask=layouts.to_block_mask(layout))
    want = attention_reference(q, k, v, layout)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_longformer_global_token_count_past_the_sequence_is_named():
    # (review, 2026-12-04: a count of 100 at S 64 was reported as "global_tokens holds 64")
    with pytest.raises(ValueError, match=r"global_tokens must be a count of tokens in \[0, S=64\], got 100"):
        layouts.longformer(64, 16, window=32, global_tokens=100)
