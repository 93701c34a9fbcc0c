"""tilesparse.bench.attention_goals: the block-sparse attention issue's goals checked on attention-suite rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite_csv import write_suite_csv
from tilesparse.bench import attention_goals
from tilesparse.cli import main

COLUMNS = ["suite", "op", "method", "dtype", "block", "density", "ms", "batch", "heads", "seq", "head_dim", "layout"]


def _row(layout, op, method, ms, seq=8192, density=0.13):
    return dict(suite="attention", op=op, method=method, dtype="bf16", block="128", density=str(density), ms=str(ms),
                batch="4", heads="16", seq=str(seq), head_dim="128", layout=layout)


def _rows():
    return [
        _row("local1024", "fwd", "tilesparse", 0.58),  # <= 0.62
        _row("local1024", "fwd", "flex", 0.92),  # 1.59x
        _row("local1024", "fwd_bwd", "tilesparse", 2.6),  # > 2.5 ms
        _row("local1024", "fwd_bwd", "flex", 3.05),  # 1.17x < 1.3
        _row("causal", "fwd_bwd", "tilesparse", 7.6, density=0.51),
        _row("causal", "fwd_bwd", "flex", 10.2),  # 1.34x >= 1
        _row("causal", "fwd_bwd", "sdpa", 6.0),  # 7.6 / 6.0 = 1.27 > 1.15
        _row("fixed", "fwd", "tilesparse", 0.56),
        _row("fixed", "fwd", "flex", 0.60),  # not a layout the ratio goal names
        _row("random10", "fwd", "tilesparse_atomic", 1.0, density=0.1),
        _row("random10", "fwd", "flex", 1.5),  # 1.5x, under its own name
        _row("strided", "fwd", "tilesparse", 0.5, seq=2048),  # another shape: left out
        _row("strided", "fwd", "flex", 0.4, seq=2048),
        _row("bigbird", "fwd", "tilesparse", ""),  # a failed row: a goal not met
    ]


def test_each_goal_is_checked_where_it_applies():
    checks = {c.goal: c for c in attention_goals.check_rows(_rows())}
    assert checks["fwd ms at most, local1024"].met
    slow = checks["fwd_bwd ms at most, local1024"]
    assert not slow.met and slow.measured == pytest.approx(2.6) and slow.wanted == 2.5
    assert checks["fwd speedup over flex, local1024"].measured == pytest.approx(0.92 / 0.58)
    assert not checks["fwd_bwd speedup over flex, local1024"].met
    assert checks["fwd_bwd speedup over flex, causal"].met and checks["fwd_bwd speedup over flex, causal"].wanted == 1
    sdpa = checks["fwd_bwd time over sdpa's, causal"]
    assert not sdpa.met and sdpa.measured == pytest.approx(7.6 / 6.0) and sdpa.density == pytest.approx(0.51)
    assert checks["fwd speedup over flex (deterministic=False), random10"].met
    assert not any("fixed" in g or "strided" in g for g in checks)
    assert not checks["fwd ran, bigbird"].met  # (review, 2026-12-04: failed rows were skipped)
    assert len(checks) == 8


def test_goals_command_reads_an_attention_csv(tmp_path, capsys):
    path = write_suite_csv(tmp_path / "attention.csv", COLUMNS, _rows())
    assert main(["goals", str(path), "--failed"]) == 0
    out = capsys.readouterr().out
    assert "fwd_bwd ms at most, local1024" in out and "fwd ms at most, local1024" not in out.replace("fwd_bwd", "")
    assert "4 of 8 checks met" in out


def test_the_committed_suite_meets_all_but_random_10_percent_forward_backward():
    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "2026-12-02-nvidia-h200-attention-41c4838.csv"
    checks = attention_goals.check_rows(attention_goals.load(path))
    assert len(checks) == 26
    assert sorted(c.goal for c in checks if not c.met) == [
        "fwd_bwd speedup over flex (deterministic=False), random10", "fwd_bwd speedup over flex, random10"]
