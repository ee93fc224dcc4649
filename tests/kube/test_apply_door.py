"""Server-side apply at the /k8s door, answered as kube-apiserver answers it: ``fieldManager`` required (422 on
``PatchOptions``), ``force`` only with apply, create on apply (201), a conflict as a 409 ``Status`` whose causes
name the field and manager, an unchanged apply keeping the resourceVersion, updates recorded as ``Update``
entries, a body's managedFields replacing the stored ones, and a dry-run apply keeping nothing."""
from __future__ import annotations

import json

import pytest

from kube.models import ManagedFields
from tests.claims import fleet

QUEUES = "/k8s/apis/draservice.io/v1alpha1/queues"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
def admin(admin_client):
    fleet.load_fleet({"c1": [("h100", 2)]})
    fleet.load_device_classes()
    return admin_client


def queue(weight: int = 2, **spec) -> str:
    return json.dumps({"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "ml"},
                       "spec": {"namespaces": ["team-a"], "weight": weight, **spec}})


def apply(client, body: str, query: str = "fieldManager=kubectl", name: str = "ml"):
    return client.generic("PATCH", f"{QUEUES}/{name}?{query}", body, content_type=APPLY)


def test_field_manager_is_required_and_force_is_for_apply_only(admin):
    missing = apply(admin, queue(), "")
    assert missing.status_code == 422 and missing.json()["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch')
    assert missing.json()["details"] == {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
        {"reason": "FieldValueRequired", "message": "Required value: is required for apply patch",
         "field": "fieldManager"}]}
    assert apply(admin, queue()).status_code == 201
    forced = admin.patch(f"{QUEUES}/ml?force=true", {"spec": {"weight": 3}}, format="json")
    assert forced.status_code == 422 and forced.json()["message"].endswith(
        "force: Forbidden: may not be specified for non-apply patch")
    assert not ManagedFields.objects.filter(name="ml").exclude(entries__0__manager="kubectl").exists()


def test_create_conflict_force_and_an_unchanged_apply(admin):
    created = apply(admin, queue())
    assert created.status_code == 201, created.json()
    fields = created.json()["metadata"]["managedFields"]
    assert [(f["manager"], f["operation"], f["fieldsV1"]) for f in fields] == [
        ("kubectl", "Apply", {"f:spec": {"f:namespaces": {'v:"team-a"': {}}, "f:weight": {}}})]
    version = created.json()["metadata"]["resourceVersion"]
    again = apply(admin, queue())
    assert again.status_code == 200 and again.json()["metadata"]["resourceVersion"] == version
    assert again.json()["metadata"]["managedFields"] == fields
    conflict = apply(admin, queue(5), "fieldManager=other")
    assert conflict.status_code == 409 and conflict.json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Conflict",
        "code": 409, "message": 'Apply failed with 1 conflict: conflict with "kubectl": .spec.weight',
        "details": {"causes": [{"reason": "FieldManagerConflict", "message": 'conflict with "kubectl"',
                                "field": ".spec.weight"}]}}
    assert admin.get(f"{QUEUES}/ml").json()["spec"]["weight"] == 2
    forced = apply(admin, queue(5), "fieldManager=other&force=true")
    assert forced.status_code == 200 and forced.json()["spec"]["weight"] == 5
    assert forced.json()["metadata"]["resourceVersion"] != version
    owners = {f["manager"]: f["fieldsV1"]["f:spec"] for f in forced.json()["metadata"]["managedFields"]}
    assert owners == {"kubectl": {"f:namespaces": {'v:"team-a"': {}}},
                      "other": {"f:namespaces": {'v:"team-a"': {}}, "f:weight": {}}}


def test_updates_are_recorded_and_a_bodys_managed_fields_replace_them(admin):
    apply(admin, queue())
    patched = admin.generic("PATCH", f"{QUEUES}/ml?fieldManager=kubectl-edit", json.dumps(
        {"spec": {"priority": 4}}), content_type="application/merge-patch+json")
    assert patched.status_code == 200, patched.json()
    fields = patched.json()["metadata"]["managedFields"]
    assert [(f["manager"], f["operation"], f["apiVersion"]) for f in fields] == [
        ("kubectl", "Apply", "draservice.io/v1alpha1"), ("kubectl-edit", "Update", "draservice.io/v1alpha1")]
    assert fields[1]["fieldsV1"] == {"f:spec": {"f:priority": {}}}
    reset = admin.generic("PATCH", f"{QUEUES}/ml", json.dumps([
        {"op": "test", "path": "/metadata/resourceVersion", "value": patched.json()["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/metadata/managedFields", "value": fields[:1]}]),
        content_type="application/json-patch+json")
    assert reset.status_code == 200, reset.json()
    assert [f["manager"] for f in reset.json()["metadata"]["managedFields"]] == ["kubectl"]
    # Nobody owns .spec.priority now: another manager's apply of it is no conflict.
    assert apply(admin, queue(9, priority=7), "fieldManager=third").status_code == 409  # .spec.weight still is
    assert apply(admin, queue(2, priority=7), "fieldManager=third").status_code == 200


def test_a_dry_run_apply_keeps_nothing(admin):
    dry = apply(admin, queue(), "fieldManager=kubectl&dryRun=All")
    assert dry.status_code == 201 and dry.json()["metadata"]["managedFields"][0]["manager"] == "kubectl"
    assert admin.get(f"{QUEUES}/ml").status_code == 404 and not ManagedFields.objects.exists()


def test_a_namespace_token_applies_claims_in_its_namespace_only(admin, ns_client):
    team = ns_client("team-a")
    body = json.dumps(fleet.gpu_claim("applied"))
    url = "/k8s/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/applied?fieldManager=flux"
    created = team.generic("PATCH", url.format("team-a"), body, content_type=APPLY)
    assert created.status_code == 201, created.json()
    assert created.json()["metadata"]["managedFields"][0]["manager"] == "flux"
    again = team.generic("PATCH", url.format("team-a"), body, content_type=APPLY)
    assert again.json()["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]
    assert team.generic("PATCH", url.format("team-b"), body, content_type=APPLY).status_code == 403
