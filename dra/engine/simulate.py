"""What-if allocation: one group of claims against a snapshot, with nothing kept.

``simulate`` is the one function behind ``POST /api/v1/simulate`` (with the body's own inventory, or with the
stored fleet) and the upstream conformance tests. ``snapshot_from_body`` turns the simulate body format into
engine inputs: the body's slices and nodes become one cluster, and its ``allocated*`` lists the in-use state.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .engine import Engine
from .types import AllocatedDevice, ClaimGroup, ClusterInventory, Features, FleetSnapshot, GroupOutcome, SearchBudget

SIMULATION_CLUSTER = "simulation"


def simulate(snapshot: FleetSnapshot, allocated: Iterable[AllocatedDevice], claims: list[dict],
             node: str | None = None, features: Features | None = None, *,
             allowed_clusters: list[str] | None = None, budget: SearchBudget | None = None) -> GroupOutcome:
    """Allocate ``claims`` together (all or none) on a throw-away engine. Input errors raise ``AllocationError``."""
    engine = Engine(snapshot, allocated, features=features, budget=budget)
    return engine.allocate(ClaimGroup(claims=list(claims), node=node, allowed_clusters=allowed_clusters,
                                      key="simulate"))


def allocated_from_body(body: dict[str, Any], cluster: str = SIMULATION_CLUSTER) -> list[AllocatedDevice]:
    out = []
    for item in body.get("allocatedDevices") or []:
        out.append(AllocatedDevice(cluster, item["driver"], item["pool"], item["device"]))
    for item in body.get("allocatedSharedDevices") or []:
        out.append(AllocatedDevice(cluster, item["driver"], item["pool"], item["device"],
                                   share_id=item.get("shareID") or item.get("shareId") or "shared",
                                   consumed_capacity=item.get("consumedCapacity") or {}))
    for item in body.get("allocatedCapacity") or []:
        # Aggregated consumption of a multi-allocatable device (upstream AllocatedState.AggregatedCapacity).
        out.append(AllocatedDevice(cluster, item["driver"], item["pool"], item["device"],
                                   consumed_capacity=dict(item.get("capacity") or {})))
    return out


def snapshot_from_body(body: dict[str, Any], slices: list[dict] | None = None,
                       cluster: str = SIMULATION_CLUSTER) -> FleetSnapshot:
    """The body's inventory as a one-cluster snapshot. ``slices`` overrides ``body["resourceSlices"]`` (callers
    pass slices already converted to v1). The body's ``node`` is added to the nodes if it is not listed."""
    nodes = [dict(n) for n in body.get("nodes") or []]
    node = body.get("node")
    if isinstance(node, dict):
        if node.get("name") and all(n.get("name") != node["name"] for n in nodes):
            nodes.append({"name": node["name"], "labels": node.get("labels") or {}})
    elif isinstance(node, str) and all(n.get("name") != node for n in nodes):
        nodes.append({"name": node, "labels": {}})
    inv = ClusterInventory(name=cluster, nodes=nodes,
                           resource_slices=list(slices if slices is not None else body.get("resourceSlices") or []),
                           device_taint_rules=list(body.get("deviceTaintRules") or []))
    return FleetSnapshot(clusters=[inv], device_classes=list(body.get("deviceClasses") or []))


def node_name_of(body: dict[str, Any]) -> str | None:
    node = body.get("node")
    if isinstance(node, dict):
        return node.get("name")
    return node
