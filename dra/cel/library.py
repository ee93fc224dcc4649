"""Runtime implementations of the Kubernetes CEL libraries that cel-python lacks.

cel-python calls `x.f(a)` as `f(x, a)` and `f(a)` as `f(a)`, so one Python function serves a
name for every receiver type and dispatches on the argument types (both quantities and semvers
have `isGreaterThan`, strings and lists both have `indexOf`). Failures are returned as
CELEvalError values, which is how cel-python propagates errors through `&&`/`||`; the
evaluator turns them into CELRuntimeError with the position of the call.

Covered: kubernetes.quantity, kubernetes.Semver (v1, with normalisation), the Kubernetes regex
(find, findAll) and lists (isSorted, sum, min, max, indexOf, lastIndexOf) libraries, cel-go's
strings extension (v2) and sets extension, and `matches` with RE2 semantics.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from . import regex
from .quantity import Quantity, QuantityError
from .semver import Semver, SemverError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def err(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, None)


def no_overload(name: str, *args: Any) -> CELEvalError:
    kinds = ", ".join(type_name(a) for a in args)
    return CELEvalError(f"found no matching overload for '{name}' applied to '({kinds})'", TypeError, None)


def type_name(value: Any) -> str:
    """CEL's name for the runtime type of a value (used in error messages)."""
    if isinstance(value, celtypes.BoolType):
        return "bool"
    if isinstance(value, celtypes.UintType):
        return "uint"
    if isinstance(value, celtypes.IntType):
        return "int"
    if isinstance(value, celtypes.DoubleType):
        return "double"
    if isinstance(value, celtypes.StringType):
        return "string"
    if isinstance(value, celtypes.BytesType):
        return "bytes"
    if isinstance(value, celtypes.ListType):
        return "list"
    if isinstance(value, celtypes.MapType):
        return "map"
    if isinstance(value, Quantity):
        return "Quantity"
    if isinstance(value, Semver):
        return "Semver"
    if value is None:
        return "null_type"
    return type(value).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, celtypes.IntType) and not isinstance(v, (celtypes.BoolType, celtypes.UintType))


# --- kubernetes.quantity --------------------------------------------------------------------
def quantity(text=None, *extra):
    if extra or not isinstance(text, str):
        return no_overload("quantity", text, *extra)
    try:
        return Quantity.parse(str(text))
    except QuantityError as exc:
        return err(str(exc))


def isQuantity(text=None, *extra):
    if extra or not isinstance(text, str):
        return no_overload("isQuantity", text, *extra)
    try:
        Quantity.parse(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def sign(q=None, *extra):
    if extra or not isinstance(q, Quantity):
        return no_overload("sign", q, *extra)
    return celtypes.IntType(q.sign())


def isInteger(q=None, *extra):
    if extra or not isinstance(q, Quantity):
        return no_overload("isInteger", q, *extra)
    return celtypes.BoolType(q.as_int64() is not None)


def asInteger(q=None, *extra):
    if extra or not isinstance(q, Quantity):
        return no_overload("asInteger", q, *extra)
    value = q.as_int64()
    if value is None:
        return err("cannot convert value to integer")
    return celtypes.IntType(value)


def asApproximateFloat(q=None, *extra):
    if extra or not isinstance(q, Quantity):
        return no_overload("asApproximateFloat", q, *extra)
    return celtypes.DoubleType(q.as_float())


def _quantity_arith(name: str, op: Callable[[Quantity, Any], Quantity]):
    def fn(q=None, other=None, *extra):
        if extra or not isinstance(q, Quantity) or not (isinstance(other, Quantity) or _is_int(other)):
            return no_overload(name, q, other, *extra)
        return op(q, other)

    fn.__name__ = name
    return fn


add = _quantity_arith("add", Quantity.add)
sub = _quantity_arith("sub", Quantity.sub)


# --- comparisons shared by Quantity and Semver ------------------------------------------------
def _comparable(name: str, a: Any, b: Any) -> int | CELEvalError:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    return no_overload(name, a, b)


def isGreaterThan(a=None, b=None, *extra):
    c = no_overload("isGreaterThan", a, b, *extra) if extra else _comparable("isGreaterThan", a, b)
    return c if isinstance(c, CELEvalError) else celtypes.BoolType(c == 1)


def isLessThan(a=None, b=None, *extra):
    c = no_overload("isLessThan", a, b, *extra) if extra else _comparable("isLessThan", a, b)
    return c if isinstance(c, CELEvalError) else celtypes.BoolType(c == -1)


def compareTo(a=None, b=None, *extra):
    c = no_overload("compareTo", a, b, *extra) if extra else _comparable("compareTo", a, b)
    return c if isinstance(c, CELEvalError) else celtypes.IntType(c)


# --- kubernetes.Semver ------------------------------------------------------------------------
def semver(text=None, normalize=None, *extra):
    if extra or not isinstance(text, str) or not (normalize is None or isinstance(normalize, celtypes.BoolType)):
        return no_overload("semver", text, *(a for a in (normalize, *extra) if a is not None))
    try:
        return Semver.parse_normalized(str(text)) if normalize else Semver.parse(str(text))
    except SemverError as exc:
        return err(str(exc))


def isSemver(text=None, normalize=None, *extra):
    if extra or not isinstance(text, str) or not (normalize is None or isinstance(normalize, celtypes.BoolType)):
        return no_overload("isSemver", text, *(a for a in (normalize, *extra) if a is not None))
    try:
        Semver.parse_normalized(str(text)) if normalize else Semver.parse(str(text))
    except SemverError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver_part(name: str):
    def fn(v=None, *extra):
        if extra or not isinstance(v, Semver):
            return no_overload(name, v, *extra)
        return celtypes.IntType(getattr(v, name))

    fn.__name__ = name
    return fn


major, minor, patch = _semver_part("major"), _semver_part("minor"), _semver_part("patch")


# --- regex ----------------------------------------------------------------------------------
def _regex_call(name: str, fn: Callable, text: Any, pattern: Any, *rest: Any):
    if not isinstance(text, str) or not isinstance(pattern, str):
        return no_overload(name, text, pattern, *rest)
    try:
        return fn(str(text), str(pattern), *rest)
    except regex.RegexError as exc:
        return err(str(exc))


def matches(text=None, pattern=None, *extra):
    if extra:
        return no_overload("matches", text, pattern, *extra)
    result = _regex_call("matches", regex.matches, text, pattern)
    return result if isinstance(result, CELEvalError) else celtypes.BoolType(result)


def find(text=None, pattern=None, *extra):
    if extra:
        return no_overload("find", text, pattern, *extra)
    result = _regex_call("find", regex.find, text, pattern)
    return result if isinstance(result, CELEvalError) else celtypes.StringType(result)


def findAll(text=None, pattern=None, limit=None, *extra):
    if extra or not (limit is None or _is_int(limit)):
        return no_overload("findAll", text, pattern, *(a for a in (limit, *extra) if a is not None))
    args = () if limit is None else (int(limit),)
    result = _regex_call("findAll", regex.find_all, text, pattern, *args)
    if isinstance(result, CELEvalError):
        return result
    return celtypes.ListType([celtypes.StringType(s) for s in result])
