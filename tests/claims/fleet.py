"""Build test fleets through the inventory's own services (the same path an agent's push takes)."""
from __future__ import annotations

from inventory import demo
from inventory.models import DeviceClass
from inventory.services import clusters as cluster_services
from inventory.services import fleet as fleet_services
from inventory.services import sync


def load_device_classes() -> None:
    for obj in demo.standard_device_classes():
        if not DeviceClass.objects.filter(cluster=None, name=obj["metadata"]["name"]).exists():
            fleet_services.create_fleet_object(DeviceClass, obj)


def cluster_body(name: str, node_types: list[tuple[str, int]]) -> dict:
    """Nodes named ``<cluster>-<type>-<i>`` with the demo fleet's real slices for each node type."""
    slices, node_list = [], []
    for node_type, count in node_types:
        for i in range(count):
            node = f"{name}-{node_type}-{i:03d}"
            slices += demo.node_slices(node_type, node)
            node_list.append({"name": node, "labels": {"kubernetes.io/hostname": node}})
    return {"resourceSlices": slices, "nodes": node_list}


def load_fleet(plan: dict[str, list[tuple[str, int]]], labels: dict[str, dict] | None = None) -> dict[str, dict]:
    """``{cluster: [(node type, node count), ...]}`` -> pushed; returns the push bodies by cluster."""
    load_device_classes()
    bodies = {}
    for name, node_types in plan.items():
        cluster_services.create_cluster(name=name, labels=(labels or {}).get(name, {"env": name}),
                                        with_token=False)
        bodies[name] = cluster_body(name, node_types)
        sync.push_inventory(name, bodies[name])
    return bodies


def gpu_claim(name: str, count: int = 1, device_class: str = "gpu.nvidia.com", **meta) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, **meta},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class,
                                                                           "count": count}}]}}}


def mig_pair_claim(name: str, profile: str = "1g.10gb") -> dict:
    """Two MIG partitions of one parent GPU: matchAttribute on parentUUID."""
    selector = {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "a", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [selector]}},
                             {"name": "b", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [selector]}}],
                "constraints": [{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]}}}
