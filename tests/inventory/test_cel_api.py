"""POST /api/v1/cel/validate and /api/v1/cel/match: what a platform engineer tries before creating a class."""
import pytest

pytestmark = pytest.mark.django_db

H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'


@pytest.fixture
def fleet(cluster_factory, real_slices):
    _, client = cluster_factory("east")
    resp = client.put("/api/v1/clusters/east/inventory", {"resourceSlices": real_slices, "nodes": []}, format="json")
    assert resp.status_code == 200, resp.content
    return real_slices


def test_validate_accepts_a_real_selector(admin_client):
    resp = admin_client.post("/api/v1/cel/validate", {"expression": H100}, format="json")
    assert resp.status_code == 200
    assert resp.json()["valid"] is True


def test_validate_explains_quantity_comparison(admin_client):
    expr = 'device.capacity["gpu.nvidia.com"].memory >= quantity("40Gi")'
    body = admin_client.post("/api/v1/cel/validate", {"expression": expr}, format="json").json()
    assert body["valid"] is False
    text = " ".join((i.get("message") or "") + " " + (i.get("hint") or "") for i in body["issues"])
    assert "compareTo" in text or "isGreaterThan" in text


def test_match_counts_stored_devices_by_cluster_and_product(admin_client, fleet):
    expected = sum(
        1 for s in fleet for d in s["spec"].get("devices", [])
        if s["spec"]["driver"] == "gpu.nvidia.com"
        and d.get("attributes", {}).get("productName", {}).get("string") == "NVIDIA H100 80GB HBM3"
    )
    assert expected > 0
    body = admin_client.post("/api/v1/cel/match", {"expression": H100}, format="json").json()
    assert body["matches"] == expected
    assert body["exhaustive"] is True
    assert {(r["cluster"], r["product"]) for r in body["byClusterAndProduct"]} == {("east", "NVIDIA H100 80GB HBM3")}


def test_match_with_device_class_applies_the_class_selectors(admin_client, fleet):
    admin_client.put("/api/v1/deviceclasses/only-amd", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "only-amd"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.amd.com"'}}]}}, format="json")
    body = admin_client.post("/api/v1/cel/match", {"expression": H100, "deviceClassName": "only-amd"},
                             format="json").json()
    assert body["matches"] == 0  # an NVIDIA product name never matches the AMD class


def test_match_against_a_given_device(admin_client):
    device = {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}}
    body = admin_client.post("/api/v1/cel/match", {"expression": H100, "device": device}, format="json").json()
    assert body["matches"] == 1
    missing = admin_client.post("/api/v1/cel/match", {
        "expression": 'device.attributes["gpu.nvidia.com"].uuid == "x"', "device": device}, format="json").json()
    assert missing["matches"] == 0 and "no such key" in missing["error"]["message"]


def test_match_rejects_a_bad_expression_with_problem_json(admin_client):
    resp = admin_client.post("/api/v1/cel/match", {"expression": "device.driver == "}, format="json")
    assert resp.status_code == 422
    assert resp["Content-Type"].startswith("application/problem+json")
    assert resp.json()["errors"][0]["field"] == "expression"


def test_match_unknown_device_class_is_422(admin_client, fleet):
    resp = admin_client.post("/api/v1/cel/match", {"expression": H100, "deviceClassName": "nope"}, format="json")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "deviceClassName"


def test_cel_endpoints_need_a_token():
    from rest_framework.test import APIClient
    assert APIClient().post("/api/v1/cel/validate", {"expression": "true"}, format="json").status_code == 401
