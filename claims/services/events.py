"""The per-claim audit trail: every decision about a claim is one ``ClaimEvent`` row."""
from __future__ import annotations

from claims.models import ClaimEvent, ResourceClaim

CREATED = "Created"
ATTEMPT = "AllocationAttempt"
ALLOCATED = "Allocated"
RELEASED = "Released"
LEASE_EXPIRED = "LeaseExpired"
LEASE_RENEWED = "LeaseRenewed"
FAILED = "Failed"
DELETED = "Deleted"
RESERVED = "Reserved"
UNRESERVED = "Unreserved"


def event(claim: ResourceClaim, type_: str, reason: str = "", message: str = "", data=None) -> ClaimEvent:
    """An unsaved event; callers bulk-create them in their own transaction (``record``).

    Load claims with ``select_related("namespace")`` so this does not query per claim.
    """
    return ClaimEvent(claim=claim, namespace=claim.namespace.name, claim_name=claim.name, claim_uid=claim.uid,
                      type=type_, reason=reason, message=(message or "")[:4000], data=data)


def record(events: list[ClaimEvent]) -> None:
    from claims.services import bulk

    bulk.insert_rows(events)
