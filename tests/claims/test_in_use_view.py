"""``fleet.InUse``: a read of the devices in use is a view of the worker's rows, not a copy of them, and still
answers as of its read while later reads move the rows on. (The reads against a real change log:
test_rows_in_use.py.)"""
from __future__ import annotations

import gc
import threading

from claims.services import fleet
from dra.engine import AllocatedDevice


def row(device: str) -> AllocatedDevice:
    return AllocatedDevice("c1", "gpu.example.com", "node-1", device, None, None, False)


class Log:
    """The change log's entries the next read returns: (seq, row id, kind, row fields or None)."""

    truncated = False
    seq = 0

    def __init__(self) -> None:
        self.entries: list[tuple] = []

    def read(self) -> list[tuple]:
        out, self.entries = self.entries, []
        return out


def fields(device: str) -> tuple:
    return ("c1", "gpu.example.com", "node-1", device, None, None, False)


def cache_with(rows: dict[int, AllocatedDevice]) -> tuple[fleet._RowCache, Log]:
    cache, log = fleet._RowCache(), Log()
    cache.rows, cache.stale, cache.follower = dict(rows), False, log  # type: ignore[assignment]
    return cache, log


def test_a_read_shares_the_rows_instead_of_copying_them():
    cache, _ = cache_with({i: row(f"gpu-{i}") for i in range(1000)})
    first, second = cache.read(), cache.read()
    assert first._rows is cache.rows and second._rows is cache.rows
    assert first == second == {i: row(f"gpu-{i}") for i in range(1000)}


def test_an_older_view_answers_as_of_its_read_while_later_reads_move_on():
    cache, log = cache_with({1: row("gpu-1"), 2: row("gpu-2"), 3: row("gpu-3")})
    before = cache.read()
    log.entries = [(10, 2, "DELETED", None), (11, 4, "ADDED", fields("gpu-4")), (12, 1, "DELETED", None),
                   (13, 1, "ADDED", fields("gpu-9")), (14, 5, "ADDED", fields("gpu-5")), (15, 5, "DELETED", None)]
    after = cache.read()
    assert dict(after.items()) == {1: row("gpu-9"), 3: row("gpu-3"), 4: row("gpu-4")}
    assert dict(before.items()) == {1: row("gpu-1"), 2: row("gpu-2"), 3: row("gpu-3")}
    # Every kind of lookup, on both, agrees with its own read.
    assert (len(before), len(after)) == (3, 3)
    assert 2 in before and 2 not in after and 4 in after and 4 not in before and 5 not in before
    assert before[1] == row("gpu-1") and after[1] == row("gpu-9")
    assert before.get(4) is None and after.get(2) is None
    assert sorted(before) == [1, 2, 3] and sorted(after) == [1, 3, 4]
    assert set(before.keys()) | set(after.keys()) == {1, 2, 3, 4}
    # Saved per changed row only, never the table.
    assert set(before._before) == {1, 2, 4, 5} and after._before == {}


def test_a_view_nobody_holds_costs_nothing_later():
    cache, log = cache_with({1: row("gpu-1")})
    view = cache.read()
    del view
    gc.collect()
    held = cache.read()
    log.entries = [(10, 1, "DELETED", None)]
    cache.read()
    assert len(cache.views) == 2 and held._before == {1: row("gpu-1")}  # the dropped view is gone from the set


def test_a_full_read_leaves_the_old_rows_to_the_old_views(monkeypatch):
    cache, log = cache_with({1: row("gpu-1"), 2: row("gpu-2")})
    old = cache.read()
    monkeypatch.setattr(fleet.changes, "settled", lambda: 20)
    monkeypatch.setattr(fleet.changes, "last_seq", lambda: 20)
    monkeypatch.setattr(fleet.DeviceAllocation.objects, "values_list", lambda *a, **k: [2, 3])
    monkeypatch.setattr(fleet, "_fetch", lambda ids, scan=False: {i: row(f"gpu-{i}") for i in ids})
    monkeypatch.setattr(fleet.changes, "Follower", lambda *a: log)
    cache.reset()
    new = cache.read()
    assert dict(new.items()) == {2: row("gpu-2"), 3: row("gpu-3")}
    assert dict(old.items()) == {1: row("gpu-1"), 2: row("gpu-2")} and old._rows is not cache.rows


def test_readers_in_other_threads_see_a_consistent_view():
    """Web threads (simulate, explain) read while the worker's cache moves on: a view never changes under
    them, and never raises for a dict changed during iteration."""
    cache, log = cache_with({i: row(f"gpu-{i}") for i in range(200)})
    view = cache.read()
    expected = dict(view.items())
    stop, errors = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            try:
                assert dict(view.items()) == expected and len(view) == 200 and all(i in view for i in range(200))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for n in range(300):
        log.entries = [(n * 2, n % 200, "DELETED", None), (n * 2 + 1, 1000 + n, "ADDED", fields(f"gpu-x{n}"))]
        cache.read()
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
