"""The ``Reservation`` object (``draservice.io/v1alpha1``): parsing, defaulting and validation of one object.

Capacity booked for a future window, once or every day (``dra.windows``), for some namespaces and queues.
Pure checks of the object itself live here; the checks against other reservations and the fleet (conflicts,
queues' nominal guarantees) are ``queues.services.reservations``'s, under its lock.
"""
from __future__ import annotations

from typing import Any

from dra import windows
from dra.k8s import fields as f
from queues import spec as queue_spec
from queues.models import API_VERSION

KIND = "Reservation"
LABEL = "draservice.io/reservation"  # a claim opts in by naming the reservation it runs in
SPEC_FIELDS = ("window", "resources", "users", "leadTimeSeconds", "reclaimBorrowed", "lendIdle")
RESOURCE_FIELDS = ("deviceClassName", "devices", "counters", "capacity", "clusterSelector", "nodeSelector",
                   "topologyKey")
UNITS = ("devices", "counters", "capacity")
USERS_FIELDS = ("namespaces", "queues")
MAX_RESOURCES = 16
MAX_USERS = 256
MAX_LEAD = 7 * 86400  # a week: a hold longer than that is a standing quota, which is the queue's business
MAX_DEVICES = 100_000


def normalize(body: Any, url_name: str | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """(normalized object, field errors). The object is ``{apiVersion, kind, metadata, spec}`` with defaults."""
    if not isinstance(body, dict):
        return {}, [("", "must be a Reservation object")]
    name, labels, annotations, errors = queue_spec.header(body, KIND, url_name)
    raw = body.get("spec")
    if not isinstance(raw, dict):
        return {}, errors + [f.invalid("spec", raw, "must be an object") if raw is not None
                             else f.required("spec")]
    spec, spec_errors = _spec(raw)
    obj = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": name or "", "labels": labels if isinstance(labels, dict) else {},
                        "annotations": annotations if isinstance(annotations, dict) else {}},
           "spec": spec}
    return obj, errors + spec_errors


def _spec(raw: dict) -> tuple[dict, list[tuple[str, str]]]:
    errors: list[tuple[str, str]] = []
    for key in raw:
        if key not in SPEC_FIELDS:
            errors.append(f.unsupported(f"spec.{key}", key, SPEC_FIELDS))
    _, window, window_errors = windows.parse(raw.get("window"))
    errors += window_errors
    spec: dict[str, Any] = {"window": window}
    resources = raw.get("resources")
    if not isinstance(resources, list) or not resources:
        errors.append(f.required("spec.resources", "a reservation books at least one resource") if not resources
                      else f.invalid("spec.resources", resources, "must be a list"))
        resources = []
    elif len(resources) > MAX_RESOURCES:
        errors.append(f.too_many("spec.resources", len(resources), MAX_RESOURCES))
    spec["resources"] = []
    for i, r in enumerate(resources):
        entry, entry_errors = _resource(r, f"spec.resources[{i}]")
        errors += entry_errors
        spec["resources"].append(entry)
    spec["users"] = _users(raw.get("users"), errors)
    lead = raw.get("leadTimeSeconds", 0)
    if isinstance(lead, bool) or not isinstance(lead, int) or not 0 <= lead <= MAX_LEAD:
        errors.append(f.invalid("spec.leadTimeSeconds", lead, f"must be an integer from 0 to {MAX_LEAD}"))
        lead = 0
    spec["leadTimeSeconds"] = lead
    for key in ("reclaimBorrowed", "lendIdle"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            errors.append(f.invalid(f"spec.{key}", value, "must be true or false"))
            value = False
        spec[key] = value
    return spec, errors


def _resource(r: Any, path: str) -> tuple[dict, list[tuple[str, str]]]:
    if not isinstance(r, dict):
        return {}, [f.invalid(path, r, "must be an object")]
    errors: list[tuple[str, str]] = []
    for key in r:
        if key not in RESOURCE_FIELDS:
            errors.append(f.unsupported(f"{path}.{key}", key, RESOURCE_FIELDS))
    entry: dict[str, Any] = {}
    cls = r.get("deviceClassName")
    if not cls:
        errors.append(f.required(f"{path}.deviceClassName", "every resource names its DeviceClass"))
    else:
        errors += f.check_dns_subdomain(cls, f"{path}.deviceClassName")
        entry["deviceClassName"] = cls
    units = [u for u in UNITS if r.get(u) is not None]
    if len(units) != 1:
        errors.append(f.required(path, "give exactly one of devices, counters, capacity") if not units else
                      f.invalid(f"{path}.{units[1]}", units[1], "give exactly one of devices, counters, capacity"))
    if r.get("devices") is not None:
        n = r["devices"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DEVICES:
            errors.append(f.invalid(f"{path}.devices", n, f"must be an integer from 1 to {MAX_DEVICES}"))
        else:
            entry["devices"] = n
    for unit in ("counters", "capacity"):
        if r.get(unit) is None:
            continue
        named = r[unit]
        if not isinstance(named, dict) or not named:
            errors.append(f.invalid(f"{path}.{unit}", named, "must map a name to a quantity (e.g. 160Gi)"))
            continue
        entry[unit] = {}
        for name, value in named.items():
            amount = queue_spec.amount_of(value) if f.is_quantity(value) or isinstance(value, int) else None
            reason = f.quantity_range_reason(value) if isinstance(value, str) and f.is_quantity(value) else None
            if not isinstance(name, str) or not name or amount is None or amount <= 0 or reason:
                errors.append(f.invalid(f"{path}.{unit}[{name}]", value, reason or "must be a positive quantity"))
            else:
                entry[unit][name] = value
    for key in ("clusterSelector", "nodeSelector"):
        selector = r.get(key)
        if selector is None:
            continue
        labels = selector.get("matchLabels") if isinstance(selector, dict) else None
        if not isinstance(labels, dict) or set(selector) - {"matchLabels"} or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            errors.append(f.invalid(f"{path}.{key}", selector, "must be {matchLabels: {label: value}}"))
        else:
            entry[key] = {"matchLabels": dict(labels)}
    if r.get("topologyKey") is not None:
        key = r["topologyKey"]
        if not isinstance(key, str) or not key:
            errors.append(f.invalid(f"{path}.topologyKey", key, "must be a node label key"))
        else:
            errors += f.check_label_name(key, f"{path}.topologyKey")
            entry["topologyKey"] = key
    return entry, errors


def _users(raw: Any, errors: list) -> dict:
    if not isinstance(raw, dict):
        errors.append(f.required("spec.users", "{namespaces, queues}: who may run in the reservation"))
        return {"namespaces": [], "queues": []}
    for key in raw:
        if key not in USERS_FIELDS:
            errors.append(f.unsupported(f"spec.users.{key}", key, USERS_FIELDS))
    out: dict[str, list[str]] = {}
    for key in USERS_FIELDS:
        names = raw.get(key) or []
        if not isinstance(names, list):
            errors.append(f.invalid(f"spec.users.{key}", names, "must be a list of names"))
            names = []
        elif len(names) > MAX_USERS:
            errors.append(f.too_many(f"spec.users.{key}", len(names), MAX_USERS))
        seen: set[str] = set()
        for i, n in enumerate(names):
            errors += f.check_dns_label(n, f"spec.users.{key}[{i}]")
            if n in seen:
                errors.append(f.duplicate(f"spec.users.{key}[{i}]", n))
            if isinstance(n, str):
                seen.add(n)
        out[key] = [n for n in names if isinstance(n, str)]
    if not out["namespaces"] and not out["queues"]:
        errors.append(f.required("spec.users", "name at least one namespace or queue"))
    return out


def parsed_window(spec: dict) -> windows.Window:
    """The stored (valid) spec's window."""
    window, _, errors = windows.parse(spec["window"])
    assert window is not None, errors
    return window
