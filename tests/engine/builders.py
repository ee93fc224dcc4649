"""Small builders of Kubernetes JSON for engine tests (real v1 shapes, no stand-ins)."""
from __future__ import annotations

import copy

from dra.engine import ClaimGroup, ClusterInventory, Engine, FleetSnapshot

DRIVER = "gpu.example.com"


def device_class(name="gpu", expr=f'device.driver == "{DRIVER}"', config=None):
    spec = {"selectors": [{"cel": {"expression": expr}}]}
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def device(name, **attrs):
    d = {"name": name, "attributes": {}}
    for k, v in attrs.items():
        kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "string"
        d["attributes"][k] = {kind: v}
    return d


def node_slice(node, devices, driver=DRIVER, pool=None, name=None, generation=1, count=1, **spec_extra):
    spec = {"driver": driver, "nodeName": node, "devices": copy.deepcopy(devices),
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count}}
    spec.update(spec_extra)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}"}, "spec": spec}


def network_slice(name, devices, pool, selector=None, driver=DRIVER):
    spec = {"driver": driver, "devices": copy.deepcopy(devices),
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}}
    if selector is None:
        spec["allNodes"] = True
    else:
        spec["nodeSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def request(name, cls="gpu", count=1, selectors=(), mode="ExactCount", **extra):
    exact = {"deviceClassName": cls, "allocationMode": mode}
    if mode == "ExactCount":
        exact["count"] = count
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    exact.update(extra)
    return {"name": name, "exactly": exact}


def claim(name, requests, constraints=None, namespace="default", config=None):
    devices = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def cluster(name, nodes: dict[str, list[dict]], classes=(), stale=False, labels=None, extra_slices=(),
            taint_rules=()):
    """``nodes``: node name -> devices local to it (one pool per node)."""
    slices = [node_slice(n, devs) for n, devs in nodes.items() if devs] + list(extra_slices)
    return ClusterInventory(name=name, labels=labels or {}, stale=stale,
                            nodes=[{"name": n, "labels": {"node": n}} for n in nodes], resource_slices=slices,
                            device_classes=list(classes), device_taint_rules=list(taint_rules))


def engine(*clusters, classes=None, allocated=(), **kw):
    return Engine(FleetSnapshot(list(clusters), list(classes if classes is not None else [device_class()])),
                  allocated, **kw)


def group(*claims, **kw):
    return ClaimGroup(list(claims), **kw)


def gpus(n, **attrs):
    return [device(f"gpu-{i}", index=i, **attrs) for i in range(n)]


def picked(outcome):
    """(claim, request, device) triples of a successful outcome."""
    return [(c.name, r["request"], r["device"]) for c in outcome.claims for r in c.allocation["devices"]["results"]]
