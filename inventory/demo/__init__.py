"""The demo fleet: realistic NVIDIA/AMD/Intel nodes, scaled to N nodes over several clusters.

``slices.json`` holds the shapes of real driver output (see its provenance in the shared fixtures'
README): one or more ResourceSlices per node type. ``deviceclasses.json`` holds the drivers' standard
DeviceClasses with their real selectors. The generator copies a node type's slices under a new node
name, with fresh (deterministic) UUIDs, so every generated device is unique while keeping real shapes.
Everything is deterministic: the same arguments give the same fleet, so loading it twice changes nothing.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).resolve().parent
_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NAMESPACE = uuid.UUID("6f1c1f4e-8c1e-4a53-9d1a-3a7f0e9d2b10")
DEMO_LABEL = "draservice.io/demo"

# Node types: the node name used in slices.json and what a node of that type looks like.
NODE_TYPES = {
    "h100": {"template": "h100-hgx-node-01", "instance": "p5.48xlarge", "product": "NVIDIA-H100-80GB-HBM3"},
    "a100-mig": {"template": "a100-dgx-node-01", "instance": "dgx-a100", "product": "NVIDIA-A100-SXM4-80GB"},
    "l4": {"template": "gke-l4-pool-node-01", "instance": "g2-standard-48", "product": "NVIDIA-L4"},
    "mi300x": {"template": "mi300x-node-01", "instance": "Standard_ND96isr_MI300X_v5", "product": "MI300X"},
    "mi300x-dpx": {"template": "gpu-operator-2", "instance": "Standard_ND96isr_MI300X_v5", "product": "MI300X"},
    "intel": {"template": "rpl-s", "instance": "workstation-b60", "product": "Arc-Pro-B60"},
    "example": {"template": "dra-example-driver-cluster-worker", "instance": "kind-worker", "product": "example"},
}


@dataclass(frozen=True)
class ClusterPlan:
    name: str
    labels: dict
    zones: tuple[str, ...]
    mix: tuple[tuple[str, int], ...]  # (node type, weight)
    share: int  # relative share of the fleet's nodes


CLUSTERS = (
    ClusterPlan("aws-us-east-1", {"provider": "aws", "region": "us-east-1"},
                ("us-east-1a", "us-east-1b", "us-east-1c"), (("h100", 3), ("l4", 1)), 4),
    ClusterPlan("gcp-europe-west4", {"provider": "gcp", "region": "europe-west4"},
                ("europe-west4-a", "europe-west4-b"), (("l4", 3), ("a100-mig", 1)), 3),
    ClusterPlan("azure-westeurope", {"provider": "azure", "region": "westeurope"},
                ("westeurope-1", "westeurope-2"), (("mi300x", 3), ("mi300x-dpx", 1)), 2),
    ClusterPlan("onprem-fra1", {"provider": "onprem", "region": "eu-central"},
                ("fra1-hall-a",), (("h100", 2), ("a100-mig", 1), ("intel", 1), ("example", 1)), 1),
)


@dataclass
class ClusterInventoryBody:
    name: str
    labels: dict
    body: dict = field(default_factory=dict)  # the PUT /clusters/{name}/inventory body

    @property
    def device_count(self) -> int:
        return sum(len(s["spec"].get("devices") or ()) for s in self.body["resourceSlices"])


@lru_cache(maxsize=1)
def template_slices() -> dict[str, list[dict]]:
    """Node name in slices.json -> its slices."""
    by_node: dict[str, list[dict]] = {}
    for obj in json.loads((DATA / "slices.json").read_text()):
        by_node.setdefault(obj["spec"]["nodeName"], []).append(obj)
    return by_node


def standard_device_classes() -> list[dict]:
    return json.loads((DATA / "deviceclasses.json").read_text())


def node_slices(node_type: str, node_name: str) -> list[dict]:
    """The slices of one node of ``node_type``, renamed to ``node_name``, with UUIDs of its own."""
    template = NODE_TYPES[node_type]["template"]
    text = json.dumps(template_slices()[template]).replace(template, node_name)
    text = _UUID.sub(lambda m: "GPU-" + str(uuid.uuid5(NAMESPACE, f"{node_name}/{m.group(0)}")), text)
    return json.loads(text)


def node_labels(plan: ClusterPlan, node_type: str, node_name: str, index: int) -> dict:
    info = NODE_TYPES[node_type]
    return {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/region": plan.labels["region"],
        "topology.kubernetes.io/zone": plan.zones[index % len(plan.zones)],
        "topology.draservice.io/rack": f"rack-{index // 8:03d}",
        "node.kubernetes.io/instance-type": info["instance"],
        "draservice.io/accelerator": info["product"],
    }


def _split(total: int, weights: list[int]) -> list[int]:
    """Largest-remainder split of ``total`` by ``weights`` (every part gets at least one when possible)."""
    raw = [total * w / sum(weights) for w in weights]
    parts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - parts[i], reverse=True)[: total - sum(parts)]:
        parts[i] += 1
    return parts


def generate_fleet(nodes: int) -> list[ClusterInventoryBody]:
    """``nodes`` nodes over the demo clusters (fewer clusters when there are fewer nodes than clusters)."""
    plans = list(CLUSTERS)[: max(1, min(len(CLUSTERS), nodes))]
    counts = _split(nodes, [p.share for p in plans])
    fleet = []
    for plan, count in zip(plans, counts, strict=False):
        types = _split(count, [w for _, w in plan.mix])
        order = [t for (t, _), n in zip(plan.mix, types, strict=False) for _ in range(n)]
        slices, node_list = [], []
        prefix = plan.name.split("-")[0]
        for index, node_type in enumerate(order):
            node_name = f"{prefix}-{node_type}-{index:05d}"
            slices += node_slices(node_type, node_name)
            node_list.append({"name": node_name, "labels": node_labels(plan, node_type, node_name, index)})
        fleet.append(ClusterInventoryBody(
            name=plan.name, labels={**plan.labels, DEMO_LABEL: "true"},
            body={"resourceSlices": slices, "nodes": node_list, "deviceClasses": [], "deviceTaintRules": []},
        ))
    return fleet


def synthetic_cluster(nodes: int = 5000, node_type: str = "h100", gpu_slices_only: bool = True) -> dict:
    """One big cluster's push body for benchmarks: ``nodes`` nodes of one type (8 GPUs each for h100)."""
    plan = CLUSTERS[0]
    slices, node_list = [], []
    for index in range(nodes):
        node_name = f"bench-{node_type}-{index:05d}"
        for obj in node_slices(node_type, node_name):
            if not gpu_slices_only or obj["spec"]["driver"].startswith("gpu."):
                slices.append(obj)
        node_list.append({"name": node_name, "labels": node_labels(plan, node_type, node_name, index)})
    return {"resourceSlices": slices, "nodes": node_list, "deviceClasses": [], "deviceTaintRules": []}
