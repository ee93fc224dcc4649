"""Pool generations: a full push that takes a pool's generation backwards is accepted (the cluster's truth)
and recorded as a pool event, shown by the API and the dashboard; one push mixing generations is refused."""
from __future__ import annotations

import pytest

from inventory.models import Pool, PoolEvent, ResourceSlice
from tests.conftest import client_for
from tests.inventory.test_pools import slice_obj

pytestmark = pytest.mark.django_db


def push(agent, slices, cluster="c1"):
    return agent.put(f"/api/v1/clusters/{cluster}/inventory", {"resourceSlices": slices}, format="json")


def pool_of(agent, name="p1"):
    (pool,) = agent.get("/api/v1/pools", {"name": name}).json()["results"]
    return pool


def test_a_generation_going_backwards_is_accepted_and_recorded(cluster_factory):
    _, agent = cluster_factory("c1")
    assert push(agent, [slice_obj("s1", generation=6), slice_obj("s2", pool="p2", generation=2)]).status_code == 200
    assert push(agent, [slice_obj("s1", generation=6), slice_obj("s2", pool="p2", generation=2)]).status_code == 200
    assert PoolEvent.objects.count() == 0  # same generation again: nothing to say
    resp = push(agent, [slice_obj("s1", generation=3), slice_obj("s2", pool="p2", generation=4)])
    assert resp.status_code == 200, resp.content
    pool = pool_of(agent)
    assert (pool["generation"], pool["state"]) == (3, "complete")  # stored as pushed
    events = agent.get(f"/api/v1/pools/{pool['id']}/events").json()["results"]
    assert [(e["type"], e["cluster"], e["driver"], e["pool"], e["data"]) for e in events] == [
        ("GenerationRegressed", "c1", "gpu.example.com", "p1", {"previousGeneration": 6, "generation": 3})]
    assert "went back from 6 to 3" in events[0]["message"] and events[0]["time"]
    assert agent.get(f"/api/v1/pools/{pool_of(agent, 'p2')['id']}/events").json()["results"] == []  # 2 -> 4
    fleet = agent.get("/api/v1/poolevents", {"cluster": "c1", "type": "GenerationRegressed"}).json()["results"]
    assert [e["pool"] for e in fleet] == ["p1"]


def test_an_incremental_change_that_lowers_the_generation_is_recorded_too(cluster_factory):
    _, agent = cluster_factory("c1")
    assert push(agent, [slice_obj("s1", generation=6)]).status_code == 200
    assert agent.put("/api/v1/clusters/c1/resourceslices/s1", slice_obj("s1", generation=1),
                     format="json").status_code == 200
    assert list(PoolEvent.objects.values_list("pool", "data")) == [("p1", {"previousGeneration": 6, "generation": 1})]


def test_pool_events_outlive_the_pool_and_go_with_the_cluster(cluster_factory, admin_client):
    cluster, agent = cluster_factory("c1")
    push(agent, [slice_obj("s1", generation=6)])
    push(agent, [slice_obj("s1", generation=3)])
    push(agent, [])
    assert not Pool.objects.exists()
    assert admin_client.get("/api/v1/poolevents", {"pool": "p1"}).json()["results"][0]["pool"] == "p1"
    assert admin_client.delete("/api/v1/clusters/c1").status_code == 204
    assert not PoolEvent.objects.exists()


def test_one_push_mixing_generations_of_a_pool_is_refused(cluster_factory):
    _, agent = cluster_factory("c1")
    assert push(agent, [slice_obj("keep", pool="p2")]).status_code == 200
    resp = push(agent, [slice_obj("old", generation=1, count=2), slice_obj("new", generation=2, count=2),
                        slice_obj("other", pool="p2", generation=7)])
    assert resp.status_code == 422, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    (error,) = resp.json()["errors"]
    assert error["field"] == "resourceSlices[0].spec.pool.generation"
    assert "pool gpu.example.com/p1 has slices of generation 2" in error["reason"]
    # Atomic: nothing of the refused push was stored.
    assert list(ResourceSlice.objects.values_list("name", flat=True)) == ["keep"]
    # A Kubernetes List names the items.
    listed = agent.put("/api/v1/clusters/c1/inventory", {"kind": "ResourceSliceList", "items": [
        slice_obj("a", generation=5), slice_obj("b", generation=4)]}, format="json")
    assert listed.status_code == 422 and listed.json()["errors"][0]["field"] == "items[1].spec.pool.generation"


def test_the_agent_drops_the_obsolete_slices_and_gets_the_rest_through(cluster_factory):
    """What the agent does with such a 422 (agent.inventory._drop_rejected): the errors name objects, so it
    pushes again without them; the pool then holds its highest generation, as the allocator would count it."""
    from agent.inventory import _drop_rejected

    _, agent = cluster_factory("c1")
    state = {"resourceSlices": [slice_obj("old", generation=1, count=2), slice_obj("new", generation=2)],
             "nodes": [], "deviceClasses": [], "deviceTaintRules": []}
    problem = agent.put("/api/v1/clusters/c1/inventory", state, format="json").json()
    assert [what for what, _ in _drop_rejected(state, problem)] == ["resourceSlice old"]
    assert agent.put("/api/v1/clusters/c1/inventory", state, format="json").status_code == 200
    assert Pool.objects.get().generation == 2


def test_the_dashboard_shows_pool_events(cluster_factory, client, django_user_model):
    cluster, agent = cluster_factory("c1")
    push(agent, [slice_obj("s1", generation=6)])
    push(agent, [slice_obj("s1", generation=3)])
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    for url in ("/inventory/pools/", "/inventory/pools/?cluster=c1", "/clusters/c1/"):
        page = client.get(url).content.decode()
        assert 'data-testid="pool-events"' in page and "GenerationRegressed" in page, url
        assert "generation went back from 6 to 3" in page, url


def test_reading_pool_events_needs_a_token(cluster_factory):
    cluster_factory("c1")
    assert client_for(None).get("/api/v1/poolevents").status_code == 401
