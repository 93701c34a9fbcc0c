"""bsmm_cases.pairwise, the greedy all-pairs cover the interpreter's knob grids use: every pair of
values of any two axes at least once, the same cases on every call, and no silent empty grid."""

import itertools

import pytest

from bsmm_cases import pairwise


def _axes(*sizes):
    return [[(f"a{axis}v{value}", (axis, value)) for value in range(size)] for axis, size in enumerate(sizes)]


@pytest.mark.parametrize("sizes", [(4, 2, 7, 5), (4, 2, 3, 3, 2), (4, 2, 6, 9), (2, 2), (3, 1, 4)])
def test_every_pair_of_values_is_covered_deterministically(sizes):
    axes = _axes(*sizes)
    cases = pairwise(*axes)
    assert [c.id for c in cases] == [c.id for c in pairwise(*axes)]
    assert len({c.id for c in cases}) == len(cases)
    assert len(cases) <= len(list(itertools.product(*map(range, sizes))))
    for i, j in itertools.combinations(range(len(sizes)), 2):
        seen = {(case.values[i], case.values[j]) for case in cases}
        assert seen == {((i, u), (j, v)) for u in range(sizes[i]) for v in range(sizes[j])}


def test_the_cover_is_a_fraction_of_the_product_for_the_suites_grids():
    # the prefetch and tiling grids: 280 and 432 cases in full
    assert len(pairwise(*_axes(4, 2, 7, 5))) <= 40 and len(pairwise(*_axes(4, 2, 6, 9))) <= 60


def test_one_axis_gives_every_value_and_an_empty_axis_is_refused():
    assert [case.values for case in pairwise(*_axes(3))] == [((0, 0),), ((0, 1),), ((0, 2),)]
    with pytest.raises(ValueError, match="at least one value"):
        pairwise(*_axes(2, 0))
