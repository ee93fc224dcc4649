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

from claims.models import ResourceClaim
from claims.services import external

GANG_ANNOTATION = "gangs.draservice.io/gang"
GANG_LABEL = "gangs.draservice.io/gang"  # on the members' consumers
WAITING = "WaitingForGang"


def register() -> None:
    external.register_external_allocator(GANG_ANNOTATION)


def hold(claims: list[ResourceClaim], gang_name: str, message: str, now) -> None:
    """Mark locked member claims as ``gang_name``'s (saved by the claims app)."""
    external.mark(claims, GANG_ANNOTATION, gang_name, WAITING, message, now)


def reapply(claims: list[ResourceClaim] | None = None, gang_name: str | None = None) -> int:
    """Put the annotation back on pending member claims that lost it: ``claims`` (locked by the caller, of
    ``gang_name``), or every gang's (each claim locked there, skipping rows someone else holds)."""
    if claims is not None:
        return external.remark(claims, GANG_ANNOTATION, gang_name or "")
    return external.remark_pending(GANG_ANNOTATION, lambda qs: list(
        qs.filter(reservations__consumer__gang_member__isnull=False)
        .values_list("id", "reservations__consumer__gang_member__gang__name")[:500]))
