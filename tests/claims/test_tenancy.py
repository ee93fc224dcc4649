"""Namespaces are tenants: a namespace token reads and writes only its own namespaces' claims."""
from __future__ import annotations

from datetime import timedelta

import pytest

from claims.models import ResourceClaim
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.services.clusters import create_cluster
from tests.claims.fleet import gpu_claim
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

A = "/api/v1/namespaces/team-a"
B = "/api/v1/namespaces/team-b"


@pytest.fixture
def claims_in_both(admin_client, classes):
    for ns in (A, B):
        assert admin_client.post(f"{ns}/resourceclaims", gpu_claim("job"), format="json").status_code == 201
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": gpu_claim("x")["spec"]}}
    assert admin_client.post(f"{B}/resourceclaimtemplates", template, format="json").status_code == 201


def test_namespace_token_cannot_touch_another_namespace(ns_client, claims_in_both):
    client = ns_client("team-a")
    assert client.get(f"{A}/resourceclaims/job").status_code == 200
    forbidden = [
        client.get(f"{B}/resourceclaims/job"),
        client.get(f"{B}/resourceclaims/does-not-exist"),  # 403 too: existence is not revealed
        client.get(f"{B}/resourceclaims"),
        client.get(f"{B}/resourceclaims/job/explain"),
        client.get(f"{B}/resourceclaims/job/events"),
        client.post(f"{B}/resourceclaims", gpu_claim("intruder"), format="json"),
        client.post(f"{B}/resourceclaims/batch", {"items": [gpu_claim("intruder")]}, format="json"),
        client.put(f"{B}/resourceclaims/job", gpu_claim("job"), format="json"),
        client.patch(f"{B}/resourceclaims/job", {"metadata": {"labels": {"x": "y"}}}, format="json"),
        client.post(f"{B}/resourceclaims/job/release"),
        client.post(f"{B}/resourceclaims/job/renew"),
        client.delete(f"{B}/resourceclaims/job"),
        client.get(f"{B}/resourceclaimtemplates/t"),
        client.delete(f"{B}/resourceclaimtemplates/t"),
        client.post(f"{B}/consumers", {"metadata": {"name": "p"}, "spec": {"resourceClaims": [
            {"name": "g", "resourceClaimTemplateName": "t"}]}}, format="json"),
    ]
    for resp in forbidden:
        assert resp.status_code == 403, (resp.request["PATH_INFO"], resp.request["REQUEST_METHOD"], resp.content)
        assert resp["Content-Type"] == "application/problem+json"
    claim = ResourceClaim.objects.get(namespace__name="team-b", name="job")
    assert claim.phase == "Pending" and claim.labels == {} and claim.resource_version == 1
    assert not ResourceClaim.objects.filter(name="intruder").exists()


def test_cross_namespace_lists_only_show_own(ns_client, admin_client, claims_in_both):
    client = ns_client("team-a")
    items = client.get("/api/v1/resourceclaims").json()["items"]
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items] == [("team-a", "job")]
    assert [n["name"] for n in client.get("/api/v1/namespaces").json()["items"]] == ["team-a"]
    assert len(admin_client.get("/api/v1/resourceclaims").json()["items"]) == 2
    assert [n["name"] for n in admin_client.get("/api/v1/namespaces").json()["items"]] == ["team-a", "team-b"]


def test_token_for_several_namespaces(ns_client, claims_in_both):
    client = ns_client("team-a", "team-b")
    assert client.get(f"{B}/resourceclaims/job").status_code == 200
    assert client.post(f"{B}/resourceclaims", gpu_claim("mine"), format="json").status_code == 201


def test_read_only_token_cannot_write(ns_client, claims_in_both):
    client = ns_client("team-a", read_only=True)
    assert client.get(f"{A}/resourceclaims/job").status_code == 200
    for resp in (client.post(f"{A}/resourceclaims", gpu_claim("new"), format="json"),
                 client.post(f"{A}/resourceclaims/job/release"),
                 client.delete(f"{A}/resourceclaims/job"),
                 client.patch(f"{A}/resourceclaims/job", {"metadata": {"labels": {"a": "b"}}}, format="json")):
        assert resp.status_code == 403, resp.content
        assert "read-only" in resp.json()["detail"]
    assert ResourceClaim.objects.get(namespace__name="team-a", name="job").phase == "Pending"


def test_expired_and_bad_tokens_are_401(claims_in_both):
    _, secret = issue_token(kind=APIToken.NAMESPACE, namespaces=["team-a"], expires_in=timedelta(seconds=-1))
    assert client_for(secret).get(f"{A}/resourceclaims/job").status_code == 401
    assert client_for("dra_nope_nope").get(f"{A}/resourceclaims/job").status_code == 401


def test_cluster_token_writes_only_claims_pinned_to_its_cluster(claims_in_both):
    _, secret = create_cluster(name="edge-1", labels={})
    agent = client_for(secret)
    pinned = gpu_claim("edge-1.job", annotations={"draservice.io/allowed-clusters": "name=edge-1"})
    assert agent.post(f"{A}/resourceclaims", pinned, format="json").status_code == 201
    other = gpu_claim("elsewhere", annotations={"draservice.io/allowed-clusters": "name=edge-2"})
    assert agent.post(f"{A}/resourceclaims", other, format="json").status_code == 403
    assert agent.post(f"{A}/resourceclaims", gpu_claim("unpinned"), format="json").status_code == 403
    assert agent.get(f"{B}/resourceclaims/job").status_code == 200  # the agent reads (to follow claims)
    assert agent.delete(f"{B}/resourceclaims/job").status_code == 403
    assert agent.delete(f"{A}/resourceclaims/edge-1.job").status_code == 200
