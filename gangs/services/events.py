"""The per-gang audit trail: every decision about a gang is one ``GangEvent`` row."""
from __future__ import annotations

from gangs.models import Gang, GangEvent

CREATED = "Created"
ATTEMPT = "PlacementAttempt"
PLACED = "Placed"
MEMBERS_ADDED = "MembersAdded"
MEMBER_LOST = "MemberLost"
PREEMPTED = "Preempted"  # every member requeued by preemption: Pending again
FAILED = "Failed"
RELEASED = "Released"
DELETED = "Deleted"


def event(gang: Gang, type_: str, reason: str = "", message: str = "", data=None) -> GangEvent:
    """An unsaved event (load the gang with its namespace); callers record them in their transaction."""
    return GangEvent(gang=gang, namespace=gang.namespace.name, gang_name=gang.name, gang_uid=gang.uid, type=type_,
                     reason=reason, message=(message or "")[:4000], data=data)


def record(events: list[GangEvent]) -> None:
    if events:
        GangEvent.objects.bulk_create(events)
