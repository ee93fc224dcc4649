"""Conservative backfill (Slurm's): a claim may take devices on a node held for a queue's head when it ends
before any planned claim needs them.

A placement that the round's queue-head screen (``queue_holds``) would undo stays when every claim of the
group has a walltime (``draservice.io/lease-ttl``), the holding queue's claims are in the plan
(``scheduler.services.plan``: else nothing says when the head starts, and the hold stands), and for every
planned claim (of any queue) whose planned devices it takes, its walltime end -- allocation now plus its lease
-- plus the lease sweep's period and a round's latency is no later than that claim's planned start. A claim
with no walltime never backfills into a hold: it might never end.

The placement is marked (its diagnostics' ``backfill``: the planned start it must end before, and the claim
it protects), and ``claims.services.claims.renew_lease`` refuses (409) a renewal that would run past it.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime

from django.utils import timezone

from dra.engine.timeline import may_backfill
from scheduler.models import PlannedStart
from scheduler.services import plan

ISO = "%Y-%m-%dT%H:%M:%SZ"


@dataclasses.dataclass
class _Promise:
    claim_id: int
    name: str  # namespace/name
    queue: str
    start: datetime


class Backfill:
    """The plan as a round's screen reads it: loaded on the first placement it is asked about."""

    def __init__(self) -> None:
        self.loaded = False
        self.by_device: dict[tuple, list[_Promise]] = defaultdict(list)
        self.first_of: dict[str, _Promise] = {}  # queue -> its earliest planned claim

    def _load(self) -> None:
        self.loaded = True
        rows = (PlannedStart.objects.exclude(start_at=None)
                .values_list("claim_id", "claim__namespace__name", "claim__name", "queue", "start_at", "devices"))
        for claim_id, ns, name, queue, start, devices in rows:
            if start is None:
                continue  # excluded above; for the type checker
            promise = _Promise(claim_id, f"{ns}/{name}", queue, start)
            for d in devices or []:
                self.by_device[tuple(d)].append(promise)
            if queue not in self.first_of or start < self.first_of[queue].start:
                self.first_of[queue] = promise

    def allows(self, group, outcome, holder: str):
        """``outcome`` marked as a backfill when it may stay on ``holder``'s held node, else None."""
        leases = [c.lease_seconds for c in group.claims]
        if not leases or not all(leases):
            return None
        if not self.loaded:
            self._load()
        if holder not in self.first_of:
            return None
        pad = plan.margin()
        mine = {c.id for c in group.claims}
        taken = [p for d in outcome.devices for p in self.by_device.get((d.cluster, d.driver, d.pool, d.device), ())
                 if p.claim_id not in mine]
        if not may_backfill(leases, timezone.now().timestamp(), pad.total_seconds(),
                            [p.start.timestamp() for p in taken]):
            return None
        protects = min(taken, key=lambda p: p.start) if taken else self.first_of[holder]
        mark = {"plannedStart": protects.start.strftime(ISO), "protects": protects.name,
                "endBefore": (protects.start - pad).strftime(ISO)}
        return dataclasses.replace(outcome, diagnostics={**(outcome.diagnostics or {}), "backfill": mark})
