"""The claim POST answered without DRF's dispatch (claims.api.fastpost) answers as DRF's view does.

Each case is sent twice: as the common request (Bearer token, JSON, no Accept), which the fast path answers,
and with an Accept header DRF negotiates to the same JSON renderer but the fast path leaves to DRF. Status,
body and headers must agree (the generated uid and timestamps aside)."""
from __future__ import annotations

import json

import pytest
import yaml

from claims.api import fastpost
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services import clusters
from tests.claims.fleet import gpu_claim
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/namespaces/team-a/resourceclaims"
DRF_ACCEPT = "application/json, */*"  # the same renderer for DRF, not the fast path's
HEADERS = ("Content-Type", "Allow", "Vary", "WWW-Authenticate", "Idempotent-Replayed")


@pytest.fixture
def taken(monkeypatch):
    """How many POSTs the fast path answered."""
    calls = []
    real = fastpost._post

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fastpost, "_post", spy)
    return calls


def _client(kind: str):
    if kind == "admin":
        return client_for(issue_token(kind=APIToken.ADMIN)[1])
    if kind == "bad-token":
        return client_for("dra_nope_nope")
    if kind == "other-namespace":
        return client_for(issue_token(kind=APIToken.NAMESPACE, namespaces=["elsewhere"])[1])
    if kind == "read-only":
        return client_for(issue_token(kind=APIToken.ADMIN, read_only=True)[1])
    cluster, _ = clusters.create_cluster(name="c1", labels={}, with_token=False)
    return client_for(issue_token(kind=APIToken.CLUSTER, cluster=cluster)[1])


def _shape(resp, name: str) -> tuple:
    """What must agree: the status, the body (byte for byte for an error; a created claim's uid and times
    aside), the Location and the headers DRF sets."""
    text = resp.content.decode().replace(name, "NAME")
    body = json.loads(text) if text else None
    if resp.status_code == 201:
        text = ""
        for key in ("uid", "creationTimestamp"):
            body["metadata"].pop(key)
        for condition in body["status"]["conditions"]:
            condition.pop("lastTransitionTime", None)
    return (resp.status_code, text, body, resp.get("Location", "").replace(name, "NAME"),
            {h: resp.get(h) for h in HEADERS})


def _bad_name(name: str) -> dict:
    claim = gpu_claim(name)
    claim["spec"]["devices"]["requests"][0]["name"] = "NOT_A_LABEL"
    return claim


CASES = {
    "created": ("admin", gpu_claim),
    "invalid (422)": ("admin", _bad_name),
    "a List (400)": ("admin", lambda name: {"kind": "List", "items": [gpu_claim(name)]}),
    "unknown class (422)": ("admin", lambda name: gpu_claim(name, device_class="nope.example.com")),
    "bad token (401)": ("bad-token", gpu_claim),
    "other namespace (403)": ("other-namespace", gpu_claim),
    "read-only token (403)": ("read-only", gpu_claim),
    "cluster token, unpinned claim (403)": ("cluster", gpu_claim),
    "cluster token, invalid claim (422 before 403)": ("cluster", _bad_name),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_and_drf_answers_agree(case, classes, taken):
    kind, body = CASES[case]
    client = _client(kind)
    fast = client.post(URL, body("fast-1"), format="json")
    assert len(taken) == 1
    drf = client.post(URL, body("drf-1"), format="json", HTTP_ACCEPT=DRF_ACCEPT)
    assert len(taken) == 1
    assert _shape(fast, "fast-1") == _shape(drf, "drf-1")


def test_unparsable_empty_and_taken_bodies_agree(admin_client, classes, taken):
    for body in (b"{not json", b"", b'"a string"'):
        fast = admin_client.post(URL, body, content_type="application/json")
        drf = admin_client.post(URL, body, content_type="application/json", HTTP_ACCEPT=DRF_ACCEPT)
        assert _shape(fast, "x") == _shape(drf, "x"), body
    assert admin_client.post(URL, gpu_claim("dup"), format="json").status_code == 201
    fast = admin_client.post(URL, gpu_claim("dup"), format="json")
    drf = admin_client.post(URL, gpu_claim("dup"), format="json", HTTP_ACCEPT=DRF_ACCEPT)
    assert fast.status_code == 409 and _shape(fast, "dup") == _shape(drf, "dup")
    assert len(taken) == 5


def test_an_idempotency_key_is_one_claim_whichever_path_answers(admin_client, classes, taken):
    first = admin_client.post(URL, gpu_claim("once"), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = admin_client.post(URL, gpu_claim("once"), format="json", HTTP_IDEMPOTENCY_KEY="k1",
                              HTTP_ACCEPT=DRF_ACCEPT)
    assert first.status_code == again.status_code == 201 and "Idempotent-Replayed" not in first
    assert again["Idempotent-Replayed"] == "true" and again.json()["metadata"]["uid"] == first.json()["metadata"]["uid"]
    other = admin_client.post(URL, gpu_claim("twice"), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 422 and "Idempotency-Key" in other.json()["detail"]
    assert len(taken) == 2


def test_other_requests_go_to_drf(admin_client, classes, taken):
    assert admin_client.post(f"{URL}?dryRun=All", gpu_claim("dry"), format="json").status_code == 201
    assert admin_client.post(URL, yaml.safe_dump(gpu_claim("y")), content_type="application/yaml").status_code == 201
    assert admin_client.post(URL, gpu_claim("as-yaml"), format="json", HTTP_ACCEPT="application/yaml")["Content-Type"] \
        .startswith("application/yaml")
    assert admin_client.get(URL).status_code == 200
    assert taken == []
