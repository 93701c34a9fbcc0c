"""The 'attention' benchmark suite's CPU-side parts: case tables, validation, the flops
count, and an end-to-end run of the CPU smoke table through the reference path (rows,
CSV columns, plot). The GPU tables themselves need a GPU."""

import csv

import pytest
import torch

from tilesparse.bench import COLUMNS, attention, get_suite, report, suite_names
from tilesparse.bench.matmul import RunContext


def test_the_suites_are_registered():
    assert {"attention", "attention-long", "attention-cpu"} <= set(suite_names())


def test_the_issue_table_and_its_quick_subset():
    table = attention.resolve_table("attention")
    assert table["shapes"] == [(4, 16, 8192, 128)] and table["blocks"] == [128]
    names = [s["name"] for s in table["layouts"]]
    assert {"causal", "local1024", "strided", "bigbird", "random10"} <= set(names)
    assert set(table["methods"]) == {"tilesparse", "tilesparse_atomic", "tilesparse_kernel", "flex", "sdpa"} and table["ops"] == ["fwd", "fwd_bwd"]
    quick = attention.resolve_table("attention", quick=True)
    assert [s["name"] for s in quick["layouts"]] == ["causal", "local1024"]


@pytest.mark.parametrize("overrides, match", [
    ({"dtypes": ["fp32"]}, "bf16 or fp16"),
    ({"ops": ["bwd"]}, "unknown op"),
    ({"methods": ["xformers"]}, "unknown method"),
    ({"layouts": [{"name": "a", "builder": "causal"}, {"name": "a", "builder": "causal"}]}, "appears twice"),
    ({"layouts": [{"builder": "causal"}]}, "needs 'name'"),
    ({"blocks": [0]}, "block"),
])
def test_bad_tables_are_refused_by_name(overrides, match):
    with pytest.raises(ValueError, match=match):
        attention.resolve_table("attention", overrides=overrides)


def test_cli_shapes_keep_the_tables_heads():
    table = attention.resolve_table("attention", overrides={"shapes": [(64, 4096, 64)]})
    assert table["shapes"] == [(4, 16, 4096, 64)]  # M = B * H -> B = 64 / 16


def test_flops_count_active_blocks():
    # 4 b^2 D per block per batch element for the forward; fwd_bwd is 3.5x
    assert attention.flops("fwd", 10, 128, 64, 2) == 4.0 * 10 * 128 * 128 * 64 * 2
    assert attention.flops("fwd_bwd", 10, 128, 64, 2) == 3.5 * attention.flops("fwd", 10, 128, 64, 2)


def test_cpu_table_runs_end_to_end(tmp_path):
    # The reference path on the CPU: every pattern gets a tilesparse row per op, dense
    # patterns an SDPA row, and the tilesparse forward is checked against SDPA on causal.
    pytest.importorskip("tilesparse.attention")
    table = attention.resolve_table("attention-cpu")
    ctx = RunContext(cuda=False, stamp={"gpu": "cpu", "torch": torch.__version__, "triton": "", "commit": "test"},
                     log=lambda msg: None)
    rows = get_suite("attention-cpu").run("attention-cpu", table, ctx)
    ours = [r for r in rows if r["method"] == "tilesparse"]
    assert {(r["layout"], r["op"]) for r in ours} == {(s["name"], op) for s in table["layouts"] for op in table["ops"]}
    assert all(r["ms"] and r["ms"] > 0 and not r["note"].startswith("error") for r in ours)
    atomic = [r for r in rows if r["method"] == "tilesparse_atomic"]  # deterministic=False (the CPU path ignores it)
    assert len(atomic) == len(ours) and all(r["ms"] and not r["note"].startswith("error") for r in atomic)
    assert {r["layout"] for r in rows if r["method"] == "sdpa"} == {"causal"}
    assert {r["layout"] for r in rows if r["method"] == "tilesparse_kernel"} == {"causal"}  # dense patterns only
    causal = next(r for r in ours if r["layout"] == "causal")
    assert causal["rel_err"] is not None and causal["rel_err"] < 2e-2  # bf16 against SDPA
    assert causal["speedup_vs_dense"] is not None
    local = next(r for r in ours if r["layout"] == "local64")
    assert 0 < local["density"] < causal["density"] <= 1
    nb = table["shapes"][0][2] // table["blocks"][0]  # shapes are (B, H, S, D)
    # the causal dense layout computes the lower triangle of blocks, diagonal included
    assert causal["density"] == pytest.approx((nb + 1) / (2 * nb))
    path = report.write_csv(rows, tmp_path / "attention.csv")
    with path.open() as f:
        header = next(csv.reader(f))
    assert header[: len(COLUMNS)] == COLUMNS and {"layout", "speedup_vs_flex", "peak_mib", "sm_mhz",
                                                   "power_capped"} <= set(header)
    assert all(r["sm_mhz"] is None and r["power_capped"] is None for r in rows)  # no GPU clock on the CPU
    assert attention.plot_attention(rows, tmp_path / "attention.png").stat().st_size > 1000


@pytest.mark.parametrize("per_head", [False, True], ids=["shared", "per_head"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flex_mask_mod_keeps_the_layouts_elements(per_head, causal):
    """The mask_mod handed to FlexAttention keeps exactly the layout's elements for every
    head index (a shared layout's mask is [1, nb, nb]; indexing it by head overflowed)."""
    from tilesparse.attention import layouts as attention_layouts
    from tilesparse.bench.attention import _mask_mod

    heads, seq, block = 3, 64, 16
    layout = (attention_layouts.random(seq, block, density=0.4, num_heads=heads, seed=1) if per_head
              else attention_layouts.local(seq, block, window=32, causal=causal))
    mod = _mask_mod(layout.mask, block, causal)
    q_idx, kv_idx = torch.meshgrid(torch.arange(seq), torch.arange(seq), indexing="ij")
    for h in range(heads):
        got = mod(0, torch.tensor(h), q_idx, kv_idx)
        blocks = layout.mask[h if per_head else 0]
        want = blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)
        if causal:
            want = want & (q_idx >= kv_idx)
        assert torch.equal(got, want), h
