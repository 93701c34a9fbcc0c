"""The column-grouped warp-specialized dds (``bsmm_ws_group``, Gluon): its config and
tables on the CPU, and on an sm90 GPU (marked ``gpu``) forced by its config against
float64 CPU references: block sizes 16-64, groups 1-8 (the last group cut short), both
directions, odd M, empty and full layouts, bias, fp16 and bf16."""

import pytest
import torch

import tilesparse
from bsmm_cases import dds_against_reference, dense_of, hopper, make_layout, needs_hopper, random_values
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_panel, bsmm_ws_group
from tilesparse.kernels.bsmm_ws_group import WsGroupConfig
from tolerances import assert_close

# 704 = 11 x 64 = 22 x 32 = 44 x 16 output features and 1088 = 17 x 64 = 34 x 32 = 68 x 16 input
# features: groups of 2-8 leave a short last group in fprop and in bprop
IN_FEATURES, OUT_FEATURES = 1088, 704


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs,match", [
    (dict(group=3), "group"), (dict(group=16), "at most 8"), (dict(stages=1), "stages"),
    (dict(stages=True), "stages"), (dict(group_m=0), "group_m"), (dict(a_from_registers=1), "a_from_registers"),
    (dict(stages=2.5), "stages must be an int"), (dict(load_regs=13), "load_regs must be a multiple of 8"),
    (dict(mma_regs=300), "mma_regs must be a multiple of 8"), (dict(entries_per_stage=5), "entries_per_stage must be 1 to 4"),
    (dict(entries_per_stage=2, a_from_registers=False), "needs a_from_registers=True"),
])
def test_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WsGroupConfig(**kwargs)


def test_config_sizes():
    cfg = WsGroupConfig(4, 6)
    assert cfg.block_m == 128
    # 6 stages of a 128 x 32 activation tile and 4 blocks of 32 x 32, two consumers' 4 output tiles
    assert cfg.shared_bytes(32) == 6 * (128 * 32 + 4 * 32 * 32) * 2 + 4 * 128 * 32 * 2 + 1024
    assert cfg.accumulator_registers(32) == 64
    two = WsGroupConfig(4, 6, entries_per_stage=2)  # two entries' tiles per stage
    assert two.shared_bytes(32) - cfg.shared_bytes(32) == 6 * (128 * 32 + 4 * 32 * 32) * 2
    assert WsGroupConfig(8).accumulator_registers(64) == 256


@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_group_masks_name_the_stored_blocks(trans, group):
    layout = tilesparse.layouts.random(11 * 16, 7 * 16, 16, 0.3, seed=group)
    meta = layout.meta_on("cpu")
    pptr, pk, pslots, pmask = bsmm_ws_group.group_tables(meta, layout.block_rows, layout.block_cols, trans, group)
    panel = bsmm_panel.panel_tables(meta, layout.block_rows, layout.block_cols, trans, group)
    assert all(mine is theirs for mine, theirs in zip((pptr, pk, pslots), panel))  # the panel kernel's, shared
    assert pmask.numel() == pslots.shape[0] + 1 and pmask[-1] == 0  # one entry past the end
    for u in range(pslots.shape[0]):
        assert int(pmask[u]) == sum(1 << g for g in range(group) if pslots[u, g] >= 0)
        assert pmask[u] != 0  # a union entry has at least one stored block
    again = bsmm_ws_group.group_tables(meta, layout.block_rows, layout.block_cols, trans, group)
    assert again[3] is pmask  # remembered on the layout
    assert bsmm_ws_group.tables_ready(meta, layout.block_rows, layout.block_cols, trans, group)
    assert not bsmm_ws_group.tables_ready(meta, layout.block_rows, layout.block_cols, not trans, 16)


def test_group_masks_of_an_empty_layout():
    meta = make_layout("empty", 5, 3, 16).meta_on("cpu")
    pptr, pk, pslots, pmask = bsmm_ws_group.group_tables(meta, 5, 3, True, 4)
    assert pptr.tolist() == [0, 0, 0] and pk.numel() == 0 and pmask.tolist() == [0]  # 2 groups of 4 block-rows


def test_a_tuned_grouped_entry_the_operands_cannot_take_falls_back(monkeypatch):
    # a measured (tuned) grouped config is a hint: off Hopper (or fp32) the other kernels run
    from tilesparse.kernels import tuned

    monkeypatch.setattr(tuned, "lookup", lambda *args, **kwargs: WsGroupConfig(4))
    layout = make_layout("random", 6, 4, 16)
    values = random_values(layout, torch.float32, "cpu")
    a = torch.randn(600, 64)
    out = kernels.dds(a, values, layout.meta_on("cpu"), None, 6, 4, True)
    s = dense_of(values, layout)
    assert_close(out, a.double() @ s.t(), torch.float32, "dds after a tuned grouped entry fell back")


def test_dds_refuses_the_grouped_config_off_hopper():
    if hopper():
        pytest.skip("runs on sm90")
    layout = make_layout("random", 4, 4, 32)
    values = random_values(layout, torch.bfloat16, "cpu")
    a = torch.randn(64, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match="grouped warp-specialized kernel needs an sm90"):
        kernels.dds(a, values, layout.meta_on("cpu"), None, 4, 4, True, config=WsGroupConfig(2))


# --------------------------------------------------------------------------- GPU


def _layout(kind, block_rows, block_cols, block_size):
    """``empty_group``: empty_rows_cols plus 8 aligned empty block-rows and -columns, so
    that at every G a whole group has no union entries beside groups that have some."""
    if kind != "empty_group":
        return make_layout(kind, block_rows, block_cols, block_size)
    from tilesparse.layout import BlockLayout

    mask = torch.rand(block_rows, block_cols) < 0.6
    mask[8:16, :] = False
    mask[:, 8:16] = False
    mask[0, block_cols - 1] = True
    return BlockLayout(mask, block_size)


def _run(layout_kind, block_size, dtype, trans, m, cfg, bias=True):
    layout = _layout(layout_kind, OUT_FEATURES // block_size, IN_FEATURES // block_size, block_size)
    return dds_against_reference(layout, dtype, trans, m, cfg, bias)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("m", [1, 200, 1000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("block_size,group,stages", [(16, 8, 8), (16, 2, 4), (32, 4, 6), (32, 1, 4), (64, 2, 4),
                                                    (64, 4, 3)], ids=lambda v: str(v))
@pytest.mark.parametrize("a_regs", [True, False], ids=["a_regs", "a_smem"])
def test_grouped_kernel_matches_reference(block_size, group, stages, dtype, trans, m, a_regs):
    # empty block-rows and -columns (union entries missing some blocks, groups with none),
    # a short last group, odd M (the last row tile partial)
    out, expected = _run("empty_group" if m == 1000 else "empty_rows_cols", block_size, dtype, trans, m,
                         WsGroupConfig(group, stages, a_from_registers=a_regs))
    assert_close(out, expected, dtype, f"dds ws group b{block_size} G{group}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("m", [1, 1000, 5000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("block_size,group,stages,entries,load_regs", [
    (32, 8, 3, 2, 56), (16, 8, 4, 2, 56), (64, 2, 2, 2, 56), (32, 1, 4, 2, 56),
    (32, 4, 3, 4, 72), (32, 8, 2, 3, 72), (16, 8, 3, 4, 96), (64, 1, 2, 3, 56)], ids=lambda v: str(v))
def test_several_entries_per_stage_match_the_reference(block_size, group, stages, entries, load_regs, trans, m):
    # entry counts not a multiple of E leave a stage's last entries empty (plain arrivals,
    # mask 0); each accumulator still sums its blocks in entry order: bitwise the one-entry kernel's
    layout = _layout("empty_group", OUT_FEATURES // block_size, IN_FEATURES // block_size, block_size)
    rows, cols = layout.shape
    a = torch.randn(m, cols if trans else rows, device="cuda").to(torch.bfloat16)
    values = random_values(layout, torch.bfloat16, "cuda")
    meta = layout.meta_on("cuda")
    several = kernels.dds(a, values, meta, None, layout.block_rows, layout.block_cols, trans,
                          config=WsGroupConfig(group, stages, load_regs=load_regs, entries_per_stage=entries))
    one = kernels.dds(a, values, meta, None, layout.block_rows, layout.block_cols, trans,
                      config=WsGroupConfig(group, stages))
    assert torch.equal(several, one)
    s = dense_of(values, layout)
    assert_close(several, a.double().cpu() @ (s.t() if trans else s), torch.bfloat16, f"{entries} entries per stage")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_the_defaults_over_several_tiles_per_program(block_size, trans):
    # 5000 rows: 40 row tiles, so each persistent program carries its ring position,
    # parities and output buffers across tiles; an aligned empty group; short last groups
    cfg = {block: config for block, _, config in bsmm_ws_group._DEFAULTS}[block_size]
    out, expected = _run("empty_group", block_size, torch.bfloat16, trans, 5000, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds ws group default b{block_size}")


@pytest.mark.gpu
@needs_hopper
def test_cuda_graph_capture_uses_remembered_tables_or_the_other_kernels():
    # the tables need a host sync: a first call inside a capture runs another kernel; once
    # built (a call outside the graph), the capture runs the grouped kernel; both replay right
    layout = tilesparse.layouts.random(1024, 1024, 32, 0.5, seed=4)
    values = random_values(layout, torch.bfloat16, "cuda")
    meta = layout.meta_on("cuda")
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    s = dense_of(values, layout)
    # the kernel a cold capture falls back to, compiled outside the graph
    kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True,
                config=kernels.dds_config(1024, 32, torch.bfloat16))
    for warm in (False, True):
        if warm:
            kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True)
        assert bsmm_ws_group.tables_ready(meta, layout.block_rows, layout.block_cols, True, 8) == warm
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert_close(out, x.double().cpu() @ s.t(), torch.bfloat16, f"captured dds (warm={warm})")
    with pytest.raises(ValueError, match="CUDA graph is being captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, False, config=WsGroupConfig(2))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("layout_kind", ["empty", "full", "random", "empty_group"])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
@pytest.mark.parametrize("a_regs", [True, False], ids=["a_regs", "a_smem"])
def test_grouped_kernel_layouts(layout_kind, trans, a_regs):
    out, expected = _run(layout_kind, 32, torch.bfloat16, trans, 1000, WsGroupConfig(4, 6, a_from_registers=a_regs),
                         bias=layout_kind != "full")
    assert_close(out, expected, torch.bfloat16, f"dds ws group {layout_kind}")


@pytest.mark.gpu
@needs_hopper
def test_grouped_kernel_is_bitwise_deterministic():
    # each output tile is written by one program, its union entries summed in table order
    layout = tilesparse.layouts.random(2048, 2048, 16, 0.25, seed=3, device="cuda")
    values = random_values(layout, torch.bfloat16, "cuda")
    x = torch.randn(3000, 2048, device="cuda", dtype=torch.bfloat16)
    meta = layout.meta_on("cuda")
    cfg = WsGroupConfig(8, 8, a_from_registers=False)
    first = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    for _ in range(3):
        assert torch.equal(first, kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True,
                                              config=cfg))
    s = dense_of(values, layout)
    assert_close(first, x.double().cpu() @ s.t(), torch.bfloat16, "dds ws group large")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("block_size,dtype,cfg,match", [
    (128, torch.bfloat16, WsGroupConfig(1), "block size of 16, 32 or 64"),
    (32, torch.float32, WsGroupConfig(4), "bf16 or fp16"),
    (64, torch.bfloat16, WsGroupConfig(8), "accumulator registers"),
    (64, torch.bfloat16, WsGroupConfig(4, 8), "shared memory"),
])
def test_grouped_kernel_refuses_what_it_cannot_run(block_size, dtype, cfg, match):
    layout = make_layout("random", 4, 4, block_size)
    values = random_values(layout, dtype, "cuda")
    a = torch.randn(256, 4 * block_size, device="cuda").to(dtype)
    with pytest.raises(ValueError, match=match):
        kernels.dds(a, values, layout.meta_on("cuda"), None, 4, 4, True, config=cfg)


def test_default_config_is_none_off_hopper():
    a = torch.randn(1024, 64).to(torch.bfloat16)
    assert bsmm_ws_group.default_config(a, 32, 0.5) is None


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("block_size,density,dtype,m,taken", [
    (32, 0.5, torch.bfloat16, 1024, True), (64, 0.5, torch.float16, 1024, True),
    (32, 0.25, torch.bfloat16, 1024, False), (16, 0.5, torch.bfloat16, 1024, True),
    (16, 0.25, torch.bfloat16, 1024, False),
    (64, 0.5, torch.bfloat16, 512, False), (64, 0.5, torch.float32, 1024, False),
])
@pytest.mark.parametrize("trans", [True, False], ids=["T", "N"])
def test_dds_takes_the_grouped_kernel_where_measured_faster(block_size, density, dtype, m, taken, trans,
                                                            monkeypatch):
    layout = tilesparse.layouts.random(1024, 512, block_size, density, seed=1)
    values = random_values(layout, dtype, "cuda")
    a = torch.randn(m, 512 if trans else 1024, device="cuda").to(dtype)
    launched = []
    real = bsmm_ws_group.launch_dds_ws_group
    monkeypatch.setattr(bsmm_ws_group, "launch_dds_ws_group", lambda *args: launched.append(args[-1]) or real(*args))
    out = kernels.dds(a, values, layout.meta_on("cuda"), None, layout.block_rows, layout.block_cols, trans)
    assert bool(launched) == taken
    if taken:
        assert launched[0] == bsmm_ws_group.default_config(a, block_size, density)
    s = dense_of(values, layout)
    assert_close(out, a.double().cpu() @ (s.t() if trans else s), dtype, "dds default")
