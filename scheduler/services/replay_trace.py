"""What a replay replays: the recorded claims of a window, what held devices when it began, and the queue and
reservation specs in force at each moment of it.

* Claims: their arrival, shape, labels and walltime from the claims' history (``claims.models.ClaimHistory``);
  when they ran from the usage ledger (``usage.models.UsageInterval``: one run per distinct start of a claim's
  intervals, so a preempted claim has several); the end of a claim that never ran from its ``Released`` or
  ``Deleted`` event. A claim's duration in the replay is that of its last run (a preempted run was lost work);
  one that never ran runs for its walltime (or to the end of the window) should the replay start it.
* Background: the devices held when the window opens (intervals open at its start), on the very devices the
  ledger names, until they were given back.
* Configuration: the specs of today's queues and reservations with the audit trail's changes after each moment
  undone (``before``), so every moment of the window is replayed with the policy that was live then: one
  epoch per change inside the window.
"""
from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from claims.models import ClaimEvent, ClaimHistory
from claims.services import events as ev
from dra.engine import AllocatedDevice
from draservice import audit
from draservice.models import AuditEvent
from queues import reservation_spec
from queues import spec as queue_spec
from queues.models import Queue, Reservation
from usage.models import UsageInterval

ENDS = (ev.RELEASED, ev.DELETED, ev.LEASE_EXPIRED, ev.FAILED)


@dataclass
class Run:
    start: float  # seconds from the window's start
    end: float | None  # None: still holding devices
    devices: float  # the ledger's weights: devices (or shares of them) held
    queue: str
    reservation: str


@dataclass
class TraceClaim:
    uid: str
    namespace: str
    name: str
    labels: dict
    spec: dict
    walltime: float | None
    arrival: float  # seconds from the window's start (negative: it arrived before and waited into it)
    created_at: datetime
    runs: list[Run] = field(default_factory=list)
    ended: float | None = None  # released or deleted (whether or not it ran)

    @property
    def duration(self) -> float | None:
        """How long it holds devices once started (None: to the end of the window)."""
        if self.runs:
            last = self.runs[-1]
            return None if last.end is None else last.end - last.start
        return self.walltime


@dataclass
class Held:
    """Devices held when the window opened, until ``end`` (None: past the window)."""

    devices: list[AllocatedDevice]
    queue: str
    reservation: str
    end: float | None
    weight: float


@dataclass
class Trace:
    start: datetime
    end: datetime
    claims: list[TraceClaim]
    background: list[Held]
    # (seconds from the start, {kind: {name: spec}}): the configuration from that moment on, oldest first
    epochs: list[tuple[float, dict[str, dict[str, dict]]]]


def load(start: datetime, end: datetime) -> Trace:
    def at(when: datetime) -> float:
        return (when - start).total_seconds()

    # Rows as tuples, not models: a day is tens of thousands of claims and of ledger intervals.
    fields = ("claim_uid", "namespace", "claim_name", "labels", "spec", "lease_seconds", "created_at")
    rows = list(ClaimHistory.objects.filter(created_at__gte=start, created_at__lt=end).values_list(*fields))
    uids = {r[0] for r in rows}
    # Claims that arrived before the window and first ran inside it waited into it: replayed too.
    late = set(UsageInterval.objects.filter(started_at__gte=start, started_at__lt=end).exclude(claim_uid__in=uids)
               .values_list("claim_uid", flat=True).distinct())
    rows += list(ClaimHistory.objects.filter(claim_uid__in=late).values_list(*fields))
    claims = {str(uid): TraceClaim(str(uid), namespace, name, labels or {}, spec or {}, lease, at(created), created)
              for uid, namespace, name, labels, spec, lease, created in rows}
    runs: dict[tuple[str, datetime], list] = {}
    background: dict[tuple[str, datetime], Held] = {}
    overlapping = UsageInterval.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=start), started_at__lt=end)
    for uid_, started_at, ended_at, weight, queue, reservation, cluster, driver, pool, device, share in \
            overlapping.values_list("claim_uid", "started_at", "ended_at", "weight", "queue", "reservation",
                                    "cluster", "driver", "pool", "device", "share_id"):
        uid = str(uid_)
        key = (uid, started_at)
        ended = None if ended_at is None or ended_at >= end else at(ended_at)
        if uid in claims and started_at >= start:
            run = runs.setdefault(key, [at(started_at), ended, 0.0, queue, reservation])
            run[2] += float(weight)
        elif started_at < start:
            held = background.setdefault(key, Held([], queue, reservation, ended, 0.0))
            held.devices.append(AllocatedDevice(cluster, driver, pool, device, share or None))
            held.weight += float(weight)
    for (uid, _), (s, e, devices, queue, reservation) in sorted(runs.items(), key=lambda kv: kv[1][0]):
        claims[uid].runs.append(Run(s, e, devices, queue, reservation))
    for ended_uid, when in (ClaimEvent.objects.filter(claim_uid__in=list(claims), type__in=ENDS)
                            .order_by("id").values_list("claim_uid", "created_at")):
        claim = claims[str(ended_uid)]
        if claim.ended is None:
            claim.ended = at(when)
    ordered = sorted(claims.values(), key=lambda c: (c.created_at, c.uid))
    return Trace(start, end, ordered, list(background.values()), epochs(start, end))


# ------------------------------------------------------------------------------------------- configuration

def epochs(start: datetime, end: datetime) -> list[tuple[float, dict[str, dict[str, dict]]]]:
    """The configuration at the window's start, then after each audited change inside it."""
    kinds = {queue_spec.KIND: {q.name: copy.deepcopy(q.spec) for q in Queue.objects.all()},
             reservation_spec.KIND: {r.name: copy.deepcopy(r.spec) for r in Reservation.objects.all()}}
    events = list(AuditEvent.objects.filter(kind__in=list(kinds), at__gte=start).order_by("-id"))
    for event in events:  # newest first: undo everything since the start
        _apply(kinds[event.kind], event, "before")
    out = [(0.0, copy.deepcopy(kinds))]
    for event in reversed(events):
        if event.at >= end:
            break
        _apply(kinds[event.kind], event, "after")
        out.append(((event.at - start).total_seconds(), copy.deepcopy(kinds)))
    return out


def _apply(specs: dict[str, dict], event: AuditEvent, side: str) -> None:
    """Put ``event``'s ``side`` (before: undo it; after: redo it) of its spec leaves into ``specs``."""
    gone = (event.operation == audit.CREATE and side == "before") or (event.operation == audit.DELETE
                                                                      and side == "after")
    if gone:
        specs.pop(event.name, None)
        return
    spec = specs.setdefault(event.name, {})
    for change in event.changes or []:
        path = str(change.get("path") or "")
        if path != "spec" and not path.startswith("spec."):
            continue
        value = copy.deepcopy(change.get(side))
        if path == "spec":
            specs[event.name] = value if isinstance(value, dict) else {}
            continue
        keys = path.split(".")[1:]
        at = spec
        for key in keys[:-1]:
            inner = at.get(key)
            if not isinstance(inner, dict):
                inner = at[key] = {}
            at = inner
        if value is None:
            at.pop(keys[-1], None)
        else:
            at[keys[-1]] = value


def actual_by_queue(trace: Trace, queue_at) -> dict[str, dict]:
    """What happened, per queue: waits (first start after arrival), device-seconds inside the window,
    preemptions (runs after the first), claims and claims started. ``queue_at(claim)``: the queue of a claim
    that never ran (the ledger names the others')."""
    seconds = (trace.end - trace.start).total_seconds()
    out: dict[str, dict] = defaultdict(lambda: {"waits": [], "deviceSeconds": 0.0, "preemptions": 0, "claims": 0,
                                                "started": 0})
    for c in trace.claims:
        queue = c.runs[0].queue if c.runs else queue_at(c)
        row = out[queue]
        row["claims"] += 1
        if c.runs:
            row["started"] += 1
            row["waits"].append(max(0.0, c.runs[0].start - max(c.arrival, 0.0)))
            row["preemptions"] += len(c.runs) - 1
        for r in c.runs:
            out[r.queue]["deviceSeconds"] += r.devices * (min(seconds, r.end if r.end is not None else seconds)
                                                          - max(0.0, r.start))
    for h in trace.background:
        out[h.queue]["deviceSeconds"] += h.weight * (h.end if h.end is not None else seconds)
    return out
