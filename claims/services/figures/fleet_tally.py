"""The overview's unit tally, maintained per change instead of recomputed per poll.

The tally is what ``units_sql`` grouped by (cluster, driver, product) with ``STATE_SQL`` answers: units (a whole
device, or a partitioned GPU with all its partitions) in exclusive states. Recomputing it scans every device
(a few hundred ms at 40,000 devices, more than a second in Python), too much for every allocation of a busy
fleet or every push of a big cluster, so it is kept in parts along what changes how often:

* the inventory, per pool: a unit never spans pools (its name starts with the pool's), so each pool's units,
  with their *idle* state (tainted, invalid or free: what a unit is when no claim holds it), are read on their
  own. When a cluster's ``inventory_version`` moves, digests of its pools and slices per bucket of pools say
  which buckets moved, and those buckets' pools and slices (not their devices) say which pools moved: a
  pool's devices are written only with its slices, so its generation, its state and its slices' ids and
  content hashes change whenever anything the tally reads of it does. Only those pools'
  devices are read again; a node's labels read none.
  DeviceTaintRules (few, written by hand) may select any device: a change to them reads everything again.
* allocations and reservations change with every claim: rows are only ever inserted or deleted, so the
  tally follows them by id. A change costs one list of allocation ids (to find the deleted and the
  late-committed rows: ids come from a sequence in write order, not commit order), the new rows' keys, and
  the claims that more than one consumer holds; only the units those rows touch are re-decided.

Each process keeps its own copy behind a lock (web threads share it). ``refresh`` is given the state key read
*before* the data (and reads the clusters' versions before their pools), so a change that lands meanwhile is
either in the data already or moves the next key.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection, transaction

from claims.services.figures.sql import T_ALLOC, T_CLUSTER, T_POOL, T_RESERVATION, T_SLICE, fetch_rows, is_postgres
from claims.services.figures.units import device_rows_sql

# The exclusive states of a unit, as STATE_SQL names its columns.
SHARED, ALLOCATED, TAINTED, INVALID, FREE = "shared", "allocated_only", "tainted", "invalid", "free"
PARTIAL = "partial"  # held partitioned units: a subset of SHARED and ALLOCATED, counted on the side
COLUMNS = (SHARED, ALLOCATED, TAINTED, INVALID, FREE, "partitioned", PARTIAL, "total")
HELD = (SHARED, ALLOCATED)
GroupKey = tuple[int, str, str]  # (cluster id, driver, product)
DeviceKey = tuple[str, str, str, str]  # (cluster name, driver, pool, device), as allocations name a device
PoolKey = tuple[str, str, str]  # (cluster name, driver, pool): the first three parts of a DeviceKey
DEVICE_COLUMNS = ("cluster_id", "cluster", "node_name", "driver", "pool_name", "name", "product", "tainted",
                  "invalid", "partitioned", "unit")
# Beyond this many pools to read again, one scan of the cluster's devices (filtered here) is cheaper than a
# statement listing them.
MAX_LISTED_POOLS = 200


@contextmanager
def snapshot() -> Iterator[None]:
    """One snapshot for every statement inside: REPEATABLE READ on PostgreSQL, unless a transaction is open
    already (then its own isolation holds); SQLite's read transactions are snapshots already."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if is_postgres():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


# Pools are spread over buckets by a hash of (driver, pool name), computed alike here and in PostgreSQL
# (``bucket_of``, ``_BUCKET_SQL``); a digest per cluster and bucket tells which buckets moved, so a push that
# changes one pool reads the signatures of its bucket's pools (~1/256 of the cluster), not of every pool.
BUCKET_HEX = 2  # leading md5 hex digits: 256 buckets
_BUCKET_SQL = "substr(md5({driver} || '/' || {pool}), 1, " + str(BUCKET_HEX) + ")"
Scope = dict  # cluster id -> the buckets to read (a set), or None for all of them


def bucket_of(driver: str, pool: str) -> str:
    return hashlib.md5(f"{driver}/{pool}".encode()).hexdigest()[:BUCKET_HEX]


def cluster_digests(cluster_ids: list[int]) -> dict[int, dict[str, tuple]]:
    """Per cluster and bucket of its pools: a digest of the bucket's slices' (id, content hash) and pools' (id,
    generation, state). Slices and pools are few next to devices, and the digests are taken in the database on
    PostgreSQL."""
    if not cluster_ids:
        return {}
    marks = ", ".join(["%s"] * len(cluster_ids))
    out: dict[int, dict[str, list]] = {cid: {} for cid in cluster_ids}
    queries = ((0, T_SLICE, "driver", "pool_name", "content_hash"), (1, T_POOL, "driver", "name", "generation, state"))
    with connection.cursor() as cursor:
        for index, table, driver, pool, columns in queries:
            if is_postgres():
                text = " || ':' || ".join(f"{c}::text" for c in ["id"] + columns.split(", "))
                bucket = _BUCKET_SQL.format(driver=driver, pool=pool)
                cursor.execute(f"SELECT cluster_id, {bucket}, COUNT(*), md5(string_agg({text}, ',' ORDER BY id)) "
                               f"FROM {table} WHERE cluster_id IN ({marks}) GROUP BY 1, 2", cluster_ids)
                for cid, key, n, digest in cursor.fetchall():
                    out[cid].setdefault(key, [None, None])[index] = (n, digest)
            else:
                cursor.execute(f"SELECT cluster_id, {driver}, {pool}, id, {columns} FROM {table} "
                               f"WHERE cluster_id IN ({marks}) ORDER BY id", cluster_ids)
                rows: dict[tuple, list] = {}
                for row in cursor.fetchall():
                    rows.setdefault((row[0], bucket_of(row[1], row[2])), []).append(row[3:])
                for (cid, key), listed in rows.items():
                    digest = hashlib.sha256(repr(listed).encode()).hexdigest()
                    out[cid].setdefault(key, [None, None])[index] = (len(listed), digest)
    return {cid: {key: tuple(parts) for key, parts in buckets.items()} for cid, buckets in out.items()}


def moved_buckets(old: dict[str, tuple] | None, new: dict[str, tuple]) -> set[str] | None:
    """The buckets whose digest differs (None: all of them, nothing was known)."""
    if old is None:
        return None
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


class Unit:
    """One unit: its group, its idle state (TAINTED, INVALID or FREE: what it is when no claim holds it), its
    current state, whether it is partitioned, and the claims holding it (claim id -> allocation rows of that
    claim on the unit)."""

    __slots__ = ("group", "idle", "state", "partitioned", "claims")

    def __init__(self, group: GroupKey, idle: str, partitioned: int) -> None:
        self.group, self.idle, self.state, self.partitioned = group, idle, idle, partitioned
        self.claims: dict[int, int] = {}


@dataclass
class StateKey:
    """The parts of ``fleet.fleet_state_key`` that invalidate different parts of the tally: ``inventory``
    moves with any cluster's inventory, ``rules`` with any DeviceTaintRule."""

    allocations: tuple
    reservations: tuple
    inventory: tuple
    rules: tuple = ()


class FleetTally:
    def __init__(self) -> None:
        self.key: StateKey | None = None
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.clusters: dict[int, tuple] = {}  # cluster id -> (name, inventory_version) the pools were read at
        self.cluster_digests: dict[int, dict[str, tuple]] = {}  # cluster id -> bucket -> digest (``cluster_digests``)
        self.pool_signatures: dict[PoolKey, tuple] = {}
        self.pool_units: dict[PoolKey, list[Unit]] = {}
        self.pool_devices: dict[PoolKey, list[DeviceKey]] = {}
        self.units_by_device: dict[DeviceKey, Unit] = {}
        self.groups: dict[GroupKey, dict[str, int]] = {}
        # id -> (unit or None, claim id, device key or None for admin access)
        self.allocations: dict[int, tuple[Unit | None, int, DeviceKey | None]] = {}
        self.pool_allocations: dict[PoolKey, set[int]] = {}  # non-admin allocation ids by the pool they name
        self.claim_allocations: dict[int, set[int]] = {}
        self.multi_consumer: set[int] = set()  # claims reserved for more than one consumer

    # -- reading --------------------------------------------------------------------------------------------

    def rows(self, key: StateKey) -> list[dict]:
        """Rows shaped as ``_tally_rows("u.cluster_id, u.driver, u.product")``, brought up to ``key`` first."""
        with self.lock:
            self.refresh(key)
            return [{"cluster_id": g[0], "driver": g[1], "product": g[2], **counts}
                    for g, counts in self.groups.items()]

    def refresh(self, key: StateKey) -> None:
        old, self.key = self.key, None  # half-applied changes must not pass for a known state
        if old is None or old.rules != key.rules:
            self._rebuild()
        elif old != key:
            dirty: set[Unit] = set()
            if old.inventory != key.inventory:
                dirty |= self._follow_inventory()
            if old.allocations != key.allocations:
                dirty |= self._follow_allocations()
            if old.reservations != key.reservations:
                dirty |= self._follow_reservations()
            for unit in dirty:
                self._decide(unit)
        self.key = key

    def _rebuild(self) -> None:
        self._reset()
        self.multi_consumer = self._multi_consumer_claims()
        self._follow_inventory(everything=True)
        held = set()
        for row in self._allocation_rows():
            unit = self._add(*row)
            if unit is not None:
                held.add(unit)
        for unit in held:
            self._decide(unit)

    # -- the inventory: the pools that moved, per cluster whose inventory moved ------------------------------

    def _follow_inventory(self, everything: bool = False) -> set[Unit]:
        """Reads the pools of the clusters whose inventory moved (or that came or went), and the devices of
        the pools among them that moved; returns the units made afresh that claims hold. ``everything``: the
        tally is empty, every device is read in one statement. All from one snapshot, so that what is
        remembered of a cluster or pool (its signature) describes the very data read."""
        with snapshot():
            return self._follow_inventory_in_snapshot(everything)

    def _follow_inventory_in_snapshot(self, everything: bool) -> set[Unit]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, name, inventory_version FROM {T_CLUSTER}")
            versions = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
        moved_clusters = [cid for cid, version in versions.items() if self.clusters.get(cid) != version]
        # A node's labels move the version but no pool: digests per cluster and bucket tell, before any pool
        # is read, which buckets of pools moved (none for labels).
        digests = cluster_digests(moved_clusters)
        scope: Scope = {}
        for cid in moved_clusters:
            known = self.clusters.get(cid, ("",))[0] == versions[cid][0]  # not a new (or renamed) cluster
            buckets = moved_buckets(self.cluster_digests.get(cid) if known else None, digests[cid])
            if buckets is None or buckets:
                scope[cid] = buckets
        by_name = {versions[cid][0]: buckets for cid, buckets in scope.items()}
        by_name.update({name: None for cid, (name, _) in self.clusters.items() if cid not in versions})
        signatures = self._pool_signatures(scope) if scope else {}
        gone = [key for key in self.pool_signatures if key not in signatures and key[0] in by_name
                and (by_name[key[0]] is None or bucket_of(key[1], key[2]) in by_name[key[0]])]
        moved = [key for key, sig in signatures.items() if self.pool_signatures.get(key) != sig]
        for key in gone + moved:
            self._drop_pool(key)
        for key in moved:
            self.pool_signatures[key] = signatures[key]
        self._read_pools(moved, None if everything else {name: cid for cid, (name, _) in versions.items()})
        self.clusters = versions
        self.cluster_digests = {cid: self.cluster_digests[cid] for cid in versions if cid in self.cluster_digests}
        self.cluster_digests.update(digests)
        return self._repoint(gone + moved)

    def _pool_signatures(self, scope: Scope) -> dict[PoolKey, tuple]:
        """Per pool of the clusters and buckets in ``scope``: what moves whenever anything the tally reads of
        the pool moves. A pool's devices are written only with its slices (a changed slice is replaced,
        devices and all, and its content hash rewritten: ``inventory.services.sync``), so its Pool row and its
        slices' (id, content hash) pairs say whether they moved, without reading the wide device rows."""
        slices: dict[PoolKey, set[tuple]] = {}
        with connection.cursor() as cursor:
            where, params = _scope_sql(scope, "s", "pool_name")
            cursor.execute(f"""SELECT c.name, s.driver, s.pool_name, s.id, s.content_hash
                               FROM {T_SLICE} s JOIN {T_CLUSTER} c ON c.id = s.cluster_id WHERE {where}""", params)
            for cluster, driver, pool, slice_id, digest in cursor.fetchall():
                slices.setdefault((cluster, driver, pool), set()).add((slice_id, digest))
            where, params = _scope_sql(scope, "p", "name")
            cursor.execute(f"""SELECT c.name, p.driver, p.name, p.id, p.generation, p.state
                               FROM {T_POOL} p JOIN {T_CLUSTER} c ON c.id = p.cluster_id WHERE {where}""", params)
            rows = cursor.fetchall()
        # SQLite has no md5(): there the scope's clusters are read whole and filtered by bucket here.
        wanted = {c: b for c, b in scope.items() if b is not None} if not is_postgres() else {}
        cluster_ids = {name: cid for cid, (name, _) in self.clusters.items()} if wanted else {}
        return {(r[0], r[1], r[2]): (r[3], r[4], r[5], frozenset(slices.get((r[0], r[1], r[2]), ())))
                for r in rows if not wanted or _in_scope(wanted, cluster_ids, r)}

    def _read_pools(self, pools: list[PoolKey], cluster_ids: dict[str, int] | None) -> None:
        """Makes the units of ``pools`` (dropped before) from their devices: one statement per cluster, or
        one for the whole fleet without ``cluster_ids``."""
        if cluster_ids is None:
            sql, sql_params = device_rows_sql()
            columns, rows = fetch_rows(sql, sql_params, analytic=True)
            assert tuple(columns) == DEVICE_COLUMNS, columns
            self._make_units(rows, set(pools))
            return
        by_cluster: dict[int, list[PoolKey]] = {}
        for key in pools:
            by_cluster.setdefault(cluster_ids[key[0]], []).append(key)
        for cluster_id, keys in by_cluster.items():
            where, params = "d.cluster_id = %s", list[int | str]([cluster_id])
            if len(keys) <= MAX_LISTED_POOLS:
                where += " AND (" + " OR ".join(["(d.driver = %s AND d.pool_name = %s)"] * len(keys)) + ")"
                params += [part for key in keys for part in key[1:]]
            sql, sql_params = device_rows_sql(where, params)
            columns, rows = fetch_rows(sql, sql_params, analytic=True)
            assert tuple(columns) == DEVICE_COLUMNS, columns
            self._make_units(rows, set(keys))

    def _make_units(self, rows: list[tuple], pools: set[PoolKey]) -> None:
        units: dict[tuple, Unit] = {}
        # Tens of thousands of rows on a full read: plain tuples, one dict probe per device.
        for cluster_id, cluster, node, driver, pool, name, product, tainted, invalid, partitioned, unit_name in rows:
            pkey = (cluster, driver, pool)
            if pkey not in pools:
                continue
            # The same grouping as units_sql's GROUP BY: the devices of one unit.
            ukey = (cluster_id, node, driver, product, unit_name, partitioned)
            unit = units.get(ukey)
            if unit is None:
                unit = units[ukey] = Unit((cluster_id, driver, product or ""), FREE, partitioned)
                self.pool_units.setdefault(pkey, []).append(unit)
            # A unit is tainted if any of its devices is, invalid if its pool is (and it is not tainted).
            if tainted:
                unit.idle = TAINTED
            elif invalid and unit.idle == FREE:
                unit.idle = INVALID
            device = (cluster, driver, pool, name)
            self.units_by_device[device] = unit
            self.pool_devices.setdefault(pkey, []).append(device)
        for unit in units.values():
            unit.state = unit.idle
            counts = self.groups.get(unit.group)
            if counts is None:
                counts = self.groups[unit.group] = dict.fromkeys(COLUMNS, 0)
            counts[unit.idle] += 1
            counts["total"] += 1
            counts["partitioned"] += unit.partitioned

    def _drop_pool(self, key: PoolKey) -> None:
        self.pool_signatures.pop(key, None)
        for device in self.pool_devices.pop(key, ()):
            self.units_by_device.pop(device, None)
        for unit in self.pool_units.pop(key, ()):
            counts = self.groups[unit.group]
            counts[unit.state] -= 1
            counts["total"] -= 1
            counts["partitioned"] -= unit.partitioned
            if unit.partitioned and unit.state in HELD:
                counts[PARTIAL] -= 1
            if not counts["total"]:  # a fresh computation has no row for a group without units
                del self.groups[unit.group]

    def _repoint(self, pools: list[PoolKey]) -> set[Unit]:
        """The allocations naming a device of ``pools`` follow it to its new unit (or to none)."""
        dirty = set()
        for key in pools:
            for alloc_id in list(self.pool_allocations.get(key, ())):
                _, claim_id, device = self.allocations[alloc_id]
                self._remove(alloc_id)
                unit = self._add(alloc_id, device, claim_id, False)
                if unit is not None:
                    dirty.add(unit)
        return dirty

    # -- allocations and reservations: by id ----------------------------------------------------------------

    def _follow_allocations(self) -> set[Unit]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {T_ALLOC}")
            current = {row[0] for row in cursor.fetchall()}
        dirty: set[Unit] = set()
        for alloc_id in self.allocations.keys() - current:
            unit = self._remove(alloc_id)
            if unit is not None:
                dirty.add(unit)
        added = current - self.allocations.keys()
        if added:
            for row in self._allocation_rows(sorted(added)):
                unit = self._add(*row)
                if unit is not None:
                    dirty.add(unit)
        return dirty

    def _follow_reservations(self) -> set[Unit]:
        now = self._multi_consumer_claims()
        changed, self.multi_consumer = now ^ self.multi_consumer, now
        dirty = set()
        for claim_id in changed:
            for alloc_id in self.claim_allocations.get(claim_id, ()):
                unit = self.allocations[alloc_id][0]
                if unit is not None:
                    dirty.add(unit)
        return dirty

    def _allocation_rows(self, ids: list[int] | None = None) -> list[tuple]:
        """(id, device key, claim id, admin access) of every allocation, or of ``ids``."""
        where, params = "", []
        if ids is not None:
            where, params = f"WHERE id IN ({', '.join(['%s'] * len(ids))})", ids
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, cluster, driver, pool, device, claim_id, admin_access FROM {T_ALLOC} {where}",
                           params)
            return [(r[0], (r[1], r[2], r[3], r[4]), r[5], bool(r[6])) for r in cursor.fetchall()]

    def _multi_consumer_claims(self) -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT claim_id FROM {T_RESERVATION} GROUP BY claim_id HAVING COUNT(*) > 1")
            return {row[0] for row in cursor.fetchall()}

    def _add(self, alloc_id: int, device: DeviceKey | None, claim_id: int, admin_access: bool) -> Unit | None:
        # Admin access does not consume the device (upstream): remembered without a device, so that the id
        # diff does not fetch it again. A device gone from the inventory has no unit, but its pool is
        # remembered: the allocation finds its unit if the device comes back.
        if admin_access or device is None:
            self.allocations[alloc_id] = (None, claim_id, None)
            return None
        unit = self.units_by_device.get(device)
        self.allocations[alloc_id] = (unit, claim_id, device)
        self.pool_allocations.setdefault(device[:3], set()).add(alloc_id)
        if unit is not None:
            unit.claims[claim_id] = unit.claims.get(claim_id, 0) + 1
            self.claim_allocations.setdefault(claim_id, set()).add(alloc_id)
        return unit

    def _remove(self, alloc_id: int) -> Unit | None:
        unit, claim_id, device = self.allocations.pop(alloc_id)
        if device is not None:
            on_pool = self.pool_allocations[device[:3]]
            on_pool.discard(alloc_id)
            if not on_pool:
                del self.pool_allocations[device[:3]]
        if unit is not None:
            left = unit.claims[claim_id] - 1
            if left:
                unit.claims[claim_id] = left
            else:
                del unit.claims[claim_id]
            held = self.claim_allocations[claim_id]
            held.discard(alloc_id)
            if not held:
                del self.claim_allocations[claim_id]
        return unit

    def _decide(self, unit: Unit) -> None:
        """A unit held by more than one claim, or by a claim with more than one consumer, is shared."""
        if not unit.claims:
            state = unit.idle
        elif len(unit.claims) > 1 or not self.multi_consumer.isdisjoint(unit.claims):
            state = SHARED
        else:
            state = ALLOCATED
        if state != unit.state:
            counts = self.groups[unit.group]
            counts[unit.state] -= 1
            counts[state] += 1
            if unit.partitioned:
                counts[PARTIAL] += (state in HELD) - (unit.state in HELD)
            unit.state = state


def _scope_sql(scope: Scope, alias: str, pool: str) -> tuple[str, list]:
    """A WHERE clause for the pools (or slices, ``alias``) of ``scope``: whole clusters, or some buckets of
    them (``pool``: the alias's pool name column)."""
    parts, params = [], []
    bucket = _BUCKET_SQL.format(driver=f"{alias}.driver", pool=f"{alias}.{pool}")
    for cid, buckets in scope.items():
        if buckets is None or not is_postgres():
            parts.append(f"{alias}.cluster_id = %s")
            params.append(cid)
        else:
            parts.append(f"({alias}.cluster_id = %s AND {bucket} IN ({', '.join(['%s'] * len(buckets))}))")
            params += [cid, *sorted(buckets)]
    return " OR ".join(parts), params


def _in_scope(wanted: dict[int, set[str]], cluster_ids: dict[str, int], row: tuple) -> bool:
    buckets = wanted.get(cluster_ids.get(row[0], -1))
    return buckets is None or bucket_of(row[1], row[2]) in buckets
