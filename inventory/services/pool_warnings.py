"""Pool warnings from the allocation round: a selector that fails at run time on a pool's devices.

Such devices match nothing (``dra.engine.selectors``); the claims that met them say so in their diagnostics,
and the cluster's operator hears of it here: one ``PoolEvent`` of type ``SelectorError`` per selector, error and
push of the cluster, e.g. "class gpu.nvidia.com's selector #0 fails on 1 device of cluster rogue: no such key:
type". The key holds the cluster's ``inventory_version``, so however many claims and rounds meet the error, it
is raised once per push that changed the cluster, and again after a push that does not fix it.

A claim's own selector is not named beyond its class (pool events are read by every tenant that reads the
inventory; the expression is the claim owner's), so those warnings are one per error text.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import cast

from inventory.models import PoolEvent

MAX_REMEMBERED = 4096
_raised: set[tuple[int, str | None]] = set()


def selector_errors_of(outcomes: Iterable) -> list[dict]:
    """The ``selector_errors`` entries of the engine outcomes' failure diagnostics (skips non-outcomes)."""
    out: list[dict] = []
    for outcome in outcomes:
        diagnostics = getattr(outcome, "diagnostics", None)
        if not diagnostics:
            continue
        for request in diagnostics.get("requests") or ():
            out.extend(request.get("selector_errors") or ())
    return out


def raise_selector_errors(errors: list[dict], cluster_versions: dict[str, tuple[int, tuple]]) -> int:
    """Store one warning per (cluster push, selector, error) not stored yet; the number of rows offered.

    ``cluster_versions``: the round's fleet view (name -> (cluster id, (inventory_version, ...))). One INSERT
    that skips keys already present; nothing at all without errors."""
    wanted: dict[tuple, PoolEvent] = {}
    for e in errors:
        ids = cluster_versions.get(e["cluster"])
        if ids is None:
            continue
        cluster_id, (inventory_version, _stale) = ids[0], ids[1]
        if e["origin"] == "class":
            who, which = f"class {e['deviceClassName']}'s selector #{e['selector']}", e["deviceClassName"]
        else:
            who, which = "a claim's selector", ""
        ident = (cluster_id, inventory_version, e["origin"], which, e["selector"] if which else -1, e["error"])
        seen = wanted.get(ident)
        if seen is not None:
            seen_data = cast(dict, seen.data)  # made below, a dict
            seen_data["devices"] = max(seen_data["devices"], e["devices"])
            seen.message = _message(who, seen_data["devices"], e["cluster"], e["error"])
            continue
        data = {"origin": e["origin"], "deviceClassName": e["deviceClassName"], "selector": e["selector"],
                "error": e["error"], "devices": e["devices"], "example": e["device"],
                "inventoryVersion": inventory_version}
        if e["origin"] != "class":
            data.pop("selector")
        wanted[ident] = PoolEvent(
            cluster_id=cluster_id, driver=e["driver"], pool=e["pool"], type=PoolEvent.SELECTOR_ERROR,
            message=_message(who, e["devices"], e["cluster"], e["error"]), data=data,
            key=hashlib.sha256(repr(ident[1:]).encode()).hexdigest())
    # This process stored these already: a queue of claims meeting the same error costs no statement per round.
    fresh = [event for event in wanted.values() if (event.cluster_id, event.key) not in _raised]
    if fresh:
        PoolEvent.objects.bulk_create(fresh, ignore_conflicts=True)
        if len(_raised) > MAX_REMEMBERED:
            _raised.clear()
        _raised.update((event.cluster_id, event.key) for event in fresh)
    return len(fresh)


def _message(who: str, devices: int, cluster: str, error: str) -> str:
    noun = "device" if devices == 1 else "devices"
    return f"{who} fails on {devices} {noun} of cluster {cluster}: {error}"
