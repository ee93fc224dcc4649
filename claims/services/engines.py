"""One long-lived allocation engine per worker process and fleet snapshot, shared by every allocator.

Building an ``Engine`` (device models, CEL selector memos) costs far more than a round, so it is kept and its
in-use state is brought up to date from the allocation rows at the start of every round: rows that
disappeared are released, rows that appeared (other workers, other allocators) are committed. The claims
round, the gang worker and (later) queue admission all ask this cache, so a process holds one engine, not
one per allocator. ``rows`` is what the engine currently counts, by row id.
"""
from __future__ import annotations

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
        # Set when an engine call raised half-way: its in-use state may be inconsistent; rebuild next round.
        self.poisoned = False

    def engine_for(self, view, rows: dict[int, AllocatedDevice]) -> Engine:
        if self.engine is None or self.key != view.key or self.poisoned:
            self.poisoned = False
            if self.long_lived:  # the old engine was frozen out of the collector's sight: let it go
                memory.release_frozen()
            self.engine = self.placer = None
            self.engine, self.key = Engine(view.snapshot, list(rows.values())), view.key
            if self.long_lived:
                memory.freeze_long_lived(self.engine)
        else:
            gone = [self.rows[i] for i in self.rows.keys() - rows.keys()]
            new = [rows[i] for i in rows.keys() - self.rows.keys()]
            if gone:
                self.engine.release(gone)
            if new:
                self.engine.commit(new)
        self.rows = dict(rows)
        return self.engine

    def placer_for(self, view, rows: dict[int, AllocatedDevice]) -> GangPlacer:
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


engines = EngineCache(long_lived=True)
