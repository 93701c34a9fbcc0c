"""The small-batch fprop with the activations resident in shared memory (``bsmm_resident``,
Gluon): its config and chunk tables on the CPU, and on an sm90 GPU (marked ``gpu``) forced
by its config against float64 CPU references: block sizes 16-64, 1-64 rows, one and several
splits (the reduction split unevenly), short last row groups, empty, full, random and sparse
layouts (deep weight rings, masks with only their top bit), padded activation rows, bias, fp16
and bf16; bitwise the same over repeated calls and under CUDA-graph capture."""

import dataclasses

import pytest
import torch

import tilesparse
from bsmm_cases import dds_against_reference, dense_of, hopper, make_layout, needs_hopper, random_values
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import bsmm_resident
from tilesparse.kernels.bsmm_resident import ResidentConfig
from tolerances import assert_close

# 704 = 11 x 64 = 22 x 32 = 44 x 16 output features (row groups of 6-12 leave a short last
# group), 1088 = 17 x 64 = 34 x 32 = 68 x 16 input features (chunks of 4-32 leave a short last one)
IN_FEATURES, OUT_FEATURES = 1088, 704


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("kwargs,match", [
    (dict(rows=0), "rows must be 1 to 16"), (dict(rows=17), "rows must be 1 to 16"), (dict(splits=0), "splits"),
    (dict(w_stages=1), "w_stages"), (dict(unroll=0), "unroll must be 1 to 8"), (dict(unroll=9), "unroll"),
    (dict(chunk=33), "chunk must be 1 to 32"), (dict(chunk=0), "chunk"),
    (dict(columns=True, chunk=12, box=8), "box must be a power of two"), (dict(columns=True, box=0), "box must"),
    (dict(columns=True, chunk=6, box=3), "box must be a power of two"),
    (dict(columns=True), "need .* bytes of shared memory even at b 16"),
    (dict(columns=1), "columns must be a bool"),
    (dict(rows=2.0), "rows must be an int"), (dict(load_regs=20), "load_regs must be a multiple of 8"),
])
def test_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResidentConfig(**kwargs)


def test_config_sizes():
    cfg = ResidentConfig(rows=12, chunk=32, w_stages=4)
    # two stages of 32 activation tiles [64, 16], four weight stages of a slot [16, 16] per column
    assert cfg.shared_bytes(16) == (2 * 32 + 1) * 64 * 16 * 2 + (4 * 32 + 1) * 16 * 16 * 2 + 1024  # + the zero tiles
    assert cfg.accumulator_registers(16) == 96  # 12 tiles of [64, 16] fp32 over 128 threads
    assert ResidentConfig(rows=6).accumulator_registers(32) == 96
    # column-major: two stages, each 16 activation tiles [64, 16] and 6 rows x 16 blocks [16, 16]
    columns = ResidentConfig(rows=6, chunk=16, w_stages=2, columns=True, box=8)
    assert columns.shared_bytes(16) == 2 * (16 * 64 * 16 + 6 * 16 * 16 * 16) * 2 + 1024


@pytest.mark.parametrize("chunk", [1, 4, 5, 32])
def test_chunk_tables_name_each_rows_first_slot_and_stored_columns(chunk):
    layout = tilesparse.layouts.random(13 * 16, 70 * 16, 16, 0.4, seed=chunk)
    meta = layout.meta_on("cpu")
    firsts, masks = bsmm_resident.chunk_tables(meta, layout.block_rows, layout.block_cols, chunk)
    n_chunks = -(-layout.block_cols // chunk)
    assert firsts.shape == masks.shape == (layout.block_rows, n_chunks)
    assert firsts.dtype == masks.dtype == torch.int32
    t = layout.tables
    for r in range(layout.block_rows):
        lo, hi = int(t.row_ptr[r]), int(t.row_ptr[r + 1])
        for c in range(n_chunks):
            slots = [e for e in range(lo, hi) if c * chunk <= int(t.row_cols[e]) < (c + 1) * chunk]
            later = [e for e in range(lo, hi) if int(t.row_cols[e]) >= c * chunk]
            assert int(firsts[r, c]) == (later[0] if later else hi)
            assert slots == list(range(int(firsts[r, c]), int(firsts[r, c]) + len(slots)))  # consecutive
            bits = int(masks[r, c]) & 0xFFFFFFFF  # bit 31 is int32's sign
            assert bits == sum(1 << (int(t.row_cols[e]) - c * chunk) for e in slots)
    again = bsmm_resident.chunk_tables(meta, layout.block_rows, layout.block_cols, chunk)
    assert again[0] is firsts and again[1] is masks  # remembered


def _columns_schedule_product(a, values, firsts, masks, rows, chunk, box, b):
    """The column-major kernel's schedule, played out in PyTorch on the CPU (float64): per
    group of ``rows`` block-rows and chunk, each row's ceil(n / box) boxes of consecutive
    stored blocks from its first slot into its run of a stage (over-reading past its blocks,
    and past the last one as zeros), then per column, for each row storing it, the block at
    the row's running slot times the column's activation tile."""
    block_rows, n_chunks = masks.shape
    padded = torch.cat([values.double(), torch.zeros(box, b, b, dtype=torch.float64)])  # TMA's zero fill
    x = torch.zeros(a.shape[0], n_chunks * chunk * b, dtype=torch.float64)
    x[:, :a.shape[1]] = a.double()
    out = torch.zeros(a.shape[0], block_rows * b, dtype=torch.float64)
    for group in range(-(-block_rows // rows)):
        for c in range(n_chunks):
            stage = torch.full((rows, chunk, b, b), float("nan"), dtype=torch.float64)  # never read unless written
            for r in range(rows):
                row = group * rows + r
                if row >= block_rows:
                    continue
                bits = int(masks[row, c]) & 0xFFFFFFFF
                for q in range(-(-bin(bits).count("1") // box)):
                    start = int(firsts[row, c]) + q * box  # < n_stored: at or before the row's last block
                    stage[r, q * box:(q + 1) * box] = padded[start:start + box]
            for kb in range(chunk):
                tile = x[:, (c * chunk + kb) * b:(c * chunk + kb + 1) * b]
                for r in range(rows):
                    row = group * rows + r
                    if row >= block_rows:
                        continue
                    bits = int(masks[row, c]) & 0xFFFFFFFF
                    if bits >> kb & 1:
                        slot = bin(bits & ((1 << kb) - 1)).count("1")
                        out[:, row * b:(row + 1) * b] += tile @ stage[r, slot].t()
    return out


@pytest.mark.parametrize("rows,chunk,box", [(6, 16, 8), (3, 32, 16), (2, 6, 2), (5, 8, 1)])
def test_the_column_major_schedule_computes_the_product(rows, chunk, box):
    # the slots the producer's boxes fill are the ones the consumer's running count reads
    # (a NaN where a stage slot is read unwritten would poison the result)
    layout = tilesparse.layouts.random(11 * 16, 70 * 16, 16, 0.45, seed=rows * chunk)
    meta = layout.meta_on("cpu")
    values = torch.randn(layout.nnz, 16, 16, dtype=torch.float64)
    a = torch.randn(5, 70 * 16, dtype=torch.float64)
    firsts, masks = bsmm_resident.chunk_tables(meta, layout.block_rows, layout.block_cols, chunk)
    got = _columns_schedule_product(a, values, firsts, masks, rows, chunk, box, 16)
    torch.testing.assert_close(got, a @ dense_of(values, layout).t(), rtol=1e-12, atol=1e-12)


def test_chunk_tables_of_an_empty_layout_and_bad_chunks():
    meta = make_layout("empty", 3, 5, 16).meta_on("cpu")
    firsts, masks = bsmm_resident.chunk_tables(meta, 3, 5, 2)
    assert firsts.tolist() == [[0, 0, 0]] * 3 and masks.tolist() == [[0, 0, 0]] * 3
    with pytest.raises(ValueError, match="chunk must be 1 to 32"):
        bsmm_resident.chunk_tables(meta, 3, 5, 33)


@pytest.mark.parametrize("m,rows", [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)])
def test_activation_boxes_take_the_rows_there_are(m, rows, monkeypatch):
    from tilesparse.kernels import bsmm_resident_columns

    assert bsmm_resident_columns.activation_box_rows(m) == rows
    monkeypatch.setattr(bsmm_resident_columns, "SHORT_ACTIVATION_BOXES", False)
    assert bsmm_resident_columns.activation_box_rows(m) == 64


def test_chunk_tables_refuse_rows_out_of_column_order():
    layout = make_layout("full", 2, 4, 16)
    meta = layout.meta_on("cpu").clone()
    from tilesparse.layout import table_views

    (row_cols,) = table_views(meta, 2, 4, "row_cols")
    row_cols[:2] = row_cols[:2].flip(0)  # block-row 0's first two blocks swapped
    assert bsmm_resident.chunk_tables(meta, 2, 4, 2) is None


def test_a_tuned_resident_entry_the_operands_cannot_take_falls_back(monkeypatch):
    # a measured (tuned) resident config is a hint: off Hopper (or for bprop) the other kernels run
    from tilesparse.kernels import tuned

    monkeypatch.setattr(tuned, "lookup", lambda *args, **kwargs: ResidentConfig())
    layout = make_layout("random", 6, 4, 16)
    values = random_values(layout, torch.float32, "cpu")
    s = dense_of(values, layout)
    for trans in (True, False):
        a = torch.randn(8, 64 if trans else 96)
        out = kernels.dds(a, values, layout.meta_on("cpu"), None, 6, 4, trans)
        assert_close(out, a.double() @ (s.t() if trans else s), torch.float32,
                     f"dds after a tuned resident entry (trans={trans})")


def test_dds_refuses_the_resident_config_off_hopper():
    if hopper():
        pytest.skip("runs on sm90")
    layout = make_layout("random", 4, 4, 16)
    values = random_values(layout, torch.bfloat16, "cpu")
    a = torch.randn(8, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="resident-activation kernel needs an sm90"):
        kernels.dds(a, values, layout.meta_on("cpu"), None, 4, 4, True, config=ResidentConfig())


# --------------------------------------------------------------------------- GPU


def _run(kind, block_size, dtype, m, cfg, bias=True):
    layout = make_layout(kind, OUT_FEATURES // block_size, IN_FEATURES // block_size, block_size)
    return dds_against_reference(layout, dtype, True, m, cfg, bias)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("m", [1, 7, 32, 64], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("block_size,rows,chunk,w_stages", [
    (16, 12, 32, 4), (16, 8, 8, 2), (16, 1, 3, 3), (32, 6, 16, 2), (32, 4, 5, 3), (64, 2, 4, 2), (64, 1, 2, 4)],
    ids=lambda v: str(v))
@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
def test_resident_kernel_matches_reference(block_size, rows, chunk, w_stages, splits, m):
    # an empty block-row and block-column; with 3 splits the last one's chunks are fewer
    cfg = ResidentConfig(rows=rows, splits=splits, chunk=chunk, w_stages=w_stages)
    out, expected = _run("empty_rows_cols", block_size, torch.bfloat16, m, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds resident b{block_size} {cfg}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kind", ["empty", "full", "random"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("splits", [1, 2, 40], ids=lambda s: f"splits{s}")
def test_layouts_dtypes_and_more_splits_than_chunks(kind, dtype, splits):
    # 40 splits of 68 / 32 = 3 chunks: 3 programs per group; no bias
    out, expected = _run(kind, 16, dtype, 33, ResidentConfig(splits=splits), bias=False)
    assert_close(out, expected, dtype, f"dds resident {kind} splits {splits}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("splits", [1, 4])
def test_resident_kernel_is_bitwise_deterministic_and_captures(splits):
    layout = tilesparse.layouts.random(2048, 3072, 16, 0.3, seed=1)
    values = random_values(layout, torch.bfloat16, "cuda")
    meta = layout.meta_on("cuda")
    x = torch.randn(48, 3072, device="cuda", dtype=torch.bfloat16)
    cfg = ResidentConfig(splits=splits)
    first = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    for _ in range(5):
        again = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
        assert torch.equal(first, again)
    graph = torch.cuda.CUDAGraph()  # the chunk table, built above, is remembered on the layout
    with torch.cuda.graph(graph):
        out = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    x.copy_(torch.randn_like(x))
    for _ in range(2):  # the arrival counters are left zero for the next replay
        graph.replay()
        s = dense_of(values, layout)
        assert_close(out, x.double().cpu() @ s.t(), torch.bfloat16, f"captured resident dds (splits {splits})")


@pytest.mark.gpu
@needs_hopper
def test_resident_config_refuses_bprop_and_many_rows():
    layout = make_layout("random", 4, 4, 16)
    values = random_values(layout, torch.bfloat16, "cuda")
    meta = layout.meta_on("cuda")
    with pytest.raises(ValueError, match="fprop only"):
        kernels.dds(torch.randn(8, 64, device="cuda", dtype=torch.bfloat16), values, meta, None, 4, 4, False,
                    config=ResidentConfig())
    with pytest.raises(ValueError, match="at most 64 rows"):
        kernels.dds(torch.randn(65, 64, device="cuda", dtype=torch.bfloat16), values, meta, None, 4, 4, True,
                    config=ResidentConfig())


def _top_bit_layout(block_rows, block_cols, block_size, chunk):
    """Each block-row stores only the last block-column of every chunk (its mask's top bit)
    plus, on even rows, the first: bit 31 of an int32 mask at chunk 32."""
    from tilesparse.layout import BlockLayout

    mask = torch.zeros(block_rows, block_cols, dtype=torch.bool)
    mask[:, chunk - 1::chunk] = True
    mask[::2, 0] = True
    return BlockLayout(mask, block_size)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kind", ["sparse", "top_bit"])
@pytest.mark.parametrize("block_size,rows,chunk,w_stages", [(16, 12, 8, 16), (16, 12, 32, 4), (32, 6, 8, 8)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
def test_sparse_layouts_and_deep_rings(kind, block_size, rows, chunk, w_stages, splits):
    # stages with no block (plain arrivals) beside stages with a few, around rings of up to 16
    block_rows, block_cols = OUT_FEATURES // block_size, IN_FEATURES // block_size
    if kind == "sparse":
        seed = int(torch.randint(1 << 30, ()))
        layout = tilesparse.layouts.random(OUT_FEATURES, IN_FEATURES, block_size, 0.05, seed=seed)
    else:
        layout = _top_bit_layout(block_rows, block_cols, block_size, chunk)
    cfg = ResidentConfig(rows=rows, splits=splits, chunk=chunk, w_stages=w_stages)
    out, expected = dds_against_reference(layout, torch.bfloat16, True, 40, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds resident {kind} {cfg}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kind", ["random", "top_bit"])
@pytest.mark.parametrize("unroll", [1, 3, 8])
def test_unrolled_loops_and_their_zero_tiles(kind, unroll):
    # rows whose block counts are not multiples of the unroll: the steps past a row's last
    # block multiply the zero tiles; bit 31 (top_bit, chunk 32) is the mask's sign
    block_rows, block_cols = OUT_FEATURES // 16, IN_FEATURES // 16
    if kind == "random":
        layout = tilesparse.layouts.random(OUT_FEATURES, IN_FEATURES, 16, 0.3, seed=int(torch.randint(1 << 30, ())))
    else:
        layout = _top_bit_layout(block_rows, block_cols, 16, 32)
    cfg = ResidentConfig(rows=12, splits=2, chunk=32, w_stages=4, unroll=unroll)
    out, expected = dds_against_reference(layout, torch.bfloat16, True, 64, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds resident {kind} {cfg}")


# the column-major variant: (block, rows, chunk, box, stages); a row's run of a stage is whole
# boxes over-read past a row's blocks (and past the last block: zero-filled)
COLUMN_CONFIGS = [(16, 6, 16, 8, 2), (16, 8, 16, 4, 2), (16, 1, 3, 1, 3), (16, 2, 32, 16, 2), (32, 4, 8, 8, 2),
                  (32, 3, 6, 2, 2), (64, 2, 4, 4, 2), (16, 4, 12, 4, 2), (16, 12, 4, 4, 6)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("m", [1, 7, 64], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("block_size,rows,chunk,box,stages", COLUMN_CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
def test_column_major_kernel_matches_reference(block_size, rows, chunk, box, stages, splits, m):
    cfg = ResidentConfig(rows=rows, splits=splits, chunk=chunk, w_stages=stages, columns=True, box=box)
    out, expected = _run("empty_rows_cols", block_size, torch.bfloat16, m, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds resident columns b{block_size} {cfg}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kind", ["empty", "full", "random", "sparse", "top_bit"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_column_major_layouts_and_dtypes(kind, dtype):
    block_rows, block_cols = OUT_FEATURES // 16, IN_FEATURES // 16
    if kind == "sparse":
        layout = tilesparse.layouts.random(OUT_FEATURES, IN_FEATURES, 16, 0.05, seed=int(torch.randint(1 << 30, ())))
    elif kind == "top_bit":
        layout = _top_bit_layout(block_rows, block_cols, 16, 32)
    else:
        layout = make_layout(kind, block_rows, block_cols, 16)
    cfg = ResidentConfig(rows=2, splits=2, chunk=32, w_stages=2, columns=True, box=16)
    out, expected = dds_against_reference(layout, dtype, True, 40, cfg)
    assert_close(out, expected, dtype, f"dds resident columns {kind} {cfg}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("block_size,rows,chunk,box,stages", COLUMN_CONFIGS, ids=lambda v: str(v))
def test_column_major_kernel_on_full_layouts_and_runs_itself(block_size, rows, chunk, box, stages, monkeypatch):
    # every row stores every column: the most boxes a stage expects (only the top binary digit
    # of their count set where R * chunk / box is a power of two); and the variant, not the
    # resident kernel, is what ran
    from tilesparse.kernels import bsmm_resident_columns

    calls = []
    real = bsmm_resident_columns.launch_columns
    monkeypatch.setattr(bsmm_resident_columns, "launch_columns", lambda *args: calls.append(1) or real(*args))
    cfg = ResidentConfig(rows=rows, splits=2, chunk=chunk, w_stages=stages, columns=True, box=box)
    out, expected = _run("full", block_size, torch.bfloat16, 64, cfg)
    assert_close(out, expected, torch.bfloat16, f"dds resident columns full b{block_size} {cfg}")
    assert calls


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("m,dtype", [(1, torch.bfloat16), (16, torch.bfloat16), (17, torch.float16)],
                         ids=["m1-16rows", "m16-16rows", "m17-32rows-fp16"])
def test_column_major_short_activation_boxes_keep_the_bits(m, dtype, monkeypatch):
    # copies of M's rows only (16 / 32): the tile's other rows keep what shared memory held,
    # here poisoned first by a 64-row launch on NaN activations. Rows no output stores: the
    # results are bitwise those of 64-row copies, and finite
    from tilesparse.kernels import bsmm_resident_columns

    layout = tilesparse.layouts.random(1024, 3072, 16, 0.3, seed=int(torch.randint(1 << 30, ())))
    values = random_values(layout, dtype, "cuda")
    meta = layout.meta_on("cuda")
    bias = torch.randn(1024, device="cuda", dtype=dtype)
    cfg = ResidentConfig(rows=6, splits=2, chunk=12, w_stages=2, columns=True, box=4)
    x = torch.randn(m, 3072, device="cuda", dtype=dtype)
    monkeypatch.setattr(bsmm_resident_columns, "SHORT_ACTIVATION_BOXES", False)
    whole = kernels.dds(x, values, meta, bias, layout.block_rows, layout.block_cols, True, config=cfg)
    poison = torch.full((64, 3072), float("nan"), device="cuda", dtype=dtype)
    kernels.dds(poison, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    monkeypatch.setattr(bsmm_resident_columns, "SHORT_ACTIVATION_BOXES", True)
    short = kernels.dds(x, values, meta, bias, layout.block_rows, layout.block_cols, True, config=cfg)
    assert torch.isfinite(short).all()
    assert torch.equal(short, whole)
    expected = x.double().cpu() @ dense_of(values, layout).t() + bias.double().cpu()
    assert_close(short, expected, dtype, "dds resident columns, short activation boxes")


@pytest.mark.gpu
@needs_hopper
def test_column_major_refuses_boxes_past_tma_rows():
    layout = make_layout("random", 4, 4, 64)
    values = random_values(layout, torch.bfloat16, "cuda")
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    cfg = ResidentConfig(rows=2, chunk=8, w_stages=2, columns=True, box=8)  # 8 x 64 rows per box
    with pytest.raises(ValueError, match="more than TMA's 256"):
        kernels.dds(x, values, layout.meta_on("cuda"), None, layout.block_rows, layout.block_cols, True, config=cfg)


@pytest.mark.gpu
@needs_hopper
def test_column_major_kernel_is_bitwise_deterministic():
    layout = tilesparse.layouts.random(2048, 3072, 16, 0.3, seed=2)
    values = random_values(layout, torch.bfloat16, "cuda")
    meta = layout.meta_on("cuda")
    x = torch.randn(64, 3072, device="cuda", dtype=torch.bfloat16)
    cfg = ResidentConfig(rows=6, splits=3, chunk=16, w_stages=2, columns=True, box=8)
    first = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=cfg)
    for _ in range(5):
        assert torch.equal(first, kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True,
                                              config=cfg))
    assert_close(first, x.double().cpu() @ dense_of(values, layout).t(), torch.bfloat16, "dds resident columns")
    many = dataclasses.replace(cfg, splits=40)  # more splits than the 12 chunks: 12 programs per group
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True, config=many)
    x.copy_(torch.randn_like(x))
    for _ in range(2):  # the arrival counters are left zero for the next replay
        graph.replay()
        assert_close(out, x.double().cpu() @ dense_of(values, layout).t(), torch.bfloat16,
                     "captured dds resident columns, 40 splits")


@pytest.mark.gpu
@needs_hopper
def test_padded_activation_rows():
    # A with a row pitch past K (a view of a wider buffer): the descriptor takes its stride
    layout = make_layout("random", OUT_FEATURES // 16, IN_FEATURES // 16, 16)
    values = random_values(layout, torch.bfloat16, "cuda")
    a = torch.randn(24, IN_FEATURES + 64, device="cuda").to(torch.bfloat16)[:, :IN_FEATURES]
    out = kernels.dds(a, values, layout.meta_on("cuda"), None, layout.block_rows, layout.block_cols, True,
                      config=ResidentConfig())
    assert_close(out, a.double().cpu() @ dense_of(values, layout).t(), torch.bfloat16, "dds resident, padded rows")


@pytest.mark.gpu
@needs_hopper
def test_a_capture_before_the_tables_are_built_refuses_the_config():
    layout = tilesparse.layouts.random(512, 512, 16, 0.5, seed=3)
    values = random_values(layout, torch.bfloat16, "cuda")
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    meta = layout.meta_on("cuda")  # the layout's own tables exist; the chunk tables do not yet
    with pytest.raises(ValueError, match="no chunk table"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            kernels.dds(x, values, meta, None, layout.block_rows, layout.block_cols, True,
                        config=ResidentConfig())
