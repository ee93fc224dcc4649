"""SelectorCache: remember (expression, relevant device content) -> result.

An expression's result depends only on the parts of `device` it reads (its footprint, see
analysis.py). The memo key is therefore the expression plus the *projection* of the device onto
that footprint: a device that has not changed is never evaluated twice, and neither is a device
that differs from an already-evaluated one only in parts the expression does not read (uuid,
PCI address, ...). When the footprint cannot be determined statically, the projection is the
whole device content key, i.e. the plain (expression, device) memo.

Errors are cached like results: a device that fails an expression fails it again, with the same
CELRuntimeError, until its relevant content changes.

The memo is bounded by two generations: entries go into the current generation; when it is
full it becomes the previous one (the one before is dropped), and a hit in the previous
generation is copied forward. Hot entries therefore survive, lookups need no LRU bookkeeping,
and memory stays under `max_entries`.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

from .analysis import Footprint
from .compiler import COMPILED_CACHE_SIZE, CompiledExpression, compile_expression
from .device import CELDevice, DeviceView
from .errors import CELRuntimeError
from .meter import CostMeter, current_meter

_MISSING = ("<missing>",)
_fp_ids: dict[Footprint | None, int] = {}
_fp_lock = threading.Lock()
_fp_counter = itertools.count()
# Distinct footprints grow with distinct expression shapes. Past this many the table is
# dropped; ids are never reused, so a stale id on a device view can never be mistaken for
# another footprint (it is simply never looked up again).
_MAX_FOOTPRINTS = 50_000


def _footprint_id(fp: Footprint | None) -> int:
    # Footprints are interned to small ints so per-device projection lookups hash an int.
    fid = _fp_ids.get(fp)
    if fid is None:
        with _fp_lock:
            fid = _fp_ids.get(fp)
            if fid is None:
                if len(_fp_ids) >= _MAX_FOOTPRINTS:
                    _fp_ids.clear()
                fid = _fp_ids[fp] = next(_fp_counter)
    return fid


class _Projection:
    """One distinct projection. Interned: equal projections are the same object, so memo
    lookups hash and compare by identity (tuples of strings would be re-hashed and compared
    element by element on every lookup)."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple):
        self.parts = parts


_interned: dict[tuple, _Projection] = {}
# Distinct projections grow with distinct relevant device content; past this many the table is
# dropped and rebuilt (which only costs re-evaluating some memo entries once).
_MAX_INTERNED = 1_000_000


def _intern(parts: tuple) -> _Projection:
    proj = _interned.get(parts)
    if proj is None:
        if len(_interned) >= _MAX_INTERNED:
            _interned.clear()
        proj = _interned.setdefault(parts, _Projection(parts))
    return proj


def projection(footprint: Footprint | None, view: DeviceView, device: CELDevice) -> tuple:
    """The content of `view` that an expression with this footprint can observe."""
    if footprint is None:
        return ("all", device.key())
    flat, names = view.flat, view.names
    # Domain lists feed the "which domains does the device have" hint of a failed lookup.
    parts: list = [view.domains] if (footprint.paths or footprint.domains or footprint.domain_sets) else []
    if footprint.driver:
        parts.append(view.driver)
    if footprint.multi:
        parts.append(view.multi)
    for path in footprint.paths:
        parts.append(flat.get(path, _MISSING))
    for kind, domain in footprint.domains:
        if kind.endswith("#names"):
            parts.append(names.get((kind[0], domain), ()))
        else:
            parts.append(tuple(sorted((k[2], v) for k, v in flat.items() if k[0] == kind and k[1] == domain)))
    if view.error is not None:
        parts.append(("error", view.error))
    return tuple(parts)


def reset_shared_caches() -> None:
    """Forget the process-wide content-addressed device views and interned projections (for
    benchmarks and tests that need a cold start; never needed for correctness)."""
    from .device import _views

    _views.clear()
    _interned.clear()


class _Entry:
    __slots__ = ("compiled", "fp", "fp_id", "drivers")

    def __init__(self, compiled: CompiledExpression):
        self.compiled = compiled
        self.fp = compiled.footprint
        self.fp_id = _footprint_id(compiled.footprint)
        self.drivers = compiled.drivers


class SelectorCache:
    """Bounded memo of selector results for one process; safe to share between threads
    (lookups rely on dict operations being atomic under the GIL; inserts and generation
    switches take a lock)."""

    def __init__(self, max_entries: int = 200_000, *, consumable_capacity: bool = True):
        self.max_entries = max_entries
        self.consumable_capacity = consumable_capacity
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        # expression -> {projection -> result}; two levels so a lookup hashes only the
        # (interned, identity-hashed) projection.
        self._current: dict[str, dict] = {}
        self._previous: dict[str, dict] = {}
        self._current_size = 0
        self._hits = 0
        self._evaluations = 0
        self._index_skips = 0
        self._generations = 0

    def compiled(self, expression: str) -> CompiledExpression:
        return self._entry(expression).compiled

    def _entry(self, expression: str) -> _Entry:
        entry = self._entries.get(expression)
        if entry is None:
            entry = _Entry(compile_expression(expression, consumable_capacity=self.consumable_capacity))
            with self._lock:
                # No more entries than compile_expression's LRU keeps: an entry holds its compiled program
                # alive (~40 KB), so a larger map here would defeat that bound.
                if len(self._entries) >= COMPILED_CACHE_SIZE:
                    self._entries.clear()
                self._entries[expression] = entry
        return entry

    def _results(self, expression: str) -> dict:
        results = self._current.get(expression)
        if results is None:
            with self._lock:
                results = self._current.setdefault(expression, {})
        return results

    def _lookup(self, entry: _Entry, expression: str, device: CELDevice, meter: CostMeter | None = None):
        """(result, was_cached) for one device, evaluating and memoising on a miss."""
        view = device._view or device.view()
        proj = view.projections.get(entry.fp_id)
        if proj is None:
            proj = _intern(projection(entry.fp, view, device))
            view.projections[entry.fp_id] = proj
        results = self._results(expression)
        result = results.get(proj)
        if result is not None:
            return result, True
        old = self._previous.get(expression)
        result = old.get(proj) if old is not None else None
        if result is not None:
            self._store(expression, proj, result)
            return result, True
        try:
            # CostBudgetExhausted (the caller's shared budget ran out) propagates unmemoised.
            result = entry.compiled.evaluate_view(view, meter=meter or current_meter())
        except CELRuntimeError as exc:
            result = exc
        with self._lock:
            self._evaluations += 1
        self._store(expression, proj, result)
        return result, False

    def _store(self, expression: str, proj: _Projection, result) -> None:
        with self._lock:
            self._current.setdefault(expression, {})[proj] = result
            self._current_size += 1
            if self._current_size >= self.max_entries // 2:
                self._previous = self._current
                self._current = {}
                self._current_size = 0
                self._generations += 1

    def evaluate(self, expression: str, device: CELDevice, *, meter: CostMeter | None = None) -> bool:
        """Result of `expression` for `device`; raises CELCompileError, or the (cached)
        CELRuntimeError. A `meter` bounds the cost of all evaluations charged to it (a cached
        result costs nothing); CostBudgetExhausted when it runs out."""
        result, hit = self._lookup(self._entry(expression), expression, device, meter)
        if hit:
            with self._lock:
                self._hits += 1
        if isinstance(result, CELRuntimeError):
            raise result
        return result

    def evaluate_many(self, expression: str, devices: Iterable[CELDevice], *,
                      use_driver_index: bool = True) -> list[bool | CELRuntimeError]:
        """Results for many devices, in order; errors are returned, not raised. With the driver
        index, a device whose driver the expression excludes is False without a lookup (unless
        its content is unusable, which upstream reports as an error for any expression)."""
        entry = self._entry(expression)
        drivers = entry.drivers if use_driver_index else None
        fp_id = entry.fp_id
        out: list[bool | CELRuntimeError] = []
        append = out.append
        skips = misses = 0
        results = self._results(expression)
        for device in devices:
            view = device._view or device.view()
            if drivers is not None and device.driver not in drivers and view.error is None:
                append(False)
                skips += 1
                continue
            # Fast path, the common case on an unchanged fleet: projection and result known.
            proj = view.projections.get(fp_id)
            if proj is not None:
                result = results.get(proj)
                if result is not None:
                    append(result)
                    continue
            result, hit = self._lookup(entry, expression, device)
            misses += not hit
            append(result)
            results = self._results(expression)  # a generation switch may have replaced it
        with self._lock:
            self._hits += len(out) - skips - misses
            self._index_skips += skips
        return out

    def footprint_key(self, expressions: Iterable[str]) -> tuple[int, ...]:
        """Equal keys: ``group_by_projection`` groups any devices alike for these expressions."""
        return tuple(sorted({self._entry(expression).fp_id for expression in expressions}))

    def group_by_projection(self, expressions: Iterable[str], devices: list[CELDevice],
                            max_groups: int) -> list[list[int]] | None:
        """Positions of ``devices`` in groups whose members are indistinguishable to every one of
        ``expressions``: equal driver, equal usability and equal projection onto each footprint, so
        one member's results (memoised, or raised as errors) are every member's. None when there
        would be more than ``max_groups`` groups (the footprints read per-device values such as a
        uuid, or cannot be determined): then grouping saves nothing. Evaluates nothing and charges
        no meter. A fleet of identical GPUs is one group, whatever commit id the text carries."""
        fps: dict[int, Footprint | None] = {}
        for expression in expressions:
            entry = self._entry(expression)
            fps[entry.fp_id] = entry.fp
        footprints = list(fps.items())
        groups: dict[tuple, list[int]] = {}
        for pos, device in enumerate(devices):
            view = device._view or device.view()
            projections = view.projections
            key: list = [device.driver, view.error is None]
            for fp_id, fp in footprints:
                proj = projections.get(fp_id)
                if proj is None:
                    proj = projections[fp_id] = _intern(projection(fp, view, device))
                key.append(proj)
            members = groups.get(tuple(key))
            if members is None:
                if len(groups) >= max_groups:
                    return None
                groups[tuple(key)] = [pos]
            else:
                members.append(pos)
        return list(groups.values())

    def clear(self) -> None:
        with self._lock:
            self._current = {}
            self._previous = {}
            self._current_size = 0

    def stats(self) -> dict:
        with self._lock:
            return {
                "entries": self._current_size + sum(len(v) for v in self._previous.values()),
                "max_entries": self.max_entries,
                "hits": self._hits,
                "evaluations": self._evaluations,
                "driver_index_skips": self._index_skips,
                "generations": self._generations,
                "expressions": len(self._entries),
            }
