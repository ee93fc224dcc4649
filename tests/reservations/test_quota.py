"""A reservation inside [start − lead, end] takes what it reserves from what the cohort can lend (issue 38):
real rounds in this process, the reservations' pass called as the beat calls it."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from claims.models import Phase, ResourceClaim
from queues.models import QuotaCharge, Reservation
from scheduler.models import PlannedStart
from scheduler.services import plan, reservation_tick
from tests.claims.fleet import load_fleet
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, rounds, submit

pytestmark = pytest.mark.django_db


def reservation(start: timedelta, lead: int) -> dict:
    begin = datetime.now(UTC) + start
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": "nightly"},
            "spec": {"window": {"start": begin.strftime("%Y-%m-%dT%H:%M:%S"),
                                "end": (begin + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S"),
                                "timeZone": "UTC"},
                     "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 8}],
                     "users": {"namespaces": ["r"]}, "leadTimeSeconds": lead}}


def allocated(ns: str) -> int:
    return ResourceClaim.objects.filter(namespace__name=ns, phase=Phase.ALLOCATED).count()


@pytest.fixture
def cohort(admin_client):
    """16 GPUs; team-a (nominal 4) borrows, team-b (nominal 4, lendingLimit 0) keeps its nominal."""
    load_fleet({"c1": [("h100", 2)]})
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4),
         queue_body("team-b", namespaces=["b"], gpus=4, lending=0))


def test_from_start_minus_lead_the_reserved_devices_are_not_lent_to_borrowers(admin_client, cohort):
    assert admin_client.post("/api/v1/reservations", reservation(timedelta(minutes=10), 3600),
                             format="json").status_code == 201
    reservation_tick.run()  # inside [start − lead, end]: one node of 8 held
    assert len(Reservation.objects.get(name="nightly").held["nodes"]) == 1
    for i in range(8):
        submit(admin_client, "a", f"a{i}")
    rounds()
    # 16 GPUs − 8 reserved − 4 that team-b keeps: team-a has its nominal and nothing to borrow.
    assert allocated("a") == 4
    waiting = ResourceClaim.objects.filter(namespace__name="a", phase=Phase.PENDING)
    assert {c.reason for c in waiting} == {"WaitingForQuota"}
    assert all("reservations hold (8 from their start minus lead time" in c.message for c in waiting), \
        [c.message for c in waiting]
    # team-b's nominal is there for it, without a preemption.
    for i in range(4):
        submit(admin_client, "b", f"b{i}")
    rounds()
    assert allocated("b") == 4

    # A claim that ends before the start may be lent the held node; its devices there come out of what the
    # reservation withholds, so its borrowing fits (4 kept + 5 used + 8 − 1 withheld = 16).
    submit(admin_client, "a", "short", annotations={"draservice.io/lease-ttl": "60s"})
    rounds()
    short = ResourceClaim.objects.get(namespace__name="a", name="short")
    held = Reservation.objects.get(name="nightly").held["nodes"]
    assert short.phase == Phase.ALLOCATED and [short.cluster, short.node] in held
    assert QuotaCharge.objects.filter(claim=short, queue__name="team-a").exists()
    assert allocated("a") == 5

    # Without the reservation, the same claims borrow: 4 kept by team-b + 9 of team-a <= 16.
    assert admin_client.delete("/api/v1/reservations/nightly").status_code == 204
    rounds()
    assert allocated("a") == 9


def test_before_start_minus_lead_nothing_is_withheld(admin_client, cohort):
    assert admin_client.post("/api/v1/reservations", reservation(timedelta(hours=3), 600),
                             format="json").status_code == 201
    reservation_tick.run()
    assert Reservation.objects.get(name="nightly").held == {}
    for i in range(12):
        submit(admin_client, "a", f"a{i}")
    rounds()
    assert allocated("a") == 12  # 16 − the 4 team-b keeps


def test_a_claim_waiting_for_its_window_is_not_planned_ahead_of_a_borrower(admin_client):
    """Before the hold a claim with no walltime runs on the node the reservation will hold (the reservation
    reclaims it from its start minus the lead time): the labelled claim waiting for the window is not in the plan,
    where it would have taken the free devices at once and kept the borrower off them."""
    load_fleet({"c1": [("h100", 1)]})  # one node, 8 GPUs
    assert admin_client.post("/api/v1/reservations", reservation(timedelta(minutes=10), 60),
                             format="json").status_code == 201
    submit(admin_client, "r", "reserved", 8, labels={"draservice.io/reservation": "nightly"})
    rounds()
    reserved = ResourceClaim.objects.get(namespace__name="r", name="reserved")
    assert (reserved.phase, reserved.reason) == (Phase.PENDING, "WaitingForReservation")
    plan.refresh(force=True)
    assert not PlannedStart.objects.filter(claim=reserved).exists()
    submit(admin_client, "a", "borrower", 4)  # no walltime
    rounds()
    borrower = ResourceClaim.objects.get(namespace__name="a", name="borrower")
    assert borrower.phase == Phase.ALLOCATED, (borrower.reason, borrower.message)
