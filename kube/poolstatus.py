"""Answering a ResourcePoolStatusRequest: the fleet's pools of one driver (optionally one pool), with how many
devices each has, how many claims hold, how many are unavailable (tainted NoSchedule/NoExecute, an invalid
pool, or a stale cluster) and how many are left. One aggregate query per table, bounded by ``limit`` pools.

Pool names carry their cluster (``<cluster>.<pool>``) as the door's other fleet objects do.
"""
from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from claims.models import DeviceAllocation
from claims.services import caps
from draservice.problems import FieldError
from inventory.models import Cluster, Device, Pool
from kube.models import ResourcePoolStatusRequest

API_VERSION = "resource.k8s.io/v1alpha3"
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
RETENTION = timedelta(hours=24)
_DRIVER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
BLOCKING = ("NoSchedule", "NoExecute")


def check_spec(spec) -> dict:
    if not isinstance(spec, dict):
        raise FieldError([("spec", "Required value")])
    errors = []
    driver = spec.get("driver")
    if not isinstance(driver, str) or not driver:
        errors.append(("spec.driver", "Required value"))
    elif len(driver) > 63 or not _DRIVER.match(driver):
        errors.append(("spec.driver", f'Invalid value: "{driver}": a lowercase RFC 1123 subdomain of at most 63 '
                                      "characters"))
    pool = spec.get("poolName")
    if pool is not None and (not isinstance(pool, str) or not pool or len(pool) > 253):
        errors.append(("spec.poolName", "Invalid value: must be a non-empty pool name of at most 253 characters"))
    limit = spec.get("limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        errors.append(("spec.limit", f"Invalid value: {limit!r}: must be between 1 and {MAX_LIMIT}, inclusive"))
    unknown = sorted(set(spec) - {"driver", "poolName", "limit"})
    errors += [(f"spec.{k}", "unknown field") for k in unknown]
    if errors:
        raise FieldError(errors)
    return {"driver": driver, **({"poolName": pool} if pool else {}), "limit": limit}


def _pools(spec: dict):
    pools = Pool.objects.select_related("cluster").filter(driver=spec["driver"]).order_by("cluster__name", "name")
    if spec.get("poolName"):
        cluster, _, name = spec["poolName"].partition(".")
        pools = pools.filter(cluster__name=cluster, name=name) if name else pools.none()
    return list(pools[:spec["limit"] + 1])


def compute_status(spec: dict) -> dict:
    pools = _pools(spec)
    more = len(pools) > spec["limit"]
    pools = pools[:spec["limit"]]
    stale = {c.pk for c in Cluster.objects.filter(pk__in={p.cluster_id for p in pools}) if c.is_stale()}
    keys = Q()
    for p in pools:
        keys |= Q(cluster_id=p.cluster_id, pool_name=p.name, pool_generation=p.generation)
    devices: dict = defaultdict(lambda: {"total": 0, "tainted": set(), "nodes": set()})
    if pools:
        for cluster_id, pool, name, node, taints in (Device.objects.filter(keys, driver=spec["driver"])
                                                     .values_list("cluster_id", "pool_name", "name", "node_name",
                                                                  "taints")):
            entry = devices[(cluster_id, pool)]
            entry["total"] += 1
            entry["nodes"].add(node)
            if any((t or {}).get("effect") in BLOCKING for t in taints or []):
                entry["tainted"].add(name)
    held: dict = defaultdict(set)
    if pools:
        names = {p.cluster_id: p.cluster.name for p in pools}
        for cluster, pool, device in (DeviceAllocation.objects.filter(
                cluster__in=set(names.values()), driver=spec["driver"], pool__in={p.name for p in pools},
                admin_access=False).values_list("cluster", "pool", "device").distinct()):
            held[(cluster, pool)].add(device)
    out = []
    for p in pools:
        entry = devices[(p.cluster_id, p.name)]
        allocated = held[(p.cluster.name, p.name)]
        total = entry["total"]
        if p.cluster_id in stale or p.state == Pool.INVALID:
            unavailable = total - len(allocated)
        else:
            unavailable = len(entry["tainted"] - allocated)
        row = {"driver": p.driver, "poolName": f"{p.cluster.name}.{p.name}", "generation": p.generation,
               "resourceSliceCount": p.resource_slice_count, "totalDevices": total,
               "allocatedDevices": len(allocated), "availableDevices": max(0, total - len(allocated) - unavailable),
               "unavailableDevices": unavailable}
        nodes = entry["nodes"] - {""}
        if len(nodes) == 1:
            row["nodeName"] = next(iter(nodes))
        if p.state == Pool.INVALID and p.reason:
            row["validationError"] = p.reason
        out.append(row)
    status = {"poolCount": len(out), "pools": out}
    if more:
        status["truncated"] = True  # more pools match than spec.limit
    return status


def create(obj: dict, owner: str = "") -> ResourcePoolStatusRequest:
    """Answer and keep the request; ``owner`` is whom it counts against (``claims.services.caps``)."""
    meta: dict = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not _DRIVER.match(name or "") or len(name) > 253:
        raise FieldError([("metadata.name", "Required value: a lowercase RFC 1123 subdomain")])
    spec = check_spec(obj.get("spec"))
    # Before the fleet-wide queries the answer costs.
    caps.check_pool_status_requests(owner, ResourcePoolStatusRequest.objects.filter(owner=owner))
    status = compute_status(spec)
    with transaction.atomic():
        if ResourcePoolStatusRequest.objects.filter(name=name).exists():
            raise FieldError([("metadata.name", f'resourcepoolstatusrequests "{name}" already exists')],
                             status_code=409)
        return ResourcePoolStatusRequest.objects.create(name=name, spec=spec, status=status,
                                                        labels=meta.get("labels") or {}, owner=owner)


def count_of_namespace(namespace: str) -> int:
    """The requests that count against a namespace's ``resourcepoolstatusrequests`` cap (its tokens')."""
    return ResourcePoolStatusRequest.objects.filter(owner=f"ns:{namespace}").count()


def purge(now=None) -> int:
    cutoff = (now or timezone.now()) - RETENTION
    return ResourcePoolStatusRequest.objects.filter(created_at__lt=cutoff).delete()[0]



