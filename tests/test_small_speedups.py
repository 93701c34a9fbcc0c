"""The small-batch speedup tables (tilesparse.ops.small_speedups, one per measured weight):
generated from their committed results, the nearest weight's read at the right M bucket,
and used to warn (running a layer as dense only where the dense path's model says so) at
512 rows and fewer."""

import warnings
from pathlib import Path

import pytest
import torch

from script_modules import load_script
import tilesparse as ts
from tilesparse.ops import dense_dispatch as dd
from tilesparse.ops import small_speedups

ROOT = Path(__file__).resolve().parents[1]
H200 = small_speedups.TABLES["12288x12288"].SMALL_SPEEDUPS["nvidia-h200"]
H200_4096 = small_speedups.TABLES["4096x4096"].SMALL_SPEEDUPS["nvidia-h200"]


def _generator():
    return load_script("scripts/gen_small_speedups.py")


@pytest.mark.parametrize("weight", sorted(small_speedups.TABLES))
def test_each_table_is_the_generators_output_for_its_results(weight):
    gen = _generator()
    module = small_speedups.TABLES[weight]
    base = gen.table_from_csv if module.SOURCE.endswith(".csv") else gen.table_from_probe
    gpu, measured_weight, table = base(ROOT / module.SOURCE)
    assert (gpu, measured_weight) == ("nvidia-h200", weight)
    for update in module.UPDATES:  # later sweeps' or suite runs' points, in order
        apply = gen.update_from_csv if update.endswith(".csv") else gen.update_from_probe
        assert apply(table, gpu, weight, ROOT / update) > 0
    text = gen.render(module.SOURCE, gpu, weight, table, module.UPDATES)
    assert text == gen.target(weight).read_text() == Path(module.__file__).read_text()


def test_a_sweep_whose_dense_was_timed_unlike_the_bases_is_refused():
    # at 4096² the sweep's dense (9.9-10.3 µs, partly from L2) is not the suite's (12.5-14.2): its speedups
    # would understate every point; at 12288² the two time dense alike and the sweep's points replace the base's
    gen = _generator()
    results = ROOT / "bench" / "results"
    base = results / "2026-12-03-nvidia-h200-small-4096-m1-512-9ce3f72.csv"
    gpu, weight, table = gen.table_from_csv(base)
    sweep = results / "2026-12-03-nvidia-h200-small-warps46-check-4096-a1a4c5e.json"
    with pytest.raises(SystemExit, match="differently timed dense"):
        gen.update_from_probe(table, gpu, weight, sweep, gen.dense_ms(base))
    base = results / "2026-12-03-nvidia-h200-small-m1-512-fcfebea.csv"
    gpu, weight, table = gen.table_from_csv(base)
    sweep = results / "2026-12-03-nvidia-h200-small-warps45-m64-e69771e.json"
    assert gen.update_from_probe(table, gpu, weight, sweep, gen.dense_ms(base)) == 18


def test_the_tables_cover_what_they_measured():
    for op in ("fprop", "bprop"):  # every block size 16-128; 12288²: M 1-512, densities 0.03-0.5
        assert sorted(H200[op]) == sorted(H200_4096[op]) == [16, 32, 64, 128]
        for by_m in H200[op].values():
            assert sorted(by_m) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
            assert all([d for d, _ in points] == [0.03, 0.1, 0.25, 0.5] for points in by_m.values())
        for by_m in H200_4096[op].values():  # 4096²: the small suite at M 1-512, densities 0.03-0.5
            assert sorted(by_m) == [1, 8, 32, 64, 128, 256, 512]
            assert all([d for d, _ in points] == [0.03, 0.1, 0.25, 0.5] for points in by_m.values())


@pytest.mark.parametrize("n, k, weight", [(12288, 12288, "12288x12288"), (16384, 16384, "12288x12288"),
                                          (65536, 65536, "12288x12288"), (8192, 8192, "12288x12288"),
                                          (6144, 6144, "4096x4096"), (4096, 4096, "4096x4096"),
                                          (4096, 11008, "4096x4096"), (2048, 2048, "4096x4096")])
def test_a_weight_takes_the_nearest_measured_table(n, k, weight):
    # nearest on a log scale of elements; weights past the largest measured one take its table
    assert small_speedups.nearest_table(n * k) is small_speedups.TABLES[weight]


@pytest.mark.parametrize("n, k", [(4096, 11008), (6144, 6144), (5120, 8192)])
def test_weights_nearer_4096_take_its_table_at_every_measured_row_count(n, k):
    # 4096² is measured at 1-512 rows (the suite of 637af9f), as 12288² is: these weights
    # (nearer 4096² on a log scale) read it all the way
    for rows in (1, 32, 33, 512):
        assert small_speedups.nearest_table(n * k, rows) is small_speedups.TABLES["4096x4096"]
    got = dd.measured_speedup("nvidia-h200", torch.bfloat16, 64, 16, 0.5, False, weight_elements=n * k)
    assert got == pytest.approx(H200_4096["fprop"][16][64][-1][1])


def test_weights_far_below_every_table_get_none():
    assert small_speedups.nearest_table(2048 * 2048 - 1) is None  # under 4096² / REACH
    assert small_speedups.nearest_table(None) is None
    assert small_speedups.nearest_table(0) is None


BIG = 12288 * 12288  # weight elements of the 1-512-row table


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 32, 128, 512])
def test_measured_row_counts_read_their_own_points(rows):
    fprop, bprop = H200["fprop"][128][rows][-1][1], H200["bprop"][128][rows][-1][1]
    args = dict(rows=rows, block_size=128, density=0.5, weight_elements=BIG)
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, training=False, **args) == pytest.approx(fprop)
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, training=True, **args) == pytest.approx(min(fprop, bprop))


@pytest.mark.parametrize("rows, below, above", [(3, 2, 4), (5, 4, 8), (100, 64, 128), (200, 128, 256)])
def test_rows_between_measurements_take_the_lower_of_the_two(rows, below, above):
    # the measurements need not be monotonic in M (tile shapes change between buckets)
    by_m = H200["fprop"][64]
    want = min(by_m[below][-1][1], by_m[above][-1][1])
    got = dd.measured_speedup("nvidia-h200", torch.bfloat16, rows, 64, 0.5, False, weight_elements=BIG)
    assert got == pytest.approx(want)


def test_nothing_claimed_between_the_suites_for_small_weights_or_elsewhere():
    args = dict(block_size=128, density=0.5, training=False, weight_elements=BIG)
    for rows in (0, dd.SMALL_ROWS + 1, 4096, dd.MIN_ROWS - 1):
        assert dd.measured_speedup("nvidia-h200", torch.bfloat16, rows=rows, **args) is None, rows
    for elements in (2048 * 2048 - 1, None):  # weights far below every table, or not known
        assert dd.measured_speedup("nvidia-h200", torch.bfloat16, rows=64, **{**args, "weight_elements": elements}) \
            is None
    # the 4096² table's own points, and between two of its row counts the lower of the two
    small = {**args, "weight_elements": 4096 * 4096}
    by_m = H200_4096["fprop"][128]
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, rows=32, **small) == by_m[32][-1][1]
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, rows=33, **small) == min(by_m[32][-1][1],
                                                                                       by_m[64][-1][1])
    assert dd.measured_speedup("nvidia-h200", torch.float32, rows=64, **args) is None
    assert dd.measured_speedup("nvidia-a100-sxm4-80gb", torch.bfloat16, rows=64, **args) is None
    assert dd.measured_speedup("nvidia-h200", torch.bfloat16, rows=64, **{**args, "block_size": 8}) is None


def test_small_rows_slower_than_dense_warn_and_keep_the_kernels(monkeypatch):
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "1")
    dd._warn_once.cache_clear()
    assert H200["fprop"][32][256][-1][1] < 1  # b 32 at density 0.5, 256 rows: slower than dense
    with pytest.warns(UserWarning, match=r"slower than dense here and runs its kernels.*products near 200 rows"):
        assert not dd._decide("nvidia-h200", torch.bfloat16, 200, 32, 0.5, True, BIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # faster than dense, or a weight too small to claim anything: silent
        assert not dd._decide("nvidia-h200", torch.bfloat16, 32, 128, 0.1, True, BIG)
        for rows in (1, 2, 3, 4):  # b 16 at density 0.5 on the FMA kernel: faster than dense, both ways
            assert not dd._decide("nvidia-h200", torch.bfloat16, rows, 16, 0.5, True, BIG)
        assert not dd._decide("nvidia-h200", torch.bfloat16, 200, 16, 0.5, False, 1024 * 1024)
        assert not dd._decide("nvidia-h200", torch.bfloat16, 8, 128, 0.25, True, 4096 * 4096)  # 1.46-1.52x
    with pytest.warns(UserWarning, match="runs as dense"):  # the large-batch rows still dispatch
        assert dd._decide("nvidia-h200", torch.bfloat16, dd.MIN_ROWS, 16, 0.5, True, BIG)


def test_a_4096_weight_at_density_05_warns_that_b16_is_slower(monkeypatch):
    # W 4096², b 16, density 0.5: faster than dense at 8 rows (1.05-1.11x, the suite of 637af9f, dense
    # streamed past L2 as the kernels are), 0.84-0.95x at 32 rows; the dense path was not measured
    # below 128 rows, so it warns and keeps the kernels
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "1")
    dd._warn_once.cache_clear()
    assert min(H200_4096["fprop"][16][8][-1][1], H200_4096["bprop"][16][8][-1][1]) > 1
    assert max(H200_4096["fprop"][16][32][-1][1], H200_4096["bprop"][16][32][-1][1]) < 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not dd._decide("nvidia-h200", torch.bfloat16, 8, 16, 0.5, True, 4096 * 4096)
    with pytest.warns(UserWarning, match=r"slower than dense here and runs its kernels.*products near 32 rows"):
        assert not dd._decide("nvidia-h200", torch.bfloat16, 32, 16, 0.5, True, 4096 * 4096)


def test_small_rows_run_as_dense_where_the_dense_path_model_says_faster(monkeypatch):
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "1")
    dd._warn_once.cache_clear()
    # the model (fitted to the dense path timed on the H200 at 5af8cc4) against the shipped
    # speedups (the small suite of 2fa57c2, whose deep panels halved b 16's times at 128-512
    # rows, with 51b9550's rows after the panel's slot fix, 5-9 % faster at 512 rows): the
    # forward runs as dense at 512 rows for b 16 at d 0.5 / 0.25 (b 32 at 0.5 no longer)
    faster_as_dense = {(512, 16, 0.5), (512, 16, 0.25)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rows in (128, 256, 512):
            for block in (16, 32):
                for density in (0.5, 0.25, 0.1):
                    got = dd._decide("nvidia-h200", torch.bfloat16, rows, block, density, False, BIG)
                    assert got == ((rows, block, density) in faster_as_dense), (rows, block, density)
                    # training: two scatters and a gather per step; no shipped point is slow enough now
                    assert not dd._decide("nvidia-h200", torch.bfloat16, rows, block, density, True, BIG)
        # ... where kernels were as slow as before (0.25-0.27x, 24fa380's suite) it ran as dense
        assert dd.small_dense_path_faster("nvidia-h200", 256, 0.5, True, 0.26)
        assert not dd.small_dense_path_faster("nvidia-h200", 128, 0.5, True, 0.27)
        # outside the range the dense path was timed in (128-512 rows, density <= 0.5): warn only
        assert not dd._decide("nvidia-h200", torch.bfloat16, 64, 16, 0.5, False, BIG)
        assert not dd._decide("nvidia-h200", torch.bfloat16, 512, 16, 0.75, False, BIG)
        assert not dd._decide("nvidia-h200", torch.bfloat16, 512, 64, 1.0, False, BIG)
        monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "0")
        assert not dd._decide("nvidia-h200", torch.bfloat16, 512, 16, 0.5, False, BIG)
    assert not dd.small_dense_path_faster("nvidia-a100-sxm4-80gb", 256, 0.5, False, 0.1)  # not measured there
    assert dd.small_path_ratio("nvidia-h200", 128, 0.5) == pytest.approx(1.5 * 0.91)
    assert dd.small_path_ratio("nvidia-h200", 378, 0.5) == pytest.approx(1.5 * 0.91 / 2)


@pytest.mark.gpu
def test_gpu_layer_at_few_rows_warns_and_matches_the_kernels():
    if dd._gpu(torch.cuda.current_device()) not in small_speedups.TABLES["12288x12288"].SMALL_SPEEDUPS:
        pytest.skip("no small-batch measurements for this GPU")
    layer = ts.nn.BlockSparseLinear(8192, 8192, block_size=32, density=0.5).cuda().to(torch.bfloat16)
    assert small_speedups.nearest_table(layer.in_features * layer.out_features) is small_speedups.TABLES["12288x12288"]
    x = torch.randn(256, 8192, device="cuda", dtype=torch.bfloat16)
    dd._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="runs its kernels"):
        got = layer(x)
    with dd.kernels_only():
        assert torch.equal(got, layer(x))  # the kernels' result, bit for bit


@pytest.mark.gpu
def test_gpu_layer_at_few_rows_runs_as_dense_where_faster():
    # b 16 at density 0.5 and 512 rows: the forward measured at 0.62x dense (12288² table, the
    # nearest that measured 512 rows), under the dense path's model for the forward (one scatter:
    # 1 / (1 + 0.50) = 0.66), so inference runs as dense; training pays two scatters and a
    # gather per step (0.44 there) and keeps the kernels. The dense path's gradients are
    # checked through dense_linear against the kernels'.
    from tolerances import assert_close

    gpu = dd._gpu(torch.cuda.current_device())
    if gpu not in dd.SMALL_PATH:
        pytest.skip("no dense-path measurements for this GPU")
    layer = ts.nn.BlockSparseLinear(8192, 8192, block_size=16, density=0.5).cuda().to(torch.bfloat16)
    x = torch.randn(512, 8192, device="cuda", dtype=torch.bfloat16)
    speedup = dd.measured_speedup(gpu, torch.bfloat16, 512, 16, 0.5, False, 8192 * 8192)
    assert dd.small_dense_path_faster(gpu, 512, 0.5, False, speedup), "the premise: inference as dense"
    dd._warn_once.cache_clear()
    with torch.no_grad(), pytest.warns(UserWarning, match="runs as dense"):
        got = layer(x)
    with torch.no_grad(), dd.kernels_only():
        want = layer(x)
    assert_close(got, want, torch.bfloat16, "forward as dense")
    x.requires_grad_()
    dd._warn_once.cache_clear()
    with pytest.warns(UserWarning, match="runs its kernels"):
        want = layer(x)
    want.float().square().mean().backward()
    grads = x.grad.clone(), layer.weight.grad.clone()
    x.grad = None
    layer.zero_grad()
    meta = layer.layout.meta_on(x.device)
    got = dd.dense_linear(x, layer.weight, meta, layer.bias, layer.layout.block_rows, layer.layout.block_cols)
    got.float().square().mean().backward()
    assert_close(got, want, torch.bfloat16, "forward as dense, training")
    assert_close(x.grad, grads[0], torch.bfloat16, "dX as dense")
    assert_close(layer.weight.grad, grads[1], torch.bfloat16, "dW blocks as dense")
