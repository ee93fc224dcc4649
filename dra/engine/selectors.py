"""Selector matching: which devices a (class, request) pair selects, evaluated once per distinct device content.

A ``SelectorSet`` is the class selectors followed by the request selectors of one request or subrequest.
Many claims use the same set, so the engine keeps one ``SelectorSet`` per distinct set and asks it about a
device at most once (the answer is cached on the set, per device). The CEL evaluation itself is memoized by
``(expression, device content)`` in ``dra.cel.SelectorCache``, so a fleet of identical GPUs costs one
evaluation per expression, and expressions that name a driver skip other drivers' devices without evaluating.

A selector that fails at run time on a device (``no such key: type`` on a device that publishes no ``type``)
means that device does not match. Upstream kube-scheduler fails the pod's Filter with the error and retries
the pod later; it serves one cluster, whose devices its own operator runs. Fleet-wide, one odd device of one
cluster would fail every claim of every tenant that reaches it although other devices can serve them: so here
the device drops out (charged to ``cel_error`` in failure diagnostics, with the error), and a claim whose every
candidate fails waits with ``Reason.SELECTOR_ERROR_ON_ALL_CANDIDATES`` for the inventory to change instead of
failing. Compile errors and cost limits stay errors: they are the claim's (or class's) own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dra.cel import CELCompileError, CELDevice, CELRuntimeError, SelectorCache, compile_expression

from .model import Device
from .types import AllocationError, ErrorCode

if TYPE_CHECKING:
    from .index import KeyIndex

MATCH = True
NO_MATCH = False


class SelectorFailure:
    """A device on which a selector could not be evaluated: no match, counted by failure explanations."""

    __slots__ = ("origin", "name", "index", "error", "stage")

    def __init__(self, origin: str, name: str, index: int, error: CELRuntimeError, stage: str):
        self.origin = origin  # "class" or "claim"
        self.name = name  # class name (the claim is named when the error is raised)
        self.index = index
        self.error = error
        self.stage = stage

    @property
    def reason(self) -> str:
        return getattr(self.error, "reason", None) or str(self.error)

    def label(self) -> str:
        """Which selector, without the claim's expression text (shown to whoever reads the pool's warnings)."""
        if self.origin == "class":
            return f"class {self.name}'s selector #{self.index}"
        return f"a claim's selector #{self.index} (class {self.name})"


# Stages at which a device drops out of a selector set (used by diagnostics).
STAGE_DRIVER = "class_selector"
STAGE_CLASS = "class_selector"
STAGE_REQUEST = "request_selector"

# Per-device memo codes (one byte per device).
_UNKNOWN, _MATCH, _DROP_CLASS, _DROP_REQUEST, _FAILED = range(5)
_STAGES = {_DROP_CLASS: STAGE_CLASS, _DROP_REQUEST: STAGE_REQUEST, _FAILED: "cel_error"}
# Distinct device contents remembered per selector set (beyond it the per-device memo still answers).
_CONTENT_MEMO = 512


class SelectorSet:
    """Class selectors then request selectors of one request; evaluated lazily, memoized per device.

    The per-device memo is a byte per device of the engine (not a dict entry), and the memo by device content
    is capped: a worker keeps hundreds of these, and fleets of devices that publish a unique ``uuid`` make
    every content distinct (so that memo would only grow). ``forget`` drops both when the engine evicts it."""

    __slots__ = ("key", "class_name", "class_exprs", "request_exprs", "compiled", "drivers", "codes", "failures",
                 "cache", "consumable_capacity", "by_content", "size", "key_indexes", "node_cands")

    def __init__(self, key: tuple, class_name: str, class_exprs: tuple[str, ...], request_exprs: tuple[str, ...],
                 cache: SelectorCache, consumable_capacity: bool, size: int = 0):
        self.key = key
        self.class_name = class_name
        self.class_exprs = class_exprs
        self.request_exprs = request_exprs
        self.cache = cache
        self.consumable_capacity = consumable_capacity
        self.compiled = []
        drivers: frozenset | None = None
        for origin, exprs in (("class", class_exprs), ("claim", request_exprs)):
            for i, expr in enumerate(exprs):
                compiled = compile_expression(expr, consumable_capacity=consumable_capacity)
                self.compiled.append((origin, i, expr, compiled))
                named = getattr(compiled, "drivers", None)
                if named is not None and origin == "class":
                    drivers = named if drivers is None else drivers & named
        # Only class selectors feed the driver index: a request selector that names a driver would move a
        # device's drop-out from "request selector" to "class selector" in diagnostics.
        self.drivers = drivers
        self.size = size
        self.codes = bytearray(size)  # device idx -> _UNKNOWN / MATCH / drop-out stage / failure
        self.failures: dict[int, SelectorFailure] = {}
        # Devices with equal CEL-visible content (same model on many nodes) share one answer: content -> code.
        self.by_content: dict[tuple, tuple[int, SelectorFailure | None]] = {}
        # Kept by the engine's ``SelectorState`` (on the set itself, so that finding them costs no hash of the
        # key): cluster -> the key index last resolved for it, and (cluster, node) -> candidate devices.
        self.key_indexes: dict[str, KeyIndex] = {}
        self.node_cands: dict[tuple[str, str], list[Device]] = {}

    def forget(self) -> None:
        """Drop the memo (the engine evicted this set; a cached plan may still hold it and re-evaluate)."""
        self.codes = bytearray(self.size)
        self.failures = {}
        self.by_content = {}
        self.key_indexes = {}
        self.node_cands = {}

    def evaluate(self, device: Device) -> object:
        idx = device.idx
        code = self.codes[idx] if idx < self.size else _UNKNOWN
        if code == _MATCH:
            return MATCH
        if code == _UNKNOWN:
            hit = self.by_content.get(device.content)
            if hit is None:
                hit = self._evaluate(device)
                if len(self.by_content) < _CONTENT_MEMO:
                    self.by_content[device.content] = hit
            code, failure = hit[0], hit[1]
            if idx < self.size:
                self.codes[idx] = code
                if failure is not None:
                    self.failures[idx] = failure
            if failure is not None:
                return failure
            return MATCH if code == _MATCH else NO_MATCH
        if code == _FAILED:
            return self.failures.get(idx) or self._evaluate(device)[1]
        return NO_MATCH

    def known(self, device: Device) -> bool:
        """Is the answer for ``device`` remembered (``evaluate`` costs a lookup, no CEL)?"""
        return device.idx < self.size and self.codes[device.idx] != _UNKNOWN

    def stage_of(self, device: Device) -> str:
        code = self.codes[device.idx] if device.idx < self.size else _UNKNOWN
        if code == _UNKNOWN:
            hit = self.by_content.get(device.content)
            code = hit[0] if hit is not None else _UNKNOWN
        return _STAGES.get(code, STAGE_CLASS)

    def _evaluate(self, device: Device) -> tuple[int, SelectorFailure | None]:
        cel_device = cel_device_of(device)
        # The driver index skips devices of other drivers, except devices whose content CEL cannot represent:
        # upstream fails on those with any expression, and so do we.
        if self.drivers is not None and device.driver not in self.drivers and cel_device.view().error is None:
            return _DROP_CLASS, None
        for origin, i, expr, _compiled in self.compiled:
            try:
                ok = self.cache.evaluate(expr, cel_device)
            except CELRuntimeError as exc:
                stage = STAGE_CLASS if origin == "class" else STAGE_REQUEST
                return _FAILED, SelectorFailure(origin, self.class_name, i, exc, stage)
            if not ok:
                return (_DROP_CLASS if origin == "class" else _DROP_REQUEST), None
        return _MATCH, None

    def evaluate_partial(self, device: Device, skip_request_index: int | None) -> object:
        """Class selectors and all request selectors except one: for "nearest miss" diagnostics."""
        cel_device = cel_device_of(device)
        for origin, i, expr, _compiled in self.compiled:
            if origin == "claim" and i == skip_request_index:
                continue
            try:
                if not self.cache.evaluate(expr, cel_device):
                    return NO_MATCH
            except CELRuntimeError:
                return NO_MATCH
        return MATCH


def cel_device_of(device: Device) -> CELDevice:
    if device._cel is None:
        capacity = {name: {"value": str_value} for name, str_value in _capacity_strings(device)}
        device._cel = CELDevice(driver=device.driver, attributes=device.attributes, capacity=capacity,
                                allow_multiple_allocations=device.allow_multiple_raw)
    return device._cel


def _capacity_strings(device: Device):
    from .quantity import format_quantity

    for name, cap in device.capacity.items():
        yield name, format_quantity(cap.value, cap.fmt)


def compile_or_raise(expr: str, *, consumable_capacity: bool, origin: str, name: str, index: int,
                     field: str | None = None, claim: str | None = None) -> None:
    """Compile errors are input errors; upstream words them per class or per claim."""
    try:
        compile_expression(expr, consumable_capacity=consumable_capacity)
    except CELCompileError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        if origin == "class":
            msg = f"class {name}: selector #{index}: CEL compile error: {reason}"
        else:
            msg = f"{name}: selector #{index}: CEL compile error: {reason}"
        raise AllocationError(ErrorCode.CEL, msg, claim=claim, field=field) from exc
