"""Cheap upper bounds: how many members of one shape could fit on a node, from the engine's own indexes.

A member "shape" is its claims' specs: members made from one template share one. For each shape the engine's
plan gives the fixed-count requests and their selector sets; the engine keeps, per selector set and cluster,
the number of free matching devices per node (``KeyIndex``), brought up to date whenever it is asked for
(``Engine.key_index``), so the bounds read it afresh rather than holding one across allocations.
``free // need`` per selector set, minimum over the sets, bounds the members that node can take. A bound
only prunes (a node or domain that cannot possibly hold the members is not tried); the engine's exact search
decides everything else, so constraints, counters, capacity and taints keep their full meaning.

Requests we cannot bound cheaply (``All`` mode, ``firstAvailable``, admin access, devices that can be
shared by several allocations) add no bound (the member's other requests still do); a shape with no bound at
all is tried exactly on every node. If the engine's internals ever stop offering what we read here, the same
happens: slower, never wrong.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from dra.engine import Engine

if TYPE_CHECKING:
    from dra.engine.model import ClusterModel
    from dra.engine.selectors import SelectorSet

UNBOUNDED = 1 << 30


class _FreeDevices(Protocol):
    """What the bounds read of the engine's per-selector index (``dra.engine.index.KeyIndex``)."""

    local_free: dict[str, int]  # node -> free node-local matching devices
    net_free: int  # free network-attached matching devices
    multi: bool  # some matching device can be shared


class ShapeBounds:
    def __init__(self, engine: Engine, claims: list[dict], cluster: str):
        """Raises ``AllocationError`` (through the engine's planner) for invalid claims or unknown classes."""
        self.engine = engine
        self._needs: list[tuple[SelectorSet, ClusterModel, int]] = []  # (selector set, cluster model, devices needed)
        self.devices = 0  # fixed-count devices per member (all requests), for ordering members by size
        plan = engine.plan_for(claims, cluster)  # the public planner: same errors the allocator would raise
        try:
            model = engine.clusters[cluster]
            per_sel: dict[int, tuple[SelectorSet, list[int]]] = {}
            for cp in plan.claims:
                for rp in cp.requests:
                    alt = rp.alts[0]
                    if rp.has_sub or alt.all_mode or alt.admin:
                        continue  # not bounded here; the other requests still bound the member
                    self.devices += alt.count
                    per_sel.setdefault(id(alt.sel), (alt.sel, []))[1].append(alt.count)
            for sel, counts in per_sel.values():
                ki = engine.key_index(sel, model)
                if ki.multi:
                    continue  # a shareable device can serve several members: free devices bound nothing
                self._needs.append((sel, model, sum(counts)))
            self._needs.sort(key=lambda kn: -kn[2])
        except (AttributeError, KeyError, TypeError):  # engine internals changed: exact search only
            self._needs = []

    @property
    def needs(self) -> list[tuple[_FreeDevices, int]]:
        """(index, devices needed per member), the indexes up to date with every allocation made so far."""
        return [(self.engine.key_index(sel, model), need) for sel, model, need in self._needs]

    def slots(self, node: str) -> int:
        """Upper bound of members of this shape that ``node`` can take now."""
        needs = self.needs
        if not needs:
            return UNBOUNDED
        best = UNBOUNDED
        for ki, need in needs:
            n = (ki.local_free.get(node, 0) + ki.net_free) // need
            if n < best:
                best = n
                if not best:
                    return 0
        return best

    def free(self, nodes: list[str]) -> tuple[int, int]:
        """(free devices of the main request over ``nodes``, devices the main request needs per member).

        Network-attached devices are counted once, not once per node.
        """
        needs = self.needs
        if not needs:
            return 0, 0
        ki, need = needs[0]
        return sum(ki.local_free.get(n, 0) for n in nodes) + ki.net_free, need

    def domain_bound(self, nodes: list[str], cap: int) -> int:
        """Upper bound of members over ``nodes`` (at most ``cap``); network devices are shared by the nodes."""
        total = 0
        for n in nodes:
            total += self.slots(n)
            if total >= cap:
                total = cap
                break
        if self._needs:
            for ki, need in self.needs:
                pooled = (sum(ki.local_free.get(n, 0) for n in nodes) + ki.net_free) // need
                total = min(total, pooled)
        return total
