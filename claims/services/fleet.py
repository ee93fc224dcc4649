"""What the worker needs from the inventory: a snapshot, the versions it was built from, devices in use.

Building a ``FleetSnapshot`` reads every slice of the fleet, so it is cached per process and rebuilt only
when the fleet's fingerprint changes: per cluster its ``inventory_version`` and live staleness, plus the
fleet-wide DeviceClasses and DeviceTaintRules. The fingerprint is read BEFORE the snapshot is built, so a
snapshot is never older than its key claims; the write step re-checks the versions under lock
(``claims.services.locking``), which is what makes a stale cache harmless rather than merely unlikely.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone

from claims.models import DeviceAllocation
from inventory.snapshot import build_fleet_snapshot

# A backstop: even with an unchanged fingerprint, rebuild now and then (e.g. a class edited in place by
# someone who forgot to bump anything).
SNAPSHOT_MAX_AGE_SECONDS = 60.0


@dataclass
class FleetView:
    key: tuple
    snapshot: object  # dra.engine.FleetSnapshot
    cluster_versions: dict[str, tuple[int, tuple]]  # name -> (cluster id, (inventory_version, stale_since))
    cluster_labels: list[tuple[str, dict]]
    counter_pools: set[tuple[str, str, str]] = field(default_factory=set)  # pools with sharedCounters
    built_at: float = 0.0


_cache_lock = threading.Lock()
_cache: FleetView | None = None


def fingerprint() -> tuple[tuple, dict[str, tuple[int, tuple]], list[tuple[str, dict]]]:
    """What the snapshot depends on, in ONE query (it runs every round): per cluster its inventory version,
    staleness and labels; fleet-wide the DeviceClasses' and DeviceTaintRules' count and newest change."""
    from django.db.models.expressions import RawSQL

    from inventory.models import Cluster, DeviceClass, DeviceTaintRule

    def agg(model, expr):
        return RawSQL(f"SELECT {expr} FROM {connection.ops.quote_name(model._meta.db_table)}", [])

    now = timezone.now()
    versions: dict[str, tuple[int, tuple]] = {}
    labels: list[tuple[str, dict]] = []
    parts = []
    fleet_part: tuple = ()
    rows = (Cluster.objects.only("id", "name", "labels", "inventory_version", "last_sync_at", "last_heartbeat_at",
                                 "stale_since").order_by("id")
            .annotate(classes_n=agg(DeviceClass, "count(*)"), classes_t=agg(DeviceClass, "max(updated_at)"),
                      classes_v=agg(DeviceClass, "max(resource_version)"), rules_n=agg(DeviceTaintRule, "count(*)"),
                      rules_t=agg(DeviceTaintRule, "max(updated_at)"),
                      rules_v=agg(DeviceTaintRule, "max(resource_version)")))
    for c in rows:
        stale = c.is_stale(now) or c.stale_since is not None
        versions[c.name] = (c.id, (c.inventory_version, c.stale_since))
        labels.append((c.name, c.labels or {}))
        parts.append((c.id, c.inventory_version, stale, tuple(sorted((c.labels or {}).items()))))
        fleet_part = (c.classes_n, str(c.classes_t), c.classes_v, c.rules_n, str(c.rules_t), c.rules_v)
    return (tuple(parts), fleet_part), versions, labels


def current_view() -> FleetView:
    """The fleet as of now (cached per process while the fingerprint holds)."""
    global _cache
    key, versions, labels = fingerprint()
    with _cache_lock:
        cached = _cache
    if cached is not None and cached.key == key and time.monotonic() - cached.built_at < SNAPSHOT_MAX_AGE_SECONDS:
        return cached
    snapshot = build_fleet_snapshot()
    view = FleetView(key=key, snapshot=snapshot, cluster_versions=versions, cluster_labels=labels,
                     counter_pools=_counter_pools(snapshot), built_at=time.monotonic())
    with _cache_lock:
        _cache = view
    return view


def invalidate() -> None:
    global _cache
    with _cache_lock:
        _cache = None


def _counter_pools(snapshot) -> set[tuple[str, str, str]]:
    """Pools whose devices consume shared counters: an allocation there must lock the whole pool."""
    out = set()
    for cluster in snapshot.clusters:
        for s in cluster.resource_slices:
            spec = s.get("spec") or {}
            if spec.get("sharedCounters") or any(d.get("consumesCounters") for d in spec.get("devices") or ()):
                pool = (spec.get("pool") or {}).get("name", "")
                out.add((cluster.name, spec.get("driver", ""), pool))
    return out


class _RowCache:
    """The allocation rows this process has read, by id. Rows never change once written (they are only
    inserted and deleted), so a round reads the ids and fetches only the rows it has not seen."""

    def __init__(self):
        self.rows: dict[int, object] = {}

    def read(self) -> dict[int, object]:
        from dra.engine import AllocatedDevice

        # Plain fetches, not .iterator(): server-side cursors cost extra round trips, and this runs every round.
        ids = set(DeviceAllocation.objects.values_list("id", flat=True))
        for gone in self.rows.keys() - ids:
            del self.rows[gone]
        new = ids - self.rows.keys()
        if new:
            fields = ("id", "cluster", "driver", "pool", "device", "share_id", "consumed_capacity", "admin_access")
            qs = DeviceAllocation.objects.values_list(*fields)
            qs = qs.filter(id__in=new) if len(new) <= 500 else qs  # many new: one scan beats a huge IN
            for row_id, cluster, driver, pool, device, share_id, consumed, admin in qs:
                if row_id in new:
                    self.rows[row_id] = AllocatedDevice(cluster, driver, pool, device, share_id or None,
                                                        consumed or None, admin)
        return dict(self.rows)


_rows = _RowCache()


def rows_in_use() -> dict[int, object]:
    """Every allocation row as the engine's ``AllocatedDevice``, by row id (read at the start of a round)."""
    return _rows.read()
