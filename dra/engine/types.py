"""The engine's contract: what goes in (Kubernetes JSON wrapped in small dataclasses) and what comes out.

Inputs stay plain ``resource.k8s.io/v1`` JSON dicts so that the inventory side can hand over exactly what it
stores; outputs are dataclasses with a JSON-safe ``to_dict()`` for storage and HTTP.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------------------------------- features, budget

@dataclass(frozen=True)
class Features:
    """The allocator's feature switches (upstream ``structured.Features``), all on by default.

    A request or device that needs a feature that is off is an error (a request field) or is skipped (a device
    field), exactly as upstream does it.
    """

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    device_binding_and_status: bool = True

    _JSON_KEYS = {
        "adminAccess": "admin_access",
        "prioritizedList": "prioritized_list",
        "partitionableDevices": "partitionable_devices",
        "deviceTaints": "device_taints",
        "consumableCapacity": "consumable_capacity",
        "deviceBindingAndStatus": "device_binding_and_status",
    }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Features:
        """Accepts the simulate body's camelCase keys (or snake_case); missing keys stay on."""
        if not data:
            return cls()
        kwargs = {}
        for key, value in data.items():
            attr = cls._JSON_KEYS.get(key, key)
            if attr not in cls.__dataclass_fields__ or attr.startswith("_"):
                raise ValueError(f"unknown feature {key!r}")
            kwargs[attr] = bool(value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, bool]:
        return {json_key: getattr(self, attr) for json_key, attr in self._JSON_KEYS.items()}


@dataclass(frozen=True)
class SearchBudget:
    """Upper bounds on the work one ``allocate`` call may do before it gives up with ``search_budget_exceeded``.

    ``max_steps`` counts candidate placements tried (one device for one request slot) over all nodes;
    ``max_nodes`` bounds on how many nodes the exact search runs for one group (nodes ruled out by the cheap
    count and constraint bounds, or identical to a node that already failed, do not count); ``max_seconds`` is
    a wall-clock backstop. The defaults are far above what any realistic claim needs (the pruning makes typical
    searches linear) and far below a hang.
    """

    max_steps: int = 200_000
    max_seconds: float = 2.0
    max_nodes: int = 256


# ---------------------------------------------------------------------------------------------- inputs

@dataclass
class ClusterInventory:
    """One cluster as the inventory stores it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    stale: bool = False
    nodes: list[dict] = field(default_factory=list)  # [{"name": ..., "labels": {...}}]
    resource_slices: list[dict] = field(default_factory=list)  # normalized v1 ResourceSlice JSON
    device_taint_rules: list[dict] = field(default_factory=list)  # v1 DeviceTaintRule JSON
    device_classes: list[dict] = field(default_factory=list)  # overrides fleet classes of the same name


@dataclass
class FleetSnapshot:
    clusters: list[ClusterInventory]
    device_classes: list[dict] = field(default_factory=list)  # fleet-wide v1 DeviceClasses


@dataclass(frozen=True)
class AllocatedDevice:
    """One device (or one share of a multi-allocatable device) in use.

    ``share_id`` is set for a share of a device with ``allowMultipleAllocations``; ``consumed_capacity`` is
    what that share takes (capacity name -> quantity string). A record without ``share_id`` holds the device
    exclusively. ``admin_access`` records are informational: admin access never consumes a device.
    """

    cluster: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: dict[str, str] | None = field(default=None, hash=False, compare=True)
    admin_access: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cluster": self.cluster, "driver": self.driver, "pool": self.pool,
                               "device": self.device}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.consumed_capacity:
            out["consumedCapacity"] = dict(self.consumed_capacity)
        if self.admin_access:
            out["adminAccess"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllocatedDevice:
        return cls(cluster=data.get("cluster", ""), driver=data["driver"], pool=data["pool"],
                   device=data["device"], share_id=data.get("shareID") or data.get("share_id"),
                   consumed_capacity=data.get("consumedCapacity") or data.get("consumed_capacity"),
                   admin_access=bool(data.get("adminAccess") or data.get("admin_access")))


@dataclass
class ClaimGroup:
    """One consumer's claims: all are allocated together (node-local devices on one node) or none is."""

    claims: list[dict]  # v1 ResourceClaim JSON, already defaulted and validated
    allowed_clusters: list[str] | None = None
    preferred_cluster: str | None = None
    node: str | None = None  # restrict to this node, like the kube-scheduler Filter for one node
    key: str = ""
    # (cluster, node) pairs not to place on: held by the caller for another group (a queue's head, a
    # defragmentation target). Not a failure reason of their own: the caller asks again without them to learn
    # whether the group would fit only there.
    avoid_nodes: frozenset[tuple[str, str]] = frozenset()


# ---------------------------------------------------------------------------------------------- outcomes

class Reason:
    """Reason codes of a failed ``allocate`` (``GroupOutcome.reason``)."""

    UNSATISFIABLE = "unsatisfiable"  # no cluster/node can hold the group now
    SEARCH_BUDGET_EXCEEDED = "search_budget_exceeded"
    NO_ELIGIBLE_CLUSTER = "no_eligible_cluster"  # allowed_clusters/staleness left nothing to try
    INVALID_POOLS = "invalid_pools"  # nothing fit anywhere, and some examined node has invalid pools
    # Unsatisfiable, and some request's selectors match no device but fail at run time on some (``selectors``)
    SELECTOR_ERROR_ON_ALL_CANDIDATES = "selector_error_on_all_candidates"


class ErrorCode:
    """Codes of ``AllocationError``: the input is wrong, not the fleet full."""

    UNKNOWN_CLASS = "unknown_device_class"
    CEL = "cel_error"
    LIMIT = "limit_exceeded"
    POOL_UPDATING = "pool_being_updated"  # allocationMode All over an incomplete/invalid pool
    POOL_INVALID = "pool_invalid"  # nothing fit and the node has invalid pools (upstream's per-node error)
    FEATURE_DISABLED = "feature_disabled"
    INVALID = "invalid_claim"


class AllocationError(Exception):
    """An input error: the claim (or a class it names) is wrong, or asks for something that cannot be decided.

    ``message`` uses the upstream allocator's wording where upstream has one; ``field`` is a field path into
    the claim when the error is about one field.
    """

    def __init__(self, code: str, message: str, *, claim: str | None = None, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.claim = claim
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "claim": self.claim, "field": self.field}


@dataclass
class ClaimOutcome:
    name: str
    namespace: str = ""
    uid: str = ""
    allocation: dict | None = None  # v1 AllocationResult JSON

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "uid": self.uid, "allocation": self.allocation}


@dataclass
class GroupOutcome:
    """The answer for one ``ClaimGroup``.

    On success ``allocated`` is true, ``cluster`` and ``node`` (None when only network-attached devices were
    used) say where, ``claims`` carries one ``AllocationResult`` per claim in input order, and ``devices`` the
    records to persist (and to pass to ``Engine.release`` later). On failure ``reason`` is a ``Reason`` code,
    ``message`` a sentence, and ``diagnostics`` structured data about where candidates dropped out.
    ``error`` is set when the input was wrong (the same ``AllocationError`` that ``allocate`` raises when
    asked to raise).
    """

    allocated: bool
    key: str = ""
    cluster: str | None = None
    node: str | None = None
    claims: list[ClaimOutcome] = field(default_factory=list)
    devices: list[AllocatedDevice] = field(default_factory=list)
    reason: str | None = None
    message: str = ""
    diagnostics: dict[str, Any] = field(default_factory=dict)
    error: AllocationError | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated": self.allocated,
            "key": self.key,
            "cluster": self.cluster,
            "node": self.node,
            "claims": [c.to_dict() for c in self.claims],
            "devices": [d.to_dict() for d in self.devices],
            "reason": self.reason,
            "message": self.message,
            "diagnostics": self.diagnostics,
            "error": self.error.to_dict() if self.error else None,
        }


def allocated_from_dicts(items: Iterable[dict], cluster: str = "") -> list[AllocatedDevice]:
    """Convenience for callers holding JSON records; ``cluster`` fills records that lack one."""
    out = []
    for item in items:
        rec = AllocatedDevice.from_dict(item)
        if not rec.cluster and cluster:
            rec = AllocatedDevice(cluster, rec.driver, rec.pool, rec.device, rec.share_id, rec.consumed_capacity,
                                  rec.admin_access)
        out.append(rec)
    return out


__all__ = [
    "Features", "SearchBudget", "ClusterInventory", "FleetSnapshot", "AllocatedDevice", "ClaimGroup",
    "Reason", "ErrorCode", "AllocationError", "ClaimOutcome", "GroupOutcome", "allocated_from_dicts",
]
