"""The static inventory model: ResourceSlice JSON turned into pools and devices, once per engine.

Pools follow upstream ``GatherPools``: only the highest generation counts, a pool whose slice count does not
match ``resourceSliceCount`` is incomplete, a pool with duplicate device names or bad counter references is
invalid. Devices of incomplete or invalid pools are never allocated, but they are kept so that diagnostics can
say why they were skipped. Order is deterministic: pools by (driver, pool) with pools that have binding
conditions last, slices by name (slices with binding conditions after the others), devices in slice order.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .quantity import Amount, Q, QuantityError, parse_quantity
from .types import ClusterInventory, Features

if TYPE_CHECKING:
    from dra.cel import CELDevice

STANDARD_DOMAIN = "resource.kubernetes.io"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

REACH_NODE = "node"  # local to one node
REACH_ALL = "all"  # reachable from every node
REACH_SELECTOR = "selector"  # reachable from nodes matching a node selector
REACH_NONE = "none"  # no node field we understand: never reachable (upstream skips such slices)


class Node:
    __slots__ = ("cluster", "name", "labels", "candidates", "pools", "sig")

    def __init__(self, cluster: str, name: str, labels: dict[str, str] | None):
        self.cluster = cluster
        self.name = name
        self.labels = labels or {}
        self.candidates: list[Device] | None = None  # devices reachable from this node, in allocation order
        self.pools: list[Pool] | None = None  # pools with at least one slice relevant for this node
        self.sig: tuple | None = None  # content signature of the candidates (for node symmetry)


class Pool:
    __slots__ = ("cluster", "driver", "name", "generation", "slices", "devices", "incomplete", "invalid",
                 "invalid_reason", "counter_sets", "has_binding_conditions", "uid", "order")

    def __init__(self, cluster: str, driver: str, name: str, generation: int):
        self.cluster = cluster
        self.driver = driver
        self.name = name
        self.generation = generation
        self.slices: list[dict] = []
        self.devices: list[Device] = []
        self.incomplete = False
        self.invalid = False
        self.invalid_reason = ""
        self.counter_sets: dict[str, dict[str, Amount]] = {}
        self.has_binding_conditions = False
        self.uid = (cluster, driver, name)
        self.order = 0

    @property
    def pool_id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def usable(self) -> bool:
        return not (self.incomplete or self.invalid)


class Capacity:
    __slots__ = ("value", "fmt", "default", "valid_values", "has_range", "range_min", "range_max", "range_step",
                 "has_policy")

    def __init__(self, raw: dict):
        q = Q.parse(raw.get("value", "0"))
        self.value, self.fmt = q.value, q.fmt
        policy = raw.get("requestPolicy")
        self.has_policy = policy is not None
        policy = policy or {}
        self.default = Q.parse(policy["default"]) if policy.get("default") is not None else None
        self.valid_values = [Q.parse(v) for v in policy.get("validValues") or []] or None
        rng = policy.get("validRange")
        self.has_range = rng is not None
        rng = rng or {}
        self.range_min = Q.parse(rng["min"]) if rng.get("min") is not None else None
        self.range_max = Q.parse(rng["max"]) if rng.get("max") is not None else None
        self.range_step = Q.parse(rng["step"]) if rng.get("step") is not None else None


class Device:
    """One device of one pool. Static: the dynamic in-use state lives in the engine."""

    __slots__ = ("idx", "cluster", "driver", "pool", "name", "pool_ref", "slice_name", "reach", "node_name",
                 "node_selector", "result_node_name", "result_node_selector", "attributes", "capacity",
                 "consumes", "taints", "binding_conditions", "binding_failure_conditions", "binds_to_node",
                 "allow_multiple", "allow_multiple_raw", "sig", "content", "min_share", "locality", "_cel",
                 "attr_cache")

    # Set by ClusterModel._device (idx by ClusterModel._build), never changed afterwards.
    idx: int
    cluster: str
    driver: str
    pool: str
    name: str
    pool_ref: Pool
    slice_name: str
    reach: str  # REACH_*
    node_name: str | None
    node_selector: dict | None
    result_node_name: str | None
    result_node_selector: dict | None
    attributes: dict[str, dict]
    capacity: dict[str, Capacity]
    consumes: list[tuple[str, dict[str, Amount]]]  # (counter set, counter -> amount)
    taints: list[dict]
    binding_conditions: list[str]
    binding_failure_conditions: list[str]
    binds_to_node: bool
    allow_multiple: bool
    allow_multiple_raw: Any  # the slice's allowMultipleAllocations as given
    sig: tuple
    content: tuple
    min_share: dict[str, Amount]
    locality: tuple[str, Any] | None

    def __init__(self) -> None:
        self._cel: CELDevice | None = None
        self.attr_cache: dict = {}  # constraint attribute name -> typed value (constraints.attribute_value)

    @property
    def id_str(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"

    def attribute(self, qualified: str) -> dict | None:
        """Upstream ``lookupAttribute``: the full name, or the short name when the domain is the driver's."""
        attr = self.attributes.get(qualified)
        if attr is not None:
            return attr
        domain, sep, short = qualified.partition("/")
        if not sep or domain != self.driver:
            return None
        return self.attributes.get(short)


def _node_fields(obj: dict) -> tuple[str, str | None, dict | None]:
    node_name = obj.get("nodeName") or None
    if node_name:
        return REACH_NODE, node_name, None
    if obj.get("allNodes"):
        return REACH_ALL, None, None
    if obj.get("nodeSelector") is not None:
        return REACH_SELECTOR, None, obj["nodeSelector"]
    return REACH_NONE, None, None


def node_selector_matches(selector: dict | None, node: Node | None) -> bool:
    """``nodeaffinity.NodeSelector.Match``: terms are ORed, requirements within a term ANDed."""
    if node is None or not selector:
        return False
    for term in selector.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue  # an empty term matches no objects
        if all(_requirement_matches(r, node.labels) for r in exprs) and \
                all(_requirement_matches(r, {"metadata.name": node.name}) for r in fields):
            return True
    return False


def _requirement_matches(req: dict, labels: dict[str, str]) -> bool:
    key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
    label = labels.get(key) if key is not None else None
    present = label is not None
    if op == "In":
        return present and label in values
    if op == "NotIn":
        return not present or label not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if label is None or len(values) != 1:
            return False
        try:
            have, want = int(label), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def device_reaches(device: Device, node: Node | None) -> bool:
    """``NodeMatches`` for the device (per-device node selection) or its slice."""
    if device.reach == REACH_NODE:
        return node is not None and node.name == device.node_name
    if device.reach == REACH_ALL:
        return True
    if device.reach == REACH_SELECTOR:
        return node_selector_matches(device.node_selector, node)
    return False


def _canon(obj: Any) -> str:
    if not obj and isinstance(obj, (list, dict)):  # most taints and binding conditions: no encoder call
        return "[]" if isinstance(obj, list) else "{}"
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _taint_rules_for(rules: Iterable[dict], driver: str, pool: str, device: str) -> list[dict]:
    """Taints that DeviceTaintRules add to one device (the tracker's ``applyPatches``)."""
    out = []
    for rule in rules:
        spec = rule.get("spec") or {}
        sel = spec.get("deviceSelector")
        if sel is None:
            continue  # upstream: an empty selector matches every device, no selector none
        if sel.get("driver") is not None and sel["driver"] != driver:
            continue
        if sel.get("pool") is not None and sel["pool"] != pool:
            continue
        if sel.get("device") is not None and sel["device"] != device:
            continue
        taint = spec.get("taint") or {}
        out.append({k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k) is not None})
    return out


class ClusterModel:
    """Pools, devices and nodes of one cluster."""

    def __init__(self, inv: ClusterInventory, features: Features, first_idx: int):
        self.inventory = inv  # what it was built from: an engine built from the same object may reuse it
        self.name = inv.name
        self.labels = dict(inv.labels or {})
        self.stale = bool(inv.stale)
        self.features = features
        self.pools: list[Pool] = []
        self.devices: list[Device] = []
        self.nodes: dict[str, Node] = {}
        for n in inv.nodes or []:
            self.nodes[n["name"]] = Node(self.name, n["name"], n.get("labels"))
        self.node_order = sorted(self.nodes)
        self.has_network_devices = False
        self._build(inv, first_idx)

    def renumber(self, first_idx: int) -> None:
        """Give the devices indexes from ``first_idx`` on (in the order ``_build`` gave them), for a new engine
        that reuses this model because its cluster did not change. The engine that numbered them before must
        not be used any more: its state arrays are indexed by the old numbers."""
        for offset, d in enumerate(self.devices):
            d.idx = first_idx + offset

    def dispose(self) -> None:
        """Break this model's reference cycles (device <-> pool, device <-> CEL view, node caches) so that
        reference counting frees it at once, with no collection: a worker that keeps its engine frozen out of
        the collector's sight drops a replaced cluster's model this way (``Engine.dispose``)."""
        for pool in self.pools:
            pool.devices, pool.slices = [], []
        for d in self.devices:
            d.pool_ref = None  # type: ignore[assignment]
            d._cel = None
        for node in self.nodes.values():
            node.candidates = node.pools = None
        self.__dict__.clear()

    # -------------------------------------------------------------------------------------------- building
    def _build(self, inv: ClusterInventory, first_idx: int) -> None:
        by_pool: dict[tuple[str, str], list[dict]] = {}
        for s in inv.resource_slices or []:
            spec = s.get("spec") or {}
            pool = spec.get("pool") or {}
            by_pool.setdefault((spec.get("driver", ""), pool.get("name", "")), []).append(s)
        pools = []
        for (driver, pool_name), slices in by_pool.items():
            top = max(_generation(s) for s in slices)
            current = [s for s in slices if _generation(s) == top]
            pool = Pool(self.name, driver, pool_name, top)
            expected = int((current[0]["spec"].get("pool") or {}).get("resourceSliceCount", 0))
            # Completeness counts every slice of the generation, also those the features make us ignore.
            pool.incomplete = len(current) != expected
            if not self.features.partitionable_devices:
                # Upstream ignores these slices' content when the feature is off.
                current = [s for s in current if s["spec"].get("perDeviceNodeSelection") is None
                           and not s["spec"].get("sharedCounters")]
            pool.slices = sorted(current, key=lambda s: (_slice_has_binding(s), s["metadata"].get("name", "")))
            pools.append(pool)
        idx = first_idx
        for pool in pools:
            self._build_pool(pool, inv.device_taint_rules or [])
        pools.sort(key=lambda p: (p.has_binding_conditions, p.driver, p.name))
        for order, pool in enumerate(pools):
            pool.order = order
            for d in pool.devices:
                d.idx = idx
                idx += 1
                self.devices.append(d)
        self.pools = pools
        # Nodes named by slices but missing from the node list still exist as far as allocation is concerned.
        for d in self.devices:
            if d.reach == REACH_NODE and d.node_name is not None and d.node_name not in self.nodes:
                self.nodes[d.node_name] = Node(self.name, d.node_name, {})
            elif d.reach in (REACH_ALL, REACH_SELECTOR):
                self.has_network_devices = True
        self.node_order = sorted(self.nodes)

    def _build_pool(self, pool: Pool, taint_rules: list[dict]) -> None:
        names: set[str] = set()
        partitionable = self.features.partitionable_devices
        for s in pool.slices:
            spec = s["spec"]
            if partitionable and spec.get("sharedCounters"):
                for cs in spec["sharedCounters"]:
                    if cs.get("name") in pool.counter_sets:
                        pool.invalid, pool.invalid_reason = True, f"duplicate counter set name {cs.get('name')}"
                    try:
                        pool.counter_sets[cs.get("name")] = {
                            n: parse_quantity((c or {}).get("value", "0"))
                            for n, c in (cs.get("counters") or {}).items()}
                    except QuantityError as exc:
                        pool.invalid, pool.invalid_reason = True, f"counter set {cs.get('name')}: {exc}"
                continue
            per_device = bool(spec.get("perDeviceNodeSelection"))
            slice_reach = _node_fields(spec)
            for raw in spec.get("devices") or []:
                name = raw.get("name", "")
                if name in names and not pool.invalid:
                    pool.invalid, pool.invalid_reason = True, f"duplicate device name {name}"
                names.add(name)
                d = self._device(pool, s, raw, per_device, slice_reach, taint_rules)
                pool.devices.append(d)
                if d.binding_conditions:
                    pool.has_binding_conditions = True
        if partitionable and not pool.invalid:
            for d in pool.devices:
                for set_name, counters in d.consumes:
                    if set_name not in pool.counter_sets:
                        pool.invalid, pool.invalid_reason = True, f"counter set {set_name} not found"
                        break
                    missing = [c for c in counters if c not in pool.counter_sets[set_name]]
                    if missing:
                        pool.invalid = True
                        pool.invalid_reason = f"counter {missing[0]} not found in counter set {set_name}"
                        break
                if pool.invalid:
                    break

    def _device(self, pool: Pool, s: dict, raw: dict, per_device: bool, slice_reach, taint_rules) -> Device:
        spec = s["spec"]
        d = Device()
        d.cluster, d.driver, d.pool, d.name = self.name, pool.driver, pool.name, raw.get("name", "")
        d.pool_ref, d.slice_name = pool, s["metadata"].get("name", "")
        if per_device:
            d.reach, d.node_name, d.node_selector = _node_fields(raw)
            d.result_node_name, d.result_node_selector = raw.get("nodeName") or None, raw.get("nodeSelector")
        else:
            d.reach, d.node_name, d.node_selector = slice_reach
            d.result_node_name, d.result_node_selector = spec.get("nodeName") or None, spec.get("nodeSelector")
        d.attributes = raw.get("attributes") or {}
        d.capacity = {}
        for cname, craw in (raw.get("capacity") or {}).items():
            try:
                d.capacity[cname] = Capacity(craw or {})
            except QuantityError as exc:
                pool.invalid, pool.invalid_reason = True, f"device {d.name}: capacity {cname}: {exc}"
        consumes = []
        for cc in raw.get("consumesCounters") or []:
            try:
                consumes.append((cc.get("counterSet"), {n: parse_quantity((c or {}).get("value", "0"))
                                                        for n, c in (cc.get("counters") or {}).items()}))
            except QuantityError as exc:
                pool.invalid, pool.invalid_reason = True, f"device {d.name}: consumesCounters: {exc}"
        d.consumes = consumes
        taints = list(raw.get("taints") or [])
        taints += _taint_rules_for(taint_rules, d.driver, d.pool, d.name)
        d.taints = taints
        d.binding_conditions = list(raw.get("bindingConditions") or [])
        d.binding_failure_conditions = list(raw.get("bindingFailureConditions") or [])
        d.binds_to_node = bool(raw.get("bindsToNode"))
        d.allow_multiple_raw = raw.get("allowMultipleAllocations")
        d.allow_multiple = bool(d.allow_multiple_raw) and self.features.consumable_capacity
        # What CEL can see of the device: equal content, equal selector results (memoized per selector set).
        attributes = _canon(d.attributes)  # in both keys below: encoded once (a cluster's build is mostly this)
        d.content = (d.driver, attributes,
                     _canon({n: (c or {}).get("value") for n, c in (raw.get("capacity") or {}).items()}),
                     d.allow_multiple_raw)
        # The least one share of a multi-allocatable device can take from each capacity: once less than that
        # is left, the device cannot take another share.
        d.min_share = {}
        for cname, cap in d.capacity.items():
            if cap.has_range and cap.range_min is not None:
                d.min_share[cname] = cap.range_min.value
            elif cap.valid_values:
                d.min_share[cname] = min(v.value for v in cap.valid_values)
        locality = d.attribute(PCIE_ROOT) or d.attribute(f"{d.driver}/parentUUID")
        d.locality = _attr_scalar(locality)
        # Devices with the same signature are interchangeable for every check the search makes: CEL sees only
        # driver, attributes, capacity and allowMultipleAllocations; constraints see attributes; taints and
        # binding conditions are compared as data. Devices that share state (counters, multi-allocation) keep
        # their identity so that symmetry never hides a difference.
        if d.consumes or d.allow_multiple:
            d.sig = ("id", pool.uid, d.name)
        else:
            d.sig = (d.driver, attributes, _canon(raw.get("capacity") or {}), _canon(taints),
                     _canon(d.binding_conditions), _canon(d.binding_failure_conditions), d.binds_to_node,
                     # The node's name is left out: within one node all its local devices share it, and
                     # leaving it out lets identical nodes share one search (engine node shapes).
                     d.reach, _canon(d.node_selector) if d.node_selector else "",
                     d.allow_multiple_raw)
        return d

    # -------------------------------------------------------------------------------------------- per node
    def _pool_reach_index(self) -> None:
        """Pools by the node they are local to, and the pools reachable from more than one node."""
        self._local_pools: dict[str | None, list[Pool]] = {}  # by node name (never None for a local device)
        self._network_pools: list[Pool] = []
        for pool in self.pools:
            local_nodes, network = set(), False
            for d in pool.devices:
                if d.reach == REACH_NODE:
                    local_nodes.add(d.node_name)
                elif d.reach != REACH_NONE:
                    network = True
            for s in pool.slices:  # counter-only slices make a pool relevant to their node too
                reach, name, _ = _node_fields(s.get("spec") or {})
                if reach == REACH_NODE:
                    local_nodes.add(name)
                elif reach != REACH_NONE:
                    network = True
            for n in local_nodes:
                self._local_pools.setdefault(n, []).append(pool)
            if network:
                self._network_pools.append(pool)

    def node_candidates(self, node: Node) -> list[Device]:
        """Devices reachable from ``node`` in allocation order (pool order, then slice and device order)."""
        if node.candidates is None:
            if not hasattr(self, "_local_pools"):
                self._pool_reach_index()
            pools = sorted(set(self._local_pools.get(node.name, [])) | set(self._network_pools),
                           key=lambda p: p.order)
            cands, relevant_pools = [], []
            for pool in pools:
                relevant = False
                for d in pool.devices:
                    if device_reaches(d, node):
                        relevant = True
                        if pool.usable:
                            cands.append(d)
                if not relevant and not pool.devices:
                    relevant = any(_slice_reaches(s, node) for s in pool.slices)
                if relevant:
                    relevant_pools.append(pool)
            node.candidates = cands
            node.pools = relevant_pools
            node.sig = tuple(d.sig for d in cands)
        return node.candidates

    def node_pools(self, node: Node) -> list[Pool]:
        self.node_candidates(node)
        assert node.pools is not None  # node_candidates fills it
        return node.pools


def _slice_reaches(s: dict, node: Node) -> bool:
    reach, name, selector = _node_fields(s.get("spec") or {})
    if reach == REACH_NODE:
        return name == node.name
    if reach == REACH_ALL:
        return True
    if reach == REACH_SELECTOR:
        return node_selector_matches(selector, node)
    return False


def _generation(s: dict) -> int:
    return int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))


def _slice_has_binding(s: dict) -> bool:
    return any((d or {}).get("bindingConditions") for d in (s.get("spec") or {}).get("devices") or [])


def _attr_scalar(attr: dict | None) -> tuple[str, Any] | None:
    if not attr:
        return None
    for k in ("string", "int", "bool", "version"):
        if k in attr:
            return (k, attr[k])
    return None
