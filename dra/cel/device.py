"""The input side of a selector: a device as the scheduler sees it, and the CEL `device` variable.

`CELDevice` holds the v1 ResourceSlice JSON of one device. The CEL value built from it (domain
maps, typed attribute values, quantities) is built once per distinct content and shared, because
building it costs about as much as a cheap evaluation and a fleet has many devices with identical
content (same GPU model on many nodes).
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celpy import celtypes

from .quantity import Quantity, QuantityError
from .semver import Semver, SemverError

ATTRIBUTE_VALUE_KINDS = ("int", "bool", "string", "version")


def _freeze(value: Any) -> Any:
    """A hashable, order-independent copy of JSON-like data (dict key order never matters).

    This runs for every attribute of every device a fleet loads, so exact-type checks come
    first (the Mapping ABC check is slow) and one-entry dicts, the shape of every v1
    attribute value, skip the sort.
    """
    cls = type(value)
    if cls is str or cls is int or cls is float or value is None:
        return value
    if cls is bool:
        # Keep True distinct from 1 in the fingerprint.
        return ("b", value)
    if cls is dict or isinstance(value, Mapping):
        if len(value) == 1:
            for k, v in value.items():
                return ((k if type(k) is str else str(k), _freeze(v)),)
        return tuple(sorted([(k if type(k) is str else str(k), _freeze(v)) for k, v in value.items()]))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
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
    if type(raw) is str:
        return raw
    if isinstance(raw, (dict, Mapping)):
        return raw.get("value")
    return raw


@dataclass(frozen=True, eq=False, slots=True)
class CELDevice:
    """One device's driver, attributes and capacity in resource.k8s.io/v1 JSON form.

    Treat the mappings as immutable: the fingerprint and the resolved view are computed once
    and cached on the object.
    """

    driver: str
    attributes: Mapping[str, Mapping] = field(default_factory=dict)
    capacity: Mapping[str, Mapping] = field(default_factory=dict)
    allow_multiple_allocations: bool | None = None
    # Caches (slots, so the hot path of a fleet-wide lookup is a plain attribute read).
    _key: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _view: DeviceView | None = field(default=None, init=False, repr=False, compare=False)

    def key(self) -> tuple:
        """Fingerprint of everything CEL can see; equal keys mean equal selector results.

        Capacity request policies are left out: no CEL expression can read them.
        """
        cached = self._key
        if cached is None:
            cached = (
                self.driver,
                _freeze(self.attributes),
                tuple(sorted((str(k), _freeze(_capacity_value(v))) for k, v in self.capacity.items())),
                self.allow_multiple_allocations,
            )
            object.__setattr__(self, "_key", cached)
        return cached

    def __getstate__(self):
        # Pickle the content only; the caches are rebuilt on demand.
        return (self.driver, self.attributes, self.capacity, self.allow_multiple_allocations)

    def __setstate__(self, state) -> None:
        for name, value in zip(("driver", "attributes", "capacity", "allow_multiple_allocations"), state, strict=False):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_key", None)
        object.__setattr__(self, "_view", None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CELDevice) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def view(self) -> DeviceView:
        """The resolved view of this device (shared between devices with equal content)."""
        cached = self._view
        if cached is None:
            cached = _views.get(self)
            object.__setattr__(self, "_view", cached)
        return cached


class DomainMap(celtypes.MapType):
    """The attributes or capacities of one domain; remembers which so errors can say so."""

    def __init__(self, kind: str, domain: str, items: dict):
        # dict.__init__ directly: celtypes.MapType.__init__ re-validates every key through ABC
        # isinstance checks, which dominated building a device's CEL value.
        dict.__init__(self, items)
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
        dict.__init__(self, items)
        self.kind = kind

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            if not isinstance(key, str):
                raise
            return MissingDomain(self.kind, str(key), tuple(sorted(str(k) for k in self.keys())))


class DeviceView:
    """Resolved content of a device, shared by all devices with equal content.

    Built eagerly (cheap, needed for every memo lookup): the flat (kind, domain, id) -> frozen
    JSON table that projections read, the domain and name lists that error hints show, and the
    error any evaluation must report if the content is unusable (e.g. a version attribute that
    is not semver, which upstream reports before evaluating anything). Built lazily (needed only
    when an expression is really evaluated): the CEL `device` value and its activation.
    """

    __slots__ = ("flat", "domains", "names", "error", "driver", "multi", "_value", "_attributes",
                 "_capacity", "activation", "projections")

    def __init__(self, device: CELDevice):
        self.driver = device.driver
        self.multi = bool(device.allow_multiple_allocations)
        self.error: str | None = None
        self._value: celtypes.MapType | None = None
        self.activation: dict | None = None
        # Filled lazily by the selector cache: footprint id -> projection.
        self.projections: dict = {}
        attrs: dict[str, dict] = {}
        caps: dict[str, dict] = {}
        flat: dict[tuple[str, str, str], Any] = {}
        _, frozen_attributes, frozen_capacity, _ = device.key()
        for name, frozen in frozen_attributes:
            domain, ident = split_qualified_name(name, device.driver)
            value, error = _attribute_value(frozen)
            if error is not None:
                self.error = self.error or f"attribute {name}: {error}"
                continue
            attrs.setdefault(domain, {})[ident] = value
            # Projections hold the frozen JSON, not the CEL value: plain tuples compare safely.
            flat[("a", domain, ident)] = frozen
        for name, text in frozen_capacity:
            domain, ident = split_qualified_name(name, device.driver)
            if isinstance(text, str):
                value, error = _capacity_quantity(text)
            else:
                value, error = None, f"capacity value must be a quantity string, got {text!r}"
            if error is not None:
                self.error = self.error or f"capacity {name}: {error}"
                continue
            caps.setdefault(domain, {})[ident] = value
            flat[("c", domain, ident)] = text
        self.flat = flat
        self._attributes = attrs
        self._capacity = caps
        self.domains = (tuple(sorted(attrs)), tuple(sorted(caps)))
        self.names = {("a", d): tuple(sorted(v)) for d, v in attrs.items()}
        self.names.update({("c", d): tuple(sorted(v)) for d, v in caps.items()})

    @property
    def value(self) -> celtypes.MapType:
        """The CEL value of the `device` variable."""
        if self._value is None:
            value = celtypes.MapType()
            dict.update(value, {
                celtypes.StringType("driver"): celtypes.StringType(self.driver),
                celtypes.StringType("attributes"): DomainsMap("attributes", {
                    celtypes.StringType(d): DomainMap("attributes", d,
                                                      {celtypes.StringType(k): v for k, v in m.items()})
                    for d, m in self._attributes.items()
                }),
                celtypes.StringType("capacity"): DomainsMap("capacity", {
                    celtypes.StringType(d): DomainMap("capacity", d, {celtypes.StringType(k): v for k, v in m.items()})
                    for d, m in self._capacity.items()
                }),
                # Upstream: ptr.Deref(AllowMultipleAllocations, false). Whether the field exists
                # at all is decided at compile time (consumable_capacity), not here.
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(self.multi),
            })
            self._value = value
        return self._value


@functools.lru_cache(maxsize=65536)
def _capacity_quantity(text: str):
    # Fleets repeat the same few capacity strings; parse each once. Returns (value, error).
    try:
        return Quantity.parse(text), None
    except QuantityError as exc:
        return None, str(exc)


@functools.lru_cache(maxsize=65536)
def _attribute_value(frozen: Any):
    """One v1 DeviceAttribute, frozen ((("int", 3),) etc.) -> (CEL value, error). Cached:
    the same attribute values repeat across a fleet. Exactly one kind must be set."""
    pairs = isinstance(frozen, tuple) and all(isinstance(i, tuple) and len(i) == 2 for i in frozen)
    items = dict(frozen) if pairs else None
    if items is None:
        return None, "unsupported attribute value"
    present = [k for k in ATTRIBUTE_VALUE_KINDS if items.get(k) is not None]
    if len(present) != 1:
        return None, "unsupported attribute value"
    kind = present[0]
    value = items[kind]
    if kind == "int" and isinstance(value, int):
        return celtypes.IntType(value), None
    if kind == "bool" and isinstance(value, tuple) and value[0] == "b":
        return celtypes.BoolType(value[1]), None
    if kind == "string" and isinstance(value, str):
        return celtypes.StringType(value), None
    if kind == "version" and isinstance(value, str):
        try:
            return Semver.parse(value), None
        except SemverError as exc:
            return None, f"parse semantic version: {exc}"
    return None, "unsupported attribute value"


class _ViewCache:
    """Bounded content-addressed cache of DeviceViews: devices with equal content share one."""

    def __init__(self, max_entries: int = 100_000):
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

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_views = _ViewCache()
