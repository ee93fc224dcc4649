"""The reservations' pass (``scheduler.tasks.reservations``, beat every ``TICK_SECONDS``): hold, reclaim, start.

For each reservation, its current or next occurrence:
- from ``start − leadTimeSeconds``, once per occurrence: the nodes to hold are chosen by the engine
  (``queues.services.reservation_fit``) on what will still run at the start -- the devices of claims whose
  walltime ends before it, of the reservation's own claims and, with ``reclaimBorrowed``, of claims of queues
  that borrow the class are counted free; nodes running the fewest of those are tried first. What could not be
  held is the reservation's ``Degraded`` message (nothing is dropped silently). With ``reclaimBorrowed``, the
  borrowing claims running on the devices chosen get preemption notices (``scheduler.services.preemption.mark``,
  their queue's grace period; the notice names the reservation and the re-check keeps it);
- from ``start``: its labelled claims waiting for the window are decided again at once, and the delay of its
  first start is recorded (``Reservation.started``: the late-start gauge);
- after an inventory change: ``check_inventory`` (a loss is the reservation's ``Degraded``, never dropped
  silently);
- after ``end``: the hold is dropped, and claims held off its nodes or waiting for the quota it withheld
  (``queues.services.admission``) are decided again.
"""
from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from claims import dispatch
from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import fleet, wake
from claims.services.taking import bump_fleet_version
from dra import windows
from dra.engine import Engine
from queues import reservation_spec as spec_mod
from queues.models import Reservation
from queues.services import reservation_fit as fit
from queues.services import reservations as reservation_services
from queues.services import usage as u
from queues.services.order import Shares
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices
from scheduler.services import plan, preemption
from scheduler.services.reservations import ISO

TICK_SECONDS = 2.0
WAITING = "WaitingForReservation"
HELD = "HeldForReservation"


def run(now: datetime | None = None) -> dict:
    now = now or timezone.now()
    out = {"held": 0, "noticed": 0, "woken": 0, "degraded": check_inventory(now)}
    for r in Reservation.objects.order_by("id"):
        occ = windows.current_or_next(spec_mod.parsed_window(r.spec), now)
        if r.held and (occ is None or r.held.get("start") != occ.start.strftime(ISO)) and _ended(r, now):
            with transaction.atomic():
                r.held = {}
                r.save(update_fields=["held", "updated_at"])
                bump_fleet_version()  # claims waiting for the quota it withheld are tried again too
            out["woken"] += _wake(ResourceClaim.objects.filter(phase=Phase.PENDING, reason=HELD))
        if occ is None or now < occ.start - timedelta(seconds=r.spec.get("leadTimeSeconds") or 0):
            continue
        if r.held.get("start") != occ.start.strftime(ISO):
            out["held"] += 1
            out["noticed"] += hold(r, occ)
        if now >= occ.start:
            out["woken"] += _wake(ResourceClaim.objects.filter(phase=Phase.PENDING, reason=WAITING,
                                                               labels__contains={spec_mod.LABEL: r.name}))
            _note_start(r, occ)
    return out


# The fleet view whose inventory this process last checked the reservations against, and when: at most once
# every CHECK_SECONDS (each check places every reservation on a fresh engine; agents may push often).
_checked: dict = {"key": None, "at": float("-inf")}
CHECK_SECONDS = 30.0


def check_inventory(now: datetime) -> int:
    """After an inventory change (a new fleet view), each reservation against what is left: one holding now
    whose held nodes lost devices (or that was short) is held again from the fleet as it is, its shortfall its
    ``Degraded`` message; any other is placed beside the older ones its occurrences overlap
    (``reservation_services.shortfall``). ``Degraded`` clears when it fits again. Returns the reservations
    whose ``Degraded`` changed."""
    view = fleet.current_view()
    if _checked["key"] == view.key or time.monotonic() - _checked["at"] < CHECK_SECONDS:
        return 0
    changed = 0
    older: list[Reservation] = []
    for r in Reservation.objects.order_by("id"):
        occ = windows.current_or_next(spec_mod.parsed_window(r.spec), now)
        was = r.degraded
        if occ is not None and r.held.get("start") == occ.start.strftime(ISO):
            lost = _held_now(view, r) < int(r.held.get("heldDevices") or 0)
            if r.degraded or lost:
                hold(r, occ)
                if r.degraded:
                    r.degraded = (("the fleet lost capacity held for it: " if lost else
                                   "still short after an inventory change: ") + r.degraded)
                    r.save(update_fields=["degraded", "updated_at"])
        elif occ is not None:
            r.degraded = reservation_services.shortfall(r, older, view, now)
            if r.degraded != was:
                r.save(update_fields=["degraded", "updated_at"])
        changed += r.degraded != was
        older.append(r)
    _checked.update(key=view.key, at=time.monotonic())
    return changed


def _held_now(view, r: Reservation) -> int:
    """Devices of the reservation's classes on its held nodes in the current inventory (nothing in use)."""
    engine = Engine(view.snapshot, [])
    classes = {res["deviceClassName"] for res in r.spec.get("resources") or [] if res.get("devices")}
    nodes = {tuple(n) for n in r.held.get("nodes") or []}
    return sum(fit.free_on(engine, model, node, cls) for model in engine.clusters.values()
               for node in model.node_order if (model.name, node) in nodes for cls in classes)


def _ended(r: Reservation, now: datetime) -> bool:
    end = r.held.get("end")
    return not end or datetime.fromisoformat(end.replace("Z", "+00:00")) <= now


def _wake(qs) -> int:
    woken = wake.wake_claims(list(qs.values_list("id", flat=True)))
    if woken:
        dispatch.request_allocation()
    return woken


def hold(r: Reservation, occ: windows.Occurrence) -> int:
    """Choose and store the nodes held for ``occ``; notice the borrowers on them. Returns the notices given."""
    view = fleet.current_view()
    rows = fleet.rows_in_use()
    free, victims = _reclaimable(r, occ, set(rows))
    engine = Engine(view.snapshot, [d for rid, d in rows.items() if rid not in free])
    busy: dict[tuple[str, str], int] = defaultdict(int)
    for rid in free:
        claim = free[rid]
        busy[(claim.cluster, claim.node)] += 1
    placed = fit.place(engine, view.cluster_labels, r.name, r.spec, busy)
    r.held = {"start": occ.start.strftime(ISO), "end": occ.end.strftime(ISO),
              "nodes": [list(n) for n in placed.nodes], "heldDevices": len(placed.devices)}
    r.degraded = "; ".join(placed.short)
    r.save(update_fields=["held", "degraded", "updated_at"])
    taken = {(d.cluster, d.driver, d.pool, d.device) for d in placed.devices}
    hit = [c for rid, c in free.items() if c.id in victims
           and (rows[rid].cluster, rows[rid].driver, rows[rid].pool, rows[rid].device) in taken]
    if not hit or not r.spec.get("reclaimBorrowed"):
        return 0
    unique = list({c.id: c for c in hit}.values())
    return preemption.mark(None, unique, Tree.load(), label=f'reservation "{r.name}"', reservation=r.name)


def _reclaimable(r: Reservation, occ: windows.Occurrence, row_ids: set[int]):
    """(allocation row id -> its claim, for rows free by the start: walltimes ending before it, the
    reservation's own claims, borrowers when it reclaims; the ids of those borrowers)."""
    pad = plan.margin().total_seconds()
    rows = (DeviceAllocation.objects.filter(id__in=row_ids, claim__phase=Phase.ALLOCATED)
            .select_related("claim__namespace"))
    tree = shares = None
    free: dict[int, ResourceClaim] = {}
    borrowers: set[int] = set()
    for row in rows:
        c = row.claim
        ends = c.lease_expires_at.timestamp() if c.lease_expires_at else None
        if windows.free_by_start(ends, occ.start.timestamp(), pad) or (c.labels or {}).get(spec_mod.LABEL) == r.name:
            free[row.id] = c
            continue
        if not r.spec.get("reclaimBorrowed") or c.preemption:
            continue
        if shares is None:
            tree = Tree.load()
            shares = Shares(tree, u.load())
        assert tree is not None
        queue = tree.queues.get(queue_of(c, c.namespace.name, tree))
        wants = requested_devices(c.spec)
        if queue is not None and c.quota_charges.exists() and any(
                shares.used[(queue.id, cls)] > shares.nominal.get((queue.id, cls), 0) for cls, _ in wants):
            free[row.id] = c
            borrowers.add(c.id)
    return free, borrowers


def _note_start(r: Reservation, occ: windows.Occurrence) -> None:
    """Seconds from the start to the first claim the reservation admitted in this occurrence (the late-start
    gauge); kept for the last 10 occurrences."""
    key = occ.start.strftime(ISO)
    if key in r.started:
        return
    first = (ResourceClaim.objects.filter(labels__contains={spec_mod.LABEL: r.name}, allocated_at__gte=occ.start,
                                          allocated_at__lt=occ.end).aggregate(at=Min("allocated_at"))["at"])
    if first is None:
        return
    started = dict(sorted({**r.started, key: round((first - occ.start).total_seconds(), 3)}.items())[-10:])
    Reservation.objects.filter(pk=r.pk).update(started=started)
