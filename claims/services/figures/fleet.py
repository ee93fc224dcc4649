"""Fleet overview and per-cluster summaries: a handful of GROUP BY queries, whatever the fleet's size; the
overview's are remembered or maintained per fleet state, so polling it costs one key query."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Sum
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services.figures.accelerators import four_states
from claims.services.figures.claim_tally import ClaimTally
from claims.services.figures.fleet_tally import FleetTally, StateKey
from claims.services.figures.sql import T_ALLOC, T_CLUSTER, T_RESERVATION, T_TAINTRULE, fetch_dicts
from claims.services.figures.units import STATE_SQL, units_sql
from draservice.models import Change, ChangeLogState
from inventory.models import Cluster, DeviceClass, Node, ResourceSlice

T_CHANGE = Change._meta.db_table
T_CLASS = DeviceClass._meta.db_table
T_CHANGELOG = ChangeLogState._meta.db_table


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
    partial: int = 0  # held partitioned units (part of allocated_only and shared)

    def add_row(self, row: dict, stale_cluster: bool) -> None:
        self.total += row["total"] or 0
        self.allocated_only += row["allocated_only"] or 0
        self.shared += row["shared"] or 0
        self.tainted += row["tainted"] or 0
        self.partitioned += row["partitioned"] or 0
        self.partial += row.get("partial") or 0
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
    def allocated_full(self) -> int:
        return self.states["allocated"]

    @property
    def unavailable_all(self) -> int:
        return self.states["unavailable"]

    @property
    def states(self) -> dict[str, int]:
        """The four exclusive states every count of accelerators uses (``claims.services.figures.accelerators``)."""
        return four_states(self)

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


# Remembered per inventory version (``FleetState.inventory``): what only a push, a node write or a cluster
# registration changes. The clusters' own rows (heartbeats, staleness) are read on every request.
_per_inventory: dict[tuple, dict[str, dict[int, int]]] = {}


def _inventory_counts(state: FleetState) -> dict[str, dict[int, int]]:
    counts = _per_inventory.get(state.inventory)
    if counts is None:
        counts = {
            # A slice's devices are written with it, as many as its device_count: summing the slices' counts
            # gives the device rows per cluster without reading the wide device table.
            "devices": dict(ResourceSlice.objects.order_by().values("cluster_id").annotate(n=Sum("device_count"))
                            .values_list("cluster_id", "n")),
            "nodes": dict(Node.objects.order_by().values("cluster_id").annotate(n=Count("id"))
                          .values_list("cluster_id", "n")),
        }
        _per_inventory.clear()
        _per_inventory[state.inventory] = counts
    return counts


def published_devices(state: FleetState | None = None) -> dict[int, int]:
    """Devices per cluster id as the API's ``deviceCount`` counts them: rows in the ResourceSlices. Remembered
    per inventory version, so polling does not count the device table again."""
    return _inventory_counts(state or fleet_state())["devices"]


def cluster_freshness(now: datetime | None = None, *, published: bool = False,
                      state: FleetState | None = None) -> list[Cluster]:
    """All clusters with ``stale_now``, ``last_seen`` and ``node_count`` set (and ``devices_published``)."""
    now = now or timezone.now()
    counts = _inventory_counts(state or fleet_state())
    clusters = list(Cluster.objects.order_by("name"))
    for c in clusters:
        c.stale_now = c.is_stale(now)
        c.last_seen = c.last_seen_at
        c.node_count = counts["nodes"].get(c.id, 0)
        c.devices_published = counts["devices"].get(c.id, 0) if published else 0
    return clusters


@dataclass(frozen=True)
class FleetState:
    """A few cheap aggregates that move whenever what the overview counts moves.

    Allocation and reservation rows are inserted and deleted, never updated in place; their ids come from
    sequences and are never reused, so (count, max id, sum of ids) changes with any insert or delete,
    including a late-committed row below the max. Every cluster's ``inventory_version`` moves with each push
    and node write (devices, pools, taints on devices, nodes), DeviceTaintRules' ``resource_version`` with each
    write; DeviceClasses' likewise (a class marked as an accelerator changes what is counted: see
    ``accelerators``). Claims (phases, the oldest pending) move the change log (``claim_tally``: its
    highest seq, settled seq and compaction point)."""

    allocations: tuple
    reservations: tuple
    inventory: tuple
    claims: tuple

    def tally_key(self) -> StateKey:
        return StateKey(self.allocations, self.reservations, inventory=self.inventory[:3], rules=self.inventory[3:])


def fleet_state() -> FleetState:
    row = fetch_dicts(f"""SELECT
        (SELECT COALESCE(MAX(id), 0) FROM {T_ALLOC}) AS alloc_max, (SELECT COUNT(*) FROM {T_ALLOC}) AS alloc_n,
        (SELECT COALESCE(SUM(id), 0) FROM {T_ALLOC}) AS alloc_sum,
        (SELECT COALESCE(MAX(id), 0) FROM {T_RESERVATION}) AS res_max,
        (SELECT COUNT(*) FROM {T_RESERVATION}) AS res_n, (SELECT COALESCE(SUM(id), 0) FROM {T_RESERVATION}) AS res_sum,
        (SELECT COALESCE(SUM(inventory_version), 0) FROM {T_CLUSTER}) AS inv,
        (SELECT COUNT(*) FROM {T_CLUSTER}) AS clusters, (SELECT COALESCE(MAX(id), 0) FROM {T_CLUSTER}) AS cl_max,
        (SELECT COALESCE(SUM(resource_version), 0) FROM {T_TAINTRULE}) AS rules_rv,
        (SELECT COUNT(*) FROM {T_TAINTRULE}) AS rules_n,
        (SELECT COALESCE(MAX(id), 0) FROM {T_TAINTRULE}) AS rules_max,
        (SELECT COALESCE(SUM(resource_version), 0) FROM {T_CLASS}) AS classes_rv,
        (SELECT COUNT(*) FROM {T_CLASS}) AS classes_n, (SELECT COALESCE(MAX(id), 0) FROM {T_CLASS}) AS classes_max,
        (SELECT COALESCE(MAX(seq), 0) FROM {T_CHANGE}) AS changes,
        (SELECT COALESCE(MAX(settled), 0) FROM {T_CHANGELOG}) AS settled,
        (SELECT COALESCE(MAX(compacted_through), 0) FROM {T_CHANGELOG}) AS compacted""", [])[0]
    v = list(row.values())
    return FleetState(allocations=tuple(v[0:3]), reservations=tuple(v[3:6]), inventory=tuple(v[6:15]),
                      claims=tuple(v[15:18]))


def fleet_state_key() -> tuple:
    """Changes whenever anything the unit aggregate reads changes (see ``FleetState``)."""
    state = fleet_state()
    return (state.allocations, state.reservations, state.inventory)


# The overview's unit aggregate, maintained per change (``fleet_tally``): a dashboard polled every few seconds
# by many people costs one cheap key query per poll, and an allocation costs the rows it touched, not a scan
# of every device.
_tally = FleetTally()


def overview_rows(state: FleetState | None = None) -> list[dict]:
    return _tally.rows((state or fleet_state()).tally_key())


def _tally_rows(group_by: str, where: str = "", params: list | None = None) -> list[dict]:
    units, unit_params = units_sql(where, params or [])
    return fetch_dicts(f"SELECT {group_by}, {STATE_SQL} FROM ({units}) u GROUP BY {group_by}", unit_params,
                       analytic=True)


# Claims per phase and the oldest pending claim, maintained from the change log (``claim_tally``).
_claims = ClaimTally()


def claim_summary(state: FleetState | None = None) -> dict:
    counts, oldest_id = _claims.summary((state or fleet_state()).claims)
    oldest = (ResourceClaim.objects.select_related("namespace").filter(pk=oldest_id).first()
              if oldest_id is not None else None)
    pending = {"count": counts[Phase.PENDING], "oldest_at": oldest.created_at if oldest else None, "oldest": oldest}
    return {"pending": pending, "phases": counts}


def fleet_overview(now: datetime | None = None) -> dict:
    """Everything the overview page shows: one state key query, the clusters' rows, and aggregates remembered
    per state (``FleetState``)."""
    state = fleet_state()
    clusters = cluster_freshness(now, published=True, state=state)
    stale_ids = {c.id for c in clusters if c.stale_now}
    rows = overview_rows(state)

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
        **claim_summary(state),
    }


def cluster_detail(cluster: Cluster, *, search: str = "", offset: int = 0, limit: int = 200) -> dict:
    """Per-node and per-product tallies for one cluster from one GROUP BY (node, driver, product); nodes are
    ordered by name and paginated in Python over the already-aggregated rows (a few thousand small rows)."""
    where, params = "d.cluster_id = %s", list[int | str]([cluster.id])
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


def node_tally(cluster: Cluster, node_name: str) -> Tally:
    """The accelerators of one node (``accelerators``), from the same unit aggregate as the cluster
    page's rows, so a node page and its cluster page's row agree."""
    rows = _tally_rows("u.node_name", "d.cluster_id = %s AND d.node_name = %s", [cluster.id, node_name])
    tally = Tally()
    stale = cluster.is_stale()
    for row in rows:
        tally.add_row(row, stale)
    return tally


def accelerator_summary(now: datetime | None = None) -> dict:
    """The fleet's accelerators in the four states, in total and per cluster: what the overview shows, as
    ``/api/v1/devices/summary/`` returns it."""
    overview = fleet_overview(now)
    return {"accelerators": {"total": overview["totals"].total, **overview["totals"].states},
            "clusters": [{"cluster": g.key, "total": g.tally.total, **g.tally.states}
                         for g in overview["by_cluster"]]}
