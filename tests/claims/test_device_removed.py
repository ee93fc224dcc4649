"""An allocated claim whose devices a later inventory push removed says so: condition ``DeviceRemoved``, an
event, the dashboard's claim page, ``/metrics``. It stays Allocated (its workload may still run)."""
from __future__ import annotations

import copy
import time

import pytest

from claims.models import ClaimEvent, Phase, ResourceClaim
from inventory.services import sync
from scheduler.services import allocation
from tests.claims.fleet import cluster_body, gpu_claim, mig_pair_claim

NS = "/api/v1/namespaces/team-a"
REMOVED = "draservice_claims_device_removed"


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def allocate(client, body) -> dict:
    assert client.post(f"{NS}/resourceclaims", body, format="json").status_code == 201
    run_rounds()
    claim = client.get(f"{NS}/resourceclaims/{body['metadata']['name']}").json()
    assert claim["status"]["phase"] == "Allocated", claim["status"]
    return claim


def condition(claim: dict) -> dict | None:
    return next((c for c in claim["status"].get("conditions", []) if c["type"] == "DeviceRemoved"), None)


def read(client, name: str) -> dict:
    return client.get(f"{NS}/resourceclaims/{name}").json()


def metric(client) -> float:
    text = client.get("/metrics").content.decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(REMOVED + " ")))


def without_node(body: dict, node: str) -> dict:
    return {"resourceSlices": [s for s in body["resourceSlices"] if s["spec"].get("nodeName") != node],
            "nodes": [n for n in body["nodes"] if n["name"] != node]}


@pytest.mark.django_db
def test_a_full_push_without_the_node_marks_the_claim_and_restoring_it_clears(
        admin_client, small_fleet, django_capture_on_commit_callbacks, client, django_user_model):
    claim = allocate(admin_client, gpu_claim("train", count=2))
    node = claim["status"]["node"]
    results = claim["status"]["allocation"]["devices"]["results"]
    devices = sorted(f"gpu.nvidia.com/{r['pool']}/{r['device']}" for r in results)
    assert condition(claim) is None and metric(admin_client) == 0
    version = claim["metadata"]["resourceVersion"]

    with django_capture_on_commit_callbacks(execute=True):
        admin_client.put("/api/v1/clusters/c1/inventory", without_node(small_fleet["c1"], node), format="json")
    claim = read(admin_client, "train")
    assert claim["status"]["phase"] == "Allocated" and claim["status"]["allocation"]  # kept, on purpose
    cond = condition(claim)
    assert (cond["status"], cond["reason"]) == ("True", "DeviceRemoved")
    assert all(d in cond["message"] for d in devices) and "cluster c1" in cond["message"]
    assert int(claim["metadata"]["resourceVersion"]) > int(version)
    events = admin_client.get(f"{NS}/resourceclaims/train/events", {"type": "DeviceRemoved"}).json()["items"]
    assert [(e["reason"], sorted(e["data"]["devices"])) for e in events] == [("DeviceRemoved", devices)]
    assert metric(admin_client) == 1
    # The dashboard's claim page says it, on the claim and on each device.
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    page = client.get("/claims/team-a/train/").content.decode()
    assert 'data-testid="device-removed"' in page and page.count('data-testid="removed-device"') == 2

    # The same push again changes nothing (no second event).
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.put("/api/v1/clusters/c1/inventory", without_node(small_fleet["c1"], node), format="json")
    assert ClaimEvent.objects.filter(type="DeviceRemoved").count() == 1

    with django_capture_on_commit_callbacks(execute=True):
        admin_client.put("/api/v1/clusters/c1/inventory", small_fleet["c1"], format="json")
    cond = condition(read(admin_client, "train"))
    assert (cond["status"], cond["reason"]) == ("False", "DevicesPresent")
    assert metric(admin_client) == 0
    assert 'data-testid="device-removed"' not in client.get("/claims/team-a/train/").content.decode()


@pytest.mark.django_db
def test_an_incremental_delete_marks_and_a_released_claim_is_not_counted(admin_client, small_fleet,
                                                                         django_capture_on_commit_callbacks):
    claim = allocate(admin_client, gpu_claim("job", count=1))
    other = allocate(admin_client, gpu_claim("elsewhere", count=8))
    assert other["status"]["node"] != claim["status"]["node"]
    (slice_name,) = [s["metadata"]["name"] for s in small_fleet["c1"]["resourceSlices"]
                     if s["spec"].get("nodeName") == claim["status"]["node"]
                     and s["spec"]["driver"] == "gpu.nvidia.com"]
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.delete(f"/api/v1/clusters/c1/resourceslices/{slice_name}").status_code == 204
    assert condition(read(admin_client, "job"))["status"] == "True"
    assert condition(read(admin_client, "elsewhere")) is None  # its node is untouched
    assert metric(admin_client) == 1
    admin_client.post(f"{NS}/resourceclaims/job/release")
    assert metric(admin_client) == 0  # released: no longer an allocation on a missing device


@pytest.mark.django_db
def test_an_incomplete_pool_is_not_judged_until_it_is_complete(admin_client, small_fleet,
                                                               django_capture_on_commit_callbacks):
    claim = allocate(admin_client, mig_pair_claim("mig"))
    pool = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
    held = {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    slices = [s for s in small_fleet["c1"]["resourceSlices"] if s["spec"]["pool"]["name"] == pool]
    holding = next(s for s in slices if held & {d["name"] for d in s["spec"].get("devices") or ()})
    # The slice goes away while the pool still announces 9: maybe it is only late. No verdict.
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.delete(f"/api/v1/clusters/c1/resourceslices/{holding['metadata']['name']}")
    assert condition(read(admin_client, "mig")) is None
    # The driver publishes the pool again as 8 slices without it: now the devices are gone.
    body = copy.deepcopy(small_fleet["c1"])
    body["resourceSlices"] = [s for s in body["resourceSlices"] if s["metadata"]["name"] != holding["metadata"]["name"]]
    for s in body["resourceSlices"]:
        if s["spec"]["pool"]["name"] == pool:
            s["spec"]["pool"].update(resourceSliceCount=8, generation=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.put("/api/v1/clusters/c1/inventory", body, format="json").status_code == 200
    assert condition(read(admin_client, "mig"))["status"] == "True"


@pytest.mark.django_db
def test_deleting_the_cluster_marks_its_claims(admin_client, small_fleet, django_capture_on_commit_callbacks):
    allocate(admin_client, gpu_claim("orphan", count=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.delete("/api/v1/clusters/c1").status_code == 204
    claim = read(admin_client, "orphan")
    assert claim["status"]["phase"] == "Allocated" and condition(claim)["status"] == "True"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_with_a_broker_a_worker_does_the_check(admin_client, small_fleet, live_broker):
    """With a broker the push only enqueues (debounced per cluster); the worker process marks the claim."""
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("remote", count=1), format="json").status_code == 201
    status = admin_client.get(f"{NS}/resourceclaims/remote?wait=30s").json()["status"]
    assert status["phase"] == "Allocated", status
    sync.push_inventory("c1", cluster_body("c1", [("a100-mig", 1)]))  # both H100 nodes gone
    deadline = time.monotonic() + 20
    while ResourceClaim.objects.get(name="remote").device_removed_at is None:
        assert time.monotonic() < deadline, live_broker.log_tail()
        time.sleep(0.1)
    claim = ResourceClaim.objects.get(name="remote")
    assert claim.phase == Phase.ALLOCATED
    assert condition({"status": {"conditions": claim.conditions}})["status"] == "True"
