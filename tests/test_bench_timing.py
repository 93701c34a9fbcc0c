"""tilesparse.bench.timing.interleaved_ms: every function timed each round, each round
starting one function later (CPU path: perf_counter medians)."""

import time

import pytest

from tilesparse.bench.timing import interleaved_ms


def _rounds(names, rounds):
    """The order interleaved_ms times ``names`` in (bench_ms on the CPU: one warm-up call
    and 5 timed calls per function and round)."""
    calls = []
    got = interleaved_ms({name: (lambda name=name: calls.append(name)) for name in names}, cuda=False, rounds=rounds)
    assert set(got) == set(names)
    return calls[::6]


def test_interleaved_ms_gives_each_function_its_median():
    fns = {name: (lambda secs=secs: time.sleep(secs)) for name, secs in (("a", 0.0), ("b", 0.004), ("c", 0.0))}
    got = interleaved_ms(fns, cuda=False, rounds=3)
    assert got["b"] > max(got["a"], got["c"]) and got["b"] >= 3.5  # slept 4 ms


@pytest.mark.parametrize("names", [("a", "b"), ("a", "b", "c"), ("a", "b", "c", "d")])
def test_interleaved_ms_rotates_which_function_goes_first(names):
    n = len(names)
    order = _rounds(names, 2 * n)
    rounds = [order[i * n:(i + 1) * n] for i in range(2 * n)]
    assert all(sorted(r) == sorted(names) for r in rounds)  # each timed once a round
    assert sorted(r[0] for r in rounds) == sorted(names * 2)  # each first equally often
    assert rounds[1] == list(names[1:] + names[:1])


def test_interleaved_ms_rejects_no_rounds():
    with pytest.raises(ValueError, match="rounds"):
        interleaved_ms({"a": lambda: None}, cuda=False, rounds=0)


def test_parse_clock_state_reads_the_power_cap_bit():
    """nvidia-smi's csv (clock MHz, watts, throttle-reason bits in hex): bit 0x4 is the
    software power cap; N/A or short lines give None."""
    import shutil

    import torch

    from tilesparse.bench.env import clock_state, parse_clock_state

    assert parse_clock_state("1770, 684.57, 0x0000000000000004\n") == {"sm_mhz": 1770.0, "watts": 684.57,
                                                                        "power_capped": True}
    assert parse_clock_state("1980, 120.5, 0x0000000000000001") == {"sm_mhz": 1980.0, "watts": 120.5,
                                                                     "power_capped": False}
    # a field reported as N/A is None, the others are kept; a short line or no number at all is None
    assert parse_clock_state("1980, [N/A], 0x0000000000000004") == {"sm_mhz": 1980.0, "watts": None,
                                                                    "power_capped": True}
    assert parse_clock_state("N/A, N/A, N/A") is None and parse_clock_state("1980, 120.5") is None
    if not torch.cuda.is_available():
        assert clock_state() is None
    elif shutil.which("nvidia-smi"):  # the GPU found by its UUID (or the only one)
        state = clock_state()
        assert state is not None and 100 <= state["sm_mhz"] <= 3500 and state["watts"] > 0


def test_clock_state_asks_nvidia_smi_by_uuid_and_gives_up_once_it_is_missing(monkeypatch):
    import subprocess
    from types import SimpleNamespace

    import torch

    from tilesparse.bench import env

    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return SimpleNamespace(returncode=0, stdout="1755, 690.1, 0x0000000000000004\n")

    monkeypatch.setattr(env, "has_cuda", lambda: True)
    monkeypatch.setattr(env, "_clocks_unavailable", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="abc-123"))
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert env.clock_state() == {"sm_mhz": 1755.0, "watts": 690.1, "power_capped": True}
    assert calls[-1][-1] == "--id=GPU-abc-123"

    def missing(command, **kwargs):
        calls.append(command)
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    before = len(calls)
    assert env.clock_state() is None and env.clock_state() is None
    assert len(calls) == before + 1  # not asked again once missing

    def refused(command, **kwargs):  # e.g. an --id nvidia-smi does not know
        calls.append(command)
        return SimpleNamespace(returncode=6, stdout="No devices were found\n")

    monkeypatch.setattr(env, "_clocks_unavailable", False)
    monkeypatch.setattr(subprocess, "run", refused)
    before = len(calls)
    assert env.clock_state() is None and env.clock_state() is None
    assert len(calls) == before + 1
    # no UUID from torch: the unnamed query with one GPU, nothing with several
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: object())
    assert env.nvidia_smi_target() is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert env.nvidia_smi_target() == []
