"""Write-time checks that make an engine answer safe to store, whatever other workers did meanwhile.

The engine decides against a view of the fleet and of the devices in use taken at the start of a round.
Before its answer is written, under locks held to commit, we check that the view still holds for
everything the answer touches:

1. the inventory of every cluster used is unchanged: its ``inventory_version`` equals the one the snapshot
   was built from (read with ``FOR SHARE``, so a concurrent sync's UPDATE of the cluster row waits for us,
   or we wait for it and see its new version). So no allocation computed from an old pool generation is
   ever written;
2. no allocation row has appeared, since the round started, on any device we use, nor anywhere in a pool
   whose devices consume shared counters when we use a device of that pool. Rows that disappeared only
   freed capacity, which cannot invalidate a decision.

Locks are taken per device and per counter-carrying pool, as PostgreSQL transaction-scoped advisory locks,
all in one statement in ascending key order, so two writers can never wait on each other in a cycle. On
SQLite (the embedded default) every write transaction is IMMEDIATE: it holds the database write lock from
BEGIN, so writers are already serialized and no further lock is needed.

A group whose check fails "lost the race": it is not written and is retried at once in a later round. The
partial unique index on dedicated allocations stays as the last line of defence: should anything slip
through, the insert fails and the whole write is retried.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Container, Iterable
from contextlib import contextmanager

from django.db import connection

from claims.models import DeviceAllocation

DeviceKey = tuple[str, str, str, str]  # cluster, driver, pool, device
PoolKey = tuple[str, str, str]  # cluster, driver, pool


_clock = threading.local()


@contextmanager
def waiting():
    """Time a statement that takes locks others may hold (added to ``lock_seconds``): what a round spends
    there is its lock wait, an upper bound (the statement's own work is included)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _clock.seconds = getattr(_clock, "seconds", 0.0) + time.perf_counter() - started


def lock_seconds(reset: bool = False) -> float:
    """Seconds this thread spent in lock-taking statements since the last reset."""
    seconds = getattr(_clock, "seconds", 0.0)
    if reset:
        _clock.seconds = 0.0
    return seconds


def _lock_id(kind: str, key: tuple) -> int:
    """A signed 64-bit advisory lock id for a device or pool; a collision only serializes a bit more."""
    digest = hashlib.blake2b(("\x1f".join((kind, *key))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock(devices: Iterable[DeviceKey], pools: Iterable[PoolKey]) -> None:
    if connection.vendor != "postgresql":
        return
    ids = sorted({_lock_id("d", d) for d in devices} | {_lock_id("p", p) for p in pools})
    if not ids:
        return
    with connection.cursor() as cursor, waiting():
        # unnest() yields the array in order, so the locks are taken in ascending id order.
        cursor.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", [ids])


def cluster_versions_locked(cluster_ids: Iterable[int]) -> dict[int, tuple]:
    """Current (``inventory_version``, ``stale_since``) of these clusters, share-locked until commit.

    The stale sweep and every inventory write UPDATE the cluster row, so with the row share-locked neither
    can change what we compare until we commit (PostgreSQL; SQLite writers are serialized anyway).
    """
    from inventory.models import Cluster

    ids = sorted(set(cluster_ids))
    if not ids:
        return {}
    if connection.vendor != "postgresql":
        return {row[0]: (row[1], row[2]) for row in
                Cluster.objects.filter(id__in=ids).values_list("id", "inventory_version", "stale_since")}
    table = Cluster._meta.db_table
    with connection.cursor() as cursor, waiting():
        cursor.execute(f'SELECT id, inventory_version, stale_since FROM "{table}" '
                       "WHERE id = ANY(%s) ORDER BY id FOR SHARE", [ids])
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def new_rows(pools: set[PoolKey], seen_ids: Container[int]) -> tuple[set[DeviceKey], set[PoolKey]]:
    """Devices and pools (among ``pools``) that gained an allocation row not in ``seen_ids`` (any container:
    the round's rows by id serve as they are, without a set of every allocated id built every round)."""
    if not pools:
        return set(), set()
    clusters = {p[0] for p in pools}
    drivers = {p[1] for p in pools}
    names = {p[2] for p in pools}
    # All three leading columns of the (cluster, driver, pool, device) index: without the driver PostgreSQL can
    # bound the scan by the cluster alone, and chose to read the whole table for a fleet of few clusters.
    rows = (DeviceAllocation.objects.filter(cluster__in=clusters, driver__in=drivers, pool__in=names)
            .values_list("id", "cluster", "driver", "pool", "device"))
    devices: set[DeviceKey] = set()
    touched: set[PoolKey] = set()
    for row_id, cluster, driver, pool, device in rows:
        if row_id in seen_ids or (cluster, driver, pool) not in pools:
            continue
        devices.add((cluster, driver, pool, device))
        touched.add((cluster, driver, pool))
    return devices, touched
