"""Where a reservation's resources go: the engine places them, device class selectors, cluster and node
selectors and topology included, as claims of one device class pinned node by node.

Used twice: at create and update, on the current inventory with nothing in use, to tell whether reservations
whose windows overlap all fit at once (``queues.services.reservations``); and from the start of a hold, on an
engine that counts what will still run at the start, to choose the nodes held for the occurrence
(``scheduler.services.reservations``). Only ``devices`` are placed: a resource booked in ``counters`` or
``capacity`` is accepted, counted against nothing here, and said so in the reservation's status.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from claims.placement import clusters_matching
from dra.engine import ClaimGroup
from dra.engine.types import AllocatedDevice
from dra.k8s.fields import V1


@dataclass
class Placed:
    devices: list[AllocatedDevice] = field(default_factory=list)
    nodes: list[tuple[str, str]] = field(default_factory=list)  # in placement order, each once
    short: list[str] = field(default_factory=list)  # "spec.resources[0]: 3 of 8 gpu.nvidia.com devices"

    @property
    def whole(self) -> bool:
        return not self.short


def place(engine, cluster_labels: list[tuple[str, dict]], name: str, spec: dict,
          busy: dict[tuple[str, str], int] | None = None) -> Placed:
    """Place ``spec``'s resources on ``engine`` (its devices stay taken there). ``busy``: (cluster, node) ->
    how much tried there would be taken from running claims; such nodes are tried last."""
    out = Placed()
    for i, resource in enumerate(spec.get("resources") or []):
        want = resource.get("devices")
        if not want:
            continue
        got, nodes = _place_one(engine, cluster_labels, f"{name}-{i}", resource, int(want), busy or {})
        out.devices.extend(got)
        out.nodes.extend(n for n in nodes if n not in out.nodes)
        if len(got) < want:
            out.short.append(f"spec.resources[{i}]: {len(got)} of {want} {resource['deviceClassName']} devices")
    return out


def _candidates(engine, cluster_labels, resource: dict) -> list[list[tuple[object, str]]]:
    """Groups of (cluster model, node name) that may take the resource: one group, or one per value of its
    ``topologyKey`` (all its devices then on one value)."""
    allowed = clusters_matching((resource.get("clusterSelector") or {}).get("matchLabels"), cluster_labels)
    wanted = (resource.get("nodeSelector") or {}).get("matchLabels") or {}
    key = resource.get("topologyKey")
    groups: dict[str, list[tuple[object, str]]] = {}
    for model in engine.clusters.values():
        if allowed is not None and model.name not in allowed:
            continue
        for node_name in model.node_order:
            labels = model.nodes[node_name].labels
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            if key and key not in labels:
                continue
            groups.setdefault(labels.get(key, "") if key else "", []).append((model, node_name))
    return [groups[k] for k in sorted(groups)]


def free_on(engine, model, node_name: str, cls: str) -> int:
    klass = engine.get_class(None, cls)
    if klass is None:
        return 0
    exprs = tuple(((s or {}).get("cel") or {}).get("expression", "")
                  for s in (klass.get("spec") or {}).get("selectors") or [])
    return engine.key_index(engine.selector_set(cls, exprs, ()), model).free_on(node_name)


Where = tuple[str, str]


def _place_one(engine, cluster_labels, key: str, resource: dict, want: int,
               busy: dict[Where, int]) -> tuple[list[AllocatedDevice], list[Where]]:
    """The most of ``want`` devices of one resource: in the first group (topology value) where all fit, else
    the group where the most did (the others' devices are given back to the engine)."""
    best: tuple[list[AllocatedDevice], list[Where]] = ([], [])
    for group in _candidates(engine, cluster_labels, resource):
        got = _fill(engine, key, resource["deviceClassName"], group, want, busy)
        if len(got[0]) > len(best[0]):
            engine.release(best[0])
            best = got
        else:
            engine.release(got[0])
        if len(best[0]) == want:
            break
    return best


def _fill(engine, key: str, cls: str, group, want: int, busy) -> tuple[list[AllocatedDevice], list[Where]]:
    """Node by node (the most free first, then those running the least of what would be taken), as many as
    fit on each: one question per node, then device by device where the engine says no to all at once. Most
    free first: the held devices then make whole nodes where the fleet has them, and a reservation's claims of
    a node's worth of devices find them (a hold spread over half-busy nodes holds the devices and fits none)."""
    ranked = sorted(group, key=lambda mn: (-free_on(engine, mn[0], mn[1], cls), busy.get((mn[0].name, mn[1]), 0),
                                           mn[0].name, mn[1]))
    got: list[AllocatedDevice] = []
    nodes: list[Where] = []
    for model, node_name in ranked:
        before = len(got)
        while len(got) < want:
            count = min(want - len(got), max(1, free_on(engine, model, node_name, cls)))
            outcome = engine.allocate(_group(key, cls, count, model.name, node_name), raise_errors=False)
            if not outcome.allocated and count > 1:
                outcome = engine.allocate(_group(key, cls, 1, model.name, node_name), raise_errors=False)
            if not outcome.allocated:
                break
            got.extend(outcome.devices)
        if len(got) > before:
            nodes.append((model.name, node_name))
        if len(got) >= want:
            break
    return got, nodes


def _group(key: str, cls: str, count: int, cluster: str, node: str) -> ClaimGroup:
    claim = {"apiVersion": V1, "kind": "ResourceClaim",
             "metadata": {"name": f"reservation-{key}", "namespace": "draservice-reservations",
                          "uid": f"reservation-{key}"},
             "spec": {"devices": {"requests": [{"name": "held", "exactly": {
                 "deviceClassName": cls, "allocationMode": "ExactCount", "count": count}}]}}}
    return ClaimGroup(claims=[claim], allowed_clusters=[cluster], node=node, key=f"reservation:{key}")
