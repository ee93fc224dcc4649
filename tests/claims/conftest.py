"""Fixtures for the claims tests: a small real fleet, claim bodies. API clients and the real Celery workers
(``worker_pool``, ``live_broker``) come from tests/conftest.py."""
from __future__ import annotations

import pytest

from tests.claims import fleet as fleet_helpers


@pytest.fixture
def small_fleet(db):
    """One cluster: two 8xH100 nodes and one 8xA100 node with MIG partitions (the shared fixtures' shapes)."""
    return fleet_helpers.load_fleet({"c1": [("h100", 2), ("a100-mig", 1)]})


@pytest.fixture
def two_clusters(db):
    """c-h100 (two H100 nodes, labels env=gpu) and c-mig (one A100 MIG node, labels env=mig)."""
    return fleet_helpers.load_fleet({"c-h100": [("h100", 2)], "c-mig": [("a100-mig", 1)]},
                                    labels={"c-h100": {"env": "gpu"}, "c-mig": {"env": "mig"}})


@pytest.fixture
def classes(db):
    fleet_helpers.load_device_classes()
