"""The input side of a selector: a device as the scheduler sees it, and the CEL `device` variable.

`CELDevice` holds the v1 ResourceSlice JSON of one device. The CEL value built from it (domain
maps, typed attribute values, quantities) is built once per distinct content and shared, because
building it costs about as much as a cheap evaluation and a fleet has many devices with identical
content (same GPU model on many nodes).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

from celpy import celtypes

from .quantity import Quantity, QuantityError
from .semver import Semver, SemverError

ATTRIBUTE_VALUE_KINDS = ("int", "bool", "string", "version")


def _freeze(value: Any) -> Any:
    """A hashable, order-independent copy of JSON-like data (dict key order never matters)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bool):
        # Keep True distinct from 1 in the fingerprint.
        return ("b", value)
    return value


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """`domain/id` -> (domain, id); a name without a domain belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    if not sep:
        return driver, name
    return domain, ident


def _capacity_value(raw: Any) -> Any:
    # v1 DeviceCapacity is {"value": "80Gi", "requestPolicy": ...}; the conformance vectors and
    # some callers pass the bare quantity string. Only the value is visible to CEL.
    if isinstance(raw, Mapping):
        return raw.get("value")
    return raw


@dataclass(frozen=True, eq=False)
class CELDevice:
    """One device's driver, attributes and capacity in resource.k8s.io/v1 JSON form."""

    driver: str
    attributes: Mapping[str, Mapping] = field(default_factory=dict)
    capacity: Mapping[str, Mapping] = field(default_factory=dict)
    allow_multiple_allocations: bool | None = None

    def key(self) -> tuple:
        """Fingerprint of everything CEL can see; equal keys mean equal selector results.

        Capacity request policies are left out: no CEL expression can read them.
        """
        cached = self.__dict__.get("_key")
        if cached is None:
            cached = (
                self.driver,
                _freeze(self.attributes),
                tuple(sorted((str(k), _freeze(_capacity_value(v))) for k, v in self.capacity.items())),
                self.allow_multiple_allocations,
            )
            object.__setattr__(self, "_key", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CELDevice) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def view(self) -> "DeviceView":
        """The resolved view of this device (shared between devices with equal content)."""
        cached = self.__dict__.get("_view")
        if cached is None:
            cached = _views.get(self)
            object.__setattr__(self, "_view", cached)
        return cached


class DomainMap(celtypes.MapType):
    """The attributes or capacities of one domain; remembers which so errors can say so."""

    def __init__(self, kind: str, domain: str, items: dict):
        super().__init__(items)
        self.kind = kind
        self.domain = domain


class MissingDomain(DomainMap):
    """What `device.attributes["unknown.domain"]` yields: empty, as upstream, but knows the
    domains the device does have so a failed lookup can list them."""

    def __init__(self, kind: str, domain: str, available: tuple[str, ...]):
        super().__init__(kind, domain, {})
        self.available = available


class DomainsMap(celtypes.MapType):
    """`device.attributes` / `device.capacity`: unknown domains are empty maps (upstream's
    newStringInterfaceMapWithDefault), so `device.attributes["x"].y` fails with "no such key: y"."""

    def __init__(self, kind: str, items: dict):
        super().__init__(items)
        self.kind = kind

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            if not isinstance(key, str):
                raise
            return MissingDomain(self.kind, str(key), tuple(sorted(self.keys())))


class DeviceView:
    """Resolved content of a device: the CEL value, a flat (kind, domain, id) -> value table for
    projections, and the error that any evaluation must report if the content is unusable."""

    __slots__ = ("value", "flat", "domains", "names", "error", "driver", "multi", "activation", "projections")

    def __init__(self, device: CELDevice):
        self.driver = device.driver
        self.multi = bool(device.allow_multiple_allocations)
        self.error: str | None = None
        # Filled lazily by the compiler and the selector cache.
        self.activation = None
        self.projections: dict = {}
        attrs: dict[str, dict] = {}
        caps: dict[str, dict] = {}
        flat: dict[tuple[str, str, str], Any] = {}
        for name, raw in device.attributes.items():
            domain, ident = split_qualified_name(str(name), device.driver)
            try:
                value = _attribute_value(raw)
            except ValueError as exc:
                self.error = self.error or f"attribute {name}: {exc}"
                continue
            attrs.setdefault(domain, {})[celtypes.StringType(ident)] = value
            # Projections hold the frozen JSON, not the CEL value: plain tuples compare safely.
            flat[("a", domain, ident)] = _freeze(raw)
        for name, raw in device.capacity.items():
            domain, ident = split_qualified_name(str(name), device.driver)
            text = _capacity_value(raw)
            try:
                value = Quantity.parse(text) if isinstance(text, str) else _bad_capacity(text)
            except QuantityError as exc:
                self.error = self.error or f"capacity {name}: {exc}"
                continue
            caps.setdefault(domain, {})[celtypes.StringType(ident)] = value
            flat[("c", domain, ident)] = text
        self.flat = flat
        self.domains = (tuple(sorted(attrs)), tuple(sorted(caps)))
        self.names = {("a", d): tuple(sorted(v)) for d, v in attrs.items()}
        self.names.update({("c", d): tuple(sorted(v)) for d, v in caps.items()})
        fields = {
            celtypes.StringType("driver"): celtypes.StringType(device.driver),
            celtypes.StringType("attributes"): DomainsMap(
                "attributes",
                {celtypes.StringType(d): DomainMap("attributes", d, m) for d, m in attrs.items()},
            ),
            celtypes.StringType("capacity"): DomainsMap(
                "capacity",
                {celtypes.StringType(d): DomainMap("capacity", d, m) for d, m in caps.items()},
            ),
            # Upstream: ptr.Deref(AllowMultipleAllocations, false). Whether the field exists at
            # all is decided at compile time (consumable_capacity), not here.
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(self.multi),
        }
        self.value = celtypes.MapType(fields)


def _bad_capacity(value: Any) -> Quantity:
    raise QuantityError(f"capacity value must be a quantity string, got {value!r}")


def _attribute_value(raw: Any):
    """One v1 DeviceAttribute ({"int": 3} etc.) -> the CEL value; exactly one kind must be set."""
    if not isinstance(raw, Mapping):
        raise ValueError("unsupported attribute value")
    present = [k for k in ATTRIBUTE_VALUE_KINDS if raw.get(k) is not None]
    if len(present) != 1:
        raise ValueError("unsupported attribute value")
    kind = present[0]
    value = raw[kind]
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return celtypes.IntType(value)
    if kind == "bool" and isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "string" and isinstance(value, str):
        return celtypes.StringType(value)
    if kind == "version" and isinstance(value, str):
        try:
            return Semver.parse(value)
        except SemverError as exc:
            raise ValueError(f"parse semantic version: {exc}") from None
    raise ValueError("unsupported attribute value")


class _ViewCache:
    """Bounded content-addressed cache of DeviceViews: devices with equal content share one."""

    def __init__(self, max_entries: int = 50_000):
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple, DeviceView] = OrderedDict()

    def get(self, device: CELDevice) -> DeviceView:
        key = device.key()
        with self._lock:
            view = self._items.get(key)
            if view is not None:
                self._items.move_to_end(key)
                return view
        view = DeviceView(device)
        with self._lock:
            self._items[key] = view
            if len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return view


_views = _ViewCache()
