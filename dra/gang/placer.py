"""Gang placement on top of the matching engine: all-or-nothing, inside one topology domain, least fragmenting.

``GangPlacer(engine, snapshot).place(gang)``:

1. Domains: the nodes of each eligible cluster grouped by the required level (``topology``). Nodes without
   that label are left out (and counted, for the explanation).
2. Assess every domain with the engine's free-device indexes (``bounds``): an upper bound of the members it
   can take now, the free devices left over, and how many preferred-level groups the members would span.
   Cheap: no search, a few dictionary reads per node.
3. Rank the domains that could hold at least ``min_member`` members: those that hold every member first
   (else those that hold the most), then the gang's preferred cluster, then the fewest preferred-level
   groups spanned (all in one block before two blocks), then the tightest fit (fewest free devices left
   over: the placement fragments the fleet least and keeps emptier domains whole for the next big gang),
   then names (determinism).
4. Place members one by one in the best domain with the exact engine (``Engine.allocate`` restricted to one
   node): largest members first, nodes of the chosen preferred-level groups first, best-fit nodes first.
   Each member keeps all of its claims' own constraints (matchAttribute on a PCIe root, a parent GPU...):
   the engine checks them, this module only chooses the node. A node that failed for a shape is not tried
   again for that shape in this pass (allocations only take devices away, so it cannot start to fit).
5. At least ``min_member`` placed: done. Otherwise everything placed in that domain is released and the
   next domain is tried, up to ``max_domain_trials``. Nothing is ever left half-placed in the engine.

Pending gangs get an account of why: which domain came closest, with how much room, and what the whole
fleet would have without the topology requirement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from dra.engine import AllocationError, ClaimGroup, Engine, ErrorCode, FleetSnapshot

from .bounds import UNBOUNDED, ShapeBounds
from .topology import Domain, TopologyIndex, group_labels
from .types import DomainReport, Gang, GangMember, GangOutcome, GangReason, MemberPlacement, Topology

MAX_DOMAIN_TRIALS = 8
REPORTED_DOMAINS = 10
# Engine errors that depend on the cluster (its classes, its pools), not on the claim: that cluster or node
# is unusable for now, the gang is not wrong.
_CLUSTER_ERRORS = {ErrorCode.UNKNOWN_CLASS, ErrorCode.POOL_UPDATING}


class GangSpecError(ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{p}: {r}" for p, r in errors))
        self.errors = errors


@dataclass
class _Assessed:
    domain: Domain
    report: DomainReport
    group_order: list[tuple]  # preferred-level groups, the ones to fill first first
    rank: tuple


class GangPlacer:
    """Long-lived like the engine it wraps: build once per snapshot, ``place`` many gangs."""

    def __init__(self, engine: Engine, snapshot: FleetSnapshot, *, max_domain_trials: int = MAX_DOMAIN_TRIALS):
        self.engine = engine
        self.index = TopologyIndex(snapshot)
        self.max_domain_trials = max_domain_trials

    # ------------------------------------------------------------------------------------------ public
    def place(self, gang: Gang, *, commit: bool = True, within: tuple[str, dict[str, str]] | None = None
              ) -> GangOutcome:
        """Place ``gang``; with ``commit`` the engine keeps the devices (the caller persists them, or gives
        them back with ``release``), without it nothing changes (what-if). ``within=(cluster, domain labels)``
        restricts the placement to one domain (adding members to a gang already placed there)."""
        errors = gang.errors()
        if errors:
            raise GangSpecError(errors)
        started = time.perf_counter()
        self._trials = 0
        topo = gang.topology
        shapes: dict[str, list[int]] = {}
        for i, m in enumerate(gang.members):
            shapes.setdefault(_shape_key(m), []).append(i)
        clusters, skipped = self._eligible(gang, within)

        assessed: list[_Assessed] = []
        domains_total = unlabelled = 0
        bounds_by_cluster: dict[str, dict[str, ShapeBounds]] = {}
        for cluster in clusters:
            bounds: dict[str, ShapeBounds] = {}
            try:
                for skey, idxs in shapes.items():
                    bounds[skey] = ShapeBounds(self.engine, gang.members[idxs[0]].claims, cluster)
            except AllocationError as exc:
                if exc.code in _CLUSTER_ERRORS:
                    skipped.append({"cluster": cluster, "reason": exc.code, "detail": exc.message})
                    continue
                member = gang.members[shapes[skey][0]].name
                return self._invalid(gang, exc, member, started)
            bounds_by_cluster[cluster] = bounds
            cd = self.index.domains(cluster, topo)
            unlabelled += cd.unlabelled
            for domain in cd.domains:
                if within is not None and domain.labels != within[1]:
                    continue
                domains_total += 1
                assessed.append(self._assess(gang, domain, bounds, shapes))

        candidates = sorted((a for a in assessed if a.report.capacity >= gang.min_member), key=lambda a: a.rank)
        tried = 0
        member_failure: dict | None = None
        for a in candidates:
            if tried >= self.max_domain_trials:
                a.report.state, a.report.message = "not_tried", "not tried: the trial limit was reached"
                continue
            tried += 1
            placements, unplaced, failure = self._fill(gang, a, bounds_by_cluster[a.domain.cluster], shapes)
            a.report.placeable = len(placements)
            if len(placements) >= gang.min_member:
                a.report.state = "placed"
                if not commit:
                    self.release_placements(placements)
                others = sorted((x.report for x in assessed if x is not a), key=_closeness)
                return GangOutcome(
                    True, gang=gang.name, cluster=a.domain.cluster, domain=dict(a.domain.labels),
                    placements=placements, unplaced=unplaced,
                    message=f"placed {len(placements)} of {len(gang.members)} members in {a.report.name}",
                    domains=[a.report] + others[: REPORTED_DOMAINS - 1],
                    diagnostics=self._stats(gang, started, domains_total, len(candidates), tried, assessed,
                                            skipped, unlabelled))
            self.release_placements(placements)
            a.report.state = "fell_short"
            a.report.message = (f"only {len(placements)} of the {gang.min_member} members needed could be placed "
                                "with their claims' constraints")
            member_failure = member_failure or failure
        return self._pending(gang, topo, clusters, assessed, candidates, tried, skipped, unlabelled, domains_total,
                             member_failure, started)

    def release_placements(self, placements: list[MemberPlacement]) -> None:
        """Give the devices of these placements back to the engine (a rolled-back or lost write)."""
        self.engine.release([d for p in placements for d in p.outcome.devices])

    # ------------------------------------------------------------------------------------------ steps
    def _eligible(self, gang: Gang, within) -> tuple[list[str], list[dict]]:
        allowed = set(gang.allowed_clusters) if gang.allowed_clusters is not None else None
        if within is not None:
            allowed = {within[0]} if allowed is None else allowed & {within[0]}
        out, skipped = [], []
        for name in self.index.clusters():
            if allowed is not None and name not in allowed:
                continue
            if self.index.stale[name]:
                skipped.append({"cluster": name, "reason": "cluster_stale"})
                continue
            out.append(name)
        out.sort(key=lambda c: (0 if c == gang.preferred_cluster else 1, c))
        return out, skipped

    def _assess(self, gang: Gang, domain: Domain, bounds: dict[str, ShapeBounds],
                shapes: dict[str, list[int]]) -> _Assessed:
        n = len(gang.members)
        capacity = 0
        for skey, idxs in shapes.items():
            capacity += bounds[skey].domain_bound(domain.nodes, len(idxs))
        primary = max(shapes, key=lambda k: (len(shapes[k]) * max(1, bounds[k].devices), -min(shapes[k])))
        pb, pcount = bounds[primary], len(shapes[primary])
        free, need = pb.free(domain.nodes)
        target = min(pcount, pb.domain_bound(domain.nodes, pcount))
        group_order, span = _choose_groups(domain, pb, target, gang.topology)
        report = DomainReport(domain.cluster, dict(domain.labels), len(domain.nodes), capacity, free, need * pcount,
                              span=span)
        if capacity < gang.min_member:
            report.state = "too_small"
            report.message = f"room for {capacity} of the {gang.min_member} members needed"
        # Free devices the placement would leave behind in the domain: the smaller, the tighter the fit.
        leftover = free - need * target
        rank = (0 if capacity >= n else 1, -min(capacity, n), 0 if domain.cluster == gang.preferred_cluster else 1,
                span, leftover, domain.sort_key)
        return _Assessed(domain, report, group_order, rank)

    def _fill(self, gang: Gang, a: _Assessed, bounds: dict[str, ShapeBounds], shapes: dict[str, list[int]]
              ) -> tuple[list[MemberPlacement], list[str], dict | None]:
        """Place as many members as possible in the domain; largest members first."""
        cluster = a.domain.cluster
        shape_of = {i: skey for skey, idxs in shapes.items() for i in idxs}
        order = sorted(range(len(gang.members)), key=lambda i: (-bounds[shape_of[i]].devices, i))
        nodes_for: dict[str, list[str]] = {}
        cursor: dict[str, int] = {}
        placements: list[MemberPlacement] = []
        unplaced: list[str] = []
        failure: dict | None = None
        for i in order:
            member = gang.members[i]
            skey = shape_of[i]
            sb = bounds[skey]
            if skey not in nodes_for:
                nodes_for[skey] = _node_order(a.domain, a.group_order, sb)
                cursor[skey] = 0
            nodes = nodes_for[skey]
            placed = None
            while cursor[skey] < len(nodes):
                node = nodes[cursor[skey]]
                if sb.slots(node) == 0:
                    cursor[skey] += 1
                    continue
                self._trials += 1
                out = self.engine.allocate(ClaimGroup(claims=member.claims, allowed_clusters=[cluster], node=node,
                                                      key=member.key or f"{gang.key or gang.name}/{member.name}"),
                                           raise_errors=False)
                if out.allocated:
                    placed = MemberPlacement(member.name, cluster, out.node or node, out,
                                             self.index.node_labels(cluster, node, gang.topology))
                    break
                if failure is None:
                    failure = {"member": member.name, "node": node, "reason": out.reason,
                               "message": out.message,
                               "error": out.error.to_dict() if out.error is not None else None}
                cursor[skey] += 1  # monotone: this node cannot start to fit this shape during the pass
            if placed is None:
                unplaced.append(member.name)
            else:
                placements.append(placed)
        position = {m.name: j for j, m in enumerate(gang.members)}
        unplaced.sort(key=position.__getitem__)
        return placements, unplaced, failure

    # ------------------------------------------------------------------------------------------ outcomes
    def _invalid(self, gang: Gang, exc: AllocationError, member: str, started: float) -> GangOutcome:
        return GangOutcome(False, gang=gang.name, reason=GangReason.INVALID,
                           message=f"member {member}: {exc.message}", error=exc, error_member=member,
                           diagnostics={"error": exc.to_dict(), "member": member,
                                        "seconds": round(time.perf_counter() - started, 6)})

    def _stats(self, gang, started, domains_total, candidates, tried, assessed, skipped, unlabelled) -> dict:
        topo = gang.topology
        total = sum(min(x.report.capacity, len(gang.members)) for x in assessed)
        return {"required": topo.required, "preferred": topo.preferred, "minMember": gang.min_member,
                "members": len(gang.members), "domains": domains_total, "candidates": candidates, "tried": tried,
                "fleetCapacity": total, "unlabelledNodes": unlabelled, "clustersSkipped": skipped,
                "engineCalls": self._trials, "seconds": round(time.perf_counter() - started, 6)}

    def _pending(self, gang, topo: Topology, clusters, assessed, candidates, tried, skipped, unlabelled,
                 domains_total, member_failure, started) -> GangOutcome:
        reports = sorted((a.report for a in assessed), key=_closeness)
        closest = reports[0] if reports else None
        diagnostics = self._stats(gang, started, domains_total, len(candidates), tried, assessed, skipped,
                                  unlabelled)
        if member_failure:
            diagnostics["memberFailure"] = member_failure
        level = f"{topo.required} domain" if topo.required else "cluster"
        need = f"{gang.min_member} of {len(gang.members)} members" if gang.min_member < len(gang.members) else \
            f"all {len(gang.members)} members"
        if not clusters or (not assessed and skipped and not unlabelled):
            reason = GangReason.NO_ELIGIBLE_CLUSTER
            detail = "; ".join(f"{s['cluster']}: {s.get('detail') or s['reason']}" for s in skipped[:5])
            message = "no eligible cluster" + (f" ({detail})" if detail else "")
        elif not assessed:
            reason = GangReason.NO_TOPOLOGY_DOMAIN
            message = (f"no node in the eligible clusters carries the required label {topo.required} "
                       f"({unlabelled} nodes without it)")
        elif not candidates:
            assert closest is not None  # assessed is not empty
            reason = GangReason.NO_DOMAIN_FITS
            fleet = diagnostics["fleetCapacity"]
            message = (f"not enough free devices in any single {level} for {need}: the closest, {closest.name}, "
                       f"has room for {closest.capacity} ({closest.free_devices} free of the "
                       f"{closest.needed_devices} devices needed)")
            if topo.required:
                message += (f"; the eligible clusters together have room for {fleet}" if fleet >= gang.min_member
                            else f"; even the eligible clusters together have room for only {fleet}")
        else:
            assert closest is not None  # assessed is not empty
            reason = GangReason.MEMBERS_DO_NOT_FIT
            message = (f"{need} could not be placed in any single {level} with their claims' constraints: the "
                       f"closest, {closest.name}, took {closest.placeable if closest.placeable is not None else 0}")
            if member_failure:
                message += f" (member {member_failure['member']}: {member_failure['message']})"
            if len(candidates) > tried:
                message += f"; {len(candidates) - tried} more candidate domains were not tried"
        return GangOutcome(False, gang=gang.name, unplaced=[m.name for m in gang.members], reason=reason,
                           message=message, closest=closest, domains=reports[:REPORTED_DOMAINS],
                           diagnostics=diagnostics)


# ---------------------------------------------------------------------------------------------- helpers

def _shape_key(member: GangMember) -> str:
    """Members whose claims have equal specs are interchangeable (the engine caches plans the same way)."""
    return repr([c.get("spec") for c in member.claims])


def _closeness(report: DomainReport) -> tuple:
    """Closest to holding the gang first: the exact count where one was tried, else the bound."""
    got = report.placeable if report.placeable is not None else report.capacity
    return (-got, -report.free_devices, report.cluster, tuple(report.domain.items()))


def _choose_groups(domain: Domain, sb: ShapeBounds, target: int, topo: Topology) -> tuple[list[tuple], int]:
    """Preferred-level groups in fill order, and how many the target members span.

    One group that holds them all: the tightest such group (best fit). Otherwise the largest groups first,
    which spans the fewest groups. Groups beyond those needed follow, largest first, as a fallback for the
    exact placement.
    """
    if not topo.preferred or len(domain.groups) <= 1:
        return list(domain.groups), 1
    caps = {g: sb.domain_bound(nodes, max(target, 1)) for g, nodes in domain.groups.items()}
    fitting = [g for g, c in caps.items() if c >= target]
    if fitting and target > 0:
        best = min(fitting, key=lambda g: (caps[g], g))
        rest = sorted((g for g in caps if g != best), key=lambda g: (-caps[g], g))
        return [best] + rest, 1
    by_size = sorted(caps, key=lambda g: (-caps[g], g))
    span, total = 0, 0
    for g in by_size:
        if total >= target:
            break
        total += caps[g]
        span += 1
    return by_size, max(span, 1)


def _node_order(domain: Domain, group_order: list[tuple], sb: ShapeBounds) -> list[str]:
    """Nodes group by group; within a group the fullest nodes that still fit first (best fit), then names."""
    out: list[str] = []
    for g in group_order:
        nodes = domain.groups[g]
        ranked = sorted(((sb.slots(n), n) for n in nodes), key=lambda t: (t[0] if t[0] < UNBOUNDED else UNBOUNDED,
                                                                          t[1]))
        out.extend(n for slots, n in ranked if slots > 0)
    return out


__all__ = ["GangPlacer", "GangSpecError", "MAX_DOMAIN_TRIALS", "group_labels"]
