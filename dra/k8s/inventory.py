"""A cluster's inventory push, parsed: the body in any of its shapes -> normalized v1 objects.

Pure (no Django): the service's push endpoint (``inventory.services.sync``) validates a whole body here before
it opens a transaction, so that one bad object fails the push with every problem named by its path
(``resourceSlices[3].spec.devices[5].attributes``) and nothing is written.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dra.k8s.fields import (
    Errors,
    ObjectInvalid,
    check_dns_subdomain,
    check_label_name,
    check_label_value,
    check_unknown,
)
from dra.k8s.slices import normalize_device_class, normalize_device_taint_rule, normalize_resource_slice

PUSH_KEYS = {"resourceSlices": "ResourceSlice", "nodes": "Node", "deviceClasses": "DeviceClass",
             "deviceTaintRules": "DeviceTaintRule"}
KIND_TO_KEY = {kind: key for key, kind in PUSH_KEYS.items()}


@dataclass
class Inventory:
    slices: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)  # {"name", "labels"}
    classes: list[dict] = field(default_factory=list)
    rules: list[dict] = field(default_factory=list)
    slice_paths: list[tuple[str, dict]] = field(default_factory=list)  # (path in the body, normalized slice)


def normalize_node(obj: Any, path: str = "") -> dict:
    """``{"name", "labels"}`` or a core/v1 Node (only its name and labels are kept)."""
    errs: Errors = []
    if not isinstance(obj, dict):
        raise ObjectInvalid([(path, "must be an object")])
    if "metadata" in obj:
        metadata = obj.get("metadata")
        source, base = (metadata if isinstance(metadata, dict) else {}), "metadata."
    else:
        source, base = obj, ""
        check_unknown(obj, frozenset({"name", "labels", "apiVersion", "kind"}), "", errs)
    if obj.get("kind", "Node") != "Node":
        errs.append(("kind", f"Invalid value: {obj.get('kind')!r}: expected 'Node'"))
    errs += check_dns_subdomain(source.get("name"), f"{base}name")
    labels = source.get("labels") or {}
    if not isinstance(labels, dict):
        errs.append((f"{base}labels", "must be an object"))
        labels = {}
    for key, value in labels.items():
        errs += check_label_name(key, f"{base}labels[{key}]") + check_label_value(value, f"{base}labels[{key}]")
    if errs:
        raise ObjectInvalid(errs).prefixed(path)
    return {"name": source["name"], "labels": dict(labels)}


def parse_inventory(body: Any, compile_cel: Callable[[str], Any] | None = None) -> tuple[Inventory, Errors]:
    """The push body -> (normalized v1 objects, every problem found with its path in the body).

    The body is ``{resourceSlices, nodes, deviceClasses, deviceTaintRules}`` or a Kubernetes List (or a bare
    list of objects). ``compile_cel`` checks DeviceClass selectors (``normalize_device_class``). Raises
    ObjectInvalid only for a body that is neither."""
    if isinstance(body, list):
        body = {"kind": "List", "items": body}
    if not isinstance(body, dict):
        raise ObjectInvalid([("", "the body must be an object with resourceSlices/nodes/deviceClasses/"
                                  "deviceTaintRules, or a Kubernetes List")])
    errors: Errors = []
    buckets = _buckets(body, errors)
    inventory = Inventory()
    normalizers = {
        # The body is the caller's and discarded after the push: no need for a defensive copy of 40 MB of JSON.
        "resourceSlices": (lambda o: normalize_resource_slice(o, copy=False), inventory.slices),
        "nodes": (normalize_node, inventory.nodes),
        "deviceClasses": (lambda o: normalize_device_class(o, compile_cel), inventory.classes),
        "deviceTaintRules": (normalize_device_taint_rule, inventory.rules),
    }
    for key, items in buckets.items():
        normalize, out = normalizers[key]
        seen: dict[str, str] = {}
        for path, item in items:
            try:
                obj = normalize(item)
            except ObjectInvalid as exc:
                errors.extend(exc.prefixed(path).errors)
                continue
            if key == "resourceSlices":
                inventory.slice_paths.append((path, obj))
            name = obj["name"] if key == "nodes" else obj["metadata"]["name"]
            if name in seen:
                name_path = f"{path}.name" if key == "nodes" and "metadata" not in item else f"{path}.metadata.name"
                errors.append((name_path, f"Duplicate value: {name!r} (also at {seen[name]})"))
            seen[name] = path
            out.append(obj)
    return inventory, errors


def _buckets(body: dict, errors: Errors) -> dict[str, list[tuple[str, Any]]]:
    """The body's objects by push key, each with its path in the body."""
    buckets: dict[str, list[tuple[str, Any]]] = {key: [] for key in PUSH_KEYS}
    if "items" in body and str(body.get("kind", "List")).endswith("List"):
        items = body["items"] if isinstance(body["items"], list) else []
        if not isinstance(body["items"], list):
            errors.append(("items", "must be a list"))
        default_kind = body.get("kind", "List")[:-4] or None  # "ResourceSliceList" -> "ResourceSlice"
        for i, item in enumerate(items):
            kind = item.get("kind", default_kind) if isinstance(item, dict) else None
            key = KIND_TO_KEY.get(kind or "")
            if key is None:
                errors.append((f"items[{i}].kind", f"Unsupported value: {kind!r}: supported values: "
                               + ", ".join(f'"{k}"' for k in KIND_TO_KEY)))
            else:
                buckets[key].append((f"items[{i}]", item))
        return buckets
    for key, value in body.items():
        if key not in PUSH_KEYS:
            errors.append((key, "unknown field (expected resourceSlices, nodes, deviceClasses, deviceTaintRules)"))
        elif value is not None and not isinstance(value, list):
            errors.append((key, "must be a list"))
        else:
            buckets[key] = [(f"{key}[{i}]", item) for i, item in enumerate(value or [])]
    return buckets


# The attributes that name a device's product, in the order drivers publish them (NVIDIA productName, AMD
# model, Intel type): the usage ledger and the utilisation snapshots group by the same name.
PRODUCT_ATTRIBUTES = ("productName", "model", "type")


def product_name(device: dict | None) -> str:
    """A v1 device's product (its first product attribute's value), or ""."""
    attrs = (device or {}).get("attributes") or {}
    for name in PRODUCT_ATTRIBUTES:
        value = attrs.get(name)
        if isinstance(value, dict):
            for kind in ("string", "version", "int", "bool"):
                if kind in value:
                    return str(value[kind])[:253]
    return ""
