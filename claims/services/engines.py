"""One long-lived allocation engine per worker process and fleet snapshot, shared by every allocator.

Building an ``Engine`` (device models, CEL selector memos) costs far more than a round, so it is kept and its
in-use state is brought up to date from the allocation rows at the start of every round: rows that
disappeared are released, rows that appeared (other workers, other allocators) are committed. The rows come
from ``fleet.rows_in_use``, which follows the change log; when it can say which rows a read touched, only
those are compared (a round costs what changed, not the size of the fleet), else the whole set is. The
claims round, the gang worker and (later) queue admission all ask this cache, so a process holds one engine,
not one per allocator. ``rows`` is what the engine currently counts, by row id: the rows read plus the
round's own writes (``note_written``), which the log brings back later and which are then not counted twice.

A decision pass (a claims round, a gang placement) uses the engine through one ``session()``: the session
owns what the pass may do to the cache's state -- ``poison`` it (an engine call raised half-way), ``invalidate``
it (the unique index refused a write: the engine and the fleet view are both in doubt), reset it when the pass
raises, and settle it (``memory.settle``) when a pass that used it ends. Nothing outside this module writes
the cache's state.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from claims.services import fleet
from dra.engine import AllocatedDevice, Engine, memory
from dra.gang import GangPlacer


class EngineCache:
    def __init__(self, long_lived: bool = False) -> None:
        # long_lived: the worker's cache (its engine lives until the fleet changes) freezes the engine out of
        # the garbage collector's sight; a per-request cache (simulate) must not, or it would never be freed.
        self.long_lived = long_lived
        self.reset()

    def reset(self) -> None:
        self.key: tuple | None = None
        self.engine: Engine | None = None
        self.placer: GangPlacer | None = None
        self.rows: dict[int, AllocatedDevice] = {}
        self.synced: tuple[object, int] | None = None  # (row source, generation) ``rows`` was last brought to
        # Set when an engine call raised half-way: its in-use state may be inconsistent; rebuild next round.
        self.poisoned = False
        if self.long_lived:  # what the engine counted is in doubt: so is the worker's copy of the rows
            fleet.reset_rows()

    def engine_for(self, view, rows: Mapping[int, AllocatedDevice]) -> Engine:
        if self.engine is None or self.key != view.key or self.poisoned:
            # The clusters the new view did not rebuild (fleet.current_view keeps their inventory objects)
            # keep their device models: an inventory push costs its cluster's build, not the fleet's. Not after
            # a failure half-way (poisoned): then everything is built afresh.
            old = self.engine
            reuse = old.clusters if old is not None and not self.poisoned else None
            plain = rows.snapshot() if isinstance(rows, fleet.InUse) else dict(rows)  # kept: ours to change
            self.poisoned = False
            self.engine = self.placer = None
            if self.long_lived:  # the old engine was frozen out of the collector's sight: free it now
                if reuse is None:
                    memory.release_frozen()  # before the build: the process holds one engine at a time
                with memory.collector_paused():
                    engine = Engine(view.snapshot, list(plain.values()), reuse=reuse)
                if old is not None and reuse is not None:
                    # Nothing else holds the old engine (rounds and passes ask this cache each time): its
                    # cycles broken, reference counting frees it, and the models it shares live on.
                    old.dispose(keep=engine.clusters.values())
                    memory.release_frozen(disposed=True)
                self.engine = engine
                memory.freeze_long_lived(self.engine)
            else:
                self.engine = Engine(view.snapshot, list(plain.values()), reuse=reuse)
            self.key = view.key
            self.rows = plain
        else:
            touched = self._touched(rows)
            ids = self.rows.keys() | rows.keys() if touched is None else touched
            gone = [self.rows.pop(i) for i in ids if i in self.rows and i not in rows]
            new = {i: rows[i] for i in ids if i in rows and i not in self.rows}
            if gone:
                self.engine.release(gone)
            if new:
                self.engine.commit(list(new.values()))
                self.rows.update(new)
        self.synced = (rows.source, rows.generation) if isinstance(rows, fleet.InUse) else None
        return self.engine

    def settle(self) -> None:
        """After a round: the worker freezes what the round left alive (``memory.settle``)."""
        if self.long_lived and self.engine is not None and memory.settles():
            memory.settle()

    def _touched(self, rows) -> set[int] | None:
        """The row ids that may differ between ``rows`` and what the engine counts, when known."""
        if self.synced is None or not isinstance(rows, fleet.InUse) or rows.source is not self.synced[0]:
            return None
        return rows.touched(self.synced[1])

    def placer_for(self, view, rows: Mapping[int, AllocatedDevice]) -> GangPlacer:
        """A gang placer over the same engine (it commits the placements it returns into that engine)."""
        engine = self.engine_for(view, rows)
        if self.placer is None:
            self.placer = GangPlacer(engine, view.snapshot)
        return self.placer

    def note_written(self, written: list[tuple]) -> None:
        """``written``: (id, cluster, driver, pool, device, share_id, consumed_capacity, admin_access) rows."""
        for row_id, cluster, driver, pool, device, share_id, consumed, admin in written:
            if row_id is None:  # a backend that did not tell: the next round re-reads and resyncs
                self.reset()
                return
            self.rows[row_id] = AllocatedDevice(cluster, driver, pool, device, share_id or None, consumed or None,
                                                admin)


    def poison(self) -> None:
        """An engine call raised half-way: its in-use state may be inconsistent; rebuilt at the next use."""
        self.poisoned = True


class EngineSession:
    """One decision pass's use of an ``EngineCache`` (see ``session``)."""

    def __init__(self, cache: EngineCache) -> None:
        self.cache = cache
        self.used = False

    def engine_for(self, view, rows: Mapping[int, AllocatedDevice]) -> Engine:
        self.used = True
        return self.cache.engine_for(view, rows)

    def placer_for(self, view, rows: Mapping[int, AllocatedDevice]) -> GangPlacer:
        self.used = True
        return self.cache.placer_for(view, rows)

    def note_written(self, written: list[tuple]) -> None:
        self.cache.note_written(written)

    @property
    def poisoned(self) -> bool:
        return self.cache.poisoned

    def poison(self) -> None:
        self.cache.poison()

    def invalidate(self) -> None:
        """The unique index refused a row: something slipped past the checks, so neither what the engine
        counts nor the cached fleet view is trusted; both are rebuilt at the next use."""
        self.cache.reset()
        fleet.invalidate(hard=True)


@contextmanager
def session(cache: EngineCache | None = None) -> Iterator[EngineSession]:
    """The engine for one decision pass. A pass that raises resets the cache (its in-use state may now disagree
    with the database); a pass that used the engine settles it when it ends (what the pass left alive leaves
    the collector's generations, ``dra.engine.memory``)."""
    current = EngineSession(engines if cache is None else cache)
    try:
        yield current
    except BaseException:
        current.cache.reset()
        raise
    if current.used:
        current.cache.settle()


engines = EngineCache(long_lived=True)
