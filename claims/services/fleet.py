"""What the worker needs from the inventory: a snapshot, the versions it was built from, devices in use.

Building a ``FleetSnapshot`` reads every slice of the fleet, so it is cached per process and rebuilt only
when the fleet's fingerprint changes: per cluster its ``inventory_version`` and live staleness, plus the
fleet-wide DeviceClasses and DeviceTaintRules. The fingerprint is read BEFORE the snapshot is built, so a
snapshot is never older than its key claims; the write step re-checks the versions under lock
(``claims.services.locking``), which is what makes a stale cache harmless rather than merely unlikely.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from django.db import connection
from django.utils import timezone

from claims.models import DeviceAllocation
from dra.engine import AllocatedDevice, FleetSnapshot, memory
from draservice import changes
from draservice.prepared import Prepared
from inventory.snapshot import build_fleet_snapshot, stored_digests

# A backstop: even with an unchanged fingerprint, check this often that the stored slices and nodes are what the
# view was built from (a slice or node edited by someone who forgot to bump the cluster's inventory version).
# A check is two aggregate queries (slices, nodes); only a cluster that differs is rebuilt.
SNAPSHOT_MAX_AGE_SECONDS = 60.0


@dataclass
class FleetView:
    key: tuple
    snapshot: FleetSnapshot
    cluster_versions: dict[str, tuple[int, tuple]]  # name -> (cluster id, (inventory_version, stale_since))
    cluster_labels: list[tuple[str, dict]]
    counter_pools: set[tuple[str, str, str]] = field(default_factory=set)  # pools with sharedCounters
    built_at: float = 0.0  # when the backstop last found the stored inventory as built (monotonic)
    # Per cluster name: the fingerprint part its ClusterInventory was built for, and the stored digest then.
    parts: dict[str, tuple] = field(default_factory=dict)
    digests: dict[str, tuple] = field(default_factory=dict)


_cache_lock = threading.Lock()
_cache: FleetView | None = None


def fingerprint() -> tuple[tuple, dict[str, tuple[int, tuple]], list[tuple[str, dict]]]:
    """What the snapshot depends on, in ONE query (it runs every round): per cluster its inventory version,
    staleness and labels; fleet-wide the DeviceClasses' and DeviceTaintRules' count and newest change."""
    now = timezone.now()
    versions: dict[str, tuple[int, tuple]] = {}
    labels: list[tuple[str, dict]] = []
    parts = []
    fleet_part: tuple = ()
    for c in _FINGERPRINT.rows():
        stale = c.is_stale(now) or c.stale_since is not None
        versions[c.name] = (c.id, (c.inventory_version, c.stale_since))
        labels.append((c.name, c.labels or {}))
        parts.append((c.id, c.inventory_version, stale, tuple(sorted((c.labels or {}).items()))))
        fleet_part = (c.classes_n, str(c.classes_t), c.classes_v, c.rules_n, str(c.rules_t), c.rules_v)
    return (tuple(parts), fleet_part), versions, labels


def _fingerprint_query():
    from django.db.models.expressions import RawSQL

    from inventory.models import Cluster, DeviceClass, DeviceTaintRule

    def agg(model, expr):
        return RawSQL(f"SELECT {expr} FROM {connection.ops.quote_name(model._meta.db_table)}", [])

    return (Cluster.objects.only("id", "name", "labels", "inventory_version", "last_sync_at", "last_heartbeat_at",
                                 "stale_since").order_by("id")
            .annotate(classes_n=agg(DeviceClass, "count(*)"), classes_t=agg(DeviceClass, "max(updated_at)"),
                      classes_v=agg(DeviceClass, "max(resource_version)"), rules_n=agg(DeviceTaintRule, "count(*)"),
                      rules_t=agg(DeviceTaintRule, "max(updated_at)"),
                      rules_v=agg(DeviceTaintRule, "max(resource_version)")))


_FINGERPRINT = Prepared(_fingerprint_query, ())  # every round asks: compiled once per thread and connection


def current_view() -> FleetView:
    """The fleet as of now (cached per process while the fingerprint holds). A changed fingerprint rebuilds
    only the clusters whose part of it changed (all of them when the fleet-wide classes or rules did): the
    others keep their ``ClusterInventory`` objects, and the engine cache its device models for them."""
    global _cache
    key, versions, labels = fingerprint()
    with _cache_lock:
        cached = _cache
    drifted: set[str] = set()
    if cached is not None and cached.key == key:
        if time.monotonic() - cached.built_at < SNAPSHOT_MAX_AGE_SECONDS:
            return cached
        drifted = _drifted(cached)
        if not drifted:
            cached.built_at = time.monotonic()
            return cached
    view = _build_view(key, versions, labels, cached, drifted)
    with _cache_lock:
        _cache = view
    return view


def _build_view(key: tuple, versions: dict, labels: list, cached: FleetView | None, drifted: set[str]) -> FleetView:
    parts = {name: part for name, part in zip((n for n, _ in labels), key[0], strict=True)}
    keep = {}
    if cached is not None and cached.key[1] == key[1]:  # the fleet-wide part (classes, rules) is unchanged
        keep = {inv.name: inv for inv in cached.snapshot.clusters
                if inv.name not in drifted and cached.parts.get(inv.name) == parts.get(inv.name)}
    changed = [name for name in parts if name not in keep]
    digests = {name: d for name, d in (cached.digests.items() if cached is not None else ()) if name in keep}
    digests.update(stored_digests(changed))  # before the build: a later edit shows as drift at the next check
    with memory.collector_paused():  # a million objects that live on: no collection finds garbage among them
        built = build_fleet_snapshot(clusters=changed) if changed or not keep else None
    if built is not None:
        by_name = {inv.name: inv for inv in built.clusters} | keep
        snapshot = FleetSnapshot(clusters=[by_name[n] for n in sorted(by_name)], device_classes=built.device_classes)
    else:
        assert cached is not None
        snapshot = FleetSnapshot(clusters=[keep[n] for n in sorted(keep)],
                                 device_classes=cached.snapshot.device_classes)
    if drifted or cached is None or {p[0] for p in cached.parts.values()} != {p[0] for p in parts.values()}:
        # Someone wrote around the service, or clusters came or went (rare; in tests, a new database world
        # whose truncated rows no log entry reports): read the rows afresh too. A push to a known cluster
        # does not: the change log carries every allocation row written since.
        _rows.reset()
    return FleetView(key=key, snapshot=snapshot, cluster_versions=versions, cluster_labels=labels,
                     counter_pools=_counter_pools(snapshot), built_at=time.monotonic(), parts=parts, digests=digests)


def _drifted(view: FleetView) -> set[str]:
    """Clusters whose stored slices or nodes differ from what ``view`` was built from."""
    now = stored_digests(list(view.digests))
    return {name for name, digest in view.digests.items() if now.get(name) != digest}


def invalidate(hard: bool = False) -> None:
    """The inventory changed (or may have). Soft: the next view compares the stored slices and nodes with
    what it was built from (the backstop's digest check) besides the fingerprint, which it reads every time
    anyway; so a push still rebuilds only its cluster. Hard (after the database refused a write the view
    allowed): the next view is built from scratch."""
    global _cache
    with _cache_lock:
        if hard:
            _cache = None
        elif _cache is not None:
            _cache.built_at = float("-inf")


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


_ABSENT = object()  # a view's saved "value" of a row that did not exist at its read
_UNSAVED = object()


class InUse(Mapping[int, AllocatedDevice]):
    """The allocation rows in use, by id, as of one read of the change log; ``generation`` names that read,
    so the engine cache can ask which rows changed since the read it last applied (``touched``).

    A view of the cache's rows, not a copy: copying every row in use (tens of thousands at fleet scale) at
    every read was a fifth of a busy worker's CPU. Before the cache changes a row it saves the row as it was
    into each view still alive (``_before``), so a view answers as of its read and costs what changed after
    it, not the table. A full read gives the cache a new dict and leaves the old one to the old views.
    Lookups take the cache's lock: a web thread may read while another brings the cache up to date."""

    __slots__ = ("_rows", "_before", "_lock", "generation", "source", "__weakref__")

    def __init__(self, rows: dict, generation: int = 0, source: _RowCache | None = None) -> None:
        self._rows = rows
        self._before: dict[int, object] = {}
        self._lock = source.lock if source is not None else threading.Lock()
        self.generation, self.source = generation, source

    def touched(self, since: int) -> set[int] | None:
        return self.source.touched(since, self.generation) if self.source is not None else None

    def __getitem__(self, key: int) -> AllocatedDevice:
        with self._lock:
            value = self._before.get(key, _UNSAVED)
            if value is _UNSAVED:
                return self._rows[key]
        if value is _ABSENT:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            value = self._before.get(key, _UNSAVED)  # type: ignore[call-overload]
            return key in self._rows if value is _UNSAVED else value is not _ABSENT

    def __len__(self) -> int:
        with self._lock:
            n = len(self._rows)
            for key, value in self._before.items():
                n += (value is not _ABSENT) - (key in self._rows)
            return n

    def __iter__(self):
        return iter(self.snapshot())

    def snapshot(self) -> dict[int, AllocatedDevice]:
        """A plain dict of the rows as of the read (what a full engine build or a web thread keeps)."""
        with self._lock:
            out = self._rows.copy()
            for key, value in self._before.items():
                if value is _ABSENT:
                    out.pop(key, None)
                else:
                    out[key] = value
            return out

    def keys(self):
        return self.snapshot().keys()

    def values(self):
        return self.snapshot().values()

    def items(self):
        return self.snapshot().items()


ALLOCATIONS = "deviceallocations"  # the change log's resource for DeviceAllocation rows
JOURNAL = 64  # reads whose touched row ids are kept for the engine caches that have not caught up yet


class _RowCache:
    """The allocation rows, by id, kept current from the change log (``draservice.changes.Follower``).

    A round reads only the changes since the last one: rows added are fetched by id, rows deleted dropped.
    The whole table is read (ids, then the rows not held yet) only on the first read, when the log was
    compacted past us (``Expired``), after ``reset()`` (an engine cache that may disagree with the database)
    and whenever a new fleet view is built (an inventory change, and every ``SNAPSHOT_MAX_AGE_SECONDS``: the
    safety rebuild). Thread-safe: web threads (simulate, explain) share a process's cache.
    """

    def __init__(self):
        self.rows: dict[int, object] = {}
        self.lock = threading.Lock()
        self.follower: changes.Follower | None = None
        self.stale = True  # read the whole table next time
        self.generation = 0
        self.full_generation = 0  # no deltas reach back across a full read
        self.journal: deque[tuple[int, frozenset[int]]] = deque(maxlen=JOURNAL)
        self.rows_read = 0  # database rows the last read fetched (log entries and allocation rows): a benchmark figure
        self.views: list[weakref.ref[InUse]] = []  # views of ``rows`` (``InUse``); dead ones pruned at each read

    def reset(self) -> None:
        with self.lock:
            self.stale = True

    def read(self) -> InUse:
        with self.lock:
            if self.stale or self.follower is None:
                self._full_read()
            else:
                try:
                    entries = self.follower.read()
                except changes.Expired:
                    self._full_read()
                else:
                    if self.follower.truncated:
                        self._full_read()  # a backlog larger than a read: the table is cheaper
                    else:
                        self._apply(entries)
            out = InUse(self.rows, self.generation, self)
            self.views = [ref for ref in self.views if ref() is not None]
            self.views.append(weakref.ref(out))
            return out

    def touched(self, since: int, upto: int) -> set[int] | None:
        """Row ids added or deleted by the reads after ``since`` up to ``upto``; None when not known (a full
        read in between, or too old): diff the whole set then."""
        with self.lock:
            if since < self.full_generation or since > upto:
                return None
            entries = [ids for g, ids in self.journal if since < g <= upto]
            if len(entries) != upto - since:
                return None
            return set().union(*entries)

    def _full_read(self) -> None:
        # The position first: every change at or below it is visible to the reads below, and the changes
        # after it are replayed, harmlessly, onto rows that may already show them (per row, in seq order).
        position = changes.settled()
        # Past the log's own sequence, the follower's place means nothing: the log was emptied and its sequence
        # restarted (``manage.py flush``); kept, it would skip every change until the sequence caught up.
        if self.follower is not None and position < self.follower.seq <= changes.last_seq():
            position = self.follower.seq
        ids = set(DeviceAllocation.objects.values_list("id", flat=True))
        # A new dict: the views of the old one keep it, unchanged from now on, and need nothing saved.
        self.rows = {i: row for i, row in self.rows.items() if i in ids}
        self.views = []
        new = ids - self.rows.keys()
        self.rows.update(_fetch(new, scan=len(new) > 500))  # many new: one scan beats a huge IN
        self.rows_read = len(ids) + len(new)
        self.follower = changes.Follower(ALLOCATIONS, position, DeviceAllocation._meta.db_table, ROW_FIELDS)
        self.stale = False
        self.generation += 1
        self.full_generation = self.generation
        self.journal.clear()

    def _apply(self, entries: list[tuple[int, int, str, tuple | None]]) -> None:
        self.rows_read = len(entries)
        if not entries:
            return
        views = [view for view in (ref() for ref in self.views) if view is not None]
        for _, row_id, kind, row in entries:
            for view in views:  # what the row was at each live view's read, unless saved already
                view._before.setdefault(row_id, self.rows.get(row_id, _ABSENT))
            if kind != "ADDED":
                self.rows.pop(row_id, None)
            elif row is not None:  # None: deleted since, and its DELETED entry is in the log too
                self.rows[row_id] = _allocated(row)
        self.generation += 1
        self.journal.append((self.generation, frozenset(entry[1] for entry in entries)))


ROW_FIELDS = ("cluster", "driver", "pool", "device", "share_id", "consumed_capacity", "admin_access")


def _allocated(row: tuple) -> AllocatedDevice:
    """A row's ``ROW_FIELDS`` as the engine's ``AllocatedDevice`` (raw SQL: JSON as text, SQLite booleans
    as integers)."""
    cluster, driver, pool, device, share_id, consumed, admin = row
    if isinstance(consumed, str):
        consumed = json.loads(consumed)
    return AllocatedDevice(cluster, driver, pool, device, share_id or None, consumed or None, bool(admin))


def _fetch(ids: set[int], scan: bool = False) -> dict[int, AllocatedDevice]:
    """These allocation rows as the engine's ``AllocatedDevice``. Plain fetches, not .iterator(): server-side
    cursors cost extra round trips, and this runs every round."""
    qs = DeviceAllocation.objects.values_list("id", *ROW_FIELDS)
    qs = qs if scan else qs.filter(id__in=ids)
    return {row[0]: _allocated(row[1:]) for row in qs if row[0] in ids}


_rows = _RowCache()


def rows_in_use() -> InUse:
    """Every allocation row as the engine's ``AllocatedDevice``, by row id (read at the start of a round).
    A copy: the caller may keep it while later reads move on."""
    return _rows.read()


def reset_rows() -> None:
    """Read the whole table at the next ``rows_in_use`` (the caller's view of it may be wrong)."""
    _rows.reset()


def rows_read_last() -> int:
    """Database rows the last ``rows_in_use`` read (benchmarks)."""
    return _rows.rows_read

