"""An all-namespaces watch shows a tenant only what its list shows: DELETED tombstones included.

A tombstone carries the deleted claim's name, uid, spec (selector text), cluster and node; before, it skipped
the namespace filter every other event passes, so tenant a's ``kubectl get resourceclaims -A -w`` heard of
tenant b's deletions. Also: the label and field selectors apply to tombstones as to lists, and a negative
``timeoutSeconds`` is a 400 naming the parameter.
"""
from __future__ import annotations

import json

import pytest

from draservice import changes
from tests.claims import fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

ALL = "/k8s/apis/resource.k8s.io/v1/resourceclaims"


def ns_url(ns: str) -> str:
    return f"/k8s/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def claim(name: str, **labels) -> dict:
    body = fleet.gpu_claim(name)
    if labels:
        body["metadata"]["labels"] = labels
    return body


def events(client, url: str, **params) -> list[dict]:
    response = client.get(url, {"watch": "1", "timeoutSeconds": "1", **params})
    assert response.status_code == 200, response.content
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def test_a_tenants_all_namespaces_watch_never_carries_another_tenants_tombstones(ns_client):
    fleet.load_device_classes()
    changes.seal()
    changes.seal()  # past the seqs of rows earlier tests truncated (a gap that never fills)
    tenant_a, tenant_b = ns_client("team-a"), ns_client("team-b")
    for client, ns, name, labels in ((tenant_a, "team-a", "a-1", {"app": "x"}), (tenant_a, "team-a", "a-2", {}),
                                     (tenant_b, "team-b", "b-secret", {"app": "x"})):
        assert client.post(ns_url(ns), claim(name, **labels), format="json").status_code == 201
    listed = tenant_a.get(ALL).json()
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a-1", "a-2"]
    rv = listed["metadata"]["resourceVersion"]
    for client, ns, name in ((tenant_b, "team-b", "b-secret"), (tenant_a, "team-a", "a-1"),
                             (tenant_a, "team-a", "a-2")):
        assert client.delete(f"{ns_url(ns)}/{name}").status_code == 200

    seen = events(tenant_a, ALL, resourceVersion=rv)
    deleted = [(e["object"]["metadata"]["namespace"], e["object"]["metadata"]["name"]) for e in seen
               if e["type"] == "DELETED"]
    assert deleted == [("team-a", "a-1"), ("team-a", "a-2")]
    assert b"b-secret" not in json.dumps(seen).encode()
    # Selectors apply to tombstones as to lists.
    labelled = events(tenant_a, ALL, resourceVersion=rv, labelSelector="app=x")
    assert [e["object"]["metadata"]["name"] for e in labelled if e["type"] == "DELETED"] == ["a-1"]
    named = events(tenant_a, ALL, resourceVersion=rv, fieldSelector="metadata.name=a-2")
    assert [e["object"]["metadata"]["name"] for e in named if e["type"] == "DELETED"] == ["a-2"]
    # Tenant b still hears of its own deletion (and only of it).
    theirs = events(tenant_b, ALL, resourceVersion=rv)
    assert [e["object"]["metadata"]["name"] for e in theirs if e["type"] == "DELETED"] == ["b-secret"]


def test_a_negative_watch_timeout_is_a_400_naming_it(ns_client):
    response = ns_client("team-a").get(ns_url("team-a"), {"watch": "1", "timeoutSeconds": "-5"})
    assert response.status_code == 400
    body = response.json()
    assert body["kind"] == "Status" and body["reason"] == "BadRequest" and "timeoutSeconds" in body["message"]
