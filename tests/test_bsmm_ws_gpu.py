"""The Hopper warp-specialized persistent dds kernel (``bsmm_ws``, Gluon) on CUDA,
forced by its config, against float64 CPU references (setup as in test_bsmm_gpu.py).
Marked ``gpu``; skipped on GPUs other than sm90, where the kernel cannot run (the
launcher's error for that is checked too)."""

import pytest
import torch

from bsmm_cases import dds_against_reference, dense_of, make_layout, needs_hopper, random_values
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_ws
from tolerances import assert_close

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]
IN_FEATURES, OUT_FEATURES = 1024, 768  # as test_bsmm_gpu.py

CONFIGS = {
    "m128w8": bsmm_ws.WsConfig(128, 64, 8, 4),
    "m128w4": bsmm_ws.WsConfig(128, 64, 4, 4),
    "m256w8": bsmm_ws.WsConfig(256, 64, 8, 3),
    "m64w4k128": bsmm_ws.WsConfig(64, 128, 4, 3),
    "m128w4pp": bsmm_ws.WsConfig(128, 64, 4, 4, pingpong=True),
    "m64w4pp": bsmm_ws.WsConfig(64, 64, 4, 6, pingpong=True),
    "m128w8bal": bsmm_ws.WsConfig(128, 64, 8, 4, balanced=True),
    "m64w4ppbal": bsmm_ws.WsConfig(64, 64, 4, 6, pingpong=True, balanced=True),
}


def _run(layout_kind, block_size, dtype, trans, m, cfg, bias=True):
    layout = make_layout(layout_kind, OUT_FEATURES // block_size, IN_FEATURES // block_size, block_size)
    return dds_against_reference(layout, dtype, trans, m, cfg, bias, DEVICE)


@needs_hopper
@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("m", [1, 200, 1000, 4096], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"b{b}")
def test_ws_kernel_matches_reference(block_size, dtype, trans, m, cfg):
    # empty block-rows and -columns: tiles with no work still write their bias;
    # odd M: the last row tile is partial (TMA zero-fills and clips)
    config = CONFIGS[cfg]
    if config.block_k > block_size:
        pytest.skip("block_k wider than the block")
    out, expected = _run("empty_rows_cols", block_size, dtype, trans, m, config)
    assert_close(out, expected, dtype, f"dds ws {cfg}")


@needs_hopper
@pytest.mark.parametrize("layout_kind", ["empty", "full", "random"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_ws_kernel_layouts(layout_kind, trans):
    out, expected = _run(layout_kind, 128, torch.bfloat16, trans, 1000, CONFIGS["m128w8"], bias=layout_kind != "full")
    assert_close(out, expected, torch.bfloat16, f"dds ws {layout_kind}")


@needs_hopper
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_dds_picks_the_ws_kernel_on_hopper_at_large_m(trans, monkeypatch):
    # the default dispatch at M >= WS_MIN_M, b 128: the warp-specialized kernel runs
    calls = []
    real = bsmm_ws.launch_dds_ws
    monkeypatch.setattr(bsmm_ws, "launch_dds_ws", lambda *args: calls.append(args[8]) or real(*args))
    out, expected = _run("random", 128, torch.bfloat16, trans, bsmm_ws.WS_MIN_M + 100, None)
    assert calls and isinstance(calls[0], bsmm_ws.WsConfig)
    assert_close(out, expected, torch.bfloat16, "dds default on Hopper")


@needs_hopper
@pytest.mark.parametrize("precision", ["high", "highest"])
def test_dds_picks_the_ws_kernel_for_fp32_only_as_tf32(precision, monkeypatch):
    # fp32 at b 128, large M: the TF32 warp-specialized config under 'high'; under
    # 'highest' the Triton kernel's IEEE path (the ws kernel runs TF32 only)
    calls = []
    real = bsmm_ws.launch_dds_ws
    monkeypatch.setattr(bsmm_ws, "launch_dds_ws", lambda *args: calls.append(args[8]) or real(*args))
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        out, expected = _run("random", 128, torch.float32, True, bsmm_ws.WS_MIN_M + 100, None)
    finally:
        torch.set_float32_matmul_precision(previous)
    if precision == "high":
        assert calls == [bsmm_ws._TF32_DEFAULTS[0][2]]
    else:
        assert calls == []
    assert_close(out, expected, torch.float32, f"dds fp32 default ({precision})")


@needs_hopper
def test_ws_kernel_is_bitwise_deterministic_and_matches_the_tile_kernel_shape():
    # each output tile is written by one program, its blocks summed in table order
    import tilesparse

    layout = tilesparse.layouts.random(4096, 4096, 128, 0.25, seed=3, device=DEVICE)
    values = random_values(layout, torch.bfloat16, DEVICE)
    x = torch.randn(3000, 4096, device=DEVICE, dtype=torch.bfloat16)
    meta = layout.meta_on(DEVICE)
    cfg = CONFIGS["m128w8"]
    first = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    for _ in range(3):
        again = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
        assert torch.equal(first, again)
    tile = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True,
                       config=kernels.dds_config(3000, 128, torch.bfloat16))
    assert torch.equal(first, tile)  # same blocks, same k-steps, same fp32 order (seen on the H200)
    assert_close(first, tile.double().cpu(), torch.bfloat16, "ws vs tile kernel")


@needs_hopper
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("pingpong", [False, True], ids=["coop", "pingpong"])
def test_balanced_schedule_is_taken_and_bitwise_equal_to_round_robin(trans, pingpong, monkeypatch):
    # which program computes a tile changes nothing in its arithmetic
    import tilesparse

    # built on the CPU: its block counts travel with the tables to the GPU (meta_on)
    layout = tilesparse.layouts.random(4096, 2048, 128, 0.25, seed=5)
    values = random_values(layout, torch.bfloat16, DEVICE)
    x = torch.randn(2999, layout.block_cols * 128 if trans else layout.block_rows * 128, device=DEVICE,
                    dtype=torch.bfloat16)
    meta = layout.meta_on(DEVICE)
    warps, stages = (4, 4) if pingpong else (8, 4)
    plain = bsmm_ws.WsConfig(128, 64, warps, stages, pingpong=pingpong)
    balanced = bsmm_ws.WsConfig(128, 64, warps, stages, pingpong=pingpong, balanced=True)
    scheds = []
    real = bsmm_ws.launch_dds_ws
    monkeypatch.setattr(bsmm_ws, "launch_dds_ws", lambda *args: scheds.append(args[10]) or real(*args))
    want = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, trans, config=plain)
    got = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, trans, config=balanced)
    assert scheds[0] is None and scheds[1] is not None and scheds[1].is_cuda
    assert torch.equal(got, want)
    # a CUDA graph replays the remembered schedule
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, trans, config=balanced)
    assert scheds[2] is scheds[1]  # the captured launch read the remembered schedule
    x.copy_(torch.randn_like(x))
    graph.replay()
    fresh = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, trans, config=plain)
    assert torch.equal(captured, fresh)


@needs_hopper
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("m", [1, 1000, 4096], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("block_size,cfg", [(32, bsmm_ws.WsConfig(128, 32, 8, 12)), (32, bsmm_ws.WsConfig(256, 32, 8, 10)),
                                            (16, bsmm_ws.WsConfig(128, 16, 8, 16))], ids=["b32m128", "b32m256", "b16m128"])
def test_ws_kernel_small_blocks(block_size, cfg, m, trans):
    # b 16 and 32 (opt-in): one K step per block, deep rings; empty rows and columns,
    # bias, odd M; bf16 and fp16
    for dtype in DTYPES:
        out, expected = _run("empty_rows_cols", block_size, dtype, trans, m, cfg)
        assert_close(out, expected, dtype, f"dds ws b{block_size}")


def test_ws_kernel_refuses_what_it_cannot_run():
    layout = make_layout("random", 4, 4, 32)
    values = random_values(layout, torch.float32, DEVICE)
    a = torch.randn(64, 128, device=DEVICE)
    meta = layout.meta_on(DEVICE)
    with pytest.raises(ValueError, match="warp-specialized kernel"):
        kernels.dds(a, values, meta, None, 4, 4, True, config=CONFIGS["m128w8"])


# --------------------------------------------------------------------------- sdd (updat)

SDD_CONFIGS = {
    "m64w8st5": bsmm_ws.WsConfig(64, 64, 8, 5),
    "m64w4st4": bsmm_ws.WsConfig(64, 64, 4, 4),
    "m128w8st3": bsmm_ws.WsConfig(128, 64, 8, 3),
}


@needs_hopper
@pytest.mark.parametrize("cfg", list(SDD_CONFIGS), ids=list(SDD_CONFIGS))
@pytest.mark.parametrize("m", [1, 200, 1000, 4096], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"b{b}")
def test_ws_sdd_matches_reference(block_size, dtype, m, cfg):
    # values[z] = (dY^T X)[block z]; M not a multiple of the step: TMA zero-fills the tail
    if 16 * SDD_CONFIGS[cfg].num_warps > block_size:
        pytest.skip("more warps than the block has rows for (refused by the launcher)")
    layout = make_layout("empty_rows_cols", OUT_FEATURES // block_size, IN_FEATURES // block_size, block_size)
    rows, cols = layout.shape
    dy = torch.randn(m, rows, device=DEVICE).to(dtype)
    x = torch.randn(m, cols, device=DEVICE).to(dtype)
    out = kernels.sdd(dy.t(), x, layout.meta_on(DEVICE), block_size, layout.block_rows, layout.block_cols,
                      config=SDD_CONFIGS[cfg])
    expected = layout.gather(dy.double().cpu().t() @ x.double().cpu())
    assert_close(out, expected, dtype, f"sdd ws {cfg}")


@needs_hopper
def test_ws_sdd_is_bitwise_deterministic_and_refuses_ping_pong():
    import tilesparse

    layout = tilesparse.layouts.random(2048, 1024, 128, 0.3, seed=5, device=DEVICE)
    dy = torch.randn(3000, 2048, device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(3000, 1024, device=DEVICE, dtype=torch.bfloat16)
    meta = layout.meta_on(DEVICE)
    cfg = SDD_CONFIGS["m64w8st5"]
    first = kernels.sdd(dy.t(), x, meta, 128, layout.block_rows, layout.block_cols, config=cfg)
    for _ in range(3):
        assert torch.equal(first, kernels.sdd(dy.t(), x, meta, 128, layout.block_rows, layout.block_cols, config=cfg))
    with pytest.raises(ValueError, match="ping-pong"):
        kernels.sdd(dy.t(), x, meta, 128, layout.block_rows, layout.block_cols,
                    config=bsmm_ws.WsConfig(128, 64, 4, 4, pingpong=True))


@needs_hopper
def test_ws_refuses_misaligned_values_and_overlapping_rows_and_the_default_falls_back():
    # a contiguous view of the blocks 2 bytes into a buffer, and an expanded A (row
    # stride 0): TMA cannot take either; forced, a clear error; by default, the Triton kernels
    layout = make_layout("random", OUT_FEATURES // 128, IN_FEATURES // 128, 128)
    n = layout.nnz * 128 * 128
    flat = torch.randn(n + 1, device=DEVICE, dtype=torch.bfloat16)
    values = flat[1:].view(layout.nnz, 128, 128)
    a = torch.randn(bsmm_ws.WS_MIN_M + 7, IN_FEATURES, device=DEVICE, dtype=torch.bfloat16)
    meta = layout.meta_on(DEVICE)
    args = (meta, None, layout.block_rows, layout.block_cols, True)
    with pytest.raises(ValueError, match="16-byte-aligned block values"):
        kernels.dds(a, values, *args, config=CONFIGS["m128w8"])
    expected = a.double().cpu() @ dense_of(values, layout).t()
    assert_close(kernels.dds(a, values, *args), expected, torch.bfloat16, "default, misaligned values")
    row = torch.randn(1, IN_FEATURES, device=DEVICE, dtype=torch.bfloat16).expand(bsmm_ws.WS_MIN_M + 7, -1)
    good = random_values(layout, torch.bfloat16, DEVICE)
    with pytest.raises(ValueError, match="non-overlapping rows"):
        kernels.dds(row, good, *args, config=CONFIGS["m128w8"])
    expected = row.double().cpu() @ dense_of(good, layout).t()
    assert_close(kernels.dds(row, good, *args), expected, torch.bfloat16, "default, expanded A")


@needs_hopper
def test_ws_kernels_alternating_problems_stay_bitwise_equal():
    # each launch builds its TMA descriptors in scratch memory the allocator recycles:
    # alternating three problems (fprop, bprop, updat) must never read a stale descriptor
    import tilesparse

    problems = []
    for seed, (n, k) in enumerate(((1024, 2048), (2048, 1024), (1536, 1536))):
        layout = tilesparse.layouts.random(n, k, 128, 0.3, seed=seed, device=DEVICE)
        x = torch.randn(700 + 100 * seed, k, device=DEVICE, dtype=torch.bfloat16)
        dy = torch.randn(x.shape[0], n, device=DEVICE, dtype=torch.bfloat16)
        values = random_values(layout, torch.bfloat16, DEVICE)
        meta = layout.meta_on(DEVICE)
        r, c = layout.block_rows, layout.block_cols
        problems.append(lambda x=x, dy=dy, v=values, m=meta, r=r, c=c: (
            kernels.dds(x, v, m, None, r, c, True, config=CONFIGS["m128w8"]),
            kernels.dds(dy, v, m, None, r, c, False, config=CONFIGS["m128w8"]),
            kernels.sdd(dy.t(), x, m, 128, r, c, config=SDD_CONFIGS["m64w8st5"])))
    first = [p() for p in problems]
    for _ in range(40):
        for p, want in zip(problems, first):
            for got, ref in zip(p(), want):
                assert torch.equal(got, ref)


@needs_hopper
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("block_size", [64, 128], ids=lambda b: f"b{b}")
def test_ws_kernel_runs_fp32_as_tf32_only(block_size, trans):
    # fp32 inputs: TF32 wgmma (K-major operands; bprop's blocks are transposed once by
    # dds as for the Triton TF32 path); refused under 'highest' precision
    cfg = bsmm_ws.WsConfig(128, 32, 8, 4)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        out, expected = _run("empty_rows_cols", block_size, torch.float32, trans, 1000, cfg)
        assert_close(out, expected, torch.float32, "dds ws tf32")
        torch.set_float32_matmul_precision("highest")
        with pytest.raises(ValueError, match="TF32 only"):
            _run("random", block_size, torch.float32, trans, 300, cfg)
    finally:
        torch.set_float32_matmul_precision(previous)


@needs_hopper
def test_ws_kernels_replay_in_a_cuda_graph():
    # captured once (descriptor scratch from the graph's pool), replayed with new inputs
    # copied into the captured buffers: every replay equals the eager call bit for bit
    import tilesparse

    layout = tilesparse.layouts.random(1024, 2048, 128, 0.3, seed=7, device=DEVICE)
    values = random_values(layout, torch.bfloat16, DEVICE)
    meta = layout.meta_on(DEVICE)
    r, c = layout.block_rows, layout.block_cols
    x = torch.randn(1000, 2048, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn(1000, 1024, device=DEVICE, dtype=torch.bfloat16)

    def products():
        return (kernels.dds(x, values, meta, None, r, c, True, config=CONFIGS["m128w8"]),
                kernels.sdd(dy.t(), x, meta, 128, r, c, config=SDD_CONFIGS["m64w8st5"]))

    products()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = products()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
        graph.replay()
        for got, want in zip(outs, products()):
            assert torch.equal(got, want)
