"""BlockSparseSelfAttention: the module against its definition (projections + the
dense-masked attention reference), sequence prefixes, grouped-query heads, padding,
errors, checkpoints, compile, and a GPU check in bf16."""

import copy

import pytest
import torch
from torch import nn

from tilesparse.attention import AttentionLayout
from tilesparse.attention import layouts as attention_layouts
from tilesparse.attention.reference import attention_reference
from tilesparse.nn.attention import BlockSparseSelfAttention
from tolerances import REL_TOL, rel_error


def _expected(module: BlockSparseSelfAttention, x, layout, key_padding_mask=None):
    """The module's definition, spelled out: projections around the reference attention."""
    batch, seq, embed = x.shape
    kv_dim = module.num_kv_heads * module.head_dim
    q, k, v = module.qkv(x).split([embed, kv_dim, kv_dim], dim=-1)
    q = q.view(batch, seq, module.num_heads, module.head_dim).transpose(1, 2)
    k = k.view(batch, seq, module.num_kv_heads, module.head_dim).transpose(1, 2)
    v = v.view(batch, seq, module.num_kv_heads, module.head_dim).transpose(1, 2)
    attn = attention_reference(q, k, v, layout, causal=module.causal, key_padding_mask=key_padding_mask)
    return module.out(attn.to(x.device, x.dtype).transpose(1, 2).reshape(batch, seq, embed))


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=lambda h: f"kv{h}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_module_computes_its_definition(kv_heads, causal):
    layout = attention_layouts.local(128, 16, window=48, causal=causal)
    module = BlockSparseSelfAttention(64, 4, layout, num_kv_heads=kv_heads, causal=causal)
    x = torch.randn(2, 128, 64, requires_grad=True)
    out = module(x)
    assert out.shape == (2, 128, 64)
    with torch.no_grad():
        want = _expected(module, x, layout)
    assert rel_error(out, want) <= REL_TOL[torch.float32]
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_shorter_sequences_use_the_layouts_prefix_and_padding_masks_keys():
    layout = attention_layouts.bigbird(128, 16, window_blocks=3, global_blocks=1, random_blocks=1, seed=0)
    module = BlockSparseSelfAttention(32, 2, layout, causal=False)
    x = torch.randn(2, 70, 32)  # 5 blocks of 16, the last one partial
    padding = torch.zeros(2, 70, dtype=torch.bool)
    padding[1, 50:] = True
    prefix = module.layout_for(70)
    assert prefix.num_blocks == 5 and torch.equal(prefix.mask, layout.mask[:, :5, :5])
    assert module.layout_for(70) is prefix  # cached
    with torch.no_grad():
        out = module(x, key_padding_mask=padding)
        want = _expected(module, x, prefix, key_padding_mask=padding)
    assert rel_error(out, want) <= REL_TOL[torch.float32]
    # padded keys do not matter: changing them leaves every output unchanged
    x2 = x.clone()
    x2[1, 50:] = torch.randn(20, 32)
    with torch.no_grad():
        out2 = module(x2, key_padding_mask=padding)
    assert torch.allclose(out2[1, :50], out[1, :50], atol=1e-5)


def test_in_a_gpt_block_the_loss_falls():
    torch.manual_seed(0)
    seq, embed = 64, 32
    layout = attention_layouts.local(seq, 16, window=32, causal=True)
    block = nn.ModuleDict({"ln": nn.LayerNorm(embed), "attn": BlockSparseSelfAttention(embed, 2, layout),
                           "head": nn.Linear(embed, 16)})
    opt = torch.optim.AdamW(block.parameters(), lr=3e-3)
    x = torch.randn(4, seq, embed)
    target = torch.randint(0, 16, (4, seq))
    losses = []
    for _ in range(30):
        h = x + block["attn"](block["ln"](x))
        loss = nn.functional.cross_entropy(block["head"](h).reshape(-1, 16), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_state_dict_round_trip_and_a_different_layout_is_refused():
    layout = attention_layouts.local(64, 16, window=32, causal=True)
    module = BlockSparseSelfAttention(32, 2, layout)
    state = module.state_dict()
    assert "layout_mask" in state
    twin = BlockSparseSelfAttention(32, 2, layout)
    twin.load_state_dict(state)
    x = torch.randn(1, 64, 32)
    with torch.no_grad():
        assert torch.equal(twin(x), module(x))
    other = BlockSparseSelfAttention(32, 2, attention_layouts.causal(64, 16))
    with pytest.raises(ValueError, match="attention layout differs"):
        other.load_state_dict(state)


@pytest.mark.parametrize("make, match", [
    (lambda L: BlockSparseSelfAttention(30, 4, L), "not divisible by num_heads"),
    (lambda L: BlockSparseSelfAttention(32, 4, L, num_kv_heads=3), "num_kv_heads"),
    (lambda L: BlockSparseSelfAttention(32, 4, "causal"), "AttentionLayout"),
    (lambda L: BlockSparseSelfAttention(32, 4, AttentionLayout(torch.ones(2, 4, 4, dtype=torch.bool), 16)),
     "layout has 2 heads"),
])
def test_bad_arguments_are_named(make, match):
    layout = attention_layouts.causal(64, 16)
    with pytest.raises((ValueError, TypeError), match=match):
        make(layout)


def test_inputs_that_do_not_fit_are_named():
    module = BlockSparseSelfAttention(32, 2, attention_layouts.causal(64, 16))
    with pytest.raises(ValueError, match="exceeds the layout"):
        module(torch.randn(1, 80, 32))
    with pytest.raises(ValueError, match="x must be"):
        module(torch.randn(64, 32))


def test_compiles_fullgraph_and_matches_eager():
    torch._dynamo.reset()
    module = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, window=32, causal=True))
    compiled = torch.compile(copy.deepcopy(module), fullgraph=True)
    x = torch.randn(2, 64, 32)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_e, out_c = module(xe), compiled(xc)
    assert rel_error(out_c, out_e) <= REL_TOL[torch.float32]
    out_e.square().sum().backward()
    out_c.square().sum().backward()
    assert rel_error(xc.grad, xe.grad) <= REL_TOL[torch.float32]
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads", [8, 2], ids=lambda h: f"kv{h}")
def test_gpu_bf16_module_matches_its_definition(kv_heads):
    torch.manual_seed(0)
    layout = attention_layouts.local(1024, 64, window=256, causal=True)
    module = BlockSparseSelfAttention(512, 8, layout, num_kv_heads=kv_heads).to("cuda", torch.bfloat16)
    x = torch.randn(2, 1000, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = module(x)
    reference = copy.deepcopy(module).double()
    with torch.no_grad():
        want = _expected(reference, x.double(), module.layout_for(1000))
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]
    out.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()


def test_prefix_layouts_are_built_before_graph_capture(monkeypatch):
    """A sequence length whose tables are not built yet gets a clear error naming
    prepare() when it is first seen inside a CUDA-graph capture; prepare() builds it (and
    the full length's tables) beforehand."""
    module = BlockSparseSelfAttention(32, 2, attention_layouts.local(64, 16, window=32, causal=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"prepare\(40\)"):
        module.layout_for(40)
    assert module.layout_for(64) is module.layout  # the module built the full layout's CPU tables
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    module.prepare(40, 20)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert module.layout_for(64) is module.layout
    assert module.layout_for(40).num_blocks == 3 and module.layout_for(20).num_blocks == 2
    assert module.layout_for(40).has_tables("cpu", True)
