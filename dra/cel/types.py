"""Static types of the DRA CEL environment and the signatures of its functions.

Types are plain values: a name ("int", "Quantity", "dyn", ...) or a tuple
("list", elem) / ("map", key, value). "any" is the type of attribute values (upstream declares
them as the unknown/any type): it behaves like dyn, and unlike dyn it is an acceptable result
type for a selector, exactly as upstream's "must evaluate to bool or the unknown type".
"""
from __future__ import annotations

from typing import Any

DYN = "dyn"
ANY = "any"
BOOL, INT, UINT, DOUBLE, STRING, BYTES, NULL = "bool", "int", "uint", "double", "string", "bytes", "null_type"
QUANTITY, SEMVER, TYPE = "Quantity", "Semver", "type"
TIMESTAMP, DURATION = "google.protobuf.Timestamp", "google.protobuf.Duration"
DEVICE = "kubernetes.DRADevice"
NUMERIC = (INT, UINT, DOUBLE)


def list_of(t) -> tuple:
    return ("list", t)


def map_of(k, v) -> tuple:
    return ("map", k, v)


ATTRIBUTES = map_of(STRING, map_of(STRING, ANY))
CAPACITY = map_of(STRING, map_of(STRING, QUANTITY))


def device_fields(consumable_capacity: bool) -> dict:
    fields = {"driver": STRING, "attributes": ATTRIBUTES, "capacity": CAPACITY}
    if consumable_capacity:
        fields["allowMultipleAllocations"] = BOOL
    return fields


def is_dyn(t) -> bool:
    return t in (DYN, ANY)


def fmt(t) -> str:
    if isinstance(t, tuple):
        if t[0] == "list":
            return f"list({fmt(t[1])})"
        return f"map({fmt(t[1])}, {fmt(t[2])})"
    return t


def unify(a, b):
    """A type matching both, or None. Type variables are single upper-case letters."""
    if is_dyn(a):
        return b if not is_dyn(b) else (ANY if ANY in (a, b) else DYN)
    if is_dyn(b):
        return a
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] and len(a) == len(b):
        parts = [unify(x, y) for x, y in zip(a[1:], b[1:], strict=False)]
        if any(p is None for p in parts):
            return None
        return (a[0], *parts)
    return a if a == b else None


def match(param, actual, bindings: dict) -> bool:
    """Does `actual` fit the parameter type `param` (which may contain type variables)?"""
    if isinstance(param, str) and len(param) == 1 and param.isupper():
        bound = bindings.get(param)
        if bound is None:
            bindings[param] = actual
            return True
        joined = unify(bound, actual)
        if joined is None:
            return False
        bindings[param] = joined
        return True
    if is_dyn(actual) or is_dyn(param):
        return True
    if isinstance(param, tuple):
        if isinstance(actual, tuple) and actual[0] == param[0] and len(actual) == len(param):
            return all(match(p, a, bindings) for p, a in zip(param[1:], actual[1:], strict=False))
        return False
    return param == actual


def substitute(t, bindings: dict):
    if isinstance(t, str) and len(t) == 1 and t.isupper():
        return bindings.get(t, DYN)
    if isinstance(t, tuple):
        return (t[0], *(substitute(x, bindings) for x in t[1:]))
    return t


# name -> list of (receiver type or None for a global call, argument types, result type)
_L, _M = list_of, map_of
SIGNATURES: dict[str, list[tuple]] = {
    # core
    "size": [(None, (STRING,), INT), (None, (BYTES,), INT), (None, (_L("A"),), INT), (None, (_M("K", "V"),), INT),
             (STRING, (), INT), (BYTES, (), INT), (_L("A"), (), INT), (_M("K", "V"), (), INT)],
    "contains": [(STRING, (STRING,), BOOL)],
    "startsWith": [(STRING, (STRING,), BOOL)],
    "endsWith": [(STRING, (STRING,), BOOL)],
    "matches": [(STRING, (STRING,), BOOL), (None, (STRING, STRING), BOOL)],
    "int": [(None, (t,), INT) for t in (INT, UINT, DOUBLE, STRING, TIMESTAMP)],
    "uint": [(None, (t,), UINT) for t in (INT, UINT, DOUBLE, STRING)],
    "double": [(None, (t,), DOUBLE) for t in (INT, UINT, DOUBLE, STRING)],
    "string": [(None, (t,), STRING) for t in (INT, UINT, DOUBLE, STRING, BOOL, BYTES, TIMESTAMP, DURATION)],
    "bool": [(None, (t,), BOOL) for t in (BOOL, STRING)],
    "bytes": [(None, (t,), BYTES) for t in (BYTES, STRING)],
    "dyn": [(None, ("A",), DYN)],
    "type": [(None, ("A",), TYPE)],
    "timestamp": [(None, (STRING,), TIMESTAMP), (None, (TIMESTAMP,), TIMESTAMP)],
    "duration": [(None, (STRING,), DURATION), (None, (DURATION,), DURATION)],
    # kubernetes.quantity
    "quantity": [(None, (STRING,), QUANTITY)],
    "isQuantity": [(None, (STRING,), BOOL)],
    # Upstream declares sign as a global overload and documents it as a method; accept both.
    "sign": [(None, (QUANTITY,), INT), (QUANTITY, (), INT)],
    "isInteger": [(QUANTITY, (), BOOL)],
    "asInteger": [(QUANTITY, (), INT)],
    "asApproximateFloat": [(QUANTITY, (), DOUBLE)],
    "add": [(QUANTITY, (QUANTITY,), QUANTITY), (QUANTITY, (INT,), QUANTITY)],
    "sub": [(QUANTITY, (QUANTITY,), QUANTITY), (QUANTITY, (INT,), QUANTITY)],
    "isGreaterThan": [(QUANTITY, (QUANTITY,), BOOL), (SEMVER, (SEMVER,), BOOL)],
    "isLessThan": [(QUANTITY, (QUANTITY,), BOOL), (SEMVER, (SEMVER,), BOOL)],
    "compareTo": [(QUANTITY, (QUANTITY,), INT), (SEMVER, (SEMVER,), INT)],
    # kubernetes.Semver (version 1)
    "semver": [(None, (STRING,), SEMVER), (None, (STRING, BOOL), SEMVER)],
    "isSemver": [(None, (STRING,), BOOL), (None, (STRING, BOOL), BOOL)],
    "major": [(SEMVER, (), INT)],
    "minor": [(SEMVER, (), INT)],
    "patch": [(SEMVER, (), INT)],
    # Kubernetes regex library
    "find": [(STRING, (STRING,), STRING)],
    "findAll": [(STRING, (STRING,), _L(STRING)), (STRING, (STRING, INT), _L(STRING))],
    # cel-go strings extension, version 2
    "charAt": [(STRING, (INT,), STRING)],
    "indexOf": [(STRING, (STRING,), INT), (STRING, (STRING, INT), INT), (_L("A"), ("A",), INT)],
    "lastIndexOf": [(STRING, (STRING,), INT), (STRING, (STRING, INT), INT), (_L("A"), ("A",), INT)],
    "lowerAscii": [(STRING, (), STRING)],
    "upperAscii": [(STRING, (), STRING)],
    "replace": [(STRING, (STRING, STRING), STRING), (STRING, (STRING, STRING, INT), STRING)],
    "split": [(STRING, (STRING,), _L(STRING)), (STRING, (STRING, INT), _L(STRING))],
    "substring": [(STRING, (INT,), STRING), (STRING, (INT, INT), STRING)],
    "trim": [(STRING, (), STRING)],
    "join": [(_L(STRING), (), STRING), (_L(STRING), (STRING,), STRING)],
    "strings.quote": [(None, (STRING,), STRING)],
    # Kubernetes lists library
    "isSorted": [(_L("A"), (), BOOL)],
    "sum": [(_L("A"), (), "A")],
    "min": [(_L("A"), (), "A")],
    "max": [(_L("A"), (), "A")],
    # cel-go sets extension
    "sets.contains": [(None, (_L("A"), _L("A")), BOOL)],
    "sets.equivalent": [(None, (_L("A"), _L("A")), BOOL)],
    "sets.intersects": [(None, (_L("A"), _L("A")), BOOL)],
}

# Functions that are documented upstream but not provided here, with the reason, so the error
# says "not supported" instead of pretending the name does not exist.
UNSUPPORTED = {
    "includes": "`includes` needs the DRAListTypeAttributes feature (Kubernetes 1.36); it is not in 1.35",
    "reverse": "`reverse` is in the strings extension version 3, newer than Kubernetes 1.35 allows",
    "format": "the strings extension's format() is not supported by this service",
    "url": "the Kubernetes URL library is not supported by this service",
    "isURL": "the Kubernetes URL library is not supported by this service",
    "ip": "the Kubernetes IP library is not supported by this service",
    "isIP": "the Kubernetes IP library is not supported by this service",
    "cidr": "the Kubernetes CIDR library is not supported by this service",
    "isCIDR": "the Kubernetes CIDR library is not supported by this service",
    "optional.of": "optional types are not supported by this service",
    "optional.none": "optional types are not supported by this service",
    "optional.ofNonZeroValue": "optional types are not supported by this service",
    "orValue": "optional types are not supported by this service",
    "hasValue": "optional types are not supported by this service",
    "value": "optional types are not supported by this service",
}

_ARITH: dict[str, list[tuple[tuple[Any, Any], Any]]] = {  # op -> ((left, right), result) overloads
    "_+_": [((t, t), t) for t in (INT, UINT, DOUBLE, STRING, BYTES)] + [((_L("A"), _L("A")), _L("A")),
            ((TIMESTAMP, DURATION), TIMESTAMP), ((DURATION, TIMESTAMP), TIMESTAMP), ((DURATION, DURATION), DURATION)],
    "_-_": [((t, t), t) for t in (INT, UINT, DOUBLE)] + [((TIMESTAMP, TIMESTAMP), DURATION),
            ((TIMESTAMP, DURATION), TIMESTAMP), ((DURATION, DURATION), DURATION)],
    "_*_": [((t, t), t) for t in (INT, UINT, DOUBLE)],
    "_/_": [((t, t), t) for t in (INT, UINT, DOUBLE)],
    "_%_": [((t, t), t) for t in (INT, UINT)],
}
_ORDERED = (INT, UINT, DOUBLE, STRING, BYTES, BOOL, TIMESTAMP, DURATION)


def binary_result(op: str, left, right):
    """Result type of a binary operator, or None if no overload applies."""
    if op in ("_==_", "_!=_"):
        if is_dyn(left) or is_dyn(right) or unify(left, right) is not None or (left == NULL or right == NULL):
            return BOOL
        return None
    if op in ("_<_", "_<=_", "_>_", "_>=_"):
        if is_dyn(left) or is_dyn(right):
            return BOOL
        if left in NUMERIC and right in NUMERIC:  # CrossTypeNumericComparisons
            return BOOL
        return BOOL if left == right and left in _ORDERED else None
    if op == "_in_":
        if is_dyn(right):
            return BOOL
        if isinstance(right, tuple):
            elem = right[1]
            return BOOL if is_dyn(left) or unify(left, elem) is not None else None
        return None
    for (a, b), result in _ARITH[op]:
        bindings: dict = {}
        if match(a, left, bindings) and match(b, right, bindings):
            if is_dyn(left) and is_dyn(right):
                return DYN
            return substitute(result, bindings)
    return None
