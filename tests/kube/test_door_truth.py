"""``dryRun=All`` at both doors (DRF's test client): the answer is the object as it would be stored, the verdict
a ``Warning`` header, and nothing is kept (every table's row count and the change log's max id unchanged);
any other value is a 400 in each door's error shape. Label selectors on every list and deletecollection; the
manifest doctor's fix in warnings; no create overwrites; the queue columns of claims and queues."""
from __future__ import annotations

import json
import re

import pytest
from django.apps import apps
from django.db.models import Max

from claims.services import claims as claim_services
from draservice.models import Change
from queues.services import queues as queue_services
from tests.claims import fleet

K8S = "/k8s/apis/resource.k8s.io/v1/namespaces/team-c/resourceclaims"
API = "/api/v1/namespaces/team-c/resourceclaims"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def snapshot() -> dict:
    """Row count of every table, and the change log's highest id."""
    counts = {m._meta.db_table: m.objects.count() for m in apps.get_models() if m._meta.managed}
    counts["change log max seq"] = Change.objects.aggregate(top=Max("seq"))["top"]
    return counts


@pytest.fixture
def admin(admin_client):
    fleet.load_fleet({"c1": [("h100", 1)]})
    queue_services.create_queue({"metadata": {"name": "team-c"}, "spec": {"namespaces": ["team-c"], "quotas": [
        {"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": 2, "borrowingLimit": 0}}]}})
    claim_services.create_claims("team-c", [fleet.gpu_claim("held", count=2, annotations={
        "draservice.io/lease-ttl": "10m"})])
    return admin_client


def test_a_dry_run_create_answers_the_object_and_the_verdict_and_keeps_nothing(admin):
    before = snapshot()
    body = fleet.gpu_claim("", count=4)
    body["metadata"] = {"generateName": "job-"}
    for url in (f"{K8S}?dryRun=All", f"{API}?dryRun=All"):
        response = admin.post(url, body, format="json")
        assert response.status_code == 201, response.content
        obj = response.json()
        meta = obj["metadata"]
        assert meta["name"].startswith("job-") and len(meta["name"]) == 9
        assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"] == ""
        assert obj["status"]["queue"] == "team-c"
        assert "ETag" not in response
        warning = response["Warning"]
        assert warning.startswith('299 - "would wait for quota in team-c: gpu.nvidia.com: 0 of 2 nominal in use, '
                                  'may borrow 0, the claim asks 4')
    assert snapshot() == before


def test_a_dry_run_asks_for_no_work_and_keeps_no_idempotency_key(admin, django_capture_on_commit_callbacks):
    before = snapshot()
    with django_capture_on_commit_callbacks() as dry:
        response = admin.post(f"{API}?dryRun=All", fleet.gpu_claim("once"), format="json",
                              HTTP_IDEMPOTENCY_KEY="job-1")
    assert response.status_code == 201 and dry == []  # no allocator kick, no wake-up
    assert snapshot() == before
    with django_capture_on_commit_callbacks() as real:
        again = admin.post(API, fleet.gpu_claim("once"), format="json", HTTP_IDEMPOTENCY_KEY="job-1")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again and len(real) >= 1


def test_dry_run_update_patch_delete_and_deletecollection_keep_nothing(admin):
    current = admin.get(f"{K8S}/held").json()
    version = current["metadata"]["resourceVersion"]
    before = snapshot()
    patched = admin.patch(f"{K8S}/held?dryRun=All", json.dumps({"metadata": {"labels": {"team": "c"}}}),
                          content_type="application/merge-patch+json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["metadata"]["labels"] == {"team": "c"}
    assert patched.json()["metadata"]["resourceVersion"] == version  # upstream answers the current version
    api_version = admin.get(f"{API}/held").json()["metadata"]["resourceVersion"]
    api_patched = admin.patch(f"{API}/held?dryRun=All", json.dumps({"metadata": {"labels": {"team": "c"}}}),
                              content_type="application/merge-patch+json")
    assert api_patched.status_code == 200, api_patched.content
    assert api_patched.json()["metadata"]["resourceVersion"] == api_version
    current["metadata"]["labels"] = {"x": "y"}
    assert admin.put(f"{K8S}/held?dryRun=All", current, format="json").status_code == 200
    deleted = admin.delete(f"{K8S}/held", {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]},
                           format="json")
    assert deleted.status_code == 200 and deleted.json()["metadata"]["name"] == "held"
    everything = admin.delete(f"{K8S}?dryRun=All")
    assert [o["metadata"]["name"] for o in everything.json()["items"]] == ["held"]
    assert admin.post(f"{API}/held/release?dryRun=All").status_code in (200, 202)
    assert snapshot() == before
    assert admin.get(f"{K8S}/held").json()["metadata"].get("labels") in (None, {})


def test_any_other_dry_run_value_is_a_400_in_each_doors_shape(admin):
    before = snapshot()
    k8s = admin.post(f"{K8S}?dryRun=Some", fleet.gpu_claim("x"), format="json")
    assert k8s.status_code == 400
    assert (k8s.json()["kind"], k8s.json()["reason"]) == ("Status", "BadRequest")
    assert k8s.json()["message"] == 'dryRun: Invalid value: "Some": supported values: "All"'
    api = admin.post(f"{API}?dryRun=true", fleet.gpu_claim("x"), format="json")
    assert api.status_code == 400 and api["Content-Type"] == "application/problem+json"
    assert api.json()["errors"] == [{"field": "dryRun", "reason": 'Invalid value: "true": supported values: "All"'}]
    assert snapshot() == before


def test_a_dry_run_still_validates(admin):
    bad = fleet.gpu_claim("bad", device_class="nope.example.com")
    response = admin.post(f"{K8S}?dryRun=All", bad, format="json")
    assert response.status_code == 422 and "nope.example.com" in response.json()["message"]
    exists = admin.post(f"{K8S}?dryRun=All", fleet.gpu_claim("held"), format="json")
    assert exists.status_code == 409 and exists.json()["reason"] == "AlreadyExists"


@pytest.mark.parametrize("plural,selector,expected", [
    ("resourceslices", "draservice.io/cluster=c1", 2),
    ("resourceslices", "draservice.io/cluster=other", 0),
    ("resourceslices", "!draservice.io/cluster", 0),
    ("deviceclasses", "foo=bar", 0),
    ("deviceclasses", "!draservice.io/cluster", 8),
])
def test_label_selectors_on_the_fleets_objects(admin, plural, selector, expected):
    response = admin.get(f"/k8s/apis/resource.k8s.io/v1/{plural}", {"labelSelector": selector})
    assert response.status_code == 200, response.content
    assert len(response.json()["items"]) == expected


def test_label_selectors_on_events_namespaces_and_queues(admin):
    assert len(admin.get("/k8s/api/v1/namespaces/team-c/events", {"labelSelector": "a=b"}).json()["items"]) == 0
    assert len(admin.get("/k8s/api/v1/namespaces/team-c/events", {"labelSelector": "!a"}).json()["items"]) == 1
    assert admin.get("/k8s/api/v1/namespaces", {"labelSelector": "a=b"}).json()["items"] == []
    queues = admin.get("/k8s/apis/draservice.io/v1alpha1/queues", {"labelSelector": "a notin (b)"}).json()
    assert [q["metadata"]["name"] for q in queues["items"]] == ["default", "team-c"]


def test_deletecollection_with_a_selector_and_a_body_without_content_type(admin):
    for name, team in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        body = fleet.gpu_claim(name)
        body["metadata"]["labels"] = {"team": team}
        response = admin.generic("POST", K8S, data=json.dumps(body), content_type="")
        assert response.status_code == 201, response.content
    deleted = admin.delete(f"{K8S}?labelSelector=team%3Da")
    assert sorted(o["metadata"]["name"] for o in deleted.json()["items"]) == ["a1", "a2"]
    left = [o["metadata"]["name"] for o in admin.get(K8S).json()["items"]]
    assert left == ["held", "b1"]


def test_the_doctors_fix_is_a_warning_and_in_the_422s_message(admin):
    old = fleet.gpu_claim("old")
    old["spec"]["devices"]["requests"] = [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]
    refused = admin.post(f"{K8S}?fieldValidation=Strict", old, format="json")
    assert refused.status_code == 422
    message = refused.json()["message"]
    assert message.startswith('ResourceClaim.resource.k8s.io "old" is invalid: [')
    assert "; rewritten for resource.k8s.io/v1 (1 change): spec.devices.requests[0]: deviceClassName, count sat " \
           "directly on the request" in message and "\n" not in message
    assert refused["Warning"].startswith('299 - "the manifest doctor would change spec.devices.requests[0]: '
                                         'deviceClassName, count sat directly on the request in v1beta1')
    beta = {**old, "apiVersion": "resource.k8s.io/v1beta1"}
    stored = admin.post("/k8s/apis/resource.k8s.io/v1beta1/namespaces/team-c/resourceclaims", beta, format="json")
    assert stored.status_code == 201
    assert "the manifest doctor would change apiVersion: v1beta1 is an older DRA API version" in stored["Warning"]


def test_a_create_never_overwrites_and_a_selector_change_is_said(admin):
    from inventory.models import Cluster, DeviceClass

    classic = {"apiVersion": "resource.k8s.io/v1alpha2", "kind": "ResourceClass",
               "metadata": {"name": "gpu.nvidia.com"}, "driverName": "gpu.nvidia.com"}
    sketched = admin.post("/k8s/apis/resource.k8s.io/v1alpha2/resourceclasses", classic, format="json")
    assert sketched.status_code == 422 and "details.skeleton" in sketched.json()["message"]
    assert 'a DeviceClass \\"gpu.nvidia.com\\" already exists in the fleet' in sketched["Warning"]
    classes = "/k8s/apis/resource.k8s.io/v1/deviceclasses"
    skeleton = sketched.json()["details"]["skeleton"]
    assert admin.post(classes, skeleton, format="json").json()["reason"] == "AlreadyExists"
    DeviceClass.objects.create(cluster=Cluster.objects.get(name="c1"), name="local.example.com",
                               object={"metadata": {"name": "local.example.com"}, "spec": {}})
    shadow = admin.post(classes, {**skeleton, "metadata": {"name": "local.example.com"}}, format="json")
    assert shadow.status_code == 409 and "(published by cluster c1)" in shadow.json()["message"]
    changed = admin.patch(f"{classes}/gpu.nvidia.com", json.dumps({"spec": skeleton["spec"]}),
                          content_type="application/merge-patch+json")
    assert changed.status_code == 200
    assert 'deviceclass \\"gpu.nvidia.com\\": spec.selectors replaced (were [' in changed["Warning"]


def test_a_plain_http_request_without_a_token_is_told_to_use_https(client, db):
    response = client.get("/k8s/apis/resource.k8s.io/v1/resourceslices")
    assert response.status_code == 401
    assert "this is plain HTTP, where kubectl sends no token" in response.json()["message"]
    assert "var/kubeconfig" in response.json()["message"]


def test_claims_show_queue_position_and_eta_and_queues_nominal_used_pending(admin):
    from scheduler.services import allocation

    allocation.allocate_round()
    claim_services.create_claims("team-c", [fleet.gpu_claim("next", count=2)])
    allocation.allocate_round()
    status = admin.get(f"{K8S}/next").json()["status"]
    assert (status["queue"], status["positionInQueue"], status["reason"]) == ("team-c", 1, "WaitingForQuota")
    assert status["estimatedStartTime"]
    table = admin.get(K8S, HTTP_ACCEPT=TABLE).json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "State", "Cluster", "Node", "Devices", "Age",
                                                               "Queue", "Position", "ETA", "Reason"]
    rows = {r["cells"][0]: r["cells"] for r in table["rows"]}
    assert rows["held"][1] == "Allocated" and rows["held"][6:9] == ["team-c", "<none>", "<none>"]
    assert rows["next"][6:8] == ["team-c", 1] and re.fullmatch(r"in (9m\d*s?|10m)", rows["next"][8])
    queues = admin.get("/k8s/apis/draservice.io/v1alpha1/queues", HTTP_ACCEPT=TABLE).json()
    assert [c["name"] for c in queues["columnDefinitions"]] == ["Name", "Nominal", "Used", "Pending", "Age",
                                                                "Borrowing"]
    cells = {r["cells"][0]: r["cells"] for r in queues["rows"]}
    assert cells["team-c"][:4] == ["team-c", "gpu.nvidia.com=2", "gpu.nvidia.com=2", 1]
    assert cells["team-c"][5] == "gpu.nvidia.com=0"
