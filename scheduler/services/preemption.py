"""Preemption with notice: choose victims with the engine, mark them, requeue them at their deadline.

For a pending claim the engine could not place for lack of room (``Unsatisfiable``), or that a quota of its
queue's tree refused (``WaitingForQuota``), candidates are:
- claims of other queues that borrow the class (use beyond their nominal in the contested unit: devices, or the
  counter or capacity the claim's quota counts), when the claim is within its own queue's nominal and its queue
  reclaims (``preemption.reclaimBorrowed: Always``); for a quota-refused claim, only under the ancestor whose
  ``borrowingLimit`` caps the class (``reclaim_scope``);
- claims of its own queue with a lower priority, when ``preemption.withinQueue: LowerPriority``.
Never a claim younger than its queue's ``minRuntimeSeconds``, or one already being preempted. A placed gang is
one candidate with its whole demand, all its members or none (``gang_victims``). Candidates are taken other
queues' first (reclaim), then its own queue's; lowest priority first, most recently started first, and only
while their queue still borrows; the engine (the claims round's cached one, on the same snapshot) confirms after
each that the freed devices let the claim fit, and then every victim whose removal (last taken first) still
lets it fit keeps its devices: the set is inclusion-minimal. One pass decides all its preemptors on one engine
(``reclaim``): each victim serves one. A claim held off the nodes kept for a queue's head (``HeldForQueueHead``) is
short of room too.

Victims get the condition ``Preempted`` (reason ``PreemptionPending``) and ``Releasing``, an event, and, if their
queue has a webhook, a signed notice delivered by the notify workers after commit (``queues.services.webhooks``;
a dead or slow receiver never holds anything up). Noticed at T, a victim is to stop by ``stopBy`` = T +
``graceSeconds``; its devices move at the earlier of its confirmation (``claims.services.preemption.confirm``: its
cluster's agent saw its ``reservedFor`` empty, or the agent, an admin or its namespace said it stopped; at
``stopBy``, a claim nothing can be using: no consumer and no live agent for its cluster) and ``forceAt`` = T +
``forceAfterSeconds`` (at least ``graceSeconds``; by default equal), when it is forced. Either way it is requeued
(``claims.services.preemption.requeue``): devices freed, Pending again at its place, reason ``Preempted``.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta
from fractions import Fraction
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import fleet, queueing, wake
from claims.services import preemption as claim_preemption
from claims.services.engines import engines
from claims.services.external import managed_elsewhere
from dra.engine.quantity import parse_quantity
from dra.engine.types import AllocatedDevice
from queues import spec as queue_spec
from queues.models import Preemption, PreemptionState, Queue, QuotaCharge
from queues.services import order, webhooks
from queues.services import usage as u
from queues.services.position import PRIORITY_SQL
from queues.services.resolve import Tree, effective_priority, queue_of
from queues.services.usage import requested_devices
from scheduler.services import allocation, gang_victims, policy
from scheduler.services.grouping import Group

log = logging.getLogger(__name__)
# Why a pending claim may reclaim: the fleet has no room for it (or only on nodes held for a queue's head), or a
# quota of its queue's tree is used up.
CAPACITY_REASONS = ("Unsatisfiable", "HeldForQueueHead", queueing.WAITING_FOR_QUOTA)


def nominal_of(queue: Queue, cls: str, unit: tuple[str, str] = ("devices", "")) -> Fraction:
    """The queue's nominal for ``cls`` in ``unit`` ((devices, "") or (counters | capacity, name)), summed over
    its entries for the class (per-cluster ones too: reclaim weighs the fleet-wide amount)."""
    total = Fraction(0)
    for entry in queue.spec.get("quotas") or []:
        if entry.get("deviceClassName") != cls:
            continue
        limits = entry.get("devices") if unit[0] == "devices" else (entry.get(unit[0]) or {}).get(unit[1])
        if limits:
            total += Fraction(queue_spec.amount_of(limits.get("nominal", 0)) or 0)
    return total


def contested_unit(queue: Queue, cls: str) -> tuple[str, str]:
    """The unit preemption weighs for a claim of ``queue``: devices where its quota for ``cls`` counts them,
    else the first counter (e.g. MIG memory), else the first capacity it counts."""
    entries = [e for e in queue.spec.get("quotas") or [] if e.get("deviceClassName") == cls]
    if not entries or any(e.get("devices") for e in entries):
        return ("devices", "")
    for unit in ("counters", "capacity"):
        for e in entries:
            for res in e.get(unit) or {}:
                return (unit, res)
    return ("devices", "")


def placed_amount(devices, unit: tuple[str, str], view) -> Fraction:
    """What a placement's devices count in ``unit`` (as ``queues.services.usage.needs`` charges it)."""
    if unit[0] == "devices":
        return Fraction(sum(1 for d in devices if not d.share_id and not d.admin_access))
    if unit[0] == "counters":
        counters = u.device_counters(view)
        return sum((counters.get((d.cluster, d.driver, d.pool, d.device), {}).get(unit[1], Fraction(0))
                    for d in devices if not d.admin_access), Fraction(0))
    total = Fraction(0)
    for d in devices:
        qty = (d.consumed_capacity or {}).get(unit[1])
        if qty and not d.admin_access:
            total += Fraction(parse_quantity(qty))
    return total


class Found(NamedTuple):
    """What ``candidates`` found: victim candidates in order; victim id -> (queue id, amount); queue id ->
    used and nominal amounts; the claim's queue id; the contested unit all amounts are in."""

    pool: list
    held: dict
    used: dict
    nominal: dict
    own: int
    unit: tuple[str, str]
    checks: tuple = (None,)  # see ``_greedy``


def choose_victims(claim: ResourceClaim, tree: Tree, coming: dict | None = None,
                   hopeless: dict | None = None, kept: list | None = None, engine=None) -> list[ResourceClaim]:
    """The victims whose devices, freed, let ``claim`` fit (the engine says so), or []. ``coming``: (queue,
    class) -> devices being reclaimed for other waiting claims (counted as used). ``hopeless``: kept by the
    caller over one pass, (queue, class, priority) -> the least need for which there was no candidate at all:
    a claim alike that needs as much or more has none either (its selectors play no part before the engine's
    check, and ``coming`` only grows in a pass), so it is not looked at again -- a queue of thousands of alike
    claims read every allocated claim of their class once per claim and pass. ``kept``: see
    ``confirm_with_engine``. ``engine``: the one to ask (default: the worker's cached one)."""
    wanted = requested_devices(claim.spec)
    if not wanted:
        return []
    cls = wanted[0][0]
    need = sum(n for c, n in wanted if c == cls)
    queue_name = queue_of(claim, claim.namespace.name, tree)
    key = (queue_name, cls, effective_priority(claim, tree.queues.get(queue_name)), claim.reason)
    if hopeless is not None and key in hopeless and need >= hopeless[key]:
        return []
    found = candidates(claim, need, cls, tree, coming)
    if found is None or not found[0]:
        if hopeless is not None:
            hopeless[key] = min(need, hopeless.get(key, need))
        return []
    return _confirm(claim, found, need, kept, engine)


def candidates(claim: ResourceClaim, need: int, cls: str, tree: Tree, coming: dict | None):
    """(victim candidates in order, held, used, nominal, own queue id) for a unit of ``claim``'s queue that
    needs ``need`` devices of ``cls`` -- or None when it may preempt nobody."""
    name = queue_of(claim, claim.namespace.name, tree)
    queue = tree.queues.get(name)
    if queue is None:
        return None
    unit = contested_unit(queue, cls)
    # Another queue's claim under notice is not counted as its use: its devices are already on their way to a
    # preemptor (counted, it kept its queue borrowing for the next preemptor of the pass, which took more). The
    # claim's own queue's are: they still run, and the round, which admits it, counts them (left out here, a
    # queue whose claims were being preempted looked within its nominal and preempted back, for ever).
    noticed = Preemption.objects.filter(state=PreemptionState.PENDING).values("victim_id")
    charged = QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit=unit[0], resource=unit[1],
                                         device_class=cls)
    # Use per queue summed by the database: the allocated claims of a class are tens of thousands of rows.
    used: dict[int, Fraction] = defaultdict(Fraction)
    for queue_id, total, going in (charged.values("queue_id")
                                   .annotate(total=Sum("amount"), going=Sum("amount", filter=Q(claim_id__in=noticed)))
                                   .values_list("queue_id", "total", "going")):
        used[queue_id] = Fraction(total) - (Fraction(going) if going and queue_id != queue.id else 0)
    charged = charged.exclude(claim_id__in=noticed)  # the candidates: none under notice already
    by_id = {q.id: q for q in tree.queues.values()}
    if unit[0] == "devices":
        within = used[queue.id] + (coming or {}).get((name, cls), 0) + need <= nominal_of(queue, cls)
    else:  # what it needs is known once placed: room is required now, the placement is checked (``_confirm``)
        within = used[queue.id] < nominal_of(queue, cls, unit)
    scope = reclaim_scope(claim, name, cls, tree)
    borrowers = {qid for qid, amount in used.items()
                 if qid != queue.id and qid in by_id and amount > nominal_of(by_id[qid], cls, unit)
                 and (scope is None or qid in scope)}
    mine = effective_priority(claim, queue)
    rule = policy.Policy(queue, mine, claim.created_at, within)
    victim_queues = (borrowers if rule.other_queues else set()) | ({queue.id} if rule.own_queue else set())
    if not victim_queues:
        return Found([], {}, used, {}, queue.id, unit)
    rows = charged.filter(queue_id__in=victim_queues)
    if connection.vendor == "postgresql":
        # Its own queue's claims of a higher priority never give way (of an equal one, only newer ones may):
        # left out by the query (a queue of equals is every allocated claim of the class). A join, not id
        # arrays: ``NOT id = ANY(array)`` is a scan of the array per row, quadratic in the allocated claims.
        op = "<=" if rule.within_queue == "LowerOrNewerEqualPriority" else "<"
        rows = rows.extra(where=[f'(NOT "queues_quotacharge"."queue_id" = %s OR {PRIORITY_SQL} {op} %s)'],
                          params=[queue.id, queue.max_priority, mine])
    held = {cid: (qid, Fraction(amount)) for cid, qid, amount in rows.values_list("claim_id", "queue_id", "amount")}
    if not held:
        return Found([], held, used, {}, queue.id, unit)
    now = timezone.now()
    pool = []
    # Only what the choice reads: the spec, allocation and conditions (the wide JSON columns) are not needed.
    allocated = list(ResourceClaim.objects.filter(phase=Phase.ALLOCATED, id__in=list(held))
                     .only("id", "labels", "annotations", "allocated_at", "created_at", "namespace_id", "cluster",
                           "node"))
    for v in gang_victims.fold(allocated, held):  # a gang is one candidate with its whole demand
        vq = by_id[held[v.id][0]]
        prio = effective_priority(v, vq)
        min_run = (vq.spec.get("preemption") or {}).get("minRuntimeSeconds", 0)
        if managed_elsewhere(v) or (v.allocated_at and v.allocated_at > now - timedelta(seconds=min_run)):
            continue
        if not rule.admits(v, vq, prio):
            continue
        # Kueue's order: claims of queues above their nominal first (reclaim), then its own queue's lower
        # priorities; lower priority first; most recently started first.
        pool.append((vq.id == queue.id, prio, -(v.allocated_at.timestamp() if v.allocated_at else 0), v.id, v))
    pool.sort(key=lambda t: t[:4])
    nominal = {qid: nominal_of(q, cls, unit) for qid, q in by_id.items()}
    checks: tuple = (None,)
    if rule.strategies:  # must borrow, fair-share preemption: what may be taken depends on the shares as it goes
        incoming = Fraction(need + (coming or {}).get((name, cls), 0)) if unit[0] == "devices" else Fraction(0)
        total = sum(used.values(), Fraction(0)) + sum(nominal.values(), Fraction(0))
        decayed, capacity = None, 1.0
        if any(queue_spec.half_life(q.spec) for q in tree.queues.values()):
            # The order's decayed usage and capacity: a queue's history weighs in preemption as in the order.
            known = order.Shares(tree, u.load())
            decayed, capacity = known.decayed, known.capacity()
        shares = policy.FairShares(tree, nominal, total, decayed, capacity)
        checks = tuple(policy.strategy_checks(shares, queue.id, incoming, rule.strategies))
    return Found([p[-1] for p in pool], held, used, nominal, queue.id, unit, checks)


def reclaim_scope(claim: ResourceClaim, name: str, cls: str, tree: Tree) -> set[int] | None:
    """The queues whose borrowing a claim blocked by quota (not by a full fleet) may reclaim: those under the
    highest ancestor of its queue that caps the class (a ``borrowingLimit``), where freeing devices gives the
    quota back; None (any queue) for a claim the fleet has no room for, or one blocked at the top level."""
    if claim.reason != queueing.WAITING_FOR_QUOTA:
        return None
    top = None
    for q in tree.chain(name)[1:]:
        entry = next((e for e in q.spec.get("quotas") or [] if e.get("deviceClassName") == cls
                      and not e.get("clusterSelector")), None)
        if entry and (entry.get("devices") or {}).get("borrowingLimit") is not None:
            top = q
    if top is None:
        return None
    ids = {top.id}
    grew = True
    while grew:
        more = {q.id for q in tree.queues.values() if q.parent_id in ids} - ids
        ids |= more
        grew = bool(more)
    return ids


def victim_devices(pool) -> dict[int, list[AllocatedDevice]]:
    """Candidate id -> its devices (a gang's: every member's)."""
    devices: dict[int, list[AllocatedDevice]] = defaultdict(list)
    unit_of = {c.id: v.id for v in pool for c in gang_victims.expand([v])}
    for row in DeviceAllocation.objects.filter(claim_id__in=list(unit_of)):
        devices[unit_of[row.claim_id]].append(AllocatedDevice(row.cluster, row.driver, row.pool, row.device,
                                                     row.share_id or None, row.consumed_capacity or None,
                                                     row.admin_access))
    return devices


def _confirm(claim, found: Found, need: int, kept: list | None, engine=None) -> list[ResourceClaim]:
    """Load what the engine check needs (the round's cached engine, the candidates' devices) and run it. In a
    unit other than devices, what the claim needs is known once the engine places it: no amount is required
    freed before the engine is asked, and a placement counts only if it keeps the claim's queue within its
    nominal."""
    if not found.pool:
        return []
    view = fleet.current_view()
    engine = engine or engines.engine_for(view, fleet.rows_in_use())
    devices = victim_devices(found.pool)
    group = allocation.engine_group(Group(claims=[claim]), view)
    admits = None
    if found.unit[0] != "devices":
        room = found.nominal.get(found.own, Fraction(0)) - found.used.get(found.own, Fraction(0))
        need = 0

        def admits(outcome) -> bool:
            return placed_amount(outcome.devices, found.unit, view) <= room
    return confirm_with_engine(engine, group, found.pool, need, found.held, found.used, found.nominal, found.own,
                               devices, kept, admits, quota_blocked=claim.reason == queueing.WAITING_FOR_QUOTA,
                               checks=found.checks)


def confirm_with_engine(engine, group, pool, need, held, used, nominal, own, devices,
                        kept: list | None = None, admits=None, quota_blocked: bool = False,
                        checks: tuple = (None,)) -> list:
    """The inclusion-minimal victims of ``pool`` that let ``engine`` place ``group``, or []: candidates are
    taken in order (a queue's only while it still borrows, unless it is ``own``) until the engine places the
    group, then every victim whose removal, in reverse order, still lets it be placed is given back (the
    greedy set alone took victims on a node that was not used in the end). ``held``: victim id -> (queue id,
    devices); ``used`` / ``nominal``: queue id -> devices; ``devices``: victim id -> its AllocatedDevices.
    The engine is left as it was, unless ``kept`` (a list, one per pass) is given: then the victims stay
    released and the group placed, so that the pass's next preemptors are decided after this one (each
    victim serves one preemptor), and ``restore(kept)`` puts the engine back at the end of the pass.
    ``admits``: a placement counts only if it says yes (None: any). ``quota_blocked``: the claim waits for a
    quota, not for room (the engine places it as things are; ``need`` must be freed under that quota)."""
    placed = _placer(engine, group, admits)
    if not quota_blocked and placed():
        # It fits as things are: devices were freed since it was tried (a pass's sweep requeues the victims
        # noticed for this very claim just before it is looked at again), or an earlier preemptor's victims of
        # this pass free room for it too. The round places it; nobody goes (but the room is its own for the
        # rest of the pass).
        _keep(engine, group, admits, kept, [])
        return []
    chosen = _greedy(placed, engine, pool, need, held, used, nominal, own, devices, checks)
    if not chosen:
        return []
    freed = sum((held[v.id][1] for v in chosen), Fraction(0))
    for v in reversed(list(chosen)):
        if freed - held[v.id][1] < need:
            continue  # the quota still needs as much freed (a claim blocked by quota, not by the fleet)
        engine.commit(devices[v.id])
        if placed():
            chosen.remove(v)  # not needed: it keeps its devices
            freed -= held[v.id][1]
        else:
            engine.release(devices[v.id])
    if not _keep(engine, group, admits, kept, [d for v in chosen for d in devices[v.id]]):
        for v in chosen:
            engine.commit(devices[v.id])
    return chosen


def _keep(engine, group, admits, kept: list | None, victims: list) -> bool:
    """Place ``group`` for the rest of the pass (``kept``), its ``victims``' devices released; False when there
    is no pass to keep it for or it does not fit."""
    if kept is None:
        return False
    outcome = engine.allocate(group, raise_errors=False)
    if not outcome.allocated:
        return False
    if admits is not None and not admits(outcome):
        engine.release(outcome.devices)
        return False
    kept.append(Kept(engine, victims, list(outcome.devices), (outcome.cluster or "", outcome.node or "")))
    return True


def _placer(engine, group, admits):
    """A check that ``engine`` places ``group`` now (and ``admits`` agrees); the engine is left as it was."""
    def placed() -> bool:
        outcome = engine.allocate(group, raise_errors=False, explain=False)  # only whether: no explanation
        if not outcome.allocated:
            return False
        engine.release(outcome.devices)
        return admits is None or admits(outcome)
    return placed


def _greedy(placed, engine, pool, need, held, used, nominal, own, devices, checks: tuple = (None,)) -> list:
    """Candidates in order until the engine places ``group``: left released, or [] (the engine as it was).
    ``checks``: one predicate per try (fair-share strategies, ``policy.strategy_checks``) saying whether a victim
    of another queue may be taken next, given the use as the choice leaves it; None: while its queue borrows."""
    for check in checks:
        chosen = _greedy_once(placed, engine, pool, need, held, used, nominal, own, devices, check)
        if chosen:
            return chosen
    return []


def _greedy_once(placed, engine, pool, need, held, used, nominal, own, devices, check) -> list:
    left = dict(used)
    chosen: list = []
    freed = Fraction(0)
    done = False
    try:
        for v in pool:
            qid, amount = held[v.id]
            if qid != own and (not check(qid, amount, left) if check is not None
                               else left[qid] <= nominal.get(qid, 0)):
                continue  # that queue no longer borrows (or would fall below the preemptor's share)
            engine.release(devices[v.id])
            chosen.append(v)
            left[qid] -= amount
            freed += amount
            if freed < need:
                continue
            if placed():
                done = True
                return chosen
        return []
    finally:
        if not done:
            for v in chosen:
                engine.commit(devices[v.id])


placer, keep = _placer, _keep  # for the re-check of running notices (``scheduler.services.recheck``)


class Kept(NamedTuple):
    """A preemptor placed in a pass's engine on its victims' devices: ``where`` (cluster, node) is where."""

    engine: object
    victims: list
    placed: list
    where: tuple[str, str]


def restore(kept: list[Kept]) -> None:
    """Undo what ``confirm_with_engine`` kept in the engine over a pass: placements out, victims back."""
    for k in reversed(kept):
        k.engine.release(k.placed)
        k.engine.commit(k.victims)
    kept.clear()


def mark(preemptor: ResourceClaim | None, victims: list[ResourceClaim], tree: Tree, label: str | None = None,
         reservation: str = "") -> int:
    """Notice to ``victims`` (one transaction); webhooks after commit. Returns how many were marked. No
    ``preemptor``: a ``reservation`` reclaims its held capacity (``label`` names it)."""
    now = timezone.now()
    victims = gang_victims.expand(victims)  # a gang's members are noticed together
    with transaction.atomic():
        # The preemptor's row too (in the same id order): two passes that overlap (the beat sends one per period
        # to any worker) both decided for it; the second must see the first's victims and mark none.
        ids = {v.id for v in victims}
        mine = [preemptor.id] if preemptor is not None else []
        rows = [v for v in claim_preemption.locked([*ids, *mine]) if v.id in ids and v.phase == Phase.ALLOCATED]
        if Preemption.objects.filter(Q(victim_id__in=[v.id for v in rows]) | Q(preemptor_id__in=mine),
                                     state=PreemptionState.PENDING).exists():
            return 0  # another pass got there first
        made = []
        for v in rows:
            vq = tree.queues.get(queue_of(v, v.namespace.name, tree))
            stop_by, force_at = notice_times(vq, now)
            made.append(Preemption(victim=v, preemptor=preemptor, queue=vq.name if vq else "", deadline=force_at,
                                   stop_by=stop_by, reservation=reservation))
            who = label or (f"{preemptor.namespace.name}/{preemptor.name}" if preemptor is not None else "")
            message = (f"preempted for {who}: stop by {stop_by.strftime('%Y-%m-%dT%H:%M:%SZ')}; devices are released "
                       f"at {force_at.strftime('%Y-%m-%dT%H:%M:%SZ')} at the latest, earlier once it has stopped")
            data = {"preemptor": preemptor.name if preemptor is not None else "", "stopBy": stop_by.isoformat(),
                    "forceAt": force_at.isoformat(), **({"reservation": reservation} if reservation else {})}
            claim_preemption.mark([v], message, data, now, stop_by=stop_by, force_at=force_at,
                                  preemptor_id=preemptor.id if preemptor is not None else None)
        Preemption.objects.bulk_create(made)
        webhooks.notify(made, tree.queues)
    return len(made)


def notice_times(queue: Queue | None, now) -> tuple:
    """(stopBy, forceAt) of a notice given ``now`` to a victim of ``queue`` (its ``graceSeconds`` and
    ``forceAfterSeconds``, the latter by default the former)."""
    policy = (queue.spec.get("preemption") or {}) if queue else {}
    grace = policy.get("graceSeconds", 30)
    force = max(grace, policy.get("forceAfterSeconds", grace))
    return now + timedelta(seconds=grace), now + timedelta(seconds=force)


def force_after(claims: list[ResourceClaim]) -> dict[int, float]:
    """claim id -> its queue's ``forceAfterSeconds`` (as ``notice_times`` counts it): how long a claim whose
    walltime ended keeps its devices, unconfirmed (``claims.services.walltime``)."""
    tree, now = Tree.load(), timezone.now()
    return {c.id: (notice_times(tree.queues.get(queue_of(c, c.namespace.name, tree)), now)[1] - now).total_seconds()
            for c in claims}


def sweep(limit: int = 500) -> int:
    """Finish the notices that are over: a victim confirmed (requeued already) or released meanwhile; one that
    nothing can be using, at ``stopBy`` (confirmed now, ``NoConsumer``); the rest at ``forceAt`` (forced).
    Returns how many victims it requeued."""
    now = timezone.now()
    due = list(Preemption.objects.filter(state=PreemptionState.PENDING)
               .filter(Q(deadline__lte=now) | Q(stop_by__lte=now) | ~Q(victim__phase=Phase.ALLOCATED))
               .order_by("deadline").values_list("id", "victim_id", "preemptor_id", "deadline")[:limit])
    if not due:
        return 0
    with transaction.atomic():
        victims = {v.id: v for v in claim_preemption.locked([v for _, v, _, _ in due])}
        live = [v for v in victims.values() if v.phase == Phase.ALLOCATED]
        kept = _recheck_due(live, now)  # their notices were cancelled: they keep their devices
        live = [v for v in live if v.id not in kept]
        forced = [v for v in live if any(d <= now for _, vid, _, d in due if vid == v.id)]
        calm = claim_preemption.nobody_to_ask([v for v in live if v not in forced], now)
        if calm:
            claim_preemption.confirm_locked(calm, claim_preemption.NO_CONSUMER, now, recheck=False)
        claim_preemption.requeue(forced, "preempted: it did not confirm that it stopped before its forceAt, and its "
                                         "devices went to a claim with a better right to them; waiting at its "
                                         "original place in its queue", now)
        moved = {v.id for v in [*forced, *calm]}
        finished = [(p, v, pre) for p, v, pre, _ in due
                    if v not in kept and (v in moved or victims.get(v) not in live)]
        for pid, vid, _ in finished:
            _finish(pid, victims.get(vid), now)
        # The preemptors are tried by the next round, as their requeued victims are: the wake-ups offer a freed
        # device to claims its own selectors serve, and a freed MIG partition's counters serve other partitions.
        wake.wake_claims({pre for _, _, pre in finished if pre is not None})
    return len(moved)


def _recheck_due(live: list[ResourceClaim], now) -> set[int]:
    """Just before their devices move: the ids of locked victims ``live`` whose notices the re-check cancelled."""
    still = claim_preemption.still_needed(live, now, in_worker=True)  # ``scheduler.services.recheck``
    return {v.id for v in live} - {v.id for v in still}


def _finish(pid: int, victim: ResourceClaim | None, now) -> None:
    """The notice ``pid`` is over: what confirmed it is copied from the victim (released meanwhile: its release;
    neither: forced at its deadline)."""
    info = (victim.preemption or {}) if victim is not None else {}
    at, by = info.get("confirmedAt"), info.get("confirmedBy") or ""
    confirmed_at = parse_datetime(at) if at else None
    if victim is not None and victim.phase == Phase.RELEASED and confirmed_at is None:
        confirmed_at, by = victim.released_at, "Released"
    Preemption.objects.filter(id=pid).update(state=PreemptionState.DONE, finished_at=now, confirmed_at=confirmed_at,
                                             confirmed_by=by[:255])
