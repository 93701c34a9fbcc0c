"""The tuned-config table (tilesparse.kernels.tuned) and `tilesparse tune`'s CPU-side
parts: keys and buckets, JSON round trips, file merging and reading, the launchers
consulting the table, the search spaces. The sweep itself needs a GPU."""

import functools
import json
import re

import pytest
import torch

from bsmm_cases import INTERPRETER_MARKS, dense_of, make_layout, random_values
from tilesparse.bench import tune as tune_mod
from tilesparse.cli import main
from tilesparse.kernels import bsmm as kernels
from tilesparse.kernels import tuned
from tilesparse.kernels.bsmm_panel import PanelConfig
from tilesparse.kernels.bsmm_sdd_group import SddGroupConfig
from tilesparse.kernels.bsmm_sdd_tile import SddTileConfig
from tilesparse.kernels.bsmm_small import SmallConfig
from tilesparse.kernels.bsmm_ws import WsConfig
from tilesparse.kernels.bsmm_resident import ResidentConfig
from tilesparse.kernels.bsmm_ws_group import WsGroupConfig
from tilesparse.kernels.bsmm_ws_sdd_group import WsSddGroupConfig
from tilesparse.kernels.bsmm_ws_sdd_rows import WsSddRowsConfig
from tolerances import assert_close

pytestmark = INTERPRETER_MARKS  # some cases launch kernels under the interpreter


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    monkeypatch.setenv("TILESPARSE_TUNED", str(path))
    tuned.reload()
    yield path
    tuned.reload()


def test_buckets():
    assert [tuned.m_bucket(m) for m in (0, 1, 2, 3, 64, 65, 8192, 9000)] == [1, 1, 2, 4, 64, 128, 8192, 16384]
    assert tuned.density_bucket(0.5) == 0.5
    assert tuned.density_bucket(0.3) == 0.25
    assert tuned.density_bucket(0.12) == 0.1
    assert tuned.density_bucket(0.04) == 0.05  # log-nearest: 0.04 is closer to 0.05 than to 0.03
    assert tuned.density_bucket(0.02) == 0.03
    assert tuned.density_bucket(1e-9) == 0.01
    assert tuned.key("nvidia-h200", "fprop", torch.bfloat16, 128, 8000, 0.26) == "nvidia-h200|fprop|bf16|128|8192|0.25"


@pytest.mark.parametrize("config", [
    kernels.KernelConfig(128, 64, 4, 4, tma=True, device_desc=True),
    SmallConfig(32, 64, 16, 4, 8),
    SmallConfig(64, 64, 128, 8, 6, splits=2, swap=True, m_inner=True),
    PanelConfig(4, 64, 8, 3),
    WsConfig(128, 64, 4, 4, pingpong=True),
    WsGroupConfig(8, 4, a_from_registers=False),
    ResidentConfig(rows=6, splits=2, chunk=16, w_stages=8),
    ResidentConfig(rows=6, splits=1, chunk=16, w_stages=2, columns=True, box=4),
])
def test_json_round_trip(config):
    obj = tuned.to_json(config)
    assert json.loads(json.dumps(obj)) == obj
    assert tuned.from_json(obj) == config


def test_from_json_rejects_bad_entries():
    with pytest.raises(ValueError, match="unknown config kind"):
        tuned.from_json({"kind": "mystery", "block_m": 1})
    with pytest.raises(ValueError, match="bad tile config"):
        tuned.from_json({"kind": "tile", "block_m": 128, "no_such_field": 1})


def test_record_merges_and_the_table_reads_it(table_file):
    k1 = tuned.key("gpu-a", "fprop", torch.bfloat16, 128, 8192, 0.5)
    k2 = tuned.key("gpu-a", "updat", torch.float16, 64, 4096, 0.1)
    tuned.record({k1: kernels.KernelConfig(256, 64, 8, 3)}, table_file, {k1: {"tuned_ms": 0.2}})
    tuned.record({k2: PanelConfig(8)}, table_file)
    data = json.loads(table_file.read_text())
    assert data["format"] == tuned.FORMAT and set(data["entries"]) == {k1, k2}
    assert data["entries"][k1]["tuned_ms"] == 0.2
    table = tuned._table()
    assert table[k1] == kernels.KernelConfig(256, 64, 8, 3) and table[k2] == PanelConfig(8)


def test_an_unknown_format_is_refused(table_file):
    # A user file in another format is ignored (with a warning), record() refuses to merge.
    shipped = tuned._table()  # the user file does not exist yet: the shipped tables only
    tuned.reload()
    table_file.write_text(json.dumps({"format": 99, "entries": {}}))
    with pytest.warns(UserWarning, match="unknown tuned-config format"):
        assert tuned._table() == shipped
    with pytest.raises(ValueError, match="unknown tuned-config format"):
        tuned.record({}, table_file)


def test_the_shipped_tables_read_as_configs():
    # Every shipped file parses (an unknown field or kind would raise) and its keys are
    # well formed: gpu|op|dtype|block|M bucket|density bucket[|wNxK].
    tuned.reload()
    shipped = tuned._read_shipped()
    assert shipped, "tilesparse/kernels/tuned/ ships at least the H200's table"
    for k in shipped:
        gpu, op, dtype, block, m, density, *weight = k.split("|")
        assert not weight or re.fullmatch(r"w\d+x\d+", weight[0]) and len(weight) == 1
        assert op in ("fprop", "bprop", "updat") and dtype in ("bf16", "fp16", "tf32", "fp32")
        assert tuned.m_bucket(int(m)) == int(m) and tuned.density_bucket(float(density)) == float(density)
        assert int(block) in (16, 32, 64, 128)


def test_shipped_gemv_entries_are_dds_at_rows_the_kernel_takes():
    # the FMA kernel takes 1-8 rows of fprop / bprop: an entry elsewhere would always fall back;
    # the H200's b 16 entries at 1-4 rows are its measured wins (thirty-fourth session)
    from tilesparse.kernels import bsmm_gemv

    tuned.reload()
    shipped = tuned._read_shipped()
    gemv = {k: c for k, c in shipped.items() if isinstance(c, bsmm_gemv.GemvConfig)}
    for k in gemv:
        _, op, _, _, m, *_ = k.split("|")
        assert op in ("fprop", "bprop") and int(m) <= bsmm_gemv.MAX_ROWS, k
    for op in ("fprop", "bprop"):
        for m in (1, 2, 4):
            for density in tuned.DENSITY_BUCKETS[:-1]:
                assert f"nvidia-h200|{op}|bf16|16|{m}|{density:g}" in gemv
        assert not isinstance(shipped.get(f"nvidia-h200|{op}|bf16|16|8|0.5"), bsmm_gemv.GemvConfig)


def fake_gpu(monkeypatch, slug="fake-gpu", chip=("0.0", 1)):
    """Name a CUDA device without a GPU: its slug and chip (capability, SMs) are faked."""
    monkeypatch.setattr(tuned, "_gpu_slug", lambda index: slug)
    monkeypatch.setattr(tuned, "_device_chip", lambda index: chip)


def test_cuda_lookups_find_entries_and_are_remembered(table_file, monkeypatch):
    # A CUDA device is only named here (no GPU needed): the slug is faked.
    fake_gpu(monkeypatch)
    cuda0 = torch.device("cuda", 0)
    k = tuned.key("fake-gpu", "fprop", torch.bfloat16, 128, 8192, 0.5)
    tuned.record({k: kernels.KernelConfig(256, 64, 8, 3)}, table_file)
    assert tuned.lookup("fprop", torch.bfloat16, 128, 8000, 0.47, cuda0) == kernels.KernelConfig(256, 64, 8, 3)
    assert tuned.lookup("bprop", torch.bfloat16, 128, 8000, 0.47, cuda0) is None
    tuned.record({k: kernels.KernelConfig(128, 64, 4, 4)}, table_file)  # record() forgets the remembered answers
    assert tuned.lookup("fprop", torch.bfloat16, 128, 8000, 0.47, cuda0) == kernels.KernelConfig(128, 64, 4, 4)
    monkeypatch.setenv("TILESPARSE_TUNED", "off")
    assert tuned.lookup("fprop", torch.bfloat16, 128, 8000, 0.47, cuda0) is None


def test_lookup_entry_says_whether_the_entry_is_this_weight_shapes(table_file, monkeypatch):
    # (the dispatcher leaves an entry measured on this very shape alone: bsmm_small.warps_for_grid)
    fake_gpu(monkeypatch)
    cuda0 = torch.device("cuda", 0)
    free = tuned.key("fake-gpu", "fprop", torch.bfloat16, 64, 32, 0.5)
    shaped = tuned.key("fake-gpu", "fprop", torch.bfloat16, 64, 32, 0.5, (4096, 4096))
    tuned.record({free: kernels.KernelConfig(64, 64, 4, 3), shaped: kernels.KernelConfig(128, 64, 8, 3)}, table_file)
    args = ("fprop", torch.bfloat16, 64, 32, 0.5, cuda0)
    assert tuned.lookup_entry(*args, (4096, 4096)) == (kernels.KernelConfig(128, 64, 8, 3), True)
    assert tuned.lookup_entry(*args, (8192, 4096)) == (kernels.KernelConfig(64, 64, 4, 3), False)
    assert tuned.lookup_entry(*args) == (kernels.KernelConfig(64, 64, 4, 3), False)
    assert tuned.lookup_entry("bprop", *args[1:], (4096, 4096)) == (None, False)
    monkeypatch.setenv("TILESPARSE_TUNED", " OFF ")  # any case, as the other switches
    assert tuned.lookup_entry(*args, (4096, 4096)) == (None, False) and tuned.user_path() is None


def test_fp16_falls_back_to_bf16_entries_after_its_own(table_file, monkeypatch):
    fake_gpu(monkeypatch)
    cuda0 = torch.device("cuda", 0)
    bf16 = tuned.key("fake-gpu", "updat", torch.bfloat16, 64, 8192, 0.5)
    tuned.record({bf16: kernels.KernelConfig(64, 64, 8, 3)}, table_file)
    assert tuned.lookup("updat", torch.float16, 64, 8192, 0.5, cuda0) == kernels.KernelConfig(64, 64, 8, 3)
    assert tuned.lookup("updat", torch.float32, 64, 8192, 0.5, cuda0) is None  # fp32 / tf32 only their own
    fp16_shaped = tuned.key("fake-gpu", "updat", torch.float16, 64, 8192, 0.5, (4096, 4096))
    tuned.record({fp16_shaped: kernels.KernelConfig(128, 64, 4, 4)}, table_file)
    assert tuned.lookup("updat", torch.float16, 64, 8192, 0.5, cuda0, (4096, 4096)) == kernels.KernelConfig(
        128, 64, 4, 4)  # its own entry first
    assert tuned.lookup("updat", torch.bfloat16, 64, 8192, 0.5, cuda0, (4096, 4096)) == kernels.KernelConfig(
        64, 64, 8, 3)  # never the other way round


def test_an_entry_for_the_weight_shape_comes_before_the_shape_free_one(table_file, monkeypatch):
    fake_gpu(monkeypatch)
    cuda0 = torch.device("cuda", 0)
    general = tuned.key("fake-gpu", "updat", torch.bfloat16, 128, 8192, 0.5)
    shaped = tuned.key("fake-gpu", "updat", torch.bfloat16, 128, 8192, 0.5, (11008, 4096))
    assert shaped == general + "|w11008x4096"
    tuned.record({general: kernels.KernelConfig(64, 128, 4, 4)}, table_file)
    assert tuned.lookup("updat", torch.bfloat16, 128, 8192, 0.5, cuda0, (11008, 4096)) == kernels.KernelConfig(
        64, 128, 4, 4)  # no entry for the shape: the shape-free one
    tuned.record({shaped: kernels.KernelConfig(64, 64, 8, 3)}, table_file)
    assert tuned.lookup("updat", torch.bfloat16, 128, 8192, 0.5, cuda0, (11008, 4096)) == kernels.KernelConfig(
        64, 64, 8, 3)
    for other in ((4096, 4096), None):  # other weights, or none named: the shape-free entry
        assert tuned.lookup("updat", torch.bfloat16, 128, 8192, 0.5, cuda0, other) == kernels.KernelConfig(
            64, 128, 4, 4)


def test_the_users_entries_come_before_the_shipped_ones_shaped_or_not(table_file, monkeypatch):
    # a user's own `tilesparse tune` (shape-free) must not be shadowed by a shipped entry for the shape
    fake_gpu(monkeypatch)
    shaped = tuned.key("fake-gpu", "fprop", torch.bfloat16, 64, 8192, 0.5, (4096, 4096))
    monkeypatch.setattr(tuned, "_read_shipped", lambda: {shaped: kernels.KernelConfig(128, 64, 8, 3)})
    tuned.reload()
    cuda0 = torch.device("cuda", 0)
    assert tuned.lookup("fprop", torch.bfloat16, 64, 8192, 0.5, cuda0, (4096, 4096)) == kernels.KernelConfig(
        128, 64, 8, 3)
    tuned.record({tuned.key("fake-gpu", "fprop", torch.bfloat16, 64, 8192, 0.5): kernels.KernelConfig(64, 64, 4, 4)},
                 table_file)
    assert tuned.lookup("fprop", torch.bfloat16, 64, 8192, 0.5, cuda0, (4096, 4096)) == kernels.KernelConfig(
        64, 64, 4, 4)


def test_a_gpu_without_entries_takes_the_shipped_ones_of_its_chip(table_file, monkeypatch):
    # an H100 SXM (sm_90, 132 SMs) has no table of its own: it takes the H200's
    sibling = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 32, 0.5)
    sibling_shaped = tuned.key("nvidia-h200", "fprop", torch.bfloat16, 16, 32, 0.5, (12288, 12288))
    monkeypatch.setattr(tuned, "_read_shipped", lambda: {sibling: kernels.KernelConfig(64, 64, 4, 3),
                                                         sibling_shaped: kernels.KernelConfig(128, 64, 8, 3)})
    monkeypatch.setattr(tuned, "_shipped_chips", functools.lru_cache(maxsize=1)(lambda: {"nvidia-h200": ("9.0", 132)}))
    tuned.reload()
    cuda0 = torch.device("cuda", 0)
    fake_gpu(monkeypatch, "nvidia-h100-80gb-hbm3", ("9.0", 132))
    assert tuned.lookup("fprop", torch.bfloat16, 16, 32, 0.5, cuda0) == kernels.KernelConfig(64, 64, 4, 3)
    assert tuned.lookup("fprop", torch.float16, 16, 32, 0.5, cuda0, (12288, 12288)) == kernels.KernelConfig(
        128, 64, 8, 3)  # fp16 -> bf16 and the shape's entry, as for its own
    assert tuned.lookup("bprop", torch.bfloat16, 16, 32, 0.5, cuda0) is None
    # its own entries, shape-free ones included, come before the sibling's
    tuned.record({tuned.key("nvidia-h100-80gb-hbm3", "fprop", torch.bfloat16, 16, 32, 0.5):
                  kernels.KernelConfig(32, 64, 4, 4)}, table_file)
    assert tuned.lookup("fprop", torch.bfloat16, 16, 32, 0.5, cuda0, (12288, 12288)) == kernels.KernelConfig(
        32, 64, 4, 4)
    for slug, chip in (("nvidia-h100-pcie", ("9.0", 114)), ("nvidia-a100-sxm4-80gb", ("8.0", 108))):
        fake_gpu(monkeypatch, slug, chip)  # another chip: heuristics
        tuned.reload()
        assert tuned.lookup("fprop", torch.bfloat16, 16, 32, 0.5, cuda0) is None


def test_the_shipped_h200_table_names_its_chip_and_tune_records_the_header(table_file):
    assert tuned.same_chip_slugs("nvidia-h100-80gb-hbm3", ("9.0", 132)) == ("nvidia-h200",)
    assert tuned.same_chip_slugs("nvidia-h200", ("9.0", 132)) == ()
    header = {"gpu": "fake-gpu", "capability": "9.0", "sms": 132}
    k = tuned.key("fake-gpu", "fprop", torch.bfloat16, 16, 32, 0.5)
    tuned.record({k: kernels.KernelConfig(64, 64, 4, 3)}, table_file, device=header)
    tuned.record({k: kernels.KernelConfig(64, 64, 8, 3)}, table_file, device={**header, "sms": 1})
    data = json.loads(table_file.read_text())
    assert data["device"] == header  # kept, not overwritten
    assert tuned.from_json(data["entries"][k]["config"]) == kernels.KernelConfig(64, 64, 8, 3)


def test_lookups_off_and_on_cpu(monkeypatch):
    assert tuned.lookup("fprop", torch.float32, 16, 64, 0.5, torch.device("cpu")) is None
    monkeypatch.setenv("TILESPARSE_TUNED", "off")
    assert tuned.user_path() is None


def test_dds_and_sdd_use_a_tuned_config(monkeypatch):
    # The launchers ask the table (op, dtype, block, M, density) before their heuristics,
    # and run whichever kind of config it returns.
    calls = []

    def fake_lookup(op, dtype, block, m, density, device, weight=None):
        calls.append((op, dtype, block, m, round(density, 4)))
        assert weight == (layout.shape[0], layout.shape[1])  # W [N, K], whichever product
        return PanelConfig(2, block_m=16) if op != "updat" else kernels.KernelConfig(16, 16, 4, 2)

    monkeypatch.setattr(tuned, "lookup", fake_lookup)
    layout = make_layout("random", 4, 3, 16)
    values = random_values(layout, torch.float32)
    a = torch.randn(20, layout.shape[1])
    out = kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True)
    assert_close(out, a.double() @ dense_of(values, layout).t(), torch.float32, "dds via tuned panel")
    g, x = torch.randn(20, layout.shape[0]), torch.randn(20, layout.shape[1])
    out = kernels.sdd(g.t(), x, layout.meta, 16, layout.block_rows, layout.block_cols)
    assert_close(out, layout.gather(g.t().double() @ x.double()), torch.float32, "sdd via tuned config")
    density = round(layout.nnz / 12, 4)
    assert calls == [("fprop", torch.float32, 16, 20, density), ("updat", torch.float32, 16, 20, density)]


@pytest.mark.parametrize("m", [1, 64, 256, 512, 8192])
@pytest.mark.parametrize("block", [16, 32, 64, 128])
@pytest.mark.parametrize("fp32", [False, True])
def test_search_spaces_are_valid_configs(m, block, fp32):
    from tilesparse.kernels.bsmm_gemv import GemvConfig

    kinds = (kernels.KernelConfig, SmallConfig, PanelConfig, WsConfig, WsGroupConfig, GemvConfig)
    dds = list(tune_mod.dds_space(m, block, fp32))
    gemv = [c for c in dds if isinstance(c, GemvConfig)]
    assert bool(gemv) == (m <= 8)  # the FMA kernel at 1-8 rows
    deep = [c for c in dds if isinstance(c, PanelConfig) and c.swap]  # deep panels: b 16, 16-bit, <= 64 rows
    assert bool(deep) == (block == 16 and m <= 64 and not fp32)
    assert all(c.entries * block <= 256 and c.group * block <= 256 and c.block_m >= 16 for c in deep)
    # ... and with 128 x 128 tiles, the rows as the MMA's M side, sums in-kernel: b 16 / 32, 65-512 rows
    wide = [c for c in dds if isinstance(c, PanelConfig) and c.block_m == 128 and c.fused_sum]
    assert bool(wide) == (block <= 32 and 64 < m <= 512 and not fp32)
    assert all(not c.swap and c.splits > 1 and c.entries * block <= 64 and c.group * block <= 128 for c in wide)
    assert all(c.sub <= max(16, block) for c in gemv)
    sdd = list(tune_mod.sdd_space(block, nnz=50, sms=132, fp32=fp32))
    assert dds and sdd
    assert all(isinstance(c, kinds) for c in dds)
    grouped = [c for c in dds if isinstance(c, WsGroupConfig)]
    assert bool(grouped) == (not fp32 and block <= 64 and m > 256)  # the column-grouped kernel
    assert all(c.accumulator_registers(block) <= 128 and c.shared_bytes(block) <= 227 * 1024 for c in grouped)
    assert all(isinstance(c, (kernels.KernelConfig, WsConfig, SddGroupConfig, SddTileConfig, WsSddGroupConfig,
                              WsSddRowsConfig)) for c in sdd)
    assert any(isinstance(c, WsSddGroupConfig) for c in sdd) == (not fp32 and block == 64)
    rows = [c for c in sdd if isinstance(c, WsSddRowsConfig)]  # the row-run sdd: b 64, 16-bit
    assert bool(rows) == (not fp32 and block == 64)
    assert all(c.shared_bytes() <= 227 * 1024 for c in rows)
    assert any(isinstance(c, SddGroupConfig) for c in sdd) == (not fp32)
    assert any(isinstance(c, SddTileConfig) for c in sdd) == (not fp32 and block <= 64)
    for c in sdd:
        if isinstance(c, SddGroupConfig):
            c.check_block(block)  # the panel fits
        if isinstance(c, SddTileConfig):
            assert c.fits(block)
    assert any(isinstance(c, WsConfig) for c in sdd) == (not fp32 and block >= 64)
    # the streaming kernel: at small M, at M 128-512 with the row tiles inner (16-bit), and
    # at large M as feature-major tiles (16-bit, b 16)
    small = [c for c in dds if isinstance(c, SmallConfig)]
    assert bool(small) == (m <= 256 or (not fp32 and (m <= 512 or block <= 16)))
    assert any(c.m_inner for c in small) == (not fp32 and 64 < m <= 512)
    # each step's index and activation tile loaded ahead: wherever the streaming kernel is tried at small M
    assert any(c.prefetch for c in small) == (m <= 256 or (not fp32 and m <= 512))
    # the Hopper warp-specialized kernel at large M: b 64 and 128 (fp32 as TF32), and in
    # 16-bit b 16 and 32 too (deep rings)
    assert any(isinstance(c, WsConfig) for c in dds) == ((block >= 64 or not fp32) and m > 256)
    for c in dds:
        if isinstance(c, WsConfig):
            assert c.block_k <= block
    for c in dds:
        if isinstance(c, PanelConfig):
            assert c.group * block <= 128
        if isinstance(c, SmallConfig):
            assert c.sub <= max(16, block) and (max(16, block) % c.sub == 0)


def test_tune_command_needs_a_gpu(capsys):
    assert main(["tune", "--block", "64"]) == 1
    assert "needs a CUDA device" in capsys.readouterr().out


@pytest.mark.parametrize("make, field", [
    (lambda: kernels.KernelConfig(100, 64, 4, 4), "block_m"),
    (lambda: kernels.KernelConfig(128, 48, 4, 4), "block_k"),
    (lambda: kernels.KernelConfig(128, 64, 3, 4), "num_warps"),
    (lambda: kernels.KernelConfig(128, 64, 4, 0), "num_stages"),
    (lambda: SmallConfig(24, 64, 16, 4, 8), "sub"),
    (lambda: SmallConfig(32, 64, 8, 4, 8), "block_m"),
    (lambda: PanelConfig(3), "group"),
    (lambda: PanelConfig(2, splits=0), "splits"),
    (lambda: PanelConfig(2, splits=True), "splits"),
    (lambda: WsConfig(96, 64, 8, 4), "block_m"),
    (lambda: WsConfig(512, 64, 8, 4), "block_m"),
    (lambda: WsConfig(128, 64, 2, 4), "num_warps"),
    (lambda: WsConfig(128, 64, 8, 1), "stages"),
    (lambda: WsConfig(128, 64, 8, 4, pingpong=True), "pingpong"),
])
def test_bad_configs_are_refused_by_name(make, field):
    with pytest.raises(ValueError, match=field):
        make()


@pytest.mark.parametrize("config, field", [
    (SmallConfig(64, 16, 16, 4, 2), "sub"),          # 64 features per program, 32-wide tile
    (kernels.KernelConfig(32, 64, 4, 2), "block_k"),
])
def test_configs_larger_than_the_tile_are_refused(config, field):
    # Each of these once compiled to a kernel that wrote nothing (or only the bias).
    layout = make_layout("random", 2, 2, 32)
    values = random_values(layout, torch.float32)
    a = torch.randn(5, layout.shape[1])
    with pytest.raises(ValueError, match=f"{field}=64 exceeds the 32-wide tile"):
        kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True, config)


def test_search_spaces_use_the_kernels_tile_for_odd_blocks():
    # b = 24 runs on 32-wide tiles: candidates must be built for 32, not 24.
    for c in tune_mod.dds_space(8192, 24, False):
        if isinstance(c, kernels.KernelConfig):
            assert c.block_k == 32
    for c in tune_mod.sdd_space(24, nnz=10, sms=132, fp32=False):
        if isinstance(c, SddGroupConfig):
            c.check_block(24)  # panels of 32-wide tiles
        else:
            assert c.block_k == 32


def test_float32_keys_name_the_matmul_precision():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert "|fp32|" in tuned.key("g", "fprop", torch.float32, 64, 100, 0.5)
        torch.set_float32_matmul_precision("high")
        assert "|tf32|" in tuned.key("g", "fprop", torch.float32, 64, 100, 0.5)
    finally:
        torch.set_float32_matmul_precision(old)


def test_a_broken_user_file_warns_and_is_ignored(table_file):
    table_file.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring the tuned-config file"):
        assert tuned._table() == tuned._read_shipped()


def test_ws_config_is_refused_off_hopper_by_name():
    # the Gluon kernel runs only on sm90; elsewhere a forced WsConfig is a clear error
    # (the default dispatch never picks it there)
    layout = make_layout("random", 2, 2, 64)
    values = random_values(layout, torch.bfloat16)
    a = torch.randn(600, layout.shape[1]).to(torch.bfloat16)
    with pytest.raises(ValueError, match="needs an sm90"):
        kernels.dds(a, values, layout.meta, None, layout.block_rows, layout.block_cols, True, WsConfig())


def test_confirm_times_both_in_turn_and_returns_medians():
    order, times = [], iter([5.0, 4.0, 9.0, 4.2, 5.2, 3.0, 4.8, 4.1, 5.1, 9.9])

    def time_ms(fn):
        order.append(fn())
        return next(times)

    current, best = tune_mod.confirm(lambda: "current", lambda: "best", 5, time_ms=time_ms)
    assert order == ["current", "best"] * 5  # in turn, so a drift hits both alike
    assert current == 5.1 and best == 4.1  # medians of (5, 9, 5.2, 4.8, 5.1) and (4, 4.2, 3, 4.1, 9.9)


def test_tune_confirm_rounds_must_not_be_negative(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--confirm", "-1"])
    assert "confirm must be at least 0" in capsys.readouterr().err


@pytest.mark.parametrize("nnz, expected", [
    (51, [1, 3]),  # fewer blocks than SMs: enough splits to fill them
    (132, [1]),  # one full wave
    (138, [1, 2, 4]),  # a 5 % second wave
    (300, [1, 2, 4]),
    (396, [1]),  # three waves and more: the tail weighs little
])
def test_split_counts_for_partial_waves(nnz, expected):
    assert tune_mod.split_counts(nnz, 132) == expected
    splits = {c.splits for c in tune_mod.sdd_space(128, nnz, 132, fp32=False) if isinstance(c, kernels.KernelConfig)}
    assert splits == set(expected)


@pytest.mark.parametrize("nnz, group, expected", [
    (3277, 16, [1, 2, 4, 8]),  # b 16 at density 0.05 on 4096²: ~205 groups
    (4096, 8, [1, 2, 4]),  # b 32 at 0.25: 512 groups
    (32768, 16, [1]),  # b 16 at 0.5: 2048 groups fill the GPU
])
def test_group_split_counts(nnz, group, expected):
    assert tune_mod.group_split_counts(nnz, group, 132) == expected
    splits = {c.splits for c in tune_mod.sdd_space(16, nnz, 132, fp32=False)  # b 16's groups: 16 and 8
              if isinstance(c, SddGroupConfig) and c.group == group}
    assert splits == set(expected)


def test_product_runs_each_op_on_one_cases_operands():
    # the tuner's, dispatch_one's and tuned_ab's call: fprop, bprop and updat against float64
    layout = make_layout("random", 4, 3, 16)
    values = random_values(layout, torch.float32)
    meta = layout.meta_on("cpu")
    x, dy = torch.randn(40, 48), torch.randn(40, 64)
    w = dense_of(values, layout)
    expected = {"fprop": x.double() @ w.t(), "bprop": dy.double() @ w,
                "updat": layout.gather(dy.double().t() @ x.double())}
    for op, want in expected.items():
        call = tune_mod.product(op, x, dy, values, meta, 16, layout.block_rows, layout.block_cols)
        assert_close(call(), want, torch.float32, f"product {op}")
    with pytest.raises(ValueError, match="op must be fprop, bprop or updat"):
        tune_mod.product("step", x, dy, values, meta, 16, 4, 3)
