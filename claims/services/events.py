"""The per-claim audit trail: every decision about a claim is one ``ClaimEvent`` row."""
from __future__ import annotations

import uuid

from django.db.models import QuerySet

from claims.models import ClaimEvent, ResourceClaim
from draservice.errors import BadRequest

CREATED = "Created"
ATTEMPT = "AllocationAttempt"
ALLOCATED = "Allocated"
RELEASED = "Released"
LEASE_EXPIRED = "LeaseExpired"
LEASE_RENEWED = "LeaseRenewed"
FAILED = "Failed"
DELETED = "Deleted"
DEVICE_REMOVED = "DeviceRemoved"
RESERVED = "Reserved"
UNRESERVED = "Unreserved"
RELEASING = "Releasing"  # a release was asked for; the devices stay held until confirmed (or a deadline)


def event(claim: ResourceClaim, type_: str, reason: str = "", message: str = "", data=None) -> ClaimEvent:
    """An unsaved event; callers bulk-create them in their own transaction (``record``).

    Load claims with ``select_related("namespace")`` so this does not query per claim.
    """
    return ClaimEvent(claim=claim, namespace=claim.namespace.name, claim_name=claim.name, claim_uid=claim.uid,
                      type=type_, reason=reason, message=(message or "")[:4000], data=data)


def record(events: list[ClaimEvent]) -> None:
    from claims.services import bulk

    bulk.insert_rows(events)


def trail(namespace: str, name: str, uid: str | None = None) -> QuerySet | None:
    """The events of claim ``namespace/name``, also once it is deleted (events outlive their claim).

    ``uid`` picks one incarnation of the name (a claim deleted and created again is a new claim with a new
    uid). Without it: the existing claim's events, or, when there is none, those of the last claim of that
    name. None when no claim of that name ever had an event.
    """
    events = ClaimEvent.objects.filter(namespace=namespace, claim_name=name)
    wanted: uuid.UUID | None
    if uid is not None:
        try:
            wanted = uuid.UUID(uid)
        except ValueError:
            raise BadRequest([("uid", f"Invalid value: {uid!r}: must be a UUID")]) from None
    else:
        wanted = (ResourceClaim.objects.filter(namespace__name=namespace, name=name).values_list("uid", flat=True)
                  .first())
        if wanted is None:  # deleted: the newest event names the last claim of that name
            wanted = events.order_by("-id").values_list("claim_uid", flat=True).first()
    if wanted is None or not events.filter(claim_uid=wanted).exists():
        return None
    return events.filter(claim_uid=wanted)
