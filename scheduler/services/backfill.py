"""Conservative backfill (Slurm's): a claim may take devices on a node held for a queue's head, or devices the
plan gives another claim on any node, when it ends before any planned claim needs them.

A placement that the round's queue-head screen (``queue_holds``) would undo stays when every claim of the
group has a walltime (``draservice.io/lease-ttl``), the holding queue's claims are in the plan
(``scheduler.services.plan``: else nothing says when the head starts, and the hold stands), and for every
planned claim (of any queue) whose planned devices it takes, its walltime end -- allocation now plus its lease
-- plus the lease sweep's period and a round's latency is no later than that claim's planned start. A claim
with no walltime never backfills into a hold: it might never end.

Off the held nodes the same rule keeps the plan's devices (``keeps``): a placement that takes a device planned
for another claim stays only when it ends before that claim's planned start, except a planned claim whose start
has come taking its planned node's share (the devices of one node stand in for each other). The engine tries
the nodes with planned devices last (``planned_nodes``), so a claim is sent elsewhere before it is refused.

The placement is marked (its diagnostics' ``backfill``: the planned start it must end before, and the claim
it protects), and ``claims.services.claims.renew_lease`` refuses (409) a renewal that would run past it.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime

from django.utils import timezone

from claims.models import Phase
from dra.engine.timeline import may_backfill
from draservice.prepared import PreparedValues
from scheduler.models import PlannedStart
from scheduler.services import plan

ISO = "%Y-%m-%dT%H:%M:%SZ"
# What still waits of the plan (a planned claim allocated or released since the pass promises nothing), read by
# every round that places something: compiled once.
_PROMISES = PreparedValues(lambda: PlannedStart.objects.exclude(start_at=None).filter(claim__phase=Phase.PENDING)
                           .values_list("claim_id", "claim__namespace__name", "claim__name", "queue", "start_at",
                                        "devices"))


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
        self.own: dict[int, tuple[datetime, tuple[str, str], int]] = {}  # claim -> (start, its node, devices)
        self.nodes: dict[tuple[str, str], set[int]] = defaultdict(set)  # node -> claims planned there

    def _load(self) -> None:
        self.loaded = True
        for claim_id, ns, name, queue, start, devices in _PROMISES.rows():
            if start is None:
                continue  # excluded above; for the type checker
            promise = _Promise(claim_id, f"{ns}/{name}", queue, start)
            for d in devices or []:
                self.by_device[tuple(d)].append(promise)
                self.nodes[(d[0], d[2])].add(claim_id)
            if devices:
                self.own[claim_id] = (start, (devices[0][0], devices[0][2]), len(devices))
            if queue not in self.first_of or start < self.first_of[queue].start:
                self.first_of[queue] = promise

    def planned_nodes(self, group) -> frozenset[tuple[str, str]]:
        """Nodes with devices planned for claims other than ``group``'s (for the engine to try last), but the
        group's own planned node once its planned start has come: its devices are there."""
        if not self.loaded:
            self._load()
        mine = {c.id for c in group.claims}
        due = {self.own[c][1] for c in mine if c in self.own and self.own[c][0] <= timezone.now()}
        return frozenset(n for n, ids in self.nodes.items() if ids - mine and n not in due)

    def keeps(self, group, outcome, yields=None):
        """Planned devices off the held nodes: ``outcome`` as it is when it takes no device planned for another
        claim, or its own planned node's share once its planned start has come (it takes the place it was
        planned); marked as a backfill when it ends before the planned starts of those it takes; else None (it
        would delay them). ``yields(queue)``: whether that queue's planned claims give way to this group, as a
        borrowing queue's head gives way to a within-nominal claim (``queue_holds``): a preemptor's freed
        devices were planned for its requeued victims, at the head of their queue, and it could never take
        them."""
        if not outcome.allocated or not outcome.devices:
            return outcome
        if not self.loaded:
            self._load()
        mine = {c.id for c in group.claims}
        now = timezone.now()
        if any(c in self.own and self.own[c][0] <= now and self.own[c][1] == (outcome.cluster, outcome.node)
               and self.own[c][2] >= len(outcome.devices) for c in mine):
            return outcome
        taken = self._taken(mine, outcome)
        if not taken or (yields is not None and all(yields(q) for q in {p.queue for p in taken})):
            return outcome
        return self._mark(group, outcome, None)

    def allows(self, group, outcome, holder: str):
        """``outcome`` marked as a backfill when it may stay on ``holder``'s held node, else None."""
        if not self.loaded:
            self._load()
        if holder not in self.first_of:
            return None
        return self._mark(group, outcome, holder)

    def _taken(self, mine: set[int], outcome) -> list[_Promise]:
        return [p for d in outcome.devices for p in self.by_device.get((d.cluster, d.driver, d.pool, d.device), ())
                if p.claim_id not in mine]

    def _mark(self, group, outcome, holder: str | None):
        leases = [c.lease_seconds for c in group.claims]
        if not leases or not all(leases):
            return None
        pad = plan.margin()
        taken = self._taken({c.id for c in group.claims}, outcome)
        if not may_backfill(leases, timezone.now().timestamp(), pad.total_seconds(),
                            [p.start.timestamp() for p in taken]):
            return None
        protects = min(taken, key=lambda p: p.start) if taken or holder is None else self.first_of[holder]
        mark = {"plannedStart": protects.start.strftime(ISO), "protects": protects.name,
                "endBefore": (protects.start - pad).strftime(ISO)}
        return dataclasses.replace(outcome, diagnostics={**(outcome.diagnostics or {}), "backfill": mark})
