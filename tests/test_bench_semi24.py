"""The 'semi24' benchmark suite's CPU-side parts: its tables, their validation, and an
end-to-end run of the CPU smoke table through the reference paths."""

import pytest
import torch

from tilesparse.bench import get_suite, semi24, suite_names
from tilesparse.bench.matmul import RunContext


def test_the_suites_are_registered_and_the_issue_ffn_is_in_the_table():
    assert {"semi24", "semi24-cpu"} <= set(suite_names())
    table = semi24.resolve_table("semi24")
    assert {"tokens": 16384, "dim": 4096, "hidden": 16384} in table["ffns"]
    assert semi24.resolve_table("semi24", quick=True)["gemms"] == [[16384, 16384, 4096]]


@pytest.mark.parametrize("overrides, match", [
    ({"dtypes": ["fp32"]}, "bf16 or fp16"),
    ({"shapes": [(64, 100, 64)]}, "multiples of 16"),
    ({"prep": [[6, 8]]}, "multiples of 4"),
    ({"ffns": [{"tokens": 0, "dim": 8, "hidden": 8}]}, "ffn tokens"),
])
def test_bad_tables_are_refused_by_name(overrides, match):
    with pytest.raises(ValueError, match=match):
        semi24.resolve_table("semi24", overrides=overrides)


def test_cpu_table_runs_end_to_end():
    table = semi24.resolve_table("semi24-cpu")
    ctx = RunContext(cuda=False, stamp={"gpu": "cpu", "torch": torch.__version__, "triton": "", "commit": "test"},
                     log=lambda msg: None)
    rows = get_suite("semi24-cpu").run("semi24-cpu", table, ctx)
    assert all(r["ms"] and r["ms"] > 0 and not str(r["note"]).startswith("error") for r in rows), \
        [r["note"] for r in rows if r["ms"] is None]
    gemm = {r["method"]: r for r in rows if r["case"] == "gemm"}
    assert set(gemm) == {"dense", "tilesparse", "tilesparse_auto"}
    assert gemm["tilesparse"]["rel_err"] < 2e-2 and gemm["tilesparse"]["speedup_vs_dense"] is not None
    ffn = {(r["method"], r["op"]) for r in rows if r["case"] == "ffn"}
    assert ffn == {(m, op) for m in ("dense", "tilesparse", "tilesparse_auto", "act_dense", "tilesparse_act24")
                   for op in ("ffn_fwd", "ffn_step", "ffn_train_step")} | {
        (m, "ffn_train_loop") for m in ("dense", "tilesparse", "tilesparse_auto")}
    loop = next(r for r in rows if r["op"] == "ffn_train_loop" and r["method"] == "tilesparse")
    assert "100 steps per loop" in loop["note"] and "2 mask updates per timed loop" in loop["note"]  # counted
    assert all(r["speedup_vs_dense"] for r in rows if r["method"].startswith("tilesparse"))
    assert {r["method"] for r in rows if r["case"] == "prep"} == {"optimal", "greedy"}


def test_prep_share_adds_repacking_and_amortized_mask_updates():
    """prep_per_step = sum over both FFN weights of map_pair + (mask + learn_maps) / mask_every,
    as a share of the dense FFN training step."""
    table = {"ffns": [{"tokens": 64, "dim": 8, "hidden": 32}], "prep_tokens": 64}
    ctx = RunContext(cuda=False, stamp={"gpu": "cpu", "torch": torch.__version__, "triton": "", "commit": "test"},
                     log=lambda msg: None)

    def row(op, method, shape, ms):
        return {"op": op, "method": method, "dtype": "bf16", "M": shape[0], "N": shape[1], "K": shape[2], "ms": ms}

    up, down = (64, 32, 8), (64, 8, 32)
    rows = [row("ffn_train_step", "dense", (64, 32, 8), 20.0)]
    for shape, (pair, mask, learn) in ((up, (0.2, 3.0, 9.0)), (down, (0.3, 4.0, 11.0))):
        rows += [row("compress", "map_pair", shape, pair), row("mask", "optimal", shape, mask),
                 row("mask", "greedy", shape, 0.5), row("compress", "learn_maps", shape, learn)]
    rows.insert(0, row("ffn_train_step", "dense", (64, 64, 8), 80.0))  # another FFN's dense step comes first
    semi24._prep_share("semi24", table, "bf16", ctx, rows)
    share = rows[-1]
    expected = 0.2 + 0.3 + (3.0 + 9.0 + 4.0 + 11.0) / 100
    assert share["op"] == "prep_per_step" and share["ms"] == pytest.approx(expected)
    assert f"{100 * expected / 20.0:.1f} %" in share["note"]  # against this FFN's own dense step
    logged = []
    ctx.log = logged.append
    semi24._prep_share("semi24", table, "bf16", ctx, [r for r in rows if r["method"] != "map_pair"])
    assert logged and "not computed" in logged[0]
