"""The gang worker's periodic sweep: timeouts, placed gangs that lost members, holds that went missing.

* A pending gang past its ``deadline`` (created + ``scheduleTimeoutSeconds``) fails with ``ScheduleTimeout``
  and everything is released (its claims too: the gang will never start).
* A placed gang whose members were all requeued by preemption goes back to Pending (``preempted``).
* A placed gang whose members lost their claims (released, lease expired, deleted through the claims API)
  below ``minMember`` fails with ``MinMemberLost`` and releases what the others still hold: a gang below
  its minimum is of no use to anyone, and holding its devices would be a partial hold. Above the minimum
  it only counts the members that are left.

Each gang is its own transaction; rows another transaction holds are skipped and seen on the next sweep.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import events as ev
from gangs.services import hold, preempted
from gangs.services.gangs import fail_timeout, finish_locked, member_claims

BATCH = 100


def sweep() -> dict[str, int]:
    return {"held_again": hold.reapply(), "timed_out": expire_timeouts(), "requeued": preempted.requeue_preempted(),
            "checked": check_placed()}


def expire_timeouts(limit: int = BATCH) -> int:
    now = timezone.now()
    ids = list(Gang.objects.filter(phase=GangPhase.PENDING, deadline__lte=now).order_by("deadline")
               .values_list("id", flat=True)[:limit])
    done = 0
    for gang_id in ids:
        with transaction.atomic():
            gang = (Gang.objects.select_for_update(skip_locked=True, of=("self",)).select_related("namespace")
                    .filter(pk=gang_id, phase=GangPhase.PENDING, deadline__lte=now).first())
            if gang is None:
                continue
            mcs, _ = member_claims(gang, lock=True)
            fail_timeout(gang, mcs, now)
            done += 1
    return done


def check_placed(limit: int = BATCH) -> int:
    """Placed gangs with a placed member whose claims are no longer all allocated (or whose consumer is gone)."""
    through = "reservations__consumer__gang_member"
    suspects = set(ResourceClaim.objects.filter(**{f"{through}__phase": MemberPhase.PLACED,
                                                    f"{through}__gang__phase": GangPhase.PLACED})
                   .exclude(phase=Phase.ALLOCATED).values_list(f"{through}__gang_id", flat=True)[:limit])
    suspects |= set(GangMember.objects.filter(gang__phase=GangPhase.PLACED, phase=MemberPhase.PLACED,
                                              consumer__isnull=True).values_list("gang_id", flat=True)[:limit])
    changed = 0
    for gang_id in sorted(suspects):
        with transaction.atomic():
            gang = (Gang.objects.select_for_update(skip_locked=True, of=("self",)).select_related("namespace")
                    .filter(pk=gang_id, phase=GangPhase.PLACED).first())
            if gang is None:
                continue
            mcs, _ = member_claims(gang, lock=True)
            now = timezone.now()
            # A member requeued by preemption is not lost: its gang goes back to Pending whole once the others
            # are requeued too (``preempted``).
            lost = [mc for mc in mcs if mc.member.phase == MemberPhase.PLACED and mc.state != "placed"
                    and not preempted.requeued(mc)]
            for mc in lost:
                mc.member.phase = MemberPhase.LOST
                mc.member.save(update_fields=["phase"])
            ev.record([ev.event(gang, ev.MEMBER_LOST, "MemberLost", f"member {mc.member.name} lost its claims")
                       for mc in lost])
            placed = sum(1 for mc in mcs if mc.state == "placed" or preempted.requeued(mc))
            if placed < gang.min_member:
                finish_locked(gang, mcs, GangPhase.FAILED, "MinMemberLost",
                              f"only {placed} members still hold their claims; minMember is {gang.min_member}", now)
            elif lost:
                gang.placed_count = placed
                gang.resource_version += 1
                gang.save(update_fields=["placed_count", "resource_version", "updated_at"])
            changed += bool(lost)
    return changed
