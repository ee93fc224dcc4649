"""Utilisation snapshots: devices in use per cluster, driver and product, recorded periodically.

"Product" is the device's ``productName`` attribute (GPUs), else ``model`` or ``type``, else empty. A
partitionable device's partitions are counted as devices (a MIG partition in use is one device in use).
"""
from __future__ import annotations

from collections import Counter

from django.db import transaction
from django.utils import timezone

from claims.models import DeviceAllocation, UtilisationSnapshot
from claims.services import fleet
from dra.k8s.inventory import product_name

# The inventory's side of a snapshot (devices per cluster, driver and product, and each device's product), kept
# for the fleet view it was counted from: it changes only with the inventory, and walking 40,000 devices' JSON
# every minute was a burst of CPU beside the allocation rounds (the soak's slowest claims came in those seconds).
_inventory: dict = {"key": None, "totals": Counter(), "product_of": {}}


def _inventory_counts(view) -> tuple[Counter, dict[tuple[str, str, str, str], str]]:
    if _inventory["key"] != view.key:
        totals: Counter = Counter()
        product_of: dict[tuple[str, str, str, str], str] = {}
        for inventory in view.snapshot.clusters:
            for s in inventory.resource_slices:
                spec = s.get("spec") or {}
                driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
                for device in spec.get("devices") or ():
                    product = product_name(device)
                    product_of[(inventory.name, driver, pool, device.get("name", ""))] = product
                    totals[(inventory.name, driver, product)] += 1
        _inventory.update(key=view.key, totals=totals, product_of=product_of)
    return _inventory["totals"], _inventory["product_of"]


def record_snapshot() -> int:
    totals, product_of = _inventory_counts(fleet.current_view())
    used: Counter = Counter()
    shares: Counter = Counter()
    seen: set = set()
    found: str | None
    for cluster, driver, pool, device, share_id in DeviceAllocation.objects.filter(admin_access=False).values_list(
            "cluster", "driver", "pool", "device", "share_id").iterator(chunk_size=5000):
        found = product_of.get((cluster, driver, pool, device))
        if found is None:
            continue  # the device left the inventory; its allocation stays until released
        key = (cluster, driver, found)
        if share_id:
            shares[key] += 1
        if (cluster, driver, pool, device) not in seen:
            seen.add((cluster, driver, pool, device))
            used[key] += 1
    now = timezone.now()
    rows = [UtilisationSnapshot(taken_at=now, cluster=c, driver=d, product=p, devices_total=n,
                                devices_allocated=used.get((c, d, p), 0), shares_allocated=shares.get((c, d, p), 0))
            for (c, d, p), n in sorted(totals.items())]
    with transaction.atomic():
        UtilisationSnapshot.objects.bulk_create(rows, batch_size=1000)
    return len(rows)
