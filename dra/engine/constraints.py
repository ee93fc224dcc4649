"""Claim constraints: ``matchAttribute`` and ``distinctAttribute``.

Both are monotonic (once a device violates one, adding more devices never fixes it), which is what lets the
search reject a device at the moment it is considered. Attribute names are fully qualified; a device that
publishes the short name under its own driver's domain has it too (upstream ``lookupAttribute``). A device
without the attribute violates the constraint.

Unlike upstream 1.35, ``distinctAttribute`` compares a new device with every device already in the set, not
only with the last one picked for each request (upstream keys its memory by request name, so three devices
of one request could share a value).
"""
from __future__ import annotations

from collections import Counter

from .model import Device

_UNKNOWN = object()  # an attribute value of no supported type: equal to nothing, not even itself


_ABSENT = object()


def attribute_value(device: Device, name: str):
    """(type, value) of a device attribute, ``_UNKNOWN`` for an empty/unsupported one, None if absent.

    Cached on the device: constraints ask for the same attribute of the same devices over and over."""
    v = device.attr_cache.get(name, _ABSENT)
    if v is not _ABSENT:
        return v
    v = None
    attr = device.attribute(name)
    if attr is not None:
        v = _UNKNOWN
        for kind in ("string", "int", "bool", "version"):
            if kind in attr and attr[kind] is not None:
                v = (kind, attr[kind])
                break
    device.attr_cache[name] = v
    return v


class Constraint:
    __slots__ = ("attr", "requests", "index")

    kind = ""

    def __init__(self, attr: str, requests: list[str] | None, index: int):
        self.attr = attr
        self.requests = frozenset(requests) if requests else None
        self.index = index

    def applies(self, base: str, sub: str | None) -> bool:
        if self.requests is None:
            return True
        if base in self.requests:
            return True
        return sub is not None and f"{base}/{sub}" in self.requests

    def fresh(self) -> Constraint:
        """A copy with nothing added (one per search of a node): the request set is shared, not rebuilt."""
        c = self.__class__.__new__(self.__class__)
        c.attr, c.requests, c.index = self.attr, self.requests, self.index
        c.clear()
        return c

    def clear(self) -> None:
        raise NotImplementedError

    # Every kind implements these three.
    def add(self, device: Device) -> bool:
        raise NotImplementedError

    def remove(self, device: Device) -> None:
        raise NotImplementedError

    def admits(self, device: Device) -> bool:
        raise NotImplementedError


class MatchAttribute(Constraint):
    __slots__ = ("value", "n")
    kind = "matchAttribute"

    def __init__(self, attr, requests, index):
        super().__init__(attr, requests, index)
        self.clear()

    def clear(self) -> None:
        self.value = None
        self.n = 0

    def add(self, device: Device) -> bool:
        v = attribute_value(device, self.attr)
        if v is None:
            return False
        if self.n == 0:
            self.value = v
            self.n = 1
            return True
        if v is _UNKNOWN or v != self.value:
            return False
        self.n += 1
        return True

    def remove(self, device: Device) -> None:
        self.n -= 1
        if self.n == 0:
            self.value = None

    def admits(self, device: Device) -> bool:
        """Would ``add`` accept the device (without changing anything)?"""
        v = attribute_value(device, self.attr)
        if v is None:
            return False
        return self.n == 0 or (v is not _UNKNOWN and v == self.value)


class DistinctAttribute(Constraint):
    __slots__ = ("seen", "n")
    kind = "distinctAttribute"

    def __init__(self, attr, requests, index):
        super().__init__(attr, requests, index)
        self.clear()

    def clear(self) -> None:
        self.seen: Counter = Counter()
        self.n = 0

    def add(self, device: Device) -> bool:
        v = attribute_value(device, self.attr)
        if v is None:
            return False
        if self.n and (v is _UNKNOWN or self.seen[v]):
            return False
        self.seen[v] += 1
        self.n += 1
        return True

    def remove(self, device: Device) -> None:
        v = attribute_value(device, self.attr)
        self.seen[v] -= 1
        if not self.seen[v]:
            del self.seen[v]
        self.n -= 1

    def admits(self, device: Device) -> bool:
        v = attribute_value(device, self.attr)
        if v is None:
            return False
        return not self.n or (v is not _UNKNOWN and not self.seen[v])
