"""Multi-rack test fleets with real driver shapes (the demo fleet's 8xH100 nodes), as engine snapshots for
the library tests and pushed through the inventory's own services for the integration tests."""
from __future__ import annotations

from inventory import demo

ZONE = "topology.kubernetes.io/zone"
RACK = "topology.draservice.io/rack"
BLOCK = "topology.draservice.io/block"
LEVELS = [ZONE, RACK, BLOCK]

# zone -> rack -> block -> nodes. Racks of different sizes, so that "fits only in one rack" is meaningful:
# rack-a1 has 4 nodes (32 GPUs) in two blocks of 2, rack-a2 has 2, rack-b1 has 3 in one block.
LAYOUT = {
    "zone-a": {"rack-a1": {"block-1": 2, "block-2": 2}, "rack-a2": {"block-3": 2}},
    "zone-b": {"rack-b1": {"block-4": 3}},
}


def nodes(cluster: str = "c1", layout: dict | None = None) -> list[dict]:
    out = []
    for zone, racks in (layout or LAYOUT).items():
        for rack, blocks in racks.items():
            for block, count in blocks.items():
                for i in range(count):
                    name = f"{cluster}-{block}-n{i}"
                    out.append({"name": name, "labels": {"kubernetes.io/hostname": name, ZONE: zone, RACK: rack,
                                                         BLOCK: block}})
    return out


def gpu_slices(node_list: list[dict], node_type: str = "h100") -> list[dict]:
    """The demo node type's NVIDIA GPU slices for each node: for "h100" 8 GPUs with pcieRoot attributes, for
    "a100-mig" 8 A100s partitioned into MIG devices (with their counter set)."""
    out = []
    for n in node_list:
        out += [s for s in demo.node_slices(node_type, n["name"]) if s["spec"]["driver"] == "gpu.nvidia.com"]
    return out


def snapshot(clusters: dict[str, list[dict]] | None = None, stale: set[str] = frozenset(), node_type: str = "h100"):
    from dra.engine import ClusterInventory, FleetSnapshot

    clusters = clusters or {"c1": nodes("c1")}
    return FleetSnapshot([ClusterInventory(name, nodes=ns, resource_slices=gpu_slices(ns, node_type),
                                           stale=name in stale)
                          for name, ns in clusters.items()], demo.standard_device_classes())


def claim_body(name: str, count: int = 8, namespace: str = "team", selectors=(), constraints=None,
               requests=None) -> dict:
    exact = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}
    if selectors:
        exact["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices = {"requests": requests or [{"name": "gpu", "exactly": exact}]}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"devices": devices}}


# ---------------------------------------------------------------------------------------------- database

def load(clusters: dict[str, list[dict]] | None = None) -> None:
    """Push the fleet through the inventory services (the same path an agent's push takes)."""
    from inventory.models import Cluster, DeviceClass
    from inventory.services import clusters as cluster_services
    from inventory.services import fleet as fleet_services
    from inventory.services import sync

    for obj in demo.standard_device_classes():
        if not DeviceClass.objects.filter(cluster=None, name=obj["metadata"]["name"]).exists():
            fleet_services.create_fleet_object(DeviceClass, obj)
    for name, node_list in (clusters or {"c1": nodes("c1")}).items():
        if not Cluster.objects.filter(name=name).exists():
            cluster_services.create_cluster(name=name, labels={"env": name}, with_token=False)
        sync.push_inventory(name, {"resourceSlices": gpu_slices(node_list), "nodes": node_list})


def template_body(name: str = "h100x8", count: int = 8) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count}}]}}}}


def gang_body(name: str, replicas: int, *, template: str = "h100x8", min_member: int | None = None,
              required: str | None = RACK, preferred: str | None = BLOCK, timeout: int | None = None) -> dict:
    spec: dict = {"replicas": replicas, "template": {"resourceClaims": [{"name": "gpus",
                                                                         "resourceClaimTemplateName": template}]}}
    if min_member is not None:
        spec["minMember"] = min_member
    if required or preferred:
        spec["topology"] = {"levels": LEVELS, **({"required": required} if required else {}),
                            **({"preferred": preferred} if preferred else {})}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Gang", "metadata": {"name": name}, "spec": spec}
