"""SelectorCache: remember (expression, relevant device content) -> result.

An expression's result depends only on the parts of `device` it reads (its footprint, see
analysis.py). The memo key is therefore the expression plus the *projection* of the device onto
that footprint: a device that has not changed is never evaluated twice, and neither is a device
that differs from an already-evaluated one only in parts the expression does not read (uuid,
PCI address, ...). When the footprint cannot be determined statically, the projection is the
whole device content key, which is the plain (expression, device) memo.

Errors are cached like results: a device that fails an expression fails it again, with the same
CELRuntimeError, until its relevant content changes.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from .analysis import Footprint
from .compiler import CompiledExpression, compile_expression
from .device import CELDevice, DeviceView
from .errors import CELRuntimeError

_MISSING = ("<missing>",)


def projection(footprint: Footprint | None, view: DeviceView, device: CELDevice) -> tuple:
    """The content of `view` that an expression with this footprint can observe."""
    if footprint is None:
        return ("all", device.key())
    flat, names = view.flat, view.names
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
            prefix = kind
            parts.append(tuple(sorted((k[2], v) for k, v in flat.items() if k[0] == prefix and k[1] == domain)))
    if view.error is not None:
        parts.append(("error", view.error))
    return tuple(parts)


class SelectorCache:
    """Bounded, thread-safe memo of selector results for one process.

    `max_entries` bounds the number of remembered (expression, projection) results; the least
    recently used are dropped first.
    """

    def __init__(self, max_entries: int = 200_000, *, consumable_capacity: bool = True):
        self.max_entries = max_entries
        self.consumable_capacity = consumable_capacity
        self._lock = threading.Lock()
        self._results: OrderedDict[tuple, bool | CELRuntimeError] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def compiled(self, expression: str) -> CompiledExpression:
        return compile_expression(expression, consumable_capacity=self.consumable_capacity)

    def evaluate(self, expression: str, device: CELDevice) -> bool:
        """Result of `expression` for `device`; raises CELCompileError or the (cached)
        CELRuntimeError."""
        compiled = self.compiled(expression)
        view = device.view()
        fp = compiled.footprint
        # Projections are stored on the (content-shared) view, one per distinct footprint.
        proj = view.projections.get(fp)
        if proj is None:
            proj = projection(fp, view, device)
            view.projections[fp] = proj
        key = (expression, proj)
        with self._lock:
            result = self._results.get(key)
            if result is not None:
                self._results.move_to_end(key)
                self._hits += 1
        if result is None:
            try:
                result = compiled.evaluate_view(view)
            except CELRuntimeError as exc:
                result = exc
            with self._lock:
                self._misses += 1
                self._results[key] = result
                if len(self._results) > self.max_entries:
                    self._results.popitem(last=False)
                    self._evictions += 1
        if isinstance(result, CELRuntimeError):
            raise result
        return result

    def clear(self) -> None:
        with self._lock:
            self._results.clear()

    def stats(self) -> dict:
        with self._lock:
            return {
                "entries": len(self._results),
                "max_entries": self.max_entries,
                "hits": self._hits,
                "evaluations": self._misses,
                "evictions": self._evictions,
            }
