"""Where the devices of one cluster drop out for one request: counted per group of alike devices, within a budget.

``diagnostics.explain`` charges every device of the eligible clusters to the first check it fails. Those checks
come in two kinds:

* Static ones, fixed for the engine's life: the device's pool (incomplete, invalid), whether it reaches the
  group's node, the selectors (class, request, CEL error, nearest miss) and the features a device needs. They
  depend on the selector set, the cluster and the node, not on what is in use, so their ``SelectorCounts`` are
  kept across allocations and releases. The selectors are evaluated once per group of the partition the engine
  keeps for allocation (``partition``: devices that no selector of the set can tell apart), and the answer is
  charged to every member: a selector text never seen before (CI pipelines put commit ids in them) costs a few
  evaluations however many devices the cluster has, as it does for allocation. Only where the engine keeps no
  partition (the selectors read per-device values such as a uuid) is each device evaluated, within a budget.
* Dynamic ones (allocated, capacity, counters, taint), for the devices that pass the static ones: per device,
  within a budget, and remembered until something in that cluster changes (``Engine.cluster_version``), so a
  release in one cluster does not throw away what was counted in the others.

When a budget runs out, the devices left are counted as ``not_examined`` and the explanation says it was
sampled. The other counts are then lower bounds, except ``clusters_matching``, which adds the devices whose
selectors were not evaluated and so stays an upper bound: the claims service decides with it which releases can
wake a pending claim, and an under-count would leave a claim asleep.
"""
from __future__ import annotations

from collections import Counter, OrderedDict

from .capacity import consumption, fits
from .model import REACH_NODE, REACH_NONE, ClusterModel, Device, Node, device_reaches
from .search import taint_blocks
from .selectors import NO_MATCH, SelectorFailure, SelectorSet

# Per explanation: devices given the per-device checks (allocated, capacity, counters, taint; or a selector answer
# the set already holds), up to a few microseconds each; and selector evaluations for devices without a partition
# group or a known answer (selectors that read per-device values such as a uuid, on devices allocation has not
# evaluated), tens of microseconds each. Failures on the soak's fleet (40,000 devices) stay within both.
MAX_EXPLAIN_CHECKS = 50_000
MAX_EXPLAIN_EVALUATIONS = 2_000
# Remembered selector-stage counts (per selector set, cluster and node) and final counts (per claim shape,
# request, cluster and node). A selector-stage entry mostly points at the partition's own group lists; one that
# would hold more devices of its own than this is not remembered.
MAX_SELECTOR_COUNTS = 256
MAX_COUNTS = 256
MAX_OWNED = 4096


class ExplainBudget:
    """What one explanation may still spend on per-device work (what is refused is counted as not examined)."""

    __slots__ = ("checks", "evaluations")

    def __init__(self, checks: int, evaluations: int):
        self.checks = checks
        self.evaluations = evaluations

    def take_checks(self, wanted: int) -> int:
        granted = min(wanted, max(0, self.checks))
        self.checks -= granted
        return granted

    def take_evaluation(self) -> bool:
        if self.evaluations <= 0:
            return False
        self.evaluations -= 1
        return True


class SelectorCounts:
    """The static part for one (selector set, cluster, node): counts per stage, the nearest misses, how many
    devices match the selectors, and the devices that passed every static check (``passed``: lists, mostly the
    partition's own group lists). ``unevaluated``: devices reaching the node whose selectors the budget did not
    let us evaluate; ``owned``: devices in lists made here (what remembering this costs)."""

    __slots__ = ("considered", "dropped", "near", "matching", "passed", "unevaluated", "owned", "errors")

    def __init__(self, considered: int):
        self.considered = considered
        # (origin, class, selector index, error) -> [devices, first (driver, pool, device)]: CEL runtime errors
        self.errors: dict[tuple, list] = {}
        self.dropped: Counter = Counter()
        self.near: Counter = Counter()
        self.matching = 0
        self.passed: list[list[Device]] = []
        self.unevaluated = 0
        self.owned = 0


def selector_counts(engine, cluster: ClusterModel, sel: SelectorSet, node: Node | None,
                    budget: ExplainBudget) -> SelectorCounts:
    out = SelectorCounts(len(cluster.devices))
    for pool in cluster.pools:
        if pool.incomplete:
            out.dropped["pool_incomplete"] += len(pool.devices)
        elif pool.invalid:
            out.dropped["pool_invalid"] += len(pool.devices)
    part = engine.selector_partition(sel, cluster)
    if part is None:
        _per_device(engine, out, sel, [d for p in cluster.pools if p.usable for d in p.devices], node, budget)
        return out
    # The partition holds the usable devices (``partition.usable_devices``); with the binding feature off,
    # devices with binding conditions are outside it and are looked at one by one (they are few, and drop out
    # as binding_conditions_unsupported when the selectors match).
    reach = None if node is None else {d.idx for d in cluster.node_candidates(node)}
    split = not engine.features.partitionable_devices
    for group, placed in zip(part.groups, part.placed(), strict=True):
        if reach is None:
            members = placed
        else:
            members = [d for d in group if d.idx in reach]
            if len(members) == len(group):
                members = group
        out.dropped["node_mismatch"] += len(group) - len(members)
        if members:
            _charge_group(out, sel, members, group, split)
    if not engine.features.device_binding_and_status:
        outside = [d for p in cluster.pools if p.usable and p.has_binding_conditions for d in p.devices
                   if d.binding_conditions]
        _per_device(engine, out, sel, outside, node, budget)
    return out


def _charge_group(out: SelectorCounts, sel: SelectorSet, members: list[Device], group: list[Device],
                  split: bool) -> None:
    """One evaluation for the whole group: its members answer alike for every selector of ``sel``."""
    n = len(members)
    answer = sel.evaluate(members[0])
    if isinstance(answer, SelectorFailure):
        out.dropped["cel_error"] += n
        _note_error(out, answer, members)
        return
    if answer is NO_MATCH:
        stage = sel.stage_of(members[0])
        out.dropped[stage] += n
        if stage == "request_selector":
            for i in range(len(sel.request_exprs)):
                if sel.evaluate_partial(members[0], i) is not NO_MATCH:
                    out.near[i] += n
        return
    out.matching += n
    if split:  # counters_unsupported: the partitionable-devices feature is off
        kept = [d for d in members if not d.consumes]
        out.dropped["counters_unsupported"] += n - len(kept)
        if len(kept) < n:
            members = kept
    if members is not group:
        out.owned += len(members)
    if members:
        out.passed.append(members)


def _per_device(engine, out: SelectorCounts, sel: SelectorSet, devices: list[Device], node: Node | None,
                budget: ExplainBudget) -> None:
    features = engine.features
    passed = []
    for d in devices:
        if d.reach == REACH_NONE or (node is not None and not device_reaches(d, node)):
            out.dropped["node_mismatch"] += 1
            continue
        # An answer the set already holds (allocation evaluated the device) costs a check, not an evaluation.
        if not (budget.take_checks(1) if sel.known(d) else budget.take_evaluation()):
            out.unevaluated += 1
            continue
        answer = sel.evaluate(d)
        if isinstance(answer, SelectorFailure):
            out.dropped["cel_error"] += 1
            _note_error(out, answer, [d])
            continue
        if answer is NO_MATCH:
            stage = sel.stage_of(d)
            out.dropped[stage] += 1
            if stage == "request_selector":
                for i in range(len(sel.request_exprs)):
                    if sel.evaluate_partial(d, i) is not NO_MATCH:
                        out.near[i] += 1
            continue
        out.matching += 1
        if d.binding_conditions and not features.device_binding_and_status:
            out.dropped["binding_conditions_unsupported"] += 1
        elif d.consumes and not features.partitionable_devices:
            out.dropped["counters_unsupported"] += 1
        else:
            passed.append(d)
    if passed:
        out.passed.append(passed)
        out.owned += len(passed)


def _note_error(out: SelectorCounts, failure: SelectorFailure, devices: list[Device]) -> None:
    """Count a selector's runtime error on ``devices``; the example is the first device by name (the same
    however the devices were grouped)."""
    key = (failure.origin, failure.name, failure.index, failure.reason)
    example = min((d.driver, d.pool, d.name) for d in devices)
    seen = out.errors.get(key)
    if seen is None:
        out.errors[key] = [len(devices), example]
    else:
        seen[0] += len(devices)
        seen[1] = min(seen[1], example)


def later_counts(engine, cluster: ClusterModel, alt, static: SelectorCounts, budget: ExplainBudget) -> dict:
    """The final counts for ``alt`` in ``cluster``: the static ones, then per device that passed them the first
    of allocated, capacity, counters and taint it fails, or available."""
    counts: dict = {"considered": static.considered, "available": 0, "_selector_matching": static.matching,
                    "available_by_node": Counter(), "_near": Counter(static.near), "dropped": Counter(static.dropped),
                    "not_examined": static.unevaluated, "unevaluated": static.unevaluated,
                    "_errors": static.errors}
    dropped = counts["dropped"]
    excl, active, cap_used, admin = engine.excl, engine.active, engine.cap_used, alt.admin
    consumable, taints_on, admits = engine.features.consumable_capacity, engine.features.device_taints, \
        engine.capacity_admits
    allocated = available = 0
    per_node: dict[str | None, int] = {}  # node name (None: network-attached) -> devices available
    for devices in static.passed:
        take = budget.take_checks(len(devices))
        if take < len(devices):
            counts["not_examined"] += len(devices) - take
            devices = devices[:take]
        for d in devices:
            i = d.idx
            # ``Engine.is_free``, inline: a full fleet's explanation is mostly this line.
            if not admin and (excl[i] or (not d.allow_multiple and i in active)):
                allocated += 1
                continue
            if d.consumes or (taints_on and d.taints) or cap_used.get(i):
                stage = _free_stage(engine, alt, d)
            else:  # what ``_free_stage`` comes to for a device without counters, taints or shares
                stage = "capacity" if consumable and not admits(alt, d) else None
            if stage is None:
                available += 1
                where = d.node_name if d.reach == REACH_NODE else None
                per_node[where] = per_node.get(where, 0) + 1
            else:
                dropped[stage] += 1
    if allocated:
        dropped["allocated"] += allocated
    counts["available"] = available
    by_node = counts["available_by_node"]
    for where, n in per_node.items():
        by_node[f"{cluster.name}/{where if where is not None else '(network)'}"] += n
    return counts


def _free_stage(engine, alt, d: Device) -> str | None:
    """The dynamic checks after "allocated", in ``diagnostics.STAGES`` order."""
    features = engine.features
    if features.consumable_capacity:
        used = engine.cap_used.get(d.idx)
        if not used:  # nothing consumed yet: the engine's memo answers (it outlives selector texts)
            if not engine.capacity_admits(alt, d):
                return "capacity"
        else:
            amounts = consumption(alt.cap_requests, d)
            if amounts is None or fits(amounts, d, used) is not None:
                return "capacity"
    if d.consumes and not (d.allow_multiple and engine.active.get(d.idx)):
        pool = d.pool_ref
        for set_name, counters in d.consumes:
            used = engine.counters_used.get((pool.uid, set_name), {})
            total = pool.counter_sets.get(set_name, {})
            if any(amount > total.get(c, 0) - used.get(c, 0) for c, amount in counters.items()):
                return "counters"
    if features.device_taints and d.taints and taint_blocks(d.taints, alt.tolerations):
        return "taint"
    return None


class ExplainCache:
    """What explanations computed, per engine: selector-stage counts for the engine's life (bounded, LRU), final
    counts while their cluster's version stands still. ``walks``/``reused``: selector-stage counts computed and
    reused; ``recounted``/``hits``: final counts computed and reused (for tests and benchmarks)."""

    def __init__(self) -> None:
        self.selectors: OrderedDict[tuple, SelectorCounts] = OrderedDict()
        self.counts: dict[tuple, tuple[str, int, dict]] = {}  # key -> (cluster, its version then, counts)
        self.walks = self.reused = self.recounted = self.hits = 0

    def selector_counts(self, engine, cluster: ClusterModel, sel: SelectorSet, node: Node | None,
                        budget: ExplainBudget) -> SelectorCounts:
        key = (sel.key, cluster.name, node.name if node is not None else None)
        static = self.selectors.get(key)
        if static is not None:
            self.selectors.move_to_end(key)
            self.reused += 1
            return static
        self.walks += 1
        static = selector_counts(engine, cluster, sel, node, budget)
        # A budget-cut walk is not kept: the next explanation may have the budget to finish it.
        if not static.unevaluated and static.owned <= MAX_OWNED:
            self.selectors[key] = static
            if len(self.selectors) > MAX_SELECTOR_COUNTS:
                self.selectors.popitem(last=False)
        return static

    def final_counts(self, engine, cluster: ClusterModel, alt, node: Node | None, key: tuple | None,
                     budget: ExplainBudget) -> dict:
        version = engine.cluster_version.get(cluster.name, 0)
        if key is not None:
            hit = self.counts.get(key)
            if hit is not None and hit[1] == version:
                self.hits += 1
                return hit[2]
        self.recounted += 1
        static = self.selector_counts(engine, cluster, alt.sel, node, budget)
        counts = later_counts(engine, cluster, alt, static, budget)
        if key is not None and not counts["not_examined"]:
            if len(self.counts) >= MAX_COUNTS:
                current = engine.cluster_version
                for k in [k for k, (c, v, _) in self.counts.items() if current.get(c, 0) != v]:
                    del self.counts[k]
                if len(self.counts) >= MAX_COUNTS:
                    self.counts.clear()
            self.counts[key] = (cluster.name, version, counts)
        return counts


def stale_counts(cluster: ClusterModel) -> dict:
    """A stale cluster: every device is charged to ``cluster_stale`` (no selector is looked at)."""
    n = len(cluster.devices)
    return {"considered": n, "available": 0, "_selector_matching": 0, "available_by_node": Counter(),
            "_near": Counter(), "dropped": Counter({"cluster_stale": n} if n else {}), "not_examined": 0,
            "unevaluated": 0, "_errors": {}}
