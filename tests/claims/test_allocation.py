"""The allocation round against real PostgreSQL and the real engine (no Celery here; see test_worker.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from claims.models import ClaimEvent, DeviceAllocation, ResourceClaim
from claims.services import claims as claim_services
from claims.services import external, fleet
from claims.services.engines import engines
from inventory.models import Device
from inventory.services import sync
from scheduler.services import allocation
from tests.claims.fleet import cluster_body, gpu_claim, mig_pair_claim

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a"


def run_rounds():
    total = allocation.RoundResult()
    while True:
        r = allocation.allocate_round()
        if not r.taken:
            return total
        total.allocated += r.allocated
        total.pending += r.pending
        total.lost_race += r.lost_race


def status(client, name):
    return client.get(f"{NS}/resourceclaims/{name}").json()["status"]


def test_submit_allocate_release(admin_client, small_fleet):
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("job", count=2), format="json").status_code == 201
    run_rounds()
    st = status(admin_client, "job")
    assert st["phase"] == "Allocated" and st["cluster"] == "c1" and st["node"].startswith("c1-h100-")
    results = st["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["driver"] for r in results} == {"gpu.nvidia.com"}
    assert st["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [st["node"]]
    assert DeviceAllocation.objects.count() == 2
    version = allocation.fleet_version()
    released = admin_client.post(f"{NS}/resourceclaims/job/release").json()
    assert released["status"]["phase"] == "Released" and "allocation" not in released["status"]
    assert DeviceAllocation.objects.count() == 0
    assert allocation.fleet_version() == version + 2  # two devices freed: gangs and estimates read again
    types = list(ClaimEvent.objects.filter(claim_name="job").values_list("type", flat=True))
    assert types == ["Created", "Allocated", "Released"]


def test_unsatisfiable_claim_stays_pending_with_reason_and_is_not_retried_blindly(admin_client, small_fleet):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("huge", count=9), format="json")  # nodes have 8
    run_rounds()
    st = status(admin_client, "huge")
    assert st["phase"] == "Pending" and st["reason"] == "Unsatisfiable"
    assert st["conditions"][0]["reason"] == "Unsatisfiable"
    explain = admin_client.get(f"{NS}/resourceclaims/huge/explain").json()
    assert explain["current"] is True and explain["diagnostics"]["diagnostics"]
    assert allocation.allocate_round().taken == 0  # nothing changed since: no second attempt
    with connection.cursor():
        allocation.bump_fleet_version()
    assert allocation.allocate_round().taken == 1
    fresh = admin_client.get(f"{NS}/resourceclaims/huge/explain?refresh=true").json()
    assert fresh["refreshed"] and fresh["diagnostics"]["allocatable"] is False


def test_consumer_claims_land_on_one_node(admin_client, small_fleet):
    # Fill 7 of 8 GPUs of one node: bin-packing would put a lone 1-GPU claim there, but this consumer's
    # two claims do not both fit on it, so both must go to the other node.
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("filler", count=7), format="json")
    run_rounds()
    filler_node = status(admin_client, "filler")["node"]
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
                "spec": {"spec": gpu_claim("x")["spec"]}}
    assert admin_client.post(f"{NS}/resourceclaimtemplates", template, format="json").status_code == 201
    consumer = {"kind": "Consumer", "metadata": {"name": "pod-1"}, "spec": {"resourceClaims": [
        {"name": "first", "resourceClaimTemplateName": "one-gpu"},
        {"name": "second", "resourceClaimTemplateName": "one-gpu"}]}}
    resp = admin_client.post(f"{NS}/consumers", consumer, format="json")
    assert resp.status_code == 201, resp.content
    names = [s["resourceClaimName"] for s in resp.json()["status"]["resourceClaimStatuses"]]
    assert len(names) == 2 and all(n.startswith("pod-1-") for n in names)
    run_rounds()
    nodes = {status(admin_client, n)["node"] for n in names}
    assert len(nodes) == 1 and nodes != {filler_node}
    got = admin_client.get(f"{NS}/consumers/pod-1").json()
    assert got["status"]["phase"] == "Allocated" and got["status"]["node"] == nodes.pop()
    claim = admin_client.get(f"{NS}/resourceclaims/{names[0]}").json()
    assert claim["status"]["reservedFor"] == [{"apiGroup": "draservice.io", "resource": "consumers",
                                               "name": "pod-1", "uid": got["metadata"]["uid"]}]
    assert claim["metadata"]["ownerReferences"][0]["name"] == "pod-1"
    # Deleting the consumer releases and deletes the claims made for it.
    assert admin_client.delete(f"{NS}/consumers/pod-1").status_code == 200
    assert not ResourceClaim.objects.filter(name__in=names).exists()
    assert DeviceAllocation.objects.count() == 7


def test_shared_claim_with_several_consumers(admin_client, small_fleet):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("shared-gpu"), format="json")
    for pod in ("pod-a", "pod-b", "pod-c"):
        resp = admin_client.post(f"{NS}/consumers", {"metadata": {"name": pod}, "spec": {"resourceClaims": [
            {"name": "gpu", "resourceClaimName": "shared-gpu"}]}}, format="json")
        assert resp.status_code == 201, resp.content
    run_rounds()
    st = status(admin_client, "shared-gpu")
    assert st["phase"] == "Allocated" and len(st["allocation"]["devices"]["results"]) == 1
    assert [r["name"] for r in st["reservedFor"]] == ["pod-a", "pod-b", "pod-c"]
    assert DeviceAllocation.objects.count() == 1
    for pod in ("pod-a", "pod-b", "pod-c"):
        assert admin_client.get(f"{NS}/consumers/{pod}").json()["status"]["phase"] == "Allocated"


def test_reserved_for_is_capped(admin_client, small_fleet, monkeypatch):
    from claims.services import consumers

    monkeypatch.setattr(consumers, "MAX_RESERVED_FOR", 2)
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("cap"), format="json")
    def body(n):
        return {"metadata": {"name": n}, "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "cap"}]}}
    assert admin_client.post(f"{NS}/consumers", body("p1"), format="json").status_code == 201
    assert admin_client.post(f"{NS}/consumers", body("p2"), format="json").status_code == 201
    resp = admin_client.post(f"{NS}/consumers", body("p3"), format="json")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "spec.resourceClaims[0].resourceClaimName"


def test_mig_pair_gets_two_partitions_of_one_parent(admin_client, small_fleet):
    resp = admin_client.post(f"{NS}/resourceclaims", mig_pair_claim("mig-pair"), format="json")
    assert resp.status_code == 201, resp.content
    run_rounds()
    st = status(admin_client, "mig-pair")
    assert st["phase"] == "Allocated", st
    results = st["allocation"]["devices"]["results"]
    assert st["node"] == "c1-a100-mig-000" and [r["request"] for r in results] == ["a", "b"]
    devices = [Device.objects.get(cluster__name="c1", driver=r["driver"], pool_name=r["pool"], name=r["device"])
               for r in results]
    parents = {d.attributes["parentUUID"]["string"] for d in devices}
    assert len(devices) == 2 and devices[0].name != devices[1].name and len(parents) == 1
    assert {d.attributes["profile"]["string"] for d in devices} == {"1g.10gb"}


def test_lease_expiry_frees_devices(admin_client, small_fleet):
    obj = gpu_claim("leased", annotations={"draservice.io/lease-ttl": "30s"})
    admin_client.post(f"{NS}/resourceclaims", obj, format="json")
    run_rounds()
    assert status(admin_client, "leased")["phase"] == "Allocated"
    renewed = admin_client.post(f"{NS}/resourceclaims/leased/renew", {"ttl": "1m"}, format="json")
    assert renewed.status_code == 200 and renewed.json()["status"]["lease"]["leaseDurationSeconds"] == 60
    assert claim_services.expire_leases() == 0
    ResourceClaim.objects.filter(name="leased").update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert claim_services.expire_leases() == 1
    st = status(admin_client, "leased")
    assert st["phase"] == "Released" and st["reason"] == "LeaseExpired"
    assert DeviceAllocation.objects.count() == 0
    assert ClaimEvent.objects.filter(claim_name="leased", type="LeaseExpired").exists()
    assert admin_client.post(f"{NS}/resourceclaims/leased/renew").status_code == 409


def test_placement_hints_across_clusters(admin_client, two_clusters):
    pinned = gpu_claim("pinned", annotations={"draservice.io/allowed-clusters": "name=c-mig"})
    by_label = gpu_claim("by-label", annotations={"draservice.io/allowed-clusters": "env=gpu"})
    nowhere = gpu_claim("nowhere", annotations={"draservice.io/allowed-clusters": "env=none"})
    preferred = gpu_claim("preferred", annotations={"draservice.io/preferred-cluster": "c-h100"})
    resp = admin_client.post(f"{NS}/resourceclaims/batch", {"items": [pinned, by_label, nowhere, preferred]},
                             format="json")
    assert resp.status_code == 201, resp.content
    run_rounds()
    st = status(admin_client, "pinned")  # the MIG cluster publishes no whole GPUs
    assert st["phase"] == "Pending" and st["reason"] == "Unsatisfiable"
    assert status(admin_client, "by-label")["cluster"] == "c-h100"
    assert status(admin_client, "nowhere")["reason"] == "NoEligibleCluster"
    assert status(admin_client, "preferred")["cluster"] == "c-h100"


@pytest.mark.parametrize("cluster_turns", [False, True], ids=["racing", "cluster-turns"])
def test_lost_race_is_detected_and_retried(admin_client, small_fleet, monkeypatch, settings, cluster_turns):
    """A worker whose view missed another worker's allocation must not write on top of it: with or without
    per-cluster turns (scheduler.services.turns, an optimisation), the write-time check under device locks
    catches it and only that group waits."""
    settings.CLAIMS_CLUSTER_TURNS = cluster_turns
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("first"), format="json")
    run_rounds()
    taken = DeviceAllocation.objects.get()
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("second"), format="json")
    real = fleet.rows_in_use
    engines.reset()
    monkeypatch.setattr(fleet, "rows_in_use", lambda: {k: v for k, v in real().items() if k != taken.id})
    r = allocation.allocate_round()
    assert r.lost_race == 1 and r.allocated == 0
    st = status(admin_client, "second")
    assert st["phase"] == "Pending" and st["reason"] == "LostRace"
    assert DeviceAllocation.objects.count() == 1
    monkeypatch.setattr(fleet, "rows_in_use", real)
    engines.reset()
    assert allocation.allocate_round().allocated == 1  # retried at once, with the true picture
    keys = list(DeviceAllocation.objects.values_list("cluster", "driver", "pool", "device"))
    assert len(set(keys)) == 2


def test_changed_inventory_version_means_lost_race(admin_client, small_fleet, monkeypatch):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("gen"), format="json")
    view = fleet.current_view()
    # The cluster's inventory changes after our snapshot was taken (a new node is pushed).
    sync.push_inventory("c1", cluster_body("c1", [("h100", 3), ("a100-mig", 1)]))
    monkeypatch.setattr(fleet, "current_view", lambda: view)
    r = allocation.allocate_round()
    assert r.lost_race == 1 and DeviceAllocation.objects.count() == 0
    monkeypatch.undo()
    assert allocation.allocate_round().allocated == 1


def test_engine_crash_parks_one_group_and_never_wedges_the_queue(admin_client, small_fleet, monkeypatch):
    from dra.engine.engine import Engine

    real = Engine.allocate

    def flaky(self, group, **kw):
        if group.claims[0]["metadata"]["name"] == "boom":
            raise RuntimeError("engine bug")
        return real(self, group, **kw)

    monkeypatch.setattr(Engine, "allocate", flaky)
    items = [gpu_claim("before"), gpu_claim("boom"), gpu_claim("after")]
    admin_client.post(f"{NS}/resourceclaims/batch", {"items": items}, format="json")
    first = allocation.allocate_round()
    assert (first.allocated, first.pending, first.lost_race) == (1, 1, 1)
    assert status(admin_client, "boom")["reason"] == "EngineError"
    assert status(admin_client, "after")["reason"] == "Deferred"
    assert allocation.allocate_round().allocated == 1  # "after", on a fresh engine
    assert status(admin_client, "after")["phase"] == "Allocated"
    assert allocation.allocate_round().taken == 0  # "boom" waits for the fleet to change


def test_claims_of_another_allocator_are_left_alone(admin_client, small_fleet, monkeypatch):
    monkeypatch.setattr(external, "EXTERNAL_ALLOCATOR_ANNOTATIONS", {"example.com/placed-by"})
    owned = gpu_claim("owned", annotations={"example.com/placed-by": "gang-1"})
    consumer = {"kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": [
        {"name": "a", "resourceClaimName": "owned"}, {"name": "b", "resourceClaimName": "mine"}]}}
    resp = admin_client.post(f"{NS}/resourceclaims/batch", {"items": [owned, gpu_claim("mine"), gpu_claim("solo"),
                                                                      consumer]}, format="json")
    assert resp.status_code == 201, resp.content
    run_rounds()
    assert status(admin_client, "owned")["reason"] == "WaitingForAllocation"  # never touched
    assert status(admin_client, "mine")["reason"] == "ManagedByAnotherAllocator"
    assert status(admin_client, "solo")["phase"] == "Allocated"
    assert DeviceAllocation.objects.count() == 1


def test_explain_refresh_shares_one_cel_budget(admin_client, small_fleet, monkeypatch):
    import dra.cel

    uuid = 'device.attributes["gpu.nvidia.com"].uuid.startsWith("GPU-")'
    claim = gpu_claim("pinned")
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": uuid}}]
    assert admin_client.post(f"{NS}/resourceclaims", claim, format="json").status_code == 201
    monkeypatch.setattr(dra.cel, "REQUEST_COST_BUDGET", 20)  # a few devices' worth: each GPU has its own uuid
    fresh = admin_client.get(f"{NS}/resourceclaims/pinned/explain?refresh=true").json()
    assert fresh["refreshed"] is True
    assert fresh["diagnostics"]["allocatable"] is False and fresh["diagnostics"]["reason"] == "cel_budget_exhausted"
    assert "the request's CEL budget of 20 cost units is used up" in fresh["diagnostics"]["message"]
    monkeypatch.undo()
    fresh = admin_client.get(f"{NS}/resourceclaims/pinned/explain?refresh=true").json()
    assert fresh["diagnostics"]["allocatable"] is True
