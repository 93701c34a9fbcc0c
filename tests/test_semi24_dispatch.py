"""The 2:4 sparse/dense dispatcher (tilesparse.semi24.dispatch), driven by a fake timer,
and cuSPARSELt's algorithm choice (tilesparse.semi24.cusparselt) with a faked search:
both plain Python around GPU timings, so they are tested on the CPU."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tilesparse.semi24 import dispatch as dsp


# --------------------------------------------------------------------------- dispatcher


class FakeTimer:
    def __init__(self, sparse_ms, dense_ms):
        self.ms = {"sparse": sparse_ms, "dense": dense_ms}
        self.calls = []

    def __call__(self, fn):
        which = fn()
        self.calls.append(which)
        return self.ms[which]


def _choose(d, m=128, mode="auto", sparse=True):
    return d.choose("fprop", m, 256, 512, torch.bfloat16, "cuda", (lambda: "sparse") if sparse else None,
                    lambda: "dense", mode=mode, device_name="FakeGPU")


@pytest.mark.parametrize("sparse_ms,dense_ms,expected",
                         [(1.0, 2.0, "sparse"), (3.0, 2.0, "dense"), (1.95, 2.0, "dense"),  # 1.95: within the margin
                          (1.9, 2.0, "sparse"), (1.94, 2.0, "dense")])  # the margin's edges: 3 % (1.94)
def test_dispatcher_picks_the_faster_and_caches(tmp_path, sparse_ms, dense_ms, expected):
    path = tmp_path / "cache.json"
    timer = FakeTimer(sparse_ms, dense_ms)
    d = dsp.Semi24Dispatcher(path, timer=timer)
    assert _choose(d) == expected
    assert _choose(d) == expected and _choose(d, m=100) == expected  # 100 buckets to 128
    assert timer.calls == ["sparse", "dense", "dense", "sparse"] and d.timings == 1  # timed once, A B B A
    data = json.loads(path.read_text())
    key = d.key("fprop", 128, 256, 512, torch.bfloat16, "FakeGPU")
    assert data["version"] == dsp.CACHE_VERSION and data["entries"][key]["choice"] == expected
    assert data["entries"][key]["sparse_ms"] == sparse_ms
    # a new process (new dispatcher) reads the file and times nothing
    timer2 = FakeTimer(100.0, 100.0)
    d2 = dsp.Semi24Dispatcher(path, timer=timer2)
    assert _choose(d2) == expected and timer2.calls == []
    # another shape is timed
    _choose(d2, m=1024)
    assert len(timer2.calls) == 4 and len(json.loads(path.read_text())["entries"]) == 2


def test_each_candidate_is_the_mean_of_its_two_timings(tmp_path):
    """sparse, dense, dense, sparse: a linear drift (here +1 ms per timing) falls on both alike."""
    order = []

    def drifting(fn):
        order.append(fn())
        return {"sparse": 10.0, "dense": 10.2}[order[-1]] + len(order)  # timings 1..4 add 1..4 ms

    d = dsp.Semi24Dispatcher(tmp_path / "c.json", timer=drifting)
    assert _choose(d) == "dense"  # 12.5 against 12.7: within the margin
    entry = d.entry(d.key("fprop", 128, 256, 512, torch.bfloat16, "FakeGPU"))
    assert order == ["sparse", "dense", "dense", "sparse"]
    assert entry["sparse_ms"] == pytest.approx(12.5) and entry["dense_ms"] == pytest.approx(12.7)


def test_threads_asking_at_once_time_a_problem_once(tmp_path):
    import threading
    import time

    timer = FakeTimer(1.0, 2.0)

    def slow(fn):
        time.sleep(0.01)
        return timer(fn)

    d = dsp.Semi24Dispatcher(tmp_path / "c.json", timer=slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(_choose(d))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["sparse"] * 4 and d.timings == 1 and len(timer.calls) == 4


def test_a_save_keeps_what_another_process_decided(tmp_path):
    path = tmp_path / "c.json"
    first, second = (dsp.Semi24Dispatcher(path, timer=FakeTimer(1.0, 2.0)) for _ in range(2))
    assert second.lookup("anything") is None  # second reads the (missing) file now
    _choose(first)  # first writes its decision
    _choose(second, m=1024)  # second decides another problem and saves
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 2


def test_dispatcher_override_cpu_and_unavailable(tmp_path):
    timer = FakeTimer(1.0, 2.0)
    d = dsp.Semi24Dispatcher(tmp_path / "c.json", timer=timer)
    assert _choose(d, mode="dense") == "dense" and _choose(d, mode="sparse") == "sparse"
    assert _choose(d, sparse=False) == "dense"  # no sparse path: nothing to time
    assert d.choose("fprop", 8, 8, 8, torch.float32, "cpu", lambda: "sparse", lambda: "dense") == "dense"
    assert timer.calls == [] and not (tmp_path / "c.json").exists()
    with pytest.raises(ValueError, match="mode"):
        _choose(d, mode="fastest")
    with pytest.raises(ValueError, match="op"):
        d.key("wgrad", 1, 1, 1, torch.float16, "x")


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "entries": {}}', '[1, 2]', '{"version": 3}'])
def test_dispatcher_corrupt_cache_warns_and_is_ignored(tmp_path, content):
    path = tmp_path / "cache.json"
    path.write_text(content)
    timer = FakeTimer(1.0, 2.0)
    d = dsp.Semi24Dispatcher(path, timer=timer)
    with pytest.warns(UserWarning, match="ignoring the 2:4 dispatch cache"):
        assert _choose(d) == "sparse"
    assert timer.calls == ["sparse", "dense", "dense", "sparse"]
    assert json.loads(path.read_text())["version"] == dsp.CACHE_VERSION  # rewritten in the good format


def test_dispatcher_cache_path_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESPARSE_SEMI24_CACHE", str(tmp_path / "env.json"))
    assert dsp.Semi24Dispatcher().cache_path == tmp_path / "env.json"
    monkeypatch.delenv("TILESPARSE_SEMI24_CACHE")
    assert dsp.default_cache_path().parts[-3:] == (".cache", "tilesparse", "semi24_dispatch.json")


def test_dispatcher_times_again_quietly_after_a_timing_method_change(tmp_path):
    path = tmp_path / "old.json"
    key = dsp.Semi24Dispatcher.key("fprop", 128, 256, 512, torch.bfloat16, "FakeGPU")
    path.write_text(json.dumps({"version": 1, "entries": {key: {"choice": "dense"}}}))
    d = dsp.Semi24Dispatcher(path, timer=FakeTimer(1.0, 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _choose(d) == "sparse"  # the version-1 "dense" is not trusted
    assert d.timings == 1 and json.loads(path.read_text())["version"] == dsp.CACHE_VERSION


def test_dispatcher_in_memory_only(tmp_path):
    path = tmp_path / "none.json"
    d = dsp.Semi24Dispatcher(path, timer=FakeTimer(1.0, 2.0), persist=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _choose(d) == "sparse" and _choose(d) == "sparse"
    assert not path.exists() and d.timings == 1


def test_cslt_algorithm_is_searched_once_per_problem(monkeypatch):
    # The search itself needs cuSPARSELt (GPU); here it is faked to count its calls.
    from tilesparse.semi24 import cusparselt as semi_linear

    calls = []

    def fake_search(packed, dense_b, bias=None, transpose_result=False):
        calls.append((tuple(packed.shape), tuple(dense_b.shape), transpose_result))
        return 17

    monkeypatch.setattr(torch, "_cslt_sparse_mm_search", fake_search)
    monkeypatch.setattr(semi_linear, "_ALG_IDS", {})
    packed, b = torch.empty(64, 40), torch.empty(64, 32)
    assert semi_linear.cslt_algorithm(packed, b, None) == 17
    assert semi_linear.cslt_algorithm(packed, b, None) == 17
    assert calls == [((64, 40), (64, 32), True)]  # remembered
    assert semi_linear.cslt_algorithm(packed, torch.empty(64, 48), None) == 17 and len(calls) == 2
    monkeypatch.setenv("TILESPARSE_CSLT_SEARCH", "0")
    assert semi_linear.cslt_algorithm(packed, torch.empty(64, 56), None) == 0 and len(calls) == 2


def test_a_failed_cslt_search_warns_and_keeps_the_default(monkeypatch):
    from tilesparse.semi24 import cusparselt as semi_linear

    def broken(*args, **kwargs):
        raise RuntimeError("no cuSPARSELt here")

    monkeypatch.setattr(torch, "_cslt_sparse_mm_search", broken)
    monkeypatch.setattr(semi_linear, "_ALG_IDS", {})
    with pytest.warns(UserWarning, match="algorithm search failed"):
        assert semi_linear.cslt_algorithm(torch.empty(64, 40), torch.empty(64, 8), None) == 0
