"""The engine's view of the fleet: ``build_fleet_snapshot()`` -> ``dra.engine.types.FleetSnapshot``.

Five queries whatever the fleet's size (clusters, nodes, slices, taint rules, classes), reading the stored
normalized v1 JSON as is: no per-device query and no re-serialization.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

from django.db import connection
from django.utils import timezone

from dra.engine.types import ClusterInventory, FleetSnapshot
from inventory.models import Cluster, DeviceClass, DeviceTaintRule, Node, ResourceSlice


def build_fleet_snapshot(clusters: Iterable[str] | None = None) -> FleetSnapshot:
    """All clusters (or those named), stale ones included and flagged ``stale`` so the engine can skip
    them for new allocations. Fleet-wide DeviceTaintRules are added to every cluster's rules; a cluster's
    own DeviceClasses go in ``device_classes`` of its ClusterInventory (they override fleet classes of the
    same name there), fleet-wide classes in ``FleetSnapshot.device_classes``."""
    now = timezone.now()
    rows = Cluster.objects.order_by("name")
    if clusters is not None:
        rows = rows.filter(name__in=list(clusters))
    inventories: dict[int, ClusterInventory] = {
        c.pk: ClusterInventory(name=c.name, labels=dict(c.labels or {}),
                               stale=c.is_stale(now) or c.stale_since is not None)
        for c in rows.only("id", "name", "labels", "last_sync_at", "last_heartbeat_at", "stale_since")
    }
    ids = list(inventories)
    for cluster_id, name, labels in (Node.objects.filter(cluster_id__in=ids).order_by("cluster_id", "name")
                                     .values_list("cluster_id", "name", "labels")):
        inventories[cluster_id].nodes.append({"name": name, "labels": labels or {}})
    for cluster_id, obj in (ResourceSlice.objects.filter(cluster_id__in=ids).order_by("cluster_id", "name")
                            .values_list("cluster_id", "object").iterator(chunk_size=2000)):
        inventories[cluster_id].resource_slices.append(obj)
    fleet_rules: list[dict] = []
    for cluster_id, obj in (DeviceTaintRule.objects.filter(cluster_id__in=ids) | DeviceTaintRule.objects
                            .filter(cluster__isnull=True)).order_by("name").values_list("cluster_id", "object"):
        if cluster_id is None:
            fleet_rules.append(obj)
        else:
            inventories[cluster_id].device_taint_rules.append(obj)
    fleet_classes: list[dict] = []
    for cluster_id, obj in (DeviceClass.objects.filter(cluster_id__in=ids) | DeviceClass.objects
                            .filter(cluster__isnull=True)).order_by("name").values_list("cluster_id", "object"):
        if cluster_id is None:
            fleet_classes.append(obj)
        else:
            inventories[cluster_id].device_classes.append(obj)
    for inventory in inventories.values():
        inventory.device_taint_rules = fleet_rules + inventory.device_taint_rules
    return FleetSnapshot(clusters=list(inventories.values()), device_classes=fleet_classes)


def stored_digests(names: list[str] | None = None) -> dict[str, tuple]:
    """Per cluster name: what its stored slices and nodes are, as one comparable value (counts and a hash of
    slice names with their content hashes and of node names with their labels), from two aggregate queries.
    What a snapshot was built from: the worker compares it now and then with the one taken at the build, to
    find an inventory edited without its cluster's version moving (``claims.services.fleet``)."""
    clusters = Cluster.objects.all() if names is None else Cluster.objects.filter(name__in=names)
    ids = dict(clusters.values_list("id", "name"))
    out: dict[str, list] = {name: [0, 0, 0, 0] for name in ids.values()}
    if not ids:
        return {}
    if connection.vendor == "postgresql":
        sql = ("SELECT cluster_id, count(*), sum(('x' || substr(md5(name || ':' || {col}), 1, 15))::bit(60)::bigint) "
               "FROM {table} WHERE cluster_id = ANY(%s) GROUP BY cluster_id")
        for slot, (model, col) in enumerate(((ResourceSlice, "content_hash"), (Node, "labels::text"))):
            with connection.cursor() as cursor:
                cursor.execute(sql.format(col=col, table=model._meta.db_table), [list(ids)])
                for cluster_id, n, total in cursor.fetchall():
                    out[ids[cluster_id]][2 * slot:2 * slot + 2] = [n, int(total or 0)]
    else:  # SQLite (the embedded demo): small fleets, hashed here
        for slot, rows in enumerate((ResourceSlice.objects.filter(cluster_id__in=ids).values_list(
                "cluster_id", "name", "content_hash"), Node.objects.filter(cluster_id__in=ids).values_list(
                "cluster_id", "name", "labels"))):
            for cluster_id, name, content in rows:
                entry = out[ids[cluster_id]]
                entry[2 * slot] += 1
                entry[2 * slot + 1] ^= hash((name, json.dumps(content, sort_keys=True)))
    return {name: tuple(v) for name, v in out.items()}
