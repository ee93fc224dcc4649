"""Defragmentation advice: free capacity nothing asked for can use, and plans that make room for a big claim.

Everything here is a what-if on a private copy of the fleet: one ``Engine`` built from the worker's own
snapshot and the allocation rows, changed by ``release``/``allocate`` and put back after every try. Nothing is
written; ``scheduler.services.defrag_apply`` carries a plan out.

*Shapes* are the specs people ask for: the distinct specs of pending claims and the most common specs of the
last day's claims. A shape is tried as asked, without its placement hints (a shape stands for many claims).

*Stranded* free capacity: the free units of a node where no pending claim that waits for room only (not for
quota: ``QUOTA_REASONS``) fits (the engine says so, node by node); none while no such claim waits.
Units are counted as the dashboard counts them (a partitionable GPU is one unit, free when no partition of it
is in use), and only devices one of the shapes' device classes selects (other kinds nobody asked for are the
Fragmentation page's "free devices no pending claim can use").

*Plans*: for a pending claim of two or more devices (the *target*) the engine cannot place, and for a common
shape of two or more devices that fits nowhere now (a target with no claim behind it), the candidate nodes
are those of its allowed clusters that hold something, least in use first. On a candidate the movable
claims are released smallest first until the target fits there; the target is then placed on the node and
each released claim is placed elsewhere by the engine (within its own allowed clusters, never back on the
node). A plan exists only when all of that succeeds in one engine state, so the plan is verified: the
target fits on the freed node AND the moved claims fit on their targets, together.

Movable: allocated, on a node, no consumer (``status.reservedFor`` is empty: moving a claim a pod uses would
need the pod moved too), not placed by another allocator (a gang member), not pinned to its node, not
already being released (condition ``Releasing``), no admin access. The search is bounded: ``MAX_TARGETS``
targets, ``MAX_CANDIDATES`` nodes each, ``SECONDS`` of engine time for the plans and as much for the stranded
figures; the answer says when a bound cut it short.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from claims import k8s
from claims.models import DeviceAllocation, Phase, Reservation, ResourceClaim
from claims.placement import clusters_matching, node_pin
from claims.services import fleet, queueing
from claims.services.conditions import RELEASING, is_true
from claims.services.external import managed_elsewhere
from dra.cel import MAX_SELECTOR_COST, CostBudgetExhausted, CostMeter, metered
from dra.engine import AllocatedDevice, ClaimGroup, Engine
from dra.engine.selectors import MATCH
from scheduler.services.holds import HOLD_UNTIL

log = logging.getLogger(__name__)

MAX_TARGETS = 10  # pending claims planned for, oldest first
MAX_CANDIDATES = 5  # nodes tried per target, the least in use first
MAX_SHAPES = 12  # shapes the stranded figures are computed for
PENDING_SAMPLE = 2000  # pending claims whose specs are read (oldest first)
RECENT = timedelta(days=1)
RECENT_SAMPLE = 5000  # the last day's shapes are learnt from its most recent claims
SECONDS = 1.5  # engine time for the plans, and as much again for the stranded figures
NODES_SHOWN = 50
QUOTA_REASONS = (queueing.WAITING_FOR_QUOTA, queueing.NO_QUOTA_FOR_CLASS, queueing.QUEUE_DOES_NOT_EXIST)
CALL_BUDGET = 2 * MAX_SELECTOR_COST  # CEL cost of one engine call, as in a claims round


@dataclass
class Move:
    claim_id: int
    namespace: str
    name: str
    uid: str
    resource_version: int
    kind: str  # "single GPU", "shared", "MIG", "<n> devices"
    devices: int
    from_cluster: str
    from_node: str
    to_cluster: str
    to_node: str
    allocation: dict = field(repr=False, default_factory=dict)  # the engine's AllocationResult on the target


@dataclass
class Plan:
    id: str
    target_id: int | None  # None: the target is a common shape, not a pending claim
    target: str  # namespace/name of the claim, or the shape's description
    target_uid: str
    target_rv: int
    target_devices: int
    cluster: str
    node: str
    moves: list[Move]

    @property
    def devices_moved(self) -> int:
        return sum(m.devices for m in self.moves)

    def to_dict(self) -> dict:
        kinds = " / ".join(sorted({m.kind for m in self.moves}))
        return {
            "id": self.id, "cluster": self.cluster, "node": self.node,
            "target": ({"claim": self.target, "uid": self.target_uid, "devices": self.target_devices}
                       if self.target_id is not None else {"shape": self.target, "devices": self.target_devices}),
            "summary": (f"move {len(self.moves)} claim{'s' if len(self.moves) != 1 else ''} ({kinds}) from "
                        f"{self.cluster}/{self.node} and the node can hold "
                        + (f"{self.target} ({self.target_devices} devices)" if self.target_id is not None
                           else f"a claim of a common shape, {self.target}")),
            "devicesMoved": self.devices_moved,
            "moves": [{"claim": f"{m.namespace}/{m.name}", "uid": m.uid, "kind": m.kind, "devices": m.devices,
                       "from": {"cluster": m.from_cluster, "node": m.from_node},
                       "to": {"cluster": m.to_cluster, "node": m.to_node}} for m in self.moves],
        }


@dataclass
class Advice:
    plans: list[Plan]
    stranded: dict
    shapes: list[dict]
    exhaustive: bool
    view: object = field(repr=False, default=None)  # the fleet view and rows the plans were computed on
    rows: dict = field(repr=False, default_factory=dict)

    def to_dict(self) -> dict:
        return {"plans": [p.to_dict() for p in self.plans], "stranded": self.stranded,
                "shapes": [{k: v for k, v in s.items() if k != "obj"} for s in self.shapes],
                "exhaustive": self.exhaustive}


@dataclass
class _Held:
    """An allocated claim as the search sees it."""

    claim: ResourceClaim
    devices: list[AllocatedDevice]
    movable: bool


# ------------------------------------------------------------------------------------------------ entry point

def advice(*, plans: bool = True, stranded: bool = True) -> Advice:
    view = fleet.current_view()
    rows = fleet.rows_in_use().snapshot()  # a plain dict: the advice keeps it, and reads every row
    engine = Engine(view.snapshot, list(rows.values()))
    shapes = _shapes()
    # Stranded by placement: free on nodes where no claim that waits only for room fits. Claims waiting for
    # quota are the queues' matter, not the fleet's shape (they would not start on a fitting node either).
    admitted = [s for s in shapes if s["admitted"]]
    stranded_out, done_s = stranded_capacity(engine, admitted) if stranded else ({}, True)
    found, done_p = find_plans(engine, view, rows, shapes) if plans else ([], True)
    return Advice(plans=found, stranded=stranded_out, shapes=shapes, exhaustive=done_s and done_p, view=view,
                  rows=rows)


def _allocate(engine: Engine, group: ClaimGroup):
    """One engine call with a round's CEL budget; None when it could not answer (budget, engine error)."""
    try:
        with metered(CostMeter(CALL_BUDGET)):
            return engine.allocate(group, raise_errors=False)
    except CostBudgetExhausted:
        return None


def _claim_obj(name: str, namespace: str, uid: str, spec: dict) -> dict:
    return {"apiVersion": k8s.V1, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": spec}


# ------------------------------------------------------------------------------------------------ shapes

def _shapes() -> list[dict]:
    """Distinct specs of pending claims and of the last day's claims, most asked for first."""
    counts: Counter = Counter()
    specs: dict[str, dict] = {}
    pending: Counter = Counter()
    admitted: Counter = Counter()  # pending claims no queue holds back (they wait for room only)
    for spec, reason in (ResourceClaim.objects.filter(phase=Phase.PENDING).order_by("id")
                         .values_list("spec", "reason")[:PENDING_SAMPLE]):
        key = json.dumps(spec, sort_keys=True)
        specs[key] = spec
        pending[key] += 1
        admitted[key] += reason not in QUOTA_REASONS
    since = timezone.now() - RECENT
    recent: Counter = Counter()
    for spec in (ResourceClaim.objects.filter(created_at__gte=since).order_by("-id")
                 .values_list("spec", flat=True)[:RECENT_SAMPLE]):
        key = json.dumps(spec, sort_keys=True)
        specs.setdefault(key, spec)
        recent[key] += 1
    counts.update(pending)
    counts.update(recent)
    out = []
    for i, (key, _) in enumerate(counts.most_common(MAX_SHAPES)):
        spec = specs[key]
        out.append({"spec": spec, "devices": spec_devices(spec), "pending": pending.get(key, 0),
                    "admitted": admitted.get(key, 0), "recent": recent.get(key, 0),
                    "obj": _claim_obj(f"shape-{i}", "defragmentation", str(uuid.UUID(int=i + 1)), spec)})
    return out


def spec_devices(spec: dict | None) -> int:
    """Devices a spec asks for (ExactCount; the first alternative of firstAvailable; All counts one)."""
    total = 0
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        body: dict = req.get("exactly") or next(iter(req.get("firstAvailable") or []), {})
        total += int(body.get("count") or 1) if body.get("allocationMode", "ExactCount") == "ExactCount" else 1
    return total


# ------------------------------------------------------------------------------------------------ stranded

def _shape_classes(shapes: list[dict]) -> set[str]:
    return {body.get("deviceClassName", "") for s in shapes
            for req in ((s["spec"] or {}).get("devices") or {}).get("requests") or []
            for body in ([req["exactly"]] if req.get("exactly") else list(req.get("firstAvailable") or []))}


def _class_sets(engine: Engine, cluster: str, classes: set[str]) -> list:
    out = []
    for name in sorted(classes):
        klass = engine.get_class(cluster, name)
        if klass is not None:
            exprs = tuple(((s or {}).get("cel") or {}).get("expression", "")
                          for s in (klass.get("spec") or {}).get("selectors") or [])
            out.append(engine.selector_set(name, exprs, ()))
    return out


def free_units(engine: Engine, model, node, class_sets: list) -> int:
    """Free units on a node of the kinds the shapes ask for (a device one of their classes selects): whole
    devices in use by nobody, and partitionable GPUs none of whose counters are used (one unit each, as the
    dashboard counts them)."""
    whole, counter_sets = 0, set[tuple]()
    for d in model.node_candidates(node):
        if d.node_name != node.name or not any(sel.evaluate(d) is MATCH for sel in class_sets):
            continue  # network-attached devices belong to no node; other kinds of device nobody asked for
        if d.consumes:
            counter_sets.update((d.pool_ref.uid, name) for name, _ in d.consumes)
        elif not engine.excl[d.idx] and not engine.active.get(d.idx):
            whole += 1
    free_sets = sum(1 for key in counter_sets if not any(engine.counters_used.get(key, {}).values()))
    return whole + free_sets


def stranded_capacity(engine: Engine, shapes: list[dict]) -> tuple[dict, bool]:
    """Free units on nodes where no shape fits, per cluster and node; (figures, every node examined)."""
    deadline = time.perf_counter() + SECONDS
    nodes: list[dict] = []
    by_cluster: Counter[str] = Counter()
    free_total, examined, complete = 0, 0, True
    classes = _shape_classes(shapes)
    for model in engine.clusters.values():
        if model.stale:
            continue
        class_sets = _class_sets(engine, model.name, classes)
        for name in model.node_order:
            if time.perf_counter() > deadline:
                complete = False
                break
            free = free_units(engine, model, model.nodes[name], class_sets)
            if not free:
                continue
            examined += 1
            free_total += free
            try:
                if any(_fits_on(engine, s["obj"], model.name, name) for s in shapes if s["devices"] <= free):
                    continue
            except Exception:  # an engine bug must not take the page down: the node is left uncounted
                log.exception("defragmentation: shapes on %s/%s failed", model.name, name)
                complete = False
                continue
            by_cluster[model.name] += free
            nodes.append({"cluster": model.name, "node": name, "free": free})
    nodes.sort(key=lambda r: (-r["free"], r["cluster"], r["node"]))
    return ({"total": sum(by_cluster.values()), "freeTotal": free_total, "nodesExamined": examined,
             "byCluster": [{"cluster": c, "stranded": n} for c, n in sorted(by_cluster.items())],
             "nodes": nodes[:NODES_SHOWN], "complete": complete}, complete)


def _fits_on(engine: Engine, obj: dict, cluster: str | None, node: str | None) -> bool:
    """Whether ``obj`` fits (on the node; anywhere without one); the engine is left as it was."""
    out = _allocate(engine, ClaimGroup(claims=[obj], allowed_clusters=[cluster] if cluster else None, node=node))
    if out is not None and out.allocated:
        engine.release(out.devices)
        return True
    return False


# ------------------------------------------------------------------------------------------------ plans

@dataclass
class _Target:
    obj: dict  # the claim object the engine places
    devices: int
    label: str
    claim: ResourceClaim | None = None  # None for a common shape
    allowed: list[str] | None = None
    pin: str | None = None


def _targets(engine: Engine, view, shapes: list[dict]) -> list[_Target]:
    """Pending claims of two or more devices the engine could not place (not already waiting on a plan), then
    common shapes of two or more devices that no node can hold now."""
    qs = (ResourceClaim.objects.filter(phase=Phase.PENDING, attempts__gt=0).exclude(annotations__has_key=HOLD_UNTIL)
          .select_related("namespace").order_by("id"))
    out: list[_Target] = []
    for claim in qs[:PENDING_SAMPLE]:
        if spec_devices(claim.spec) >= 2 and not managed_elsewhere(claim) and len(out) < MAX_TARGETS:
            out.append(_Target(obj=_claim_obj(claim.name, claim.namespace.name, str(claim.uid), claim.spec),
                               devices=spec_devices(claim.spec), label=f"{claim.namespace.name}/{claim.name}",
                               claim=claim, allowed=clusters_matching(claim.allowed_cluster_selector,
                                                                      view.cluster_labels),
                               pin=node_pin(claim.annotations)))
    for shape in shapes:
        if len(out) >= MAX_TARGETS:
            break
        if shape["devices"] < 2 or shape["pending"] or not shape["recent"]:
            continue  # pending shapes are planned for through their claims
        if not _fits_on(engine, shape["obj"], None, None):
            out.append(_Target(obj=shape["obj"], devices=shape["devices"], label=describe(shape["spec"])))
    return out


def describe(spec: dict | None) -> str:
    parts = []
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        body: dict = req.get("exactly") or next(iter(req.get("firstAvailable") or []), {})
        parts.append(f"{int(body.get('count') or 1)} × {body.get('deviceClassName', '?')}")
    return " + ".join(parts) or "no devices"


def find_plans(engine: Engine, view, rows: dict, shapes: list[dict]) -> tuple[list[Plan], bool]:
    deadline = time.perf_counter() + SECONDS
    plans: list[Plan] = []
    used_nodes: set[tuple[str, str]] = set()
    for target in _targets(engine, view, shapes):
        if time.perf_counter() > deadline:
            return plans, False
        candidates = sorted(((used, key) for key, used in engine.node_used.items() if used > 0
                             and key not in used_nodes and (target.allowed is None or key[0] in target.allowed)
                             and (target.pin is None or key[1] == target.pin)),
                            key=lambda t: (t[0], t[1]))[:MAX_CANDIDATES]
        held = _held_on([key for _, key in candidates], rows)
        for _, (cluster, node) in candidates:
            if time.perf_counter() > deadline:
                return plans, False
            try:
                moves = _try_node(engine, view, target.obj, cluster, node, held.get((cluster, node), []))
            except Exception:  # an engine bug must not take the page down: this candidate has no plan
                log.exception("defragmentation: trying %s/%s for %s failed", cluster, node, target.label)
                moves = None
            if moves is not None:
                plans.append(_plan(target, cluster, node, moves))
                used_nodes.add((cluster, node))  # one plan per node: two plans for one node cannot both apply
                break
    return plans, True


def _held_on(nodes: list[tuple[str, str]], rows: dict) -> dict[tuple[str, str], list[_Held]]:
    if not nodes:
        return {}
    wanted = set(nodes)
    claims = [c for c in ResourceClaim.objects.filter(phase=Phase.ALLOCATED, node__in={n for _, n in nodes})
              .select_related("namespace").order_by("id") if (c.cluster, c.node) in wanted]
    ids = [c.id for c in claims]
    devices: dict[int, list[AllocatedDevice]] = defaultdict(list)
    admin: set[int] = set()
    for row_id, claim_id, admin_access in (DeviceAllocation.objects.filter(claim_id__in=ids)
                                           .values_list("id", "claim_id", "admin_access")):
        if row_id in rows:
            devices[claim_id].append(rows[row_id])
        if admin_access:
            admin.add(claim_id)
    reserved = set(Reservation.objects.filter(claim_id__in=ids).values_list("claim_id", flat=True))
    out: dict[tuple[str, str], list[_Held]] = defaultdict(list)
    for c in claims:
        movable = (c.id not in reserved and c.id not in admin and not managed_elsewhere(c)
                   and not node_pin(c.annotations) and not is_true(c.conditions, RELEASING) and bool(devices[c.id]))
        out[(c.cluster, c.node)].append(_Held(c, devices[c.id], movable))
    return out


def _try_node(engine: Engine, view, target_obj: dict, cluster: str, node: str,
              held: list[_Held]) -> list[Move] | None:
    """The moves of a verified plan freeing ``node`` for ``target_obj``, or None. The engine is left as it
    was found."""
    movable = sorted((h for h in held if h.movable), key=lambda h: (len(h.devices), h.claim.id))
    released: list[_Held] = []
    placed: list[list[AllocatedDevice]] = []
    try:
        fitted = False
        for h in movable:
            engine.release(h.devices)
            released.append(h)
            out = _allocate(engine, ClaimGroup(claims=[target_obj], allowed_clusters=[cluster], node=node))
            if out is not None and out.allocated:
                placed.append(out.devices)
                fitted = True
                break
        if not fitted:
            return None
        moves = []
        for h in released:
            move = _place_elsewhere(engine, view, h, cluster, node, placed)
            if move is None:
                return None
            moves.append(move)
        return moves
    finally:
        for devices in placed:
            engine.release(devices)
        for h in released:
            engine.commit(h.devices)


def _place_elsewhere(engine: Engine, view, h: _Held, cluster: str, node: str,
                     placed: list[list[AllocatedDevice]]) -> Move | None:
    c = h.claim
    allowed = clusters_matching(c.allowed_cluster_selector, view.cluster_labels)
    obj = _claim_obj(c.name, c.namespace.name, str(c.uid), c.spec)
    out = _allocate(engine, ClaimGroup(claims=[obj], allowed_clusters=sorted(allowed) if allowed is not None
                                       else None, preferred_cluster=c.preferred_cluster or None))
    if out is None or not out.allocated:
        return None
    placed.append(out.devices)
    if (out.cluster, out.node) == (cluster, node) or not out.node:
        return None  # back on the node being freed (or on no node): not a move that frees anything
    return Move(claim_id=c.id, namespace=c.namespace.name, name=c.name, uid=str(c.uid),
                resource_version=c.resource_version, kind=move_kind(c), devices=len(h.devices),
                from_cluster=cluster, from_node=node, to_cluster=out.cluster, to_node=out.node,
                allocation=out.claims[0].allocation)


def move_kind(claim: ResourceClaim) -> str:
    results = ((claim.allocation or {}).get("devices") or {}).get("results") or []
    classes = {(r.get("exactly") or {}).get("deviceClassName", "")
               for r in ((claim.spec or {}).get("devices") or {}).get("requests") or []}
    if any(r.get("shareID") for r in results):
        return "shared"
    if any("mig" in c for c in classes):
        return "MIG"
    return "single GPU" if len(results) == 1 else f"{len(results)} devices"


def _plan(target: _Target, cluster: str, node: str, moves: list[Move]) -> Plan:
    # The id names the state the plan was computed on: any change to the claims involved gives another id.
    claim = target.claim
    ident = [str(claim.uid), claim.resource_version] if claim is not None else [json.dumps(target.obj["spec"],
                                                                                           sort_keys=True)]
    key = json.dumps([*ident, cluster, node, [(m.uid, m.resource_version, m.to_cluster, m.to_node) for m in moves]])
    return Plan(id=hashlib.sha256(key.encode()).hexdigest()[:16], target_id=claim.id if claim else None,
                target=target.label, target_uid=str(claim.uid) if claim else "",
                target_rv=claim.resource_version if claim else 0, target_devices=target.devices, cluster=cluster,
                node=node, moves=moves)
