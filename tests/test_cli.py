"""The `tilesparse` command, run in-process through ``main([...])``.

Without a GPU, `bench` runs the small CPU reference suite; the checks below are the
ones a result file must pass on any machine: the CSV's fixed leading columns, positive
times, a speedup on every tilesparse row, the JSON sidecar and the PNG.
"""

import csv
import json

import pytest
import torch

from tilesparse.bench import COLUMNS
from tilesparse.cli import main

# Two blocks, one density, two ops: enough to cover every writer on the CPU in ~1 s.
SMALL = ["--block", "32", "64", "--density", "0.5", "--ops", "fprop", "updat"]


def _read_csv(path):
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_info_prints_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert "triton" in out and "numpy" in out
    assert ("triton kernels (CUDA)" if torch.cuda.is_available() else "PyTorch reference (CPU)") in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
def test_bench_cpu_writes_csv_json_png(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path)] + SMALL) == 0
    out = capsys.readouterr().out
    assert "No CUDA device" in out

    csvs = list(tmp_path.glob("*-cpu-cpu-reference.csv"))
    assert len(csvs) == 1
    header, rows = _read_csv(csvs[0])
    assert header[: len(COLUMNS)] == COLUMNS
    assert "rel_err" in header
    assert {r["suite"] for r in rows} == {"cpu-reference"}
    assert {r["method"] for r in rows} == {"dense", "tilesparse"}
    assert {r["dtype"] for r in rows} == {"fp32"}
    assert {(r["op"], r["block"]) for r in rows if r["method"] == "tilesparse"} == {
        ("fprop", "32"), ("fprop", "64"), ("updat", "32"), ("updat", "64")
    }
    for r in rows:
        assert float(r["ms"]) > 0
        assert float(r["tflops_nnz"]) > 0
        assert r["gpu"] == "cpu" and r["torch"] == torch.__version__ and r["commit"]
        assert float(r["rel_err"]) < 1e-4
    for r in rows:
        if r["method"] == "tilesparse":
            assert float(r["speedup_vs_dense"]) > 0
            assert float(r["density"]) == 0.5
        else:
            assert float(r["speedup_vs_dense"]) == 1.0

    sidecar = json.loads(csvs[0].with_suffix(".json").read_text())
    assert sidecar["gpu"] == "cpu" and sidecar["torch"] == torch.__version__
    assert sidecar["suite"] == "cpu-reference" and sidecar["rows"] == len(rows) and sidecar["complete"]
    png = csvs[0].with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
def test_bench_no_plot_and_step(tmp_path):
    assert main(["bench", "--out", str(tmp_path), "--no-plot", "--shape", "64x128x256",
                 "--block", "32", "--density", "0.25", "--ops", "step"]) == 0
    assert not list(tmp_path.glob("*.png"))
    (path,) = tmp_path.glob("*.csv")
    _, rows = _read_csv(path)
    assert [(r["method"], r["op"], r["M"], r["N"], r["K"]) for r in rows] == [
        ("dense", "step", "64", "128", "256"), ("tilesparse", "step", "64", "128", "256")
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
@pytest.mark.parametrize("peers, named", [(["none"], "['dense']"), (["stk"], "['dense', 'stk']")])
def test_bench_peers_override_the_suites(tmp_path, capsys, peers, named):
    assert main(["bench", "--out", str(tmp_path), "--no-plot", "--shape", "64x128x256", "--block", "32",
                 "--density", "0.25", "--ops", "fprop", "--peers", *peers]) == 0
    assert f"peers {named}" in capsys.readouterr().out
    (path,) = tmp_path.glob("*.csv")
    _, rows = _read_csv(path)
    assert sorted(r["method"] for r in rows) == ["dense", "tilesparse"]  # stk needs CUDA: skipped, said so


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
def test_bench_step_with_autograd_threads_off(tmp_path):
    # every method's step timed with backward on the calling thread: named in the file and the notes
    assert main(["bench", "--out", str(tmp_path), "--no-plot", "--shape", "64x128x256", "--block", "32",
                 "--density", "0.25", "--ops", "step", "--autograd-threads", "off"]) == 0
    (path,) = tmp_path.glob("*.csv")
    assert "-1thread" in path.name
    _, rows = _read_csv(path)
    assert sorted(r["method"] for r in rows) == ["dense", "tilesparse"]
    assert all("autograd worker threads off" in r["note"] and float(r["ms"]) > 0 for r in rows)
    assert torch.autograd.is_multithreading_enabled()  # restored after timing


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
def test_bench_autograd_threads_off_without_a_step_says_it_changes_nothing(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), "--no-plot", "--shape", "64x128x256", "--block", "32",
                 "--density", "0.25", "--ops", "fprop", "--autograd-threads", "off"]) == 0
    assert "changes only training-step timings" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no subcommand
        ["frobnicate"],
        ["bench", "--block", "abc"],
        ["bench", "--density", "0"],
        ["bench", "--density", "1.5"],
        ["bench", "--shape", "12x34"],
        ["bench", "--dtype", "fp8"],
        ["bench", "--ops", "backward"],
        ["bench", "--suite", "nope"],
        ["bench", "--block", "48", "--shape", "64x128x128"],  # 48 does not divide W
        ["bench", "--peers", "cublas"],
        ["bench", "--peers", "none", "stk"],
        ["bench", "--suite", "attention", "--peers", "stk"],
        ["bench", "--suite", "attention", "--autograd-threads", "off"],
        ["bench", "--autograd-threads", "maybe"],
    ],
)
def test_argument_errors_exit_nonzero(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv + (["--out", str(tmp_path)] if argv[:1] == ["bench"] else []))
    assert info.value.code not in (0, None)
    assert not list(tmp_path.iterdir())  # nothing written before the arguments are checked
    if argv[:1] == ["bench"]:  # the subcommand's own usage, also for errors found after parsing
        assert "tilesparse bench: error:" in capsys.readouterr().err


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_suite_header_names_its_cases(quick):
    """The bench header line is built from any suite's case table (a GPU run of the
    attention and 2:4 suites once failed on a header that assumed matmul shapes)."""
    from tilesparse import bench
    from tilesparse.cli import describe_table

    for name in bench.suite_names():
        table = bench.get_suite(name).prepare(name, quick=quick, overrides={})
        line = describe_table(table)
        assert line and "entries" in line or "[" in line, (name, line)


def test_environment_records_host_launch_time_on_gpus_only():
    # the JSON sidecar's host_launch_us says how fast the machine's host launches (eager
    # rows faster than their calls' host time are host-bound); nothing to time on the CPU
    import torch

    from tilesparse.bench import env

    if torch.cuda.is_available():
        us = env.host_launch_us(calls=50)
        assert 0 < us < 1000
    else:
        assert env.host_launch_us() is None
        assert "host_launch_us" not in env.environment(bandwidth=False)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_draws_a_merged_small_suite_csv_again(tmp_path, capsys):
    # a committed merge of three runs (scripts/merge_results.py): the small suite's bandwidth plot, on the CPU
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "bench" / "results" / "2026-12-03-nvidia-h200-small-m1-512-fcfebea.csv"
    out = tmp_path / "small.png"
    assert main(["plot", str(src), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert "wrote" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU reference suite runs only without a GPU")
def test_plot_of_a_bench_csv_defaults_to_its_png(tmp_path):
    assert main(["bench", "--out", str(tmp_path), "--no-plot"] + SMALL) == 0
    (path,) = tmp_path.glob("*-cpu-cpu-reference.csv")
    assert not path.with_suffix(".png").exists()
    assert main(["plot", str(path)]) == 0
    assert path.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC


def test_plot_into_a_folder_or_a_name_without_suffix_says_the_file_it_wrote(tmp_path, capsys):
    # (review, 2026-12-04: "wrote plots" while matplotlib wrote plots.png)
    assert main(["bench", "--out", str(tmp_path), "--no-plot"] + SMALL) == 0
    (path,) = tmp_path.glob("*-cpu-cpu-reference.csv")
    folder = tmp_path / "plots"
    folder.mkdir()
    capsys.readouterr()
    assert main(["plot", str(path), "--out", str(folder)]) == 0
    assert f"wrote {folder / path.with_suffix('.png').name}" in capsys.readouterr().out.replace("\n", "")
    assert main(["plot", str(path), "--out", str(tmp_path / "named")]) == 0
    assert (tmp_path / "named.png").read_bytes()[:8] == PNG_MAGIC
    assert main(["plot", str(path.with_suffix(".json"))]) == 2  # the run's JSON: named, no traceback
    assert "is not a suite CSV" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["bench"], ["demo", "--steps", "1", "--no-plot"]])
def test_an_out_path_that_is_a_file_is_an_argument_error(tmp_path, capsys, command):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out in (afile, afile / "sub"):
        with pytest.raises(SystemExit) as info:
            main(command + ["--out", str(out)])
        assert info.value.code == 2 and "must be a folder" in capsys.readouterr().err


def test_the_cpu_smoke_suites_run_as_asked_on_a_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU path of the command")
    assert main(["bench", "--suite", "attention-cpu", "--out", str(tmp_path), "--no-plot"]) == 0
    assert list(tmp_path.glob("*-attention-cpu.csv")) and not list(tmp_path.glob("*cpu-reference*"))


@pytest.mark.parametrize("argv, message", [
    (["tune", "--budget", "-5"], "--budget must be a finite number > 0"),
    (["tune", "--min-gain", "-1"], "--min-gain must be a finite number >= 0"),
    (["demo", "--model", "gpt24", "--density", "0.25", "--steps", "1"], "--density does not apply to --model gpt24"),
])
def test_more_argument_errors_name_the_argument(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_read_csv_types_the_cells_again(tmp_path):
    from tilesparse.bench import report

    rows = [{"suite": "small", "op": "fprop", "method": "tilesparse", "dtype": "bf16", "M": 8, "N": 64, "K": 32,
             "block": 16, "density": 0.25, "ms": 0.0125, "commit": "1234567", "note": "", "rel_err": None}]
    path = report.write_csv(rows, tmp_path / "r.csv")
    (back,) = report.read_csv(path)
    assert back["M"] == 8 and isinstance(back["M"], int) and back["density"] == 0.25 and back["ms"] == 0.0125
    assert back["commit"] == "1234567" and back["dtype"] == "bf16"  # text columns stay text
    assert back["rel_err"] is None and back["note"] is None


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("a,b\n1,2\n", "not a suite CSV"),
    ("suite,op,method\nsmall,fprop,dense\nlarge,fprop,dense\n", "expected rows of one suite"),
    ("suite,op,method\nnope,fprop,dense\n", "unknown suite 'nope'"),
])
def test_plot_refuses_what_is_not_one_suites_csv(tmp_path, capsys, content, message):
    path = tmp_path / "x.csv"
    if content is not None:
        path.write_text(content)
    assert main(["plot", str(path)]) == 2
    assert message in capsys.readouterr().out
