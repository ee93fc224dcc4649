"""Issue 38's done-when with real Celery workers on PostgreSQL: a reservation starting in 60 s with a lead time
of 30 s. The beat's tasks (the reservations' pass, the preemption pass, the lease sweep) are sent from here as
the beat sends them, more often; the rounds are the workers'."""
from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from claims.models import Phase, ResourceClaim
from draservice.celery import app
from queues.models import Preemption, QuotaCharge, Reservation
from tests.claims.fleet import gpu_claim, load_fleet
from usage.models import UsageInterval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 2
LABEL = "draservice.io/reservation"


def claim(ns: str, name: str) -> ResourceClaim:
    return ResourceClaim.objects.get(namespace__name=ns, name=name)


BEAT_SECONDS = 1.0  # the beat sends these every 2 s (reservations) and 5 s; the loops below poll every 0.25 s
_last_beat = [0.0]


def beat() -> None:
    """The beat's tasks, at most once per BEAT_SECONDS: sent at every 0.25 s poll, they queued up ahead of the
    allocation rounds on a loaded machine (each takes a few hundred ms there) and a round waited behind dozens
    of them, longer than the waits below allow."""
    if time.monotonic() - _last_beat[0] < BEAT_SECONDS:
        return
    _last_beat[0] = time.monotonic()
    for task in ("scheduler.tasks.reservations", "queues.tasks.preempt", "claims.tasks.expire_leases"):
        app.send_task(task)


def until(when: datetime) -> None:
    while datetime.now(UTC) < when:
        beat()
        time.sleep(0.25)


def wait_for(check, timeout: float, about: tuple[str, str] | None = None) -> float:
    started = time.monotonic()
    while not check():
        if about is not None and time.monotonic() - started >= timeout:
            c = claim(*about)
            raise AssertionError(f"timed out: {about[1]} is {c.phase} ({c.reason}: {c.message}), "
                                 f"{c.attempts} attempts")
        assert time.monotonic() - started < timeout, "timed out"
        beat()
        time.sleep(0.25)
    return time.monotonic() - started


def post(client, ns: str, name: str, count: int, labels: dict | None = None, **annotations):
    return client.post(f"/api/v1/namespaces/{ns}/resourceclaims",
                       gpu_claim(name, count, labels=labels or {}, annotations=annotations), format="json")


def test_a_reservation_holds_reclaims_and_starts_its_claims_on_time(admin_client, live_broker):
    load_fleet({"c1": [("h100", 1)]})  # one node, 8 GPUs
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 5}}},
                              format="json").status_code == 200
    start = (datetime.now(UTC) + timedelta(seconds=60)).replace(microsecond=0)
    window = {"start": start.strftime("%Y-%m-%dT%H:%M:%S"),
              "end": (start + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S"), "timeZone": "UTC"}
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": "nightly"},
            "spec": {"window": window, "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 8}],
                     "users": {"namespaces": ["team-r"]}, "leadTimeSeconds": 30, "reclaimBorrowed": True}}
    assert admin_client.post("/api/v1/reservations", body, format="json").status_code == 201

    # A conflicting reservation: 409 naming the other and the occurrence.
    rival = {**body, "metadata": {"name": "rival"},
             "spec": {**body["spec"], "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 1}]}}
    resp = admin_client.post("/api/v1/reservations", rival, format="json")
    assert resp.status_code == 409 and 'reservation "nightly"' in resp.json()["detail"], resp.content
    assert start.strftime("%Y-%m-%dT%H:%M") in resp.json()["detail"]
    # A namespace not in its users naming it: 403.
    resp = post(admin_client, "team-a", "intruder", 1, {LABEL: "nightly"})
    assert resp.status_code == 403, resp.content

    # Before the hold: a borrower of the default queue (nominal 0) with no walltime runs on the node.
    assert post(admin_client, "team-a", "borrower", 4).status_code == 201
    assert post(admin_client, "team-r", "reserved", 8, {LABEL: "nightly"}).status_code == 201
    wait_for(lambda: claim("team-a", "borrower").phase == Phase.ALLOCATED, 20, ("team-a", "borrower"))
    wait_for(lambda: claim("team-r", "reserved").reason == "WaitingForReservation", 20)

    # From start - 30 s: held, and the borrower there gets a notice naming the reservation.
    until(start - timedelta(seconds=30))
    took = wait_for(lambda: Preemption.objects.filter(victim__name="borrower", reservation="nightly").exists(), 10)
    assert took <= 5, took
    assert claim("team-a", "borrower").preemption["stopBy"]
    held = Reservation.objects.get(name="nightly").held
    assert held["nodes"] == [["c1", "c1-h100-000"]] and held["heldDevices"] == 8
    # Walltimes: one ending after the start never lands on the held node; one ending well before it does.
    assert post(admin_client, "team-a", "long", 2, **{"draservice.io/lease-ttl": "120s"}).status_code == 201
    assert post(admin_client, "team-a", "short", 1, **{"draservice.io/lease-ttl": "8s"}).status_code == 201
    wait_for(lambda: claim("team-a", "short").phase == Phase.ALLOCATED, 10)
    wait_for(lambda: claim("team-a", "long").reason == "HeldForReservation", 10)
    assert claim("team-a", "long").phase == Phase.PENDING
    # The borrower is requeued at its deadline and kept off the node too (no walltime).
    wait_for(lambda: claim("team-a", "borrower").phase == Phase.PENDING, 15)

    # At the start: the labelled claim runs within 5 s, on the held capacity, charged to no queue.
    until(start)
    wait_for(lambda: claim("team-r", "reserved").phase == Phase.ALLOCATED, 10)
    reserved = claim("team-r", "reserved")
    late = (reserved.allocated_at - start).total_seconds()
    assert 0 <= late <= 5, late
    assert reserved.node == "c1-h100-000"
    assert not QuotaCharge.objects.filter(claim=reserved).exists()
    intervals = UsageInterval.objects.filter(claim_id=reserved.id)
    assert intervals.count() == 8 and set(intervals.values_list("reservation", flat=True)) == {"nightly"}
    assert claim("team-a", "long").phase == Phase.PENDING
    status = admin_client.get("/api/v1/reservations/nightly").json()["status"]
    assert status["utilisation"] == {"devicesInUse": 8, "devicesReserved": 8, "fraction": 1.0}
