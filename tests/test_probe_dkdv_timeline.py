"""The dK/dV timeline probe's analysis (scripts/probes/attention_dkdv_timeline.py,
``_timeline``) on made-up stamps: phases, the per-step fit, gaps between programs on one
SM, busy share and the tail, against values worked out by hand."""

import pytest
import torch

from script_modules import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("scripts/probes/attention_dkdv_timeline.py")


def test_timeline_of_made_up_stamps(probe):
    # two SMs; columns: SM, start, K/V in, walk done, stored (ns). Walks of 2 and 4 steps at
    # 1 µs per step plus 0.5 µs; K/V after 1 µs, stores 0.5 µs; SM 0 runs programs 0 then 2
    # with a 2 µs gap, SM 1 runs program 1 and idles from 7 µs to the end at 12 µs
    us = 1000
    rows = [[0, 0, 1 * us, 3.5 * us, 4 * us],
            [1, 0, 1 * us, 5.5 * us, 6 * us],
            [0, 6 * us, 7 * us, 9.5 * us, 10 * us]]
    rows[1][4] = 7 * us
    stamps = torch.tensor([r + [0, 0, 0] for r in rows], dtype=torch.int64)
    stamps[2, 3], stamps[2, 4] = int(11.5 * us), 12 * us  # program 2: 4 steps
    t = probe._timeline(stamps, steps=[2, 4, 4])
    assert t["programs"] == 3 and t["sms"] == 2 and t["span_us"] == 12.0
    assert t["kv_wait_us"]["median"] == 1.0
    assert t["walk_fit"]["us_per_step"] == pytest.approx(1.0) and t["walk_fit"]["us_fixed"] == pytest.approx(0.5)
    assert t["gap_us"]["median"] == 2.0  # SM 0: stored at 4, next start at 6
    assert t["busy_share"] == pytest.approx((4 + 7 + 6) / (2 * 12), abs=1e-4)
    assert t["drain_us"] == 5.0  # SM 1 done at 7, the last store at 12
    assert t["tail_idle_share"] == pytest.approx(5 / 24, abs=1e-4)
