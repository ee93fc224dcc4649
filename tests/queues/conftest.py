"""Fixtures for the queue tests: a real fleet pushed through the inventory services, queue bodies."""
from __future__ import annotations

import pytest

from benchmarks._queue_world import queue_body  # noqa: F401  (one Queue body for tests and the scenarios)
from tests.claims import fleet as fleet_helpers


@pytest.fixture
def h100_fleet(db):
    """One cluster c1 (labels region=eu): two nodes of 8 H100 = 16 GPUs."""
    return fleet_helpers.load_fleet({"c1": [("h100", 2)]}, labels={"c1": {"region": "eu"}})
