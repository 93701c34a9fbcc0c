"""The 'small' benchmark suite (batch 1..512, judged by achieved bandwidth) on the CPU:
its byte count, its case table, the rows it writes, the CSV and plot writers, and the
CPU fallback of `tilesparse bench --suite small`. Its GPU timing is not exercised here.
"""

import csv
import json
import math
import time

import pytest
import torch

from tilesparse.bench import BANDWIDTH_COLUMNS, COLUMNS, EXTRA_COLUMNS, get_suite, report, suite_names
from tilesparse.bench.matmul import RunContext
from tilesparse.bench import peers, stream_reference
from tilesparse.bench.small import COPY_METHOD, READ_METHOD, bytes_moved
from tilesparse.bench.timing import host_us, rotation_copies
from tilesparse.cli import main
from tilesparse.layout import BlockLayout

# W [4, 6] in blocks of 2: a 2 x 3 block grid holding 3 blocks.
MASK = torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.bool)


def _read_csv(path):
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


# --------------------------------------------------------------------------- bytes


def test_bytes_moved_by_hand():
    layout = BlockLayout(MASK, 2)
    m, n, k, e = 5, 4, 6, 2  # X [5, 6], W [4, 6], Y [5, 4], 2-byte elements
    weight = 3 * 2 * 2 * e  # nnz * b * b = 24 bytes
    x_bytes, y_bytes = m * k * e, m * n * e  # 60, 40
    # fprop reads row_ptr (2 block-rows + 1) and row_cols (nnz) as int32
    assert bytes_moved("fprop", m, n, k, e, layout) == weight + 4 * (3 + 3) + x_bytes + y_bytes == 148
    # bprop reads col_ptr (3 block-cols + 1), col_rows and col_slot (nnz each)
    assert bytes_moved("bprop", m, n, k, e, layout) == weight + 4 * (4 + 6) + y_bytes + x_bytes == 164
    # updat writes dW's blocks, reads row_of and row_cols, dY and X
    assert bytes_moved("updat", m, n, k, e, layout) == weight + 4 * 6 + y_bytes + x_bytes == 148
    assert bytes_moved("step", m, n, k, e, layout) == 148 + 164 + 148


def test_bytes_moved_dense_has_no_tables():
    m, n, k, e = 5, 4, 6, 2
    dense = n * k * e + m * k * e + m * n * e  # 48 + 60 + 40
    for op in ("fprop", "bprop", "updat"):
        assert bytes_moved(op, m, n, k, e) == dense == 148
    assert bytes_moved("step", m, n, k, e) == 3 * dense


def test_bytes_moved_rejects_a_mismatched_layout_and_unknown_op():
    layout = BlockLayout(MASK, 2)
    with pytest.raises(ValueError, match="does not match"):
        bytes_moved("fprop", 5, 6, 4, 2, layout)
    with pytest.raises(ValueError, match="unknown op"):
        bytes_moved("backward", 5, 4, 6, 2, layout)


def test_rotation_copies_span_the_l2_cache():
    l2 = 50 << 20
    assert rotation_copies(1 << 20, None) == 1  # CPU: no L2 size, no copies
    assert rotation_copies(10 << 30, l2) == 1  # one operand set already exceeds L2 many times
    assert rotation_copies(10 << 20, l2) == 15  # ceil(3 * 50 MiB / 10 MiB)
    assert rotation_copies(1, l2) == 256  # bounded


# --------------------------------------------------------------------------- case table


def test_small_is_registered_with_its_plot():
    assert "small" in suite_names()
    assert get_suite("small").plot is report.plot_bandwidth


def test_small_table_full_and_quick():
    prepare = get_suite("small").prepare
    full = prepare("small")
    assert full["graph"] is True and full["cold_l2"] is True
    assert full["dtypes"] == ["bf16"] and full["ops"] == ["fprop", "bprop"]
    assert full["blocks"] == [16, 32, 64, 128] and full["densities"] == [0.5, 0.25, 0.1, 0.03]
    batch = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert full["shapes"] == [(m, 12288, 12288) for m in batch] + [(m, 4096, 4096) for m in batch]

    quick = prepare("small", quick=True)
    assert quick["shapes"] == [(m, 12288, 12288) for m in (1, 32, 64, 256)]
    assert quick["blocks"] == [32, 128] and quick["densities"] == [0.25, 0.03]


def test_small_table_overrides():
    prepare = get_suite("small").prepare
    table = prepare("small", quick=True, overrides={"shapes": [[8, 256, 512]], "ops": ["updat", "step"]})
    assert table["shapes"] == [(8, 256, 512)] and table["ops"] == ["updat", "step"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"blocks": [48]}, "does not divide"),  # 48 divides 12288 but not 4096
        ({"blocks": [96]}, "does not divide"),
        ({"densities": [1.5]}, "not in"),
        ({"ops": ["backward"]}, "unknown op"),
        ({"shapes": [[0, 128, 128]]}, "non-positive"),
    ],
)
def test_small_table_rejects_impossible_cases(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_suite("small").prepare("small", overrides=overrides)


# --------------------------------------------------------------------------- rows, CSV, plot

TINY = {
    "dtypes": ["fp32"], "shapes": [(1, 64, 128), (8, 64, 128)], "blocks": [16, 32], "densities": [0.5],
    "ops": ["fprop", "bprop"], "peers": ["dense", "torch_bsr", "stk"], "seed": 0, "graph": True, "cold_l2": True,
}
STAMP = {"gpu": "cpu", "torch": torch.__version__, "triton": "-", "commit": "test"}


@pytest.fixture(scope="module")
def cpu_rows():
    """The small suite's rows for a tiny table on the CPU, with a made-up copy bandwidth."""
    ctx = RunContext(cuda=False, stamp=STAMP, copy_bandwidth_gbs=20.0, log=lambda text: None)
    return get_suite("small").run("small", TINY, ctx), ctx


def test_rows_carry_bandwidth(cpu_rows):
    rows, ctx = cpu_rows
    assert {r["method"] for r in rows} == {"dense", "tilesparse"}  # the GPU-only peers skip on the CPU
    assert {"torch_bsr/fprop", "stk/fprop"} <= set(ctx.skipped)
    assert len(rows) == 2 * (2 + 2 * 2)  # per shape: dense x 2 ops, tilesparse x 2 blocks x 2 ops
    for r in rows:
        layout = _random_layout(r) if r["method"] == "tilesparse" else None  # the suite draws the same one
        nbytes = bytes_moved(r["op"], r["M"], r["N"], r["K"], 4, layout)
        assert math.isclose(r["gbps"], nbytes / (r["ms"] * 1e-3) / 1e9)
        assert math.isclose(r["bw_fraction"], r["gbps"] / 20.0)
        assert r["rel_err"] < 1e-4


def test_the_transposed_storage_method_times_fprop_only():
    # tilesparse_t: W's blocks stored in Wᵀ's order (TransposedBlockSparseLinear), fprop only
    ctx = RunContext(cuda=False, stamp=STAMP, copy_bandwidth_gbs=20.0, log=lambda text: None)
    rows = get_suite("small").run("small", dict(TINY, peers=["dense", "tilesparse_t"], copy_reference=False), ctx)
    flipped = [r for r in rows if r["method"] == "tilesparse_t"]
    assert {(r["op"], r["block"], r["M"]) for r in flipped} == {("fprop", b, m) for b in (16, 32) for m in (1, 8)}
    assert all(r["rel_err"] < 1e-4 and r["ms"] > 0 for r in flipped)
    assert "tilesparse_t/bprop" in ctx.skipped


def test_the_kmajor_method_times_its_table_points_on_kmajor_activations(monkeypatch):
    # tilesparse_kmajor: the activations handed over K-major (made before the timed call), at the
    # points of the dispatcher's K-major table only (here: b 16, 16 / 32 rows, density 0.1)
    seen = []
    as_kmajor = peers.as_kmajor
    monkeypatch.setattr(peers, "as_kmajor", lambda a: seen.append(as_kmajor(a)) or seen[-1])
    ctx = RunContext(cuda=False, stamp=STAMP, copy_bandwidth_gbs=20.0, log=lambda text: None)
    table = dict(TINY, shapes=[(8, 512, 512), (16, 512, 512), (32, 512, 512)], densities=[0.1],
                 peers=["dense", "tilesparse_kmajor"], copy_reference=False)
    rows = get_suite("small").run("small", table, ctx)
    kmajor = [r for r in rows if r["method"] == "tilesparse_kmajor"]
    assert {(r["op"], r["block"], r["M"]) for r in kmajor} == {("fprop", 16, 16), ("fprop", 16, 32),
                                                                ("bprop", 16, 32)}
    assert all(r["rel_err"] < 1e-4 and r["ms"] > 0 and r["gbps"] > 0 for r in kmajor)
    assert len(seen) == 3 and all(a.stride(0) == 1 and a.t().is_contiguous() for a in seen)  # A^T contiguous
    assert "tilesparse_kmajor/fprop" in ctx.skipped  # (8 rows; b 32)


def _random_layout(row):
    from tilesparse import layouts

    return layouts.random(row["N"], row["K"], row["block"], row["density"], seed=TINY["seed"])


def test_no_copy_bandwidth_leaves_the_fraction_empty():
    ctx = RunContext(cuda=False, stamp=STAMP, log=lambda text: None)
    table = dict(TINY, shapes=[(1, 64, 128)], blocks=[32], ops=["fprop"])
    rows = get_suite("small").run("small", table, ctx)
    assert all(r["gbps"] > 0 and r["bw_fraction"] is None for r in rows)


def test_copy_reference_rows_move_each_rows_bytes(tmp_path, monkeypatch):
    # each reference call sleeps its own time, so a row's ms says which call it timed
    pause = {COPY_METHOD: 0.004, READ_METHOD: 0.012}
    made = []
    for method, name in ((COPY_METHOD, "copy_call"), (READ_METHOD, "read_call")):
        def make(nbytes, device, method=method):
            made.append(method)
            return lambda: time.sleep(pause[method])
        monkeypatch.setattr(stream_reference, name, make)
    ctx = RunContext(cuda=False, stamp=STAMP, copy_bandwidth_gbs=20.0, log=lambda text: None)
    table = dict(TINY, shapes=[(8, 64, 128)], copy_reference=True)
    rows = get_suite("small").run("small", table, ctx)
    sparse = [r for r in rows if r["method"] == "tilesparse"]
    dense_ms = {r["op"]: r["ms"] for r in rows if r["method"] == "dense"}
    for method, words in ((COPY_METHOD, "SM copy"), (READ_METHOD, "plain read")):
        copies = [r for r in rows if r["method"] == method]
        assert len(copies) == len(sparse) == 4
        for r, c in zip(sparse, copies):
            assert (c["op"], c["block"], c["density"], c["M"]) == (r["op"], r["block"], r["density"], r["M"])
            nbytes = bytes_moved(c["op"], c["M"], c["N"], c["K"], 4, _random_layout(c))
            assert c["ms"] > 0 and math.isclose(c["gbps"], nbytes / (c["ms"] * 1e-3) / 1e9, rel_tol=1e-6)
            assert math.isclose(c["bw_fraction"], c["gbps"] / 20.0)
            assert math.isclose(c["speedup_vs_dense"], dense_ms[c["op"]] / c["ms"], rel_tol=1e-6)
            assert c["rel_err"] is None and c["tflops_nnz"] is None and words in c["note"]
            assert pause[method] * 1e3 <= c["ms"] < pause[method] * 1e3 + 7  # timed this method's call
        # fprop and bprop of one block move bytes within 2 % of each other: one timing serves both
        assert len({c["ms"] for c in copies}) <= 2
    assert set(made) == {COPY_METHOD, READ_METHOD}
    assert report.plot_bandwidth(rows, tmp_path / "with-copy.png").is_file()


def test_csv_bandwidth_columns_only_when_present(cpu_rows, tmp_path):
    rows, _ = cpu_rows
    large_like = [{k: v for k, v in r.items() if k not in BANDWIDTH_COLUMNS} for r in rows]
    header, _ = _read_csv(report.write_csv(large_like, tmp_path / "large.csv"))
    assert header == COLUMNS + EXTRA_COLUMNS  # the large suite's CSV is unchanged

    header, written = _read_csv(report.write_csv(rows + large_like[:1], tmp_path / "small.csv"))
    assert header == COLUMNS + EXTRA_COLUMNS + BANDWIDTH_COLUMNS
    assert float(written[0]["gbps"]) > 0 and float(written[0]["bw_fraction"]) > 0
    assert written[-1]["gbps"] == "" and written[-1]["bw_fraction"] == ""  # a row without them: empty cells


def test_plot_bandwidth_writes_png(cpu_rows, tmp_path):
    rows, _ = cpu_rows
    png = report.plot_bandwidth(rows, tmp_path / "small.png", title="small on cpu")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    no_fraction = [dict(r, bw_fraction=None) for r in rows]  # falls back to GB/s
    assert report.plot_bandwidth(no_fraction, tmp_path / "gbps.png").is_file()
    assert report.plot_bandwidth([r for r in rows if r["method"] == "dense"], tmp_path / "none.png") is None


# --------------------------------------------------------------------------- the command


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback happens only without a GPU")
def test_bench_small_falls_back_to_cpu_reference(tmp_path, capsys):
    argv = ["bench", "--suite", "small", "--quick", "--out", str(tmp_path),
            "--block", "32", "--density", "0.5", "--ops", "fprop"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "No CUDA device" in out and "asked for: 'small'" in out
    (path,) = tmp_path.glob("*-cpu-cpu-reference.csv")
    header, rows = _read_csv(path)
    assert header == COLUMNS + EXTRA_COLUMNS  # the CPU reference rows carry no bandwidth
    assert {r["suite"] for r in rows} == {"cpu-reference"}
    assert {r["method"] for r in rows} == {"dense", "tilesparse"}
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["complete"] and sidecar["timing"].startswith("time.perf_counter")
    assert path.with_suffix(".png").is_file()


def test_host_us_times_every_call_after_the_warmup():
    calls = []
    per_call = host_us(lambda: calls.append(time.sleep(0.001)), n=20, warmup=3)
    assert len(calls) == 23
    assert 1000 <= per_call < 50_000  # at least the 1 ms sleep, in microseconds
