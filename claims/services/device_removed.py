"""Allocated claims whose devices a later inventory push removed: the ``DeviceRemoved`` condition.

Runs after a cluster's inventory changed (``claims.receivers``). A held device is *gone* when its pool no
longer has it at the pool's current generation, or the pool (or the whole cluster) is gone. A device of a pool
that is incomplete at its current generation is not judged: the slice that still lists it may simply not have
arrived yet (a driver publishing a new generation slice by slice).

What it does to such a claim: condition ``DeviceRemoved`` status ``True``, reason ``DeviceRemoved``, a message
naming the devices, a ``DeviceRemoved`` event, ``device_removed_at`` set (the metric counts those). When the
devices are back (the slice is re-published) the condition turns ``False`` (reason ``DevicesPresent``).

What it does NOT do: release the claim. It stays ``Allocated``, with its allocation rows: the pod or job that
uses the devices may still be running (a driver restart re-publishes slices; a node drain is the cluster's
business), so freeing the devices is the holder's decision, or its lease's. Keeping the rows also keeps a device
that comes back under the same name from being handed to a second claim while the first may still use it.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import bulk
from claims.services import events as ev
from claims.services.conditions import set_condition
from draservice import notify
from inventory.models import Device, Pool

DEVICE_REMOVED = "DeviceRemoved"  # condition type, reason and event type alike
DEVICES_PRESENT = "DevicesPresent"
MAX_NAMED = 20  # devices named in one message; the event's data lists them all


def _gone_devices(cluster: str) -> dict[int, list[str]]:
    """Allocated claims on ``cluster`` -> their gone devices as "driver/pool/device" (one query)."""
    current_generation = Pool.objects.filter(cluster_id=OuterRef("cluster_id"), driver=OuterRef("driver"),
                                             name=OuterRef("pool_name")).values("generation")[:1]
    present = Device.objects.filter(cluster__name=OuterRef("cluster"), driver=OuterRef("driver"),
                                    pool_name=OuterRef("pool"), name=OuterRef("device"),
                                    pool_generation=Subquery(current_generation))
    undecided = Pool.objects.filter(cluster__name=OuterRef("cluster"), driver=OuterRef("driver"),
                                    name=OuterRef("pool"), state=Pool.INCOMPLETE)
    rows = (DeviceAllocation.objects.filter(cluster=cluster, claim__phase=Phase.ALLOCATED)
            .exclude(Exists(present)).exclude(Exists(undecided))
            .order_by("claim_id", "driver", "pool", "device")
            .values_list("claim_id", "driver", "pool", "device"))
    gone: dict[int, list[str]] = defaultdict(list)
    for claim_id, driver, pool, device in rows:
        name = f"{driver}/{pool}/{device}"
        if name not in gone[claim_id]:  # shares of one device are one device
            gone[claim_id].append(name)
    return dict(gone)


def _message(cluster: str, devices: list[str]) -> str:
    named = ", ".join(devices[:MAX_NAMED]) + (f" and {len(devices) - MAX_NAMED} more" if len(devices) > MAX_NAMED
                                              else "")
    return (f"{len(devices)} allocated device(s) no longer in cluster {cluster}'s inventory: {named}. "
            f"The claim stays allocated; release it when its workload is done with them.")


def _serialize(cluster: str) -> None:
    """One check per cluster at a time, each reading the inventory as committed when it got its turn: two
    checks racing on two pushes (remove, then restore) must not leave the older answer last."""
    if connection.vendor != "postgresql":
        return  # SQLite's IMMEDIATE transactions serialize writers already
    key = int.from_bytes(hashlib.blake2b(f"device-removed\x1f{cluster}".encode(), digest_size=8).digest(), "big",
                         signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def check_cluster(cluster: str) -> list[int]:
    """Mark (or unmark) the allocated claims of ``cluster``; returns the ids of claims that changed."""
    now = timezone.now()
    with transaction.atomic():
        _serialize(cluster)
        gone = _gone_devices(cluster)
        marked = set(ResourceClaim.objects.filter(cluster=cluster, phase=Phase.ALLOCATED,
                                                  device_removed_at__isnull=False).values_list("id", flat=True))
        candidates = set(gone) | marked
        if not candidates:
            return []
        claims = list(ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                      .filter(id__in=candidates, phase=Phase.ALLOCATED).order_by("id"))
        changed, events = [], []
        for claim in claims:
            event = _apply(claim, cluster, gone.get(claim.id), now)
            if event is not None:
                changed.append(claim)
                events.append(event)
        bulk.update_rows(changed, ["conditions", "device_removed_at", "resource_version", "updated_at"])
        ev.record(events)
        ids = [c.id for c in changed]
        if ids:
            transaction.on_commit(lambda: notify.publish(ids))
    return ids


def _apply(claim: ResourceClaim, cluster: str, devices: list[str] | None, now):
    """Set the condition on one locked claim; returns its event, or None when nothing changed."""
    current = next((c for c in claim.conditions or [] if c.get("type") == DEVICE_REMOVED), None)
    if devices:
        message = _message(cluster, devices)
        if current and current.get("status") == "True" and current.get("message") == message:
            return None
        claim.conditions = set_condition(claim.conditions, DEVICE_REMOVED, True, DEVICE_REMOVED, message, now)
        claim.device_removed_at = claim.device_removed_at or now
        event = ev.event(claim, DEVICE_REMOVED, DEVICE_REMOVED, message, {"cluster": cluster, "devices": devices})
    else:
        if current is None or current.get("status") != "True":
            return None
        message = f"the allocated devices are in cluster {cluster}'s inventory again"
        claim.conditions = set_condition(claim.conditions, DEVICE_REMOVED, False, DEVICES_PRESENT, message, now)
        claim.device_removed_at = None
        event = ev.event(claim, DEVICE_REMOVED, DEVICES_PRESENT, message, {"cluster": cluster, "devices": []})
    claim.resource_version += 1
    claim.updated_at = now
    return event
