"""The Queue API: CRUD in JSON and YAML, ETag/If-Match, admins write and everyone reads, the default queue,
and every bad input as a 422/409 problem+json with field paths (and nothing half-stored)."""
from __future__ import annotations

import base64

import pytest
import yaml

from queues.models import Queue, QueueNamespace
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

Q = "/api/v1/queues"


def fields(resp) -> dict[str, str]:
    assert resp["Content-Type"].startswith("application/problem+json"), resp.content
    out: dict[str, str] = {}
    for e in resp.json()["errors"]:
        out[e["field"]] = f'{out[e["field"]]}; {e["reason"]}' if e["field"] in out else e["reason"]
    return out


def test_default_queue_always_exists(admin_client):
    resp = admin_client.get(f"{Q}/default")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["kind"] == "Queue" and body["apiVersion"] == "draservice.io/v1alpha1"
    assert body["spec"]["quotas"] == [] and "parent" not in body["spec"]
    assert admin_client.delete(f"{Q}/default").status_code == 409


def test_crud_json_yaml_etag(admin_client, ns_client):
    resp = admin_client.post(Q, queue_body("team-a", namespaces=["a"], gpus=8, borrowing=4), format="json")
    assert resp.status_code == 201, resp.content
    assert resp["Location"].endswith("/queues/team-a")
    etag = resp["ETag"]
    got = admin_client.get(f"{Q}/team-a")
    assert got["ETag"] == etag
    assert got.json()["spec"]["quotas"][0]["devices"] == {"nominal": 8, "borrowingLimit": 4}
    assert got.json()["spec"]["weight"] == 1 and got.json()["spec"]["preemption"]["graceSeconds"] == 30
    assert admin_client.get(f"{Q}/team-a", HTTP_IF_NONE_MATCH=etag).status_code == 304
    # A reader (a namespace token) reads, but may not write.
    reader = ns_client("a")
    assert reader.get(Q).status_code == 200
    assert [i["metadata"]["name"] for i in reader.get(Q).json()["items"]] == ["default", "team-a"]
    assert reader.patch(f"{Q}/team-a", {"spec": {"weight": 2}}, format="json").status_code == 403
    # PATCH with a stale If-Match: 412, nothing changed.
    patched = admin_client.patch(f"{Q}/team-a", {"spec": {"weight": 2}}, format="json", HTTP_IF_MATCH=etag)
    assert patched.status_code == 200 and patched.json()["spec"]["weight"] == 2
    assert patched["ETag"] != etag
    stale = admin_client.patch(f"{Q}/team-a", {"spec": {"weight": 3}}, format="json", HTTP_IF_MATCH=etag)
    assert stale.status_code == 412
    assert Queue.objects.get(name="team-a").weight == 2
    # PUT in YAML replaces the whole spec.
    doc = yaml.safe_dump(queue_body("team-a", namespaces=["a", "a2"], gpus=16))
    put = admin_client.put(f"{Q}/team-a", doc, content_type="application/yaml", HTTP_ACCEPT="application/yaml")
    assert put.status_code == 200, put.content
    assert yaml.safe_load(put.content)["spec"]["namespaces"] == ["a", "a2"]
    assert sorted(QueueNamespace.objects.values_list("namespace", flat=True)) == ["a", "a2"]
    # PUT of a new name creates it.
    assert admin_client.put(f"{Q}/team-b", queue_body("team-b", gpus=1), format="json").status_code == 201
    assert admin_client.delete(f"{Q}/team-b", HTTP_IF_MATCH='"99"').status_code == 412
    assert admin_client.delete(f"{Q}/team-b").status_code == 204
    assert admin_client.get(f"{Q}/team-b").status_code == 404


def test_webhook_secret_is_write_only(admin_client, settings):
    settings.WEBHOOK_ALLOWED_TARGETS = ["https://hooks.example.com"]
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    body = queue_body("team-a", gpus=1, preemption={"webhook": {"url": "https://hooks.example.com/a",
                                                                 "secret": secret}})
    resp = admin_client.post(Q, body, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["spec"]["preemption"]["webhook"] == {"url": "https://hooks.example.com/a", "secretSet": True}
    assert secret not in admin_client.get(Q).content.decode()
    # What a GET shows goes back in a PUT unchanged: the stored secret stays.
    got = admin_client.get(f"{Q}/team-a").json()
    assert admin_client.put(f"{Q}/team-a", got, format="json").status_code == 200
    assert Queue.objects.get(name="team-a").spec["preemption"]["webhook"]["secret"] == secret


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"parent": "nowhere"}, "spec.parent", "does not exist"),
    ({"quotas": [{"devices": {"nominal": 1}}]}, "spec.quotas[0].deviceClassName", "Required"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": -1}}]},
     "spec.quotas[0].devices.nominal", "greater than or equal to 0"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "counters": {"memory": {"nominal": "-5Gi"}}}]},
     "spec.quotas[0].counters[memory].nominal", "greater than or equal to 0"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "gpus": {"nominal": 1}}]}, "spec.quotas[0].gpus",
     "Unsupported value"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": 1, "borrowingLimt": 1}}]},
     "spec.quotas[0].devices.borrowingLimt", "Unsupported value"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": 2, "lendingLimit": 3}}]},
     "spec.quotas[0].devices.lendingLimit", "must not exceed nominal"),
    ({"quotas": [{"deviceClassName": "gpu.nvidia.com", "devices": {"nominal": "many"}}]},
     "spec.quotas[0].devices.nominal", "non-negative integer"),
    ({"weight": 0}, "spec.weight", "greater than 0"),
    ({"maxPriority": -1}, "spec.maxPriority", "greater than or equal to 0"),
    ({"preemption": {"withinQueue": "Sometimes"}}, "spec.preemption.withinQueue", "Unsupported value"),
    ({"preemption": {"webhook": {"url": "https://evil.example.org/x"}}}, "spec.preemption.webhook.url",
     "allow-list"),
    ({"preemption": {"webhook": {"url": "https://evil.example.org/x", "secret": "s" * 32}}},
     "spec.preemption.webhook.secret", "whsec_"),
    ({"namespaces": ["Bad_NS"]}, "spec.namespaces[0]", "RFC 1123"),
])
def test_bad_queue_is_422_with_field_path(admin_client, spec, field, words):
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "bad"}, "spec": spec}
    resp = admin_client.post(Q, body, format="json")
    assert resp.status_code == 422, resp.content
    errors = fields(resp)
    assert field in errors and words in errors[field], errors
    assert not Queue.objects.filter(name="bad").exists()


def test_cycle_namespace_twice_and_leaf_rules(admin_client):
    assert admin_client.post(Q, queue_body("org"), format="json").status_code == 201
    assert admin_client.post(Q, queue_body("team-a", parent="org", namespaces=["a"]), format="json").status_code == 201
    # org -> team-a -> org would be a cycle.
    resp = admin_client.patch(f"{Q}/org", {"spec": {"parent": "team-a"}}, format="json")
    assert resp.status_code == 422 and "cycle" in fields(resp)["spec.parent"]
    assert admin_client.patch(f"{Q}/org", {"spec": {"parent": "org"}}, format="json").status_code == 422
    assert Queue.objects.get(name="org").parent_id is None
    # A namespace listed by two queues.
    resp = admin_client.post(Q, queue_body("team-b", namespaces=["b", "a"]), format="json")
    assert resp.status_code == 422 and 'queue "team-a"' in fields(resp)["spec.namespaces[1]"]
    assert not Queue.objects.filter(name="team-b").exists() and not QueueNamespace.objects.filter(namespace="b")
    # Only leaves take claims: team-a lists namespaces, so it cannot be a parent; org has children.
    resp = admin_client.post(Q, queue_body("sub", parent="team-a"), format="json")
    assert resp.status_code == 422 and "only leaf queues" in fields(resp)["spec.parent"]
    resp = admin_client.patch(f"{Q}/org", {"spec": {"namespaces": ["o"]}}, format="json")
    assert resp.status_code == 422 and "children" in fields(resp)["spec.namespaces"]
    # A parent cannot be deleted under its children; the default queue has no parent.
    assert admin_client.delete(f"{Q}/org").status_code == 409
    resp = admin_client.patch(f"{Q}/default", {"spec": {"parent": "org"}}, format="json")
    assert resp.status_code == 422 and "spec.parent" in fields(resp)
    # The name in the body must match the URL's.
    resp = admin_client.put(f"{Q}/org", queue_body("other"), format="json")
    assert resp.status_code == 422 and "metadata.name" in fields(resp)


def test_duplicate_create_is_409(admin_client):
    assert admin_client.post(Q, queue_body("team-a"), format="json").status_code == 201
    resp = admin_client.post(Q, queue_body("team-a"), format="json")
    assert resp.status_code == 409 and "already exists" in resp.json()["detail"]
