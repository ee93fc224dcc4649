"""The exact bodies of errors the services raise, at both doors: problem+json under /api/v1, a Kubernetes
``Status`` under /k8s. The services raise domain exceptions (``draservice.errors``) and each door maps them in
one place (``draservice.problems.exception_handler``, ``kube.status.translate``); these snapshots hold the
bodies clients already parse, whatever the mapping becomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.claims import fleet

# Transactional: the /k8s door's manifest doctor reads the fleet after the failed create rolled back, which a
# test wrapped in one transaction cannot show.
pytestmark = pytest.mark.django_db(transaction=True)

NS = "/api/v1/namespaces/team-a"
K8S_CLAIMS = "/k8s/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
RPSR = "/k8s/apis/resource.k8s.io/v1alpha3/resourcepoolstatusrequests"


def _rpsr(name: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "ResourcePoolStatusRequest",
        "metadata": {"name": name},
        "spec": {"driver": "gpu.nvidia.com"},
    }


def claim_already_exists(admin, tenant):
    admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("a"), format="json")
    return admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("a"), format="json")


def claim_unknown_device_class(admin, tenant):
    return admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("a", device_class="no.such.class"), format="json")


def claim_renewed_after_release(admin, tenant):
    admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("a"), format="json")
    admin.post(f"{NS}/resourceclaims/a/release")
    return admin.post(f"{NS}/resourceclaims/a/renew", {}, format="json")


def idempotency_key_reused(admin, tenant):
    admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("a"), format="json", HTTP_IDEMPOTENCY_KEY="run-1")
    return admin.post(f"{NS}/resourceclaims", fleet.gpu_claim("b"), format="json", HTTP_IDEMPOTENCY_KEY="run-1")


def events_uid_not_a_uuid(admin, tenant):
    return admin.get(f"{NS}/resourceclaims/a/events?uid=nope")


def default_queue_deleted(admin, tenant):
    admin.get("/api/v1/queues/default")  # the default queue exists once asked for
    return admin.delete("/api/v1/queues/default")


def device_class_already_exists(admin, tenant):
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {},
    }
    return admin.post("/api/v1/deviceclasses", body, format="json")


def usage_window_reversed(admin, tenant):
    return admin.get("/api/v1/usage?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z")


def defrag_plan_not_found(admin, tenant):
    return admin.post(f"/api/v1/defragmentation/plans/{'0' * 16}/apply")


def k8s_claim_already_exists(admin, tenant):
    admin.post(K8S_CLAIMS, fleet.gpu_claim("a"), format="json")
    return admin.post(K8S_CLAIMS, fleet.gpu_claim("a"), format="json")


def k8s_claim_unknown_device_class(admin, tenant):
    return admin.post(K8S_CLAIMS, fleet.gpu_claim("a", device_class="no.such.class"), format="json")


def k8s_pool_status_requests_over_quota(admin, tenant):
    admin.patch(f"{NS}/objectquota", {"spec": {"hard": {"resourcepoolstatusrequests": 1}}}, format="json")
    tenant.post(RPSR, _rpsr("q-0"), format="json")
    return tenant.post(RPSR, _rpsr("q-1"), format="json")


SNAPSHOTS = Path(__file__).parent / "fixtures" / "error_bodies.json"
CASES = {name: make for name, make in list(globals().items()) if name in json.loads(SNAPSHOTS.read_text())}


def test_every_snapshot_has_its_case():
    assert sorted(CASES) == sorted(json.loads(SNAPSHOTS.read_text())) and len(CASES) >= 10


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_body(case, admin_client, ns_client):
    """Status, content type and body exactly as recorded in ``fixtures/error_bodies.json`` (written by hand from
    a run before the services' exceptions became domain exceptions; a changed body is a changed API)."""
    fleet.load_device_classes()
    want = json.loads(SNAPSHOTS.read_text())[case]
    response = CASES[case](admin_client, ns_client("team-a"))
    assert (response.status_code, response["Content-Type"], json.loads(response.content)) == (
        want["status"], want["contentType"], want["body"])
