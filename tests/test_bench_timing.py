"""tilesparse.bench.timing.interleaved_ms: every function timed each round, each round
starting one function later and every other round reversed (CPU path: perf_counter
medians)."""

import time

import pytest

from tilesparse.bench.timing import interleaved_ms


def test_interleaved_ms_times_each_function_every_round_rotating_and_reversing_the_order():
    calls = []
    fns = {name: (lambda name=name, secs=secs: calls.append(name) or time.sleep(secs))
           for name, secs in (("a", 0.0), ("b", 0.004), ("c", 0.0))}
    got = interleaved_ms(fns, cuda=False, rounds=3)
    assert set(got) == set(fns)
    assert got["b"] > max(got["a"], got["c"]) and got["b"] >= 3.5  # slept 4 ms
    # bench_ms on the CPU: one warm-up call and 5 timed calls per function and round
    order = calls[::6]
    # round 0: a b c; round 1: b c a reversed; round 2: c a b
    assert order == ["a", "b", "c", "a", "c", "b", "c", "a", "b"]


def test_interleaved_ms_rejects_no_rounds():
    with pytest.raises(ValueError, match="rounds"):
        interleaved_ms({"a": lambda: None}, cuda=False, rounds=0)
