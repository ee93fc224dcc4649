"""Who may do what with a claim: one test per token kind and verb (draservice.permissions states the rules).

The claim ``job`` of namespace ``team`` is not pinned to a cluster and is allocated on ``c1``; ``c1``'s agent
may release or delete it (its pods went away) but may not edit or renew it, and creates only claims pinned to
``c1``. Another namespace's token is refused before any lookup: it learns nothing, not even whether the claim
exists.
"""
from __future__ import annotations

import pytest

from claims.models import Phase, ResourceClaim
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.models import Cluster
from tests.claims.fleet import gpu_claim, load_fleet
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team/resourceclaims"
KINDS = ("admin", "own-namespace", "other-namespace", "cluster-of-claim", "other-cluster", "anonymous")
# Expected status per verb, in KINDS order.
TABLE = {
    "get": (200, 200, 403, 200, 200, 401),
    "create": (201, 201, 403, 403, 403, 401),
    "create-pinned-c1": (201, 201, 403, 201, 403, 401),
    "edit": (200, 200, 403, 403, 403, 401),
    "renew": (200, 200, 403, 403, 403, 401),
    "release": (200, 200, 403, 200, 403, 401),
    "delete": (200, 200, 403, 200, 403, 401),
    "read-missing": (404, 404, 403, 404, 404, 401),
    "release-missing": (404, 404, 403, 404, 404, 401),  # a foreign namespace learns nothing
}
PINNED_C1 = {"draservice.io/allowed-clusters": "name=c1"}


def _client(kind: str):
    if kind == "anonymous":
        return client_for(None)
    if kind == "admin":
        return client_for(issue_token(kind=APIToken.ADMIN)[1])
    if kind in ("own-namespace", "other-namespace"):
        ns = "team" if kind == "own-namespace" else "elsewhere"
        return client_for(issue_token(kind=APIToken.NAMESPACE, namespaces=[ns])[1])
    cluster = Cluster.objects.get(name="c1" if kind == "cluster-of-claim" else "c2")
    return client_for(issue_token(kind=APIToken.CLUSTER, cluster=cluster)[1])


@pytest.fixture
def job(django_capture_on_commit_callbacks):
    load_fleet({"c1": [("h100", 1)]})
    admin = _client("admin")
    with django_capture_on_commit_callbacks(execute=True):  # the inline allocation round runs after commit
        assert admin.post(NS, gpu_claim("job"), format="json").status_code == 201
    load_fleet({"c2": [("h100", 1)]})
    claim = ResourceClaim.objects.get(name="job")
    assert claim.phase == Phase.ALLOCATED and claim.cluster == "c1" and not claim.allowed_cluster_selector
    return claim


def _do(client, verb: str):
    if verb == "get":
        return client.get(f"{NS}/job")
    if verb == "read-missing":
        return client.get(f"{NS}/no-such-claim")
    if verb == "create":
        return client.post(NS, gpu_claim("new"), format="json")
    if verb == "create-pinned-c1":
        return client.post(NS, gpu_claim("new-c1", annotations=PINNED_C1), format="json")
    if verb == "edit":
        return client.patch(f"{NS}/job", {"metadata": {"labels": {"edited": "yes"}}}, format="json")
    if verb == "renew":
        return client.post(f"{NS}/job/renew", {"ttl": "1h"}, format="json")
    if verb == "release":
        return client.post(f"{NS}/job/release")
    if verb == "release-missing":
        return client.post(f"{NS}/no-such-claim/release")
    return client.delete(f"{NS}/job")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verb", list(TABLE))
def test_claim_access(job, kind, verb):
    resp = _do(_client(kind), verb)
    expected = TABLE[verb][KINDS.index(kind)]
    assert resp.status_code == expected, (kind, verb, resp.status_code, resp.content[:300])
    if expected in (401, 403):
        assert resp["Content-Type"].startswith("application/problem+json")
        job.refresh_from_db()
        assert job.phase == Phase.ALLOCATED and "edited" not in (job.labels or {})  # nothing written


def test_a_pinned_claim_is_editable_by_its_clusters_agent(job):
    admin = _client("admin")
    assert admin.post(NS, gpu_claim("mirror", annotations=PINNED_C1), format="json").status_code == 201
    agent, other = _client("cluster-of-claim"), _client("other-cluster")
    edit = {"metadata": {"labels": {"pod": "running"}}}
    assert agent.patch(f"{NS}/mirror", edit, format="json").status_code == 200
    assert other.patch(f"{NS}/mirror", edit, format="json").status_code == 403
    assert other.post(f"{NS}/mirror/release").status_code == 403
    assert agent.post(f"{NS}/mirror/release").status_code == 200


def test_a_read_only_token_reads_and_writes_nothing(job):
    reader = client_for(issue_token(kind=APIToken.NAMESPACE, namespaces=["team"], read_only=True)[1])
    assert reader.get(f"{NS}/job").status_code == 200
    resp = reader.post(f"{NS}/job/release")
    assert resp.status_code == 403 and "read-only" in resp.json()["detail"]
