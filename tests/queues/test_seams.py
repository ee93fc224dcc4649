"""The race tests' seam (tests/queues/seams.py) still sits between the quota check and the write."""
from __future__ import annotations

import time

from queues.services import admission
from tests.queues.seams import delay_admission_writes


def test_admit_writes_its_charges_through_the_rebindable_name():
    # admit() looks bulk_insert up in its module at call time: rebinding it reaches the write after the checks.
    assert "bulk_insert" in admission.admit.__code__.co_names


def test_the_seam_sleeps_before_the_write(monkeypatch):
    calls: list[float] = []
    monkeypatch.setattr(admission, "bulk_insert", lambda *a, **k: calls.append(time.monotonic()))
    delay_admission_writes(0.05)
    start = time.monotonic()
    admission.bulk_insert("model", [], [])
    assert len(calls) == 1 and calls[0] - start >= 0.05
