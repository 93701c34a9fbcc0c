"""The 'lstm' and 'lstm-paper' benchmark suites: case tables, a CPU smoke run, the plot."""

import pytest
import torch

# =========================================================================== benchmark suite


def test_bench_lstm_suite_table_and_cpu_smoke_run():
    from tilesparse.bench import COLUMNS, SUITES
    from tilesparse.bench import lstm as bench_lstm
    from tilesparse.bench.matmul import RunContext

    assert "lstm" in SUITES
    for quick in (False, True):
        table = bench_lstm.prepare("lstm", quick=quick)
        assert table["shapes"] == [(table["batch"] * table["steps"], 4 * h, h) for h in table["hidden"]]
    for bad, match in (({"ops": ["fprop"]}, "unknown op 'fprop'"), ({"blocks": [48]}, "block 48 does not divide"),
                       ({"shapes": [[64, 100, 50]]}, "N must be 4K"), ({"densities": [0.0]}, "density 0.0")):
        with pytest.raises(ValueError, match=match):
            bench_lstm.prepare("lstm", overrides=bad)
    assert bench_lstm.dense_hidden_for(4 * 64 * 64 + 4 * 64 * 32, 32) == 64  # exact root

    table = bench_lstm.prepare("lstm", overrides={"hidden": [16], "batch": 2, "steps": 2, "blocks": [8],
                                                  "densities": [0.5], "dtypes": ["fp32"]})
    stamp = {"gpu": "cpu", "torch": torch.__version__, "triton": "-", "commit": "-"}
    rows = bench_lstm.run("lstm", table, RunContext(cuda=False, stamp=stamp, log=lambda text: None))
    assert [(r["op"], r["method"], r.get("baseline")) for r in rows] == [
        ("lstm_step", "cudnn", "equal_hidden"), ("lstm_fwd", "cudnn", "equal_hidden"),
        ("lstm_step", "tilesparse", ""), ("lstm_fwd", "tilesparse", ""),
        ("lstm_step", "cudnn", "equal_params"), ("lstm_fwd", "cudnn", "equal_params"),
    ]
    for r in rows:
        assert set(COLUMNS) <= set(r) and r["ms"] > 0 and r["tflops_nnz"] > 0 and r["speedup_vs_dense"] > 0
        assert r["M"] == 4 and r["N"] == 4 * r["K"] == 4 * r["hidden"]
    sparse = [r for r in rows if r["method"] == "tilesparse"]
    assert all(r["rel_err"] < 1e-5 and r["speedup_vs_equal_params"] > 0 for r in sparse)
    assert all(r["block"] == 8 and r["density"] == 0.5 and r["K"] == 16 and r["time_loops"] == "cpu" for r in sparse)

    # backward on the calling thread: the training-step rows say so, the forward rows do not
    ctx = RunContext(cuda=False, stamp=stamp, log=lambda text: None, autograd_threads=False)
    rows = bench_lstm.run("lstm", table, ctx)
    assert all(("autograd worker threads off" in r["note"]) == (r["op"] == "lstm_step") for r in rows)
    assert torch.autograd.is_multithreading_enabled()


def test_lstm_bench_plot_draws_time_per_step_against_hidden(tmp_path):
    # The suite's plot from rows shaped like its own (no GPU needed to draw).
    from tilesparse.bench.lstm import plot_lstm

    rows = []
    for hidden, ms in ((1024, 0.05), (2048, 0.12), (4096, 0.40)):
        rows.append(dict(method="cudnn", baseline="equal_hidden", dtype="bf16", op="lstm_step", hidden=hidden,
                         block=0, density=1.0, ms_per_step=ms))
        for density in (0.1, 0.03):
            rows.append(dict(method="tilesparse", baseline="", dtype="bf16", op="lstm_step", hidden=hidden,
                             block=32, density=density, ms_per_step=ms * density * 3))
    rows.append(dict(method="cudnn", baseline="equal_params", dtype="bf16", op="lstm_step", hidden=700,
                     block=0, density=1.0, ms_per_step=0.03))
    path = plot_lstm(rows, tmp_path / "lstm.png", title="t")
    assert path is not None and path.stat().st_size > 10_000
    assert plot_lstm([r for r in rows if r["method"] == "cudnn"], tmp_path / "none.png") is None


def test_bench_lstm_paper_table():
    # The paper's setting as its own suite: hidden up to 18432 at 3 % of blocks, dense input.
    from tilesparse.bench import SUITES, get_suite

    get_suite("lstm")
    assert "lstm-paper" in SUITES
    table = SUITES["lstm-paper"].prepare("lstm-paper")
    assert max(table["hidden"]) == 18432 and table["densities"] == [0.03] and not table["sparse_input"]
    assert SUITES["lstm-paper"].prepare("lstm-paper", quick=True)["hidden"] == [12288]
