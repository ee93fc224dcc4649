"""CEL operators with cel-go semantics on cel-python values.

cel-python's own operators return plain Python floats/strs/lists for some operations (so
`1.5 + 2.5 == 4.0` would compare a float with a DoubleType) and use Python's floor semantics for
`/` and `%`. These functions always return CEL-typed values and follow CEL: int64/uint64
overflow is an error, integer division truncates toward zero, values of different kinds are
unequal at run time, and numbers compare across int, uint and double.
"""
from __future__ import annotations

import datetime
import math
from typing import Any

from celpy import celtypes

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_UINT_MAX = 2**64 - 1


class OperatorError(ValueError):
    """The operation is defined for these types but failed (overflow, division by zero)."""


class NoOverload(TypeError):
    """The operator is not defined for these operand types."""


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, celtypes.BoolType))


def _kind(v: Any) -> str:
    if _is_bool(v):
        return "bool"
    if isinstance(v, celtypes.UintType):
        return "uint"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if isinstance(v, bytes):
        return "bytes"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "map"
    if v is None:
        return "null"
    if isinstance(v, datetime.datetime):
        return "timestamp"
    if isinstance(v, datetime.timedelta):
        return "duration"
    return type(v).__name__


# cel-python's IntType(x) wraps a conversion function in functools.wraps on every call (about
# 10 us); a value already range-checked here is built directly, a hundred times faster.
_new_int = int.__new__


def cel_int(value: int) -> celtypes.IntType:
    """IntType of a Python int already known to be in the int64 range."""
    return _new_int(celtypes.IntType, value)


def _int(value: int) -> celtypes.IntType:
    if not _INT_MIN <= value <= _INT_MAX:
        raise OperatorError("integer overflow")
    return _new_int(celtypes.IntType, value)


def _uint(value: int) -> celtypes.UintType:
    if not 0 <= value <= _UINT_MAX:
        raise OperatorError("unsigned integer overflow")
    return celtypes.UintType(value)


def _trunc_div(a: int, b: int) -> int:
    if b == 0:
        raise OperatorError("division by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    if b == 0:
        raise OperatorError("modulus by zero")
    return a - b * _trunc_div(a, b)


def _double_arithmetic(op: str, x: float, y: float) -> celtypes.DoubleType:
    if op == "_+_":
        return celtypes.DoubleType(x + y)
    if op == "_-_":
        return celtypes.DoubleType(x - y)
    if op == "_*_":
        return celtypes.DoubleType(x * y)
    if op == "_/_":
        # IEEE 754, as Go: x/0.0 is ±Inf (or NaN), not an error.
        if y == 0.0:
            if x == 0.0 or x != x:
                return celtypes.DoubleType(float("nan"))
            positive = (x > 0) == (math.copysign(1.0, y) > 0)
            return celtypes.DoubleType(float("inf") if positive else float("-inf"))
        return celtypes.DoubleType(x / y)
    raise NoOverload(op)


def arithmetic(op: str, a: Any, b: Any):
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        if op == "_+_" and {ka, kb} == {"timestamp", "duration"}:
            return celtypes.TimestampType(a + b)
        if op == "_-_" and (ka, kb) == ("timestamp", "duration"):
            return celtypes.TimestampType(a - b)
        raise NoOverload(op)
    if ka in ("int", "uint"):
        wrap = _int if ka == "int" else _uint
        x, y = int(a), int(b)
        if op == "_+_":
            return wrap(x + y)
        if op == "_-_":
            return wrap(x - y)
        if op == "_*_":
            return wrap(x * y)
        if op == "_/_":
            return wrap(_trunc_div(x, y))
        return wrap(_trunc_mod(x, y))
    if ka == "double":
        return _double_arithmetic(op, float(a), float(b))
    if op == "_+_":
        if ka == "string":
            return celtypes.StringType(str(a) + str(b))
        if ka == "bytes":
            return celtypes.BytesType(bytes(a) + bytes(b))
        if ka == "list":
            return celtypes.ListType(list(a) + list(b))
        if ka == "duration":
            return celtypes.DurationType(a + b)
    if op == "_-_" and ka in ("timestamp", "duration"):
        return celtypes.DurationType(a - b)
    raise NoOverload(op)


def negate(a: Any):
    k = _kind(a)
    if k == "int":
        return _int(-int(a))
    if k == "double":
        return celtypes.DoubleType(-float(a))
    raise NoOverload("-_")


def equals(a: Any, b: Any) -> bool:
    """CEL runtime equality (cel-go heterogeneous equality)."""
    ka, kb = _kind(a), _kind(b)
    numeric = ("int", "uint", "double")
    if ka in numeric and kb in numeric:
        # Python compares int and float exactly, as cel-go does across numeric types.
        return (int(a) if ka != "double" else float(a)) == (int(b) if kb != "double" else float(b))
    if ka != kb:
        return False
    if ka == "bool":
        return bool(a) == bool(b)
    if ka == "string":
        return str.__eq__(str(a), str(b))
    if ka == "bytes":
        return bytes(a) == bytes(b)
    if ka == "null":
        return True
    if ka == "list":
        return len(a) == len(b) and all(equals(x, y) for x, y in zip(a, b, strict=False))
    if ka == "map":
        if len(a) != len(b):
            return False
        index = {map_key(k): v for k, v in b.items()}
        for key, value in a.items():
            other = index.get(map_key(key), _ABSENT)
            if other is _ABSENT or not equals(value, other):
                return False
        return True
    try:
        return bool(a == b)
    except TypeError:
        return False


_ABSENT = object()


def map_key(key: Any) -> tuple:
    """A hashable stand-in for a map key under CEL equality: 1, 1u and 1.0 are one key, true
    and 1 are not. Lets maps be built and compared with set lookups instead of comparing every
    pair of keys (quadratic in a literal of a few thousand entries)."""
    kind = _kind(key)
    if kind in ("int", "uint", "double"):
        return ("n", float(key) if kind == "double" else int(key))
    if kind == "bool":
        return ("b", bool(key))
    if kind == "string":
        return ("s", str(key))
    if kind == "bytes":
        return ("y", bytes(key))
    return ("?", id(key))



def compare(op: str, a: Any, b: Any) -> bool:
    """Ordering operators; numbers compare across int, uint and double (Kubernetes enables
    cel-go's CrossTypeNumericComparisons)."""
    ka, kb = _kind(a), _kind(b)
    numeric = ("int", "uint", "double")
    if ka in numeric and kb in numeric:
        x: Any = int(a) if ka != "double" else float(a)  # Any: each branch compares its own kind
        y: Any = int(b) if kb != "double" else float(b)
    elif ka == kb and ka in ("string", "bytes", "bool", "timestamp", "duration"):
        x, y = (str(a), str(b)) if ka == "string" else ((bool(a), bool(b)) if ka == "bool" else (a, b))
    else:
        raise NoOverload(op)
    if op == "_<_":
        return x < y
    if op == "_<=_":
        return x <= y
    if op == "_>_":
        return x > y
    return x >= y
