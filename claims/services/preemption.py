"""Claim state changes of preemption with notice (the claims app writes claim rows; the scheduler decides).

The safe-release flow: a victim is first *marked* (condition ``Preempted``, reason ``PreemptionPending``, and
``Releasing``, as ``claims.begin_release`` marks a claim to be released later; it keeps its devices and its
holder is told to stop by ``stopBy``), and *requeued* once it has stopped (``confirm``: its cluster's agent saw
its ``reservedFor`` empty, or the agent, an admin or its own namespace said so) or at ``forceAt`` at the latest
(``scheduler.services.preemption.sweep``): its devices are freed and it goes back to ``Pending`` with reason
``Preempted``, not ``Released``. It keeps its ``created_at``, so it is back at its original place in its queue.
``claim.preemption`` holds ``{stopBy, forceAt, confirmedAt, confirmedBy}`` (``status.preemption``).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from claims import dispatch
from claims.models import Phase, ResourceClaim
from claims.services import bulk, conditions, wake, walltime
from claims.services import events as ev
from claims.services.claims import _LOCKED_BY_NAME, _release_locked, free_devices
from claims.services.conditions import RELEASING, is_true, set_allocated_condition, set_condition
from draservice import notify
from draservice.errors import Conflict
from draservice.models import APIToken
from inventory.models import Cluster

PREEMPTED = conditions.PREEMPTED
PREEMPTION_PENDING = conditions.PREEMPTION_PENDING
FIELDS = ["phase", "reason", "message", "conditions", "allocation", "cluster", "node", "attempted_version",
          "lease_expires_at", "resource_version", "updated_at", "allocated_at", "preemption"]
RELEASE_CONFIRMED = "ReleaseConfirmed"
# An agent's report counts only from an agent that is alive: its cluster's heartbeat at most this old.
AGENT_FRESH = walltime.AGENT_FRESH
NO_CONSUMER = "NoConsumer"  # confirmedBy when nothing could be using the devices (``nobody_to_ask``)
PREEMPTION_CANCELLED = conditions.PREEMPTION_CANCELLED
# Just before a victim's devices move, the scheduler (above this app) checks that its preemptor still needs
# them: ``still_needed(victims, now)`` returns those it does, having cancelled the others' notices in the same
# transaction. Registered in ``SchedulerConfig.ready``; none: every victim is still needed.
_still_needed: Callable[..., list[ResourceClaim]] | None = None


def register_recheck(hook: Callable[..., list[ResourceClaim]]) -> None:
    global _still_needed
    _still_needed = hook


def still_needed(victims: list[ResourceClaim], now, *, in_worker: bool = False) -> list[ResourceClaim]:
    """Of locked ``victims`` about to give their devices up, those their preemptors still need (the others'
    notices cancelled). ``in_worker``: the caller is an allocation worker (its cached engine may be used)."""
    return _still_needed(victims, now, in_worker=in_worker) if _still_needed is not None else victims


def iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"  # milliseconds: a 2-second handover is visible


def locked(ids: list[int]) -> list[ResourceClaim]:
    return list(ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                .filter(id__in=sorted(ids)).order_by("id"))


def mark(claims: list[ResourceClaim], message: str, data: dict, now, *, stop_by: datetime, force_at: datetime,
         preemptor_id: int | None) -> None:
    """Locked, allocated ``claims`` are told they will be preempted (they keep their devices until then): they
    are ``Releasing`` (a lease cannot be renewed, nor run out: its expiry would free devices pods may still
    use), to stop by ``stop_by``, requeued once confirmed or at ``force_at``."""
    for c in claims:
        c.conditions = set_condition(c.conditions, PREEMPTED, True, PREEMPTION_PENDING, message, now)
        c.conditions = set_condition(c.conditions, RELEASING, True, PREEMPTION_PENDING, message, now)
        c.preemption = {"stopBy": iso(stop_by), "forceAt": iso(force_at), "confirmedAt": None, "confirmedBy": None,
                        "noticeAt": iso(now), "preemptor": preemptor_id}
        c.lease_expires_at = None
        c.resource_version += 1
        c.updated_at = now
    bulk.update_rows(claims, ["conditions", "preemption", "lease_expires_at", "resource_version", "updated_at"])
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
        if is_true(c.conditions, RELEASING):
            c.conditions = set_condition(c.conditions, RELEASING, False, PREEMPTED, message, now)
    bulk.update_rows(live, FIELDS)
    ev.record([ev.event(c, PREEMPTED, PREEMPTED, message) for c in live])
    free_devices([c.id for c in live], now)
    transaction.on_commit(dispatch.request_allocation)  # the requeued claims are pending again
    ids = [c.id for c in live]
    transaction.on_commit(lambda: notify.publish(ids))


def confirm(namespace: str, name: str, check: Callable[[ResourceClaim], None], by: str,
            reserved_for: list | None = None) -> ResourceClaim | None:
    """The claim ``namespace``/``name`` has stopped using its devices (None: there is no such claim):
    ``check(claim)`` (the caller's permission check) may refuse by raising. A preemption victim is requeued now
    and its preemptor woken (the devices are its within a claims round); a claim released later for another
    reason (``begin_release``) is released now. ``reserved_for``: what the claim's cluster agent saw in the
    cluster's ``reservedFor`` (a report, not a say-so): not empty, nothing happens. Confirming a victim already
    requeued is a no-op (retries are safe); a claim that is not being released is a 409."""
    with transaction.atomic():
        claim = _LOCKED_BY_NAME.first(namespace, name)
        if claim is None:
            return None
        check(claim)
        info = claim.preemption or {}
        if claim.phase != Phase.ALLOCATED or not is_true(claim.conditions, RELEASING):
            if info and claim.phase == Phase.PENDING:
                return claim  # requeued already (confirmed, or forced at forceAt)
            raise Conflict(f"the claim is {claim.phase} and not being released (no Releasing condition): "
                           "there is nothing to confirm")
        if reserved_for:
            return claim  # pods still use it: the report is kept for nothing; the next one may confirm
        now = timezone.now()
        if not info:
            _release_locked([claim], RELEASE_CONFIRMED, f"release confirmed by {by}", now)
            return claim
        confirm_locked([claim], by, now)
    return claim


def confirm_locked(claims: list[ResourceClaim], by: str, now, *, recheck: bool = True) -> None:
    """Locked victims (Allocated, Releasing, ``preemption`` set) confirmed by ``by``: requeued, preemptors woken
    -- those whose preemptor still needs them (``recheck``, unless the caller has just checked): the others'
    notices are cancelled and they keep their devices."""
    if recheck:
        claims = still_needed(claims, now)
    for claim in claims:
        claim.preemption = {**(claim.preemption or {}), "confirmedAt": iso(now), "confirmedBy": by}
    ev.record([ev.event(c, RELEASE_CONFIRMED, RELEASE_CONFIRMED, f"stopped, confirmed by {by}",
                        {"confirmedBy": by}) for c in claims])
    requeue(claims, f"preempted: it stopped (confirmed by {by}) and its devices went to a claim with a better "
                    "right to them; waiting at its original place in its queue", now)
    wake.wake_claims({c.preemption["preemptor"] for c in claims if c.preemption and c.preemption.get("preemptor")})


def unmark(claims: list[ResourceClaim], message: str, now) -> None:
    """Locked victims whose notice is cancelled (their preemptor no longer needs their devices): they keep their
    devices, ``Preempted=False`` (reason ``PreemptionCancelled``), no longer ``Releasing``, and a lease they had
    starts afresh (marking had stopped it)."""
    live = [c for c in claims if c.phase == Phase.ALLOCATED and c.preemption]
    for c in live:
        c.conditions = set_condition(c.conditions, PREEMPTED, False, PREEMPTION_CANCELLED, message, now,
                                     phase=Phase.ALLOCATED)
        c.conditions = [x for x in c.conditions if x.get("type") != RELEASING]
        c.preemption = None
        c.lease_expires_at = now + timedelta(seconds=c.lease_seconds) if c.lease_seconds else None
        c.resource_version += 1
        c.updated_at = now
    if not live:
        return
    bulk.update_rows(live, ["conditions", "preemption", "lease_expires_at", "resource_version", "updated_at"])
    ev.record([ev.event(c, PREEMPTED, PREEMPTION_CANCELLED, message) for c in live])
    ids = [c.id for c in live]
    transaction.on_commit(lambda: notify.publish(ids))


def nobody_to_ask(claims: list[ResourceClaim], now) -> list[ResourceClaim]:
    """Of ``claims`` (victims), those that nothing can be using, which are confirmed at ``stopBy``: no consumer
    reserves them in the service, and no agent (a heartbeat in the last ``AGENT_FRESH``) serves their cluster to
    say whether pods do."""
    return walltime.unwatched(claims, now)


def agent_alive(cluster: str, now=None) -> bool:
    now = now or timezone.now()
    return Cluster.objects.filter(name=cluster, last_heartbeat_at__gte=now - AGENT_FRESH).exists()


def confirmer(access, namespace: str) -> str:
    """Who confirms (``access``: the caller's ``draservice.permissions.Access``), as ``confirmedBy`` names it."""
    if access.kind == APIToken.CLUSTER:
        return f"agent:{access.cluster_name}"
    if access.kind == APIToken.NAMESPACE:
        return f"namespace:{namespace}"
    token = getattr(access, "token", None)
    return f"admin:{token.name}" if token is not None else "admin"
