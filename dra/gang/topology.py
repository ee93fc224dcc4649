"""Topology domains from node labels: which nodes share a rack, a block, a zone.

A domain of level L is the set of nodes of ONE cluster that carry the same value for L and for every wider
level: rack "r1" in zone "a" and rack "r1" in zone "b" are different racks, as in KAI Scheduler's
Topology. Clusters are never merged (a gang's pods run in one Kubernetes cluster), so with no required
level each cluster is one domain.

Within a domain the nodes are grouped by the preferred level. A node lacking the preferred level's label
is a group of its own: nothing says it is close to anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dra.engine import FleetSnapshot

from .types import Topology


@dataclass
class Domain:
    cluster: str
    key: tuple[str, ...]  # values of levels[: required + 1]
    labels: dict[str, str]  # level -> value for the same levels
    nodes: list[str] = field(default_factory=list)  # sorted by name
    groups: dict[tuple, list[str]] = field(default_factory=dict)  # preferred-level key -> its nodes, sorted

    @property
    def sort_key(self) -> tuple:
        return (self.cluster, self.key)


@dataclass
class ClusterDomains:
    domains: list[Domain]
    unlabelled: int  # nodes without the required level's label: no gang with this requirement can use them


class TopologyIndex:
    """Domains per (cluster, topology), computed once per snapshot and cached: the snapshot is immutable."""

    def __init__(self, snapshot: FleetSnapshot):
        self.labels: dict[str, dict[str, dict[str, str]]] = {}  # cluster -> node -> labels
        self.stale: dict[str, bool] = {}
        self.cluster_labels: dict[str, dict[str, str]] = {}
        for inv in snapshot.clusters:
            self.labels[inv.name] = {n["name"]: dict(n.get("labels") or {}) for n in inv.nodes}
            self.stale[inv.name] = bool(inv.stale)
            self.cluster_labels[inv.name] = dict(inv.labels or {})
        self._cache: dict[tuple, ClusterDomains] = {}

    def clusters(self) -> list[str]:
        return sorted(self.labels)

    def node_labels(self, cluster: str, node: str, topology: Topology) -> dict[str, str]:
        labels = self.labels.get(cluster, {}).get(node, {})
        return {level: labels[level] for level in topology.levels if level in labels}

    def domains(self, cluster: str, topology: Topology) -> ClusterDomains:
        key = (cluster, topology.levels, topology.required, topology.preferred)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._build(cluster, topology)
        return cached

    def _build(self, cluster: str, topology: Topology) -> ClusterDomains:
        req = topology.index(topology.required)
        pref = topology.index(topology.preferred) if topology.preferred else req
        outer = topology.levels[: req + 1]
        inner = topology.levels[: pref + 1]
        by_key: dict[tuple, Domain] = {}
        unlabelled = 0
        for node in sorted(self.labels.get(cluster, {})):
            labels = self.labels[cluster][node]
            if topology.required and topology.required not in labels:
                unlabelled += 1
                continue
            dkey = tuple(labels.get(level, "") for level in outer)
            domain = by_key.get(dkey)
            if domain is None:
                domain = by_key[dkey] = Domain(cluster, dkey, {lv: v for lv, v in zip(outer, dkey, strict=False) if v})
            domain.nodes.append(node)
            if topology.preferred and topology.preferred not in labels:
                gkey: tuple = ("\0node", node)  # its own group (see module docstring)
            else:
                gkey = tuple(labels.get(level, "") for level in inner)
            domain.groups.setdefault(gkey, []).append(node)
        return ClusterDomains(sorted(by_key.values(), key=lambda d: d.sort_key), unlabelled)


def group_labels(topology: Topology, gkey: tuple) -> dict[str, str]:
    """A preferred-level group key as {level: value} (empty for a node-of-its-own group)."""
    if gkey and gkey[0] == "\0node":
        return {}
    inner = topology.levels[: topology.index(topology.preferred) + 1] if topology.preferred else ()
    return {lv: v for lv, v in zip(inner, gkey, strict=False) if v}
