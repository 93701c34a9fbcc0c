"""Programmatic dependent launch settings (``tilesparse.kernels._pdl``): the mode each
device gets and the launch options it turns into; on an sm90 GPU (marked ``gpu``) the
small-batch kernel and the LSTM cell give bitwise the same results in every mode, inside
a CUDA graph too."""

import pytest
import torch

from tilesparse.kernels import _pdl


def test_cpu_tensors_never_launch_with_pdl(monkeypatch):
    monkeypatch.setenv("TILESPARSE_PDL", "2")
    assert _pdl.mode(torch.device("cpu")) == 0
    assert _pdl.pdl_options(torch.device("cpu")) == {"PDL": 0}


def test_the_interpreter_never_launches_with_pdl(monkeypatch):
    monkeypatch.setenv("TILESPARSE_PDL", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_pdl, "capability_major", lambda device: 9)
    assert _pdl.mode(torch.device("cuda", 0)) == 0


@pytest.mark.parametrize("setting, expected", [(None, _pdl.DEFAULT), ("0", 0), ("1", 1), ("2", 2), ("3", 3)])
def test_the_mode_on_hopper_follows_the_setting(monkeypatch, setting, expected):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(_pdl, "capability_major", lambda device: 9)
    if setting is None:
        monkeypatch.delenv("TILESPARSE_PDL", raising=False)
    else:
        monkeypatch.setenv("TILESPARSE_PDL", setting)
    assert _pdl.mode(torch.device("cuda", 0)) == expected
    options = _pdl.pdl_options(torch.device("cuda", 0))
    assert options == ({"PDL": expected, "launch_pdl": True} if expected else {"PDL": 0})


def test_older_gpus_never_launch_with_pdl(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TILESPARSE_PDL", "1")
    monkeypatch.setattr(_pdl, "capability_major", lambda device: 8)
    assert _pdl.mode(torch.device("cuda", 0)) == 0


@pytest.mark.parametrize("setting", ["yes", "4", "-1"])
def test_a_bad_setting_is_refused_by_name(monkeypatch, setting):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TILESPARSE_PDL", setting)
    monkeypatch.setattr(_pdl, "capability_major", lambda device: 9)
    with pytest.raises(ValueError, match="TILESPARSE_PDL"):
        _pdl.mode(torch.device("cuda", 0))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="PDL needs sm90 or newer")
@pytest.mark.parametrize("setting", ["1", "2", "3"])
def test_chained_small_products_and_cells_match_without_pdl_gpu(monkeypatch, setting):
    import tilesparse as ts
    from tilesparse.kernels.lstm_cell import lstm_cell_forward_triton

    layout = ts.layouts.random(1024, 1024, 64, 0.25, seed=2, device="cuda")
    values = torch.randn(layout.nnz, 64, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    c0 = torch.randn(8, 256, device="cuda")

    def chain():  # each call reads the one before it: the waits are what keeps this right
        y = x
        for _ in range(4):
            y = ts.dds(y, values, layout, trans_b=True)
        h, c = lstm_cell_forward_triton(y.float(), c0)[:2]
        return ts.dds(ts.dds(y, values, layout), values, layout, trans_b=True), h, c

    monkeypatch.setenv("TILESPARSE_PDL", "0")
    expected = chain()
    monkeypatch.setenv("TILESPARSE_PDL", setting)
    eager = chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    graph.replay()
    torch.cuda.synchronize()
    for want, got, again in zip(expected, eager, captured):
        assert torch.equal(want, got) and torch.equal(want, again)
