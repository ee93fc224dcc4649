"""Start-time estimates for pending claims: from the queue order, running claims' lease expiry times and the
recorded history of how long claims held their devices.

For a pending claim needing ``n`` devices of a class, behind claims of its queue needing ``m`` more, the
devices held by running claims of that class (of its own queue when it waits for quota, else of the whole
fleet) are ordered by when each is expected to end: its lease expiry, else its start plus the mean holding
time of its queue's released claims. The estimate is the moment the ends free ``n + m`` devices. With no
lease and no history to go on, there is no estimate, and ``status.estimate.reason`` says why.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.db.models import Avg, DurationField, ExpressionWrapper, F
from django.utils import timezone

from claims.models import Phase
from queues.models import QuotaCharge
from queues.services.usage import requested_devices

HISTORY = 200  # released claims per queue the mean holding time is taken over


def estimates(pending: list, queues_of: dict[int, str], ahead: dict[int, list]) -> dict[int, dict]:
    """claim id -> status fields (``estimatedStartTime`` + ``estimate.message``, or ``estimate.reason``).
    ``ahead``: claim id -> the pending claims before it in its queue."""
    if not pending:
        return {}
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
        need = sum(n for c, n in wanted if c == cls) + sum(
            n for other in ahead.get(claim.id, []) for c, n in requested_devices(other.spec) if c == cls)
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
        ends.sort()
        freed, when = 0, None
        for end, amount in ends:
            freed += amount
            if freed >= need:
                when = end
                break
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


def _history(queues: set[str]) -> dict[str, timedelta]:
    """Mean time claims of each queue held their devices (recent released ones)."""
    out: dict[str, timedelta] = {}
    held = ExpressionWrapper(F("claim__released_at") - F("claim__allocated_at"), output_field=DurationField())
    per_queue: dict[str, list] = defaultdict(list)
    for queue in queues:
        ids = list(QuotaCharge.objects.filter(queue__name=queue, claim__phase=Phase.RELEASED,
                                              claim__released_at__isnull=False)
                   .order_by("-claim__released_at").values_list("id", flat=True)[:HISTORY])
        if ids:
            mean = QuotaCharge.objects.filter(id__in=ids).aggregate(mean=Avg(held))["mean"]
            if mean is not None:
                out[queue] = mean
        per_queue[queue] = ids
    return out
