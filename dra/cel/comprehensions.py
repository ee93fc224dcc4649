"""The comprehension macros for the DRA evaluator, charged as cel-go charges their expansions.

cel-go expands `r.all(x, p)` into a loop with an accumulator and charges every iteration for
its loop condition and step: `all` costs 3 + p a step (`@not_strictly_false(@result)` and
`@result && p`), `exists` 4 + p, `exists_one` 1 + p (+1 when p holds), `map` 12 + t (the
accumulator, a one-element list and the concatenation), `filter` 1 + p (+12 when kept),
`transformMap` 3 + t. The evaluator runs the loops directly, short-circuiting as cel-go's loop
condition does, and charges the same units (estimator.py estimates the same expansion), so an
expression's run never costs more than its estimate when the device keeps to the declared sizes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celpy import celtypes
from celpy.evaluation import CELEvalError

from .cost import LIST_CREATE, MAP_CREATE
from .library import no_overload, type_name
from .operators import cel_int

_STEP = {"all": 3, "exists": 4}
_LOOP_CONDITION = {"all": 2, "exists": 3}


class _Budget(Protocol):
    def charge(self, units: int, tree: Any) -> None: ...


class ComprehensionMixin:
    """Mixed into DRAEvaluator (which provides visit, _scoped, budget and error_at, the latter as a static
    method so that this module need not import the evaluator back)."""

    if TYPE_CHECKING:  # what DRAEvaluator provides, for the type checker only (nothing here shadows it)
        budget: _Budget
        error_at: Callable[..., CELEvalError]

        def visit(self, tree: Any) -> Any: ...

        def _scoped(self, tree: Any, values: dict) -> Any: ...

    def _comprehension(self, tree, name, range_tree, variables, bodies):
        error_at = self.error_at
        source = self.visit(range_tree)
        if isinstance(source, CELEvalError):
            return source
        if isinstance(source, celtypes.MapType):
            pairs = iter(source.items())
        elif isinstance(source, celtypes.ListType):
            pairs = ((cel_int(i), v) for i, v in enumerate(source))
        else:
            return error_at(f"expression of type '{type_name(source)}' cannot be the range of a comprehension",
                            range_tree)
        entries = _entries(pairs, variables, isinstance(source, celtypes.MapType))
        kind = {"exists_one": "existsOne"}.get(name, name)
        if kind in ("all", "exists"):
            return self._quantifier(tree, kind, bodies[0], entries, len(source))
        if kind == "existsOne":
            return self._exists_one(tree, bodies[0], entries)
        if kind == "filter":
            return self._filter(tree, bodies[0], entries)
        return self._transform(tree, kind, bodies, entries)

    def _quantifier(self, tree, kind, body, entries, size):
        decisive = kind == "exists"
        first_error = None
        for i, (scope, _, _) in enumerate(entries):
            self.budget.charge(_STEP[kind], tree)
            value = self._scoped(body, scope)
            if isinstance(value, celtypes.BoolType):
                if bool(value) is decisive:
                    if i + 1 < size:
                        self.budget.charge(_LOOP_CONDITION[kind], tree)  # the check that ends the loop
                    self.budget.charge(1, tree)
                    return value
            elif first_error is None:
                first_error = value if isinstance(value, CELEvalError) else no_overload(kind, value)
        self.budget.charge(1, tree)  # the result: reading the accumulator
        return first_error if first_error is not None else celtypes.BoolType(not decisive)

    def _exists_one(self, tree, body, entries):
        count = 0
        for scope, _, _ in entries:
            self.budget.charge(1, tree)
            value = self._scoped(body, scope)
            if isinstance(value, CELEvalError):
                return value
            if not isinstance(value, celtypes.BoolType):
                return no_overload("existsOne", value)
            if value:
                self.budget.charge(1, tree)
                count += 1
        self.budget.charge(2, tree)
        return celtypes.BoolType(count == 1)

    def _filter(self, tree, body, entries):
        self.budget.charge(LIST_CREATE, tree)
        out = []
        for scope, _, item in entries:
            self.budget.charge(1, tree)
            value = self._scoped(body, scope)
            if isinstance(value, CELEvalError):
                return value
            if not isinstance(value, celtypes.BoolType):
                return no_overload("filter", value)
            if value:
                self.budget.charge(12, tree)
                out.append(item)
        self.budget.charge(1, tree)
        return celtypes.ListType(out)

    def _transform(self, tree, kind, bodies, entries):
        """map / transformList / transformMap, optionally with a filter predicate first."""
        predicate, transform = (bodies[0], bodies[1]) if len(bodies) == 2 else (None, bodies[0])
        to_map = kind == "transformMap"
        self.budget.charge(MAP_CREATE if to_map else LIST_CREATE, tree)
        out_list, out_map = [], celtypes.MapType()
        for scope, key, _ in entries:
            if predicate is not None:
                keep = self._scoped(predicate, scope)
                if isinstance(keep, CELEvalError):
                    return keep
                if not isinstance(keep, celtypes.BoolType):
                    return no_overload(kind, keep)
                if not keep:
                    self.budget.charge(1, tree)
                    continue
            self.budget.charge(3 if to_map else 12, tree)
            value = self._scoped(transform, scope)
            if isinstance(value, CELEvalError):
                return value
            if to_map:
                out_map[key] = value
            else:
                out_list.append(value)
        self.budget.charge(1, tree)
        return out_map if to_map else celtypes.ListType(out_list)


def _entries(pairs, variables, is_map: bool):
    """(scope, key, item) per element, lazily: a loop that stops early (or runs out of budget) never
    builds the scopes of the elements it does not reach. One-variable comprehensions range over
    map keys and list values."""
    if len(variables) == 2:
        first, second = variables
        for k, v in pairs:
            yield {first: k, second: v}, k, (k if is_map else v)
    else:
        name = variables[0]
        for k, v in pairs:
            item = k if is_map else v
            yield {name: item}, k, item
