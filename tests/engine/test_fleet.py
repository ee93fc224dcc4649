"""Fleet-wide behaviour: the BinPack placement policy, clusters, incremental state, determinism."""
from __future__ import annotations

import copy
import json
import os

from dra.engine import AllocatedDevice, ClusterInventory, Engine, FleetSnapshot, SearchBudget
from dra.engine.policy import node_score

from .builders import (
    DRIVER,
    claim,
    cluster,
    device,
    device_class,
    engine,
    gpus,
    group,
    network_slice,
    node_slice,
    picked,
    request,
)


def test_node_score_orders_partly_used_first_then_best_fit():
    assert sorted([node_score(False, 2), node_score(True, 7), node_score(True, 3), node_score(False, 8)]) == [
        node_score(True, 3), node_score(True, 7), node_score(False, 2), node_score(False, 8)]


def test_partly_used_node_is_filled_before_an_empty_one():
    e = engine(cluster("c1", {"node-a": gpus(4), "node-b": gpus(4)}),
               allocated=[AllocatedDevice("c1", DRIVER, "node-b", "gpu-0")])
    out = e.allocate(group(claim("x", [request("gpu")])))
    assert (out.cluster, out.node) == ("c1", "node-b")
    assert picked(out) == [("x", "gpu", "gpu-1")]


def test_whole_nodes_stay_free_even_when_a_smaller_empty_node_would_fit_tighter():
    # node-a is empty and small; node-b is big but already partly used: keep node-a whole.
    e = engine(cluster("c1", {"node-a": gpus(2), "node-b": gpus(8)}),
               allocated=[AllocatedDevice("c1", DRIVER, "node-b", "gpu-0")])
    assert e.allocate(group(claim("x", [request("gpu")]))).node == "node-b"


def test_best_fit_among_empty_nodes_keeps_the_big_node_for_the_big_claim():
    e = engine(cluster("c1", {"node-a": gpus(8), "node-b": gpus(2)}))
    small = e.allocate(group(claim("small", [request("gpu", count=2)])))
    assert small.node == "node-b"
    big = e.allocate(group(claim("big", [request("gpu", count=8)])))
    assert big.node == "node-a"


def test_one_device_claims_fill_node_after_node():
    e = engine(cluster("c1", {f"node-{i}": gpus(4) for i in range(3)}))
    nodes = [e.allocate(group(claim(f"c{i}", [request("gpu")]))).node for i in range(12)]
    assert nodes == ["node-0"] * 4 + ["node-1"] * 4 + ["node-2"] * 4
    assert not e.allocate(group(claim("extra", [request("gpu")]))).allocated


def test_preferred_and_allowed_clusters_and_stale_clusters():
    c1 = cluster("c1", {"n1": gpus(2)})
    c2 = cluster("c2", {"n2": gpus(2)})
    stale = cluster("c0", {"n0": gpus(8)}, stale=True)
    e = engine(c1, c2, stale)
    assert e.allocate(group(claim("a", [request("gpu")]))).cluster == "c1"  # name order when nothing differs
    assert e.allocate(group(claim("b", [request("gpu")]), preferred_cluster="c2")).cluster == "c2"
    assert e.allocate(group(claim("c", [request("gpu")]), allowed_clusters=["c2"])).cluster == "c2"
    out = e.allocate(group(claim("d", [request("gpu")]), allowed_clusters=["c0"]))
    assert not out.allocated and out.reason == "no_eligible_cluster"
    assert {"cluster": "c0", "reason": "cluster_stale", "eligible": False} in out.diagnostics["clusters"]


def test_cluster_specific_class_overrides_fleet_class():
    other = "other.example.com"
    c1 = cluster("c1", {"n1": gpus(1)})
    c2 = ClusterInventory("c2", nodes=[{"name": "n2", "labels": {}}],
                          resource_slices=[node_slice("n2", gpus(1), driver=other)],
                          device_classes=[device_class("gpu", f'device.driver == "{other}"')])
    e = engine(c1, c2)
    first = e.allocate(group(claim("a", [request("gpu")])))
    second = e.allocate(group(claim("b", [request("gpu")])))
    assert (first.cluster, second.cluster) == ("c1", "c2")
    assert second.claims[0].allocation["devices"]["results"][0]["driver"] == other


def test_release_makes_devices_allocatable_again_and_group_is_all_or_nothing():
    e = engine(cluster("c1", {"n1": gpus(2)}))
    a = e.allocate(group(claim("a", [request("gpu", count=2)])))
    assert a.allocated and len(a.devices) == 2
    # Two claims of one consumer: the second cannot fit, so neither is allocated and nothing is consumed.
    assert not e.allocate(group(claim("b", [request("gpu")]), claim("c", [request("gpu")]))).allocated
    e.release(a.devices)
    both = e.allocate(group(claim("b", [request("gpu")]), claim("c", [request("gpu")])))
    assert both.allocated and {d.device for d in both.devices} == {"gpu-0", "gpu-1"}


def test_group_claims_land_on_one_node():
    e = engine(cluster("c1", {"n1": gpus(1), "n2": gpus(1), "n3": gpus(2)}))
    out = e.allocate(group(claim("a", [request("gpu")]), claim("b", [request("gpu")])))
    assert out.node == "n3"
    selectors = {json.dumps(c.allocation["nodeSelector"], sort_keys=True) for c in out.claims}
    assert len(selectors) == 1 and '"n3"' in selectors.pop()


def test_node_restriction_like_the_scheduler_filter():
    e = engine(cluster("c1", {"n1": gpus(2), "n2": gpus(2)}))
    assert e.allocate(group(claim("a", [request("gpu")]), node="n2")).node == "n2"
    assert not e.allocate(group(claim("b", [request("gpu", count=3)]), node="n1")).allocated


def test_network_attached_devices_have_no_node_and_carry_the_slice_selector():
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "node", "operator": "In", "values": ["n2"]}]}]}
    inv = cluster("c1", {"n1": [], "n2": []}, extra_slices=[
        network_slice("fabric", [device("link-0")], pool="fabric", selector=selector)])
    e = engine(inv)
    out = e.allocate(group(claim("a", [request("gpu")])))
    assert out.allocated and out.node is None
    assert out.claims[0].allocation["nodeSelector"] == selector
    inv2 = cluster("c2", {"n1": []}, extra_slices=[network_slice("all", [device("nic-0")], pool="all")])
    out2 = engine(inv2).allocate(group(claim("b", [request("gpu")])))
    assert out2.allocated and out2.node is None and "nodeSelector" not in out2.claims[0].allocation


def test_same_input_gives_the_same_answer():
    def run():
        inv = cluster("c1", {f"n{i}": gpus(4, numa=0) + [device("shared", numa=1)] for i in range(3)})
        shared = copy.deepcopy(inv.resource_slices)
        for s in shared:
            for d in s["spec"]["devices"]:
                if d["name"] == "shared":
                    d["allowMultipleAllocations"] = True
                    d["capacity"] = {"memory": {"value": "8Gi"}}
        inv.resource_slices = shared
        e = engine(inv)
        outs = []
        for i in range(10):
            outs.append(e.allocate(group(claim(f"c{i}", [request("r", count=2)],
                                               [{"matchAttribute": f"{DRIVER}/numa"}])), raise_errors=False))
            outs.append(e.allocate(group(claim(f"s{i}", [request("s", selectors=['device.attributes["gpu.example.com"]'
                                                                               '.numa == 1'],
                                                                  capacity={"requests": {"memory": "2Gi"}})]))))
        return json.dumps([o.to_dict() for o in outs], sort_keys=True)

    assert run() == run()


def test_shares_never_exceed_capacity_and_get_unique_ids():
    dev = device("gpu-0")
    dev["allowMultipleAllocations"] = True
    dev["capacity"] = {"memory": {"value": "10Gi", "requestPolicy": {"default": "1Gi",
                                                                      "validRange": {"min": "1Gi", "step": "1Gi"}}}}
    e = engine(cluster("c1", {"n1": [dev]}))
    outs = [e.allocate(group(claim(f"c{i}", [request("r", capacity={"requests": {"memory": "3Gi"}})])))
            for i in range(4)]
    assert [o.allocated for o in outs] == [True, True, True, False]  # 3 x 3Gi fit in 10Gi, a 4th does not
    results = [o.claims[0].allocation["devices"]["results"][0] for o in outs[:3]]
    assert len({r["shareID"] for r in results}) == 3
    assert all(r["consumedCapacity"] == {"memory": "3Gi"} for r in results)
    # 2.5Gi rounds up to the 1Gi step: 3Gi, which no longer fits next to 9Gi; a 1Gi share still does.
    assert not e.allocate(group(claim("x", [request("r", capacity={"requests": {"memory": "2.5Gi"}})]))).allocated
    small = e.allocate(group(claim("y", [request("r", capacity={"requests": {"memory": "1Gi"}})])))
    assert small.allocated
    e.release(outs[0].devices)
    assert e.allocate(group(claim("z", [request("r", capacity={"requests": {"memory": "3Gi"}})]))).allocated


def test_admin_access_does_not_consume_the_device():
    e = engine(cluster("c1", {"n1": gpus(1)}))
    admin = e.allocate(group(claim("mon", [request("r", adminAccess=True)])))
    assert admin.allocated and admin.claims[0].allocation["devices"]["results"][0]["adminAccess"] is True
    assert e.allocate(group(claim("user", [request("r")]))).allocated
    # ...and it may use a device that is in use.
    assert e.allocate(group(claim("mon2", [request("r", adminAccess=True)]))).allocated


def test_device_taint_rules_apply_and_tolerations_lift_them():
    rule = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "maint"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                     "taint": {"key": "maintenance", "value": "true", "effect": "NoSchedule"}}}
    e = engine(cluster("c1", {"n1": gpus(1)}, taint_rules=[rule]))
    out = e.allocate(group(claim("a", [request("r")])))
    assert not out.allocated and out.diagnostics["requests"][0]["dropped"] == {"taint": 1}
    tol = [{"key": "maintenance", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    ok = e.allocate(group(claim("b", [request("r", tolerations=tol)])))
    assert ok.allocated and ok.claims[0].allocation["devices"]["results"][0]["tolerations"] == tol


def test_a_taint_rule_without_a_selector_taints_nothing_and_an_empty_one_everything():
    """Upstream DeviceTaintRuleSpec: "The empty selector matches all devices. Without a selector, no devices
    are matched." The device API shows the same (inventory.services.taints)."""
    taint = {"key": "k", "effect": "NoSchedule"}
    none = {"metadata": {"name": "none"}, "spec": {"taint": taint}}
    fleet = engine(cluster("c1", {"n1": gpus(1)}, taint_rules=[none]))
    assert fleet.allocate(group(claim("a", [request("r")]))).allocated
    everything = {"metadata": {"name": "all"}, "spec": {"deviceSelector": {}, "taint": taint}}
    out = engine(cluster("c1", {"n1": gpus(1)}, taint_rules=[everything])).allocate(group(claim("a", [request("r")])))
    assert not out.allocated and out.diagnostics["requests"][0]["dropped"] == {"taint": 1}


def _mig_engine(shared_dir):
    with open(os.path.join(shared_dir, "fixtures", "real-slices.json")) as fh:
        slices = [s for s in json.load(fh) if s["spec"]["pool"]["name"] == "a100-dgx-node-01"]
    inv = ClusterInventory("c1", nodes=[{"name": "a100-dgx-node-01", "labels": {}}], resource_slices=slices)
    mig = device_class("mig", 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"')
    return Engine(FleetSnapshot([inv], [mig]), [])


def _mig_claim(name, profile):
    return claim(name, [request("m", cls="mig", selectors=[
        f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'])])


def test_mig_partitions_exclude_each_other_and_fill_a_started_gpu_first(shared_dir):
    e = _mig_engine(shared_dir)
    # Start gpu-3 by hand; the next small partition must go to gpu-3 too, not to the untouched gpu-0.
    e.commit([AllocatedDevice("c1", "gpu.nvidia.com", "a100-dgx-node-01", "gpu-3-mig-1g10gb-19-0")])
    out = e.allocate(group(_mig_claim("a", "1g.10gb")))
    assert out.claims[0].allocation["devices"]["results"][0]["device"].startswith("gpu-3-")
    # A whole-GPU 7g profile only fits on untouched GPUs: 7 of them are left.
    sevens = [e.allocate(group(_mig_claim(f"big{i}", "7g.80gb"))) for i in range(8)]
    assert [o.allocated for o in sevens] == [True] * 7 + [False]
    assert all(not o.claims[0].allocation["devices"]["results"][0]["device"].startswith("gpu-3-")
               for o in sevens[:7])


def test_devices_close_together_for_multi_device_requests():
    devs = [device(f"gpu-{i}", **{"resource.kubernetes.io/pcieRoot": f"pci0000:{i // 2:02x}"}) for i in range(8)]
    e = engine(cluster("c1", {"n1": devs}), allocated=[AllocatedDevice("c1", DRIVER, "n1", "gpu-0")])
    out = e.allocate(group(claim("pair", [request("r", count=2)])))
    # First fit would take gpu-1 and gpu-2 (two PCIe roots); the policy takes a whole free root instead.
    assert sorted(d.device for d in out.devices) == ["gpu-2", "gpu-3"]


def test_outcomes_are_json_safe():
    e = engine(cluster("c1", {"n1": gpus(1)}), budget=SearchBudget())
    ok = e.allocate(group(claim("a", [request("r")]), key="k1"))
    bad = e.allocate(group(claim("b", [request("r")]), key="k2"))
    for o in (ok, bad):
        assert json.loads(json.dumps(o.to_dict()))["key"] in ("k1", "k2")


def test_avoided_nodes_are_passed_over_and_a_pin_to_one_fails():
    # node-b is the best fit (partly used), but held for someone else: the group goes to node-a; pinned to the
    # held node, it fits nowhere; nothing of either answer is memoised against the held node.
    e = engine(cluster("c1", {"node-a": gpus(4), "node-b": gpus(4)}),
               allocated=[AllocatedDevice("c1", DRIVER, "node-b", "gpu-0")])
    held = frozenset({("c1", "node-b")})
    out = e.allocate(group(claim("x", [request("gpu")]), avoid_nodes=held))
    assert (out.allocated, out.cluster, out.node) == (True, "c1", "node-a")
    pinned = e.allocate(group(claim("y", [request("gpu")]), node="node-b", avoid_nodes=held))
    assert not pinned.allocated and pinned.reason == "unsatisfiable"
    again = e.allocate(group(claim("z", [request("gpu")]), node="node-b"))
    assert (again.allocated, again.node) == (True, "node-b")


def test_device_clusters_names_every_cluster_a_decision_may_use_whatever_is_in_use():
    # Attribute names as CEL reads them: device.attributes["<driver>"].<name>.
    e = engine(cluster("c1", {"a": gpus(2, model="h100")}), cluster("c2", {"b": gpus(2, model="l4")}),
               cluster("c3", {"c": gpus(2, model="h100")}, stale=True),
               allocated=[AllocatedDevice("c1", DRIVER, "a", "gpu-0"), AllocatedDevice("c1", DRIVER, "a", "gpu-1")])
    h100 = claim("h", [request("gpu", selectors=[f'device.attributes["{DRIVER}"].model == "h100"'])])
    assert e.device_clusters(group(h100)) == ["c1"]  # full now, but a release may free it; c3 is stale
    assert e.device_clusters(group(claim("any", [request("gpu")]))) == ["c1", "c2"]
    assert e.device_clusters(group(claim("any", [request("gpu")]), allowed_clusters=["c2"])) == ["c2"]
    nowhere = [f'device.attributes["{DRIVER}"].model == "mi300x"']
    assert e.device_clusters(group(claim("none", [request("gpu", selectors=nowhere)]))) == []
    assert e.device_clusters(group(claim("empty", []))) == []  # takes no device anywhere
    assert not e.allocate(group(h100)).allocated
