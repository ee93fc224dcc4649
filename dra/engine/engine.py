"""The ``Engine``: a fleet snapshot, the devices in use, and ``allocate``/``release`` on top of them.

Build once per snapshot; every successful ``allocate`` updates the in-use state and the per-selector indexes
incrementally, so the next group sees those devices as taken without any rescan.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from dra.cel import CELCompileError, SelectorCache

from .capacity import consumption, fits
from .diagnostics import explain
from .explain_walk import MAX_EXPLAIN_CHECKS, MAX_EXPLAIN_EVALUATIONS, ExplainCache
from .index import KeyIndex
from .model import REACH_NODE, ClusterModel, Device, Node
from .partition import Partition
from .plan import GroupPlan, build_plan
from .quantity import Amount, Q, QuantityError, format_quantity
from .results import build_allocation, share_id
from .search import Budget, NodeError, NodeSearch, SearchBudgetExceeded
from .selector_state import MAX_KEY_INDEXES, MAX_SELECTOR_SETS, SelectorState
from .selectors import SelectorSet, cel_device_of
from .types import (
    AllocatedDevice,
    AllocationError,
    ClaimGroup,
    ClaimOutcome,
    ErrorCode,
    Features,
    FleetSnapshot,
    GroupOutcome,
    Reason,
    SearchBudget,
)

# Cached plans (one per distinct claim spec) and the node failures remembered per plan, both bounded: a worker
# sees an endless stream of distinct specs.
MAX_PLANS = 1024
MAX_NODE_FAILURES = 100_000
MAX_CAPACITY_ADMITS = 200_000
_EMPTY: dict = {}  # never written: the default of lookups


class Engine:
    def __init__(self, snapshot: FleetSnapshot, allocated: Iterable[AllocatedDevice] = (),
                 features: Features | None = None, budget: SearchBudget | None = None,
                 max_selector_sets: int = MAX_SELECTOR_SETS, max_key_indexes: int = MAX_KEY_INDEXES,
                 reuse: Mapping[str, ClusterModel] | None = None):
        """``reuse``: the cluster models of an engine being replaced (the caller drops it): a cluster whose
        ``ClusterInventory`` is the very object a model was built from is not built again, so a change in one
        cluster costs that cluster's build, not the fleet's (at 40,000 devices a build is seconds)."""
        self.features = features or Features()
        self.budget = budget or SearchBudget()
        self.cel_cache = SelectorCache(consumable_capacity=self.features.consumable_capacity)
        self.fleet_classes = {c["metadata"]["name"]: c for c in snapshot.device_classes or []}
        self.clusters: dict[str, ClusterModel] = {}
        self.cluster_classes: dict[str, dict[str, dict]] = {}
        idx = 0
        for inv in sorted(snapshot.clusters, key=lambda c: c.name):
            model = (reuse or {}).get(inv.name)
            if model is not None and model.inventory is inv and model.features == self.features:
                model.renumber(idx)
            else:
                model = ClusterModel(inv, self.features, idx)
            idx += len(model.devices)
            self.clusters[inv.name] = model
            self.cluster_classes[inv.name] = {c["metadata"]["name"]: c for c in inv.device_classes or []}
        self.devices: list[Device] = [d for m in self.clusters.values() for d in m.devices]
        self.by_id: dict[tuple[str, str, str, str], Device] = {
            (d.cluster, d.driver, d.pool, d.name): d for d in self.devices}
        # Dynamic state. Admin-access allocations are recorded by callers but never consume a device.
        self.excl = bytearray(len(self.devices))  # 1: allocated whole
        self.active: dict[int, int] = {}  # multi-allocatable device -> number of shares
        self.shares: dict[int, dict[str, dict[str, Amount]]] = {}  # device -> share id -> consumed capacity
        self.cap_used: dict[int, dict[str, Amount]] = {}  # device -> summed consumed capacity of its shares
        self.counters_used: dict[tuple, dict[str, Amount]] = {}  # (pool uid, counter set) -> consumed
        self.node_used: dict[tuple[str, str], int] = {}  # (cluster, node) -> devices in use on the node
        self.unknown_allocated: set[tuple] = set()  # records naming devices this snapshot does not have
        # Index-level availability: free, counters fit, capacity left. An upper bound for the exact checks.
        self.avail = bytearray(len(self.devices))
        self.counter_users: dict[tuple, list[Device]] = {}  # (pool uid, counter set) -> devices consuming it
        for d in self.devices:
            for set_name, _ in d.consumes:
                self.counter_users.setdefault((d.pool_ref.uid, set_name), []).append(d)
        # Versions: a node's answer for a claim shape can only change when something reachable from it changes.
        self.node_version: dict[tuple[str, str], int] = {}
        self.net_version: dict[str, int] = {}
        self._node_failures: dict[tuple, tuple] = {}
        # Per cluster, moves on every allocation and release there: what was computed about a cluster's in-use
        # state (diagnostics' per-shape device counts, ``explained``) is valid while it stands still.
        self.cluster_version: dict[str, int] = {}
        self.explained = ExplainCache()
        self._explain = True  # this allocate call explains its failure (``allocate(explain=...)``)
        # Per-device work one failure explanation may do (``explain_walk``); past it the explanation is sampled.
        self.explain_checks = MAX_EXPLAIN_CHECKS
        self.explain_evaluations = MAX_EXPLAIN_EVALUATIONS
        self._share_seq = 0
        self._selectors = SelectorState(self, max_selector_sets, max_key_indexes)
        self._plans: OrderedDict[tuple, GroupPlan] = OrderedDict()
        self._capacity_admits: dict[tuple, bool] = {}  # (capacity requests, device) -> fits when dedicated
        for d in self.devices:
            self.avail[d.idx] = self._available(d)
        for rec in allocated:
            self._apply_record(rec, +1)

    def dispose(self, keep: Iterable[ClusterModel] = ()) -> None:
        """This engine will not be used again: break its reference cycles (engine <-> its indexes and caches,
        and those of its cluster models not in ``keep``, which a new engine reuses) so that reference counting
        frees it without a full collection (over a second at 40,000 devices, ``memory.release_frozen``)."""
        kept = {id(m) for m in keep}
        for model in self.clusters.values():
            if id(model) not in kept:
                model.dispose()
        self.__dict__.clear()

    def build_cel_views(self) -> None:
        """Build every device's CEL view now rather than on first use (see ``memory.freeze_long_lived``)."""
        for d in self.devices:
            cel_device_of(d).view()

    # ------------------------------------------------------------------------------------------ state
    def is_free(self, d: Device) -> bool:
        """Free for a non-admin request as far as "in use" goes (capacity and counters are checked later)."""
        return not self.excl[d.idx] and (d.allow_multiple or not self.active.get(d.idx))

    def _device_allocated(self, d: Device) -> bool:
        return bool(self.excl[d.idx] or self.active.get(d.idx))

    def capacity_admits(self, alt, d: Device) -> bool:
        """Can a dedicated (not shared) allocation of ``d`` satisfy the alternative's capacity requests?"""
        key = (alt.cap_key, d.idx)
        ok = self._capacity_admits.get(key)
        if ok is None:
            amounts = consumption(alt.cap_requests, d)
            ok = self._capacity_admits[key] = amounts is not None and fits(amounts, d) is None
        return ok

    def _available(self, d: Device) -> bool:
        """Could a non-admin request get ``d`` now, as far as the device alone can tell?"""
        idx = d.idx
        if self.excl[idx]:
            return False
        if d.allow_multiple:
            used = self.cap_used.get(idx)
            if used:
                for name, least in d.min_share.items():
                    if d.capacity[name].value - used.get(name, 0) < least:
                        return False
            if self.active.get(idx):
                return True  # counters were charged with the first share
        elif self.active.get(idx):
            return False
        if d.consumes and self.features.partitionable_devices:
            pool = d.pool_ref
            uid, counter_sets, counters_used = pool.uid, pool.counter_sets, self.counters_used
            for set_name, counters in d.consumes:
                total = counter_sets.get(set_name, _EMPTY)
                used = counters_used.get((uid, set_name), _EMPTY)
                for cname, amount in counters.items():
                    if amount > total.get(cname, 0) - used.get(cname, 0):
                        return False
        return True

    def _refresh(self, d: Device) -> None:
        now = self._available(d)
        if now != self.avail[d.idx]:
            self.avail[d.idx] = now
            self._selectors.note_device(d.cluster, d, now)

    def _apply_record(self, rec: AllocatedDevice, sign: int) -> None:
        d = self.by_id.get((rec.cluster, rec.driver, rec.pool, rec.device))
        if d is None:
            key = (rec.cluster, rec.driver, rec.pool, rec.device, rec.share_id)
            (self.unknown_allocated.add if sign > 0 else self.unknown_allocated.discard)(key)
            return
        self._apply(d, rec, sign)

    def _apply(self, d: Device, rec: AllocatedDevice, sign: int) -> None:
        """``rec`` (which names ``d``) comes into use (sign 1) or goes."""
        if rec.admin_access:
            return
        self.cluster_version[d.cluster] = self.cluster_version.get(d.cluster, 0) + 1
        was_allocated = self._device_allocated(d)
        if rec.share_id is not None or rec.consumed_capacity is not None:
            amounts: dict[str, Amount] = {}
            for name, value in (rec.consumed_capacity or {}).items():
                try:
                    amounts[name] = Q.parse(value).value
                except QuantityError:
                    continue
            sid = rec.share_id or f"aggregated-{len(self.shares.get(d.idx, {}))}"
            self._change_share(d, sid, amounts, sign)
        else:
            self.excl[d.idx] = 1 if sign > 0 else 0
        now_allocated = self._device_allocated(d)
        if d.reach == REACH_NODE:
            assert d.node_name is not None  # a node-local device names its node
            k = (d.cluster, d.node_name)
            self.node_version[k] = self.node_version.get(k, 0) + 1
        else:
            self.net_version[d.cluster] = self.net_version.get(d.cluster, 0) + 1
        if was_allocated != now_allocated:
            self._allocated_changed(d, 1 if now_allocated else -1)
        self._refresh(d)

    def _change_share(self, d: Device, sid: str, amounts: dict[str, Amount], sign: int) -> None:
        shares = self.shares.setdefault(d.idx, {})
        if sign < 0:
            if sid not in shares:
                return
            amounts = shares.pop(sid)
        else:
            shares[sid] = amounts
        used = self.cap_used.setdefault(d.idx, {})
        for name, value in amounts.items():
            used[name] = used.get(name, 0) + sign * value
        self.active[d.idx] = self.active.get(d.idx, 0) + sign
        if self.active[d.idx] <= 0:
            self.active.pop(d.idx, None)
            self.cap_used.pop(d.idx, None)
            self.shares.pop(d.idx, None)

    def _allocated_changed(self, d: Device, sign: int) -> None:
        """``d`` went from unallocated to allocated (sign 1) or back: counters and node usage follow."""
        uid = d.pool_ref.uid
        for set_name, counters in d.consumes:
            used = self.counters_used.setdefault((uid, set_name), {})
            for cname, amount in counters.items():
                used[cname] = used.get(cname, 0) + sign * amount
            # More consumption can only make siblings unavailable, less only available again.
            want = 1 if sign > 0 else 0
            for sibling in self.counter_users.get((uid, set_name), ()):
                if sibling is d:
                    continue
                if sibling.reach == REACH_NODE and sibling.node_name != d.node_name:
                    # A counter set shared across nodes: the other node's answers change too.
                    assert sibling.node_name is not None
                    k = (sibling.cluster, sibling.node_name)
                    self.node_version[k] = self.node_version.get(k, 0) + 1
                elif sibling.reach != REACH_NODE:
                    self.net_version[d.cluster] = self.net_version.get(d.cluster, 0) + 1
                if self.avail[sibling.idx] == want:
                    self._refresh(sibling)
        if d.reach == REACH_NODE:
            assert d.node_name is not None
            key = (d.cluster, d.node_name)
            before = self.node_used.get(key, 0)
            self.node_used[key] = before + sign
            if (before == 0) != (self.node_used[key] == 0):
                self._selectors.note_node(d.cluster, d.node_name)

    def release(self, devices: Iterable[AllocatedDevice]) -> None:
        for rec in devices:
            self._apply_record(rec, -1)

    def commit(self, devices: Iterable[AllocatedDevice]) -> None:
        """Mark devices as in use that were allocated elsewhere (another engine, another worker)."""
        for rec in devices:
            self._apply_record(rec, +1)

    # ------------------------------------------------------------------------------------------ lookups
    def get_class(self, cluster: str | None, name: str) -> dict | None:
        if cluster is not None:
            klass = self.cluster_classes.get(cluster, {}).get(name)
            if klass is not None:
                return klass
        return self.fleet_classes.get(name)

    def selector_set(self, class_name: str, class_exprs: tuple, request_exprs: tuple) -> SelectorSet:
        key = (class_name, class_exprs, request_exprs)
        return self._selectors.selector_set(key, lambda: SelectorSet(
            key, class_name, class_exprs, request_exprs, self.cel_cache, self.features.consumable_capacity,
            len(self.devices)))

    def key_index(self, sel: SelectorSet, cluster: ClusterModel) -> KeyIndex:
        return self._selectors.key_index(sel, cluster)

    def selector_partition(self, sel: SelectorSet, cluster: ClusterModel) -> Partition | None:
        """The groups of ``cluster``'s usable devices that ``sel`` cannot tell apart (None: about one per device)."""
        return self._selectors.partition(sel, cluster)

    def selector_stats(self) -> dict:
        """How much per-selector state the engine holds (bounded) and how much it evicted."""
        return self._selectors.stats()

    def node_selector_candidates(self, cluster: ClusterModel, node: Node, sel: SelectorSet) -> list[Device]:
        """Devices reachable from ``node`` that ``sel`` does not rule out, in allocation order (static)."""
        return self._selectors.node_candidates(sel, cluster, node)

    def plan_for(self, claims: list[dict], cluster: str | None) -> GroupPlan:
        """The search plan for these claims; cached by claim specs (``repr`` is cheap; a spec written with
        another key order only misses the cache)."""
        scope = cluster if cluster is not None and self.cluster_classes.get(cluster) else None
        key = (scope, repr([c.get("spec") for c in claims]))
        plan = self._plans.get(key)
        if plan is None:
            plan = build_plan(claims, self.features, lambda name: self.get_class(scope, name), self.selector_set)
            plan.fp = key
            plan.primary = _primary(plan)
            self._plans[key] = plan
            if len(self._plans) > MAX_PLANS:
                self._plans.popitem(last=False)
            if len(self._node_failures) > MAX_NODE_FAILURES:
                self._node_failures.clear()  # only a shortcut: a node is searched again
            if len(self._capacity_admits) > MAX_CAPACITY_ADMITS:
                self._capacity_admits.clear()
            return plan
        self._plans.move_to_end(key)
        return plan.for_claims(claims)

    # ------------------------------------------------------------------------------------------ allocate
    def allocate(self, group: ClaimGroup, *, raise_errors: bool = True, explain: bool = True) -> GroupOutcome:
        """``explain=False``: a failure carries only its reason (not told apart from an invalid pool's unless a
        node said so), not the per-request explanation: for callers that only ask whether the group fits, such as
        the plan's candidate times."""
        self._explain = explain
        try:
            return self._allocate(group)
        except AllocationError as exc:
            if raise_errors:
                raise
            return GroupOutcome(False, key=group.key, reason=None, message=exc.message, error=exc,
                                diagnostics={"error": exc.to_dict()})
        except CELCompileError as exc:  # defensive: plans compile everything up front
            err = AllocationError(ErrorCode.CEL, str(exc))
            if raise_errors:
                raise err from exc
            return GroupOutcome(False, key=group.key, message=err.message, error=err)

    def device_clusters(self, group: ClaimGroup) -> list[str]:
        """The clusters whose devices ``allocate(group)`` may take, whatever is in use now: the eligible ones
        (allowed, not stale, holding its node) where its main request's selectors match some device. A
        superset, from static facts only, for a caller that must know before deciding which clusters a
        decision can touch (the claims round's per-cluster turns). Empty when it takes no device anywhere (no
        requests, or nothing matches). Input errors (bad CEL, limits) give every eligible cluster: ``allocate``
        reports them. Callers meter CEL cost as for ``allocate``."""
        clusters, _ = self._eligible_clusters(group)
        names = [c.name for c in clusters]
        out = []
        for cluster in clusters:
            try:
                plan = self.plan_for(group.claims, cluster.name)
                if plan.primary[0] is None:  # no requests
                    return []
                ki = self.key_index(plan.primary[0].sel, cluster)
            except AllocationError as exc:
                if exc.code == ErrorCode.UNKNOWN_CLASS:
                    continue
                return names
            except CELCompileError:
                return names
            if 1 in ki.member:
                out.append(cluster.name)
        return out

    def _eligible_clusters(self, group: ClaimGroup) -> tuple[list[ClusterModel], list[dict]]:
        skipped = []
        out = []
        allowed = set(group.allowed_clusters) if group.allowed_clusters is not None else None
        for name, cluster in self.clusters.items():
            if allowed is not None and name not in allowed:
                continue
            if cluster.stale:
                skipped.append({"cluster": name, "reason": "cluster_stale"})
                continue
            if group.node is not None and group.node not in cluster.nodes:
                skipped.append({"cluster": name, "reason": "node_not_in_cluster"})
                continue
            out.append(cluster)
        if len(out) > 1:
            out.sort(key=lambda c: (0 if c.name == group.preferred_cluster else 1, c.name))
        return out, skipped

    def _allocate(self, group: ClaimGroup) -> GroupOutcome:
        clusters, skipped = self._eligible_clusters(group)
        plans: dict[str, GroupPlan] = {}
        first_error: AllocationError | None = None
        for cluster in clusters:
            try:
                plans[cluster.name] = self.plan_for(group.claims, cluster.name)
            except AllocationError as exc:
                if exc.code != ErrorCode.UNKNOWN_CLASS:
                    raise
                first_error = first_error or exc
                skipped.append({"cluster": cluster.name, "reason": "unknown_device_class", "detail": exc.message})
        if not plans:
            if first_error is not None:
                raise first_error
            # Nothing to try, but input errors (unknown class, bad CEL, limits) must still surface.
            self.plan_for(group.claims, None)
            return self._failure(group, Reason.NO_ELIGIBLE_CLUSTER, "no eligible cluster", clusters, plans,
                                 skipped, [], [], None)
        any_plan = next(iter(plans.values()))
        if any_plan.primary[0] is None:
            # Nothing to allocate (claims without requests): trivially satisfied anywhere.
            cluster = clusters[0]
            return self._success(group, any_plan, cluster, None, [[] for _ in any_plan.claims], {}, None)
        budget = Budget(self.budget.max_steps, self.budget.max_seconds)
        node_log: list[dict] = []
        node_errors: list[AllocationError] = []
        examined = searched = 0
        failed_shapes: set = set()
        try:
            for cluster, node in self._node_order(group, clusters, plans):
                plan = plans[cluster.name]
                examined += 1
                version = (self.node_version.get((cluster.name, node.name), 0), self.net_version.get(cluster.name, 0))
                fail_key = (plan.fp, cluster.name, node.name)
                if self._node_failures.get(fail_key) == version:
                    # This claim shape already failed here and nothing reachable from the node changed since.
                    self._node_failed(cluster, node, {"reason": "unchanged_since_last_failure"}, node_log,
                                      node_errors)
                    continue
                search = NodeSearch(self, plan, cluster, node, budget)
                shape = None
                try:
                    if not search.preflight():
                        self._node_failures[fail_key] = version
                        self._node_failed(cluster, node, search.failure, node_log, node_errors)
                        continue
                    if failed_shapes:
                        shape = self._node_shape(cluster, node)
                        if shape in failed_shapes:
                            self._node_failed(cluster, node, {"reason": "same_as_failed_node"}, node_log,
                                              node_errors)
                            continue
                    searched += 1
                    if searched > self.budget.max_nodes:
                        raise SearchBudgetExceeded()
                    if search.solve():
                        return self._success(group, plan, cluster, node, search.results, search.selected, budget)
                    failed_shapes.add(shape or self._node_shape(cluster, node))
                    self._node_failures[fail_key] = version
                    self._node_failed(cluster, node, {"reason": "no_combination"}, node_log, node_errors)
                except NodeError as exc:
                    node_errors.append(exc.error)
                    node_log.append({"cluster": cluster.name, "node": node.name, "reason": "error",
                                     "detail": exc.error.message})
        except SearchBudgetExceeded:
            return self._failure(group, Reason.SEARCH_BUDGET_EXCEEDED,
                                 f"search budget exceeded after {budget.steps} steps on {searched} nodes", clusters,
                                 plans, skipped,
                                 node_log, node_errors, budget)
        if node_errors and (group.node is not None or len(node_errors) == examined):
            raise node_errors[0]
        if any(e.code == ErrorCode.POOL_INVALID for e in node_errors) or \
                (group.node is None and self._explain and self._relevant_invalid_pool(clusters, plans)):
            # Upstream reports this per node; fleet-wide it is the reason when nothing fit anywhere.
            return self._failure(group, Reason.INVALID_POOLS, "invalid resource pools were encountered", clusters,
                                 plans, skipped, node_log, node_errors, budget)
        return self._failure(group, Reason.UNSATISFIABLE, "cannot be allocated", clusters, plans, skipped, node_log,
                             node_errors, budget)

    @staticmethod
    def _relevant_invalid_pool(clusters, plans) -> bool:
        """Is there an invalid pool of a driver the group's classes could select (any driver if unknown)?"""
        for cluster in clusters:
            plan = plans.get(cluster.name)
            if plan is None:
                continue
            drivers: set | None = set()
            for alt in plan.alts:
                if alt.sel.drivers is None:
                    drivers = None
                    break
                drivers |= alt.sel.drivers
            if any(p.invalid and (drivers is None or p.driver in drivers) for p in cluster.pools):
                return True
        return False

    def _node_failed(self, cluster, node, failure, node_log, node_errors) -> None:
        invalid = [p for p in cluster.node_pools(node) if p.invalid]
        if invalid:
            err = AllocationError(ErrorCode.POOL_INVALID, "invalid resource pools were encountered")
            node_errors.append(err)
            failure = dict(failure or {}, invalid_pools=[f"{p.pool_id}: {p.invalid_reason}" for p in invalid])
        if len(node_log) < 50:
            node_log.append(dict({"cluster": cluster.name, "node": node.name}, **(failure or {})))

    def _node_shape(self, cluster: ClusterModel, node: Node) -> tuple:
        """Everything about a node that the search can see, up to device names: equal shapes, equal answers."""
        cands = cluster.node_candidates(node)
        usage = []
        for i, d in enumerate(cands):
            if self.excl[d.idx] or d.idx in self.active:
                usage.append((i, self.excl[d.idx], tuple(sorted(self.cap_used.get(d.idx, {}).items()))))
        return (node.sig, tuple(usage))

    def _node_order(self, group: ClaimGroup, clusters: list[ClusterModel], plans: dict[str, GroupPlan]):
        """(cluster, node) pairs in policy order; only nodes whose free devices could hold the main request."""
        avoid = group.avoid_nodes
        if group.node is not None:
            for cluster in clusters:
                if (cluster.name, group.node) not in avoid:
                    yield cluster, cluster.nodes[group.node]
            return
        streams = []
        for cluster in clusters:
            plan = plans.get(cluster.name)
            if plan is None or not cluster.nodes:
                continue
            primary, need_exclusive, need_shared = plan.primary
            ki = self.key_index(primary.sel, cluster)
            streams.append((cluster, ki.nodes(need_shared if ki.multi else need_exclusive)))
        if len(streams) == 1:  # one cluster (most fleets, or a group bound to one): its order is the order
            cluster, nodes = streams[0]
            for _, nname in nodes:
                if avoid and (cluster.name, nname) in avoid:
                    continue
                yield cluster, cluster.nodes[nname]
            return
        ranked = [_ranked(0 if cluster.name == group.preferred_cluster else 1, cluster.name, nodes)
                  for cluster, nodes in streams]
        for _, _, cname, nname in heapq.merge(*ranked):
            if avoid and (cname, nname) in avoid:
                continue
            cluster = self.clusters[cname]
            yield cluster, cluster.nodes[nname]

    # ------------------------------------------------------------------------------------------ outcomes
    def _success(self, group, plan, cluster, node, results, selected, budget) -> GroupOutcome:
        outcomes, records, devices = [], [], []
        node_local = False
        for ci, (cp, picks) in enumerate(zip(plan.claims, results, strict=False)):
            sids = []
            for pick in picks:
                d = pick.device
                if d.reach == "node":
                    node_local = True
                sid = None
                if pick.share:
                    self._share_seq += 1
                    meta = cp.claim.get("metadata") or {}
                    sid = share_id(f"{d.cluster}/{d.id_str}/{meta.get('namespace')}/{meta.get('name')}/"
                                   f"{meta.get('uid')}/{pick.alt.name}/{self._share_seq}")
                sids.append(sid)
                consumed = {n: format_quantity(q.value, q.fmt) for n, q in pick.amounts.items()} \
                    if pick.amounts else None
                rec = AllocatedDevice(cluster.name, d.driver, d.pool, d.name, sid, consumed, pick.alt.admin)
                records.append(rec)
                devices.append(d)
            claim_selected = {ri: si for (c, ri), si in selected.items() if c == ci}
            alloc = build_allocation(cp, picks, claim_selected, node, self.features, sids)
            meta = cp.claim.get("metadata") or {}
            outcomes.append(ClaimOutcome(meta.get("name", ""), meta.get("namespace", "") or "",
                                         meta.get("uid", "") or "", alloc))
        for d, rec in zip(devices, records, strict=True):
            self._apply(d, rec, +1)
        diagnostics = {"policy": "BinPack", "search": {"steps": budget.steps if budget else 0}}
        return GroupOutcome(True, key=group.key, cluster=cluster.name,
                            node=node.name if (node is not None and node_local) else None,
                            claims=outcomes, devices=records, diagnostics=diagnostics,
                            message=f"allocated on {cluster.name}/{node.name}" if node is not None else "allocated")

    def _failure(self, group, reason, message, clusters, plans, skipped, node_log, node_errors, budget):
        if not self._explain:
            return GroupOutcome(False, key=group.key, reason=reason, message=message, diagnostics={"reason": reason})
        diagnostics = explain(self, group, clusters, plans, skipped, node_log, node_errors, budget, reason)
        summary = diagnostics.get("summary") or message
        return GroupOutcome(False, key=group.key, reason=diagnostics.get("reason", reason), message=summary,
                            diagnostics=diagnostics)


def _ranked(pref: int, cluster: str, nodes):
    """(preference, score, cluster, node) per node, for merging the clusters' node streams in policy order."""
    for score, node in nodes:
        yield pref, score, cluster, node


def _primary(plan: GroupPlan) -> tuple:
    """``GroupPlan.primary``: (the primary alternative or None when there are no requests, its devices needed on
    one node with exclusive devices, and with devices shared between requests)."""
    alt = _primary_alt(plan)
    if alt is None:
        return None, 0, 0
    return alt, _need_from(plan, alt.sel, False), _need_from(plan, alt.sel, True)


def _primary_alt(plan: GroupPlan):
    """The alternative whose selector set narrows the nodes most: the largest fixed count without alternatives
    (counts of requests with the same selectors add up); else the first alternative."""
    first, best, best_need = None, None, 0
    for cp in plan.claims:
        for rp in cp.requests:
            alt = rp.alts[0]
            first = first or alt
            if rp.has_sub or alt.all_mode:
                continue
            need = _need_from(plan, alt.sel, False)
            if best is None or need > best_need:
                best, best_need = alt, need
    return best or first


def _need_from(plan: GroupPlan, sel, shared: bool) -> int:
    """Devices of ``sel`` the group needs on one node: the sum of fixed counts of non-admin requests with that
    selector set (the largest one when devices can be shared between requests)."""
    counts = [rp.alts[0].count for cp in plan.claims for rp in cp.requests
              if not rp.has_sub and not rp.alts[0].all_mode and not rp.alts[0].admin and rp.alts[0].sel is sel]
    if not counts:
        return 0
    return max(counts) if shared else sum(counts)
