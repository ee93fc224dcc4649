"""The manifest doctor's Django side: the fleet's vocabulary from stored inventory, and diagnoses on 422s.

``dra.k8s.doctor`` is pure; it needs to know which (domain, name) attributes and capacities the fleet publishes
and which drivers each DeviceClass selects. That is read here from the stored devices as distinct keys (one
query each on PostgreSQL), and kept in memory until the inventory or the classes change.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Sum

from dra.k8s.doctor import Diagnosis, WorkBudget, diagnose, objects_in
from dra.k8s.doctor_cel import FleetVocabulary, class_drivers
from draservice.errors import Invalid
from draservice.problems import FieldError
from inventory.models import Cluster, Device, DeviceClass

__all__ = ["diagnosed", "fleet_vocabulary", "problem_members"]

_ATTRIBUTE_KEYS = f"""
    SELECT DISTINCT d.driver, a.key, (SELECT min(t) FROM jsonb_object_keys(a.value) AS t)
    FROM {Device._meta.db_table} d CROSS JOIN LATERAL jsonb_each(d.attributes) AS a
    WHERE jsonb_typeof(a.value) = 'object'
"""
_CAPACITY_KEYS = f"SELECT DISTINCT driver, jsonb_object_keys(capacity) FROM {Device._meta.db_table}"

_memo_lock = threading.Lock()
_memo: dict[tuple, FleetVocabulary] = {}


def _fleet_key() -> tuple:
    """Changes whenever a push changes a cluster's devices (inventory_version) or a class is written."""
    clusters = Cluster.objects.aggregate(n=Count("id"), v=Sum("inventory_version"), top=Max("id"))
    classes = DeviceClass.objects.aggregate(n=Count("id"), at=Max("updated_at"), top=Max("id"))
    return tuple(clusters.values()) + tuple(classes.values())


def fleet_vocabulary() -> FleetVocabulary:
    """The attribute and capacity names every driver of the fleet publishes, and the drivers of each class."""
    key = _fleet_key()
    with _memo_lock:
        if key in _memo:
            return _memo[key]
    attributes: set[tuple[str, str, str]] = set()
    capacity: set[tuple[str, str]] = set()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_ATTRIBUTE_KEYS)
            attributes = {(driver, name, typ or "") for driver, name, typ in cursor.fetchall()}
            cursor.execute(_CAPACITY_KEYS)
            capacity = {(driver, name) for driver, name in cursor.fetchall()}
    else:  # the embedded SQLite default: small fleets, read the columns
        for driver, attrs, caps in Device.objects.values_list("driver", "attributes", "capacity").iterator():
            attributes.update((driver, name, next(iter(value), "")) for name, value in (attrs or {}).items()
                              if isinstance(value, dict))
            capacity.update((driver, name) for name in caps or {})
    classes = class_drivers(DeviceClass.objects.values_list("object", flat=True))
    vocabulary = FleetVocabulary.from_keys(attributes, capacity, classes)
    with _memo_lock:
        _memo.clear()  # one fleet state at a time is all a web process needs
        _memo[key] = vocabulary
    return vocabulary


def forget_vocabulary() -> None:
    """After a write that was rolled back (a dry run): what it read is no fleet's state."""
    with _memo_lock:
        _memo.clear()


def problem_members(diagnosis: Diagnosis) -> dict:
    """What a 422 carries of a diagnosis: ``rewrite`` and ``changes``, or ``skeleton``, with ``explanation``;
    nothing when the doctor has nothing to add (a v1 object with an ordinary mistake)."""
    if diagnosis.rewrite is None and diagnosis.skeleton is None and not diagnosis.changes:
        return {}
    out: dict[str, Any] = {"explanation": diagnosis.explanation}
    if diagnosis.rewrite is not None:
        out["rewrite"] = diagnosis.rewrite
    if diagnosis.changes:
        out["changes"] = diagnosis.changes
    if diagnosis.skeleton is not None:
        out["skeleton"] = diagnosis.skeleton
    return out


@contextmanager
def diagnosed(body: Any, *, batch: bool = False) -> Iterator[None]:
    """Around a create: a 422 for an object the doctor can rewrite (or sketch) carries the diagnosis next to
    the unchanged errors. ``batch``: the body is a list, a ``kind: List`` or ``{"items": [...]}``; each item's
    diagnosis goes into ``diagnoses`` with its index."""
    try:
        yield
    except Invalid as exc:
        exc.extra.update(_members(body, batch))
        raise
    except FieldError as exc:  # the door's own check of the body's shape, before any service
        if exc.status_code == 422:
            exc.extra.update(_members(body, batch))
        raise


def _members(body: Any, batch: bool) -> dict:
    if not batch:
        return problem_members(diagnose(body, fleet_vocabulary())) if isinstance(body, dict) else {}
    items = objects_in(body) or []
    fleet, budget = fleet_vocabulary(), WorkBudget()
    diagnoses = []
    for index, item in enumerate(items):
        members = problem_members(diagnose(item, fleet, budget)) if isinstance(item, dict) else {}
        if members:
            diagnoses.append({"index": index, **members})
    return {"diagnoses": diagnoses} if diagnoses else {}
