"""tilesparse.bench.small_goals: the small-batch issue's goals checked on small-suite CSV rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite_csv import write_suite_csv
from tilesparse.bench import small_goals
from tilesparse.cli import main

COLUMNS = ["suite", "op", "method", "dtype", "M", "N", "K", "block", "density", "ms", "speedup_vs_dense",
           "bw_fraction"]


def _row(op, method, block, density, m, speedup, fraction, ms=0.01):
    return dict(suite="small", op=op, method=method, dtype="bf16", M=str(m), N="12288", K="12288", block=str(block),
                density=str(density), ms=str(ms), speedup_vs_dense=str(speedup), bw_fraction=str(fraction))


def _rows():
    return [
        _row("fprop", "dense", 0, 1.0, 32, 1.0, 0.95),
        _row("fprop", "tilesparse", 32, 0.25, 32, 2.8, 0.67),  # 67 % < 75 %
        _row("fprop", "read", 32, 0.25, 32, 0.0, 0.96),  # the bare read at that point
        _row("bprop", "tilesparse", 16, 0.5, 8, 1.3, 0.65),  # b 16: 65 % >= 60 %
        _row("fprop", "tilesparse", 16, 0.5, 64, 0.93, 0.48),  # slower than dense, and < 60 %
        _row("fprop", "tilesparse", 64, 0.5, 128, 1.28, 0.57),  # M 128: the dense check only
        _row("fprop", "tilesparse", 128, 1.0, 8, 0.9, 0.9),  # density 1: no goal
        _row("updat", "tilesparse", 32, 0.25, 32, 1.1, 0.5),  # updat: no bandwidth goal here
        _row("fprop", "tilesparse", 64, 0.1, 8, 0.0, 0.0) | {"ms": ""},  # a failed row: a goal not met
    ]


def _by_goal(checks):
    return {(c.goal, c.block, c.density): c for c in checks}


def test_each_goal_is_checked_where_it_applies():
    checks = _by_goal(small_goals.check_rows(_rows()))
    b32 = checks[("fprop bandwidth, M 32", 32, 0.25)]
    assert not b32.met and b32.measured == pytest.approx(0.67) and b32.wanted == 0.75
    b16 = checks[("bprop bandwidth, M 8", 16, 0.5)]
    assert b16.met and b16.wanted == 0.60
    assert not checks[("fprop bandwidth, M 64", 16, 0.5)].met
    slower = checks[("fprop not slower than dense, M 64", 16, 0.5)]
    assert not slower.met and slower.measured == pytest.approx(0.93)
    assert checks[("fprop not slower than dense, M 128", 64, 0.5)].met
    assert ("fprop bandwidth, M 128", 64, 0.5) not in checks  # bandwidth goal: 1-64 rows only
    assert not any(c.density == 1.0 or c.goal.startswith("updat") for c in checks.values())
    failed = checks[("fprop ran, M 8", 64, 0.1)]  # (review, 2026-12-04: failed rows were skipped, not failed)
    assert not failed.met and [c.density for c in checks.values()].count(0.1) == 1
    assert len(checks) == 8
    ceiling = small_goals.read_ceiling(_rows())
    assert ceiling == {("32x12288x12288", "bf16", "fprop", 32, 0.25): pytest.approx(0.96)}


def test_goals_command_reads_a_small_suite_csv(tmp_path, capsys):
    path = write_suite_csv(tmp_path / "small.csv", COLUMNS, _rows())
    assert main(["goals", str(path), "--failed"]) == 0
    out = capsys.readouterr().out
    assert "| fprop bandwidth, M 32 | 32x12288x12288 | bf16 | 32 | 0.25 | 0.67 | 0.75 | 0.96 | NO |" in out
    assert "bprop bandwidth, M 8" not in out  # met: not listed with --failed
    assert "1 of 3 bandwidth checks met" in out and "3 of 4 not slower than dense checks met" in out


def test_goals_command_refuses_a_suite_without_goals(tmp_path, capsys):
    path = tmp_path / "lstm.csv"
    path.write_text("suite,op,method\nlstm,lstm_step,cudnn\n")
    assert main(["goals", str(path)]) == 2
    assert "goals exist for large, small and attention" in capsys.readouterr().out


def test_the_committed_suite_is_checked_at_every_point():
    # the merged W 12288² run: 224 bandwidth points (M 1-64, 4 blocks, 4 densities, 2 ops) and 320 dense ones
    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "2026-12-03-nvidia-h200-small-m1-512-fcfebea.csv"
    rows = small_goals.load(path)
    checks = small_goals.check_rows(rows)
    assert sum("bandwidth" in c.goal for c in checks) == 224
    assert sum("dense" in c.goal for c in checks) == 320
    assert len(small_goals.read_ceiling(rows)) == 320
