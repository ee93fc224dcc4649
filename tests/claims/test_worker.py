"""End to end with a real Celery worker process, real PostgreSQL and real Redis.

The web side is the Django test client in this process; it enqueues to Redis exactly as the web server
does. Allocation happens only in the worker subprocess (tasks are not eager here).
"""
from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from claims.models import AllocationRound, DeviceAllocation, ResourceClaim
from claims.tasks import expire_leases
from inventory.models import Device
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, mig_pair_claim

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NS = "/api/v1/namespaces/ci"


def until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def wait_phase(client, name, timeout=30.0):
    resp = client.get(f"{NS}/resourceclaims/{name}?wait={int(timeout)}s")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_submit_allocated_released(admin_client, small_fleet, live_broker):
    start = time.monotonic()
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("build-1", count=4), format="json").status_code == 201
    claim = wait_phase(admin_client, "build-1")
    assert claim["status"]["phase"] == "Allocated", claim["status"]
    assert time.monotonic() - start < 10
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 4
    assert DeviceAllocation.objects.filter(claim__name="build-1").count() == 4
    released = admin_client.delete(f"{NS}/resourceclaims/build-1")
    assert released.status_code == 200
    assert DeviceAllocation.objects.count() == 0
    # The freed devices are allocatable again at once.
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("build-2", count=8), format="json")
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("build-3", count=8), format="json")
    assert wait_phase(admin_client, "build-2")["status"]["phase"] == "Allocated"
    assert wait_phase(admin_client, "build-3")["status"]["phase"] == "Allocated"


def test_idempotent_retry_gives_one_claim(admin_client, small_fleet, live_broker):
    body = gpu_claim("")
    body["metadata"] = {"generateName": "retry-"}
    answers = []

    def post():
        try:
            answers.append(admin_client.post(f"{NS}/resourceclaims", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {a.status_code for a in answers} == {201}, [a.content for a in answers]
    assert len({a.json()["metadata"]["uid"] for a in answers}) == 1
    assert ResourceClaim.objects.count() == 1
    name = answers[0].json()["metadata"]["name"]
    assert wait_phase(admin_client, name)["status"]["phase"] == "Allocated"
    again = admin_client.post(f"{NS}/resourceclaims", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.json()["metadata"]["uid"] == answers[0].json()["metadata"]["uid"]
    assert ResourceClaim.objects.count() == 1 and DeviceAllocation.objects.count() == 1


def test_shared_claim_several_consumers(admin_client, small_fleet, live_broker):
    items = [gpu_claim("shared")] + [
        {"kind": "Consumer", "metadata": {"name": f"pod-{i}"},
         "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]}} for i in range(4)]
    assert admin_client.post(f"{NS}/resourceclaims/batch", {"items": items}, format="json").status_code == 201
    claim = wait_phase(admin_client, "shared")
    assert claim["status"]["phase"] == "Allocated"
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == [f"pod-{i}" for i in range(4)]
    assert DeviceAllocation.objects.count() == 1
    pod = admin_client.get(f"{NS}/consumers/pod-3?wait=10s").json()
    assert pod["status"]["phase"] == "Allocated" and pod["status"]["node"] == claim["status"]["node"]


def test_consumer_with_two_claims_lands_on_one_node(admin_client, small_fleet, live_broker):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("filler", count=7), format="json")
    filler = wait_phase(admin_client, "filler")["status"]["node"]
    items = [gpu_claim("left"), gpu_claim("right"),
             {"kind": "Consumer", "metadata": {"name": "trainer"}, "spec": {"resourceClaims": [
                 {"name": "a", "resourceClaimName": "left"}, {"name": "b", "resourceClaimName": "right"}]}}]
    assert admin_client.post(f"{NS}/resourceclaims/batch", {"items": items}, format="json").status_code == 201
    consumer = admin_client.get(f"{NS}/consumers/trainer?wait=30s").json()
    assert consumer["status"]["phase"] == "Allocated", consumer
    left, right = (wait_phase(admin_client, n)["status"] for n in ("left", "right"))
    assert left["node"] == right["node"] == consumer["status"]["node"] != filler


def test_mig_claim_two_partitions_of_one_parent(admin_client, small_fleet, live_broker):
    assert admin_client.post(f"{NS}/resourceclaims", mig_pair_claim("mig"), format="json").status_code == 201
    claim = wait_phase(admin_client, "mig")
    assert claim["status"]["phase"] == "Allocated", claim["status"]
    results = claim["status"]["allocation"]["devices"]["results"]
    devices = [Device.objects.get(driver=r["driver"], pool_name=r["pool"], name=r["device"]) for r in results]
    assert len({d.name for d in devices}) == 2
    assert len({d.attributes["parentUUID"]["string"] for d in devices}) == 1


def test_lease_expiry_frees_devices(admin_client, small_fleet, live_broker):
    body = gpu_claim("leased", count=8, annotations={"draservice.io/lease-ttl": "5s"})
    admin_client.post(f"{NS}/resourceclaims", body, format="json")
    assert wait_phase(admin_client, "leased")["status"]["phase"] == "Allocated"
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("waiting", count=8), format="json")
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("waiting-too", count=8), format="json")
    # Two 8-GPU nodes: one of the two gets the other node, the other is tried and stays pending.
    until(lambda: set(ResourceClaim.objects.filter(name__startswith="waiting").values_list("reason", flat=True))
          == {"Allocated", "Unsatisfiable"})
    pending = ResourceClaim.objects.get(name__startswith="waiting", phase="Pending").name
    ResourceClaim.objects.filter(name="leased").update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    expire_leases.delay()  # what beat does every few seconds
    claim = admin_client.get(f"{NS}/resourceclaims/leased").json()
    deadline = time.monotonic() + 20
    while claim["status"]["phase"] != "Released" and time.monotonic() < deadline:
        time.sleep(0.1)
        claim = admin_client.get(f"{NS}/resourceclaims/leased").json()
    assert claim["status"]["phase"] == "Released" and claim["status"]["reason"] == "LeaseExpired"
    assert not DeviceAllocation.objects.filter(claim__name="leased").exists()
    # The release made room: the waiting claim gets the devices without anyone asking again.
    assert wait_phase(admin_client, pending)["status"]["phase"] == "Allocated"
    events = [e["type"] for e in admin_client.get(f"{NS}/resourceclaims/leased/events").json()["items"]]
    assert events == ["Created", "Allocated", "LeaseExpired"]


def test_canary_is_allocated_fast_beside_an_expensive_selector(admin_client, small_fleet, live_broker):
    """A claim whose selector costs ~1 s per device (stored before creation-time checks existed) and a
    cel/match with it must not hold up an unrelated claim: the canary is allocated within 2 s."""
    from claims.models import Namespace
    from tests.claims.test_round_bounds import HOSTILE

    # A warm worker (fleet snapshot and engine built), as in a running service: what is timed is the wait
    # behind the expensive claim, not the worker's cold start.
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("warm-up"), format="json").status_code == 201
    assert wait_phase(admin_client, "warm-up")["status"]["phase"] == "Allocated"
    spec = gpu_claim("hostile")["spec"]
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": HOSTILE}}]
    ns, _ = Namespace.objects.get_or_create(name="ci")
    ResourceClaim.objects.create(namespace=ns, name="hostile", spec=spec)
    match = {}

    def cel_match():
        match["status"] = admin_client.post("/api/v1/cel/match", {"expression": HOSTILE}, format="json").status_code
        connections.close_all()

    t = threading.Thread(target=cel_match)
    t.start()
    start = time.monotonic()
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("canary"), format="json").status_code == 201
    claim = wait_phase(admin_client, "canary")
    elapsed = time.monotonic() - start
    t.join(30)
    assert claim["status"]["phase"] == "Allocated", claim["status"]
    canary = ResourceClaim.objects.get(name="canary")
    server = (canary.allocated_at - canary.created_at).total_seconds()  # one clock: the database's rows
    # The hostile claim's cost is bounded in CEL cost units (deterministic); what that takes in seconds depends
    # on the CPU left over. The 2 s goal holds on a machine not loaded past its cores (CI); a busier machine
    # (several suites at once) gets a looser bound so that the test checks the bound, not the neighbours.
    # On a slower CPU the hostile claim's budget alone takes close to 2 s (its round, timed by the worker): the
    # canary then waits for that one round, never for more, and the goal grows with it.
    goal = 2.0 if os.getloadavg()[0] <= (os.cpu_count() or 1) else 6.0
    assert match["status"] == 422
    hostile = wait_phase(admin_client, "hostile")
    assert hostile["status"]["phase"] == "Failed" and hostile["status"]["attempts"] == 1
    failed_in = AllocationRound.objects.filter(failed__gte=1, finished_at__gte=canary.created_at)
    until(failed_in.exists)  # the round's log row is written after its commit
    budget = max(failed_in.values_list("seconds", flat=True))
    goal = max(goal, budget + 0.75)
    print(f"\ncanary: {server:.2f} s submit->allocated beside the expensive claim (goal {goal:.2f} s; the hostile "
          f"claim's round {budget:.2f} s)")
    assert server < goal, f"canary took {server:.2f} s from submit to allocated ({elapsed:.2f} s at the client)"


def test_a_pending_claim_is_tried_once_by_real_workers_while_the_fleet_is_stable(admin_client, small_fleet,
                                                                                  live_broker):
    """Kicks (beat's retry, other claims' commits) and heartbeats of an unchanged fleet do not re-try a claim
    that cannot fit: only a change to the fleet or to the claim does."""
    from claims import dispatch

    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("no-fit", count=32), format="json").status_code == 201
    until(lambda: ResourceClaim.objects.get(name="no-fit").attempts == 1)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        dispatch.request_allocation()
        admin_client.post("/api/v1/clusters/c1/heartbeat", {}, format="json")
        time.sleep(0.5)
    claim = ResourceClaim.objects.get(name="no-fit")
    assert claim.phase == "Pending" and claim.attempts == 1
    # Nor does a release of one GPU (it lacks 16: claims.services.wake).
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("small"), format="json")
    assert wait_phase(admin_client, "small")["status"]["phase"] == "Allocated"
    admin_client.post(f"{NS}/resourceclaims/small/release")
    until(lambda: not allocation.undecided_pending().exists())
    assert ResourceClaim.objects.get(name="no-fit").attempts == 1
    # A change to the fleet itself (here, as an inventory push announces it) allows another attempt.
    with transaction.atomic():
        allocation.bump_fleet_version()
    dispatch.request_allocation()
    until(lambda: ResourceClaim.objects.get(name="no-fit").attempts == 2)
