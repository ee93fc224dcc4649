"""What a lease renewal may not do: run a backfilled claim past the planned start it made room before.

The scheduler lets a claim with a walltime take devices on a node held for a queue's head when it ends before
the plan starts the claim those devices are promised to (``scheduler.services.backfill``), and marks the
allocation's diagnostics with that bound (``backfill.endBefore``, ``plannedStart``, ``protects``). A renewal
that would move the lease's end past the bound is refused: the planned claim would start late.
"""
from __future__ import annotations

from datetime import datetime

from claims.models import Phase
from draservice.errors import Conflict


def check_backfill(claim) -> None:
    """Raise ``Conflict`` (409) when ``claim``'s new ``lease_expires_at`` runs past its backfill bound."""
    mark = (claim.diagnostics or {}).get("backfill") if claim.phase == Phase.ALLOCATED else None
    if not mark or claim.lease_expires_at is None:
        return
    until = datetime.fromisoformat(mark["endBefore"].replace("Z", "+00:00"))
    if claim.lease_expires_at > until:
        raise Conflict(f"the claim backfilled devices planned for {mark['protects']} from {mark['plannedStart']}: "
                       f"its lease may not run past {mark['endBefore']} (renewing would delay that start)")
