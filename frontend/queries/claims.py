"""ResourceClaims for people: a filtered list, and one claim with its spec, allocation and audit trail."""
from __future__ import annotations

from dataclasses import dataclass

import yaml
from django.core.paginator import Paginator
from django.db.models import Count, F, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from claims.models import ClaimEvent, DeviceAllocation, Namespace, Phase, Reservation, ResourceClaim
from claims.services.figures.sql import is_postgres
from dra.k8s.fields import V1
from inventory.models import Cluster, DeviceClass
from queues.dashboard import queue_fields

PAGE_SIZE = 50


@dataclass
class ClaimFilters:
    namespace: str = ""
    phase: str = ""
    cluster: str = ""
    device_class: str = ""
    q: str = ""

    @classmethod
    def from_request(cls, get) -> ClaimFilters:
        phase = get.get("phase", "")
        return cls(namespace=get.get("namespace", "").strip(), phase=phase if phase in Phase.values else "",
                   cluster=get.get("cluster", "").strip(), device_class=get.get("class", "").strip(),
                   q=get.get("q", "").strip())

    @property
    def active(self) -> bool:
        return any((self.namespace, self.phase, self.cluster, self.device_class, self.q))


def _class_filter(name: str) -> Q:
    """Claims with a request (or a firstAvailable subrequest) for this DeviceClass."""
    if is_postgres():
        # jsonb containment, one index-friendly predicate per place a class name can appear.
        return (Q(spec__contains={"devices": {"requests": [{"exactly": {"deviceClassName": name}}]}})
                | Q(spec__contains={"devices": {"requests": [{"firstAvailable": [{"deviceClassName": name}]}]}}))
    # SQLite (embedded default) has no JSON containment: match the serialized text instead.
    return Q(spec_text__contains=f'"deviceClassName": "{name}"')


def claim_list(filters: ClaimFilters, page: int = 1) -> dict:
    qs = ResourceClaim.objects.select_related("namespace")
    if filters.namespace:
        qs = qs.filter(namespace__name=filters.namespace)
    if filters.phase:
        qs = qs.filter(phase=filters.phase)
    if filters.cluster:
        qs = qs.filter(cluster=filters.cluster)
    if filters.device_class:
        if not is_postgres():
            qs = qs.annotate(spec_text=Cast("spec", TextField()))
        qs = qs.filter(_class_filter(filters.device_class))
    if filters.q:
        qs = qs.filter(name__icontains=filters.q)
    qs = qs.annotate(device_count=Count("device_allocations", distinct=True)).order_by("-id")
    paginator = Paginator(qs.only("id", "name", "phase", "reason", "message", "cluster", "node", "spec", "created_at",
                                  "allocated_at", "released_at", "namespace__name"), PAGE_SIZE)
    page_obj = paginator.get_page(page)
    now = timezone.now()
    for c in page_obj.object_list:
        c.classes = sorted(_request_classes(c.spec))
        c.count = claim_size(c.spec)
        c.waited = ((c.allocated_at or now) - c.created_at) if c.created_at else None
    queues = queue_fields(list(page_obj.object_list))
    for c in page_obj.object_list:
        c.queue = queues.get(c.id)
    return {"page": page_obj, "paginator": paginator}


def filter_choices() -> dict:
    """Values for the filter drop-downs (small tables, or DISTINCT over an indexed column)."""
    return {
        "namespaces": list(Namespace.objects.order_by("name").values_list("name", flat=True)),
        "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        "classes": sorted(set(DeviceClass.objects.values_list("name", flat=True))),
        "phases": Phase.values,
    }


def _request_classes(spec: dict) -> set[str]:
    out = set()
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        if (req.get("exactly") or {}).get("deviceClassName"):
            out.add(req["exactly"]["deviceClassName"])
        for sub in req.get("firstAvailable") or []:
            if sub.get("deviceClassName"):
                out.add(sub["deviceClassName"])
    return out


def claim_size(spec: dict) -> int | None:
    """Devices the claim asks for (first alternative of a firstAvailable); None for allocationMode All."""
    total = 0
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        body = req.get("exactly") or ((req.get("firstAvailable") or [None])[0]) or {}
        if body.get("allocationMode") == "All":
            return None
        total += int(body.get("count") or 1)
    return total


def claim_object(claim: ResourceClaim) -> dict:
    """The claim as Kubernetes would show it (v1 shape), for the YAML panel."""
    meta = {"name": claim.name, "namespace": claim.namespace.name, "uid": str(claim.uid),
            "resourceVersion": str(claim.resource_version),
            "creationTimestamp": claim.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if claim.created_at else None}
    if claim.labels:
        meta["labels"] = claim.labels
    if claim.annotations:
        meta["annotations"] = claim.annotations
    return {"apiVersion": V1, "kind": "ResourceClaim", "metadata": meta, "spec": claim.spec}


def to_yaml(obj) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)


def _removed_devices(claim, events) -> set[str]:
    """Devices named by the last DeviceRemoved event while the condition holds (claims.services.device_removed)."""
    if claim.device_removed_at is None:
        return set()
    last = next((e for e in reversed(events) if e.type == "DeviceRemoved"), None)
    return set(((last.data or {}).get("devices") or []) if last else [])


def claim_detail(namespace: str, name: str) -> dict | None:
    claim = ResourceClaim.objects.select_related("namespace").filter(namespace__name=namespace, name=name).first()
    if claim is None:
        return None
    allocations = list(DeviceAllocation.objects.filter(claim=claim).order_by("id"))
    consumers = list(Reservation.objects.filter(claim=claim).select_related("consumer").order_by("id"))
    events = list(ClaimEvent.objects.filter(Q(claim=claim) | Q(claim_uid=claim.uid)).order_by("id")[:500])
    # Who else holds the devices this claim holds (a shared device).
    co_holders: dict[tuple[str, str, str, str], list[DeviceAllocation]] = {}
    if allocations:
        q = Q()
        for a in allocations:
            q |= Q(cluster=a.cluster, driver=a.driver, pool=a.pool, device=a.device)
        for other in (DeviceAllocation.objects.filter(q).exclude(claim=claim).select_related("claim__namespace")
                      .annotate(ns=F("claim__namespace__name"), claim_name=F("claim__name"))):
            co_holders.setdefault((other.cluster, other.driver, other.pool, other.device), []).append(other)
    removed = _removed_devices(claim, events)
    for a in allocations:
        a.others = co_holders.get((a.cluster, a.driver, a.pool, a.device), [])
        a.removed = f"{a.driver}/{a.pool}/{a.device}" in removed
    return {
        "claim": claim,
        "device_removed": next((c for c in claim.conditions or [] if c.get("type") == "DeviceRemoved"
                                and c.get("status") == "True"), None),
        "yaml": to_yaml(claim_object(claim)),
        "allocation_yaml": to_yaml(claim.allocation) if claim.allocation else "",
        "allocations": allocations,
        "consumers": consumers,
        "events": events,
        "size": claim_size(claim.spec),
        "classes": sorted(_request_classes(claim.spec)),
        "queue": queue_fields([claim]).get(claim.id),
        # The last preemption notice (status.preemption), counting down while the claim still holds its devices.
        "preemption": claim.preemption,
        "releasing": bool(claim.preemption) and claim.phase == "Allocated" and any(
            c.get("type") == "Releasing" and c.get("status") == "True" for c in claim.conditions or []),
    }
