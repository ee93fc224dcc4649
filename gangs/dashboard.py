"""What the gang pages show: read-only queries, shaped for the templates (no writes here).

The topology drawing is a tree of the cluster's nodes by the gang's levels (zone > rack > block > node), each
node with its devices in use, the gang's members on it, and the gang's domain (or, while pending, the domain
that came closest) marked.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count

from claims.models import DeviceAllocation, Reservation
from gangs.models import Gang, GangEvent, GangPhase
from workloads.models import Gate, Kind, Workload

MAX_DRAWN_NODES = 2000  # beyond this the drawing would not help anyone; the members table still lists them


def gang_list(namespace: str = "", phase: str = "", limit: int = 500) -> dict:
    qs = Gang.objects.select_related("namespace").order_by("-id")
    if namespace:
        qs = qs.filter(namespace__name=namespace)
    if phase:
        qs = qs.filter(phase=phase)
    gangs = list(qs[:limit])
    for g in gangs:
        g.domain_values = list(g.in_level_order(g.domain).values())
    return {"gangs": gangs, "groups": pod_groups(namespace, limit), "phases": [p for p, _ in GangPhase.choices],
            "namespaces": sorted(set(Gang.objects.values_list("namespace__name", flat=True))),
            "f": {"namespace": namespace, "phase": phase}}


def pod_groups(namespace: str = "", limit: int = 500) -> list[dict]:
    """The PodGroups and Workloads users wrote (``workloads``), with their pods and the gang each became, if
    any: a PodGroup is no gang until it has ``minMember`` pods, and the page must not say "no gangs" over it."""
    qs = Workload.objects.filter(kind__in=[Kind.PODGROUP, Kind.WORKLOAD]).select_related("namespace", "gang__namespace")
    if namespace:
        qs = qs.filter(namespace__name=namespace)
    groups = list(qs.order_by("-id")[:limit])
    pods: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    prefixes = {(w.namespace_id, f"{w.kind}/{w.name}") for w in groups}
    for ns_id, group, gate, n in (Workload.objects.filter(kind=Kind.POD, namespace_id__in={p[0] for p in prefixes})
                                  .exclude(group="").values_list("namespace_id", "group", "gate")
                                  .annotate(n=Count("id")).order_by()):
        parts = group.split("/")
        key = (ns_id, "/".join(parts[:2]))
        pods[key][0] += n
        pods[key][1] += n if gate == Gate.POD_GROUP else 0
    out = []
    for w in groups:
        total, waiting = pods.get((w.namespace_id, f"{w.kind}/{w.name}"), (0, 0))
        out.append({"w": w, "pods": total, "waiting": waiting, "min": (w.spec or {}).get("minMember"),
                    "gang": w.gang})
    return out


def gang_detail(namespace: str, name: str) -> dict | None:
    gang = Gang.objects.select_related("namespace").filter(namespace__name=namespace, name=name).first()
    if gang is None:
        return None
    members = list(gang.members.select_related("consumer").order_by("index"))
    claims: dict[int | None, list[str]] = defaultdict(list)  # looked up by a member's consumer_id
    for consumer_id, claim_name in (Reservation.objects.filter(consumer_id__in=[m.consumer_id for m in members])
                                    .order_by("claim_id").values_list("consumer_id", "claim__name")):
        claims[consumer_id].append(claim_name)
    diag = gang.diagnostics or {}
    levels = list((gang.topology or {}).get("levels") or [])
    cluster, mark, mark_kind = gang.cluster, gang.domain, "domain"
    if not cluster and diag.get("closest"):
        cluster, mark, mark_kind = diag["closest"]["cluster"], diag["closest"]["domain"], "closest"
    return {
        "gang": gang,
        "members": [{"m": m, "labels": list(gang.in_level_order(m.labels).values()),
                     "claims": claims.get(m.consumer_id, [])} for m in members],
        "events": list(GangEvent.objects.filter(gang_uid=gang.uid).order_by("-id")[:50]),
        "closest": diag.get("closest"),
        "domains": (diag.get("domains") or [])[:8],
        "stats": diag.get("diagnostics") or {},
        "levels": levels,
        "required": (gang.topology or {}).get("required"),
        "preferred": (gang.topology or {}).get("preferred"),
        "drawing": topology(cluster, levels, mark, mark_kind, gang) if cluster else None,
        "drawn_cluster": cluster,
        "mark_kind": mark_kind,
    }


def topology(cluster: str, levels: list[str], mark: dict, mark_kind: str, gang: Gang) -> dict | None:
    from inventory.models import Device, Node

    nodes = list(Node.objects.filter(cluster__name=cluster).order_by("name").values_list("name", "labels")
                 [:MAX_DRAWN_NODES + 1])
    if not nodes or len(nodes) > MAX_DRAWN_NODES:
        return None
    total = dict(Device.objects.filter(cluster__name=cluster).exclude(node_name="").values("node_name")
                 .annotate(n=Count("id")).values_list("node_name", "n"))
    where = {(d, p, n): node for d, p, n, node in Device.objects.filter(cluster__name=cluster)
             .exclude(node_name="").values_list("driver", "pool_name", "name", "node_name")}
    used: dict[str, int] = defaultdict(int)
    mine: dict[str, int] = defaultdict(int)
    gang_claims = set(Reservation.objects.filter(consumer__gang_member__gang=gang).values_list("claim_id", flat=True))
    seen = set()
    for claim_id, d, p, n in (DeviceAllocation.objects.filter(cluster=cluster, admin_access=False)
                              .values_list("claim_id", "driver", "pool", "device")):
        node = where.get((d, p, n))
        if node is None or (d, p, n) in seen:
            continue
        seen.add((d, p, n))
        used[node] += 1
        if claim_id in gang_claims:
            mine[node] += 1
    members_on: dict[str, list[str]] = defaultdict(list)
    for m in gang.members.filter(cluster=cluster).exclude(node=""):
        members_on[m.node].append(m.name)

    root: dict[str, Any] = {"label": cluster, "children": {}, "nodes": [], "marked": not mark, "depth": 0}
    for name, labels in nodes:
        labels = labels or {}
        box, path = root, {}
        for depth, level in enumerate(levels, start=1):
            value = labels.get(level)
            if value is None:
                break
            path[level] = value
            key = (level, value)
            child = box["children"].get(key)
            if child is None:
                marked = bool(mark) and path == mark  # the domain's own box, not the ones inside it
                child = box["children"][key] = {"label": f"{_short(level)}={value}", "children": {}, "nodes": [],
                                                "marked": marked, "depth": depth}
            box = child
        t = total.get(name, 0)
        box["nodes"].append({"name": name, "total": t, "used": used.get(name, 0), "mine": mine.get(name, 0),
                             "members": members_on.get(name, []),
                             "pct": round(100 * used.get(name, 0) / t) if t else 0})
    return _finish(root, mark_kind)


def _finish(box: dict, mark_kind: str) -> dict:
    children = [_finish(c, mark_kind) for _, c in sorted(box["children"].items())]
    box["children"] = children
    box["members"] = sum(len(n["members"]) for n in box["nodes"]) + sum(c["members"] for c in children)
    box["free"] = sum(n["total"] - n["used"] for n in box["nodes"]) + sum(c["free"] for c in children)
    box["total"] = sum(n["total"] for n in box["nodes"]) + sum(c["total"] for c in children)
    box["mark_kind"] = mark_kind if box["marked"] else ""
    return box


def _short(level: str) -> str:
    """``topology.draservice.io/rack`` -> ``rack``: the drawing has little room; the full key is in the legend."""
    return level.rsplit("/", 1)[-1]
