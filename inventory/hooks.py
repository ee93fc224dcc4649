"""Extension points the claims app fills in (the inventory does not import the claims app).

``register_allocation_state_provider(fn)``: ``fn(devices)`` receives a page of ``Device`` rows and returns
``{device.pk: {"state": "allocated", "claims": [...], ...}}`` for the devices it knows about; the device
API shows ``{"state": "free"}`` for the rest.

``register_allocation_state_filter(fn, states)``: ``fn(state)`` returns a ``Q`` selecting the ``Device`` rows
in that state (``?state=`` on the device list filters in SQL, not page by page). ``states`` are the names
the provider may answer; "free" is always one.

The claims app registers both from ``ClaimsConfig.ready()``. Without it every device is free, and
``?state=`` accepts only "free".
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db.models import Q

FREE = "free"

_providers: list[Callable] = []
_filters: list[tuple[Callable[[str], Q], tuple[str, ...]]] = []


def register_allocation_state_provider(provider: Callable[[list], dict]) -> None:
    if provider not in _providers:
        _providers.append(provider)


def unregister_allocation_state_provider(provider: Callable[[list], dict]) -> None:
    if provider in _providers:
        _providers.remove(provider)


def allocation_states(devices: Iterable) -> dict:
    devices = list(devices)
    states: dict = {}
    for provider in _providers:
        states.update(provider(devices) or {})
    return states


def register_allocation_state_filter(condition: Callable[[str], Q], states: Iterable[str]) -> None:
    if all(existing is not condition for existing, _ in _filters):
        _filters.append((condition, tuple(states)))


def unregister_allocation_state_filter(condition: Callable[[str], Q]) -> None:
    _filters[:] = [(fn, states) for fn, states in _filters if fn is not condition]


def allocation_state_names() -> list[str]:
    names = [FREE]
    for _, states in _filters:
        names += [s for s in states if s not in names]
    return names


def allocation_state_q(state: str) -> Q:
    """Devices in ``state``: every device is free when no app says otherwise. Unknown names: ValueError."""
    if state not in allocation_state_names():
        raise ValueError(state)
    conditions = [fn(state) for fn, states in _filters if state in states]
    if not conditions:
        return Q() if state == FREE else Q(pk__in=[])
    combined = conditions[0]
    for condition in conditions[1:]:
        # A device is free only if no provider holds it; in another state if any provider says so.
        combined = (combined & condition) if state == FREE else (combined | condition)
    return combined
