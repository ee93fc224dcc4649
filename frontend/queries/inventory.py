"""Inventory listings: ResourceSlices, pools, DeviceClasses, DeviceTaintRules (paginated, filtered in SQL)."""
from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import BooleanField, Count, ExpressionWrapper, Q

from claims.services.figures.accelerators import is_marked
from dra.cel import CELCompileError, compile_expression
from draservice import audit
from frontend.queries.claims import to_yaml
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Pool, PoolEvent, ResourceSlice
from inventory.services.selectors import _evaluate_all, device_groups

PAGE_SIZE = 100


def _page(qs, number):
    paginator = Paginator(qs, PAGE_SIZE)
    return paginator.get_page(number)


def slice_list(get) -> dict:
    f = {k: get.get(k, "").strip() for k in ("cluster", "driver", "pool", "node")}
    qs = ResourceSlice.objects.select_related("cluster")
    if f["cluster"]:
        qs = qs.filter(cluster__name=f["cluster"])
    if f["driver"]:
        qs = qs.filter(driver=f["driver"])
    if f["pool"]:
        qs = qs.filter(pool_name=f["pool"])
    if f["node"]:
        qs = qs.filter(node_name=f["node"])
    # Never load the stored JSON for a listing (it is the bulk of a slice); only ask whether counters exist.
    qs = (qs.annotate(has_counters=ExpressionWrapper(Q(object__spec__has_key="sharedCounters"),
                                                     output_field=BooleanField()))
          .defer("object").order_by("cluster__name", "driver", "pool_name", "name"))
    return {"page": _page(qs, get.get("page", 1)), "f": f,
            "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
            "drivers": sorted(set(Pool.objects.values_list("driver", flat=True).distinct()))}


def slice_detail(cluster: str, name: str) -> dict | None:
    s = ResourceSlice.objects.select_related("cluster").filter(cluster__name=cluster, name=name).first()
    if s is None:
        return None
    pool = Pool.objects.filter(cluster=s.cluster, driver=s.driver, name=s.pool_name).first()
    return {"slice": s, "yaml": to_yaml(s.object), "pool": pool,
            "current": pool is not None and pool.generation == s.pool_generation}


def pool_list(get) -> dict:
    state = get.get("state", "")
    cluster = get.get("cluster", "").strip()
    qs = Pool.objects.select_related("cluster")
    if state in dict(Pool.STATES):
        qs = qs.filter(state=state)
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    counts = {row["state"]: row["n"] for row in Pool.objects.values("state").annotate(n=Count("id"))}
    # Problems first: invalid, then incomplete, then the rest by name.
    qs = qs.order_by("state" if state else "-state", "cluster__name", "driver", "name")
    return {"page": _page(qs, get.get("page", 1)), "state": state, "cluster": cluster, "counts": counts,
            "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
            "events": recent_pool_events(cluster)}


def recent_pool_events(cluster: str = "", limit: int = 20) -> list[PoolEvent]:
    """The newest pool events (e.g. a generation that went backwards), of one cluster or of the fleet."""
    qs = PoolEvent.objects.select_related("cluster")
    if cluster:
        qs = qs.filter(cluster__name=cluster)
    return list(qs.order_by("-id")[:limit])


def _selectors(obj: dict) -> list[str]:
    return [s["cel"]["expression"] for s in ((obj or {}).get("spec") or {}).get("selectors") or []
            if (s.get("cel") or {}).get("expression")]


def deviceclass_list() -> dict:
    classes = list(DeviceClass.objects.select_related("cluster").order_by("name", "cluster__name"))
    for dc in classes:
        dc.selectors = _selectors(dc.object)
        dc.has_config = bool(((dc.object or {}).get("spec") or {}).get("config"))
        dc.accelerator = is_marked(dc.object)
    counts, exhaustive = class_match_counts(classes)
    for dc in classes:
        dc.matches = counts.get(dc.pk)
    return {"classes": classes, "counts_exhaustive": exhaustive}


def class_match_counts(classes: list[DeviceClass]) -> tuple[dict[int, int | None], bool]:
    """DeviceClass id -> devices (current pool generations; a cluster's own class: that cluster's devices) its
    selectors match, None when a selector does not compile. One grouped scan for all classes: devices that agree
    on every value the selectors read are evaluated once (``inventory.services.selectors.device_groups``)."""
    compiled: dict[int, list] = {}
    counts: dict[int, int | None] = {}
    for dc in classes:
        try:
            compiled[dc.pk] = [compile_expression(e) for e in _selectors(dc.object)]
            counts[dc.pk] = 0
        except CELCompileError:
            counts[dc.pk] = None
    groups, state, _ = device_groups([c for cl in compiled.values() for c in cl])
    verdicts: dict[tuple, bool] = {}
    for g in groups:
        for dc in classes:
            if dc.pk not in compiled or (dc.cluster is not None and dc.cluster.name != g.cluster):
                continue
            key = (dc.pk, g.key)
            if key not in verdicts:
                verdicts[key] = _evaluate_all(compiled[dc.pk], g.device)[0]
            if verdicts[key]:
                counts[dc.pk] = (counts[dc.pk] or 0) + g.count
    return counts, state["exhaustive"]


def deviceclass_detail(name: str, cluster: str = "", show_history: bool = False) -> dict | None:
    """A class (the cluster's own, else the fleet-wide one) and, for admins, the fleet-wide class's changes (the
    audit trail records those; a cluster's own classes change with its pushes)."""
    qs = DeviceClass.objects.select_related("cluster").filter(name=name)
    dc = (qs.filter(cluster__name=cluster).first() if cluster else None) or qs.filter(cluster__isnull=True).first() \
        or qs.first()
    if dc is None:
        return None
    overrides = list(qs.exclude(pk=dc.pk).values_list("cluster__name", flat=True))
    changes = audit.events("DeviceClass", name) if show_history and dc.cluster_id is None else []
    return {"dc": dc, "selectors": _selectors(dc.object), "yaml": to_yaml(dc.object), "overrides": overrides,
            "changes": changes}


def taintrule_list() -> dict:
    rules = list(DeviceTaintRule.objects.select_related("cluster").order_by("name"))
    for r in rules:
        spec = (r.object or {}).get("spec") or {}
        r.taint = spec.get("taint") or {}
        r.selector = spec.get("deviceSelector")
        q = Q() if r.cluster_id is None else Q(cluster_id=r.cluster_id)
        if r.driver:
            q &= Q(driver=r.driver)
        if r.pool_name:
            q &= Q(pool_name=r.pool_name)
        if r.device_name:
            q &= Q(name=r.device_name)
        # Rules name at least a driver in practice, so this is an indexed count; no selector selects nothing.
        if r.selector is None:
            r.selected = 0
        elif r.driver or r.pool_name or r.device_name:
            r.selected = Device.objects.filter(q).count()
        else:
            r.selected = None
        r.annotations = ((r.object or {}).get("metadata") or {}).get("annotations") or {}
    return {"rules": rules}
