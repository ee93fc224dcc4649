"""Carrying out a defragmentation plan (``scheduler.services.defrag``): one transaction, all or nothing.

1. The plan is recomputed from the fleet as it is now and looked up by id: a plan whose claims changed has
   another id (404), so an operator never applies advice the fleet has moved past.
2. Under row locks, the claims involved must still be as planned (409 otherwise).
3. The old claims are released safely (``claims.services.claims.begin_release``): each keeps its devices,
   with the condition ``Releasing``, until the cluster's agent (its cluster token) or an admin confirms that
   no pod uses them by releasing it (``POST …/resourceclaims/{name}/release``), or until the grace period
   (``graceSeconds``, default ``GRACE``) has passed. ``graceSeconds: 0`` releases them at once.
4. Each moved claim is re-created in its namespace as ``<name>-m<plan id>`` with the same spec, labels and
   annotations plus pins to its target (``draservice.io/allowed-clusters: name=<cluster>``,
   ``draservice.io/node``), and is allocated at once on the devices the engine chose for it, through the
   commit service (its locks and race checks: the target devices are taken now, nothing else can get them;
   a device taken since the plan was computed aborts the whole apply with 409). Its workload can start there
   while the old one drains. A queue's quota counts both copies until the old one is released (a queue
   without room for that refuses the apply: 409).
5. The target claim is pinned to the freed node and holds it (``scheduler.services.holds``) until it is
   allocated by the ordinary claims round (once the old claims are released), or until the grace period
   plus ``HOLD`` has passed. A plan for a common shape has no claim to hold the node for: the node is freed
   and not held (the next claim of that shape, or anything else, may take it).
"""
from __future__ import annotations

import re
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from claims import k8s
from claims.models import Phase, ResourceClaim
from claims.placement import ALLOWED_CLUSTERS, NODE_PIN
from claims.services import claims as claim_services
from claims.services import commit
from draservice.errors import BadRequest, Conflict, NotFound
from scheduler.services import admit, defrag
from scheduler.services.holds import HOLD_UNTIL, PLAN

GRACE = timedelta(minutes=15)
MAX_GRACE = timedelta(days=1)
HOLD = timedelta(minutes=30)  # after the grace period: the target's time to be allocated once the node is free
MOVED_FROM = "draservice.io/moved-from"
PLAN_ID = re.compile(r"^[0-9a-f]{16}$")
RELEASE_REASON = "Defragmented"


def parse_body(body) -> timedelta:
    """The grace period from an apply body (``{"graceSeconds": n}``, optional); BadRequest."""
    if body in (None, "", b""):
        return GRACE
    if not isinstance(body, dict):
        raise BadRequest([("", "the body must be a JSON object")])
    errors = [(k, "Forbidden: unknown field") for k in sorted(set(body) - {"graceSeconds"})]
    raw = body.get("graceSeconds", int(GRACE.total_seconds()))
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_GRACE.total_seconds():
        errors.append(("graceSeconds", f"Invalid value: {raw!r}: must be an integer from 0 to "
                                       f"{int(MAX_GRACE.total_seconds())}"))
    if errors:
        raise BadRequest(errors)
    return timedelta(seconds=raw)


def apply_plan(plan_id: str, *, actor: str, grace: timedelta = GRACE) -> dict:
    """Apply the plan ``plan_id``; returns what was done. Raises BadRequest, NotFound or Conflict."""
    if not isinstance(plan_id, str) or not PLAN_ID.match(plan_id):
        raise BadRequest([("id", "Invalid value: a plan id is 16 lowercase hexadecimal digits")])
    found = defrag.advice(stranded=False)
    plan = next((p for p in found.plans if p.id == plan_id), None)
    if plan is None:
        raise NotFound([("id", f"no plan {plan_id} now: plans are recomputed from the current fleet and a "
                                 "plan whose claims changed gets another id; list them again")], title="Plan not found")
    now = timezone.now()
    with transaction.atomic():
        commit.begin()
        target = _check_unchanged(plan)
        for move in plan.moves:
            message = (f"moved to {move.to_cluster}/{move.to_node} as {move.namespace}/{_new_name(move, plan)} "
                       f"by defragmentation plan {plan.id} ({actor})")
            if grace:
                claim_services.begin_release(move.claim_id, grace=grace, reason=RELEASE_REASON,
                                             message=f"{message}; its devices are held until the release is "
                                                     "confirmed (the agent or an admin releases it) or the "
                                                     "grace period ends")
            else:
                claim_services.release_claim(move.claim_id, reason=RELEASE_REASON, message=message)
        created = _recreate(plan, now, found, actor)
        hold_until = now + grace + HOLD
        if target is not None:
            _pin_target(target, plan, hold_until)
    return {"plan": plan.to_dict(), "created": [f"{c.namespace.name}/{c.name}" for c in created],
            "releasing": [f"{m.namespace}/{m.name}" for m in plan.moves] if grace else [],
            "released": [] if grace else [f"{m.namespace}/{m.name}" for m in plan.moves],
            "releaseDeadline": (now + grace).isoformat(), "target": plan.target,
            "holdUntil": hold_until.isoformat() if target is not None else None}


def _check_unchanged(plan: defrag.Plan) -> ResourceClaim | None:
    """The plan's target claim, locked (None for a shape's plan); Conflict when a claim changed."""
    ids = sorted([m.claim_id for m in plan.moves] + ([plan.target_id] if plan.target_id is not None else []))
    rows = {c.id: c for c in ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
            .filter(id__in=ids).order_by("id")}
    for m in plan.moves:
        c = rows.get(m.claim_id)
        if c is None or c.phase != Phase.ALLOCATED or c.resource_version != m.resource_version:
            raise Conflict(f"claim {m.namespace}/{m.name} changed since the plan was computed; list the plans again")
    if plan.target_id is None:
        return None
    target = rows.get(plan.target_id)
    if target is None or target.phase != Phase.PENDING or target.resource_version != plan.target_rv:
        raise Conflict(f"claim {plan.target} is no longer pending as planned; list the plans again")
    return target


def _new_name(move: defrag.Move, plan: defrag.Plan) -> str:
    suffix = f"-m{plan.id[:8]}"
    return move.name[:253 - len(suffix)].rstrip("-.") + suffix


def _recreate(plan: defrag.Plan, now, found: defrag.Advice, actor: str) -> list[ResourceClaim]:
    olds = {c.id: c for c in ResourceClaim.objects.filter(id__in=[m.claim_id for m in plan.moves])}
    created, units = [], []
    for move in plan.moves:
        old = olds[move.claim_id]
        notes = {k: v for k, v in (old.annotations or {}).items() if k not in (HOLD_UNTIL, PLAN)}
        notes.update({ALLOWED_CLUSTERS: f"name={move.to_cluster}", NODE_PIN: move.to_node, PLAN: plan.id,
                      MOVED_FROM: f"{move.namespace}/{move.name}"})
        obj = {"apiVersion": k8s.V1, "kind": "ResourceClaim",
               "metadata": {"name": _new_name(move, plan), "labels": old.labels or {}, "annotations": notes},
               "spec": old.spec}
        (claim,) = claim_services.create_claims(move.namespace, [obj])
        created.append(claim)
        where = f"{move.to_cluster}/{move.to_node}"
        units.append(commit.Unit([commit.Placement(
            claims=[claim], allocations=[move.allocation], cluster=move.to_cluster, node=move.to_node,
            message=f"allocated on {where}: moved from {move.from_cluster}/{move.from_node} by defragmentation "
                    f"plan {plan.id} ({actor})",
            event_data={"defragmentationPlan": plan.id, "movedFrom": f"{move.namespace}/{move.name}"})]))
    stale = commit.changed_claims(created)
    if stale:
        raise Conflict("a re-created claim changed while the plan was applied; nothing was done")
    result = admit.commit(units, found.view, found.rows, now)
    if result.lost or result.refused:
        why = "a device it needs was taken since the plan was computed" if result.lost else \
            next(iter(result.refused.values())).message
        raise Conflict(f"the plan cannot be applied now ({why}); nothing was done, list the plans again")
    return created


def _pin_target(target: ResourceClaim, plan: defrag.Plan, hold_until) -> None:
    notes = {**(target.annotations or {}), ALLOWED_CLUSTERS: f"name={plan.cluster}", NODE_PIN: plan.node,
             HOLD_UNTIL: hold_until.isoformat(), PLAN: plan.id}
    obj = {"apiVersion": k8s.V1, "kind": "ResourceClaim",
           "metadata": {"name": target.name, "namespace": target.namespace.name, "labels": target.labels or {},
                        "annotations": notes}}
    claim_services.update_claim(target.id, obj)
