"""Start-time estimates for pending claims: from the queue order, running claims' lease expiry times and the
recorded history of how long claims held their devices.

For a pending claim needing ``n`` devices of a class, behind claims of its queue needing ``m`` more, the
devices held by running claims of that class (of its own queue when it waits for quota, else of the whole
fleet) are ordered by when each is expected to end: its lease expiry, else its start plus the mean holding
time of its queue's released claims. The estimate is the moment the ends free ``n + m`` devices. With no
lease and no history to go on, there is no estimate, and ``status.estimate.reason`` says why.
"""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Avg, DurationField, ExpressionWrapper, F
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from queues import spec as queue_spec
from queues.models import DEFAULT_QUEUE, QuotaCharge
from queues.services.usage import requested_devices

HISTORY_DAYS = 7  # released claims of this recent past give a queue's mean holding time


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
    classes = {cls for c in pending for cls, _ in requested_devices(c.spec)}
    running = list(QuotaCharge.objects.filter(claim__phase=Phase.ALLOCATED, unit="devices", device_class__in=classes)
                   .values_list("claim_id", "device_class", "amount", "queue__name", "claim__lease_expires_at",
                                "claim__allocated_at"))
    held_for = _history({r[3] for r in running})
    now = timezone.now()
    out = {}
    for claim in pending:
        wanted = requested_devices(claim.spec)
        if not wanted:
            continue
        cls = wanted[0][0]
        need = sum(n for c, n in wanted if c == cls) + ahead.get(claim.id, 0)
        own_queue = claim.reason == "WaitingForQuota"
        ends = []
        unknown = 0
        for _, rcls, amount, queue, lease_end, started in running:
            if rcls != cls or (own_queue and queue != queues_of[claim.id]):
                continue
            end = lease_end or (started + held_for[queue] if queue in held_for and started else None)
            if end is None:
                unknown += int(amount)
            else:
                ends.append((max(end, now), int(amount)))
        share = 1.0
        if tree is not None and not own_queue:
            share = fair_fraction(tree.queues.get(queues_of[claim.id]),
                                  [tree.queues[q] for q in waiting if q in tree.queues], cls,
                                  sum(n for _, n in ends) + unknown)
        when = expected_start(sorted(ends), need, now, share)
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


def expected_start(ends: list, need: int, now, share: float = 1.0):
    """The first end (of ``(end, devices)`` sorted by end) by which ``need`` devices are freed for this
    queue, or None. ``share``: the part of what frees up that goes to this queue while others wait too (its
    weight over the weights of the queues with waiting claims: the fair-share order interleaves them)."""
    freed = 0.0
    for end, amount in ends:
        freed += amount * share
        if freed >= need:
            return max(end, now)
    return None


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


def _history(queues: set[str]) -> dict[str, timedelta]:
    """Mean time claims of each queue held their devices (those released in the last ``HISTORY_DAYS``)."""
    if not queues:
        return {}
    held = ExpressionWrapper(F("claim__released_at") - F("claim__allocated_at"), output_field=DurationField())
    since = timezone.now() - timedelta(days=HISTORY_DAYS)
    rows = (QuotaCharge.objects.filter(queue__name__in=queues, claim__phase=Phase.RELEASED,
                                       claim__released_at__gte=since, claim__allocated_at__isnull=False)
            .values("queue__name").annotate(mean=Avg(held)).values_list("queue__name", "mean"))
    return {name: mean for name, mean in rows if mean is not None}
