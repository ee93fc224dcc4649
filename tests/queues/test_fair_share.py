"""The effective share of a queue that remembers its past use: the README's worked example, to 1e-6."""
from __future__ import annotations

import math

import pytest

from queues import fair_share

HOUR, DAY = 3600.0, 86400.0


def test_readme_example():
    """queues/README.md, "Fair share that remembers": C = 16 devices, half-life a day; A (weight 1, S 0.25,
    U 192 device-hours) and B (weight 2, S 0, U 48 device-hours)."""
    assert fair_share.full_use(16, DAY) / HOUR == pytest.approx(553.994896, abs=1e-6)
    history_a = fair_share.history_share([(192 * HOUR, DAY)], 16)
    history_b = fair_share.history_share([(48 * HOUR, DAY)], 16)
    assert history_a == pytest.approx(0.346574, abs=1e-6)  # ln 2 / 2
    assert history_b == pytest.approx(0.086643, abs=1e-6)
    assert fair_share.effective_share(0.25, history_a, 1.0) == pytest.approx(0.298287, abs=1e-6)
    assert fair_share.effective_share(0.0, history_b, 2.0) == pytest.approx(0.021661, abs=1e-6)


def test_readme_example_a_burst_is_forgotten_as_the_half_life_says():
    """The README's second part: A's 16 devices for a day (384 device-hours), as the ledger counts it at the
    interval's close. Just after, half-life a day: ln 2 of the scale; a day later with a half-life of an hour,
    24 half-lives: about 1e-6, however little anyone else remembers (B's 0 here)."""
    assert fair_share.history_share([(384 * HOUR, DAY)], 16) == pytest.approx(math.log(2), abs=1e-6)
    later = fair_share.history_share([(384 * HOUR * 2 ** -24, HOUR)], 16)
    assert later == pytest.approx(9.92e-7, abs=1e-9)
    assert fair_share.effective_share(0.0, later, 1.0) - fair_share.effective_share(0.0, 0.0, 1.0) < 1e-6


def test_clamped_to_one_and_summed_over_a_subtree():
    assert fair_share.history_share([(384 * HOUR, HOUR)], 16) == 1.0  # more than the scale: all of it
    # Two queues of a subtree with their own half-lives: each against its own scale, summed.
    both = fair_share.history_share([(96 * HOUR, DAY), (8 * HOUR, HOUR), (5.0, 0.0)], 16)
    assert both == pytest.approx(96 * math.log(2) / (16 * 24) + 8 * math.log(2) / 16, abs=1e-12)


def test_nobody_used_anything():
    assert fair_share.history_share([(0.0, DAY)], 16) == 0.0
    assert fair_share.history_share([], 16) == 0.0
    assert fair_share.effective_share(0.5, 0.0, 2.0) == pytest.approx(0.125, abs=1e-12)
