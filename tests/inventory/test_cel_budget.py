"""Issue 12 through the HTTP API: what can be known at creation is refused at creation (a selector too
expensive to run, a claim over the per-claim device limit), and CEL requests are bounded (cel/match)."""
import time

import pytest

from dra.cel import MAX_SELECTOR_COST, UPSTREAM_MAX_SELECTOR_COST, compile_expression
from inventory.services import selectors as selector_service

pytestmark = pytest.mark.django_db

L1000 = "[" + ",".join(str(i) for i in range(1000)) + "]"
HOSTILE = (f"{L1000}.all(x, {L1000}.all(y, (has(device.attributes['gpu.nvidia.com'].uuid) ? "
           "device.attributes['gpu.nvidia.com'].uuid : 'z').size() + x + y > 0))")
# Accepted (its estimate is within the budget), and close to it on every device.
L75 = "[" + ",".join(str(i) for i in range(75)) + "]"
EXPENSIVE = f'{L75}.all(x, {L75}.all(y, device.attributes["gpu.nvidia.com"].uuid.size() + x + y > 0))'
NS = "/api/v1/namespaces/team-a"
EXPR_PATH = "spec.devices.requests[0].exactly.selectors[0].cel.expression"


def claim(name="c", count=1, expression=None):
    exact = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if expression:
        exact["selectors"] = [{"cel": {"expression": expression}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}}}


def device_class(name, expression):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


@pytest.fixture
def fleet(cluster_factory, real_slices):
    _, client = cluster_factory("east")
    nvidia = device_class("gpu.nvidia.com", 'device.driver == "gpu.nvidia.com"')
    body = {"resourceSlices": real_slices, "nodes": [], "deviceClasses": [nvidia]}
    resp = client.put("/api/v1/clusters/east/inventory", body, format="json")
    assert resp.status_code == 200, resp.content
    return client


def assert_problem(resp, field):
    assert resp.status_code == 422, resp.content
    assert resp["Content-Type"].startswith("application/problem+json")
    errors = resp.json()["errors"]
    assert field in [e["field"] for e in errors], errors
    return next(e["reason"] for e in errors if e["field"] == field)


def test_estimates_are_what_the_docs_say():
    compiled = compile_expression(EXPENSIVE)
    assert compiled.max_cost <= MAX_SELECTOR_COST < compile_expression(HOSTILE).max_cost
    assert compile_expression(HOSTILE).upstream_max_cost > UPSTREAM_MAX_SELECTOR_COST


# --- claims -----------------------------------------------------------------------------------------------

def test_claim_with_the_hostile_selector_is_refused_with_the_estimate_and_the_budget(fleet, ns_client):
    client = ns_client("team-a")
    start = time.monotonic()
    reason = assert_problem(client.post(f"{NS}/resourceclaims", claim(expression=HOSTILE), format="json"), EXPR_PATH)
    assert time.monotonic() - start < 5
    assert reason.startswith("Forbidden: too complex, exceeds cost limit: estimated rule cost exceeds budget by factor")
    assert f"budget {MAX_SELECTOR_COST:,}" in reason and "estimated cost 21,015,011" in reason
    assert client.post(f"{NS}/resourceclaims", claim(expression=EXPENSIVE), format="json").status_code == 201


@pytest.mark.parametrize("count", [64, 1_000_000_000])
def test_claim_over_the_device_limit_is_refused_on_every_path(fleet, ns_client, count):
    client = ns_client("team-a")
    field = "spec.devices.requests[0].exactly.count"
    reason = assert_problem(client.post(f"{NS}/resourceclaims", claim(count=count), format="json"), field)
    assert reason == f"Invalid value: {count}: {count} exceeds the claim limit of 32"
    batch = client.post(f"{NS}/resourceclaims/batch", {"items": [claim("ok"), claim("big", count=count)]},
                        format="json")
    assert batch.status_code == 422, batch.content
    assert any(e["field"].endswith(field) and e["field"].startswith("items[1]") for e in batch.json()["errors"])
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": claim(count=count)["spec"]}}
    assert_problem(client.post(f"{NS}/resourceclaimtemplates", template, format="json"), f"spec.{field}")
    assert client.get(f"{NS}/resourceclaims").json()["items"] == []


# --- DeviceClasses ----------------------------------------------------------------------------------------

def test_device_class_with_the_hostile_selector_is_refused(admin_client, cluster_factory):
    reason = assert_problem(admin_client.put("/api/v1/deviceclasses/hostile", device_class("hostile", HOSTILE),
                                             format="json"), "spec.selectors[0].cel.expression")
    assert reason.startswith("Forbidden: too complex, exceeds cost limit")
    _, agent = cluster_factory("west")
    pushed = agent.put("/api/v1/clusters/west/inventory", {"deviceClasses": [device_class("hostile", HOSTILE)]},
                       format="json")
    assert "Forbidden: too complex" in assert_problem(pushed, "deviceClasses[0].spec.selectors[0].cel.expression")


def test_a_cluster_push_is_held_to_the_api_servers_test_not_ours(admin_client, cluster_factory):
    ten = "[" + ",".join(str(i) for i in range(10)) + "]"
    between = f"{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, a + b + c + d >= 0))))"
    compiled = compile_expression(between)
    assert compiled.upstream_max_cost <= UPSTREAM_MAX_SELECTOR_COST < compiled.max_cost * 10
    assert compiled.max_cost > MAX_SELECTOR_COST
    _, agent = cluster_factory("west")
    resp = agent.put("/api/v1/clusters/west/inventory", {"deviceClasses": [device_class("between", between)]},
                     format="json")
    assert resp.status_code == 200, resp.content  # its API server accepted it: refusing would stop the sync
    assert_problem(admin_client.put("/api/v1/deviceclasses/between", device_class("between", between),
                                    format="json"), "spec.selectors[0].cel.expression")


# --- cel/validate and cel/match ---------------------------------------------------------------------------

def test_validate_reports_the_estimate(admin_client):
    body = admin_client.post("/api/v1/cel/validate", {"expression": HOSTILE}, format="json").json()
    assert body["valid"] is False
    assert body["estimatedCost"] == compile_expression(HOSTILE).max_cost and body["costLimit"] == MAX_SELECTOR_COST
    assert body["kubernetesEstimatedCost"] == 17_014_011 and body["kubernetesCostLimit"] == 1_000_000
    assert "exceeds budget" in body["issues"][0]["message"]
    fine = admin_client.post("/api/v1/cel/validate", {"expression": 'device.driver == "x.io"'}, format="json").json()
    assert fine["valid"] is True and fine["estimatedCost"] == 4 and fine["kubernetesEstimatedCost"] == 3


def test_match_refuses_the_hostile_selector_at_once(admin_client, fleet):
    for body in ({"expression": HOSTILE}, {"expression": HOSTILE, "deviceClassName": "gpu.nvidia.com"},
                 {"expression": HOSTILE, "device": {"driver": "gpu.nvidia.com"}}):
        start = time.monotonic()
        reason = assert_problem(admin_client.post("/api/v1/cel/match", body, format="json"), "expression")
        assert time.monotonic() - start < 5
        assert "exceeds budget" in reason and f"budget {MAX_SELECTOR_COST:,}" in reason


def test_match_shares_one_budget_among_all_evaluations(admin_client, fleet, monkeypatch):
    # Every NVIDIA GPU has its own uuid, so each is a distinct shape costing close to the per-evaluation limit:
    # the request stops when its budget is used up and says so, instead of running for minutes.
    monkeypatch.setattr(selector_service, "REQUEST_COST_BUDGET", 3 * MAX_SELECTOR_COST)
    start = time.monotonic()
    resp = admin_client.post("/api/v1/cel/match", {"expression": EXPENSIVE, "deviceClassName": "gpu.nvidia.com"},
                             format="json")
    assert time.monotonic() - start < 10
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["truncated"] is True and body["exhaustive"] is False
    assert "budget" in body["truncatedReason"]
    assert body["costUnits"] <= 3 * MAX_SELECTOR_COST + MAX_SELECTOR_COST
    assert body["estimatedCost"] == compile_expression(EXPENSIVE).max_cost


def test_match_on_one_device_beyond_the_declared_sizes_is_stopped_by_the_count(admin_client):
    expr = f'{L75}.all(i, device.attributes["d.example.com"].s.contains("zz"))'
    device = {"driver": "d.example.com", "attributes": {"s": {"string": "a" * 1_000_000}}}
    body = admin_client.post("/api/v1/cel/match", {"expression": expr, "device": device}, format="json").json()
    assert body["matches"] == 0
    assert body["error"]["reason"] == ("operation cancelled: actual cost limit exceeded "
                                       f"(more than {MAX_SELECTOR_COST} cost units)")
