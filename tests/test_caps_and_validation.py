"""What one tenant can pile up or slip past validation, through the real HTTP doors (/api/v1 and /k8s).

Count caps answer like a Kubernetes ResourceQuota (403 Forbidden, "exceeded quota: ..."), adjustable per
namespace by an admin at run time; rate caps answer 429 with Retry-After; a namespace the token cannot read is
403 whether or not it exists; and every input the careless-client tests found accepted gets a 4xx naming the
field (or, for a quota on an absent class, a Warning, as Kubernetes accepts references to absent classes).
"""
from __future__ import annotations

import pytest

from claims.models import ResourceClaim
from inventory.services.clusters import create_cluster
from tests.claims import fleet
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db, pytest.mark.live]

API = "/api/v1/namespaces/team-a"
K8S = "/k8s/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
RPSR = "/k8s/apis/resource.k8s.io/v1alpha3/resourcepoolstatusrequests"


def rpsr(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourcePoolStatusRequest",
            "metadata": {"name": name}, "spec": {"driver": "gpu.nvidia.com"}}


def test_pending_claims_cap_is_a_resource_quota_403_and_admins_change_it_at_run_time(admin_client, ns_client):
    fleet.load_device_classes()  # no cluster: every claim stays Pending
    tenant = ns_client("team-a")
    shown = tenant.get(f"{API}/objectquota").json()
    assert shown["status"]["hard"] == {"pending-claims": 5000, "resourcepoolstatusrequests": 100}
    assert tenant.patch(f"{API}/objectquota", {"spec": {"hard": {"pending-claims": 2}}},
                        format="json").status_code == 403  # only admins change caps
    changed = admin_client.patch(f"{API}/objectquota", {"spec": {"hard": {"pending-claims": 2}}}, format="json")
    assert changed.status_code == 200 and changed.json()["status"]["hard"]["pending-claims"] == 2
    for name in ("p-1", "p-2"):
        assert tenant.post(f"{API}/resourceclaims", fleet.gpu_claim(name), format="json").status_code == 201
    over = tenant.post(f"{API}/resourceclaims", fleet.gpu_claim("p-3"), format="json")
    assert over.status_code == 403, over.content
    assert "exceeded quota: pending-claims, limit 2" in over.json()["detail"]
    door = tenant.post(K8S, fleet.gpu_claim("p-3"), format="json")
    assert door.status_code == 403 and door.json()["reason"] == "Forbidden"
    assert "exceeded quota: pending-claims, limit 2" in door.json()["message"]
    assert not ResourceClaim.objects.filter(name="p-3").exists()
    assert tenant.get(f"{API}/objectquota").json()["status"]["used"]["pending-claims"] == 2
    # Another namespace is not affected; the admin gives the defaults back.
    assert ns_client("team-b").post("/api/v1/namespaces/team-b/resourceclaims", fleet.gpu_claim("b"),
                                    format="json").status_code == 201
    assert admin_client.delete(f"{API}/objectquota").status_code == 204
    assert tenant.post(f"{API}/resourceclaims", fleet.gpu_claim("p-3"), format="json").status_code == 201
    bad = admin_client.put(f"{API}/objectquota", {"spec": {"hard": {"pending-claims": -1, "pods": 3}}},
                           format="json")
    assert bad.status_code == 422
    assert {e["field"] for e in bad.json()["errors"]} == {"spec.hard[pending-claims]", "spec.hard[pods]"}


def test_pool_status_requests_have_a_count_cap_and_a_rate_cap(admin_client, ns_client, settings):
    tenant = ns_client("team-a")
    admin_client.patch(f"{API}/objectquota", {"spec": {"hard": {"resourcepoolstatusrequests": 2}}}, format="json")
    for i in range(2):
        assert tenant.post(RPSR, rpsr(f"q-{i}"), format="json").status_code == 201
    over = tenant.post(RPSR, rpsr("q-2"), format="json")
    assert over.status_code == 403 and over.json()["reason"] == "Forbidden"
    assert "exceeded quota: resourcepoolstatusrequests, limit 2" in over.json()["message"]
    # The ObjectQuota shows the /k8s door's count (registered by the door: the caps import no door).
    assert tenant.get(f"{API}/objectquota").json()["status"]["used"] == {"pending-claims": 0,
                                                                       "resourcepoolstatusrequests": 2}
    # Rate: a namespace under its count cap still may not ask faster than the rate cap.
    admin_client.delete(f"{API}/objectquota")
    settings.POOL_STATUS_REQUESTS_PER_MINUTE = 3
    assert tenant.post(RPSR, rpsr("q-3"), format="json").status_code == 201
    fast = tenant.post(RPSR, rpsr("q-4"), format="json")
    assert fast.status_code == 429 and 1 <= int(fast["Retry-After"]) <= 60
    assert admin_client.post(RPSR, rpsr("q-admin"), format="json").status_code == 201  # admins: no cap


def test_a_namespace_the_token_cannot_read_is_forbidden_whether_it_exists_or_not(ns_client):
    fleet.load_device_classes()
    team_b = ns_client("team-b")
    assert team_b.post("/api/v1/namespaces/team-b/resourceclaims", fleet.gpu_claim("x"),
                       format="json").status_code == 201
    tenant = ns_client("team-a")
    answers = {name: tenant.get(f"/k8s/api/v1/namespaces/{name}") for name in ("team-b", "no-such-ns")}
    for name, resp in answers.items():
        assert resp.status_code == 403, resp.content
        body = resp.json()
        assert body["reason"] == "Forbidden" and body["details"] == {"name": name, "kind": "namespaces"}
        assert body["message"].startswith(f'namespaces "{name}" is forbidden')
    assert team_b.get("/k8s/api/v1/namespaces/team-b").status_code == 200


def test_queue_quota_on_an_unknown_class_warns_and_a_41_digit_nominal_is_refused(admin_client):
    fleet.load_device_classes()
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"},
            "spec": {"quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": 4}},
                                {"deviceClassName": "nvidia.com-typo", "devices": {"nominal": 4}}]}}
    made = admin_client.post("/api/v1/queues", body, format="json")
    assert made.status_code == 201, made.content
    assert made["Warning"] == ('299 - "spec.quotas[1].deviceClassName: DeviceClass nvidia.com-typo not found; '
                               'this quota covers no device until it exists"')
    huge = "1" + "0" * 40 + "Ei"
    bad = admin_client.patch("/api/v1/queues/q", {"spec": {"quotas": [
        {"deviceClassName": "gpu.nvidia.com", "capacity": {"memory": {"nominal": huge}}}]}},
        content_type="application/merge-patch+json")
    assert bad.status_code == 422, bad.content
    (error,) = bad.json()["errors"]
    assert error["field"] == "spec.quotas[0].capacity[memory].nominal" and "2^63-1" in error["reason"]
    # Queue PATCH takes application/merge-patch+json, as claims do.
    ok = admin_client.patch("/api/v1/queues/q", b'{"spec": {"weight": 2}}', content_type="application/merge-patch+json")
    assert ok.status_code == 200 and ok.json()["spec"]["weight"] == 2


@pytest.mark.parametrize("value, reason", [("-8Gi", "greater than or equal to 0"), ("1" + "0" * 499, "2^63-1"),
                                           ("1e999999999", "2^63-1")])
def test_a_push_with_a_negative_or_huge_capacity_is_refused_naming_the_field(value, reason):
    _, secret = create_cluster(name="c1", labels={})
    device = {"name": "gpu-0", "capacity": {"memory": {"value": value}}}
    body = {"nodes": [{"name": "n0"}], "resourceSlices": [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "n0-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "n0", "devices": [device],
                 "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1}}}]}
    resp = client_for(secret).put("/api/v1/clusters/c1/inventory", body, format="json")
    assert 400 <= resp.status_code < 500, resp.content
    (error,) = resp.json()["errors"]
    assert error["field"].endswith("devices[0].capacity[memory].value") and reason in error["reason"]


YAML_CLAIM = b"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: dup
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        deviceClassName: gpu.nvidia.com
"""


def test_yaml_duplicate_keys_are_refused_under_strict_and_warned_otherwise(admin_client):
    fleet.load_device_classes()
    strict = admin_client.post(f"{K8S}?fieldValidation=Strict", YAML_CLAIM, content_type="application/yaml")
    assert strict.status_code == 400, strict.content
    body = strict.json()
    assert 'line 11: key "deviceClassName" already set in map' in body["message"]
    assert body["details"]["causes"][0]["field"] == "deviceClassName"
    warned = admin_client.post(K8S, YAML_CLAIM, content_type="application/yaml")
    assert warned.status_code == 201 and "already set in map" in warned["Warning"]


def test_a_json_patch_removing_metadata_is_a_400_naming_it(admin_client):
    fleet.load_device_classes()
    assert admin_client.post(K8S, fleet.gpu_claim("m"), format="json").status_code == 201
    resp = admin_client.patch(f"{K8S}/m", b'[{"op": "remove", "path": "/metadata"}]',
                              content_type="application/json-patch+json")
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["reason"] == "BadRequest" and body["details"]["causes"][0]["field"] == "metadata"
    assert ResourceClaim.objects.get(name="m").spec["devices"]["requests"][0]["name"] == "gpu"
