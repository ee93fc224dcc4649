"""Keeping gang member claims away from the claims app's per-claim allocation round.

The round (``claims.services.allocation.eligible_pending``) takes Pending claims whose ``attempted_version``
is null or below ``FleetState.version``. It has no hook to skip claims that belong to a gang, and placing a
member's claims one by one would break all-or-nothing. So member claims carry ``attempted_version = HOLD``:
``FleetState.version`` grows by one per release or inventory change and never gets near 2**62, so the round
never takes them. They also carry the annotation ``gangs.draservice.io/gang`` naming their gang: the marker
that a proper hook in the round should filter on (see the report of issue 8).

Known holes until the round has that hook: ``update_claim`` (a PUT/PATCH of a member claim's labels or
annotations) resets ``attempted_version`` to None, and a consumer outside the gang that reserves a member
claim by name links it into that consumer's group. Either can let the round allocate a member claim on its
own. The gang worker re-applies the hold before every attempt (``reapply``) and on its periodic sweep, and
treats a member claim allocated outside the gang as a lost member (its devices are released).
"""
from __future__ import annotations

from claims.models import Phase, ResourceClaim
from claims.services.conditions import set_allocated_condition

HOLD = 1 << 62
GANG_ANNOTATION = "gangs.draservice.io/gang"
GANG_LABEL = "gangs.draservice.io/gang"  # on the members' consumers
WAITING = "WaitingForGang"


def hold(claim: ResourceClaim, gang_name: str, message: str, now) -> None:
    """Mark an unsaved or locked claim as a member claim of ``gang_name`` (the caller saves it)."""
    claim.attempted_version = HOLD
    claim.annotations = {**(claim.annotations or {}), GANG_ANNOTATION: gang_name}
    set_waiting(claim, WAITING, message, now)


def set_waiting(claim: ResourceClaim, reason: str, message: str, now) -> None:
    claim.reason, claim.message = reason, message
    claim.conditions = set_allocated_condition(claim.conditions, False, reason, message, now)
    claim.resource_version += 1
    claim.updated_at = now


def reapply(claim_ids=None) -> int:
    """Put the hold back on pending member claims that lost it; all gangs' when ``claim_ids`` is None."""
    qs = ResourceClaim.objects.filter(phase=Phase.PENDING)
    if claim_ids is not None:
        qs = qs.filter(id__in=list(claim_ids))
    else:
        qs = qs.filter(reservations__consumer__gang_member__isnull=False)
    return qs.exclude(attempted_version=HOLD).update(attempted_version=HOLD)
