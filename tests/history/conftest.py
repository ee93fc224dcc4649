"""Fixtures of the history suites: device classes (and fleets) from the claims suite's helpers."""
from __future__ import annotations

import pytest

from tests.claims import fleet as fleet_helpers


@pytest.fixture
def classes(db):
    fleet_helpers.load_device_classes()
