"""The effective share of a queue that remembers its past use: the README's worked example, to 1e-6."""
from __future__ import annotations

import pytest

from queues import fair_share


def test_readme_example():
    """queues/README.md and README.md, "Fair share that remembers": A (weight 1, S 0.25, U 288) and B (weight 2,
    S 0, U 96)."""
    total = 288.0 + 96.0
    assert fair_share.effective_share(0.25, 288.0, total, 1.0) == pytest.approx(0.5, abs=1e-6)
    assert fair_share.effective_share(0.0, 96.0, total, 2.0) == pytest.approx(0.0625, abs=1e-6)


def test_nobody_used_anything():
    assert fair_share.history_share(0.0, 0.0) == 0.0
    assert fair_share.effective_share(0.5, 0.0, 0.0, 2.0) == pytest.approx(0.125, abs=1e-12)
