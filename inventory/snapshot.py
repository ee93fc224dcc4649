"""The engine's view of the fleet: ``build_fleet_snapshot()`` -> ``dra.engine.types.FleetSnapshot``.

Five queries whatever the fleet's size (clusters, nodes, slices, taint rules, classes), reading the stored
normalized v1 JSON as is: no per-device query and no re-serialization.
"""
from __future__ import annotations

from collections.abc import Iterable

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
    fleet_rules = []
    for cluster_id, obj in (DeviceTaintRule.objects.filter(cluster_id__in=ids) | DeviceTaintRule.objects
                            .filter(cluster__isnull=True)).order_by("name").values_list("cluster_id", "object"):
        if cluster_id is None:
            fleet_rules.append(obj)
        else:
            inventories[cluster_id].device_taint_rules.append(obj)
    fleet_classes = []
    for cluster_id, obj in (DeviceClass.objects.filter(cluster_id__in=ids) | DeviceClass.objects
                            .filter(cluster__isnull=True)).order_by("name").values_list("cluster_id", "object"):
        if cluster_id is None:
            fleet_classes.append(obj)
        else:
            inventories[cluster_id].device_classes.append(obj)
    for inventory in inventories.values():
        inventory.device_taint_rules = fleet_rules + inventory.device_taint_rules
    return FleetSnapshot(clusters=list(inventories.values()), device_classes=fleet_classes)
