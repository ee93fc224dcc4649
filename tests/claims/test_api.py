"""The claims API without the worker: shapes, validation, immutability, ETags, idempotency, batches."""
from __future__ import annotations

import time

import pytest
import yaml

from claims.models import ClaimEvent, ResourceClaim
from tests.claims.fleet import gpu_claim

pytestmark = pytest.mark.django_db

URL = "/api/v1/namespaces/team-a/resourceclaims"


def test_create_returns_defaulted_v1_claim_pending(admin_client, classes):
    resp = admin_client.post(URL, gpu_claim("c1"), format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceClaim"
    assert body["metadata"]["namespace"] == "team-a" and body["metadata"]["uid"]
    exact = body["spec"]["devices"]["requests"][0]["exactly"]
    assert exact["allocationMode"] == "ExactCount" and exact["count"] == 1
    assert body["status"]["phase"] == "Pending"
    assert body["status"]["conditions"][0]["type"] == "Allocated"
    assert body["status"]["conditions"][0]["status"] == "False"
    assert resp["Location"].endswith("/resourceclaims/c1")
    got = admin_client.get(f"{URL}/c1")
    assert got.status_code == 200 and got["ETag"]
    assert got.json()["spec"] == body["spec"]
    assert [e.type for e in ClaimEvent.objects.filter(claim_name="c1")] == ["Created"]


def test_v1beta1_claim_is_converted_to_v1(admin_client, classes):
    beta1 = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "old"},
             "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}}
    resp = admin_client.post(URL, beta1, format="json")
    assert resp.status_code == 201, resp.content
    req = resp.json()["spec"]["devices"]["requests"][0]
    assert req == {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                              "allocationMode": "ExactCount"}}


def test_yaml_in_and_out(admin_client, classes):
    manifest = yaml.safe_dump(gpu_claim("from-yaml"))
    resp = admin_client.post(URL, manifest, content_type="application/yaml", HTTP_ACCEPT="application/yaml")
    assert resp.status_code == 201, resp.content
    assert resp["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(resp.content)["metadata"]["name"] == "from-yaml"


def test_generate_name(admin_client, classes):
    obj = gpu_claim("")
    obj["metadata"] = {"generateName": "ci-job-"}
    resp = admin_client.post(URL, obj, format="json")
    assert resp.status_code == 201
    assert resp.json()["metadata"]["name"].startswith("ci-job-") and len(resp.json()["metadata"]["name"]) == 12


@pytest.mark.parametrize("mutate, field", [
    (lambda o: o["spec"]["devices"]["requests"][0].update(name="Bad_Name"), "spec.devices.requests[0].name"),
    (lambda o: o["spec"]["devices"]["requests"][0]["exactly"].update(count=-1),
     "spec.devices.requests[0].exactly.count"),
    (lambda o: o["spec"]["devices"]["requests"][0]["exactly"].update(deviceClassName="no-such.example.com"),
     "spec.devices.requests[0].exactly.deviceClassName"),
    (lambda o: o["metadata"].update(name="UPPER"), "metadata.name"),
    (lambda o: o["metadata"].update(annotations={"draservice.io/lease-ttl": "forever"}),
     "metadata.annotations[draservice.io/lease-ttl]"),
    (lambda o: o["spec"]["devices"]["requests"][0]["exactly"].update(
        selectors=[{"cel": {"expression": "device.driver =="}}]),
     "spec.devices.requests[0].exactly.selectors[0].cel.expression"),
])
def test_invalid_claim_gets_4xx_with_field_path(admin_client, classes, mutate, field):
    obj = gpu_claim("bad")
    mutate(obj)
    resp = admin_client.post(URL, obj, format="json")
    assert resp.status_code == 422, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    assert field in [e["field"] for e in resp.json()["errors"]], resp.json()
    assert not ResourceClaim.objects.exists()


def test_garbage_bodies_are_4xx_not_500(admin_client, classes):
    for body in ([1, 2], "just a string", {"spec": "nope"}, {"spec": {"devices": {"requests": "x"}}},
                 {"metadata": [], "spec": {}}, {"apiVersion": "v1", "kind": "Pod"}):
        resp = admin_client.post(URL, body, format="json")
        assert 400 <= resp.status_code < 500, (body, resp.content)
    resp = admin_client.post(URL, "{not json", content_type="application/json")
    assert resp.status_code == 400


def test_duplicate_name_is_409(admin_client, classes):
    assert admin_client.post(URL, gpu_claim("dup"), format="json").status_code == 201
    resp = admin_client.post(URL, gpu_claim("dup"), format="json")
    assert resp.status_code == 409
    assert resp.json()["errors"][0]["field"] == "metadata.name"


def test_spec_is_immutable_labels_are_not(admin_client, classes):
    created = admin_client.post(URL, gpu_claim("imm"), format="json").json()
    changed = dict(created, spec={"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 4}}]}})
    resp = admin_client.put(f"{URL}/imm", changed, format="json")
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "spec"
    created["metadata"]["labels"] = {"team": "ml"}
    resp = admin_client.put(f"{URL}/imm", created, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["metadata"]["labels"] == {"team": "ml"}
    assert int(resp.json()["metadata"]["resourceVersion"]) == int(created["metadata"]["resourceVersion"]) + 1


def test_etag_and_resource_version_preconditions(admin_client, classes):
    admin_client.post(URL, gpu_claim("etag"), format="json")
    first = admin_client.get(f"{URL}/etag")
    etag = first["ETag"]
    ok = admin_client.patch(f"{URL}/etag", {"metadata": {"labels": {"a": "b"}}}, format="json", HTTP_IF_MATCH=etag)
    assert ok.status_code == 200, ok.content
    stale = admin_client.patch(f"{URL}/etag", {"metadata": {"labels": {"a": "c"}}}, format="json",
                               HTTP_IF_MATCH=etag)
    assert stale.status_code == 412
    old_rv = first.json()["metadata"]["resourceVersion"]
    body = dict(first.json())
    resp = admin_client.put(f"{URL}/etag", body, format="json")  # carries the old resourceVersion
    assert resp.status_code == 409 and old_rv != ok.json()["metadata"]["resourceVersion"]
    assert admin_client.post(f"{URL}/etag/release", HTTP_IF_MATCH=etag).status_code == 412
    assert ResourceClaim.objects.get(name="etag").labels == {"a": "b"}


def test_if_match_takes_weak_tags_and_lists_like_every_other_resource(admin_client, classes):
    """One If-Match for the whole API (inventory's rules): W/ is dropped, a list matches if any tag does."""
    admin_client.post(URL, gpu_claim("weak"), format="json")
    etag = admin_client.get(f"{URL}/weak")["ETag"]
    weak = admin_client.patch(f"{URL}/weak", {"metadata": {"labels": {"a": "1"}}}, format="json",
                              HTTP_IF_MATCH=f"W/{etag}")
    assert weak.status_code == 200, weak.content
    etag = weak["ETag"]
    listed = admin_client.patch(f"{URL}/weak", {"metadata": {"labels": {"a": "2"}}}, format="json",
                                HTTP_IF_MATCH=f'"stale-1", W/{etag}')
    assert listed.status_code == 200, listed.content
    stale = admin_client.patch(f"{URL}/weak", {"metadata": {"labels": {"a": "3"}}}, format="json",
                               HTTP_IF_MATCH=f'"stale-1", {etag}')
    assert stale.status_code == 412 and stale["Content-Type"].startswith("application/problem+json")
    assert admin_client.delete(f"{URL}/weak", HTTP_IF_MATCH="*").status_code == 200


def test_idempotency_key_gives_one_claim(admin_client, classes):
    obj = gpu_claim("")
    obj["metadata"] = {"generateName": "pipeline-"}
    first = admin_client.post(URL, obj, format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    again = admin_client.post(URL, obj, format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert ResourceClaim.objects.count() == 1
    other = admin_client.post(URL, gpu_claim("different"), format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert other.status_code == 422 and other.json()["errors"][0]["field"] == "Idempotency-Key"
    assert ResourceClaim.objects.count() == 1
    # A key is scoped to its namespace: another namespace may use the same one.
    elsewhere = admin_client.post("/api/v1/namespaces/team-b/resourceclaims", obj, format="json",
                                  HTTP_IDEMPOTENCY_KEY="run-42")
    assert elsewhere.status_code == 201 and ResourceClaim.objects.count() == 2


def test_failed_request_does_not_burn_the_idempotency_key(admin_client, classes):
    bad = gpu_claim("k1", count=-1)
    assert admin_client.post(URL, bad, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 422
    good = admin_client.post(URL, gpu_claim("k1"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert good.status_code == 201


def test_batch_is_all_or_nothing_with_item_paths(admin_client, classes):
    items = [gpu_claim(f"b{i}") for i in range(5)]
    items[3]["spec"]["devices"]["requests"][0]["exactly"]["count"] = -1
    resp = admin_client.post(f"{URL}/batch", {"items": items}, format="json")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "items[3].spec.devices.requests[0].exactly.count"
    assert not ResourceClaim.objects.exists()
    items[3] = gpu_claim("b3")
    resp = admin_client.post(f"{URL}/batch", {"items": items}, format="json")
    assert resp.status_code == 201, resp.content
    assert [i["metadata"]["name"] for i in resp.json()["items"]] == [f"b{i}" for i in range(5)]
    dup = admin_client.post(f"{URL}/batch", {"items": [gpu_claim("x1"), gpu_claim("x1")]}, format="json")
    assert dup.status_code == 422 and dup.json()["errors"][0]["field"] == "items[1].metadata.name"


def test_claim_named_batch_is_still_addressable(admin_client, classes):
    assert admin_client.post(URL, gpu_claim("batch"), format="json").status_code == 201
    assert admin_client.get(f"{URL}/batch").json()["metadata"]["name"] == "batch"
    assert admin_client.delete(f"{URL}/batch").status_code == 200
    assert admin_client.get(f"{URL}/batch").status_code == 404


def test_release_and_delete_of_pending_claim(admin_client, classes):
    admin_client.post(URL, gpu_claim("r1"), format="json")
    resp = admin_client.post(f"{URL}/r1/release")
    assert resp.status_code == 200 and resp.json()["status"]["phase"] == "Released"
    assert admin_client.post(f"{URL}/r1/release").status_code == 200  # idempotent
    assert admin_client.delete(f"{URL}/r1").status_code == 200
    assert admin_client.get(f"{URL}/r1").status_code == 404
    types = list(ClaimEvent.objects.filter(claim_name="r1").values_list("type", flat=True))
    assert types == ["Created", "Released", "Deleted"]
    events = admin_client.get(f"{URL}/r1/events")  # the claim is gone; its trail stays, and is reachable
    assert events.status_code == 200
    assert [e["type"] for e in events.json()["items"]] == ["Created", "Released", "Deleted"]


def test_wait_returns_after_timeout_while_pending(admin_client, classes):
    admin_client.post(URL, gpu_claim("w1"), format="json")
    start = time.monotonic()
    resp = admin_client.get(f"{URL}/w1?wait=300ms")
    assert resp.status_code == 200 and resp.json()["status"]["phase"] == "Pending"
    assert 0.25 < time.monotonic() - start < 3
    assert admin_client.get(f"{URL}/w1?wait=forever").status_code == 400


def test_list_filters_and_paging(admin_client, classes):
    admin_client.post(f"{URL}/batch", {"items": [gpu_claim(f"l{i}", labels={"n": str(i % 2)}) for i in range(5)]},
                      format="json")
    admin_client.post(f"{URL}/l0/release")
    page = admin_client.get(f"{URL}?limit=2").json()
    assert page["kind"] == "ResourceClaimList" and len(page["items"]) == 2 and page["metadata"]["continue"]
    rest = admin_client.get(f"{URL}?limit=10&continue={page['metadata']['continue']}").json()
    assert len(rest["items"]) == 3
    assert len(admin_client.get(f"{URL}?phase=Pending").json()["items"]) == 4
    assert len(admin_client.get(f"{URL}?label=n=1").json()["items"]) == 2


def test_unauthenticated_is_401(classes):
    from rest_framework.test import APIClient

    assert APIClient().get(URL).status_code == 401


def test_consumer_entry_names_are_labels_unique_in_the_list_and_a_list_as_a_name_is_a_field_error(admin_client,
                                                                                                    classes):
    entries = [{"name": n, "resourceClaimName": "c1"} for n in ("a", "a", "B_", ["x"])]
    consumer = {"kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": entries}}
    resp = admin_client.post("/api/v1/namespaces/team-a/consumers", consumer, format="json")
    assert resp.status_code == 422, resp.content
    errors = resp.json()["errors"]
    assert [e["field"] for e in errors] == [f"spec.resourceClaims[{i}].name" for i in (1, 2, 3)], errors
    assert errors[0]["reason"] == 'Duplicate value: "a"'
