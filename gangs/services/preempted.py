"""A preempted gang goes back to Pending whole, at its original place.

The scheduler preempts a placed gang as one unit: every allocated member claim gets its notice together, and
each is requeued (Pending, reason ``Preempted``) once it stopped or at its ``forceAt``. Until the last one is
requeued the gang stays Placed (the members still under notice keep their devices: that is the notice), and
the lifecycle sweep does not count a requeued member as lost. Then the gang is Pending again: its members
Pending, nothing held, eligible for the gang worker at once. It keeps its ``created_at`` and id (its place:
the gang worker and the gang preemption take the oldest first), and its schedule timeout starts again.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from gangs import dispatch
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import events as ev
from gangs.services.gangs import MemberClaims, member_claims, set_gang_condition

PREEMPTED = "Preempted"  # the claims app's reason on a requeued victim, and the gang's once it is requeued
BATCH = 100


def requeued(mc: MemberClaims) -> bool:
    """The member's claims were requeued by preemption: all Pending, at least one for that reason."""
    return bool(mc.claims) and all(c.phase == Phase.PENDING for c in mc.claims) and any(
        c.reason == PREEMPTED for c in mc.claims)


def requeue_preempted(limit: int = BATCH) -> int:
    """Placed gangs whose members' claims were all requeued by preemption go back to Pending; returns how many.
    Each gang is its own transaction (the gang row first, then its claims); rows others hold are skipped."""
    through = "reservations__consumer__gang_member"
    ids = sorted(set(ResourceClaim.objects.filter(phase=Phase.PENDING, reason=PREEMPTED, **{
        f"{through}__phase": MemberPhase.PLACED, f"{through}__gang__phase": GangPhase.PLACED})
        .values_list(f"{through}__gang_id", flat=True)[:limit]))
    done = 0
    for gang_id in ids:
        with transaction.atomic():
            gang = (Gang.objects.select_for_update(skip_locked=True, of=("self",)).select_related("namespace")
                    .filter(pk=gang_id, phase=GangPhase.PLACED).first())
            if gang is None:
                continue
            mcs, _ = member_claims(gang, lock=True)
            placed = [mc for mc in mcs if mc.member.phase == MemberPhase.PLACED]
            if not any(requeued(mc) for mc in placed) or any(mc.state == "placed" for mc in placed):
                continue  # members still under notice keep their devices until they are requeued too
            _back_to_pending(gang, mcs, timezone.now())
            done += 1
    return done


def _back_to_pending(gang: Gang, mcs: list[MemberClaims], now) -> None:
    pending = [mc for mc in mcs if mc.state == "pending"]
    for mc in pending:
        mc.member.phase, mc.member.cluster, mc.member.node, mc.member.labels = MemberPhase.PENDING, "", "", {}
        mc.member.placed_at = None
    GangMember.objects.bulk_update([mc.member for mc in pending], ["phase", "cluster", "node", "labels",
                                                                   "placed_at"])
    message = "preempted: every member stopped and gave its devices to a claim with a better right to them; " \
              "waiting at its original place in its queue"
    gang.phase, gang.reason, gang.message = GangPhase.PENDING, PREEMPTED, message
    gang.placed_count, gang.waiting_count = 0, len(pending)
    gang.cluster, gang.domain, gang.preferred_domains = "", {}, []
    gang.placed_at, gang.attempted_version, gang.taken_until = None, None, None
    gang.hold_queue, gang.held_nodes, gang.hold_need = "", [], {}
    if gang.schedule_timeout_seconds:
        gang.deadline = now + timedelta(seconds=gang.schedule_timeout_seconds)
    gang.resource_version += 1
    set_gang_condition(gang, False, PREEMPTED, message, now)
    gang.save()
    ev.record([ev.event(gang, ev.PREEMPTED, PREEMPTED, message, {"members": [mc.member.name for mc in pending]})])
    gang_id = gang.id
    transaction.on_commit(lambda: dispatch.request_placement(gang_id))
