"""The end of a walltime: an allocated claim whose lease (``draservice.io/lease-ttl``) ran out is released as a
preemption victim is -- notice, then forced -- not pulled from under its pods.

At its walltime's end the claim becomes ``Releasing`` (reason ``LeaseExpired``): it keeps its devices, its
holder is told (an event and the claim's change notification), and its deadline (``lease_expires_at``) moves
to now + its queue's ``preemption.forceAfterSeconds`` (by default its ``graceSeconds``; asked of the queues
through ``register_force_after``: claims cannot import them). It is released once its holder confirms that
nothing uses the devices (``claims.services.preemption.confirm``) or releases it, or at that deadline by the
lease sweep (reason ``LeaseExpired``). A claim nothing can be using -- no consumer reserves it and no live
agent serves its cluster to say whether pods do -- is released at once, as a victim nobody can be asked about
is confirmed at its ``stopBy``; so is one whose queue gives no time (``forceAfterSeconds`` 0).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction

from claims.models import Phase, Reservation, ResourceClaim
from claims.services import bulk
from claims.services import events as ev
from claims.services.conditions import RELEASING, is_true, set_condition
from draservice import notify
from inventory.models import Cluster

LEASE_EXPIRED = "LeaseExpired"
# An agent's report counts only from an agent that is alive: its cluster's heartbeat at most this old.
AGENT_FRESH = timedelta(seconds=30)
DEFAULT_FORCE_AFTER = 30.0  # a queue's graceSeconds default: what a claim of no known queue is given

# claims -> {claim id: forceAfterSeconds of its queue}; registered by the scheduler (``SchedulerConfig.ready``).
_force_after: Callable[[list[ResourceClaim]], dict[int, float]] | None = None


def register_force_after(hook: Callable[[list[ResourceClaim]], dict[int, float]]) -> None:
    global _force_after
    _force_after = hook


def ended(claim: ResourceClaim) -> bool:
    """Is ``claim`` releasing because its walltime ended (not a preemption, not a release asked for)?"""
    return any(c.get("type") == RELEASING and c.get("status") == "True" and c.get("reason") == LEASE_EXPIRED
               for c in claim.conditions or [])


def unwatched(claims: list[ResourceClaim], now) -> list[ResourceClaim]:
    """Of ``claims``, those nothing can be using: no consumer reserves them in the service, and no agent (a
    heartbeat in the last ``AGENT_FRESH``) serves their cluster to say whether pods do."""
    reserved = set(Reservation.objects.filter(claim_id__in=[c.id for c in claims]).values_list("claim_id", flat=True))
    served = set(Cluster.objects.filter(name__in={c.cluster for c in claims},
                                        last_heartbeat_at__gte=now - AGENT_FRESH).values_list("name", flat=True))
    return [c for c in claims if c.id not in reserved and c.cluster not in served]


def notice(lapsed: list[ResourceClaim], now: datetime) -> list[ResourceClaim]:
    """Locked, allocated ``lapsed`` claims (walltime over, not releasing yet) given their notice: marked
    ``Releasing`` until now + their queue's ``forceAfterSeconds``. Returns those to release now instead."""
    if not lapsed:
        return []
    force = _force_after(lapsed) if _force_after is not None else {}
    at_once = {c.id for c in unwatched(lapsed, now)}
    at_once |= {c.id for c in lapsed if force.get(c.id, DEFAULT_FORCE_AFTER) <= 0}
    marked = [c for c in lapsed if c.id not in at_once]
    for c in marked:
        c.lease_expires_at = now + timedelta(seconds=force.get(c.id, DEFAULT_FORCE_AFTER))
        message = (f"its walltime ended: stop using its devices; they are released at "
                   f"{c.lease_expires_at:%Y-%m-%dT%H:%M:%SZ} at the latest, earlier once that is confirmed")
        c.conditions = set_condition(c.conditions, RELEASING, True, LEASE_EXPIRED, message, now)
        c.resource_version += 1
        c.updated_at = now
    if marked:
        bulk.update_rows(marked, ["conditions", "lease_expires_at", "resource_version", "updated_at"])
        ev.record([ev.event(c, ev.RELEASING, LEASE_EXPIRED, _message(c),
                            {"deadline": f"{c.lease_expires_at:%Y-%m-%dT%H:%M:%SZ}"}) for c in marked])
        ids = [c.id for c in marked]
        transaction.on_commit(lambda: notify.publish(ids))
    return [c for c in lapsed if c.id in at_once]


def _message(claim: ResourceClaim) -> str:
    return next(c.get("message", "") for c in claim.conditions if c.get("type") == RELEASING)


def forced(claims: list[ResourceClaim]) -> tuple[list[ResourceClaim], list[ResourceClaim]]:
    """``claims`` releasing and past their deadline, split: (walltime ended, released for another reason)."""
    mine = [c for c in claims if c.phase == Phase.ALLOCATED and is_true(c.conditions, RELEASING) and ended(c)]
    return mine, [c for c in claims if c not in mine]
