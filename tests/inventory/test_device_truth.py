"""The device API tells the truth: which claims hold a device (as the product wires it, no test hooks), the
``?state=`` filter, and the taints DeviceTaintRules add (the ones the engine applies)."""
from __future__ import annotations

import pytest

from inventory import hooks
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a"
H100 = {"attribute": "productName=NVIDIA H100 80GB HBM3"}


@pytest.fixture
def fleet(db):
    """c1: two 8xH100 nodes (c1-h100-000, c1-h100-001) and one A100 MIG node."""
    return load_fleet({"c1": [("h100", 2), ("a100-mig", 1)]})


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def devices(client, **params) -> list[dict]:
    resp = client.get("/api/v1/devices", {"limit": 1000, **params})
    assert resp.status_code == 200, resp.content
    return resp.json()["results"]


def allocate(client, name: str, count: int, **extra) -> dict:
    resp = client.post(f"{NS}/resourceclaims", gpu_claim(name, count=count, **extra), format="json")
    assert resp.status_code == 201, resp.content
    run_rounds()
    status = client.get(f"{NS}/resourceclaims/{name}").json()["status"]
    assert status["phase"] == "Allocated", status
    return status


def held(status: dict) -> set[tuple[str, str, str]]:
    return {(r["driver"], r["pool"], r["device"]) for r in status["allocation"]["devices"]["results"]}


def key(device: dict) -> tuple[str, str, str]:
    return device["driver"], device["pool"], device["name"]


def test_the_product_registers_the_claims_provider():
    assert hooks.allocation_state_names() == ["free", "allocated", "shared"]


def test_an_allocated_claim_shows_on_its_devices_and_filters(admin_client, fleet):
    status = allocate(admin_client, "train", 2)
    listed = {key(d): d for d in devices(admin_client, **H100)}
    assert len(listed) == 16
    for k in held(status):
        assert listed[k]["allocation"] == {"state": "allocated", "claimCount": 1, "claims": [
            {"namespace": "team-a", "name": "train", "request": "gpu"}]}
    assert {k for k, d in listed.items() if d["allocation"]["state"] == "free"} == set(listed) - held(status)
    # Detail agrees with the list.
    one = next(d for k, d in listed.items() if k in held(status))
    assert admin_client.get(f"/api/v1/devices/{one['id']}").json()["allocation"]["state"] == "allocated"
    # ?state= filters in SQL; several states OR together; other filters still apply.
    assert {key(d) for d in devices(admin_client, state="allocated")} == held(status)
    assert {key(d) for d in devices(admin_client, state="free", **H100)} == set(listed) - held(status)
    assert devices(admin_client, state="shared") == []
    both = devices(admin_client, state="allocated,shared", **H100)
    assert {key(d) for d in both} == held(status)
    assert len(devices(admin_client, state=["free", "allocated"], **H100)) == 16
    # Released: free again, at once.
    assert admin_client.post(f"{NS}/resourceclaims/train/release").status_code == 200
    assert devices(admin_client, state="allocated") == []


def test_a_claim_reserved_for_several_consumers_is_shared(admin_client, fleet):
    items = [gpu_claim("shared-job")] + [
        {"kind": "Consumer", "metadata": {"name": f"pod-{i}"},
         "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-job"}]}} for i in range(2)]
    assert admin_client.post(f"{NS}/resourceclaims/batch", {"items": items}, format="json").status_code == 201
    run_rounds()
    allocate(admin_client, "solo", 1)
    shared = devices(admin_client, state="shared")
    assert len(shared) == 1 and shared[0]["allocation"]["claims"][0]["name"] == "shared-job"
    alone = devices(admin_client, state="allocated")
    assert len(alone) == 1 and alone[0]["allocation"]["claims"][0]["name"] == "solo"
    assert len(devices(admin_client, state="free", **H100)) == 14


def test_other_tenants_see_the_state_but_not_the_claim(admin_client, ns_client, fleet):
    status = allocate(admin_client, "secret-project", 1)
    other = ns_client("team-b")
    (device,) = devices(other, state="allocated")
    assert key(device) in held(status)
    assert device["allocation"] == {"state": "allocated", "claimCount": 1, "claims": []}
    (mine,) = devices(ns_client("team-a"), state="allocated")
    assert mine["allocation"]["claims"][0]["name"] == "secret-project"


@pytest.mark.parametrize("value", ["bogus", "allocated,Bogus", ""])
def test_an_unknown_state_is_a_400_naming_the_supported_ones(admin_client, fleet, value):
    resp = admin_client.get("/api/v1/devices", {"state": value})
    if not value:
        assert resp.status_code == 200  # an empty parameter is no filter
        return
    assert resp.status_code == 400, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    errors = resp.json()["errors"]
    assert errors and {e["field"] for e in errors} == {"state"}
    assert '"free", "allocated", "shared"' in errors[0]["reason"]


# --------------------------------------------------------------------------------------- taints from rules

def taint_rule(name: str, selector: dict | None, effect: str = "NoSchedule") -> dict:
    spec = {"taint": {"key": "example.com/maintenance", "value": name, "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": spec}


def test_taint_rules_show_on_the_devices_they_cover_with_their_name(admin_client, fleet):
    rule = taint_rule("drain-node-0", {"driver": "gpu.nvidia.com", "pool": "c1-h100-000"})
    assert admin_client.post("/api/v1/devicetainterules", rule, format="json").status_code == 201
    by_pool = {}
    for d in devices(admin_client, **H100):
        by_pool.setdefault(d["pool"], []).append(d)
    for d in by_pool["c1-h100-000"]:
        assert d["taints"] == [{"key": "example.com/maintenance", "value": "drain-node-0", "effect": "NoSchedule",
                                "source": {"kind": "DeviceTaintRule", "name": "drain-node-0", "scope": "fleet"}}]
    assert all(d["taints"] == [] for d in by_pool["c1-h100-001"])
    tainted = devices(admin_client, tainted="true")
    assert {d["pool"] for d in tainted} == {"c1-h100-000"} and len(tainted) == 8
    assert len(devices(admin_client, tainted="false", **H100)) == 8
    one = by_pool["c1-h100-000"][0]
    assert admin_client.get(f"/api/v1/devices/{one['id']}").json()["taints"] == one["taints"]


def test_the_engine_honours_the_same_taints(admin_client, fleet):
    rule = taint_rule("drain-node-0", {"driver": "gpu.nvidia.com", "pool": "c1-h100-000"})
    assert admin_client.post("/api/v1/devicetainterules", rule, format="json").status_code == 201
    status = allocate(admin_client, "eight", 8)
    assert status["node"] == "c1-h100-001"  # the whole tainted node was not an option
    assert {d["pool"] for d in devices(admin_client, state="allocated")} == {"c1-h100-001"}


def test_cluster_pushed_rules_and_selector_semantics(admin_client):
    load_fleet({"c2": [("h100", 1)]})
    body = admin_client.get("/api/v1/clusters/c2/inventory").json()
    body["deviceTaintRules"] = [
        taint_rule("one-gpu", {"driver": "gpu.nvidia.com", "pool": "c2-h100-000", "device": "gpu-3"}),
        taint_rule("no-selector", None),  # upstream: selects nothing
        taint_rule("other-driver", {"driver": "gpu.amd.com"}),
    ]
    assert admin_client.put("/api/v1/clusters/c2/inventory", body, format="json").status_code == 200
    tainted = devices(admin_client, tainted="true")
    assert [(d["name"], [t["source"]["name"] for t in d["taints"]]) for d in tainted] == [("gpu-3", ["one-gpu"])]
    assert tainted[0]["taints"][0]["source"]["scope"] == "cluster"
    # An empty selector matches every device of the cluster.
    body["deviceTaintRules"] = [taint_rule("everything", {}, effect="NoExecute")]
    assert admin_client.put("/api/v1/clusters/c2/inventory", body, format="json").status_code == 200
    assert len(devices(admin_client, tainted="true")) == len(devices(admin_client)) == 10
