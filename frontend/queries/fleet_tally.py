"""The overview's unit tally, maintained per change instead of recomputed per poll.

The tally is what ``units_sql`` grouped by (cluster, driver, product) with ``STATE_SQL`` answers: units (a whole
device, or a partitioned GPU with all its partitions) in exclusive states. Recomputing it scans every device
(a few hundred ms at 40,000 devices), which is too much for every allocation of a busy fleet, so it is split
along what changes how often:

* the inventory (devices, pools, taints, DeviceTaintRules) changes with pushes: each unit's key, its group
  and its *idle* state (tainted, invalid or free: what it is when no claim holds it) are read in one device
  scan per inventory version;
* allocations and reservations change with every claim: rows are only ever inserted or deleted, so the
  tally follows them by id. A change costs one list of allocation ids (to find the deleted and the
  late-committed rows: ids come from a sequence in write order, not commit order), the new rows' keys, and
  the claims that more than one consumer holds; only the units those rows touch are re-decided.

Each process keeps its own copy behind a lock (web threads share it). ``refresh`` is given the state key read
*before* the data, so a change that lands meanwhile is either in the data already or moves the next key.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from django.db import connection

from frontend.queries.sql import T_ALLOC, T_RESERVATION, fetch_rows
from frontend.queries.units import device_rows_sql

# The exclusive states of a unit, as STATE_SQL names its columns.
SHARED, ALLOCATED, TAINTED, INVALID, FREE = "shared", "allocated_only", "tainted", "invalid", "free"
COLUMNS = (SHARED, ALLOCATED, TAINTED, INVALID, FREE, "partitioned", "total")
GroupKey = tuple[int, str, str]  # (cluster id, driver, product)
DeviceKey = tuple[str, str, str, str]  # (cluster name, driver, pool, device), as allocations name a device
DEVICE_COLUMNS = ("cluster_id", "cluster", "node_name", "driver", "pool_name", "name", "product", "tainted",
                  "invalid", "partitioned", "unit")


class Unit:
    """One unit: its group, its idle state (TAINTED, INVALID or FREE: what it is when no claim holds it), its
    current state and the claims holding it (claim id -> allocation rows of that claim on the unit)."""

    __slots__ = ("group", "idle", "state", "claims")

    def __init__(self, group: GroupKey, idle: str) -> None:
        self.group, self.idle, self.state = group, idle, idle
        self.claims: dict[int, int] = {}


@dataclass
class StateKey:
    """The parts of ``fleet.fleet_state_key`` that invalidate different parts of the tally."""

    allocations: tuple
    reservations: tuple
    inventory: tuple


class FleetTally:
    def __init__(self) -> None:
        self.key: StateKey | None = None
        self.units_by_device: dict[DeviceKey, Unit] = {}
        self.groups: dict[GroupKey, dict[str, int]] = {}
        self.allocations: dict[int, tuple[Unit | None, int]] = {}  # id -> (unit or None, claim id)
        self.claim_allocations: dict[int, set[int]] = {}
        self.multi_consumer: set[int] = set()  # claims reserved for more than one consumer
        self.lock = threading.Lock()

    # -- reading --------------------------------------------------------------------------------------------

    def rows(self, key: StateKey) -> list[dict]:
        """Rows shaped as ``_tally_rows("u.cluster_id, u.driver, u.product")``, brought up to ``key`` first."""
        with self.lock:
            self.refresh(key)
            return [{"cluster_id": g[0], "driver": g[1], "product": g[2], **counts}
                    for g, counts in self.groups.items()]

    def refresh(self, key: StateKey) -> None:
        old, self.key = self.key, None  # half-applied changes must not pass for a known state
        if old is None or old.inventory != key.inventory:
            self._rebuild()
        elif old != key:
            dirty: set[Unit] = set()
            if old.allocations != key.allocations:
                dirty |= self._follow_allocations()
            if old.reservations != key.reservations:
                dirty |= self._follow_reservations()
            for unit in dirty:
                self._decide(unit)
        self.key = key

    # -- the inventory: one device scan per version ---------------------------------------------------------

    def _rebuild(self) -> None:
        sql, params = device_rows_sql()
        columns, rows = fetch_rows(sql, params, analytic=True)
        assert tuple(columns) == DEVICE_COLUMNS, columns
        units: dict[tuple, Unit] = {}
        by_device: dict[DeviceKey, Unit] = {}
        # Tens of thousands of rows: plain tuples, one dict probe per device.
        for cluster_id, cluster, node, driver, pool, name, product, tainted, invalid, partitioned, unit_name in rows:
            # The same grouping as units_sql's GROUP BY: the devices of one unit.
            ukey = (cluster_id, node, driver, product, unit_name, partitioned)
            unit = units.get(ukey)
            if unit is None:
                unit = units[ukey] = Unit((cluster_id, driver, product or ""), FREE)
            # A unit is tainted if any of its devices is, invalid if its pool is (and it is not tainted).
            if tainted:
                unit.idle = TAINTED
            elif invalid and unit.idle == FREE:
                unit.idle = INVALID
            by_device[(cluster, driver, pool, name)] = unit
        groups: dict[GroupKey, dict[str, int]] = {}
        for ukey, unit in units.items():
            counts = groups.get(unit.group)
            if counts is None:
                counts = groups[unit.group] = dict.fromkeys(COLUMNS, 0)
            unit.state = unit.idle
            counts[unit.idle] += 1
            counts["total"] += 1
            counts["partitioned"] += ukey[5]
        self.units_by_device, self.groups = by_device, groups
        self.allocations, self.claim_allocations = {}, {}
        self.multi_consumer = self._multi_consumer_claims()
        held = set()
        for row in self._allocation_rows():
            unit = self._add(*row)
            if unit is not None:
                held.add(unit)
        for unit in held:
            self._decide(unit)

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

    def _add(self, alloc_id: int, device: DeviceKey, claim_id: int, admin_access: bool) -> Unit | None:
        # Admin access does not consume the device (upstream), and a device gone from the inventory has no
        # unit; both are remembered so that the id diff does not fetch them again.
        unit = None if admin_access else self.units_by_device.get(device)
        self.allocations[alloc_id] = (unit, claim_id)
        if unit is not None:
            unit.claims[claim_id] = unit.claims.get(claim_id, 0) + 1
            self.claim_allocations.setdefault(claim_id, set()).add(alloc_id)
        return unit

    def _remove(self, alloc_id: int) -> Unit | None:
        unit, claim_id = self.allocations.pop(alloc_id)
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
            unit.state = state
