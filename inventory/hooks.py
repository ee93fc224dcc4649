"""Extension points the claims app fills in (the inventory does not import the claims app).

``register_allocation_state_provider(fn)``: ``fn(devices)`` receives a page of ``Device`` rows and returns
``{device.pk: {"state": "allocated", "claim": "ns/name", ...}}`` for the devices it knows about; the device
API shows ``{"state": "free"}`` for the rest. Call it from ``ClaimsConfig.ready()``.
"""
from __future__ import annotations

from typing import Callable, Iterable

_providers: list[Callable] = []


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
