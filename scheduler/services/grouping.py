"""Which pending claims must be allocated together: one consumer's claims, on one node, or none.

Claims are linked through consumers (``Reservation`` rows): two claims used by one consumer belong to one
group, and so does everything linked to them in turn (a shared claim used by pods A and B, plus A's and B's
other claims, is one group). Members already allocated pin the group to their cluster and node; a failed
member blocks it.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from claims.models import Phase, Reservation, ResourceClaim
from claims.services.external import managed_elsewhere

BLOCK_DIFFERENT_NODES = "ConsumerClaimsOnDifferentNodes"
BLOCK_MEMBER_FAILED = "ConsumerClaimFailed"
BUSY_ELSEWHERE = "GroupMemberBusy"
BLOCK_MANAGED_ELSEWHERE = "ManagedByAnotherAllocator"


@dataclass
class Group:
    claims: list[ResourceClaim]
    consumers: list[int] = field(default_factory=list)
    pin_cluster: str | None = None
    pin_node: str | None = None
    blocked: str | None = None  # a reason code: the group cannot be allocated as it stands
    blocked_message: str = ""
    # Set by a round screen that held a node for this group (its queue's head): see claims.services.wake.
    holds_node: str = ""  # the queue whose head this group is
    held_at: tuple[str, str] | None = None  # (cluster, node) held for it
    # Set by the queue order: admitting it reads quota usage, so it commits in one part with every other such
    # group of the round (scheduler.services.turns.partition), in queue order.
    by_quota: bool = False

    @property
    def key(self) -> str:
        if self.consumers:
            return "consumers:" + ",".join(str(c) for c in sorted(self.consumers))
        return f"claim:{self.claims[0].uid}"


def build_groups(claims: list[ResourceClaim],
                 take: Callable[[list[int]], set[int]]) -> tuple[list[Group], list[ResourceClaim]]:
    """Groups for the taken pending ``claims``; plus claims left out because a member is held elsewhere.

    Pending members outside the batch are taken here too (``take`` marks them and returns those it got); when
    one is held by another worker, the whole group is left for a later round (it stays eligible).
    """
    by_id = {c.id: c for c in claims}
    res = list(Reservation.objects.filter(claim_id__in=list(by_id)).values_list("claim_id", "consumer_id"))
    if not res:
        return [Group(claims=[c]) for c in claims], []
    links = _closure(by_id, res, take)
    groups: list[Group] = []
    left_out: list[ResourceClaim] = []
    for members in _components(links.claims_of, by_id):
        mine = [by_id[i] if i in by_id else links.others[i] for i in sorted(members)
                if i in by_id or i in links.others]
        pending = [c for c in mine if c.phase == Phase.PENDING]
        if not any(i in by_id for i in members):
            continue
        if any(i in links.busy for i in members):
            left_out.extend(c for c in pending if c.id in by_id)
            continue
        group = Group(claims=pending,
                      consumers=sorted({cons for i in members for cons in links.consumers_of.get(i, ())}))
        _apply_rules(group, mine)
        if group.claims:
            groups.append(group)
    return groups, left_out


# ------------------------------------------------------------------------------ database: the linked claims

@dataclass
class _Links:
    consumers_of: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    claims_of: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    others: dict[int, ResourceClaim] = field(default_factory=dict)  # members outside the batch we may use
    busy: set[int] = field(default_factory=set)  # pending members locked by another worker (or deleted)

    def link(self, rows) -> None:
        for claim_id, consumer_id in rows:
            self.consumers_of[claim_id].add(consumer_id)
            self.claims_of[consumer_id].add(claim_id)


def _closure(by_id: dict[int, ResourceClaim], res: list[tuple[int, int]],
             take: Callable[[list[int]], set[int]]) -> _Links:
    """Every claim linked to the batch through consumers, transitively; pending ones outside it are taken."""
    links = _Links()
    links.link(res)
    known = set(by_id)
    seen_consumers: set[int] = set()
    frontier = {consumer for _, consumer in res}
    # Transitive closure over consumers; one or two iterations in practice (shared claims are few).
    while frontier:
        seen_consumers |= frontier
        rows = list(Reservation.objects.filter(consumer_id__in=list(frontier)).values_list("claim_id", "consumer_id"))
        links.link(rows)
        new_claims = {claim_id for claim_id, _ in rows} - known
        known |= new_claims
        frontier = set()
        if not new_claims:
            break
        members = {c.id: c for c in ResourceClaim.objects.select_related("namespace").filter(id__in=new_claims)}
        pending = [i for i, c in members.items() if c.phase == Phase.PENDING]
        locked = take(pending)
        for claim_id in new_claims:
            claim = members.get(claim_id)
            if claim is None or (claim.phase == Phase.PENDING and claim_id not in locked):
                links.busy.add(claim_id)
            else:
                links.others[claim_id] = claim
        more = list(Reservation.objects.filter(claim_id__in=list(new_claims)).values_list("claim_id", "consumer_id"))
        links.link(more)
        frontier = {consumer for _, consumer in more} - seen_consumers
    return links


# ------------------------------------------------------------------------------ pure: connected components

class DisjointSets:
    """Union-find over hashable items (claims linked by consumers; clusters a round's groups share)."""

    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        parent = self.parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a, b) -> None:
        self.parent[self.find(b)] = self.find(a)

    def sets(self) -> dict:
        """Root -> members, every item seen."""
        out: dict = defaultdict(list)
        for x in list(self.parent):
            out[self.find(x)].append(x)
        return out


def _components(claims_of: dict[int, set[int]], ids) -> list[list[int]]:
    """Claims linked by a consumer, as lists of claim ids (union-find); every id of ``ids`` is in one."""
    links = DisjointSets()
    for members in claims_of.values():
        ordered = list(members)
        for other in ordered[1:]:
            links.union(ordered[0], other)
    for cid in ids:
        links.find(cid)
    return list(links.sets().values())


# ------------------------------------------------------------------------------ blocking rules

def _apply_rules(group: Group, mine: list[ResourceClaim]) -> None:
    """Block the group, or pin it to where its allocated members are, from what its members are."""
    pins = {(c.cluster, c.node) for c in mine if c.phase == Phase.ALLOCATED}
    failed = [c for c in mine if c.phase == Phase.FAILED]
    foreign = [(c, managed_elsewhere(c)) for c in mine if managed_elsewhere(c)]
    if foreign:
        # A consumer outside e.g. a gang reserved one of the gang's claims: placing the group here would
        # take that claim out of its all-or-nothing placement.
        group.claims = [c for c in group.claims if not managed_elsewhere(c)]
        group.blocked = BLOCK_MANAGED_ELSEWHERE
        group.blocked_message = (f"claim {foreign[0][0].name} is placed by another allocator ({foreign[0][1]}); "
                                 "its consumers' other claims wait for it")
    elif failed:
        group.blocked = BLOCK_MEMBER_FAILED
        group.blocked_message = (f"claim {failed[0].name} used by the same consumer failed; a consumer's claims "
                                 "are allocated together or not at all")
    elif pins:
        clusters = {p[0] for p in pins}
        nodes = {p[1] for p in pins if p[1]}
        if len(clusters) > 1 or len(nodes) > 1:
            group.blocked = BLOCK_DIFFERENT_NODES
            group.blocked_message = ("claims used by the same consumer are already allocated on different "
                                     f"nodes: {', '.join(sorted(f'{c}/{n}' for c, n in pins))}")
        else:
            group.pin_cluster = clusters.pop()
            group.pin_node = nodes.pop() if nodes else None
