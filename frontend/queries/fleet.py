"""Fleet overview and per-cluster summaries: a handful of GROUP BY queries, whatever the fleet's size."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Min
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from frontend.queries.sql import T_ALLOC, T_CLUSTER, T_RESERVATION, T_TAINTRULE, fetch_dicts
from frontend.queries.units import STATE_SQL, units_sql
from inventory.models import Cluster, Device


@dataclass
class Tally:
    """Units in each exclusive state. ``allocated`` includes ``shared``; ``stale`` are free units of stale
    clusters (not offered for new claims); ``invalid`` free units of invalid pools."""

    total: int = 0
    allocated_only: int = 0
    shared: int = 0
    tainted: int = 0
    stale: int = 0
    invalid: int = 0
    free: int = 0
    partitioned: int = 0

    def add_row(self, row: dict, stale_cluster: bool) -> None:
        self.total += row["total"] or 0
        self.allocated_only += row["allocated_only"] or 0
        self.shared += row["shared"] or 0
        self.tainted += row["tainted"] or 0
        self.partitioned += row["partitioned"] or 0
        if stale_cluster:  # nothing on a stale cluster is offered, whatever its own state
            self.stale += (row["free"] or 0) + (row["invalid"] or 0)
        else:
            self.invalid += row["invalid"] or 0
            self.free += row["free"] or 0

    @property
    def allocated(self) -> int:
        return self.allocated_only + self.shared

    @property
    def unavailable(self) -> int:
        return self.stale + self.invalid

    @property
    def utilisation(self) -> int:
        return int(round(100 * self.allocated / self.total)) if self.total else 0

    @property
    def segments(self) -> list[tuple[str, int, str]]:
        """(css class, count, label) for a stacked bar."""
        return [("alloc", self.allocated_only, "allocated"), ("shared", self.shared, "shared"),
                ("taint", self.tainted, "tainted"), ("stale", self.unavailable, "stale / invalid pool"),
                ("free", self.free, "free")]


@dataclass
class Group:
    key: str
    label: str
    tally: Tally = field(default_factory=Tally)
    extra: dict = field(default_factory=dict)


_published: dict[tuple, dict[int, int]] = {}


def published_devices() -> dict[int, int]:
    """Devices per cluster id as the API's ``deviceCount`` counts them: rows in the ResourceSlices. Remembered
    per fleet state like the overview's aggregate (an inventory push moves the key), so polling does not
    count the device table again."""
    key = fleet_state_key()
    counts = _published.get(key)
    if counts is None:
        counts = dict(Device.objects.order_by().values("cluster_id").annotate(n=Count("id"))
                      .values_list("cluster_id", "n"))
        _published.clear()
        _published[key] = counts
    return counts


def cluster_freshness(now: datetime | None = None, *, published: bool = False) -> list[Cluster]:
    """All clusters with ``stale_now``, ``last_seen`` and ``node_count`` set (and ``devices_published``)."""
    now = now or timezone.now()
    clusters = list(Cluster.objects.annotate(node_count=Count("nodes")).order_by("name"))
    counts = published_devices() if published else {}
    for c in clusters:
        c.stale_now = c.is_stale(now)
        c.last_seen = c.last_seen_at
        c.devices_published = counts.get(c.id, 0)
    return clusters


# The overview's unit aggregate, remembered per fleet state (``fleet_state_key``): a dashboard polled every
# few seconds by many people costs one cheap key query per poll, not a scan of every device.
_overview_rows: dict[tuple, list[dict]] = {}


def fleet_state_key() -> tuple:
    """Changes whenever anything the unit aggregate reads changes: allocation and reservation rows (inserted
    and deleted, never updated in place), every cluster's inventory (its ``inventory_version`` moves with each
    push: devices, pools, taints on devices) and the DeviceTaintRules (``resource_version`` moves with each
    write). Ids come from sequences and are never reused, so a row deleted and another added changes the key
    too. A few cheap aggregates instead of the device scan."""
    row = fetch_dicts(f"""SELECT
        (SELECT COALESCE(MAX(id), 0) FROM {T_ALLOC}) AS alloc_max, (SELECT COUNT(*) FROM {T_ALLOC}) AS alloc_n,
        (SELECT COALESCE(MAX(id), 0) FROM {T_RESERVATION}) AS res_max,
        (SELECT COUNT(*) FROM {T_RESERVATION}) AS res_n,
        (SELECT COALESCE(SUM(inventory_version), 0) FROM {T_CLUSTER}) AS inv,
        (SELECT COUNT(*) FROM {T_CLUSTER}) AS clusters, (SELECT COALESCE(MAX(id), 0) FROM {T_CLUSTER}) AS cl_max,
        (SELECT COALESCE(SUM(resource_version), 0) FROM {T_TAINTRULE}) AS rules_rv,
        (SELECT COUNT(*) FROM {T_TAINTRULE}) AS rules_n,
        (SELECT COALESCE(MAX(id), 0) FROM {T_TAINTRULE}) AS rules_max""", [])[0]
    return tuple(row.values())


def overview_rows() -> list[dict]:
    key = fleet_state_key()
    rows = _overview_rows.get(key)
    if rows is None:
        rows = _tally_rows("u.cluster_id, u.driver, u.product")
        _overview_rows.clear()
        _overview_rows[key] = rows
    return rows


def _tally_rows(group_by: str, where: str = "", params: list | None = None) -> list[dict]:
    units, unit_params = units_sql(where, params or [])
    return fetch_dicts(f"SELECT {group_by}, {STATE_SQL} FROM ({units}) u GROUP BY {group_by}", unit_params,
                       analytic=True)


def pending_summary() -> dict:
    agg = ResourceClaim.objects.filter(phase=Phase.PENDING).aggregate(count=Count("id"), oldest=Min("created_at"))
    oldest = None
    if agg["count"]:
        oldest = (ResourceClaim.objects.filter(phase=Phase.PENDING).select_related("namespace")
                  .order_by("created_at", "id").first())
    return {"count": agg["count"], "oldest_at": agg["oldest"], "oldest": oldest}


def claim_phase_counts() -> dict[str, int]:
    counts = {p.value: 0 for p in Phase}
    for row in ResourceClaim.objects.values("phase").annotate(n=Count("id")):
        counts[row["phase"]] = row["n"]
    return counts


def fleet_overview(now: datetime | None = None) -> dict:
    """Everything the overview page shows, from one unit aggregate plus a few small queries."""
    clusters = cluster_freshness(now, published=True)
    stale_ids = {c.id for c in clusters if c.stale_now}
    rows = overview_rows()

    totals = Tally()
    by_cluster = {c.id: Group(c.name, c.name, extra={"cluster": c}) for c in clusters}
    by_product: dict[tuple, Group] = {}
    by_driver: dict[str, Group] = {}
    for row in rows:
        stale = row["cluster_id"] in stale_ids
        totals.add_row(row, stale)
        by_cluster[row["cluster_id"]].tally.add_row(row, stale)
        pkey = (row["product"] or "", row["driver"])
        by_product.setdefault(pkey, Group(pkey[0], pkey[0] or "(no product name)",
                                          extra={"driver": row["driver"]})).tally.add_row(row, stale)
        by_driver.setdefault(row["driver"], Group(row["driver"], row["driver"])).tally.add_row(row, stale)

    def ordered(groups):
        return sorted(groups, key=lambda g: (-g.tally.total, g.label))

    return {
        "totals": totals,
        "by_cluster": [by_cluster[c.id] for c in clusters],
        "by_product": ordered(by_product.values()),
        "by_driver": ordered(by_driver.values()),
        "stale_clusters": [c for c in clusters if c.stale_now],
        "devices_published": sum(c.devices_published for c in clusters),
        "clusters": clusters,
        "pending": pending_summary(),
        "phases": claim_phase_counts(),
    }


def cluster_detail(cluster: Cluster, *, search: str = "", offset: int = 0, limit: int = 200) -> dict:
    """Per-node and per-product tallies for one cluster from one GROUP BY (node, driver, product); nodes are
    ordered by name and paginated in Python over the already-aggregated rows (a few thousand small rows)."""
    where, params = "d.cluster_id = %s", [cluster.id]
    if search:
        where += " AND d.node_name LIKE %s"
        params.append(f"%{search}%")
    rows = _tally_rows("u.node_name, u.driver, u.product", where, params)
    stale = cluster.is_stale()
    nodes: dict[str, Group] = {}
    products: dict[tuple, Group] = {}
    totals = Tally()
    for row in rows:
        name = row["node_name"] or ""
        nodes.setdefault(name, Group(name, name or "(not node-local)")).tally.add_row(row, stale)
        key = (row["product"] or "", row["driver"])
        products.setdefault(key, Group(key[0], key[0] or "(no product name)", extra={"driver": key[1]})) \
            .tally.add_row(row, stale)
        totals.add_row(row, stale)
    ordered = [nodes[n] for n in sorted(nodes)]
    return {"nodes": ordered[offset:offset + limit], "node_total": len(ordered), "totals": totals,
            "products": sorted(products.values(), key=lambda g: (-g.tally.total, g.label))}
