"""Walltime with real Celery workers on PostgreSQL: a lease (``draservice.io/lease-ttl``) runs from allocation,
not creation, so time spent waiting costs none of it; ``draservice.io/pending-timeout`` bounds the wait. The
expiry sweep is sent as the beat sends it (more often, to keep the test short)."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import ClaimEvent, Phase, ResourceClaim
from draservice.celery import app
from inventory.models import Cluster
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db(transaction=True)]

NS = "/api/v1/namespaces/team-a/resourceclaims"


def wait_for(check, timeout: float) -> float:
    """Seconds until ``check()`` holds, sending the lease sweep meanwhile."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "timed out"
        app.send_task("claims.tasks.expire_leases")
        time.sleep(0.25)
    return time.monotonic() - started


def claim(name: str) -> ResourceClaim:
    return ResourceClaim.objects.get(namespace__name="team-a", name=name)


def post(admin_client, name: str, count: int, **annotations) -> dict:
    resp = admin_client.post(NS, gpu_claim(name, count, annotations=annotations), format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def test_a_waiting_claim_keeps_its_whole_walltime_and_a_renewal_extends_it(admin_client, live_broker):
    load_fleet({"c1": [("h100", 1)]})  # one node, 8 GPUs
    post(admin_client, "first", 8, **{"draservice.io/lease-ttl": "6s"})
    wait_for(lambda: claim("first").phase == Phase.ALLOCATED, 20)
    waiter = post(admin_client, "waiter", 1, **{"draservice.io/lease-ttl": "5s"})
    post(admin_client, "impatient", 8, **{"draservice.io/pending-timeout": "5s"})
    assert waiter["status"]["lease"] == {"leaseDurationSeconds": 5, "expireTime": None, "renewTime": None}

    # The bound on the wait: released, never allocated, about when its timeout says.
    wait_for(lambda: claim("impatient").phase == Phase.RELEASED, 20)
    impatient = claim("impatient")
    assert impatient.reason == "PendingTimeout" and impatient.allocated_at is None
    assert timedelta(seconds=5) <= impatient.released_at - impatient.created_at < timedelta(seconds=8)
    assert claim("waiter").phase == Phase.PENDING and claim("waiter").lease_expires_at is None

    # "first" runs its 6 s; then the waiter is allocated with its whole 5 s ahead of it.
    wait_for(lambda: claim("waiter").phase == Phase.ALLOCATED, 20)
    first, w = claim("first"), claim("waiter")
    assert first.reason == "LeaseExpired"
    assert timedelta(seconds=6) <= first.released_at - first.allocated_at < timedelta(seconds=9)
    assert w.allocated_at - w.created_at >= timedelta(seconds=3)  # it waited...
    assert w.lease_expires_at == w.allocated_at + timedelta(seconds=5)  # ...and none of that was its lease
    got = admin_client.get(f"{NS}/waiter").json()["status"]["lease"]
    assert got["expireTime"] == f"{w.lease_expires_at:%Y-%m-%dT%H:%M:%SZ}"

    # A renewal 2 s in gives it 5 s from then: it runs about 7 s in all.
    time.sleep(max(0.0, 2 - (time.time() - w.allocated_at.timestamp())))
    assert admin_client.post(f"{NS}/waiter/renew", {"ttl": "5s"}, format="json").status_code == 200
    wait_for(lambda: claim("waiter").phase == Phase.RELEASED, 20)
    w = claim("waiter")
    assert w.reason == "LeaseExpired"
    assert timedelta(seconds=7) <= w.released_at - w.allocated_at < timedelta(seconds=10)


def walltime_queue(admin_client, grace: int, force: int) -> None:
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "wq"},
            "spec": {"namespaces": ["team-a"],
                     "quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": 64}}],
                     "preemption": {"graceSeconds": grace, "forceAfterSeconds": force}}}
    resp = admin_client.post("/api/v1/queues", body, format="json")
    assert resp.status_code == 201, resp.content


def releasing(name: str) -> dict | None:
    return next((c for c in claim(name).conditions if c["type"] == "Releasing" and c["status"] == "True"), None)


def agent_alive() -> None:
    """The cluster's agent reports (so something may be using the devices: a walltime's end is a notice)."""
    Cluster.objects.update(last_heartbeat_at=timezone.now())


def test_at_walltime_end_a_watched_claim_is_noticed_then_forced_after_its_queues_force_after(admin_client,
                                                                                             live_broker):
    load_fleet({"c1": [("h100", 1)]})  # one node, 8 GPUs
    walltime_queue(admin_client, grace=2, force=5)
    agent_alive()
    post(admin_client, "job", 8, **{"draservice.io/lease-ttl": "5s"})
    wait_for(lambda: claim("job").phase == Phase.ALLOCATED, 20)
    post(admin_client, "next", 8)

    # Its walltime ends: it keeps its devices, Releasing (LeaseExpired), until forceAfterSeconds from then.
    wait_for(lambda: releasing("job") is not None, 20)
    agent_alive()
    job = claim("job")
    assert job.phase == Phase.ALLOCATED and releasing("job")["reason"] == "LeaseExpired"
    ended = job.allocated_at + timedelta(seconds=5)
    assert ended + timedelta(seconds=5) <= job.lease_expires_at < ended + timedelta(seconds=8)
    got = admin_client.get(f"{NS}/job").json()["status"]
    assert got["lease"]["expireTime"] == f"{job.lease_expires_at:%Y-%m-%dT%H:%M:%SZ}"
    assert admin_client.post(f"{NS}/job/renew", {"ttl": "1h"}, format="json").status_code == 409
    assert claim("next").phase == Phase.PENDING

    # Nobody confirms: forced at the deadline, reason LeaseExpired; the waiting claim gets the node.
    wait_for(lambda: claim("next").phase == Phase.ALLOCATED, 30)
    job = claim("job")
    assert job.phase == Phase.RELEASED and job.reason == "LeaseExpired" and releasing("job") is None
    assert timedelta(seconds=10) <= job.released_at - job.allocated_at < timedelta(seconds=14)
    assert claim("next").allocated_at >= job.released_at


def test_a_confirmation_ends_the_notice_early_and_an_unwatched_claim_goes_at_once(admin_client, live_broker):
    load_fleet({"c1": [("h100", 1)]})
    walltime_queue(admin_client, grace=30, force=60)
    agent_alive()
    post(admin_client, "watched", 8, **{"draservice.io/lease-ttl": "5s"})
    wait_for(lambda: releasing("watched") is not None, 20)
    assert claim("watched").phase == Phase.ALLOCATED
    resp = admin_client.post(f"{NS}/watched/release-confirm", format="json")
    assert resp.status_code == 200, resp.content
    w = claim("watched")
    assert w.phase == Phase.RELEASED and w.reason == "ReleaseConfirmed"
    assert w.released_at - w.allocated_at < timedelta(seconds=12)  # not the queue's 60 s

    # No agent alive and no consumer: nothing to tell, released at its walltime's end (no notice).
    Cluster.objects.update(last_heartbeat_at=None)
    post(admin_client, "alone", 8, **{"draservice.io/lease-ttl": "5s"})
    wait_for(lambda: claim("alone").phase == Phase.RELEASED, 30)
    alone = claim("alone")
    assert alone.reason == "LeaseExpired"
    assert alone.released_at - alone.allocated_at < timedelta(seconds=9)
    assert not ClaimEvent.objects.filter(claim_name="alone", type="Releasing").exists()
