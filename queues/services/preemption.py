"""Preemption with notice: choose victims with the engine, mark them, requeue them at their deadline.

For a pending claim the engine could not place for lack of room (``Unsatisfiable``), candidates are:
- claims of other queues that borrow (use beyond their nominal) the class, when the claim is within its own
  queue's nominal and its queue reclaims (``preemption.reclaimBorrowed: Always``);
- claims of its own queue with a lower priority, when ``preemption.withinQueue: LowerPriority``.
Never a claim younger than its queue's ``minRuntimeSeconds``, one already being preempted, or a gang's
(gangs are placed whole by the gang worker; preempting them whole is left to it). Candidates are taken lowest
priority first, most recently started first, and only while their queue still borrows; the engine (the claims
round's cached one, on the same snapshot) confirms after each that the freed devices let the claim fit.

Victims get the condition ``Preempted`` (reason ``PreemptionPending``) with the deadline their queue's
``graceSeconds`` gives, an event, and, if their queue has a webhook, a signed notice delivered by the notify
workers after commit (``queues.services.webhooks``; a dead or slow receiver never holds anything up). At the
deadline they are requeued (``claims.services.preemption.requeue``): devices freed, Pending again at their place, reason
``Preempted``. The deadline is trusted for every claim (what the issue calls REST-only claims); waiting for a
cluster agent to confirm that no pod uses the devices any more is not implemented yet.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta
from fractions import Fraction

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import allocation, fleet
from claims.services import preemption as claim_preemption
from claims.services.engines import engines
from claims.services.external import managed_elsewhere
from claims.services.grouping import Group
from dra.engine.types import AllocatedDevice
from queues import spec as queue_spec
from queues.models import Preemption, PreemptionState, Queue, QuotaCharge
from queues.services import webhooks
from queues.services.position import PRIORITY_SQL
from queues.services.resolve import Tree, effective_priority, queue_of
from queues.services.usage import requested_devices

log = logging.getLogger(__name__)
CAPACITY_REASONS = ("Unsatisfiable",)


def nominal_of(queue: Queue, cls: str) -> Fraction:
    for entry in queue.spec.get("quotas") or []:
        if entry.get("deviceClassName") == cls and entry.get("devices") and not entry.get("clusterSelector"):
            return Fraction(queue_spec.amount_of(entry["devices"].get("nominal", 0)) or 0)
    return Fraction(0)


def choose_victims(claim: ResourceClaim, tree: Tree, coming: dict | None = None,
                   hopeless: dict | None = None) -> list[ResourceClaim]:
    """The victims whose devices, freed, let ``claim`` fit (the engine says so), or []. ``coming``: (queue,
    class) -> devices being reclaimed for other waiting claims (counted as used). ``hopeless``: kept by the
    caller over one pass, (queue, class, priority) -> the least need for which there was no candidate at all:
    a claim alike that needs as much or more has none either (its selectors play no part before the engine's
    check, and ``coming`` only grows in a pass), so it is not looked at again -- a queue of thousands of alike
    claims read every allocated claim of their class once per claim and pass."""
    wanted = requested_devices(claim.spec)
    if not wanted:
        return []
    cls = wanted[0][0]
    need = sum(n for c, n in wanted if c == cls)
    queue_name = queue_of(claim, claim.namespace.name, tree)
    key = (queue_name, cls, effective_priority(claim, tree.queues.get(queue_name)))
    if hopeless is not None and key in hopeless and need >= hopeless[key]:
        return []
    found = candidates(claim, need, cls, tree, coming)
    if found is None or not found[0]:
        if hopeless is not None:
            hopeless[key] = min(need, hopeless.get(key, need))
        return []
    pool, held, used, nominal, own = found
    return _confirm(claim, pool, need, held, used, nominal, own)


def candidates(claim: ResourceClaim, need: int, cls: str, tree: Tree, coming: dict | None):
    """(victim candidates in order, held, used, nominal, own queue id) for a unit of ``claim``'s queue that
    needs ``need`` devices of ``cls`` -- or None when it may preempt nobody."""
    name = queue_of(claim, claim.namespace.name, tree)
    queue = tree.queues.get(name)
    if queue is None:
        return None
    policy = queue.spec.get("preemption") or {}
    charged = QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit="devices", device_class=cls)
    # Use per queue summed by the database: the allocated claims of a class are tens of thousands of rows.
    used: dict[int, Fraction] = defaultdict(Fraction)
    for queue_id, total in charged.values("queue_id").annotate(total=Sum("amount")).values_list("queue_id", "total"):
        used[queue_id] = Fraction(total)
    by_id = {q.id: q for q in tree.queues.values()}
    within = used[queue.id] + (coming or {}).get((name, cls), 0) + need <= nominal_of(queue, cls)
    borrowers = {qid for qid, amount in used.items()
                 if qid != queue.id and qid in by_id and amount > nominal_of(by_id[qid], cls)}
    reclaim = within and policy.get("reclaimBorrowed", "Always") == "Always"
    own = policy.get("withinQueue", "LowerPriority") == "LowerPriority"
    victim_queues = (borrowers if reclaim else set()) | ({queue.id} if own else set())
    if not victim_queues:
        return [], {}, used, {}, queue.id
    mine = effective_priority(claim, queue)
    rows = charged.filter(queue_id__in=victim_queues).exclude(
        claim_id__in=Preemption.objects.filter(state=PreemptionState.PENDING).values("victim_id"))
    if connection.vendor == "postgresql":
        # Its own queue's claims of no lower priority never give way: left out by the query (a queue of
        # equals is every allocated claim of the class). A join, not id arrays: ``NOT id = ANY(array)`` is
        # a scan of the array per row, and took seconds per pass at 18,000 allocated claims.
        rows = rows.extra(where=[f'(NOT "queues_quotacharge"."queue_id" = %s OR {PRIORITY_SQL} < %s)'],
                          params=[queue.id, queue.max_priority, mine])
    held = {cid: (qid, Fraction(amount)) for cid, qid, amount in rows.values_list("claim_id", "queue_id", "amount")}
    if not held:
        return [], held, used, {}, queue.id
    now = timezone.now()
    pool = []
    # Only what the choice reads: the spec, allocation and conditions (the wide JSON columns) are not needed.
    for v in (ResourceClaim.objects.filter(phase=Phase.ALLOCATED, id__in=list(held))
              .only("id", "labels", "annotations", "allocated_at", "namespace_id", "cluster", "node")):
        vq = by_id[held[v.id][0]]
        prio = effective_priority(v, vq)
        min_run = (vq.spec.get("preemption") or {}).get("minRuntimeSeconds", 0)
        if managed_elsewhere(v) or (v.allocated_at and v.allocated_at > now - timedelta(seconds=min_run)):
            continue
        if vq.id == queue.id and prio >= mine:
            continue  # within its own queue, only lower priority gives way
        pool.append((prio, -(v.allocated_at.timestamp() if v.allocated_at else 0), v.id, v))
    pool.sort(key=lambda t: t[:3])
    nominal = {qid: nominal_of(q, cls) for qid, q in by_id.items()}
    return [p[-1] for p in pool], held, used, nominal, queue.id


def victim_devices(pool) -> dict[int, list[AllocatedDevice]]:
    devices: dict[int, list[AllocatedDevice]] = defaultdict(list)
    for row in DeviceAllocation.objects.filter(claim_id__in=[v.id for v in pool]):
        devices[row.claim_id].append(AllocatedDevice(row.cluster, row.driver, row.pool, row.device,
                                                     row.share_id or None, row.consumed_capacity or None,
                                                     row.admin_access))
    return devices


def _confirm(claim, pool, need, held, used, nominal, own: int) -> list[ResourceClaim]:
    """Load what the engine check needs (the round's cached engine, the candidates' devices) and run it."""
    if not pool:
        return []
    view = fleet.current_view()
    engine = engines.engine_for(view, fleet.rows_in_use())
    devices = victim_devices(pool)
    group = allocation.engine_group(Group(claims=[claim]), view)
    return confirm_with_engine(engine, group, pool, need, held, used, nominal, own, devices)


def confirm_with_engine(engine, group, pool, need, held, used, nominal, own, devices) -> list:
    """Take candidates of ``pool`` in order (a queue's only while it still borrows, unless it is ``own``)
    until ``engine`` places ``group``; the engine is left as it was. ``held``: victim id -> (queue id,
    devices); ``used`` / ``nominal``: queue id -> devices; ``devices``: victim id -> its AllocatedDevices."""
    left = dict(used)
    chosen: list = []
    freed = Fraction(0)
    try:
        for v in pool:
            qid, amount = held[v.id]
            if qid != own and left[qid] <= nominal.get(qid, 0):
                continue  # that queue no longer borrows: what it holds now is its own
            engine.release(devices[v.id])
            chosen.append(v)
            left[qid] -= amount
            freed += amount
            if freed < need:
                continue
            outcome = engine.allocate(group, raise_errors=False)
            if outcome.allocated:
                engine.release(outcome.devices)
                return chosen
        return []
    finally:
        for v in chosen:
            engine.commit(devices[v.id])


def mark(preemptor: ResourceClaim, victims: list[ResourceClaim], tree: Tree, label: str | None = None) -> int:
    """Notice to ``victims`` (one transaction); webhooks after commit. Returns how many were marked."""
    now = timezone.now()
    with transaction.atomic():
        rows = [v for v in claim_preemption.locked([v.id for v in victims]) if v.phase == Phase.ALLOCATED]
        if Preemption.objects.filter(victim_id__in=[v.id for v in rows], state=PreemptionState.PENDING).exists():
            return 0  # another pass got there first
        made = []
        for v in rows:
            vq = tree.queues.get(queue_of(v, v.namespace.name, tree))
            grace = ((vq.spec.get("preemption") or {}).get("graceSeconds", 30)) if vq else 30
            deadline = now + timedelta(seconds=grace)
            made.append(Preemption(victim=v, preemptor=preemptor, queue=vq.name if vq else "", deadline=deadline))
            who = label or f"{preemptor.namespace.name}/{preemptor.name}"
            message = f"preempted for {who}; devices are released at {deadline.strftime('%Y-%m-%dT%H:%M:%SZ')}"
            claim_preemption.mark([v], message, {"preemptor": preemptor.name, "deadline": deadline.isoformat()}, now)
        Preemption.objects.bulk_create(made)
        webhooks.notify(made, tree.queues)
    return len(made)


def sweep(limit: int = 500) -> int:
    """Requeue the victims whose deadline has passed."""
    now = timezone.now()
    due = list(Preemption.objects.filter(state=PreemptionState.PENDING, deadline__lte=now)
               .order_by("deadline").values_list("id", "victim_id")[:limit])
    if not due:
        return 0
    with transaction.atomic():
        victims = claim_preemption.locked([v for _, v in due])
        claim_preemption.requeue(victims, "preempted: the devices went to a claim with a better right to them; "
                                          "waiting at its original place in its queue", now)
        Preemption.objects.filter(id__in=[p for p, _ in due]).update(state=PreemptionState.DONE, finished_at=now)
    return len(victims)
