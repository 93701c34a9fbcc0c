"""The direct launch path (tilesparse.kernels._launch): its specialization keys on the CPU,
and on the GPU the same bits as Triton's own launch, with new specializations (alignment,
integer classes) compiled rather than reused."""

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from bsmm_cases import count_triton_runs
from tilesparse.kernels import _launch
from tilesparse.layouts import random as random_layout



def _kernel(x_ptr, n, stride, B: tl.constexpr, FLAG: tl.constexpr):  # never launched here
    pass


def test_int_specialization_classes_differ_where_triton_may_specialize():
    spec = _launch.arg_spec
    assert spec(16) == spec(32) and spec(17) == spec(33)
    assert spec(16) != spec(17)  # divisibility by 16
    assert spec(1) != spec(17)  # equality to 1
    assert spec(2**31 - 16) != spec(2**31)  # 32- vs 64-bit
    assert spec(-(2**31)) != spec(-(2**31) - 16)
    assert spec(True) != spec(1) and spec(True) == spec(False)  # bool is its own type
    assert spec(0.5) == spec(2.0) and spec(None) is None


def test_tensor_specialization_is_dtype_and_16_byte_alignment():
    buf = torch.zeros(64, dtype=torch.float16)
    assert _launch.arg_spec(buf) == (torch.float16, True)
    assert _launch.arg_spec(buf[1:]) == (torch.float16, False)  # base + 2 bytes
    assert _launch.arg_spec(buf[8:]) == (torch.float16, True)  # base + 16 bytes
    assert _launch.arg_spec(buf.float()) != _launch.arg_spec(buf)
    with pytest.raises(_launch._Unhandled):
        _launch.arg_spec("text")


def test_host_descriptor_specialization_is_all_but_the_address():
    buf = torch.zeros(4096, dtype=torch.bfloat16)
    desc = lambda t, block: TensorDescriptor(t, list(t.shape), list(t.stride()), block)  # noqa: E731
    a, b = buf[:2048].view(32, 64), buf[2048:].view(32, 64)  # same layout, other address
    assert _launch.arg_spec(desc(a, [16, 64])) == _launch.arg_spec(desc(b, [16, 64]))
    assert _launch.arg_spec(desc(a, [16, 64])) == _launch.arg_spec(desc(buf.view(64, 64), [16, 64]))  # sizes by class
    assert _launch.arg_spec(desc(a, [16, 64])) != _launch.arg_spec(desc(a, [32, 64]))
    assert _launch.arg_spec(desc(a, [16, 64])) != _launch.arg_spec(desc(buf[:2560].view(40, 64), [16, 64]))


def test_gluon_host_descriptor_specialization_adds_its_shared_memory_layout():
    # the Gluon kernels' host-built descriptors (e.g. DkdvWsConfig.host_descs): keyed as the
    # Triton ones plus the layout their boxes land in; their tensor names the device
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    buf = torch.zeros(4096, dtype=torch.bfloat16)
    a, b = buf[:2048].view(32, 64), buf[2048:].view(32, 64)
    wide, narrow = (gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16) for shape in ([16, 64], [16, 32]))
    desc = lambda t, block, layout: GluonTensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)  # noqa: E731
    assert _launch.arg_spec(desc(a, [16, 64], wide)) == _launch.arg_spec(desc(b, [16, 64], wide))
    assert _launch.arg_spec(desc(a, [16, 64], wide)) != _launch.arg_spec(desc(a, [16, 64], narrow))
    assert _launch.arg_spec(desc(a, [16, 64], wide)) != _launch.arg_spec(desc(a, [32, 64], wide))
    assert _launch.arg_spec(desc(a, [16, 64], wide)) != _launch.arg_spec(TensorDescriptor(a, [32, 64], [64, 1],
                                                                                          [16, 64]))
    assert _launch._cuda_index(desc(a, [16, 64], wide)) is None  # a CPU tensor


def test_compile_settings_are_part_of_the_key(monkeypatch):
    import triton

    before = _launch._compile_knobs()
    monkeypatch.setattr(triton.knobs.runtime, "debug", not triton.knobs.runtime.debug)
    assert _launch._compile_knobs() != before


def _with_default(x_ptr, n, B: tl.constexpr, MODE: tl.constexpr = 3):  # never launched here
    pass


def _names(tail):
    return None if tail is None else tuple(name for name, _ in tail)


def test_constexpr_tail_only_when_keywords_are_exactly_the_trailing_constexprs():
    kernel = JITFunction(_kernel)
    tail = _launch._constexpr_tail
    assert _names(tail(kernel, 3, ("FLAG", "B", "num_warps"))) == ("B", "FLAG")  # the kernel's order
    assert all(value is _launch._GIVEN for _, value in tail(kernel, 3, ("FLAG", "B")))
    assert tail(kernel, 3, ("B",)) is None  # FLAG missing (no default)
    assert tail(kernel, 2, ("stride", "B", "FLAG")) is None  # a runtime parameter by keyword
    assert tail(kernel, 4, ("FLAG",)) is None  # a constexpr by position: its value would not be keyed


def test_constexpr_tail_fills_in_defaults_not_given():
    # a constexpr with a default the call leaves out (the persistent attention forward's
    # MMA_REGS) is passed to the compiled launcher at its default, in the kernel's order
    kernel = JITFunction(_with_default)
    assert _launch._constexpr_tail(kernel, 2, ("B",)) == (("B", _launch._GIVEN), ("MODE", 3))
    assert _launch._constexpr_tail(kernel, 2, ("MODE", "B")) == (("B", _launch._GIVEN), ("MODE", _launch._GIVEN))
    assert _launch._constexpr_tail(kernel, 2, ("MODE",)) is None  # B has no default


def test_constexpr_tail_takes_num_warps_when_the_kernel_declares_it():
    # Gluon kernels declare their launch option num_warps as a constexpr parameter too:
    # it is passed to the compiled launcher in the kernel's order, like any constexpr
    from tilesparse.kernels import bsmm_ws

    kernel = bsmm_ws._dds_ws_kernel
    names = tuple(p.name for p in kernel.params if p.is_constexpr)
    n_positional = len(kernel.params) - len(names)
    assert "num_warps" in names
    assert _names(_launch._constexpr_tail(kernel, n_positional, tuple(reversed(names)))) == names
    assert _launch._constexpr_tail(kernel, n_positional, tuple(n for n in names if n != "num_warps")) is None


def test_cpu_tensors_take_tritons_own_launch(monkeypatch):
    monkeypatch.setattr(_launch, "_ENABLED", True)  # as on a GPU machine: the tensor's device decides
    calls = []
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, **kwargs: calls.append((args, kwargs)))
    x = torch.zeros(4)
    _launch.launch(JITFunction(_kernel), (3,), x, 4, 1, B=2, FLAG=True, num_warps=1)
    assert calls == [((x, 4, 1), {"grid": (3,), "warmup": False, "B": 2, "FLAG": True, "num_warps": 1})]
    assert not any(key[0].fn is _kernel for key in _launch._COMPILED)


def test_launch_enters_the_first_arguments_device_only_when_it_is_not_current(monkeypatch):
    entered, launched = [], []

    class Device:  # stands in for torch.cuda.device: records which device was entered
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(_launch, "_cuda_index", lambda arg: arg)  # "tensors" that are device indices
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_launch, "_launch_current", lambda k, g, device, args, kw: launched.append((device, args)))
    _launch.launch(_kernel, (1,), 0, 5)
    _launch.launch(_kernel, (1,), 1, 5)
    assert entered == [1] and launched == [(0, (0, 5)), (1, (1, 5))]
    # while a CUDA graph is captured on the current device, another device's launch would
    # run once outside the graph: refused, naming both devices
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="cuda:1 while a CUDA graph is being captured on cuda:0"):
        _launch.launch(_kernel, (1,), 1, 5)
    _launch.launch(_kernel, (1,), 0, 5)  # the current device's launch is captured as usual
    assert entered == [1] and len(launched) == 3


# --------------------------------------------------------------------------- GPU

DEVICE = "cuda"


def _products(x, w, layout, dy, cfg):
    from tilesparse.kernels import bsmm as K

    meta, r, c = layout.meta, layout.block_rows, layout.block_cols
    return (K.dds(x, w, meta, None, r, c, True, cfg), K.dds(dy, w, meta, None, r, c, False, cfg),
            K.sdd(dy.t(), x, meta, layout.block_size, r, c))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["pointers", "descriptors", "ws"])
def test_gpu_direct_launch_matches_tritons_bitwise(monkeypatch, kind):
    from tilesparse.kernels import bsmm as K
    from tilesparse.kernels import bsmm_ws

    layout = random_layout(512, 384, 64, 0.4, device=DEVICE)
    if kind == "ws":  # the Gluon kernel (Hopper only), whose num_warps is also a constexpr parameter
        if torch.cuda.get_device_capability()[0] != 9:
            pytest.skip("the warp-specialized kernel is written for sm90")
        cfg = bsmm_ws.WsConfig(128, 64, 8, 5)
    else:
        cfg = K.KernelConfig(128, 64, 4, 3, tma=kind == "descriptors")
    w = torch.randn(layout.nnz, 64, 64, device=DEVICE, dtype=torch.bfloat16)
    # 16-byte aligned, then a view 2 bytes off (a new specialization: pointer alignment),
    # then an M that is not a multiple of 16 (a new integer class)
    buf_x = torch.randn(300 * 384 + 1, device=DEVICE, dtype=torch.bfloat16)
    buf_dy = torch.randn(300 * 512 + 1, device=DEVICE, dtype=torch.bfloat16)
    # (the ws kernel needs 16-byte-aligned rows: no offset view)
    for m, offset in ((256, 0), (251, 0)) if kind == "ws" else ((256, 0), (256, 1), (251, 0)):
        x = buf_x[offset:offset + m * 384].view(m, 384)
        dy = buf_dy[offset:offset + m * 512].view(m, 512)
        monkeypatch.setattr(_launch, "_ENABLED", False)
        expected = _products(x, w, layout, dy, cfg)
        monkeypatch.setattr(_launch, "_ENABLED", True)
        for _ in range(2):  # the first call may compile and remember, the second launches directly
            got = _products(x, w, layout, dy, cfg)
            for e, g in zip(expected, got):
                assert torch.equal(e, g)
    seen = count_triton_runs(monkeypatch)
    _products(x, w, layout, dy, cfg)
    assert seen == []  # every product of a remembered specialization skipped Triton's launch


@pytest.mark.gpu
def test_gpu_direct_launch_small_kernel_ints_equal_to_one_and_other_configs(monkeypatch):
    import dataclasses

    from tilesparse.kernels import bsmm as K
    from tilesparse.kernels import bsmm_small as S

    layout = random_layout(512, 384, 32, 0.3, device=DEVICE)
    meta, r, c = layout.meta, layout.block_rows, layout.block_cols
    w = torch.randn(layout.nnz, 32, 32, device=DEVICE, dtype=torch.bfloat16)
    for m in (1, 2, 17):  # M 1: an int Triton specializes as the constant 1
        x = torch.randn(m, 384, device=DEVICE, dtype=torch.bfloat16)
        small = S.small_config(m, 32, torch.bfloat16)
        for cfg in (small, dataclasses.replace(small, num_warps=8), K.KernelConfig(64, 32, 4, 3)):
            monkeypatch.setattr(_launch, "_ENABLED", False)
            expected = K.dds(x, w, meta, None, r, c, True, cfg)
            monkeypatch.setattr(_launch, "_ENABLED", True)
            for _ in range(2):
                assert torch.equal(K.dds(x, w, meta, None, r, c, True, cfg), expected), (m, cfg)


@pytest.mark.gpu
def test_gpu_layer_on_a_device_that_is_not_current():
    """Kernels run on their tensors' device: a layer on the last GPU while the first is current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from tilesparse import BlockSparseLinear
    from tilesparse.kernels.block_scatter import gather_blocks, scatter_blocks

    device = torch.device("cuda", torch.cuda.device_count() - 1)
    previous = torch.cuda.current_device()
    torch.cuda.set_device(0)
    layer = BlockSparseLinear(384, 512, block_size=64, density=0.4, dtype=torch.bfloat16).to(device)
    x = torch.randn(200, 384, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().square().sum().backward()
    with torch.cuda.device(device):  # the same products with their device current
        x2 = x.detach().clone().requires_grad_()
        layer.zero_grad()
        y2 = layer(x2)
        y2.float().square().sum().backward()
    assert torch.cuda.current_device() == 0
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)
    meta, rows, cols = layer.layout.meta_on(device), layer.layout.block_rows, layer.layout.block_cols
    dense = scatter_blocks(layer.weight.detach(), meta, rows, cols)
    assert dense.device == device and torch.equal(gather_blocks(dense, meta, rows, cols, 64), layer.weight.detach())
    torch.cuda.set_device(previous)


@pytest.mark.gpu
def test_gpu_persistent_attention_forward_launches_directly(monkeypatch):
    # the persistent warp-specialized forward leaves a defaulted constexpr (MMA_REGS) out of
    # its launch: the direct path fills in the default, gives Triton's bits and skips
    # Triton's launch once remembered
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the warp-specialized kernel is written for sm90")
    from tilesparse.attention import layouts
    from tilesparse.kernels import attention as K

    layout = layouts.local(1024, 128, 256, causal=True)
    q, k, v = (torch.randn(2, 4, 1024, 128, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    meta = layout.meta_on(q.device, True)
    forward = lambda: K.attention_forward(q, k, v, meta, None, 1, 128, True, 128 ** -0.5)  # noqa: E731
    monkeypatch.setattr(_launch, "_ENABLED", False)
    expected = forward()
    monkeypatch.setattr(_launch, "_ENABLED", True)
    for _ in range(2):
        assert all(map(torch.equal, forward(), expected))
    seen = count_triton_runs(monkeypatch)
    forward()
    assert seen == []
