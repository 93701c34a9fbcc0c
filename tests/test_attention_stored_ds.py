"""Block-sparse attention's backward with dQ from stored dS (kernels/attention_stored_ds.py):
against the float64 reference (interpreter on CPU, and marked GPU cases), bitwise
determinism, the workspace limit, and the CSR -> CSC slot table."""

from __future__ import annotations

import os

import pytest
import torch

from attention_cases import _seed, check_case, interpreter, make_inputs, padding, run_kernels
from tilesparse.attention import layouts
from tilesparse.attention.layout import attention_table_views
from tilesparse.kernels import attention_stored_ds as stored


@pytest.fixture
def stored_ds_on(monkeypatch):
    """TILESPARSE_STORED_DS=on; yields the grids the dQ-from-dS kernel was launched with."""
    import tilesparse.kernels.attention as attention_launchers

    monkeypatch.setenv("TILESPARSE_STORED_DS", "on")

    launches = []
    real_launch = attention_launchers.launch

    def counting_launch(kernel, *args, **kwargs):
        if kernel is stored._bwd_dq_from_ds_kernel:
            launches.append(args[0])
        return real_launch(kernel, *args, **kwargs)

    monkeypatch.setattr(attention_launchers, "launch", counting_launch)
    return launches


CASES = {
    # (layout, B, H, Hkv, D, dtype, causal, padding)
    "local_causal_gqa_oddS_fp16": (lambda: layouts.local(75, 16, 24, causal=True), 1, 4, 2, 32, torch.float16, True,
                                   None),
    "perhead_random_pad_fp32": (lambda: layouts.random(80, 16, 0.5, _seed(), num_heads=2), 2, 2, 1, 32,
                                torch.float32, False, "tail"),
    "bigbird_shared_fp16": (lambda: layouts.bigbird(96, 32, window_blocks=1, global_blocks=1, random_blocks=1,
                                                    seed=_seed()), 1, 2, 2, 48, torch.float16, False, None),
    "allpad_rows_fp32": (lambda: layouts.local(48, 16, 16), 2, 1, 1, 32, torch.float32, False, "all"),
}


@interpreter
@pytest.mark.parametrize("case", list(CASES))
def test_stored_ds_backward_matches_reference(case, stored_ds_on):
    make, B, H, Hkv, D, dtype, causal, pad = CASES[case]
    check_case(make(), B, H, Hkv, D, dtype, causal, pad)
    assert len(stored_ds_on) == 1  # the dQ-from-dS kernel ran (once)


@interpreter
@pytest.mark.parametrize("tiles", [((16, 16), (32, 16)), ((32, 16, True), (16, 32)), ((16, 32), (16, 16))],
                         ids=["kv16x16-q32x16", "kv32x16-two-pass-q16x32", "kv16x32-q16x16"])
def test_stored_ds_with_other_tiles_than_the_dq_kernels(tiles, stored_ds_on, monkeypatch):
    # the dK/dV kernel's BLOCK_M x BLOCK_N (query steps, key splits of a block) and the dQ
    # kernel's differ: each element of each stored tile is written once and read by its pair
    import tilesparse.kernels.attention as attention_launchers

    kv, dq = tiles
    configs = {"dkdv": attention_launchers.AttentionConfig(kv[0], kv[1], two_pass=len(kv) > 2),
               "dq": attention_launchers.AttentionConfig(*dq)}
    real = attention_launchers.attention_config
    monkeypatch.setattr(attention_launchers, "attention_config",
                        lambda kind, *args: configs.get(kind) or real(kind, *args))
    layout = layouts.random(75, 32, 0.5, _seed(), num_heads=4)
    check_case(layout, 1, 4, 2, 32, torch.float16, True, "tail")
    assert len(stored_ds_on) == 1


@interpreter
def test_stored_ds_with_a_layout_per_pair_of_heads(stored_ds_on):
    # 2 layout heads for 4 query heads (the launchers take it; the op allows 1 or H): heads
    # 0 and 2 share layout 0 but each keeps its own dS rows
    layout = layouts.random(64, 16, 0.5, _seed(), num_heads=2)
    q, k, v = make_inputs(1, 4, 4, 64, 32, torch.float32)
    grad_out = torch.randn(1, 4, 64, 32)
    stored = run_kernels(q, k, v, layout, False, None, 0.2, grad_out)[2]
    os.environ["TILESPARSE_STORED_DS"] = "off"
    recomputed = run_kernels(q, k, v, layout, False, None, 0.2, grad_out)[2]
    for a, b in zip(stored, recomputed):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    assert len(stored_ds_on) == 1


@interpreter
def test_stored_ds_gradients_are_bitwise_deterministic(stored_ds_on):
    layout = layouts.bigbird(96, 16, window_blocks=3, global_blocks=1, random_blocks=2, seed=_seed())
    q, k, v = make_inputs(1, 4, 2, 96, 32, torch.float16)
    grad_out = torch.randn(1, 4, 96, 32).to(torch.float16)
    kpm = padding(1, 96, "tail")
    first = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out)[2]
    second = run_kernels(q, k, v, layout, True, kpm, 0.25, grad_out)[2]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert len(stored_ds_on) == 2


@interpreter
def test_workspace_past_the_limit_recomputes(stored_ds_on, monkeypatch):
    monkeypatch.setattr(stored, "MAX_WORKSPACE_BYTES", 1024)
    check_case(layouts.local(48, 16, 16), 1, 2, 1, 32, torch.float32, False, None)
    assert stored_ds_on == []


def test_mode_budget_and_plan(monkeypatch):
    monkeypatch.delenv("TILESPARSE_STORED_DS", raising=False)
    assert stored.MODE == "off" and not stored.enabled()
    assert stored.plan(4, 16, 16, 1, 540, 128, torch.bfloat16, 128 << 20) is None
    for on in ("on", "1", " True "):
        monkeypatch.setenv("TILESPARSE_STORED_DS", on)
        assert stored.enabled(), on
    # issue 6's local-1024 case: 540 pairs per head, shared by 16 heads, batch 4, blocks of
    # 128, bf16: 1.1 GB of workspace against 128 MiB activations: one chunk
    assert stored.workspace_bytes(4, 16, 1, 540, 128, torch.bfloat16) == 4 * 16 * 540 * 128 * 128 * 2
    assert stored.budget_bytes(128 << 20) == min(stored.MAX_WORKSPACE_BYTES, stored.ACTIVATION_FACTOR * (128 << 20))
    chunks, rows = stored.plan(4, 16, 16, 1, 540, 128, torch.bfloat16, 128 << 20)
    assert chunks == [stored.Chunk(0, 64, 0, 64, 0)] and rows == 64
    # causal at S 8192 (2080 pairs, 4.4 GB): chunks of kv heads, each covering its rows
    chunks, rows = stored.plan(4, 16, 16, 1, 2080, 128, torch.bfloat16, 128 << 20)
    assert len(chunks) == 3 and rows == 31 and chunks[-1].kv_end == 64  # 2 GiB / 68 MB a row
    assert all(c.q_first == c.row_first == c.kv_first for c in chunks)  # no GQA: a row per (batch, head)
    # GQA (4 query heads a kv head) and a layout per head (heads share a batch's row), with
    # budgets of one and two units
    monkeypatch.setattr(stored, "ACTIVATION_FACTOR", 1)
    chunks, rows = stored.plan(2, 8, 2, 1, 10, 16, torch.float16, 10 * 16 * 16 * 2 * 4)
    assert [(c.kv_first, c.kv_end, c.q_first, c.q_end, c.row_first) for c in chunks] == \
        [(0, 1, 0, 4, 0), (1, 2, 4, 8, 4), (2, 3, 8, 12, 8), (3, 4, 12, 16, 12)] and rows == 4
    chunks, rows = stored.plan(3, 4, 2, 4, 40, 16, torch.float16, 40 * 16 * 16 * 2 * 2)
    assert [(c.kv_first, c.kv_end, c.q_first, c.q_end, c.row_first) for c in chunks] == \
        [(0, 4, 0, 8, 0), (4, 6, 8, 12, 2)] and rows == 2
    monkeypatch.undo()
    monkeypatch.setenv("TILESPARSE_STORED_DS", "on")
    # S 131072 at 2 % with 2 heads: 1.3 GB a head against 32 MiB activations: recompute
    assert stored.plan(1, 2, 2, 1, 20500, 128, torch.bfloat16, 32 << 20) is None
    assert stored.plan(1, 2, 2, 1, 0, 128, torch.bfloat16, 32 << 20) is None  # nothing stored


@interpreter
@pytest.mark.parametrize("shared", [True, False], ids=["shared-layout", "per-head-layouts"])
def test_stored_ds_in_chunks_of_heads(shared, stored_ds_on, monkeypatch):
    # a budget of ~one unit: several dK/dV + dQ launch pairs over one small workspace
    monkeypatch.setattr(stored, "ACTIVATION_FACTOR", 1)
    layout = layouts.random(64, 16, 0.6, _seed(), num_heads=None if shared else 4)
    check_case(layout, 3, 4, 2, 32, torch.float32, False, "tail")  # (causal would trim the layout's blocks)
    assert len(stored_ds_on) == 2


@pytest.mark.parametrize("num_heads", [1, 3])
def test_row_entry_slots_give_each_csr_entry_its_csc_position(num_heads):
    layout = layouts.random(96, 16, 0.4, _seed(), num_heads=num_heads)
    nb = 96 // 16
    meta = layout.meta_on("cpu", False)
    row_ptr, col_ptr, row_cols, col_rows = (t.tolist() for t in attention_table_views(meta, num_heads, nb))
    slots = stored.row_entry_slots(meta, num_heads, nb)
    assert slots is stored.row_entry_slots(meta, num_heads, nb)  # remembered
    for lm in range(num_heads * nb):
        head, m = divmod(lm, nb)
        for e in range(row_ptr[lm], row_ptr[lm + 1]):
            slot = slots[e].item()
            n = row_cols[e]
            assert col_ptr[head * nb + n] <= slot < col_ptr[head * nb + n + 1]
            assert col_rows[slot] == m


@pytest.mark.gpu
@pytest.mark.parametrize("block, D", [(64, 64), (128, 128), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_stored_ds_backward_matches_reference(block, D, dtype, stored_ds_on):
    from attention_cases import reference_with_grads
    from tolerances import assert_close

    layout = layouts.bigbird(1000, block, window_blocks=1, global_blocks=1, random_blocks=1, seed=_seed(),
                             num_heads=2)
    q, k, v = (t.cuda() for t in make_inputs(2, 2, 1, 1000, D, dtype))
    grad_out = torch.randn(2, 2, 1000, D, device="cuda").to(dtype)
    kpm = padding(2, 1000, "tail").cuda()
    out, _, grads = run_kernels(q, k, v, layout, True, kpm, D ** -0.5, grad_out)
    ref, _, ref_grads = reference_with_grads(q.cpu(), k.cpu(), v.cpu(), layout, grad_out.cpu(), causal=True,
                                             scale=D ** -0.5, key_padding_mask=kpm.cpu())
    assert_close(out, ref, dtype, "out")
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert_close(got, want, dtype, name)
    assert len(stored_ds_on) == 1
