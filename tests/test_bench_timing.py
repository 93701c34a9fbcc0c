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
