"""cel-go's strings (version 2) and sets extensions and the Kubernetes lists library.

Strings index by Unicode code point, as cel-go does (Python `str` indexing already does). Error
texts follow cel-go where users are likely to compare them.
"""
from __future__ import annotations

from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from . import operators
from .library import _is_int, err, no_overload
from .quantity import Quantity
from .semver import Semver


def _s(v: Any) -> bool:
    return isinstance(v, celtypes.StringType)


def _index_error(i: int) -> CELEvalError:
    return err(f"index out of range: {i}")


# --- strings --------------------------------------------------------------------------------
def charAt(s=None, i=None, *extra):
    if extra or not _s(s) or not _is_int(i):
        return no_overload("charAt", s, i, *extra)
    if i < 0 or i > len(s):
        return _index_error(int(i))
    return celtypes.StringType(s[i] if i < len(s) else "")


def _list_index(name: str, lst: celtypes.ListType, item: Any, last: bool):
    positions = range(len(lst) - 1, -1, -1) if last else range(len(lst))
    for i in positions:
        try:
            if operators.equals(lst[i], item):
                return celtypes.IntType(i)
        except TypeError:
            continue
    return celtypes.IntType(-1)


def indexOf(s=None, sub=None, offset=None, *extra):
    if isinstance(s, celtypes.ListType) and offset is None and not extra:
        return _list_index("indexOf", s, sub, last=False)
    if extra or not _s(s) or not _s(sub) or not (offset is None or _is_int(offset)):
        return no_overload("indexOf", s, sub, *(a for a in (offset, *extra) if a is not None))
    start = 0 if offset is None else int(offset)
    if start < 0 or start > len(s):
        return _index_error(start)
    return celtypes.IntType(s.find(sub, start))


def lastIndexOf(s=None, sub=None, offset=None, *extra):
    if isinstance(s, celtypes.ListType) and offset is None and not extra:
        return _list_index("lastIndexOf", s, sub, last=True)
    if extra or not _s(s) or not _s(sub) or not (offset is None or _is_int(offset)):
        return no_overload("lastIndexOf", s, sub, *(a for a in (offset, *extra) if a is not None))
    end = len(s) if offset is None else int(offset)
    if end < 0 or end > len(s):
        return _index_error(end)
    # The match must start at or before `offset`.
    return celtypes.IntType(s.rfind(sub, 0, end + len(sub)))


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def lowerAscii(s=None, *extra):
    if extra or not _s(s):
        return no_overload("lowerAscii", s, *extra)
    return celtypes.StringType(str(s).translate(_ASCII_LOWER))


def upperAscii(s=None, *extra):
    if extra or not _s(s):
        return no_overload("upperAscii", s, *extra)
    return celtypes.StringType(str(s).translate(_ASCII_UPPER))


def replace(s=None, old=None, new=None, n=None, *extra):
    if extra or not (_s(s) and _s(old) and _s(new)) or not (n is None or _is_int(n)):
        return no_overload("replace", s, old, new, *(a for a in (n, *extra) if a is not None))
    count = -1 if n is None else int(n)
    return celtypes.StringType(str(s).replace(str(old), str(new), count if count >= 0 else -1))


def split(s=None, sep=None, n=None, *extra):
    if extra or not (_s(s) and _s(sep)) or not (n is None or _is_int(n)):
        return no_overload("split", s, sep, *(a for a in (n, *extra) if a is not None))
    limit = -1 if n is None else int(n)
    text, separator = str(s), str(sep)
    # Go strings.SplitN: n == 0 -> no substrings; n < 0 -> all; "" separator splits runes.
    if limit == 0:
        parts: list[str] = []
    elif separator == "":
        chars = list(text)
        parts = chars if limit < 0 or limit >= len(chars) else chars[: limit - 1] + ["".join(chars[limit - 1 :])]
    else:
        parts = text.split(separator, limit - 1 if limit > 0 else -1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def substring(s=None, start=None, end=None, *extra):
    if extra or not _s(s) or not _is_int(start) or not (end is None or _is_int(end)):
        return no_overload("substring", s, start, *(a for a in (end, *extra) if a is not None))
    b = int(start)
    e = len(s) if end is None else int(end)
    if b < 0 or b > len(s):
        return _index_error(b)
    if e < 0 or e > len(s):
        return _index_error(e)
    if b > e:
        return err(f"invalid substring range. start: {b}, end: {e}")
    return celtypes.StringType(s[b:e])


def trim(s=None, *extra):
    if extra or not _s(s):
        return no_overload("trim", s, *extra)
    return celtypes.StringType(str(s).strip())


def join(lst=None, sep=None, *extra):
    if extra or not isinstance(lst, celtypes.ListType) or not (sep is None or _s(sep)):
        return no_overload("join", lst, *(a for a in (sep, *extra) if a is not None))
    if not all(_s(x) for x in lst):
        return no_overload("join", lst)
    return celtypes.StringType(("" if sep is None else str(sep)).join(str(x) for x in lst))


def strings_quote(s=None, *extra):
    if extra or not _s(s):
        return no_overload("strings.quote", s, *extra)
    escaped = str(s).replace("\\", "\\\\").replace('"', '\\"')
    for raw, esc in (("\a", "\\a"), ("\b", "\\b"), ("\f", "\\f"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
                     ("\v", "\\v")):
        escaped = escaped.replace(raw, esc)
    return celtypes.StringType(f'"{escaped}"')


# --- Kubernetes lists library -----------------------------------------------------------------
def _orderable(values: list) -> bool:
    kinds = {type(v) for v in values}
    numeric = {celtypes.IntType, celtypes.UintType, celtypes.DoubleType}
    containers = {celtypes.BoolType, celtypes.ListType, celtypes.MapType}
    return bool(kinds) and (kinds <= numeric or len(kinds) == 1) and not kinds & containers


def _key(v: Any):
    if isinstance(v, (Quantity, Semver)):
        return _Ordered(v)
    return v


class _Ordered:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def __lt__(self, other: _Ordered) -> bool:
        return self.v.compare(other.v) < 0


def isSorted(lst=None, *extra):
    if extra or not isinstance(lst, celtypes.ListType):
        return no_overload("isSorted", lst, *extra)
    if len(lst) < 2:
        return celtypes.BoolType(True)
    if not _orderable(list(lst)):
        return no_overload("isSorted", lst)
    keys = [_key(v) for v in lst]
    return celtypes.BoolType(all(not (keys[i + 1] < keys[i]) for i in range(len(keys) - 1)))


def sum(lst=None, *extra):  # noqa: A001 - the CEL function is called sum
    if extra or not isinstance(lst, celtypes.ListType):
        return no_overload("sum", lst, *extra)
    if not lst:
        return celtypes.IntType(0)
    total = lst[0]
    for v in lst[1:]:
        try:
            total = operators.arithmetic("_+_", total, v)
        except operators.NoOverload:
            return no_overload("sum", lst)
        except operators.OperatorError as exc:
            return err(str(exc))
    if not isinstance(total, (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)) \
            or isinstance(total, celtypes.BoolType):
        return no_overload("sum", lst)
    return total


def _extreme(name: str, lst: Any, extra: tuple, pick_max: bool):
    if extra or not isinstance(lst, celtypes.ListType):
        return no_overload(name, lst, *extra)
    if not lst:
        return err(f"{name} called on empty list")
    if not _orderable(list(lst)):
        return no_overload(name, lst)
    best = lst[0]
    for v in lst[1:]:
        if (_key(best) < _key(v)) if pick_max else (_key(v) < _key(best)):
            best = v
    return best


def min(lst=None, *extra):  # noqa: A001
    return _extreme("min", lst, extra, pick_max=False)


def max(lst=None, *extra):  # noqa: A001
    return _extreme("max", lst, extra, pick_max=True)


# --- sets extension -------------------------------------------------------------------------
def _member(item: Any, lst: celtypes.ListType) -> bool:
    return any(operators.equals(x, item) for x in lst)


def sets_contains(a=None, b=None, *extra):
    if extra or not isinstance(a, celtypes.ListType) or not isinstance(b, celtypes.ListType):
        return no_overload("sets.contains", a, b, *extra)
    return celtypes.BoolType(all(_member(x, a) for x in b))


def sets_equivalent(a=None, b=None, *extra):
    if extra or not isinstance(a, celtypes.ListType) or not isinstance(b, celtypes.ListType):
        return no_overload("sets.equivalent", a, b, *extra)
    return celtypes.BoolType(all(_member(x, a) for x in b) and all(_member(x, b) for x in a))


def sets_intersects(a=None, b=None, *extra):
    if extra or not isinstance(a, celtypes.ListType) or not isinstance(b, celtypes.ListType):
        return no_overload("sets.intersects", a, b, *extra)
    return celtypes.BoolType(any(_member(x, a) for x in b))
