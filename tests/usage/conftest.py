"""Fixtures for the usage tests: an injected clock, a fleet, helpers to allocate and to check the ledger."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from claims.models import DeviceAllocation
from scheduler.services import allocation
from tests.claims import fleet as fleet_helpers
from usage.models import UsageInterval

T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, t: datetime) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t

    def advance(self, **kw) -> None:
        self.t += timedelta(**kw)


@pytest.fixture
def clock(monkeypatch):
    """``django.utils.timezone.now`` answers the clock's time (every service reads the time through it)."""
    c = Clock(T0)
    monkeypatch.setattr(timezone, "now", c)
    return c


@pytest.fixture
def fleet(db, clock):
    """c1: one 8xH100 node and one 8xA100 node with MIG partitions (the demo's real slices)."""
    return fleet_helpers.load_fleet({"c1": [("h100", 1), ("a100-mig", 1)]})


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def assert_ledger_matches_allocations() -> None:
    """Every open interval has its allocation row and every (consuming) allocation row its open interval."""
    rows = sorted(DeviceAllocation.objects.filter(admin_access=False)
                  .values_list("claim_id", "cluster", "driver", "pool", "device", "share_id"))
    open_ = sorted(UsageInterval.objects.filter(ended_at__isnull=True)
                   .values_list("claim_id", "cluster", "driver", "pool", "device", "share_id"))
    assert rows == open_
