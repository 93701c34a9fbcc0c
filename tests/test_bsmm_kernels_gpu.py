"""dds's other kernels on CUDA: the small-batch (weight-streaming) kernel, with and
without its split reduction, and the panel kernel for small blocks, forced by config
against float64 CPU references (setup as in test_bsmm_gpu.py). Marked ``gpu``."""

import dataclasses

import pytest
import torch

import tilesparse
from bsmm_cases import dense_of, make_layout, random_values
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels._tiles import tile_for
from tolerances import assert_close

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BLOCK_SIZES = [8, 16, 32, 64, 128]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
IN_FEATURES, OUT_FEATURES = 1024, 768  # as test_bsmm_gpu.py: divisible by every block size


def _grid(block_size):
    return OUT_FEATURES // block_size, IN_FEATURES // block_size


def _dds_case(block_size, dtype, trans, m):
    """(operands, expected): A, the blocks, bias and tables of a layout with an empty
    block-row and block-column, and the float64 reference of dds on them."""
    layout = make_layout("empty_rows_cols", *_grid(block_size), block_size)
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows, device=DEVICE).to(dtype)
    values = random_values(layout, dtype, DEVICE)
    bias = torch.randn(rows if trans else cols, device=DEVICE).to(dtype)
    s = dense_of(values, layout)
    expected = a.double().cpu() @ (s.t() if trans else s) + bias.double().cpu()
    return (a, values, layout.meta_on(DEVICE), bias, layout.block_rows, layout.block_cols, trans), expected


# --------------------------------------------------------------------------- small-batch kernel
# dds has two kernels: large-batch tiles and a weight-streaming kernel for few rows.
# Both are forced here at the M values around the dispatch threshold, every block size
# and dtype, both table directions, with bias.


@pytest.mark.parametrize("path", ["large", "small", "small-split3", "small-chunks2-longest", "small-swap",
                                  "small-prefetch", "small-swap-prefetch", "small-l2ahead", "small-spread",
                                  "small-prefetch-spread", "small-per-lane"])
@pytest.mark.parametrize("m", [1, 37, 64, 100], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda b: f"b{b}")
def test_dds_both_kernels(block_size, dtype, trans, m, path):
    from tilesparse.kernels import bsmm_small

    operands, expected = _dds_case(block_size, dtype, trans, m)
    if path == "large":
        cfg = kernels.dds_config(m, block_size, dtype)
    else:
        cfg = bsmm_small.small_config(m, block_size, dtype)
        if path == "small-split3":
            cfg = dataclasses.replace(cfg, splits=3)
        elif path == "small-chunks2-longest":
            cfg = dataclasses.replace(cfg, chunks=2, longest_first=True)
        elif path == "small-swap":
            cfg = dataclasses.replace(cfg, swap=True)
        elif path == "small-prefetch":
            cfg = dataclasses.replace(cfg, prefetch=True)
        elif path == "small-swap-prefetch":
            cfg = dataclasses.replace(cfg, swap=True, prefetch=True)
        elif path == "small-l2ahead":
            cfg = dataclasses.replace(cfg, l2_ahead=3)
        elif path in ("small-spread", "small-prefetch-spread", "small-per-lane"):
            # 4-block steps where the tile is at most 32 wide (b 8-32); wider blocks step within
            # one block, where spread_index is ignored; per-lane: one index load per reduction lane
            tile = tile_for(block_size)
            cfg = dataclasses.replace(cfg, block_k=4 * tile if tile <= 32 else cfg.block_k,
                                      spread_index=path != "small-per-lane", prefetch=path == "small-prefetch-spread")
    assert_close(kernels.dds(*operands, config=cfg), expected, dtype, f"dds {path}")


@pytest.mark.parametrize("m", [100, 200, 300, 512], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"b{b}")
def test_dds_mid_m_configs(block_size, dtype, trans, m):
    # the M 128-512 configs in the shipped H200 table: 64-wide slices with a slice's row
    # tiles inner, at 64 and at 128 rows a program (two warpgroups); M not a multiple of either
    from tilesparse.kernels import bsmm_small

    operands, expected = _dds_case(block_size, dtype, trans, m)
    for cfg in (bsmm_small.SmallConfig(64, 64, 64, 4, 8, swap=True, m_inner=True),
                bsmm_small.SmallConfig(64, 64, 128, 8, 6, swap=True, m_inner=True)):
        assert_close(kernels.dds(*operands, config=cfg), expected, dtype, f"dds {cfg}")


@pytest.mark.parametrize("m", [1, 5, 16], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"b{b}")
def test_dds_small_wgmma_slices(block_size, dtype, trans, m):
    # 64-wide slices at few rows without the swap (wgmma on sm_90: the weight slice as the MMA's M
    # side, the rows padded to 16 as N; the fiftieth session's candidates `s64k128st6w4` /
    # `s64k64st8w4` of scripts/probes/small_variants.py), against float64, with bias
    from tilesparse.kernels import bsmm_small

    operands, expected = _dds_case(block_size, dtype, trans, m)
    for cfg in (bsmm_small.SmallConfig(64, min(block_size, 128), 16, 4, 6),
                bsmm_small.SmallConfig(64, 64, 16, 4, 8)):
        assert_close(kernels.dds(*operands, config=cfg), expected, dtype, f"dds {cfg}")


# --------------------------------------------------------------------------- panel kernel (small blocks)


@pytest.mark.parametrize("splits", [1, 4], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("group", [4, 8])
@pytest.mark.parametrize("m", [37, 1000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 32], ids=lambda b: f"b{b}")
def test_dds_panel_kernel(block_size, dtype, trans, m, group, splits):
    from tilesparse.kernels import bsmm_panel

    if block_size * group > 128:
        pytest.skip("panels wider than 128 columns are not a supported config")
    operands, expected = _dds_case(block_size, dtype, trans, m)
    out = kernels.dds(*operands, config=bsmm_panel.PanelConfig(group, splits=splits))
    assert_close(out, expected, dtype, "dds panel")


@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("entries,swap", [(4, True), (8, True), (2, False)], ids=["e4swap", "e8swap", "e2"])
@pytest.mark.parametrize("m", [8, 37], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [16, 32], ids=lambda b: f"b{b}")
def test_dds_panel_kernel_deep_steps_and_swap(block_size, dtype, trans, m, entries, swap, splits):
    # several union entries per step (the last one partial where the union's length is not
    # a multiple), the features as the MMA's M side; rows fewer than a tile
    from tilesparse.kernels import bsmm_panel
    from tilesparse.kernels._device import shared_memory_bytes

    if dtype == torch.float32 and entries * block_size > 128 and shared_memory_bytes(torch.device(DEVICE)) < 227 << 10:
        pytest.skip("fp32's 256-deep steps were seen to fit in an H200's 227 KB of shared memory, not less")
    operands, expected = _dds_case(block_size, dtype, trans, m)
    cfg = bsmm_panel.PanelConfig(128 // block_size, block_m=16 if m <= 16 else 64, splits=splits, entries=entries,
                                 swap=swap)
    out = kernels.dds(*operands, config=cfg)
    assert_close(out, expected, dtype, "dds panel, deep steps")


@pytest.mark.parametrize("stages", [3, 6], ids=lambda s: f"st{s}")
@pytest.mark.parametrize("swap,m", [(True, 8), (True, 37), (False, 37), (False, 150)],
                         ids=["swap-m8", "swap-m37", "m37", "m150"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [16, 32], ids=lambda b: f"b{b}")
def test_dds_panel_fused_split_sum(block_size, dtype, trans, swap, m, stages):
    # each tile's last split sums the partials in split order: right, bitwise repeatable,
    # counters left zero (a second call and a captured replay agree); the swapped few-row
    # tiles and the 128 x 128 tiles of 128-512 rows (two row tiles at 150, the second partial);
    # 3 stages (two buffers, one step's loads in flight) and 6 (three buffers, two steps: the
    # H200 table's b 16 bprop entries at 5-32 rows)
    from tilesparse.kernels import _alloc, bsmm_panel

    operands, expected = _dds_case(block_size, dtype, trans, m)
    block_m = (16 if m <= 16 else 64) if swap else 128
    cfg = bsmm_panel.PanelConfig(128 // block_size, block_m=block_m, num_stages=stages, splits=3,
                                 entries=64 // block_size, swap=swap, fused_sum=True)
    first = kernels.dds(*operands, config=cfg)
    assert_close(first, expected, dtype, "dds panel, fused split sum")
    assert torch.equal(first, kernels.dds(*operands, config=cfg))
    assert int(_alloc.arrival_counters(first.device, 64).abs().sum()) == 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.dds(*operands, config=cfg)
    captured.fill_(float("nan"))
    for _ in range(2):
        graph.replay()
        assert torch.equal(captured, first)


def test_panel_config_past_the_shared_memory_is_refused_by_name():
    # a config whose tiles do not fit (bf16, b 32, 256 features x 256-deep steps, 4 stages:
    # ~160 KB a stage) names the reason instead of Triton's launch error; a tuned entry like
    # it would run another kernel. (fp32 at 256 deep with the exact dot does fit on an H200.)
    from tilesparse.kernels import bsmm_panel

    operands, _ = _dds_case(32, torch.bfloat16, True, 37)
    with pytest.raises(ValueError, match="more shared memory than this GPU has"):
        kernels.dds(*operands, config=bsmm_panel.PanelConfig(8, block_m=64, entries=8, swap=True, num_stages=4))


def test_panel_config_first_asked_for_in_a_graph_capture_is_refused_then_captures():
    # the panel tables need a host sync: a caller's config inside a capture before any call
    # is refused with the reason; after one eager call the same config captures and replays
    from tilesparse.kernels import bsmm_panel

    operands, expected = _dds_case(16, torch.bfloat16, True, 8)
    cfg = bsmm_panel.PanelConfig(8, block_m=16, splits=2, entries=4, swap=True)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="CUDA graph is being captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            kernels.dds(*operands, config=cfg)
    kernels.dds(*operands, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.dds(*operands, config=cfg)
    out.fill_(float("nan"))
    graph.replay()
    assert_close(out, expected, torch.bfloat16, "captured dds panel")


def test_the_h200_table_sends_b16_half_dense_products_at_5_to_512_rows_to_the_deep_panel(monkeypatch):
    # the shipped entries (W 12288², b 16, density 0.5: bprop at 5-64 rows, fprop at 33-64,
    # both at 65-512; density 0.25: bprop at 17-64 rows): the dispatcher runs the panel kernel;
    # at density 0.25 and 5-16 rows bprop runs the small kernel (forty-first session); inside a
    # capture on a layout whose panel tables are not built yet it runs another kernel rather than raising
    from tilesparse.kernels import bsmm_kmajor, bsmm_panel, tuned

    if tuned.gpu_slug(torch.cuda.get_device_name()) != "nvidia-h200":
        pytest.skip("the entries are in the H200's table")
    calls = []
    real = bsmm_panel.launch_dds_panel
    monkeypatch.setattr(bsmm_panel, "launch_dds_panel", lambda *args: calls.append(1) or real(*args))
    layout = tilesparse.layouts.random(12288, 12288, 16, 0.5, seed=3, device=DEVICE)
    values = random_values(layout, torch.bfloat16, DEVICE)
    for m, trans in ((40, True), (8, False), (128, True), (300, False)):
        a = torch.randn(m, 12288, device=DEVICE, dtype=torch.bfloat16)
        reference = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans,
                                config=kernels.dds_config(m, 16, torch.bfloat16)).float()
        calls.clear()
        out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, trans)
        assert calls == [1]
        assert ((out.float() - reference).norm() / reference.norm()).item() < 1e-2
    # density 0.25, bprop, row-major activations (the table's own choice): the panel at 32 rows (a
    # 6-stage entry of the fortieth session), the small kernel with spread_index at 16 (35.5 against the
    # panel's 41.3 µs). With K-major on (the default) both go to the small kernel on K-major activations
    # instead (bsmm_kmajor.KMAJOR_WINS, measured faster in the forty-fourth session).
    quarter = tilesparse.layouts.random(12288, 12288, 16, 0.25, seed=5, device=DEVICE)
    quarter_values = random_values(quarter, torch.bfloat16, DEVICE)
    kmajor_copies, as_kmajor = [], bsmm_kmajor.as_kmajor
    monkeypatch.setattr(bsmm_kmajor, "as_kmajor", lambda a: kmajor_copies.append(a.shape[0]) or as_kmajor(a))
    monkeypatch.setattr(kernels, "KMAJOR_SMALL", False)
    for m, panel_calls in ((32, [1]), (16, [])):
        a = torch.randn(m, 12288, device=DEVICE, dtype=torch.bfloat16)
        reference = kernels.dds(a, quarter_values, quarter.meta, None, quarter.block_rows, quarter.block_cols, False,
                                config=kernels.dds_config(m, 16, torch.bfloat16)).float()
        calls.clear()
        out = kernels.dds(a, quarter_values, quarter.meta, None, quarter.block_rows, quarter.block_cols, False)
        assert calls == panel_calls, m
        assert ((out.float() - reference).norm() / reference.norm()).item() < 1e-2
        monkeypatch.setattr(kernels, "KMAJOR_SMALL", True)
        calls.clear()
        out = kernels.dds(a, quarter_values, quarter.meta, None, quarter.block_rows, quarter.block_cols, False)
        assert calls == [] and kmajor_copies == [m], m  # the small kernel on a K-major copy
        kmajor_copies.clear()
        assert ((out.float() - reference).norm() / reference.norm()).item() < 1e-2
        monkeypatch.setattr(kernels, "KMAJOR_SMALL", False)
    fresh = tilesparse.layouts.random(12288, 12288, 16, 0.5, seed=4, device=DEVICE)
    fresh_values = random_values(fresh, torch.bfloat16, DEVICE)
    a = torch.randn(8, 12288, device=DEVICE, dtype=torch.bfloat16)
    reference = kernels.dds(a, fresh_values, fresh.meta, None, fresh.block_rows, fresh.block_cols, False,
                            config=kernels.dds_config(8, 16, torch.bfloat16)).float()
    torch.cuda.synchronize()
    calls.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.dds(a, fresh_values, fresh.meta, None, fresh.block_rows, fresh.block_cols, False)
    graph.replay()
    assert calls == []  # no panel tables for the fresh layout inside the capture: another kernel
    assert ((captured.float() - reference).norm() / reference.norm()).item() < 1e-2


# --------------------------------------------------------------------------- feature-major tiles (large M)


@pytest.mark.parametrize("m", [777, 1000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size", [16, 32, 64], ids=lambda b: f"b{b}")
def test_dds_feature_major_tiles_at_large_m(block_size, dtype, trans, m):
    # the streaming kernel with 128-256 activation rows per program (tune's feature-major
    # candidates): the W slice as the MMA's M side; M not a multiple of the tile
    from tilesparse.kernels import bsmm_small

    operands, expected = _dds_case(block_size, dtype, trans, m)
    for cfg in (bsmm_small.SmallConfig(block_size, 64, 256, 8 if block_size == 64 else 4, 3 if block_size == 64 else 4),
                bsmm_small.SmallConfig(block_size, 64, 128, 4, 4)):
        assert_close(kernels.dds(*operands, config=cfg), expected, dtype, f"dds feature-major {cfg}")


@pytest.mark.parametrize("reduce", [{"splits": 4}, {"chunks": 3}], ids=["splits4", "chunks3"])
def test_small_kernel_split_reduction_is_bitwise_deterministic(reduce):
    # The split partials are summed in a fixed order (the chunks' in-kernel sum whatever
    # order the chunks finish in): repeated calls agree bit for bit, and the chunked
    # result is the unchunked product.
    from tilesparse.kernels import bsmm_small

    torch.manual_seed(0)
    layout = tilesparse.layouts.random(8192, 8192, 64, 0.1, seed=0, device=DEVICE)
    values = random_values(layout, torch.bfloat16, DEVICE)
    g = torch.randn(32, layout.shape[0], device=DEVICE, dtype=torch.bfloat16)
    cfg = bsmm_small.SmallConfig(32, 64, 32, 4, 4, **reduce)
    meta = layout.meta_on(DEVICE)
    first = kernels.dds(g, values, meta, None, layout.block_rows, layout.block_cols, False, config=cfg)
    for _ in range(5):
        again = kernels.dds(g, values, meta, None, layout.block_rows, layout.block_cols, False, config=cfg)
        assert torch.equal(first, again)
    plain = kernels.dds(g, values, meta, None, layout.block_rows, layout.block_cols, False,
                        config=bsmm_small.SmallConfig(32, 64, 32, 4, 4))
    assert_close(first, plain.double().cpu(), torch.bfloat16, "chunked vs whole runs")


@pytest.mark.parametrize("ahead", [1, 4, 64, 256])
@pytest.mark.parametrize("config", [
    (16, 64, 16, 8, {}), (16, 64, 16, 8, {"prefetch": True}), (16, 32, 16, 8, {}),  # b 16: 4 / 2 blocks a step
    (32, 32, 32, 12, {}), (32, 32, 32, 12, {"splits": 3}), (32, 32, 32, 12, {"chunks": 2}),  # whole-block slices
    (32, 64, 64, 12, {"swap": True}), (16, 32, 16, 8, {"prefetch": True}),  # slices of wider blocks
], ids=["b16k64", "b16k64pre", "b16k32", "s32", "s32split3", "s32chunks2", "s32k64swap", "s16k32pre"])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128], ids=lambda b: f"b{b}")
def test_small_kernel_l2_prefetch_changes_no_bit(block_size, config, ahead):
    # L2 prefetch hints (SmallConfig.l2_ahead) move no data into the program: with them the
    # kernel is bitwise the kernel without, at every reach (past the run's end, longer than any
    # run), fprop (slices of blocks in table order) and bprop (whole blocks through the slot
    # table; ignored for b 16's steps over several blocks), and both match the float64 reference.
    from tilesparse.kernels import bsmm_small

    sub, block_k, block_m, stages, extra = config
    if sub > block_size or (block_k > block_size and sub < block_size):
        pytest.skip("slices wider than the block, or multi-block steps over partial slices")
    layout = tilesparse.layouts.random(1536, 2048, block_size, 0.3, seed=2, device=DEVICE)
    plain = bsmm_small.SmallConfig(sub, block_k, block_m, 4, stages, **extra)
    _assert_hints_change_no_bit(layout, plain, ahead, ((True, 1), (True, 37), (False, 20)))


def _assert_hints_change_no_bit(layout, plain, ahead, problems):
    """dds with ``plain`` and with ``plain`` given L2 prefetch hints ``ahead`` blocks ahead:
    bitwise equal, and against float64, for each (trans, rows) of ``problems``."""
    values = random_values(layout, torch.bfloat16, DEVICE)
    meta = layout.meta_on(DEVICE)
    hinted = dataclasses.replace(plain, l2_ahead=ahead)
    s = dense_of(values, layout)
    for trans, m in problems:
        a = torch.randn(m, layout.shape[1] if trans else layout.shape[0], device=DEVICE, dtype=torch.bfloat16)
        want = kernels.dds(a, values, meta, None, layout.block_rows, layout.block_cols, trans, config=plain)
        got = kernels.dds(a, values, meta, None, layout.block_rows, layout.block_cols, trans, config=hinted)
        assert torch.equal(got, want), (plain, trans, m)
        assert_close(got, a.double().cpu() @ (s.t() if trans else s), torch.bfloat16, f"l2_ahead {trans} {m}")


@pytest.mark.parametrize("ahead", [1, 4, 256])
@pytest.mark.parametrize("config", [
    dict(group=8, block_m=32, splits=4, entries=4, swap=True), dict(group=8, block_m=16, splits=4, entries=4,
                                                                      swap=True, fused_sum=True),
    dict(group=4, block_m=64, splits=1), dict(group=4, block_m=128, splits=2, entries=4, fused_sum=True),
], ids=["deep-swap", "deep-swap-fused", "one-entry", "wide-fused"])
@pytest.mark.parametrize("block_size", [16, 32], ids=lambda b: f"b{b}")
def test_panel_l2_prefetch_changes_no_bit(block_size, config, ahead):
    # the panel's L2 prefetch hints (PanelConfig.l2_ahead: the union's stored blocks ahead,
    # slots loaded a step early) move no data into the program: bitwise the kernel without them
    # in both products, at every reach, and against float64
    from tilesparse.kernels import bsmm_panel

    if config["group"] * block_size > 256 or config.get("entries", 1) * block_size > 256:
        pytest.skip("panel or step past 256")
    layout = tilesparse.layouts.random(1536, 2048, block_size, 0.4, seed=3, device=DEVICE)
    _assert_hints_change_no_bit(layout, bsmm_panel.PanelConfig(**config), ahead, ((True, 8), (False, 37), (True, 150)))


def test_small_kernel_chunks_on_a_side_stream_and_in_a_cuda_graph():
    # The chunks' arrival counters are per stream and reset by every launch; a launch
    # captured in a CUDA graph gets its own (zeroed inside the graph). Every replay and
    # the side-stream launch give the eager result bit for bit.
    from tilesparse.kernels import bsmm_small

    layout = tilesparse.layouts.random(4096, 4096, 64, 0.1, seed=1, device=DEVICE)
    values = random_values(layout, torch.bfloat16, DEVICE)
    x = torch.randn(8, 4096, device=DEVICE, dtype=torch.bfloat16)
    cfg = bsmm_small.SmallConfig(32, 64, 16, 4, 4, chunks=2, longest_first=True)
    meta = layout.meta_on(DEVICE)

    def call():
        return kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)

    expected = call()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        on_side = call()
        call()  # also the warm-up before capture
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, expected)
    assert torch.equal(on_side, expected)
    assert_close(expected, x.double().cpu() @ dense_of(values, layout).t(), torch.bfloat16, "chunks")
