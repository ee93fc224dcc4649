"""A placed gang as ONE preemption candidate: all its allocated member claims go together, or none.

``preemption.candidates`` finds the charged claims of the queues it may reclaim from; the member claims of a
gang among them are folded here into one ``GangVictim`` carrying the gang's whole demand (the sum of its
members' charges, every member's devices). The greedy pass and the drop-in-reverse that make the victim set
inclusion-minimal (``preemption.confirm_with_engine``) then take or give back the gang as one unit: half a
gang freed would stop the whole gang and still not be the least that lets the preemptor in. ``expand`` turns
the units of a chosen set back into the claims that get a notice. A gang's ``minRuntimeSeconds`` runs from
its placement (``Gang.placed_at``), and a gang any of whose members is not a candidate (under notice already,
or charged to another queue) is none. Once every member claim has been requeued, ``gangs.services.preempted``
puts the gang back to Pending, whole, at its original place.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

from claims.models import Phase, ResourceClaim
from gangs.models import Gang, GangPhase
from gangs.services.hold import GANG_ANNOTATION

GANG_ID = "reservations__consumer__gang_member__gang_id"


@dataclass
class GangVictim:
    """A placed gang standing as one candidate. ``id`` is the gang's id negated: candidates are keyed by id in
    one dict with claim ids, which are positive."""

    gang: Gang
    claims: list[ResourceClaim] = field(default_factory=list)

    @property
    def id(self) -> int:
        return -self.gang.id

    @property
    def allocated_at(self):
        return self.gang.placed_at or min((c.allocated_at for c in self.claims if c.allocated_at), default=None)

    @property
    def created_at(self):
        return self.gang.created_at

    @property
    def labels(self) -> dict:
        return self.claims[0].labels

    @property
    def annotations(self) -> dict:
        return {}  # managed by the gang worker, but preemptible as a gang: nothing to skip it for

    @property
    def namespace(self):
        return self.claims[0].namespace

    @property
    def cluster(self) -> str:
        return self.claims[0].cluster

    @property
    def node(self) -> str:
        return self.claims[0].node

    def __str__(self) -> str:
        return f"gang {self.gang.namespace.name}/{self.gang.name}"


def fold(rows: list[ResourceClaim], held: dict) -> list:
    """``rows`` (allocated candidate claims) with each placed gang's member claims replaced by one
    ``GangVictim``; ``held`` (claim id -> (queue id, amount)) gets the units' entries (their members' summed)
    and loses the members'. A gang whose allocated members are not all among ``rows`` is left out whole."""
    members = [r for r in rows if GANG_ANNOTATION in (r.annotations or {})]
    if not members:
        return rows
    gang_of = dict(ResourceClaim.objects.filter(id__in=[r.id for r in members]).values_list("id", GANG_ID))
    by_gang: dict[int, list[ResourceClaim]] = defaultdict(list)
    for r in members:
        if gang_of.get(r.id) is not None:
            by_gang[gang_of[r.id]].append(r)
    gangs = {g.id: g for g in Gang.objects.filter(id__in=list(by_gang), phase=GangPhase.PLACED)
             .select_related("namespace")}
    allocated: dict[int, set[int]] = defaultdict(set)
    for claim_id, gang_id in (ResourceClaim.objects.filter(phase=Phase.ALLOCATED, **{f"{GANG_ID}__in": list(gangs)})
                              .values_list("id", GANG_ID)):
        allocated[gang_id].add(claim_id)
    out: list = [r for r in rows if GANG_ANNOTATION not in (r.annotations or {}) or gang_of.get(r.id) is None]
    for gang_id, claims in by_gang.items():
        charges = [held.pop(c.id) for c in claims if c.id in held]
        if gang_id not in gangs or allocated[gang_id] != {c.id for c in claims}:
            continue  # not placed, or a member under notice already or charged elsewhere: not a candidate
        if len(charges) != len(claims) or len({qid for qid, _ in charges}) != 1:
            continue  # one queue admits a gang whole; anything else is not a gang to weigh as one
        unit = GangVictim(gangs[gang_id], sorted(claims, key=lambda c: c.id))
        held[unit.id] = (charges[0][0], sum((a for _, a in charges), Fraction(0)))
        out.append(unit)
    return out


def expand(victims: list) -> list[ResourceClaim]:
    """The claims of ``victims``: a gang's member claims in its place."""
    return [c for v in victims for c in (v.claims if isinstance(v, GangVictim) else [v])]
