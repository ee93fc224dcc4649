"""Start-time estimates for pending claims: from the queue order, running claims' lease expiry times and the
recorded history of how long claims held their devices.

For a pending claim needing ``n`` devices of a class, behind claims of its queue needing ``m`` more, the
devices held by running claims of that class (of its own queue when it waits for quota, else of the whole
fleet) are ordered by when each is expected to end: its lease expiry, else its start plus the mean holding
time of its queue's released claims. The estimate is the moment the ends free ``n + m`` devices. With no
lease and no history to go on, there is no estimate, and ``status.estimate.reason`` says why.

A pending claim's read asks for its estimate, and clients poll it; what it needs of the fleet (every running
claim's devices and expected end, the queues' mean holding times) is kept per web process (``_Ends``) and
read again only when the allocations may have changed: a release (``wake.clock_sql``) or a new charge
(the highest ``QuotaCharge`` id; a re-admission inserts its charges anew). A lease renewal moves an end
without either, so the copy is also read again after ``MAX_AGE_SECONDS``. The holding times come from a
bounded sample (the ``HISTORY_SAMPLE`` most recent releases of the last ``HISTORY_DAYS``): released claims are
kept, and averaging all of them made every estimate cost more as the service ran.

A claim the scheduler's plan gives a start (a queue's first ``planDepth``: ``scheduler.services.plan``, which
registers its reader here) is estimated from the plan instead: its planned start already counts the lease
sweep's period and a round's latency after the walltime ends it waits for, and the devices the claims planned
before it take.
"""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import wake
from queues import spec as queue_spec
from queues.models import DEFAULT_QUEUE, QuotaCharge
from queues.services.usage import requested_devices

HISTORY_DAYS = 7  # released claims of this recent past give a queue's mean holding time
HISTORY_SAMPLE = 5000  # ... the most recent of them, fleet-wide
MAX_AGE_SECONDS = 10.0

# claim ids -> {"start": planned start or None} for those in the plan; set by the scheduler (AppConfig.ready).
_plan_reader: Callable[[list[int]], dict[int, dict]] | None = None


def register_plan(reader: Callable[[list[int]], dict[int, dict]] | None) -> None:
    global _plan_reader
    _plan_reader = reader


def estimates(pending: list, queues_of: dict[int, str], ahead: dict[int, int], tree=None) -> dict[int, dict]:
    """claim id -> status fields (``estimatedStartTime`` + ``estimate.message``, or ``estimate.reason``).
    ``ahead``: claim id -> devices the claims before it in its queue ask for; ``tree``: the queues (for the
    share of freed devices each gets while several wait, ``fair_fraction``)."""
    if not pending:
        return {}
    waiting = set(queues_of.values())
    if tree is not None:  # queues with waiting claims, by namespace (claims naming a queue by label aside)
        for namespace in ResourceClaim.objects.filter(phase=Phase.PENDING).values_list(
                "namespace__name", flat=True).distinct():
            waiting.add(tree.by_namespace.get(namespace, DEFAULT_QUEUE))
    running = _ends()
    now = timezone.now()
    planned = _plan_reader([c.id for c in pending]) if _plan_reader is not None else {}
    out = {}
    for claim in pending:
        start = (planned.get(claim.id) or {}).get("start")
        # The plan places devices, not quota: a claim its queue's quota holds back starts when its own queue's
        # running claims end, which the estimate below counts.
        if start is not None and claim.reason != "WaitingForQuota":
            out[claim.id] = from_plan(start, now)
            continue
        wanted = requested_devices(claim.spec)
        if not wanted:
            continue
        cls = wanted[0][0]
        need = sum(n for c, n in wanted if c == cls) + ahead.get(claim.id, 0)
        own_queue = claim.reason == "WaitingForQuota"
        ends, cumulative, unknown = running.scope(cls, queues_of[claim.id] if own_queue else "")
        share = 1.0
        if tree is not None and not own_queue:
            share = fair_fraction(tree.queues.get(queues_of[claim.id]),
                                  [tree.queues[q] for q in waiting if q in tree.queues], cls,
                                  (cumulative[-1] if cumulative else 0) + unknown)
        when = expected_start(ends, cumulative, need, now, share)
        if when is None:
            reason = "NoLeaseOrHistory" if unknown else "NotEnoughRunningClaims"
            out[claim.id] = {"estimate": {"reason": reason, "message": (
                f"{unknown} running devices have no lease and their queues no history" if unknown else
                f"the running claims free fewer than the {need} devices needed")}}
            continue
        minutes = max(0, round((when - now).total_seconds() / 60))
        out[claim.id] = {"estimatedStartTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"), "estimate": {"message": (
            f"about {minutes} min: running claims ending by {when.strftime('%H:%M')} free the {need} {cls} "
            f"devices this claim and those before it need")}}
    return out


def from_plan(start: datetime, now: datetime) -> dict:
    when = max(start, now)
    minutes = max(0, round((when - now).total_seconds() / 60))
    return {"estimatedStartTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"), "estimate": {"message": (
        f"about {minutes} min: the scheduler's plan starts it at {when.strftime('%H:%M:%S')}, when the walltimes "
        "of the running claims it waits for have ended (with the lease sweep and a round)")}}


def expected_start(ends: list[datetime], cumulative: list[int], need: int, now, share: float = 1.0):
    """The first of ``ends`` (sorted; ``cumulative``: the devices freed by each and those before it) by which
    ``need`` devices are freed for this queue, or None. ``share``: the part of what frees up that goes to this
    queue while others wait too (its weight over the weights of the queues with waiting claims: the
    fair-share order interleaves them)."""
    at = bisect_left(range(len(cumulative)), True, key=lambda i: cumulative[i] * share >= need)
    return max(ends[at], now) if at < len(ends) else None


def fair_fraction(queue, waiting: list, cls: str, capacity: float) -> float:
    """The part of the devices of ``cls`` that ``queue`` holds in the steady state of the fair-share order
    while the ``waiting`` queues (it among them) all have claims waiting: its nominal, plus its weight's part of
    what no waiting queue is nominally given. ``capacity``: devices of the class (those running, in practice)."""
    if capacity <= 0 or queue is None:
        return 1.0

    def nominal(q) -> float:
        for entry in q.spec.get("quotas") or []:
            if entry.get("deviceClassName") == cls and entry.get("devices"):
                return float(queue_spec.amount_of(entry["devices"].get("nominal", 0)) or 0)
        return 0.0

    surplus = max(0.0, capacity - sum(nominal(q) for q in waiting))
    weights = sum(q.weight for q in waiting) or 1.0
    return max(0.01, min(1.0, (nominal(queue) + surplus * queue.weight / weights) / capacity))


@dataclass
class _Ends:
    """Per device class, and per (class, queue): the running devices' expected ends in order, the devices
    freed by each end and those before it, and the devices whose end is unknown (no lease, no history)."""

    key: tuple
    built_at: float
    scopes: dict[tuple[str, str], tuple[list[datetime], list[int], int]] = field(default_factory=dict)

    def scope(self, cls: str, queue: str) -> tuple[list[datetime], list[int], int]:
        return self.scopes.get((cls, queue), ([], [], 0))


_lock = threading.Lock()
_cached: _Ends | None = None


def _state_key() -> tuple:
    """Moves whenever a claim's devices are released or charged (one statement, two index reads)."""
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT (SELECT max(id) FROM {qn(QuotaCharge._meta.db_table)}), "
                       f"{wake.clock_sql()}")
        return tuple(cursor.fetchone())


def _ends() -> _Ends:
    global _cached
    key = _state_key()
    with _lock:
        cached = _cached
    if cached is not None and cached.key == key and time.monotonic() - cached.built_at < MAX_AGE_SECONDS:
        return cached
    fresh = _build(key)
    with _lock:
        _cached = fresh
    return fresh


def _build(key: tuple) -> _Ends:
    running = list(QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit="devices")
                   .values_list("device_class", "amount", "queue__name", "claim__lease_expires_at",
                                "claim__allocated_at"))
    held_for = _history()
    listed: dict[tuple[str, str], list[tuple[datetime, int]]] = defaultdict(list)
    unknown: dict[tuple[str, str], int] = defaultdict(int)
    for cls, amount, queue, lease_end, started in running:
        end = lease_end or (started + held_for[queue] if queue in held_for and started else None)
        for scope in ((cls, ""), (cls, queue)):
            if end is None:
                unknown[scope] += int(amount)
            else:
                listed[scope].append((end, int(amount)))
    out = _Ends(key=key, built_at=time.monotonic())
    for scope in listed.keys() | unknown.keys():
        ends = sorted(listed.get(scope, ()), key=lambda e: e[0])
        cumulative, total = [], 0
        for _, n in ends:
            total += n
            cumulative.append(total)
        out.scopes[scope] = ([end for end, _ in ends], cumulative, unknown.get(scope, 0))
    return out


def _history() -> dict[str, timedelta]:
    """Mean time claims of each queue held their devices, over the fleet's ``HISTORY_SAMPLE`` most recent
    releases of the last ``HISTORY_DAYS`` (an index scan of the newest released claims, then their charges)."""
    since = timezone.now() - timedelta(days=HISTORY_DAYS)
    claims = ResourceClaim.objects.filter(phase=Phase.RELEASED, released_at__gte=since,
                                          allocated_at__isnull=False).order_by("-released_at")
    held = {i: (r, a) for i, r, a in claims.values_list("id", "released_at", "allocated_at")[:HISTORY_SAMPLE]}
    if not held:
        return {}
    totals: dict[str, list] = defaultdict(lambda: [timedelta(0), 0])
    seen: set[tuple[int, str]] = set()
    for claim_id, queue in QuotaCharge.objects.filter(claim_id__in=list(held)).values_list("claim_id", "queue__name"):
        if (claim_id, queue) in seen:
            continue  # one claim counts once per queue, whatever its number of charges
        seen.add((claim_id, queue))
        released, allocated = held[claim_id]
        if released is None or allocated is None:
            continue  # never: the query asks for released claims that were allocated
        totals[queue][0] += released - allocated
        totals[queue][1] += 1
    return {queue: total / n for queue, (total, n) in totals.items()}
