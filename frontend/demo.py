"""A demo workload on top of the demo fleet, built only through the services the API uses.

``inventory.demo`` gives the fleet; this adds what makes the dashboard worth looking at: claims in several
namespaces (allocated, shared between consumers, MIG partitions on one GPU, consumable-capacity shares,
pending ones the engine cannot place), a taint rule, a cluster whose agent went silent, a pool still being
published, and utilisation snapshots. Used by the browser tests, ``scripts/screenshots.py`` and the benchmark.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.core.management import call_command
from django.utils import timezone

GPU = "gpu.nvidia.com"
MIG = "mig.nvidia.com"
EXAMPLE = "gpu.example.com"
H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
L4 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'

LAB_CLUSTER = "onprem-lab"
LAB_NODE = "lab-node-01"
STALE_CLUSTER = "azure-westeurope"


def claim(name: str, requests: list[dict], constraints: list[dict] | None = None) -> dict:
    devices: dict = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def request(name: str, device_class: str, count: int = 1, selectors: Sequence[str] = (),
            capacity: dict | None = None) -> dict:
    exactly: dict = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def consumer(name: str, claim_name: str, entry: str = "gpu") -> dict:
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Consumer", "metadata": {"name": name},
            "spec": {"resourceClaims": [{"name": entry, "resourceClaimName": claim_name}]}}


def lab_inventory() -> dict:
    """A small on-prem lab: GPUs shared by capacity (allowMultipleAllocations), and a pool still being published."""
    def shared_gpu(i: int) -> dict:
        return {
            "name": f"gpu-{i}", "allowMultipleAllocations": True,
            "attributes": {"model": {"string": "LATEST-GPU-MODEL"}, "index": {"int": i},
                           "uuid": {"string": f"gpu-lab-{i:04d}"}, "driverVersion": {"version": "1.0.0"}},
            "capacity": {
                "memory": {"value": "80Gi",
                           "requestPolicy": {"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
                "compute": {"value": "100",
                            "requestPolicy": {"default": "10", "validRange": {"min": "1", "step": "1"}}},
            },
        }

    slices = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": f"{LAB_NODE}-gpu.example.com-shared"},
         "spec": {"driver": EXAMPLE, "pool": {"name": LAB_NODE, "generation": 1, "resourceSliceCount": 1},
                  "nodeName": LAB_NODE, "devices": [shared_gpu(0), shared_gpu(1)]}},
        # Pool lab-node-02 announces two slices but only one has arrived: an incomplete pool.
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": "lab-node-02-gpu.example.com-0"},
         "spec": {"driver": EXAMPLE, "pool": {"name": "lab-node-02", "generation": 3, "resourceSliceCount": 2},
                  "nodeName": "lab-node-02", "devices": [shared_gpu(0)]}},
    ]
    nodes = [{"name": LAB_NODE, "labels": {"kubernetes.io/hostname": LAB_NODE}},
             {"name": "lab-node-02", "labels": {"kubernetes.io/hostname": "lab-node-02"}}]
    return {"resourceSlices": slices, "nodes": nodes, "deviceClasses": [], "deviceTaintRules": []}


def load_fleet(nodes: int = 24) -> None:
    call_command("load_demo_fleet", nodes=nodes, verbosity=0, stdout=_Null())


class _Null:
    def write(self, *_):
        pass

    def flush(self):
        pass


def build_workload(*, stale: bool = True) -> dict:
    """Claims, consumers, a taint rule, a lab cluster and a snapshot. Returns names the tests look for."""
    from claims.services.claims import create_claims
    from claims.services.consumers import create_consumer
    from claims.services.utilisation import record_snapshot
    from inventory.models import Cluster, Device, DeviceTaintRule
    from inventory.services.clusters import create_cluster, sweep_stale_clusters
    from inventory.services.fleet import create_fleet_object
    from inventory.services.sync import push_inventory

    if not Cluster.objects.filter(name=LAB_CLUSTER).exists():
        create_cluster(name=LAB_CLUSTER, labels={"provider": "onprem", "region": "eu-central"}, with_token=False)
    push_inventory(LAB_CLUSTER, lab_inventory())

    # A broken H100, kept off by an operator's taint rule (the way the dashboard's "taint" button does it).
    h100 = Device.objects.filter(driver=GPU, **{f"attribute_index__{GPU}/productName": "NVIDIA H100 80GB HBM3"}) \
        .order_by("cluster__name", "node_name", "name").first()
    if h100 is not None and not DeviceTaintRule.objects.filter(name="xid-79-rma").exists():
        create_fleet_object(DeviceTaintRule, {
            "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "xid-79-rma"},
            "spec": {"deviceSelector": {"driver": GPU, "pool": h100.pool_name, "device": h100.name},
                     "taint": {"key": "draservice.io/xid", "value": "79", "effect": "NoSchedule"}}})

    # Each create commits and (no broker) runs an allocation round inline, so claims land in this order.
    create_claims("ml-training", [claim("llama-finetune", [request("gpus", GPU, 8, [H100])])])
    create_claims("ml-training", [claim("bert-eval", [request("gpus", GPU, 2, [H100])])])
    create_claims("inference", [claim("shared-l4", [request("gpu", GPU, 1, [L4])])])
    for i in range(3):
        create_consumer("inference", consumer(f"web-{i}", "shared-l4"))
    profile = 'device.attributes["gpu.nvidia.com"].profile == "{}"'
    create_claims("research", [claim("mig-pair", [request("mig", MIG, 2, [profile.format("1g.10gb")])],
                                     [{"requests": ["mig"], "matchAttribute": "gpu.nvidia.com/parentUUID"}])])
    create_claims("research", [claim("mig-3g", [request("mig", MIG, 1, [profile.format("3g.40gb")])])])
    multi = "device.allowMultipleAllocations == true"
    for name, memory, compute in (("notebook-a", "24Gi", "30"), ("notebook-b", "16Gi", "20")):
        share = {"memory": memory, "compute": compute}
        create_claims("lab", [claim(name, [request("gpu", EXAMPLE, 1, [multi], share)])])
    # Two that cannot be placed: too many GPUs for one node, and a GPU generation the fleet does not have.
    create_claims("ci", [claim("needs-16-h100", [request("gpus", GPU, 16, [H100])])])
    create_claims("ci", [claim("b200-job", [request("gpu", GPU, 1, [
        'device.attributes["gpu.nvidia.com"].architecture == "Blackwell"',
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'])])])

    if stale:
        # The Azure cluster's agent went silent an hour ago (as if its last push was then).
        an_hour_ago = timezone.now() - timedelta(hours=1)
        Cluster.objects.filter(name=STALE_CLUSTER).update(last_sync_at=an_hour_ago, last_heartbeat_at=an_hour_ago)
        sweep_stale_clusters()
    record_snapshot()
    return {
        "mig_node": _node_of("research", "mig-3g"),
        "shared_claim": ("inference", "shared-l4"),
        "pending_claims": [("ci", "needs-16-h100"), ("ci", "b200-job")],
        "lab_node": (LAB_CLUSTER, LAB_NODE),
        "stale_cluster": STALE_CLUSTER if stale else None,
    }


def _node_of(namespace: str, name: str):
    from claims.models import ResourceClaim

    c = ResourceClaim.objects.filter(namespace__name=namespace, name=name).first()
    return (c.cluster, c.node) if c and c.node else None
