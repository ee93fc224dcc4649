"""Gangs placed by real Celery workers (processes) on real PostgreSQL and Redis, driven through the API."""
from __future__ import annotations

import time

import pytest

from claims.models import DeviceAllocation, Phase, ResourceClaim
from gangs.models import Gang, GangPhase
from tests.gangs import fleet
from tests.gangs.conftest import NS
from tests.gangs.fleet import RACK

pytestmark = pytest.mark.django_db(transaction=True)
WORKERS = 2
URL = f"/api/v1/namespaces/{NS}/gangs"


def wait_until(fn, timeout: float = 20.0, workers=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout}s" + (f"\n{workers.log_tail()}" if workers else ""))


def gang(name: str) -> Gang:
    return Gang.objects.get(name=name)


def rows_of(name: str) -> int:
    return DeviceAllocation.objects.filter(claim__reservations__consumer__gang_member__gang__name=name).count()


def claims_of(name: str):
    return ResourceClaim.objects.filter(reservations__consumer__gang_member__gang__name=name)


def test_worker_places_the_gang_in_the_only_rack_that_fits_and_wait_returns(admin_client, rack_fleet,
                                                                            live_broker):
    started = time.monotonic()
    assert admin_client.post(URL, fleet.gang_body("train", 4), format="json").status_code == 201
    body = admin_client.get(f"{URL}/train?wait=30s").json()
    assert time.monotonic() - started < 20, live_broker.log_tail()
    st = body["status"]
    assert st["phase"] == "Placed", (st, live_broker.log_tail())
    assert st["placement"]["domain"][RACK] == "rack-a1"
    assert {m["labels"][RACK] for m in st["memberStatuses"]} == {"rack-a1"}
    assert rows_of("train") == 32 and {c.phase for c in claims_of("train")} == {Phase.ALLOCATED}


def test_pending_gang_holds_nothing_while_small_claims_flow(admin_client, rack_fleet, live_broker):
    assert admin_client.post(URL, fleet.gang_body("big", 5), format="json").status_code == 201
    wait_until(lambda: gang("big").attempts >= 1, workers=live_broker)
    g = gang("big")
    assert g.phase == GangPhase.PENDING and g.reason == "NoDomainFits" and "rack-a1" in g.message
    for i in range(4):
        resp = admin_client.post(f"/api/v1/namespaces/{NS}/resourceclaims", fleet.claim_body(f"small-{i}", 2),
                                 format="json")
        assert resp.status_code == 201
    small = ResourceClaim.objects.filter(name__startswith="small-")
    wait_until(lambda: all(c.phase == Phase.ALLOCATED for c in small.all()), workers=live_broker)
    assert rows_of("big") == 0 and {c.phase for c in claims_of("big")} == {Phase.PENDING}


def test_timeout_fails_the_gang_and_frees_everything(admin_client, rack_fleet, live_broker):
    from gangs import tasks

    assert admin_client.post(URL, fleet.gang_body("late", 5, timeout=2), format="json").status_code == 201
    wait_until(lambda: gang("late").attempts >= 1, workers=live_broker)
    assert gang("late").phase == GangPhase.PENDING and rows_of("late") == 0
    time.sleep(max(0.0, (gang("late").deadline - Gang.objects.get(name="late").created_at).total_seconds() - 1.5))
    wait_until(lambda: (tasks.sweep_gangs.apply_async(), time.sleep(0.3),
                        gang("late").phase == GangPhase.FAILED)[-1], timeout=15, workers=live_broker)
    g = gang("late")
    assert g.reason == "ScheduleTimeout" and "scheduleTimeoutSeconds=2" in g.message and "rack-a1" in g.message
    assert {c.phase for c in claims_of("late")} == {Phase.RELEASED} and rows_of("late") == 0
    assert not DeviceAllocation.objects.exists()
    # Everything is free: a gang that needs all of rack-a1 starts at once.
    admin_client.post(URL, fleet.gang_body("after", 4), format="json")
    assert admin_client.get(f"{URL}/after?wait=20s").json()["status"]["phase"] == "Placed"


def test_placed_gang_below_min_member_fails_frees_everything_and_the_next_gang_starts(admin_client, rack_fleet,
                                                                                     live_broker):
    from gangs import tasks

    admin_client.post(URL, fleet.gang_body("first", 4), format="json")
    assert admin_client.get(f"{URL}/first?wait=20s").json()["status"]["phase"] == "Placed"
    # Waits for rack-a1 (the only rack with 4 nodes) while "first" holds it.
    admin_client.post(URL, fleet.gang_body("second", 4), format="json")
    wait_until(lambda: gang("second").attempts >= 1, workers=live_broker)
    assert gang("second").phase == GangPhase.PENDING and rows_of("second") == 0

    victim = claims_of("first").order_by("id").first()
    assert admin_client.post(f"/api/v1/namespaces/{NS}/resourceclaims/{victim.name}/release").status_code == 200
    tasks.sweep_gangs.apply_async()  # what beat does every few seconds
    wait_until(lambda: gang("first").phase == GangPhase.FAILED, workers=live_broker)
    g = gang("first")
    assert g.reason == "MinMemberLost" and rows_of("first") == 0
    assert {c.phase for c in claims_of("first")} == {Phase.RELEASED}
    # Freeing rack-a1 asked for placement: the waiting gang gets it without anyone poking it.
    wait_until(lambda: gang("second").phase == GangPhase.PLACED, workers=live_broker)
    assert gang("second").domain[RACK] == "rack-a1" and rows_of("second") == 32
