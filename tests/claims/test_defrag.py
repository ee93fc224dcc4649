"""Defragmentation advice and plans (issue 17 item 2) on seeded fleets, through the real engine and the real
allocation round; the API's tenancy and its 4xx answers."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.placement import ALLOWED_CLUSTERS, NODE_PIN
from claims.services import claims as claim_services
from claims.services.conditions import RELEASING, is_true
from draservice.errors import Invalid, NotFound
from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.models import Cluster
from scheduler.services import allocation, defrag, defrag_apply, holds
from tests.claims.fleet import gpu_claim, load_fleet
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

NS = "team-a"
URL = "/api/v1/defragmentation"
N0, N1 = "c1-h100-000", "c1-h100-001"


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def pinned(name: str, count: int, node: str, cluster: str = "c1") -> dict:
    return gpu_claim(name, count=count, annotations={ALLOWED_CLUSTERS: f"name={cluster}", NODE_PIN: node})


def claim(name: str, ns: str = NS) -> ResourceClaim:
    return ResourceClaim.objects.get(namespace__name=ns, name=name)


def unpin(c: ResourceClaim) -> None:
    """Drop the node pin used to seed the fleet (a claim pinned by its owner is never moved)."""
    notes = {k: v for k, v in c.annotations.items() if k not in (NODE_PIN, ALLOWED_CLUSTERS)}
    claim_services.update_claim(c.id, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                       "metadata": {"name": c.name, "annotations": notes}})


@pytest.fixture
def fragmented(db):
    """Two 8xH100 nodes: two 1-GPU claims on node 0, one 6-GPU claim on node 1, and an 8-GPU claim pending
    (6 + 2 GPUs are free, on two nodes)."""
    load_fleet({"c1": [("h100", 2)]})
    claim_services.create_claims(NS, [pinned("one-a", 1, N0), pinned("one-b", 1, N0)])
    claim_services.create_claims("team-b", [pinned("six", 6, N1)])
    run_rounds()
    for c in ResourceClaim.objects.all():
        unpin(c)
    claim_services.create_claims("team-c", [gpu_claim("eight", count=8)])
    run_rounds()
    assert claim("eight", "team-c").phase == Phase.PENDING
    assert {claim(n).node for n in ("one-a", "one-b")} == {N0} and claim("six", "team-b").node == N1


def agent_client():
    _, secret = issue_token(kind=APIToken.CLUSTER, cluster=Cluster.objects.get(name="c1"))
    return client_for(secret)


def test_plan_moves_two_claims_and_the_8_gpu_claim_allocates_after_apply(fragmented):
    found = defrag.advice()
    assert len(found.plans) == 1
    plan = found.plans[0]
    assert (plan.cluster, plan.node, plan.target) == ("c1", N0, "team-c/eight")
    # Moving the two 1-GPU claims (2 devices) beats moving the 6-GPU claim: least to move first.
    assert sorted(m.name for m in plan.moves) == ["one-a", "one-b"]
    assert {(m.to_cluster, m.to_node, m.kind) for m in plan.moves} == {("c1", N1, "single GPU")}
    assert "move 2 claims (single GPU) from c1/" + N0 in plan.to_dict()["summary"]
    assert defrag.advice().plans[0].id == plan.id  # deterministic: the id names the state it was computed on

    done = defrag_apply.apply_plan(plan.id, actor="ops")
    assert sorted(done["releasing"]) == ["team-a/one-a", "team-a/one-b"] and done["released"] == []
    moved = ResourceClaim.objects.filter(annotations__has_key=defrag_apply.MOVED_FROM)
    assert sorted((c.phase, c.cluster, c.node) for c in moved) == [(Phase.ALLOCATED, "c1", N1)] * 2
    assert all(c.annotations[NODE_PIN] == N1 for c in moved)
    eight = claim("eight", "team-c")
    assert eight.phase == Phase.PENDING and eight.annotations[NODE_PIN] == N0
    assert holds.held_nodes() == {("c1", N0): eight.id}
    # Safe release: the old claims keep their devices until the agent confirms no pod uses them.
    for old in ("one-a", "one-b"):
        c = claim(old)
        assert c.phase == Phase.ALLOCATED and is_true(c.conditions, RELEASING) and c.lease_expires_at
    run_rounds()
    assert claim("eight", "team-c").phase == Phase.PENDING
    agent = agent_client()
    for old in ("one-a", "one-b"):  # the agent's confirmation: it releases the claims allocated on its cluster
        assert agent.post(f"/api/v1/namespaces/{NS}/resourceclaims/{old}/release").status_code == 200
        c = claim(old)
        assert c.phase == Phase.RELEASED and not is_true(c.conditions, RELEASING)

    run_rounds()  # the ordinary claims round, the real engine
    eight = claim("eight", "team-c")
    assert eight.phase == Phase.ALLOCATED and (eight.cluster, eight.node) == ("c1", N0)
    assert len(eight.allocation["devices"]["results"]) == 8
    assert holds.held_nodes() == {}  # the hold ends once its claim is allocated
    assert defrag.advice().plans == []


def test_an_unconfirmed_release_happens_at_the_deadline_and_cannot_be_renewed(fragmented, admin_client):
    plan = defrag.advice().plans[0]
    defrag_apply.apply_plan(plan.id, actor="ops", grace=timedelta(seconds=1))
    res = admin_client.post(f"/api/v1/namespaces/{NS}/resourceclaims/one-a/renew", {"ttl": "1h"}, format="json")
    assert res.status_code == 409
    time.sleep(1.1)
    assert claim_services.expire_leases() == 2
    assert claim("one-a").phase == Phase.RELEASED and claim("one-a").reason == claim_services.RELEASE_DEADLINE
    run_rounds()
    assert claim("eight", "team-c").phase == Phase.ALLOCATED


def test_a_held_node_is_not_given_to_another_claim(fragmented):
    plan = defrag.advice().plans[0]
    defrag_apply.apply_plan(plan.id, actor="ops", grace=timedelta(0))  # released at once
    assert claim("one-a").phase == Phase.RELEASED and claim("one-a").reason == "Defragmented"
    # A worker busy with the target: the next round sees only a newcomer that would fit on the freed node.
    ResourceClaim.objects.filter(namespace__name="team-c", name="eight").update(
        taken_until=timezone.now() + timezone.timedelta(seconds=60))
    claim_services.create_claims("team-d", [gpu_claim("small", count=1)])
    run_rounds()
    small = claim("small", "team-d")
    assert small.phase == Phase.PENDING and small.reason == "HeldForDefragmentation"
    ResourceClaim.objects.filter(namespace__name="team-c", name="eight").update(taken_until=None)
    run_rounds()
    assert claim("eight", "team-c").phase == Phase.ALLOCATED


def test_apply_refuses_a_stale_plan(fragmented):
    plan = defrag.advice().plans[0]
    claim_services.release_claim(claim("one-a").id)  # the fleet moved on: the plan has another id now
    with pytest.raises(NotFound, match=f"no plan {plan.id} now"):
        defrag_apply.apply_plan(plan.id, actor="ops")
    assert claim("one-b").phase == Phase.ALLOCATED  # nothing was done


def test_stranded_capacity_per_cluster_and_node(db):
    """An 8-GPU node fully used and a 4-GPU L4 node idle: the only shape asked for (8 GPUs) cannot use the
    L4's 4 GPUs; the H100 node's compute-domain devices are no GPUs and are not counted."""
    load_fleet({"c1": [("h100", 1), ("l4", 1)]})
    claim_services.create_claims(NS, [gpu_claim("eight", count=8)])
    run_rounds()
    claim_services.create_claims(NS, [gpu_claim("eight-more", count=8)])
    run_rounds()
    figures = defrag.advice().stranded
    assert figures["total"] == 4 and figures["freeTotal"] == 4
    assert figures["byCluster"] == [{"cluster": "c1", "stranded": 4}]
    assert figures["nodes"] == [{"cluster": "c1", "node": "c1-l4-000", "free": 4}]
    # A 1-GPU claim takes one L4 GPU: claims asked for recently do not make the rest usable, only pending ones
    # would (the 8-GPU claim still fits nowhere: the other 3 stay stranded).
    claim_services.create_claims(NS, [gpu_claim("one", count=1)])
    run_rounds()
    figures = defrag.advice().stranded
    assert figures["total"] == 3 and figures["freeTotal"] == 3
    # Nothing waits for room any more: nothing is stranded.
    claim_services.release_claim(ResourceClaim.objects.get(name="eight-more").id)
    figures = defrag.advice().stranded
    assert figures["total"] == 0


def test_node_pin_needs_a_cluster_pin(db):
    load_fleet({"c1": [("h100", 1)]})
    body = gpu_claim("x", annotations={NODE_PIN: N0})
    with pytest.raises(Invalid) as exc:
        claim_services.create_claims(NS, [body])
    assert "name=<cluster>" in str(exc.value.detail)


# ------------------------------------------------------------------------------------------------ the API

def test_api_lists_plans_for_admins_only(fragmented, admin_client, ns_client):
    res = admin_client.get(URL)
    assert res.status_code == 200, res.content
    body = res.json()
    assert [p["target"]["claim"] for p in body["plans"]] == ["team-c/eight"]
    assert {m["claim"] for m in body["plans"][0]["moves"]} == {"team-a/one-a", "team-a/one-b"}
    # The 8-GPU claim fits on neither node: their 6 + 2 free GPUs are stranded by placement.
    assert body["stranded"]["total"] == 8 and body["exhaustive"] is True
    # Tenants: 403, even the namespace whose claims the plan moves (a plan names other tenants' claims).
    for client in (ns_client(NS), ns_client("team-c")):
        res = client.get(URL)
        assert res.status_code == 403 and res["Content-Type"].startswith("application/problem+json")
        assert client.post(f"{URL}/plans/{body['plans'][0]['id']}/apply").status_code == 403
    assert admin_client.get(f"{URL}?stranded=false").json()["stranded"] == {}


@pytest.mark.parametrize("query, field", [("limit=abc", "limit"), ("limit=0", "limit"), ("limit=51", "limit"),
                                          ("stranded=maybe", "stranded"), ("nodes=3", "nodes")])
def test_api_bad_query_is_400(fragmented, admin_client, query, field):
    res = admin_client.get(f"{URL}?{query}")
    assert res.status_code == 400 and res["Content-Type"].startswith("application/problem+json")
    assert [e["field"] for e in res.json()["errors"]] == [field]


def test_api_apply(fragmented, admin_client):
    assert admin_client.post(f"{URL}/plans/not-a-plan/apply").status_code == 400
    res = admin_client.post(f"{URL}/plans/{'0' * 16}/apply")
    assert res.status_code == 404 and res.json()["errors"][0]["field"] == "id"
    plan_id = admin_client.get(URL).json()["plans"][0]["id"]
    for body, field in (({"graceSeconds": -1}, "graceSeconds"), ({"graceSeconds": "1h"}, "graceSeconds"),
                        ({"grace": 1}, "grace")):
        res = admin_client.post(f"{URL}/plans/{plan_id}/apply", body, format="json")
        assert res.status_code == 400 and [e["field"] for e in res.json()["errors"]] == [field]
    res = admin_client.post(f"{URL}/plans/{plan_id}/apply", {"graceSeconds": 0}, format="json")
    assert res.status_code == 200, res.content
    assert sorted(res.json()["released"]) == ["team-a/one-a", "team-a/one-b"]
    assert admin_client.post(f"{URL}/plans/{plan_id}/apply").status_code == 404  # applied: gone
    run_rounds()
    assert claim("eight", "team-c").phase == Phase.ALLOCATED


def test_api_staff_sessions_read_and_other_users_do_not(fragmented, client, django_user_model):
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    user = django_user_model.objects.create_user("viewer", password="x")
    client.force_login(user)
    assert client.get(URL).status_code == 403
    client.force_login(staff)
    res = client.get(URL)
    assert res.status_code == 200 and len(res.json()["plans"]) == 1


def test_a_common_shape_that_fits_nowhere_gets_a_plan_too(db):
    """No 8-GPU claim is pending, but one was asked for today: the plan frees a node for the next one."""
    load_fleet({"c1": [("h100", 2)]})
    claim_services.create_claims(NS, [gpu_claim("earlier", count=8)])
    run_rounds()
    claim_services.release_claim(claim("earlier").id)
    claim_services.create_claims(NS, [pinned("one-a", 1, N0), pinned("one-b", 1, N0)])
    claim_services.create_claims("team-b", [pinned("six", 6, N1)])
    run_rounds()
    for c in ResourceClaim.objects.filter(phase=Phase.ALLOCATED):
        unpin(c)
    (plan,) = defrag.advice().plans
    assert plan.target_id is None and plan.target == "8 × gpu.nvidia.com" and plan.node == N0
    assert plan.to_dict()["target"] == {"shape": "8 × gpu.nvidia.com", "devices": 8}
    done = defrag_apply.apply_plan(plan.id, actor="ops", grace=timedelta(0))
    assert done["holdUntil"] is None and holds.held_nodes() == {}
    claim_services.create_claims("team-c", [gpu_claim("next", count=8)])
    run_rounds()
    assert (claim("next", "team-c").phase, claim("next", "team-c").node) == (Phase.ALLOCATED, N0)
