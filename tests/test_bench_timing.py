"""tilesparse.bench.timing.interleaved_ms: every function timed each round, in turn and
reversed every other round (CPU path: perf_counter medians)."""

import time

import pytest

from tilesparse.bench.timing import interleaved_ms


def test_interleaved_ms_times_each_function_every_round_alternating_the_order():
    calls = []
    fns = {name: (lambda name=name, secs=secs: calls.append(name) or time.sleep(secs))
           for name, secs in (("short", 0.0), ("long", 0.004))}
    got = interleaved_ms(fns, cuda=False, rounds=3)
    assert set(got) == {"short", "long"}
    assert got["long"] > got["short"] and got["long"] >= 3.5  # slept 4 ms
    # bench_ms on the CPU: one warm-up call and 5 timed calls per round
    per_round = 6
    order = calls[::per_round]
    assert order == ["short", "long", "long", "short", "short", "long"]


def test_interleaved_ms_rejects_no_rounds():
    with pytest.raises(ValueError, match="rounds"):
        interleaved_ms({"a": lambda: None}, cuda=False, rounds=0)
