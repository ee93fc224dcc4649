"""Failure explanations counted per group of alike devices (dra/engine/explain_walk.py) against the per-device walk
they replaced, which is kept here as the reference: on random fleets (unique uuids, MIG partitions on shared
counters, taints, network devices reaching some nodes, incomplete and invalid pools, binding conditions, CEL
errors, features switched off) and random in-use states, every count must be the same. Then: the budget marks an
explanation sampled and never lets ``clusters_matching`` under-count; a new selector text costs the same however
many devices there are; the counts outlive changes in other clusters."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from benchmarks.engine_bench import claim as bench_claim
from benchmarks.engine_bench import exact, gpu_fleet
from dra.cel import SelectorCache
from dra.engine import AllocatedDevice, AllocationError, ClaimGroup, ClusterInventory, Engine, FleetSnapshot
from dra.engine.capacity import consumption, fits
from dra.engine.diagnostics import STAGES, _summary, explain, selector_errors
from dra.engine.model import REACH_NONE, device_reaches
from dra.engine.search import taint_blocks
from dra.engine.selectors import NO_MATCH, SelectorFailure, SelectorSet
from dra.engine.types import ErrorCode, Features

from .builders import DRIVER, claim, device, device_class, network_slice, node_slice, request

MIG = "mig.example.com"
NET = "net.example.com"
CLASSES = [device_class("gpu"), device_class("mig", f'device.driver == "{MIG}"'), device_class("any", "true"),
           device_class("net", f'device.driver == "{NET}"'),
           # A class selector that fails on the GPUs that publish no memoryGi: CEL errors at the class stage.
           device_class("big", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].memoryGi >= 80')]
GPU_SELECTORS = [
    f'device.attributes["{DRIVER}"].productName == "H100"',
    f'device.attributes["{DRIVER}"].productName != "L4"',
    f'device.attributes["{DRIVER}"].memoryGi >= 80',  # a CEL error where memoryGi is missing
    f'device.attributes["{DRIVER}"].index < 3',
    f'device.attributes["{DRIVER}"].numa == 0',
    f'device.attributes["{DRIVER}"].uuid != "GPU-0"',  # reads a per-device value: no partition on large clusters
    f'device.attributes["{DRIVER}"].uuid.startsWith("GPU-a")',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
    f'"{DRIVER}" in device.attributes && device.attributes["{DRIVER}"].productName == "A100"',
]
MIG_SELECTORS = [f'device.attributes["{MIG}"].profile == "1g"', f'device.attributes["{MIG}"].profile != "4g"']


# ---------------------------------------------------------------------------------------------- the reference
def reference_requests(e: Engine, grp: ClaimGroup, clusters, plans, skipped) -> list[dict]:
    """The per-device explanation as the engine made it before grouping (requests part, no cache): every device
    of every cluster evaluated on its own, with a selector memo of its own."""
    requests: dict[tuple, dict] = {}
    stale = [e.clusters[s["cluster"]] for s in skipped if s.get("reason") == "cluster_stale"]
    for cluster in list(clusters) + stale:
        plan = plans.get(cluster.name) or next(iter(plans.values()), None)
        if plan is None:
            continue
        for alt in plan.alts:
            key = (alt.claim_idx, alt.request_idx, alt.sub_idx)
            entry = requests.get(key)
            if entry is None:
                entry = requests[key] = {
                    "claim": plan.claims[alt.claim_idx].ref.split(" ", 1)[1], "request": alt.name,
                    "deviceClassName": alt.class_name, "allocationMode": "All" if alt.all_mode else "ExactCount",
                    "count": None if alt.all_mode else alt.count, "considered": 0,
                    "dropped": {s: 0 for s in STAGES}, "available": 0, "available_by_node": Counter(),
                    "_near": Counter(), "_exprs": alt.sel.request_exprs, "_selector_matching": 0,
                    "clusters_matching": Counter(), "_errors": {}}
            sel = SelectorSet(alt.sel.key, alt.sel.class_name, alt.sel.class_exprs, alt.sel.request_exprs,
                              SelectorCache(consumable_capacity=e.features.consumable_capacity),
                              e.features.consumable_capacity, len(e.devices))
            _reference_walk(e, grp, cluster, alt, sel, entry, cluster in stale)
    out = []
    for entry in requests.values():
        by_node, near, exprs = entry.pop("available_by_node"), entry.pop("_near"), entry.pop("_exprs")
        matching = entry.pop("_selector_matching")
        errors = selector_errors(entry.pop("_errors"))
        if errors:
            entry["selector_errors"] = errors
        entry["dropped"] = {k: v for k, v in entry["dropped"].items() if v}
        entry["best_nodes"] = [{"node": n, "available": c} for n, c in
                               sorted(by_node.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
        entry["nearest_miss"] = [{"selector": i, "expression": exprs[i], "would_match": c}
                                 for i, c in sorted(near.items())]
        entry["summary"] = _summary(entry, matching)
        entry["clusters_matching"] = dict(sorted((c, n) for c, n in entry["clusters_matching"].items() if n))
        out.append(entry)
    return out


def _reference_walk(e, grp, cluster, alt, sel, entry, stale) -> None:
    node = cluster.nodes.get(grp.node) if grp.node is not None else None
    for d in cluster.devices:
        entry["considered"] += 1
        stage = _reference_stage(e, cluster, alt, sel, d, stale, node, entry)
        if stage is None:
            entry["available"] += 1
            where = d.node_name if d.reach == "node" else "(network)"
            entry["available_by_node"][f"{cluster.name}/{where}"] += 1
        else:
            entry["dropped"][stage] += 1


def _reference_stage(e, cluster, alt, sel, d, stale, node, entry):
    features = e.features
    if stale:
        return "cluster_stale"
    if d.pool_ref.incomplete:
        return "pool_incomplete"
    if d.pool_ref.invalid:
        return "pool_invalid"
    if d.reach == REACH_NONE or (node is not None and not device_reaches(d, node)):
        return "node_mismatch"
    st = sel.evaluate(d)
    if isinstance(st, SelectorFailure):
        key = (cluster.name, st.origin, st.name, st.index, st.reason)
        seen = entry["_errors"].setdefault(key, [0, (d.driver, d.pool, d.name)])
        seen[0] += 1
        seen[1] = min(seen[1], (d.driver, d.pool, d.name))
        return "cel_error"
    if st is NO_MATCH:
        stage = sel.stage_of(d)
        if stage == "request_selector":
            for i in range(len(sel.request_exprs)):
                if sel.evaluate_partial(d, i) is not NO_MATCH:
                    entry["_near"][i] += 1
        return stage
    entry["_selector_matching"] += 1
    entry["clusters_matching"][cluster.name] += 1
    if d.binding_conditions and not features.device_binding_and_status:
        return "binding_conditions_unsupported"
    if d.consumes and not features.partitionable_devices:
        return "counters_unsupported"
    if not alt.admin and not e.is_free(d):
        return "allocated"
    if features.consumable_capacity:
        amounts = consumption(alt.cap_requests, d)
        if amounts is None or fits(amounts, d, e.cap_used.get(d.idx)) is not None:
            return "capacity"
    if d.consumes and not (d.allow_multiple and e.active.get(d.idx)):
        pool = d.pool_ref
        for set_name, counters in d.consumes:
            used = e.counters_used.get((pool.uid, set_name), {})
            total = pool.counter_sets.get(set_name, {})
            if any(amount > total.get(c, 0) - used.get(c, 0) for c, amount in counters.items()):
                return "counters"
    if features.device_taints and d.taints and taint_blocks(d.taints, alt.tolerations):
        return "taint"
    return None


# ---------------------------------------------------------------------------------------------- random fleets
def _gpu(rng: random.Random, name: str, index: int) -> dict:
    attrs: dict = {"productName": rng.choice(["H100", "A100", "L4"]), "index": index, "numa": index % 2,
                   "uuid": f"GPU-{rng.getrandbits(48):012x}"}
    if rng.random() < 0.8:
        attrs["memoryGi"] = rng.choice([40, 80])
    d = device(name, **attrs)
    roll = rng.random()
    if roll < 0.1:
        d["allowMultipleAllocations"] = True
        d["capacity"] = {"memory": {"value": "40Gi", "requestPolicy": {
            "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}}
    elif roll < 0.4:
        d["capacity"] = {"memory": {"value": rng.choice(["40Gi", "80Gi"])}}
    if rng.random() < 0.15:
        d["taints"] = [{"key": "maint", "value": "x", "effect": rng.choice(["NoSchedule", "NoExecute",
                                                                                "PreferNoSchedule"])}]
    if rng.random() < 0.05:
        d["bindingConditions"] = ["attached"]
        d["bindingFailureConditions"] = ["failed"]
    return d


def _mig_pool(node: str) -> list[dict]:
    """A counter-only slice and a slice of partitions consuming it (one pool of two slices), as MIG drivers
    publish them."""
    counters = {"sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}]}
    parts = []
    for i, (profile, mem) in enumerate([("1g", "10Gi"), ("1g", "10Gi"), ("2g", "20Gi"), ("4g", "40Gi")]):
        d = device(f"mig-{i}", profile=profile)
        d["consumesCounters"] = [{"counterSet": "gpu-0", "counters": {"memory": {"value": mem}}}]
        parts.append(d)
    head = node_slice(node, [], driver=MIG, pool=f"{node}-mig", name=f"{node}-mig-counters", count=2, **counters)
    del head["spec"]["devices"]
    return [head, node_slice(node, parts, driver=MIG, pool=f"{node}-mig", name=f"{node}-mig-parts", count=2)]


def _cluster(rng: random.Random, name: str, dense: bool, may_be_stale: bool) -> ClusterInventory:
    nodes = [f"{name}-n{i}" for i in range(rng.randint(2, 5))]
    per = 24 if dense else rng.randint(1, 6)  # dense: more distinct uuids than a partition keeps groups for
    slices = []
    for n in nodes:
        slices.append(node_slice(n, [_gpu(rng, f"gpu-{i}", i) for i in range(per)], pool=n, name=f"{n}-gpu"))
        if rng.random() < 0.5:
            slices += _mig_pool(n)
    if rng.random() < 0.5:
        slices.append(network_slice("net-all", [device(f"nic-{i}", speed=100) for i in range(3)], pool="net-all",
                                    driver=NET))
    if rng.random() < 0.5:
        sel = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "node", "operator": "In", "values": nodes[:1]}]}]}
        slices.append(network_slice("net-one", [_gpu(rng, f"fabric-{i}", i) for i in range(2)], pool="net-one",
                                    selector=sel))
    if rng.random() < 0.3:
        slices.append(node_slice(nodes[0], [_gpu(rng, "gpu-x", 0)], pool="incomplete", name="inc", count=2))
    if rng.random() < 0.3:
        slices.append(node_slice(nodes[-1], [_gpu(rng, "dup", 0), _gpu(rng, "dup", 1)], pool="invalid",
                                 name="dup"))
    if rng.random() < 0.2:  # no node field at all: reaches no node
        lost = network_slice("lost", [_gpu(rng, "lost-0", 0)], pool="lost")
        del lost["spec"]["allNodes"]
        slices.append(lost)
    return ClusterInventory(name, nodes=[{"name": n, "labels": {"node": n}} for n in nodes], resource_slices=slices,
                            stale=may_be_stale and rng.random() < 0.3)


def _features(rng: random.Random) -> Features:
    return Features(**{f: rng.random() > 0.2 for f in ("partitionable_devices", "device_taints",
                                                        "consumable_capacity", "device_binding_and_status")})


def _request(rng: random.Random, name: str, features: Features) -> dict:
    cls = rng.choice(["gpu", "gpu", "gpu", "mig", "any", "net", "big"])
    pool = MIG_SELECTORS if cls == "mig" else GPU_SELECTORS
    selectors = rng.sample(pool, rng.randint(0, 2))
    if rng.random() < 0.5:  # a CI pipeline's commit id, in an always-true clause
        selectors.append(f'"commit-{rng.getrandbits(32):08x}" != ""')
    extra: dict = {}
    if rng.random() < 0.1:
        extra["adminAccess"] = True
    if rng.random() < 0.25:
        extra["tolerations"] = [{"key": "maint", "operator": "Exists"}]
    if features.consumable_capacity and rng.random() < 0.2:
        extra["capacity"] = {"requests": {"memory": rng.choice(["10Gi", "30Gi", "60Gi"])}}
    if rng.random() < 0.1:
        return request(name, cls, selectors=selectors, mode="All", **extra)
    if features.prioritized_list and rng.random() < 0.12:
        return {"name": name, "firstAvailable": [
            {"name": "big", "deviceClassName": cls, "allocationMode": "ExactCount", "count": rng.randint(4, 12)},
            {"name": "small", "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1,
             "selectors": [{"cel": {"expression": s}} for s in selectors]}]}
    return request(name, cls, count=rng.choice([1, 1, 2, 3, 8, 14]), selectors=selectors, **extra)


def _group(rng: random.Random, e: Engine, seq: int) -> ClaimGroup:
    claims = [claim(f"c{seq}-{k}", [_request(rng, f"r{j}", e.features) for j in range(rng.randint(1, 2))])
              for k in range(rng.randint(1, 2))]
    node = None
    if rng.random() < 0.25:
        node = rng.choice([n for c in e.clusters.values() for n in c.nodes])
    allowed = None
    if rng.random() < 0.2:
        allowed = rng.sample(sorted(e.clusters), 1)
    return ClaimGroup(claims, allowed_clusters=allowed, node=node, key=f"g{seq}")


def _inputs(e: Engine, grp: ClaimGroup):
    """What ``Engine._allocate`` hands ``explain``; None when the group is an input error."""
    clusters, skipped = e._eligible_clusters(grp)
    plans = {}
    for cluster in clusters:
        try:
            plans[cluster.name] = e.plan_for(grp.claims, cluster.name)
        except AllocationError as exc:
            if exc.code != ErrorCode.UNKNOWN_CLASS:
                return None
            skipped.append({"cluster": cluster.name, "reason": "unknown_device_class", "detail": exc.message})
    return (clusters, plans, skipped) if plans else None


def _random_engine(seed: int) -> tuple[random.Random, Engine]:
    rng = random.Random(seed)
    clusters = [_cluster(rng, f"c{i}", dense=rng.random() < 0.4, may_be_stale=i > 0) for i in range(rng.randint(1, 3))]
    return rng, Engine(FleetSnapshot(clusters, CLASSES), features=_features(rng))


def _churn(rng: random.Random, e: Engine, held: list, seq: int) -> None:
    """Random in-use state: allocations of random groups, releases, and devices marked in use elsewhere."""
    for _ in range(rng.randint(0, 4)):
        out = e.allocate(_group(rng, e, seq), raise_errors=False)
        if out.allocated:
            held.append(out.devices)
    if held and rng.random() < 0.4:
        e.release(held.pop(rng.randrange(len(held))))
    if rng.random() < 0.5:
        d = rng.choice(e.devices)
        rec = AllocatedDevice(d.cluster, d.driver, d.pool, d.name)
        e.commit([rec])
        held.append([rec])


@pytest.mark.parametrize("seed", range(40))
def test_grouped_explanation_counts_what_the_per_device_walk_counted(seed):
    rng, e = _random_engine(seed)
    held: list = []
    compared = 0
    for step in range(12):
        _churn(rng, e, held, step)
        grp = _group(rng, e, 1000 + step)
        inputs = _inputs(e, grp)
        if inputs is None:
            continue
        clusters, plans, skipped = inputs
        want = reference_requests(e, grp, clusters, plans, skipped)
        for _ in range(2):  # the second answer comes from the remembered counts
            got = explain(e, grp, clusters, plans, skipped, [], [], None, "unsatisfiable")
            assert "sampled" not in got
            assert got["requests"] == want
        compared += 1
        out = e.allocate(grp, raise_errors=False)
        if not out.allocated and out.error is None and out.reason == "unsatisfiable":
            assert out.diagnostics["requests"] == reference_requests(e, grp, clusters, plans, skipped)
        elif out.allocated:
            held.append(out.devices)
    assert compared >= 3


@pytest.mark.parametrize("seed", range(12))
def test_a_budget_cut_explanation_says_so_and_never_under_counts_matching_clusters(seed):
    rng, e = _random_engine(seed)
    e.explain_checks, e.explain_evaluations = rng.randint(0, 20), rng.randint(0, 10)
    held: list = []
    sampled = 0
    for step in range(10):
        _churn(rng, e, held, step)
        grp = _group(rng, e, 1000 + step)
        inputs = _inputs(e, grp)
        if inputs is None:
            continue
        clusters, plans, skipped = inputs
        want = {(r["claim"], r["request"]): r for r in reference_requests(e, grp, clusters, plans, skipped)}
        got = explain(e, grp, clusters, plans, skipped, [], [], None, "unsatisfiable")
        assert bool(got.get("sampled")) == any(r.get("sampled") for r in got["requests"])
        sampled += bool(got.get("sampled"))
        for r in got["requests"]:
            ref = want[(r["claim"], r["request"])]
            left = r.get("not_examined", 0)
            assert bool(r.get("sampled")) == (left > 0)
            assert (r.get("sampled") or False) == ("sampled:" in r["summary"])
            assert r["considered"] == ref["considered"]
            assert sum(r["dropped"].values()) + r["available"] + left == r["considered"]
            assert r["available"] <= ref["available"]
            assert all(n <= ref["dropped"].get(stage, 0) for stage, n in r["dropped"].items())
            for cluster, n in ref["clusters_matching"].items():
                assert r["clusters_matching"].get(cluster, 0) >= n
            if not left:
                assert r == ref
    assert seed % 3 or sampled  # small budgets on these fleets do cut


def _full_fleet(nodes: int) -> Engine:
    """``nodes`` x 8 GPUs, all in use; each GPU publishes a uuid of its own, as real ones do (so no two devices
    have the same content)."""
    fleet = gpu_fleet(nodes, 8)
    for s in fleet.clusters[0].resource_slices:
        for d in s["spec"]["devices"]:
            d["attributes"]["uuid"] = {"string": f"GPU-{s['spec']['nodeName']}-{d['name']}"}
    e = Engine(fleet)
    for n in range(nodes):
        assert e.allocate(ClaimGroup(key=f"f{n}", claims=[bench_claim(f"f{n}", [exact("gpu", "gpu", 8)])])).allocated
    return e


def test_a_new_selector_text_costs_the_same_on_a_fleet_ten_times_larger():
    """Selector lookups for an explanation with a never-seen text: a few per group of alike devices, not one per
    device (the per-device walk made one or more per device: 10x the devices, 10x the lookups)."""
    lookups = []
    for nodes in (20, 200):
        e = _full_fleet(nodes)
        text = f'device.attributes["gpu.example.com"].index >= 0 && "commit-{nodes:08x}" != ""'
        grp = ClaimGroup(key="new", claims=[bench_claim("new", [exact("gpu", "gpu", 1, [text])])])
        before = e.cel_cache.stats()
        out = e.allocate(grp)
        after = e.cel_cache.stats()
        assert not out.allocated and out.diagnostics["requests"][0]["dropped"] == {"allocated": nodes * 8}
        lookups.append(after["hits"] + after["evaluations"] - before["hits"] - before["evaluations"])
    assert lookups[0] == lookups[1] < 100


def test_counts_outlive_changes_in_other_clusters():
    fleet = gpu_fleet(4, 8)
    other = gpu_fleet(4, 8)
    other.clusters[0].name = "other"
    e = Engine(FleetSnapshot(fleet.clusters + other.clusters, fleet.device_classes))
    held = [e.allocate(ClaimGroup(key=f"f{n}", claims=[bench_claim(f"f{n}", [exact("gpu", "gpu", 8)])]))
            for n in range(8)]
    assert all(h.allocated for h in held)
    big = ClaimGroup(key="big", claims=[bench_claim("big", [exact("gpu", "gpu", 9)])])
    assert not e.allocate(big).allocated
    cache = e.explained
    first = (cache.recounted, cache.walks)
    assert first == (2, 2)  # one count per cluster
    e.release(next(h for h in held if h.cluster == "other").devices)
    out = e.allocate(big)
    assert (cache.recounted, cache.walks) == (3, 2)  # only "other" counted again; selector stage kept for both
    assert out.diagnostics["requests"][0]["available"] == 8


def test_selectors_read_per_device_are_evaluated_within_the_budget():
    """A selector that reads each GPU's uuid: the engine keeps no partition for it, so an explanation evaluates
    device by device, at most ``explain_evaluations`` of them; the ones left are not examined and their cluster
    counts as matching (an upper bound). Once allocation has evaluated every device, the answers are known and
    the explanation is exact again."""
    e = _full_fleet(20)
    for n in range(20):
        e.release([AllocatedDevice("bench", DRIVER, f"node-{n:04d}", f"gpu-{i}") for i in range(8)])
    e.explain_evaluations = 10
    pin = ClaimGroup(key="pin", claims=[bench_claim("pin", [exact("gpu", "gpu", 1, [
        f'device.attributes["{DRIVER}"].uuid == "GPU-none"'])])])
    clusters, plans, skipped = _inputs(e, pin)
    before = e.cel_cache.stats()["evaluations"]
    got = explain(e, pin, clusters, plans, skipped, [], [], None, "unsatisfiable")
    assert e.cel_cache.stats()["evaluations"] - before <= 11  # the class selector once, the uuid 10 times
    r = got["requests"][0]
    assert got["sampled"] and r["not_examined"] == 150 and r["dropped"] == {"request_selector": 10}
    assert r["clusters_matching"] == {"bench": 150}
    out = e.allocate(pin)
    assert not out.allocated and "sampled" not in out.diagnostics
    r = out.diagnostics["requests"][0]
    assert r["dropped"] == {"request_selector": 160} and r["clusters_matching"] == {}
