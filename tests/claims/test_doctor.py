"""The manifest doctor through the API: ``POST /api/v1/convert`` and the 422s of the create endpoints, on a real
stored fleet. Every article fixture (tests/fixtures/articles) gets its expected outcome: a rewrite is what the
original's 422 carries, and POSTing it as given is accepted; skeletons come with an explanation; a right v1 claim
is placed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.db import connection

from claims.models import Phase, ResourceClaim
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services import doctor as doctor_services
from inventory.services.doctor import fleet_vocabulary
from scheduler.services import allocation
from tests.claims.fleet import load_fleet
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

ARTICLES = Path(__file__).resolve().parents[1] / "fixtures" / "articles"
NS = "/api/v1/namespaces/team-a"
ENDPOINTS = {"ResourceClaim": f"{NS}/resourceclaims", "ResourceClaimTemplate": f"{NS}/resourceclaimtemplates",
             "DeviceClass": "/api/v1/deviceclasses", "ResourceClass": "/api/v1/deviceclasses"}


def article(name: str) -> tuple[str, list[dict]]:
    text = (ARTICLES / name).read_text()
    expect = re.search(r"^# expect: (\w+)", text, re.M)
    assert expect, name
    return expect.group(1), list(yaml.safe_load_all(text))


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def convert(client, body) -> list[dict]:
    resp = client.post("/api/v1/convert", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()["items"]


def assert_422(resp) -> dict:
    assert resp.status_code == 422, resp.content
    assert resp["Content-Type"].startswith("application/problem+json")
    body = resp.json()
    assert body["errors"] and all({"field", "reason"} <= set(e) for e in body["errors"])
    return body


@pytest.mark.parametrize("name", sorted(p.name for p in ARTICLES.glob("*.yaml")))
def test_article(admin_client, small_fleet, name):
    expect, docs = article(name)
    diagnoses = convert(admin_client, docs if len(docs) > 1 else docs[0])
    assert len(diagnoses) == len(docs)
    for doc, diagnosis in zip(docs, diagnoses, strict=True):
        url = ENDPOINTS[doc["kind"]]
        if expect == "placed":
            assert diagnosis["outcome"] == "valid" and diagnosis["rewrite"] is None and diagnosis["changes"] == []
            assert admin_client.post(url, doc, format="json").status_code == 201
            run_rounds()
            assert ResourceClaim.objects.get(name=doc["metadata"]["name"]).phase == Phase.ALLOCATED
        elif expect == "rewrite":
            assert diagnosis["outcome"] == "rewrite", diagnosis
            problem = assert_422(admin_client.post(url, doc, format="json"))
            assert problem["rewrite"] == diagnosis["rewrite"]
            assert problem["changes"] == diagnosis["changes"] and problem["explanation"]
            created = admin_client.post(url, problem["rewrite"], format="json")
            assert created.status_code == 201, created.content
        else:
            assert diagnosis["outcome"] == "skeleton" and diagnosis["rewrite"] is None
            assert diagnosis["skeleton"]["apiVersion"] == "resource.k8s.io/v1" and diagnosis["explanation"]
            problem = assert_422(admin_client.post(url, doc, format="json"))
            assert problem["skeleton"] == diagnosis["skeleton"] and problem["explanation"]
            assert "rewrite" not in problem


def test_rewritten_article_claim_is_placed_on_big_gpus(admin_client, small_fleet):
    _, [doc] = article("v1-claim-v1beta1-shape.yaml")
    problem = assert_422(admin_client.post(ENDPOINTS["ResourceClaim"], doc, format="json"))
    assert admin_client.post(ENDPOINTS["ResourceClaim"], problem["rewrite"], format="json").status_code == 201
    run_rounds()
    claim = ResourceClaim.objects.get(name="training-gpus")
    assert claim.phase == Phase.ALLOCATED and len(claim.allocation["devices"]["results"]) == 2


def test_error_texts_are_unchanged_by_the_diagnosis(admin_client, small_fleet):
    """The 422 keeps its detail and errors[]; the doctor only adds members."""
    _, [doc] = article("v1-claim-v1beta1-shape.yaml")
    problem = assert_422(admin_client.post(ENDPOINTS["ResourceClaim"], doc, format="json"))
    fields = [e["field"] for e in problem["errors"]]
    assert fields == ["spec.devices.requests[0]"]
    assert "exactly one of `exactly` or `firstAvailable` is required" in problem["errors"][0]["reason"]
    assert problem["detail"].startswith("spec.devices.requests[0]: ")


def test_plain_mistakes_get_no_diagnosis(admin_client, small_fleet):
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "Bad_Name"},
           "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    problem = assert_422(admin_client.post(ENDPOINTS["ResourceClaim"], bad, format="json"))
    assert not {"rewrite", "skeleton", "changes", "explanation"} & set(problem)


@pytest.mark.parametrize("wrap", [lambda items: {"kind": "List", "items": items}, lambda items: {"items": items},
                                  lambda items: items], ids=["List", "items", "array"])
def test_batch_422_carries_a_diagnosis_per_item(admin_client, small_fleet, wrap):
    _, [old] = article("v1-claim-v1beta1-shape.yaml")
    _, [right] = article("v1-claim-correct.yaml")
    resp = admin_client.post(f"{NS}/resourceclaims/batch", wrap([right, old]), format="json")
    problem = assert_422(resp)
    assert [d["index"] for d in problem["diagnoses"]] == [1]
    assert problem["diagnoses"][0]["rewrite"]["metadata"]["name"] == "training-gpus"


def test_yaml_list_of_every_article(admin_client, small_fleet):
    docs = [doc for path in sorted(ARTICLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]
    text = yaml.safe_dump_all(docs)
    resp = admin_client.post("/api/v1/convert", text, content_type="application/yaml")
    assert resp.status_code == 200, resp.content
    outcomes = [d["outcome"] for d in resp.json()["items"]]
    assert outcomes == ["skeleton", "skeleton", "valid", "rewrite", "rewrite", "rewrite"]
    assert ResourceClaim.objects.count() == 0  # nothing stored


@pytest.mark.parametrize("body", [{"spec": {}}, [], ["text", 1], {"kind": "List", "items": "x"}, "text"])
def test_convert_refuses_what_is_not_a_kubernetes_object(admin_client, body):
    problem = assert_422(admin_client.post("/api/v1/convert", body, format="json"))
    assert problem["errors"][0]["field"] == ""


def test_convert_needs_a_principal_any_will_do(small_fleet):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    assert client_for(None).post("/api/v1/convert", pod, format="json").status_code == 401
    team = client_for(issue_token(kind=APIToken.NAMESPACE, namespaces=["team-a"])[1])
    items = convert(team, pod)
    assert items[0]["outcome"] == "unfixable" and "only knows DRA objects" in items[0]["explanation"]


def test_fleet_vocabulary_from_stored_devices(small_fleet):
    vocabulary = fleet_vocabulary()
    assert vocabulary.has("capacity", "gpu.nvidia.com", "memory")
    assert vocabulary.type_of("attributes", "gpu.nvidia.com", "productName") == "string"
    assert vocabulary.has("attributes", "resource.kubernetes.io", "pcieRoot")
    assert vocabulary.class_drivers["mig.nvidia.com"] == frozenset({"gpu.nvidia.com"})
    assert fleet_vocabulary() is vocabulary  # kept until the inventory or the classes change


def test_wrongly_shaped_requests_are_a_422_not_a_500(admin_client, small_fleet):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "odd"},
            "spec": {"devices": {"requests": 1}}}
    assert_422(admin_client.post(ENDPOINTS["ResourceClaim"], body, format="json"))
    assert convert(admin_client, body)[0]["outcome"] == "unfixable"


def test_an_ambiguous_name_gets_its_candidates_not_a_guess(admin_client, small_fleet):
    """Without a driver clause and with a class that names no driver, ``memory`` could be several domains'."""
    assert admin_client.post("/api/v1/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "anything"},
        "spec": {}}, format="json").status_code == 201
    sync_mixed_fleet()
    body = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "vague"},
            "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": "anything", "selectors": [
                {"cel": {"expression": 'device.attributes["memory"].quantity() >= quantity("40Gi")'}}]}]}}}
    problem = assert_422(admin_client.post(ENDPOINTS["ResourceClaim"], body, format="json"))
    assert "rewrite" not in problem and "several domains" in problem["explanation"]
    assert 'device.capacity["gpu.nvidia.com"].memory' in problem["explanation"]
    assert 'device.capacity["gpu.amd.com"].memory' in problem["explanation"]


def sync_mixed_fleet() -> None:
    """A second cluster with AMD GPUs, so that ``memory`` is published by two domains."""
    load_fleet({"c-amd": [("mi300x", 1)]})


def test_fleet_vocabulary_without_postgresql_reads_the_same(small_fleet, monkeypatch):
    """The embedded SQLite default reads the columns instead of asking for distinct keys: the same answer."""
    by_sql = fleet_vocabulary()
    doctor_services._memo.clear()
    monkeypatch.setattr(connection, "vendor", "sqlite")
    by_rows = fleet_vocabulary()
    assert by_rows is not by_sql
    assert by_rows.names == by_sql.names and by_rows.class_drivers == by_sql.class_drivers
