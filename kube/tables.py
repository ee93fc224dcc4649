"""``Table`` answers (``meta.k8s.io/v1``) for ``kubectl get``: the server decides the columns, as the API
server does for built-in kinds. Claims show state, cluster, node, devices and age (``-o wide`` adds queue and
reason); other kinds name and age, plus what matters for them."""
from __future__ import annotations

from datetime import UTC, datetime

from kube import workload_tables

TABLE_ACCEPT = "as=Table"


def wants_table(request) -> bool:
    accept = request.headers.get("Accept", "")
    return TABLE_ACCEPT in accept and "g=meta.k8s.io" in accept


def human_age(created: str | None, now: datetime | None = None) -> str:
    """kubectl's short duration (``k8s.io/apimachinery/pkg/util/duration.HumanDuration``, simplified)."""
    if not created:
        return "<unknown>"
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    return f"{hours // 24}d"


def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": "string", "format": fmt, "description": description, "priority": priority}


NAME = _col("Name", "The object's name", fmt="name")
AGE = _col("Age", "Time since creation")


def _devices(obj: dict) -> str:
    results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    names = [r.get("device", "") for r in results]
    text = ",".join(names[:4])
    return text + (f" +{len(names) - 4} more" if len(names) > 4 else "") if names else "<none>"


def _claim_state(status: dict) -> str:
    phase = str(status.get("phase") or "Pending")
    return phase + (",reserved" if status.get("reservedFor") else "")


COLUMNS = {
    "resourceclaims": [NAME, _col("State", "Pending, Allocated, Released or Failed (reserved: a consumer holds it)"),
                       _col("Cluster", "The fleet cluster it is allocated in"),
                       _col("Node", "The node its devices are on"), _col("Devices", "The devices allocated"), AGE,
                       _col("Queue", "The queue it waits or runs in", 1),
                       _col("Position", "Its place in its queue while pending", 1),
                       _col("ETA", "When it may start, estimated from the leases of the running claims", 1),
                       _col("Reason", "Why it is in this state", 1)],
    "queues": [NAME, _col("Nominal", "Devices of each class the queue is guaranteed"),
               _col("Used", "Devices of each class its claims hold"),
               _col("Pending", "Its claims waiting"), AGE,
               _col("Borrowing", "Devices of each class it may borrow beyond nominal", 1)],
    "resourceslices": [NAME, _col("Node", "The node the slice's devices are on"), _col("Driver", "The DRA driver"),
                       _col("Pool", "The resource pool"), _col("Devices", "How many devices the slice lists"), AGE],
    "consumers": [NAME, _col("Phase", "Whether every claim of the consumer is allocated"),
                  _col("Cluster", "Where its claims are"), _col("Node", "The node its claims are on"), AGE],
    "namespaces": [NAME, _col("Status", "The namespace's phase"), AGE],
    "resourcepoolstatusrequests": [NAME, _col("Driver", "The driver asked about"),
                                   _col("Pools", "How many pools matched"),
                                   _col("Available", "Devices free in those pools"), AGE],
    **workload_tables.COLUMNS,
}


def _eta(status: dict) -> str:
    """"in 12m" from status.estimatedStartTime; <unknown> for a pending claim without one."""
    when = status.get("estimatedStartTime")
    if not when:
        return "<unknown>" if str(status.get("phase") or "Pending") == "Pending" else "<none>"
    now = datetime.now(UTC)
    then = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return "now" if then <= now else "in " + human_age(now.strftime("%Y-%m-%dT%H:%M:%SZ"), then)


def _per_class(spec: dict, limit: str) -> str:
    """``gpu.nvidia.com=8,mig.nvidia.com=4`` from the quotas' device limits (``<none>``: none set)."""
    parts = [f"{q.get('deviceClassName')}={(q.get('devices') or {})[limit]}" for q in spec.get("quotas") or []
             if isinstance(q, dict) and limit in (q.get("devices") or {})]
    return ",".join(parts) or "<none>"


def _used(status: dict) -> str:
    parts = [f"{u.get('deviceClassName')}={u.get('used')}" for u in status.get("usage") or []
             if u.get("unit") == "devices"]
    return ",".join(parts) or "0"


def _cells(plural: str, obj: dict) -> list:
    meta, status, spec = obj.get("metadata") or {}, obj.get("status") or {}, obj.get("spec") or {}
    age = human_age(meta.get("creationTimestamp"))
    if plural == "resourceclaims":
        return [meta.get("name"), _claim_state(status), status.get("cluster") or "<none>",
                status.get("node") or "<none>", _devices(obj), age, status.get("queue") or "<none>",
                status.get("positionInQueue") or "<none>", _eta(status), status.get("reason") or ""]
    if plural == "queues":
        return [meta.get("name"), _per_class(spec, "nominal"), _used(status), status.get("pendingClaims", 0), age,
                _per_class(spec, "borrowingLimit")]
    if plural == "resourceslices":
        return [meta.get("name"), spec.get("nodeName") or "<none>", spec.get("driver") or "",
                (spec.get("pool") or {}).get("name") or "", len(spec.get("devices") or []), age]
    if plural == "consumers":
        return [meta.get("name"), status.get("phase") or "", status.get("cluster") or "<none>",
                status.get("node") or "<none>", age]
    if plural == "resourcepoolstatusrequests":
        return [meta.get("name"), spec.get("driver"), status.get("poolCount", 0),
                sum(p.get("availableDevices", 0) for p in status.get("pools") or []), age]
    if plural == "namespaces":
        return [meta.get("name"), status.get("phase") or "Active", age]
    if plural in workload_tables.COLUMNS:
        return workload_tables.cells(plural, obj, age)
    return [meta.get("name"), age]


def _row_object(obj: dict, include: str) -> dict | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata") or {}}


def table(plural: str, objects: list[dict], include: str = "Metadata", list_meta: dict | None = None,
          with_columns: bool = True) -> dict:
    rows = []
    for obj in objects:
        row: dict = {"cells": _cells(plural, obj)}
        embedded = _row_object(obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    out = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(list_meta or {}), "rows": rows}
    out["columnDefinitions"] = COLUMNS.get(plural, [NAME, AGE]) if with_columns else []
    return out
