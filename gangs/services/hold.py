"""Keeping gang member claims away from the claims app's per-claim allocation round.

Placing a member's claims one by one would break all-or-nothing. The claims app has a hook for this
(``claims.services.external.register_external_allocator``): claims carrying a registered annotation are
never taken by the round, and a group that contains one (a consumer outside the gang reserving a gang claim
by name) is blocked. ``GangsConfig.ready`` registers ``gangs.draservice.io/gang``; member claims get it,
with their gang's name, in the transaction that creates them, before anyone can see them.

The one way left around it: a PATCH/PUT of a member claim that removes the annotation (annotations are
mutable through the claims API), which also kicks the round at once. The sweep puts a removed annotation
back on pending member claims (``reapply``); if the round was faster, the gang worker finds the member
claim allocated outside the gang, releases it (a partial hold must not block anyone) and counts the member
as lost.
"""
from __future__ import annotations

from claims.models import Phase, ResourceClaim
from claims.services import external
from claims.services.conditions import set_allocated_condition

GANG_ANNOTATION = "gangs.draservice.io/gang"
GANG_LABEL = "gangs.draservice.io/gang"  # on the members' consumers
WAITING = "WaitingForGang"


def register() -> None:
    external.register_external_allocator(GANG_ANNOTATION)


def hold(claim: ResourceClaim, gang_name: str, message: str, now) -> None:
    """Mark a locked (or unsaved) claim as a member claim of ``gang_name``; the caller saves it."""
    claim.annotations = {**(claim.annotations or {}), GANG_ANNOTATION: gang_name}
    set_waiting(claim, WAITING, message, now)


def set_waiting(claim: ResourceClaim, reason: str, message: str, now) -> None:
    claim.reason, claim.message = reason, message
    claim.conditions = set_allocated_condition(claim.conditions, False, reason, message, now)
    claim.resource_version += 1
    claim.updated_at = now


def reapply(claims: list[ResourceClaim] | None = None, gang_name: str | None = None) -> int:
    """Put the annotation back on pending member claims that lost it: ``claims`` (locked by the caller, of
    ``gang_name``), or every gang's (each claim locked here, skipping rows someone else holds)."""
    if claims is not None:
        missing = [c for c in claims if (c.annotations or {}).get(GANG_ANNOTATION) != gang_name]
        for c in missing:
            c.annotations = {**(c.annotations or {}), GANG_ANNOTATION: gang_name}
            c.resource_version += 1
        ResourceClaim.objects.bulk_update(missing, ["annotations", "resource_version"])
        return len(missing)
    from django.db import transaction

    rows = list(ResourceClaim.objects.filter(phase=Phase.PENDING, reservations__consumer__gang_member__isnull=False)
                .exclude(annotations__has_key=GANG_ANNOTATION)
                .values_list("id", "reservations__consumer__gang_member__gang__name")[:500])
    done = 0
    for claim_id, name in rows:
        with transaction.atomic():
            claim = (ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                     .filter(pk=claim_id, phase=Phase.PENDING).first())
            if claim is not None:
                done += reapply([claim], name)
    return done
