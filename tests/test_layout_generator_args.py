"""Argument checking and exports of the structured and graph layout generators
(tilesparse.layouts): every bad argument raises a ValueError (TypeError for a missing
one) that names it; numpy integers are accepted. Their masks: test_layout_generators.py."""

import pytest

from tilesparse import layouts

# --------------------------------------------------------------------------- argument errors

GRAPH_BAD_ARGS = {
    # name in the message: (generator, kwargs)
    "rows_divisible": ("rows=30", lambda: layouts.small_world(30, 32, 4, degree=2)),
    "cols_divisible": ("cols=30", lambda: layouts.barabasi_albert(32, 30, 4, m=1)),
    "banded_rows": ("rows=30", lambda: layouts.banded(30, 32, 4, bandwidth=1)),
    "block_size_zero": ("block_size", lambda: layouts.small_world(32, 32, 0, degree=2)),
    "block_size_float": ("block_size", lambda: layouts.banded(32, 32, 4.0, bandwidth=1)),
    "ws_neither": ("exactly one of degree or density", lambda: layouts.small_world(32, 32, 4)),
    "ws_both": ("exactly one of degree or density", lambda: layouts.small_world(32, 32, 4, degree=2, density=0.2)),
    "ws_degree_odd": ("degree must be even", lambda: layouts.small_world(32, 32, 4, degree=3)),
    "ws_degree_negative": ("degree", lambda: layouts.small_world(32, 32, 4, degree=-2)),
    "ws_degree_above_n": ("degree must be in \\[0, 8\\]", lambda: layouts.small_world(32, 32, 4, degree=10)),
    "ws_degree_float": ("degree must be an int", lambda: layouts.small_world(32, 32, 4, degree=2.0)),
    "ws_degree_bool": ("degree must be an int", lambda: layouts.small_world(32, 32, 4, degree=True)),
    "ws_density_high": ("density", lambda: layouts.small_world(32, 32, 4, density=1.5)),
    "ws_density_nan": ("density", lambda: layouts.small_world(32, 32, 4, density=float("nan"))),
    "ws_rewire_negative": ("rewire_p", lambda: layouts.small_world(32, 32, 4, degree=2, rewire_p=-0.1)),
    "ws_rewire_above_1": ("rewire_p", lambda: layouts.small_world(32, 32, 4, degree=2, rewire_p=1.5)),
    "ws_rewire_str": ("rewire_p", lambda: layouts.small_world(32, 32, 4, degree=2, rewire_p="0.1")),
    "ws_seed_float": ("seed", lambda: layouts.small_world(32, 32, 4, degree=2, seed=1.5)),
    "ws_seed_none": ("seed", lambda: layouts.small_world(32, 32, 4, degree=2, seed=None)),
    "ws_diagonal_int": ("diagonal", lambda: layouts.small_world(32, 32, 4, degree=2, diagonal=1)),
    "ba_neither": ("exactly one of m or density", lambda: layouts.barabasi_albert(32, 32, 4)),
    "ba_both": ("exactly one of m or density", lambda: layouts.barabasi_albert(32, 32, 4, m=1, density=0.2)),
    "ba_m_zero": ("m must be in \\[1, 7\\]", lambda: layouts.barabasi_albert(32, 32, 4, m=0)),
    "ba_m_n": ("m must be in \\[1, 7\\]", lambda: layouts.barabasi_albert(32, 32, 4, m=8)),
    "ba_m_float": ("m must be an int", lambda: layouts.barabasi_albert(32, 32, 4, m=1.0)),
    "ba_density_negative": ("density", lambda: layouts.barabasi_albert(32, 32, 4, density=-0.1)),
    "ba_seed_str": ("seed", lambda: layouts.barabasi_albert(32, 32, 4, m=1, seed="1")),
    "ba_diagonal_none": ("diagonal", lambda: layouts.barabasi_albert(32, 32, 4, m=1, diagonal=None)),
    "ba_one_node": ("rows, cols and block_size", lambda: layouts.barabasi_albert(4, 4, 4, m=1)),
    "band_negative": ("bandwidth", lambda: layouts.banded(32, 32, 4, bandwidth=-1)),
    "band_float": ("bandwidth", lambda: layouts.banded(32, 32, 4, bandwidth=1.5)),
    "band_bool": ("bandwidth", lambda: layouts.banded(32, 32, 4, bandwidth=True)),
    "band_wrap": ("wrap", lambda: layouts.banded(32, 32, 4, bandwidth=1, wrap="yes")),
    "band_diagonal": ("diagonal", lambda: layouts.banded(32, 32, 4, bandwidth=1, diagonal=0)),
}


@pytest.mark.parametrize("case", list(GRAPH_BAD_ARGS), ids=list(GRAPH_BAD_ARGS))
def test_bad_arguments_raise_value_error_naming_them(case):
    match, call = GRAPH_BAD_ARGS[case]
    with pytest.raises(ValueError, match=match):
        call()


def test_numpy_integers_are_accepted():
    import numpy as np

    assert layouts.small_world(32, 32, 4, degree=np.int64(2), seed=np.int32(3)) == layouts.small_world(
        32, 32, 4, degree=2, seed=3)
    assert layouts.barabasi_albert(32, 32, 4, m=np.int64(2)) == layouts.barabasi_albert(32, 32, 4, m=2)
    assert layouts.banded(32, 32, 4, bandwidth=np.int16(1)) == layouts.banded(32, 32, 4, bandwidth=1)


def test_banded_requires_bandwidth():
    with pytest.raises(TypeError, match="bandwidth"):
        layouts.banded(32, 32, 4)


# --------------------------------------------------------------------------- namespace


def test_generators_are_exported():
    import types

    for name in ("small_world", "barabasi_albert", "banded", "block_diagonal", "plot", "random", "balanced", "from_dense"):
        assert isinstance(getattr(layouts, name), types.FunctionType), name


def test_a_seed_past_torchs_generator_range_is_named():
    # (review, 2026-12-04: a raw "Overflow when unpacking long long")
    with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64\)"):
        layouts.random(64, 64, 16, 0.5, seed=2**70)
