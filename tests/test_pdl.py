"""Programmatic dependent launch settings (``tilesparse.kernels._pdl``): the mode each
device gets, the launch options it turns into, and that the small-batch and LSTM cell
launchers pass them; on an sm90 GPU (marked ``gpu``) chained small products and LSTM
cells give bitwise the same results in every mode, inside a CUDA graph too, and are
really launched with PDL."""

import pytest
import torch

from tilesparse.kernels import _launch, _pdl, bsmm_small, lstm_cell


@pytest.fixture(autouse=True)
def _fresh_options():
    _pdl.reload()
    yield
    _pdl.reload()


@pytest.fixture
def hopper_cuda(monkeypatch):
    """Pretend the CUDA device is an sm90 NVIDIA GPU outside the interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(_pdl, "capability_major", lambda device: 9)


class _FakeCudaTensor:
    is_cuda = True
    device = torch.device("cuda", 0)

    def get_device(self):
        return 0


def test_cpu_tensors_never_launch_with_pdl(monkeypatch):
    monkeypatch.setenv("TILESPARSE_PDL", "2")
    assert _pdl.mode(torch.device("cpu")) == 0
    assert _pdl.pdl_options(torch.zeros(1)) == {"PDL": 0}


@pytest.mark.parametrize("setting, expected", [(None, _pdl.DEFAULT), ("0", 0), ("1", 1), ("2", 2), ("3", 3)])
def test_the_mode_on_hopper_follows_the_setting(monkeypatch, hopper_cuda, setting, expected):
    if setting is None:
        monkeypatch.delenv("TILESPARSE_PDL", raising=False)
    else:
        monkeypatch.setenv("TILESPARSE_PDL", setting)
    assert _pdl.mode(torch.device("cuda", 0)) == expected
    options = _pdl.pdl_options(_FakeCudaTensor())
    assert options == ({"PDL": expected, "launch_pdl": True} if expected else {"PDL": 0})


def test_options_are_remembered_until_reload(monkeypatch, hopper_cuda):
    monkeypatch.setenv("TILESPARSE_PDL", "2")
    assert _pdl.pdl_options(_FakeCudaTensor())["PDL"] == 2
    monkeypatch.setenv("TILESPARSE_PDL", "0")
    assert _pdl.pdl_options(_FakeCudaTensor())["PDL"] == 2  # no env read on the launch path
    _pdl.reload()
    assert _pdl.pdl_options(_FakeCudaTensor()) == {"PDL": 0}


@pytest.mark.parametrize("what", ["older gpu", "rocm", "interpreter"])
def test_where_pdl_cannot_work_it_is_off(monkeypatch, hopper_cuda, what):
    monkeypatch.setenv("TILESPARSE_PDL", "2")
    if what == "older gpu":
        monkeypatch.setattr(_pdl, "capability_major", lambda device: 8)
    elif what == "rocm":  # MI200 / MI300 report major 9; Triton's HIP backend has no launch_pdl
        monkeypatch.setattr(torch.version, "hip", "6.2")
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "true")
    assert _pdl.mode(torch.device("cuda", 0)) == 0
    assert _pdl.pdl_options(_FakeCudaTensor()) == {"PDL": 0}


@pytest.mark.parametrize("setting", ["yes", "4", "-1", "²", ""])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_bad_setting_is_refused_by_name_on_any_device(monkeypatch, hopper_cuda, setting, device):
    monkeypatch.setenv("TILESPARSE_PDL", setting)
    with pytest.raises(ValueError, match="TILESPARSE_PDL"):
        _pdl.mode(torch.device(device))


def test_the_fast_launch_path_takes_the_pdl_option():
    # a keyword outside _OPTIONS would send every PDL launch down Triton's slower path
    assert "launch_pdl" in _launch._OPTIONS


def test_the_small_kernel_and_lstm_cell_launchers_pass_the_options(monkeypatch):
    sentinel = {"PDL": 2, "launch_pdl": True}
    calls = []
    for module in (bsmm_small, lstm_cell):
        monkeypatch.setattr(module, "pdl_options", lambda t: sentinel)
        monkeypatch.setattr(module, "launch", lambda kernel, grid, *args, **kwargs: calls.append((kernel, kwargs)))
    ptr = torch.tensor([0, 1], dtype=torch.int32)
    idx = torch.zeros(1, dtype=torch.int32)
    a, values, c = torch.randn(4, 32), torch.randn(1, 32, 32), torch.empty(4, 32)
    bsmm_small.launch_dds_small(a, values, c, None, ptr, idx, None, 1, True, "ieee",
                                bsmm_small.SmallConfig(32, 32, 16, 4, 2))
    gates = torch.randn(4, 64)
    h, c, acts = lstm_cell.lstm_cell_forward_triton(gates)
    lstm_cell.lstm_cell_backward_triton(torch.randn(4, 16), None, acts, c, None)
    names = [kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__ for kernel, _ in calls]
    assert names == ["_dds_small_kernel", "_lstm_cell_fwd_kernel", "_lstm_cell_bwd_kernel"]
    for _, kwargs in calls:
        assert kwargs["PDL"] == 2 and kwargs["launch_pdl"] is True


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
    _pdl.reload()
    expected = chain()
    monkeypatch.setenv("TILESPARSE_PDL", setting)
    _pdl.reload()
    eager = chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    graph.replay()
    torch.cuda.synchronize()
    for want, got, again in zip(expected, eager, captured):
        assert torch.equal(want, got) and torch.equal(want, again)
    # and the launches really were programmatic dependent launches
    pdl_kernels = {key[0].__name__ for key, compiled in _launch._COMPILED.items()
                   if dict(key[3]).get("launch_pdl") and compiled.metadata.launch_pdl}
    assert {"_dds_small_kernel", "_lstm_cell_fwd_kernel"} <= pdl_kernels
