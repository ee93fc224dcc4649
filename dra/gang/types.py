"""The gang library's contract: what goes in (a gang of members, each with its claims, and a topology) and
what comes out (where every member landed, or why the gang cannot start now).

Plain dataclasses, JSON-safe through ``to_dict()``, so the worker can store an outcome and the simulate
endpoint can return it as is. Vocabulary follows KAI Scheduler's PodGroup (``minMember``, topology levels
with a required and a preferred level) and Kubernetes DRA (claims, devices, nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dra.engine import AllocatedDevice, AllocationError, GroupOutcome
from dra.k8s.fields import is_label_key

MAX_LEVELS = 8
MAX_LEVEL_LENGTH = 316  # a level is a node label key; this bound (not the prefix's own 253) has always applied


@dataclass(frozen=True)
class Topology:
    """Node-label levels ordered from widest to narrowest (zone, rack, block...).

    ``required``: every member must land in ONE domain of this level (nodes that share the label value at
    this level and at every wider level). ``preferred``: a narrower (or the same) level the placement tries to
    keep the gang within, and otherwise spreads over as few such domains as it can. Both are optional; with
    neither, the gang still lands in one cluster (a gang's pods run in one Kubernetes cluster).
    """

    levels: tuple[str, ...] = ()
    required: str | None = None
    preferred: str | None = None

    @classmethod
    def from_dict(cls, data: dict | None) -> Topology:
        data = data or {}
        return cls(tuple(data.get("levels") or ()), data.get("required") or None, data.get("preferred") or None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"levels": list(self.levels)}
        if self.required:
            out["required"] = self.required
        if self.preferred:
            out["preferred"] = self.preferred
        return out

    def errors(self, path: str = "topology") -> list[tuple[str, str]]:
        """Field errors, Kubernetes style (path, reason); empty when valid."""
        out: list[tuple[str, str]] = []
        if len(self.levels) > MAX_LEVELS:
            out.append((f"{path}.levels", f"Too many: {len(self.levels)}: must have at most {MAX_LEVELS} items"))
        seen: set[str] = set()
        for i, level in enumerate(self.levels):
            if not isinstance(level, str) or len(level) > MAX_LEVEL_LENGTH \
                    or not is_label_key(level, prefix_limit=MAX_LEVEL_LENGTH):
                out.append((f"{path}.levels[{i}]", f"Invalid value: {level!r}: must be a node label key"))
            elif level in seen:
                out.append((f"{path}.levels[{i}]", f'Duplicate value: "{level}"'))
            seen.add(level)
        for name in ("required", "preferred"):
            value = getattr(self, name)
            if value is not None and value not in self.levels:
                out.append((f"{path}.{name}", f"Invalid value: {value!r}: must be one of topology.levels"))
        if not out and self.required and self.preferred and self.index(self.preferred) < self.index(self.required):
            out.append((f"{path}.preferred", "Invalid value: must be the required level or a narrower one "
                                             "(a wider preference is implied by the requirement)"))
        return out

    def index(self, level: str | None) -> int:
        """Position of ``level`` in ``levels``; -1 for None (the whole cluster)."""
        return self.levels.index(level) if level else -1


@dataclass
class GangMember:
    """One member (a pod, a worker): its claims are allocated together on one node, as one consumer's."""

    name: str
    claims: list[dict]  # v1 ResourceClaim JSON, already defaulted and validated
    key: str = ""


@dataclass
class Gang:
    """All or nothing: at least ``min_member`` members are placed, each with all of its claims, or none is."""

    name: str
    members: list[GangMember]
    min_member: int
    topology: Topology = field(default_factory=Topology)
    allowed_clusters: list[str] | None = None
    preferred_cluster: str | None = None
    key: str = ""

    def errors(self) -> list[tuple[str, str]]:
        out = list(self.topology.errors())
        if not self.members:
            out.append(("members", "Required value: at least one member"))
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            out.append(("members", "Duplicate value: member names must be unique"))
        if not 1 <= self.min_member <= max(1, len(self.members)):
            out.append(("minMember", f"Invalid value: {self.min_member}: must be between 1 and the number of "
                                     f"members ({len(self.members)})"))
        return out


# ---------------------------------------------------------------------------------------------- outcomes

class GangReason:
    """Why a gang is not placed (``GangOutcome.reason``). CamelCase, like Kubernetes condition reasons."""

    NO_ELIGIBLE_CLUSTER = "NoEligibleCluster"  # allowed clusters / staleness / unknown classes left nothing
    NO_TOPOLOGY_DOMAIN = "NoTopologyDomain"  # no node carries the required level's label
    NO_DOMAIN_FITS = "NoDomainFits"  # not enough free devices in any single domain of the required level
    MEMBERS_DO_NOT_FIT = "MembersDoNotFit"  # enough devices on paper, but the exact placement failed
    INVALID = "InvalidGang"  # the gang or a member's claims are wrong (see ``error``)


@dataclass
class MemberPlacement:
    member: str
    cluster: str
    node: str  # the node the member runs on (the engine's node, or the node it was placed for)
    outcome: GroupOutcome  # the engine's answer: one AllocationResult per claim, the device records
    labels: dict[str, str] = field(default_factory=dict)  # the node's value at each topology level

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "cluster": self.cluster, "node": self.node, "labels": dict(self.labels),
                "claims": [c.to_dict() for c in self.outcome.claims],
                "devices": [d.to_dict() for d in self.outcome.devices]}


@dataclass
class DomainReport:
    """One domain of the required level as the placement saw it.

    ``capacity`` is an upper bound (from free matching devices per node) of how many members could fit;
    ``placeable`` is exact, set when members were actually placed there (and rolled back if too few).
    """

    cluster: str
    domain: dict[str, str]  # level -> value, widest level first, down to the required level
    nodes: int
    capacity: int
    free_devices: int  # free devices matching the largest member's main request
    needed_devices: int  # what the members to place need of those, in total
    span: int = 1  # preferred-level domains the members would spread over (1: all in one)
    placeable: int | None = None
    state: str = "candidate"  # candidate | too_small | not_tried | fell_short | placed
    message: str = ""

    @property
    def name(self) -> str:
        """``c1/zone=a/rack=r1``: label keys without their prefix, widest first (``domain`` has them in full)."""
        return "/".join([self.cluster] + [f"{k.rsplit('/', 1)[-1]}={v}" for k, v in self.domain.items()])

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "domain": dict(self.domain), "name": self.name, "nodes": self.nodes,
                "capacity": self.capacity, "freeDevices": self.free_devices, "neededDevices": self.needed_devices,
                "span": self.span, "placeable": self.placeable, "state": self.state, "message": self.message}


@dataclass
class GangOutcome:
    placed: bool
    gang: str = ""
    cluster: str | None = None
    domain: dict[str, str] = field(default_factory=dict)
    placements: list[MemberPlacement] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)  # members not placed (beyond minMember, or all)
    reason: str | None = None
    message: str = ""
    closest: DomainReport | None = None
    domains: list[DomainReport] = field(default_factory=list)  # the most relevant ones, best first
    diagnostics: dict[str, Any] = field(default_factory=dict)
    error: AllocationError | None = None
    error_member: str | None = None

    @property
    def devices(self) -> list[AllocatedDevice]:
        return [d for p in self.placements for d in p.outcome.devices]

    def preferred_domains(self, topology: Topology) -> list[dict[str, Any]]:
        """How the placed members spread over domains of the preferred level: [{"domain", "members"}]."""
        if not topology.preferred:
            return []
        keep = topology.levels[: topology.index(topology.preferred) + 1]
        counts: dict[tuple, int] = {}
        for p in self.placements:
            key = tuple(p.labels.get(level, "") for level in keep)
            counts[key] = counts.get(key, 0) + 1
        return [{"domain": dict(zip(keep, key, strict=False)), "members": n}
                for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

    def to_dict(self) -> dict[str, Any]:
        return {"placed": self.placed, "gang": self.gang, "cluster": self.cluster, "domain": dict(self.domain),
                "placements": [p.to_dict() for p in self.placements], "unplaced": list(self.unplaced),
                "reason": self.reason, "message": self.message,
                "closest": self.closest.to_dict() if self.closest else None,
                "domains": [d.to_dict() for d in self.domains], "diagnostics": self.diagnostics,
                "error": self.error.to_dict() if self.error else None, "errorMember": self.error_member}


__all__ = ["Topology", "GangMember", "Gang", "GangReason", "MemberPlacement", "DomainReport", "GangOutcome"]
