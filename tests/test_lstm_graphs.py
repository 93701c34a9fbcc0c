"""tilesparse.ops.lstm_graphs: the LSTM time loops replayed from CUDA graphs. On the CPU, the
cache's rules with a stand-in for the graph (first call eager, second captured, later ones replayed;
a key per shape, options and weight; at most MAX_LOOPS; a failed capture warns and stays eager; one
timestep and the switch stay eager), every call against the float64 dense recurrence. On the GPU,
bitwise the eager loop's values and gradients over calls with fresh inputs and an updated weight."""

import math

import pytest
import torch

from tilesparse import BlockSparseLSTM, layouts
from tilesparse.ops import lstm_graphs
from tilesparse.ops.lstm import lstm_sequence

from test_lstm_sequence import _dense_recurrence
from tolerances import assert_close

F64 = torch.float64


class _StandIn:
    """A captured loop without CUDA: static inputs made as the real one makes them, copied in, the loop
    run on them at each replay."""

    def __init__(self, fn, inputs, log):
        self.fn, self.log = fn, log
        self.inputs = lstm_graphs.static_copies(inputs)
        log.append("capture")

    def __call__(self, inputs):
        self.log.append("replay")
        for static, t in zip(self.inputs, inputs):
            if static is not None:
                static.copy_(t)
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in self.fn(*self.inputs))


@pytest.fixture
def stand_in(monkeypatch):
    log = []
    monkeypatch.setattr(lstm_graphs, "_replayable", lambda meta, steps: lstm_graphs.GRAPHS and steps > 1)
    monkeypatch.setattr(lstm_graphs, "_capture", lambda fn, inputs, device: _StandIn(fn, inputs, log))
    return log


def _case(steps=4, batch=3, hidden=16, block=8, seed=0):
    layout = layouts.random(4 * hidden, hidden, block, 0.5, seed=seed)
    values = (torch.randn(layout.nnz, block, block, dtype=F64) / math.sqrt(hidden)).requires_grad_()
    return layout, values


def _inputs(steps, batch, hidden, with_states):
    xproj = torch.randn(steps, batch, 4 * hidden, dtype=F64, requires_grad=True)
    states = [torch.randn(batch, hidden, dtype=F64, requires_grad=True) if with_states else None for _ in range(2)]
    return xproj, *states


def _check_against_dense(layout, values, xproj, h0, c0):
    out, h_n, c_n = lstm_sequence(xproj, values, layout, h0, c0)
    d_out = torch.randn_like(out)
    leaves = [t for t in (xproj, values, h0, c0) if t is not None]
    grads = torch.autograd.grad((out * d_out).sum() + h_n.sum() + c_n.sum(), leaves)
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    ref_h0 = refs[2] if h0 is not None else None
    ref_c0 = refs[3] if c0 is not None else None
    ref_out, ref_h, ref_c = _dense_recurrence(refs[0], layout.to_dense(refs[1]), ref_h0, ref_c0)
    ref_grads = torch.autograd.grad((ref_out * d_out).sum() + ref_h.sum() + ref_c.sum(), refs)
    for got, want, name in zip((out, h_n, c_n, *grads), (ref_out, ref_h, ref_c, *ref_grads),
                               ("out", "h_n", "c_n", "d xproj", "d W_hh", "d h0", "d c0")):
        assert_close(got, want, F64, name)


@pytest.mark.parametrize("with_states", [False, True], ids=["zero-states", "h0+c0"])
def test_first_call_eager_second_captured_then_replayed(stand_in, with_states):
    layout, values = _case()
    for _ in range(4):  # fresh inputs every call: the static copies must be refilled
        _check_against_dense(layout, values, *_inputs(4, 3, 16, with_states))
    # forward and backward keys: eager, then captured and replayed, then replayed twice
    assert stand_in == ["capture", "replay"] * 2 + ["replay"] * 4
    with torch.no_grad():  # the no-grad forward (no activations saved) is a key of its own
        for _ in range(3):
            xproj = torch.randn(4, 3, 64, dtype=F64)
            out, _, _ = lstm_sequence(xproj, values, layout)
            assert_close(out, _dense_recurrence(xproj, layout.to_dense(values), None, None)[0], F64, "no grad")
    assert stand_in[8:] == ["capture", "replay", "replay"]


def test_the_weight_is_read_in_place_at_replay(stand_in):
    # an optimizer's in-place update between calls: the replay computes with the new values
    layout, values = _case()
    for _ in range(4):
        with torch.no_grad():
            values.mul_(0.9)
        _check_against_dense(layout, values, *_inputs(4, 3, 16, False))
    assert stand_in.count("capture") == 2


def test_a_key_per_shape_and_weight_at_most_max_loops(stand_in, monkeypatch):
    monkeypatch.setattr(lstm_graphs, "MAX_LOOPS", 2)
    layout, values = _case()
    other = values.detach().clone()  # another weight tensor: another address, another graph
    with torch.no_grad():
        for w, steps in ((values, 3), (values, 3), (other, 3), (other, 3), (values, 5), (values, 5), (values, 3)):
            xproj = torch.randn(steps, 2, 64, dtype=F64)
            out, _, _ = lstm_sequence(xproj, w, layout)
            assert_close(out, _dense_recurrence(xproj, layout.to_dense(w), None, None)[0], F64, f"T {steps}")
    # (values, 3) was evicted by (other, 3) and (values, 5): its last call is eager again
    assert stand_in == ["capture", "replay", "capture", "replay", "capture", "replay"]
    assert len(lstm_graphs._CACHE[layout.meta].graphs) == 2


def test_one_timestep_and_the_switch_stay_eager(stand_in, monkeypatch):
    layout, values = _case()
    with torch.no_grad():
        for _ in range(3):
            lstm_sequence(torch.randn(1, 2, 64, dtype=F64), values, layout)
        monkeypatch.setattr(lstm_graphs, "GRAPHS", False)
        for _ in range(3):
            lstm_sequence(torch.randn(4, 2, 64, dtype=F64), values, layout)
    assert stand_in == []


def test_loops_captured_in_inference_mode_serve_calls_outside_it(stand_in):
    # the static buffers are ordinary tensors: a later call outside inference mode may copy into them
    layout, values = _case()
    xs = [torch.randn(4, 2, 64, dtype=F64) for _ in range(4)]
    with torch.inference_mode():
        for x in xs[:2]:
            lstm_sequence(x, values.detach(), layout)
    with torch.no_grad():
        for x in xs[2:]:
            out, _, _ = lstm_sequence(x, values.detach(), layout)
            assert_close(out, _dense_recurrence(x, layout.to_dense(values.detach()), None, None)[0], F64, "no grad")
    assert stand_in == ["capture", "replay", "replay", "replay"]


def test_copies_of_a_module_do_not_share_or_copy_its_loops(stand_in):
    # the loops are kept beside the layout's tables, not on them: deepcopy (an EMA or best-model snapshot)
    # and pickling see no graphs, and each copy gets its own
    import copy
    import io

    torch.manual_seed(0)
    model = BlockSparseLSTM(16, 16, block_size=8, density=0.5, dtype=F64)
    x = torch.randn(4, 2, 16, dtype=F64)
    with torch.no_grad():
        for _ in range(3):
            expected = model(x)[0]
        twin = copy.deepcopy(model)
        torch.save(model, io.BytesIO())
        for _ in range(3):
            assert torch.equal(twin(x)[0], expected)
            assert torch.equal(model(x)[0], expected)
    assert stand_in.count("capture") == 2
    lstm_graphs.clear()
    assert len(lstm_graphs._CACHE) == 0


def test_a_failed_capture_warns_once_and_stays_eager(monkeypatch):
    monkeypatch.setattr(lstm_graphs, "_replayable", lambda meta, steps: True)
    tries = []

    def refuse(fn, inputs, device):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(lstm_graphs, "_capture", refuse)
    layout, values = _case()
    with torch.no_grad():
        xproj = torch.randn(4, 2, 64, dtype=F64)
        expected = _dense_recurrence(xproj, layout.to_dense(values), None, None)[0]
        assert_close(lstm_sequence(xproj, values, layout)[0], expected, F64, "eager")
        with pytest.warns(RuntimeWarning, match="could not be captured"):
            assert_close(lstm_sequence(xproj, values, layout)[0], expected, F64, "fallback")
        assert_close(lstm_sequence(xproj, values, layout)[0], expected, F64, "eager after")
    assert tries == [1]


# --------------------------------------------------------------------------- GPU: real graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("block, batch, dtype", [(16, 32, torch.bfloat16), (32, 4, torch.float16),
                                                 (16, 3, torch.float32)], ids=["b16-B32-bf16", "b32-B4-fp16",
                                                                                "b16-B3-fp32"])
def test_gpu_replays_are_bitwise_the_eager_loop(monkeypatch, block, batch, dtype):
    torch.manual_seed(0)
    hidden, steps = 128, 6
    model = BlockSparseLSTM(hidden, hidden, block_size=block, density=0.25, sparse_input=True,
                            input_density=0.25).to("cuda", dtype)
    monkeypatch.setattr(lstm_graphs, "MAX_LOOPS", 6)  # room for all six keys below
    captures = []
    capture = lstm_graphs._capture
    monkeypatch.setattr(lstm_graphs, "_capture", lambda fn, inputs, device: captures.append(1) or capture(
        fn, inputs, device))

    def run(x, states):
        out, (h_n, c_n) = model(x, states)
        grads = torch.autograd.grad((out.float() ** 2).sum() + h_n.float().sum(), [x, *model.parameters()])
        return (out, h_n, c_n, *grads)

    for call in range(8):  # without states 4 calls, then with them 4: eager, captured, replayed twice
        x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
        states = None if call < 4 else tuple(torch.randn(1, batch, hidden, device="cuda", dtype=dtype)
                                             for _ in range(2))
        with torch.no_grad():
            model.hh.weight.mul_(0.95)  # read in place at replay
        got = run(x, states)
        monkeypatch.setattr(lstm_graphs, "GRAPHS", False)
        expected = run(x, states)
        monkeypatch.setattr(lstm_graphs, "GRAPHS", True)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert torch.equal(g, e), (call, i)
        with torch.no_grad():
            assert torch.equal(model(x, states)[0], expected[0])
    # with and without states are keys of their own: forward, backward, no-grad forward each
    assert len(captures) == 6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_a_capture_the_loop_breaks_leaves_the_callers_stream_and_runs_eagerly(monkeypatch):
    # a host sync inside the loop invalidates the capture: the call warns, runs the Python loop on the
    # caller's stream (which stays current) and gives its result; later calls stay eager, without warning
    torch.manual_seed(0)
    layout = layouts.random(256, 64, 16, 0.25, seed=1, device="cuda")
    values = torch.randn(layout.nnz, 16, 16, device="cuda", dtype=torch.bfloat16) / 8
    capture = lstm_graphs._capture
    monkeypatch.setattr(lstm_graphs, "_capture", lambda fn, inputs, device: capture(
        lambda *a: (torch.cuda.synchronize(), fn(*a))[1], inputs, device))
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller), torch.no_grad():
        for call in range(4):
            x = torch.randn(5, 4, 256, device="cuda", dtype=torch.bfloat16)
            monkeypatch.setattr(lstm_graphs, "GRAPHS", False)
            expected = lstm_sequence(x, values, layout)[0]
            monkeypatch.setattr(lstm_graphs, "GRAPHS", True)
            if call == 1:
                with pytest.warns(RuntimeWarning, match="could not be captured"):
                    got = lstm_sequence(x, values, layout)[0]
                torch.rand(1, device="cuda")  # the random generators left capture mode with the capture
            else:
                got = lstm_sequence(x, values, layout)[0]
            assert torch.cuda.current_stream() == caller
            assert torch.equal(got, expected), call
    torch.cuda.synchronize()
    assert not torch.cuda.is_current_stream_capturing()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_torch_compile_default_mode_runs_the_loops_from_graphs(monkeypatch):
    # torch.compile without CUDA graphs of its own: the registered ops' loops replay from ours, and the
    # values and gradients match the eager module's
    import copy

    from lstm_cases import check_training_steps_match

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = BlockSparseLSTM(64, 128, block_size=16, density=0.25).to("cuda", torch.bfloat16)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    captures = []
    capture = lstm_graphs._capture
    monkeypatch.setattr(lstm_graphs, "_capture", lambda fn, inputs, device: captures.append(1) or capture(
        fn, inputs, device))
    check_training_steps_match(eager, compiled_model, compiled, (10, 8, 64))
    assert len(captures) == 4  # forward and backward, for the eager and the compiled module's weights
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_an_evicted_loops_statics_are_not_reused_before_its_replay_ran(monkeypatch):
    # three streams, one graph kept. Stream A's captured loop is replayed behind a long sleep; B's capture
    # evicts it (its statics freed, made on the side stream); C's capture then allocates statics of the same
    # size on the side stream. Without the caller's stream recorded on them, the allocator would hand C
    # A's input buffer while A's copy-in and replay are still pending, and C's static copy could land
    # between them. Then every call's result is checked against the eager loop, bitwise
    torch.manual_seed(0)
    layout = layouts.random(512, 128, 16, 0.25, seed=2, device="cuda")
    values = torch.randn(layout.nnz, 16, 16, device="cuda", dtype=torch.bfloat16) / 8
    monkeypatch.setattr(lstm_graphs, "MAX_LOOPS", 1)
    lstm_graphs.clear()
    a, b, c = streams = [torch.cuda.Stream() for _ in range(3)]
    calls, statics = [], {}

    def call(s, sleep=False):
        with torch.cuda.stream(s):
            x = torch.randn(16, 8, 512, device="cuda", dtype=torch.bfloat16)
            if sleep:
                torch.cuda._sleep(1_000_000_000)  # ~0.5 s: this stream's work waits while the host goes on
            calls.append((s, x, lstm_sequence(x, values, layout)[0]))
        loops = lstm_graphs._CACHE.get(layout.meta)
        for loop in (loops.graphs.values() if loops else ()):
            statics[s] = loop.inputs[0].data_ptr()

    with torch.no_grad():
        for s in streams:
            call(s)  # warm: eager on static copies
        call(a, sleep=True)  # captured, copy-in and replay pending behind the sleep
        call(b)  # captured: A's loop evicted
        call(c)  # captured: statics allocated on the side stream while A's work is pending
        assert statics[c] != statics[a]
        torch.cuda.synchronize()
        monkeypatch.setattr(lstm_graphs, "GRAPHS", False)
        for i, (s, x, got) in enumerate(calls):
            assert torch.equal(got, lstm_sequence(x, values, layout)[0]), i
    lstm_graphs.clear()
