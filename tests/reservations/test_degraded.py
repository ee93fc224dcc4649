"""A later inventory loss is a reservation's ``Degraded=True`` with the shortfall (issue 38), for one waiting for
its window and for one holding capacity now; it clears when the inventory is back. The reservations' pass is
called as the beat calls it; the inventory changes through the agents' push."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inventory.services import sync
from queues.models import Reservation
from scheduler.services import reservation_tick
from tests.claims.fleet import load_fleet

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations"


def body(name: str, devices: int, start: timedelta, lead: int = 0) -> dict:
    begin = datetime.now(UTC) + start
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
            "spec": {"window": {"start": begin.strftime("%Y-%m-%dT%H:%M:%S"),
                                "end": (begin + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S"),
                                "timeZone": "UTC"},
                     "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": devices}],
                     "users": {"namespaces": ["r"]}, "leadTimeSeconds": lead}}


def degraded(client, name: str) -> dict:
    return next(c for c in client.get(f"{URL}/{name}").json()["status"]["conditions"] if c["type"] == "Degraded")


def one_node(full: dict, keep: str) -> dict:
    return {"resourceSlices": [s for s in full["resourceSlices"] if s["spec"]["nodeName"] == keep],
            "nodes": [n for n in full["nodes"] if n["name"] == keep]}


def tick() -> dict:
    reservation_tick._checked.update(key=None, at=float("-inf"))  # the beat's next pass, past the rate bound
    return reservation_tick.run()


@pytest.fixture
def pushed(db):
    return load_fleet({"c1": [("h100", 2)]})["c1"]  # two nodes of 8 H100


def test_a_waiting_reservation_reports_what_the_smaller_fleet_cannot_hold(admin_client, pushed):
    assert admin_client.post(URL, body("first", 4, timedelta(hours=2)), format="json").status_code == 201
    assert admin_client.post(URL, body("nightly", 12, timedelta(hours=2)), format="json").status_code == 201
    assert tick()["degraded"] == 0
    assert degraded(admin_client, "nightly")["status"] == "False"

    sync.push_inventory("c1", one_node(pushed, "c1-h100-000"))  # 8 GPUs left
    assert tick()["degraded"] == 1
    # The older reservation keeps its capacity: the newer one is short of all but 4 of the 8 left.
    first, nightly = degraded(admin_client, "first"), degraded(admin_client, "nightly")
    assert first["status"] == "False"
    assert nightly["status"] == "True" and nightly["reason"] == "Shortfall"
    assert "spec.resources[0]: 4 of 12 gpu.nvidia.com devices" in nightly["message"], nightly
    assert "beside reservations first" in nightly["message"]
    assert Reservation.objects.filter(name__in=["first", "nightly"]).count() == 2  # nothing dropped

    sync.push_inventory("c1", pushed)
    assert tick()["degraded"] == 1
    nightly = degraded(admin_client, "nightly")
    assert nightly["status"] == "False" and nightly["message"] == "" and nightly["reason"] == "AsBooked"


def test_a_holding_reservation_that_loses_held_devices_is_held_again_and_reports_the_rest(admin_client, pushed):
    assert admin_client.post(URL, body("nightly", 16, timedelta(minutes=10), lead=3600),
                             format="json").status_code == 201
    tick()
    r = Reservation.objects.get(name="nightly")
    assert r.held["heldDevices"] == 16 and r.degraded == ""

    sync.push_inventory("c1", one_node(pushed, "c1-h100-001"))
    assert tick()["degraded"] == 1
    r = Reservation.objects.get(name="nightly")
    assert r.held["nodes"] == [["c1", "c1-h100-001"]] and r.held["heldDevices"] == 8
    cond = degraded(admin_client, "nightly")
    assert cond["status"] == "True"
    assert cond["message"] == "the fleet lost capacity held for it: spec.resources[0]: 8 of 16 gpu.nvidia.com devices"

    sync.push_inventory("c1", pushed)
    assert tick()["degraded"] == 1
    r = Reservation.objects.get(name="nightly")
    assert r.held["heldDevices"] == 16 and r.degraded == ""
