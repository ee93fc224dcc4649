"""Pool state: highest generation only, incomplete below resourceSliceCount, invalid with a stated reason."""
import copy

import pytest

from inventory.models import Pool
from inventory.services.pools import compute_pool_states

pytestmark = pytest.mark.django_db


def slice_obj(name, pool="p1", generation=1, count=1, devices=("d0",), driver="gpu.example.com", **spec):
    body = {"driver": driver, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "nodeName": "node-a", "devices": [{"name": d} for d in devices]}
    body.update(spec)
    if "sharedCounters" in spec:
        body.pop("devices")
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": body}


def pool_of(agent, cluster="c1", name="p1"):
    pools = agent.get("/api/v1/pools", {"cluster": cluster, "name": name}).json()["results"]
    assert len(pools) == 1
    return pools[0]


def push(agent, slices):
    resp = agent.put("/api/v1/clusters/c1/inventory", {"resourceSlices": slices}, format="json")
    assert resp.status_code == 200, resp.json()
    return resp.json()


def test_only_the_highest_generation_counts(cluster_factory):
    _, agent = cluster_factory("c1")
    # One push carries one generation per pool (tests/inventory/test_pool_events.py); a driver's update
    # arrives slice by slice, and the slice of the new generation replaces the pool's count at once.
    push(agent, [slice_obj("old", generation=1, devices=("a", "b", "c"))])
    assert agent.put("/api/v1/clusters/c1/resourceslices/new", slice_obj("new", generation=2, devices=("a",)),
                     format="json").status_code == 201
    pool = pool_of(agent)
    assert (pool["generation"], pool["sliceCount"], pool["deviceCount"], pool["state"]) == (2, 1, 1, "complete")
    # A leftover old-generation slice with the same device names does not make the pool invalid.
    assert pool["reason"] == ""


def test_fewer_slices_than_resource_slice_count_is_incomplete(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    a100 = [s for s in real_slices if s["spec"]["pool"]["name"] == "a100-dgx-node-01"]
    assert len(a100) == 9
    push(agent, a100[:8])
    pool = pool_of(agent, name="a100-dgx-node-01")
    assert pool["state"] == "incomplete"
    assert pool["reason"] == "8 of 9 slices published for generation 1"
    name = a100[8]["metadata"]["name"]
    assert agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", a100[8], format="json").status_code == 201
    assert pool_of(agent, name="a100-dgx-node-01")["state"] == "complete"
    assert agent.delete(f"/api/v1/clusters/c1/resourceslices/{a100[0]['metadata']['name']}").status_code == 204
    assert pool_of(agent, name="a100-dgx-node-01")["state"] == "incomplete"


def test_duplicate_device_names_across_slices_make_the_pool_invalid(cluster_factory):
    _, agent = cluster_factory("c1")
    push(agent, [slice_obj("s1", count=2, devices=("gpu-0", "gpu-1")), slice_obj("s2", count=2, devices=("gpu-1",))])
    pool = pool_of(agent)
    assert (pool["state"], pool["reason"]) == ("invalid", "duplicate device name gpu-1")
    assert agent.get("/api/v1/pools", {"state": "invalid"}).json()["results"][0]["name"] == "p1"
    devices = agent.get("/api/v1/devices", {"pool": "p1"}).json()["results"]
    assert {d["poolState"] for d in devices} == {"invalid"}


def test_unknown_counter_sets_and_counters_make_the_pool_invalid(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    a100 = copy.deepcopy([s for s in real_slices if s["spec"]["pool"]["name"] == "a100-dgx-node-01"])
    a100[1]["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] = "gpu-9-counter-set"
    push(agent, a100)
    pool = pool_of(agent, name="a100-dgx-node-01")
    assert (pool["state"], pool["reason"]) == ("invalid", "counter set gpu-9-counter-set not found")
    a100 = copy.deepcopy([s for s in real_slices if s["spec"]["pool"]["name"] == "a100-dgx-node-01"])
    a100[2]["spec"]["devices"][0]["consumesCounters"][0]["counters"]["warp-drives"] = {"value": "1"}
    push(agent, a100)
    pool = pool_of(agent, name="a100-dgx-node-01")
    assert pool["state"] == "invalid"
    assert pool["reason"] == "counter warp-drives not found in counter set gpu-1-counter-set"


def test_duplicate_counter_sets_and_disagreeing_counts():
    counters = [{"name": "cs", "counters": {"c": {"value": "1"}}}]
    states = compute_pool_states([slice_obj("a", count=2, sharedCounters=counters),
                                  slice_obj("b", count=2, sharedCounters=counters)])
    assert states[("gpu.example.com", "p1")].reason == "duplicate counter set name cs"
    states = compute_pool_states([slice_obj("a", count=2), slice_obj("b", count=3, devices=("d1",))])
    assert states[("gpu.example.com", "p1")].state == "invalid"
    assert "disagree on resourceSliceCount" in states[("gpu.example.com", "p1")].reason


def test_pools_of_a_cluster_follow_its_pushes(cluster_factory):
    _, agent = cluster_factory("c1")
    push(agent, [slice_obj("s1"), slice_obj("s2", pool="p2")])
    assert Pool.objects.count() == 2
    first_id = Pool.objects.get(name="p1").pk
    push(agent, [slice_obj("s1", generation=5)])
    assert list(Pool.objects.values_list("name", "generation")) == [("p1", 5)]
    assert Pool.objects.get().pk == first_id  # updated in place, not recreated
