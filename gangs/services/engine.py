"""One long-lived ``Engine`` + ``GangPlacer`` per worker process and fleet snapshot.

Building an engine (device models, CEL selector indexes) costs far more than placing a gang, so it is kept
and brought up to date at the start of every attempt from the allocation rows: rows that disappeared are
released, rows that appeared (the claims round, other gang workers) are committed. The same approach as the
claims app's own engine cache, kept separately because that one is private to the claims round.
"""
from __future__ import annotations

from claims.models import DeviceAllocation


class PlacerCache:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.key = None
        self.engine = None
        self.placer = None
        self.rows: dict[int, object] = {}

    def placer_for(self, view, rows: dict[int, object]):
        from dra.engine import Engine
        from dra.gang import GangPlacer

        if self.engine is None or self.key != view.key:
            self.engine = Engine(view.snapshot, list(rows.values()))
            self.placer = GangPlacer(self.engine, view.snapshot)
            self.key = view.key
        else:
            gone = [self.rows[i] for i in self.rows.keys() - rows.keys()]
            new = [rows[i] for i in rows.keys() - self.rows.keys()]
            if gone:
                self.engine.release(gone)
            if new:
                self.engine.commit(new)
        self.rows = dict(rows)
        return self.placer

    def note_written(self, rows: list[DeviceAllocation]) -> None:
        from dra.engine import AllocatedDevice

        for r in rows:
            if r.pk is None:  # no RETURNING: resync from scratch next time
                self.reset()
                return
            self.rows[r.pk] = AllocatedDevice(r.cluster, r.driver, r.pool, r.device, r.share_id or None,
                                              r.consumed_capacity or None, r.admin_access)


placers = PlacerCache()
