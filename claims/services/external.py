"""Claims that another allocator places (e.g. gangs: all or nothing over many consumers).

An app registers the annotation that marks its claims (in ``AppConfig.ready``). The claims round never takes
such claims, nor groups containing one, and the claims API does not let a user change the marker.
"""
from __future__ import annotations

from django.db import transaction

from claims.models import Phase, ResourceClaim
from claims.services.conditions import set_allocated_condition

EXTERNAL_ALLOCATOR_ANNOTATIONS: set[str] = set()


def register_external_allocator(annotation: str) -> None:
    EXTERNAL_ALLOCATOR_ANNOTATIONS.add(annotation)


def managed_elsewhere(claim: ResourceClaim) -> str | None:
    return next((a for a in EXTERNAL_ALLOCATOR_ANNOTATIONS if a in (claim.annotations or {})), None)


# The claims app is the one writer of claim rows: another allocator marks, re-marks and explains its claims
# through these functions (in its own transaction, on rows it has locked).

def mark(claims: list[ResourceClaim], annotation: str, value: str, reason: str, message: str, now) -> None:
    """Hand locked pending ``claims`` to another allocator: its marker annotation, and a waiting status."""
    for claim in claims:
        claim.annotations = {**(claim.annotations or {}), annotation: value}
        claim.reason, claim.message = reason, message
        claim.conditions = set_allocated_condition(claim.conditions, False, reason, message, now)
        claim.resource_version += 1
        claim.updated_at = now
    ResourceClaim.objects.bulk_update(claims, ["annotations", "reason", "message", "conditions", "resource_version",
                                               "updated_at"])


def remark(claims: list[ResourceClaim], annotation: str, value: str) -> int:
    """Put the marker back on locked ``claims`` that lost it; returns how many needed it."""
    missing = [c for c in claims if (c.annotations or {}).get(annotation) != value]
    for c in missing:
        c.annotations = {**(c.annotations or {}), annotation: value}
        c.resource_version += 1
    ResourceClaim.objects.bulk_update(missing, ["annotations", "resource_version"])
    return len(missing)


def remark_pending(annotation: str, value_of, limit: int = 500) -> int:
    """Re-mark pending claims that ``value_of`` (claim queryset -> [(claim id, marker value)]) says belong to
    another allocator but lost the marker; each row locked here, skipping rows someone else holds."""
    rows = value_of(ResourceClaim.objects.filter(phase=Phase.PENDING).exclude(annotations__has_key=annotation))
    done = 0
    for claim_id, value in rows[:limit]:
        with transaction.atomic():
            claim = (ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                     .filter(pk=claim_id, phase=Phase.PENDING).first())
            if claim is not None:
                done += remark([claim], annotation, value)
    return done
