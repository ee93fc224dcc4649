"""Claim state changes of preemption with notice (the claims app writes claim rows; the scheduler decides).

The safe-release flow: a victim is first *marked* (condition ``Preempted``, reason ``PreemptionPending``, a
deadline; it keeps its devices and its holder is told), and at the deadline *requeued*: its devices are freed
and it goes back to ``Pending`` with reason ``Preempted``. It keeps its ``created_at``, so it is back at its
original place in its queue. Defragmentation and device removal are to reuse these two steps.
"""
from __future__ import annotations

from django.db import transaction

from claims import dispatch
from claims.models import Phase, ResourceClaim
from claims.services import bulk, conditions
from claims.services import events as ev
from claims.services.claims import free_devices
from claims.services.conditions import set_allocated_condition, set_condition
from draservice import notify

PREEMPTED = conditions.PREEMPTED
PREEMPTION_PENDING = conditions.PREEMPTION_PENDING
FIELDS = ["phase", "reason", "message", "conditions", "allocation", "cluster", "node", "attempted_version",
          "lease_expires_at", "resource_version", "updated_at", "allocated_at"]


def locked(ids: list[int]) -> list[ResourceClaim]:
    return list(ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                .filter(id__in=sorted(ids)).order_by("id"))


def mark(claims: list[ResourceClaim], message: str, data: dict, now) -> None:
    """Locked, allocated ``claims`` are told they will be preempted (they keep their devices until then)."""
    for c in claims:
        c.conditions = set_condition(c.conditions, PREEMPTED, True, PREEMPTION_PENDING, message, now)
        c.resource_version += 1
        c.updated_at = now
    bulk.update_rows(claims, ["conditions", "resource_version", "updated_at"])
    ev.record([ev.event(c, PREEMPTED, PREEMPTION_PENDING, message, data) for c in claims])
    ids = [c.id for c in claims]
    transaction.on_commit(lambda: notify.publish(ids))


def requeue(claims: list[ResourceClaim], message: str, now) -> None:
    """Locked ``claims`` give their devices back and wait again, at their original place (``created_at``).
    Their devices are freed as a release frees them (``free_devices``): the wake-ups are the same, targeted
    ones (each freed device wakes the first ``WAKE_FANOUT`` pending claims it can serve; the requeued claims
    are eligible anyway, never having been tried since)."""
    live = [c for c in claims if c.phase == Phase.ALLOCATED]
    if not live:
        return
    for c in live:
        c.phase = Phase.PENDING
        c.reason, c.message = PREEMPTED, message
        c.allocation, c.cluster, c.node, c.allocated_at = None, "", "", None
        c.attempted_version = None
        c.lease_expires_at = None
        c.resource_version += 1
        c.updated_at = now
        # Its quota is given back with its devices: QuotaReserved=False (it was left True on a Pending claim).
        done = set_allocated_condition(c.conditions, False, PREEMPTED, message, now)
        if any(x.get("type") == conditions.QUOTA_RESERVED for x in done):
            done = set_condition(done, conditions.QUOTA_RESERVED, False, PREEMPTED, message, now)
        c.conditions = set_condition(done, PREEMPTED, True, PREEMPTED, message, now, phase=Phase.PENDING)
    bulk.update_rows(live, FIELDS)
    ev.record([ev.event(c, PREEMPTED, PREEMPTED, message) for c in live])
    free_devices([c.id for c in live], now)  # last, as a release does: it locks the fleet clock's row
    transaction.on_commit(dispatch.request_allocation)  # the requeued claims are pending again
    ids = [c.id for c in live]
    transaction.on_commit(lambda: notify.publish(ids))
