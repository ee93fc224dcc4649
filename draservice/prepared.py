"""Querysets compiled once, run many times: the hot lookups of the API without Django's per-query compile.

Building and compiling a queryset (``filter``, ``select_related``, SQL generation, the converters) costs about
as much CPU as the rest of a request: a claim read by (namespace, name) with its namespace and owner spent
~4 ms of the web worker's CPU, the query itself a fraction of one. ``Prepared`` compiles the queryset once,
with stand-in values, and afterwards only substitutes the parameters, executes the SQL and turns the rows
into model instances the way Django's ``ModelIterable`` does (``select_related`` objects included), so what
callers get is the same as from the queryset.

Compiled per thread and per database alias: a compiler holds the connection it was compiled for, and Django
connections are per thread. On PostgreSQL the SQL is also prepared on the connection (``prepared_sql``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

from draservice import prepared_sql

M = TypeVar("M", bound=Model)


class Prepared(Generic[M]):
    """``build(*stand_ins)`` returns the queryset; each stand-in must reach the SQL parameters unchanged (exact
    lookups of its own type) and be a value no caller passes. ``rows(*values)`` runs it with ``values`` in
    their place."""

    def __init__(self, build: Callable[..., QuerySet[M]], stand_ins: Sequence[Any]):
        self._build = build
        self._stand_ins = tuple(stand_ins)
        self._local = threading.local()

    def _compiled(self, using: str):
        cache = self._local.__dict__.setdefault("by_alias", {})
        compiled = cache.get(using)
        if compiled is None:
            compiled = cache[using] = _Compiled(self._build(*self._stand_ins), self._stand_ins, using)
        return compiled

    def rows(self, *values: Any, using: str = "default") -> list[M]:
        return self._compiled(using).run(values)

    def first(self, *values: Any, using: str = "default") -> M | None:
        found = self.rows(*values, using=using)
        return found[0] if found else None


class _Compiled:
    def __init__(self, qs: QuerySet, stand_ins: tuple, using: str):
        if qs._prefetch_related_lookups or qs._known_related_objects:  # type: ignore[attr-defined]
            raise ValueError("Prepared: prefetch_related and known related objects are not supported")
        self.using = using
        self.compiler = qs.query.get_compiler(using=using)
        self.sql, params = self.compiler.as_sql()
        self.params = list(params)
        self.slots = _slots(self.params, stand_ins)
        select, klass_info = self.compiler.select, self.compiler.klass_info
        self.model = klass_info["model"]
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [f[0].target.attname for f in select[self.start:self.end]]
        self.populators = get_related_populators(klass_info, select, using)  # type: ignore[call-arg]  # Django 5.2
        self.converters = self.compiler.get_converters([s[0] for s in select[0:self.compiler.col_count]])
        # Annotations become attributes of the objects, as the queryset sets them.
        self.annotations = list(self.compiler.annotation_col_map.items())

    def run(self, values: tuple) -> list[Model]:
        rows = _execute(self, values)
        out = []
        for row in rows:
            obj = self.model.from_db(self.using, self.init_list, row[self.start:self.end])
            for populator in self.populators:
                populator.populate(row, obj)
            for attr, pos in self.annotations:
                setattr(obj, attr, row[pos])
            out.append(obj)
        return out


class PreparedValues:
    """``Prepared`` for a ``values_list`` queryset: ``rows(*values)`` returns its tuples (``flat``: the first
    column of each), with the fields' converters applied, as the queryset would."""

    def __init__(self, build: Callable[..., QuerySet], stand_ins: Sequence[Any] = (), *, flat: bool = False):
        self._build = build
        self._stand_ins = tuple(stand_ins)
        self._flat = flat
        self._local = threading.local()

    def rows(self, *values: Any, using: str = "default") -> list:
        cache = self._local.__dict__.setdefault("by_alias", {})
        compiled = cache.get(using)
        if compiled is None:
            compiled = cache[using] = _CompiledValues(self._build(*self._stand_ins), self._stand_ins, using)
        rows = compiled.run(values)
        return [row[0] for row in rows] if self._flat else rows


class _CompiledValues:
    def __init__(self, qs: QuerySet, stand_ins: tuple, using: str):
        self.using = using
        self.compiler = qs.query.get_compiler(using=using)
        self.sql, params = self.compiler.as_sql()
        self.params = list(params)
        self.slots = _slots(self.params, stand_ins)
        self.converters = self.compiler.get_converters([s[0] for s in self.compiler.select[0:self.compiler.col_count]])

    def run(self, values: tuple) -> list[tuple]:
        return _execute(self, values)


def _execute(compiled: _Compiled | _CompiledValues, values: tuple) -> list[tuple]:
    """Run a compiled statement with ``values`` in its stand-ins' places; its rows, the fields' converters
    applied."""
    params = list(compiled.params)
    for slot, value in zip(compiled.slots, values, strict=True):
        params[slot] = value
    with prepared_sql.cursor(connections[compiled.using]) as cursor:
        cursor.execute(compiled.sql, params)
        rows = cursor.fetchall()
    if compiled.converters:
        return [tuple(r) for r in compiled.compiler.apply_converters(rows, compiled.converters)]
    return rows


def _slots(params: list, stand_ins: tuple) -> list[int]:
    """Which parameter is which stand-in: each must appear exactly once."""
    slots = []
    for i, stand_in in enumerate(stand_ins):
        where = [k for k, p in enumerate(params) if type(p) is type(stand_in) and p == stand_in]
        if len(where) != 1:
            raise ValueError(f"Prepared: stand-in {i} appears {len(where)} times in the parameters")
        slots.append(where[0])
    return slots


def set_prefetched(obj: Model, related_name: str, objects: Sequence[Model], back: str | None = None) -> None:
    """What ``prefetch_related(related_name)`` leaves on ``obj``: ``obj.<related_name>.all()`` answers
    ``objects`` without a query. ``back``: the objects' foreign key to ``obj``, cached on them too."""
    qs = getattr(obj, related_name).all()
    qs._result_cache = objects
    qs._prefetch_done = True
    if back:
        for item in objects:
            item._state.fields_cache[back] = obj
    obj.__dict__.setdefault("_prefetched_objects_cache", {})[related_name] = qs
