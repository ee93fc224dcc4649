"""Garbage-collector policy for a process that keeps a large, long-lived engine (a worker).

CPython's cyclic collector pauses the process for a time proportional to the objects it scans. A full
collection scans every tracked object that is not frozen, and a young one everything that survived since
the last full one. A worker holds about a million long-lived objects at 40,000 devices (the engine, the
fleet snapshot, the CEL caches); scanned, that is 0.2-0.6 s of CPU per full collection, more in wall time on
a loaded machine. So the worker keeps what lives long out of the collector's sight (``gc.freeze``), and
keeps it that way as things are added:

- ``freeze_long_lived(engine)`` after building an engine: builds its lazily-made parts first (every
  device's CEL view, the CEL parser's tables), then freezes everything. The old engine was let go and
  collected just before the build (``release_frozen``): an engine is full of reference cycles (device <->
  pool, device <-> CEL view, engine <-> its indexes) that reference counting alone never frees. An engine
  replaced because one cluster changed is instead disposed of (``Engine.dispose`` breaks those cycles, and
  the new engine reuses the other clusters' models), so reference counting frees it frozen as it is; the
  full collection (1.4 s at 40,000 devices) then runs at most every ``FULL_COLLECT_SECONDS``.
- ``settle()`` after every allocation round: what the round left behind that is still alive (compiled CEL
  programs and their parse trees, cached plans, selector sets, node candidate lists, the rows read) joins
  the frozen set, after a collection that only has to scan what is new since the last round. So the
  collector's own generations stay small: no collection, young or full, has much to scan. Evicted cache
  entries are freed by reference counting (they hold no cycles), frozen or not.
- ``worker_start()`` in the worker's main process before the pool forks: the thresholds below, and
  everything imported so far frozen.
- Big builds (an engine, the fleet snapshot that is rebuilt every minute) run with the collector paused
  (``collector_paused``): building a million objects otherwise triggers a dozen full collections of
  geometrically growing size (0.1-0.55 s each were measured in the soak), all finding nothing. In a worker
  what they built is frozen at once, before a young collection would scan all of it. Likewise a settle
  that finds more than ``SETTLE_COLLECT_LIMIT`` new objects freezes them without collecting. The little
  cyclic garbage frozen that way (~15 objects per snapshot rebuild were measured) stays until the engine
  is replaced, when ``release_frozen`` unfreezes and collects everything.

Thresholds (``tune``, set at the worker's start): a young collection scans up to ``YOUNG_THRESHOLD`` new
objects plus the survivors of the previous ones. The interpreter's 700 runs one every few hundred
allocations, thousands per round, for objects that reference counting frees anyway; 50,000 (this module's
earlier value) made each young collection scan 50,000 objects and each middle one up to ten times that
(0.1 s CPU measured in the soak). 10,000 keeps both a few milliseconds.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dra.cel import compile_expression

if TYPE_CHECKING:
    from .engine import Engine

YOUNG_THRESHOLD = 10_000
# Above this many unfrozen objects a collection would take tens of milliseconds: settle freezes them unscanned.
SETTLE_COLLECT_LIMIT = 50_000
# At most this often a replaced, disposed engine is followed by a full collection (see ``release_frozen``).
FULL_COLLECT_SECONDS = 600.0
_last_full = 0.0
_tuned = False
_freezing = False  # this process keeps its long-lived objects frozen (a worker, or it froze an engine)
_engine_frozen = False  # an engine was frozen since the last release_frozen: a replacement must collect it
_worker = False  # worker_start() ran: this process only allocates, so it may freeze what each round leaves


def tune() -> None:
    """Once per process (the worker's start): the collection thresholds above."""
    global _tuned
    if not _tuned:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, gen1, gen2)
        _tuned = True


def worker_start() -> None:
    """The worker's main process, before its pool forks: the thresholds, and everything imported so far
    frozen (the children start with an empty young generation, and copy-on-write pages stay shared)."""
    global _freezing, _worker
    tune()
    _freezing = _worker = True
    gc.freeze()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection while building a large structure that lives on (nothing it makes is garbage
    worth a scan of everything it made so far). In a process that keeps its long-lived objects frozen (a
    worker, once it froze an engine) what was built is frozen at once: left in the young generation, the next
    young collection would scan all of it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _freezing:
            gc.freeze()
        if enabled:
            gc.enable()


def release_frozen(disposed: bool = False) -> None:
    """After dropping a frozen engine (and before building the next): make everything collectable again and
    collect the old engine now, while the process holds only one. Nothing to do before the first engine.
    ``disposed``: the old engine's cycles were broken (``Engine.dispose``), so reference counting freed it,
    frozen or not; then the full collection (over a second at 40,000 devices, for a change in one cluster)
    runs only if the last one is older than ``FULL_COLLECT_SECONDS``: it is still what frees the little cyclic
    garbage ``settle`` froze."""
    global _engine_frozen, _last_full
    if _engine_frozen and (not disposed or time.monotonic() - _last_full > FULL_COLLECT_SECONDS):
        gc.unfreeze()
        gc.collect()
        _engine_frozen = False
        _last_full = time.monotonic()


def freeze_long_lived(engine: Engine | None = None) -> None:
    """After building a long-lived engine (right after ``release_frozen``): build its devices' CEL views
    (selectors would on first use), then freeze everything. No collection first: ``release_frozen`` just
    did one, and the build made little garbage (it is reclaimed with the engine)."""
    global _freezing, _engine_frozen, _last_full
    tune()
    if not _last_full:  # the first engine: counts as a fresh start for FULL_COLLECT_SECONDS
        _last_full = time.monotonic()
    _freezing = _engine_frozen = True
    with collector_paused():
        if engine is not None:
            engine.build_cel_views()
            compile_expression("true")  # the CEL parser's grammar tables (~10,000 objects) are built on first use


def settles() -> bool:
    """Does this process freeze what each round leaves alive? Only a worker: a web process that runs rounds
    (the embedded runner) also serves requests, whose objects alive at that moment would be frozen too, and
    the cyclic garbage they become later kept until the next engine replacement."""
    return _worker


def settle() -> int:
    """After a round: collect the garbage among the objects made since the last settle (only those are
    scanned) and freeze the rest. Returns how many objects were new."""
    new = len(gc.get_objects())
    if new <= SETTLE_COLLECT_LIMIT:
        gc.collect()
    gc.freeze()
    return new
