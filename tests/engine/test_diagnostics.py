"""Explainable failures: where devices dropped out, per request, per node, and the nearest miss."""
from __future__ import annotations

import json

from dra.engine import AllocatedDevice, ClusterInventory

from .builders import DRIVER, claim, cluster, device, engine, gpus, group, node_slice, request


def _request_diag(out, index=0):
    return out.diagnostics["requests"][index]


def test_all_matching_devices_in_use():
    e = engine(cluster("c1", {"n1": gpus(8)}),
               allocated=[AllocatedDevice("c1", DRIVER, "n1", f"gpu-{i}") for i in range(8)])
    out = e.allocate(group(claim("c", [request("r")])))
    assert not out.allocated and out.reason == "unsatisfiable"
    diag = _request_diag(out)
    assert diag["considered"] == 8 and diag["available"] == 0
    assert diag["dropped"] == {"allocated": 8}
    assert diag["summary"].startswith("8 device(s) match the selectors; of those 8 allocated")
    assert json.loads(json.dumps(out.to_dict()))["diagnostics"]["requests"][0]["dropped"] == {"allocated": 8}


def test_nearest_miss_names_the_selector_to_relax():
    devs = [device(f"gpu-{i}", productName="A100", memoryGi=80) for i in range(2)] + \
           [device("gpu-2", productName="H100", memoryGi=40)]
    e = engine(cluster("c1", {"n1": devs}))
    sel = ['device.attributes["gpu.example.com"].productName == "H100"',
           'device.attributes["gpu.example.com"].memoryGi >= 80']
    out = e.allocate(group(claim("c", [request("r", selectors=sel)])))
    diag = _request_diag(out)
    assert diag["dropped"] == {"request_selector": 3}
    # Dropping selector #0 would admit the two A100s; dropping #1 would admit the H100.
    assert [(m["selector"], m["would_match"]) for m in diag["nearest_miss"]] == [(0, 2), (1, 1)]
    assert "2 more would match if selector #0" in diag["summary"]


def test_class_selector_taint_incomplete_pool_and_stale_cluster_are_counted():
    taint = {"key": "broken", "effect": "NoExecute"}
    tainted = device("gpu-9")
    tainted["taints"] = [taint]
    other_driver = node_slice("n1", [device("x")], driver="other.example.com", name="other")
    incomplete = node_slice("n2", gpus(2), pool="p-incomplete", name="inc", count=2)
    live = ClusterInventory("c1", nodes=[{"name": "n1", "labels": {}}, {"name": "n2", "labels": {}}],
                            resource_slices=[node_slice("n1", [tainted]), other_driver, incomplete])
    stale = cluster("c2", {"n3": gpus(3)}, stale=True)
    e = engine(live, stale)
    out = e.allocate(group(claim("c", [request("r")])))
    assert not out.allocated
    dropped = _request_diag(out)["dropped"]
    assert dropped == {"taint": 1, "class_selector": 1, "pool_incomplete": 2, "cluster_stale": 3}
    assert out.diagnostics["unusable_pools"] == [{"cluster": "c1", "pool": f"{DRIVER}/p-incomplete", "generation": 1,
                                                  "state": "incomplete", "detail": "1 slice(s) of generation 1"}]
    assert {"cluster": "c2", "reason": "cluster_stale", "eligible": False} in out.diagnostics["clusters"]


def test_per_node_view_when_devices_are_spread_too_thin():
    e = engine(cluster("c1", {"n1": gpus(2), "n2": gpus(2), "n3": gpus(1)}))
    out = e.allocate(group(claim("c", [request("r", count=3)])))
    diag = _request_diag(out)
    assert diag["available"] == 5
    assert diag["best_nodes"][0] == {"node": "c1/n1", "available": 2}
    assert "5 available but at most 2 on one node (need 3)" in diag["summary"]


def test_constraint_failure_is_reported_per_node():
    devs = [device(f"gpu-{i}", numa=i) for i in range(4)]
    e = engine(cluster("c1", {"n1": devs}))
    out = e.allocate(group(claim("c", [request("a"), request("b")], [{"matchAttribute": f"{DRIVER}/numa"}])))
    assert not out.allocated
    node = out.diagnostics["nodes"][0]
    assert node["node"] == "n1" and node["reason"] == "constraint" and node["matchAttribute"] == f"{DRIVER}/numa"
    assert "cannot be combined" in _request_diag(out)["summary"]


def test_subrequests_are_explained_each():
    e = engine(cluster("c1", {"n1": gpus(1)}))
    r = {"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 4},
        {"name": "small", "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 2}]}
    out = e.allocate(group(claim("c", [r])))
    assert [d["request"] for d in out.diagnostics["requests"]] == ["r/big", "r/small"]
    assert [d["count"] for d in out.diagnostics["requests"]] == [4, 2]


def test_invalid_pools_are_a_reason_fleet_wide_and_an_error_on_a_pinned_node():
    import pytest

    from dra.engine import AllocationError

    dup = node_slice("n1", [device("gpu-0"), device("gpu-0")])  # duplicate device names: the pool is invalid
    inv = ClusterInventory("c1", nodes=[{"name": "n1", "labels": {}}, {"name": "n2", "labels": {}}],
                           resource_slices=[dup, node_slice("n2", gpus(1))])
    e = engine(inv, allocated=[AllocatedDevice("c1", DRIVER, "n2", "gpu-0")])
    out = e.allocate(group(claim("c", [request("r")])))
    assert not out.allocated and out.reason == "invalid_pools"
    assert out.diagnostics["unusable_pools"][0]["detail"] == "duplicate device name gpu-0"
    with pytest.raises(AllocationError, match="invalid resource pools were encountered"):
        e.allocate(group(claim("c", [request("r")]), node="n1"))


def test_no_eligible_cluster_names_the_clusters_and_why():
    e = engine(cluster("c1", {"n1": gpus(2)}, stale=True), cluster("c2", {"n2": gpus(2)}, stale=True))
    out = e.allocate(group(claim("c", [request("r")])))
    assert not out.allocated and out.reason == "no_eligible_cluster"
    assert "c1" in out.message and "c2" in out.message and "stale" in out.message
