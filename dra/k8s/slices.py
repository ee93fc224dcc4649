"""ResourceSlice, DeviceClass and DeviceTaintRule: conversion to ``resource.k8s.io/v1`` and validation.

Pure functions on JSON-shaped dicts, no Django. ``normalize_*`` accept v1, v1beta2 and v1beta1 (DeviceTaintRule
also v1alpha3), return one normalized v1 object, and raise ``ObjectInvalid`` with every problem found as
``(field path, reason)``. Paths are in the v1 shape (``spec.devices[5].attributes[productName]``), as upstream
reports them after its own v1beta1 normalization.

Limits and messages follow upstream ``pkg/apis/resource/validation/validation.go`` and
``k8s.io/api/resource/v1/types.go``.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dra.k8s.fields import (
    GROUP,
    Errors,
    ObjectInvalid,
    as_dict,
    as_list,
    check_dns_label,
    check_dns_subdomain,
    check_driver_name,
    check_envelope,
    check_label_name,
    check_label_value,
    check_node_selector,
    check_pool_name,
    check_qualified_name,
    check_string_list,
    check_unknown,
    finish_object,
    is_quantity,
    is_semver,
    json_copy,
    normalize_metadata,
    normalize_quantity,
    qualified_name_reasons,
    quantity_range_reason,
    too_long,
    too_many,
)

__all__ = [
    "ACCEPTED_VERSIONS", "Errors", "ObjectInvalid", "check_cel_selector", "check_opaque_config", "check_taint",
    "normalize_device_class", "normalize_device_taint_rule", "normalize_resource_slice", "taint_rule_matches",
]

# v1alpha3 (Kubernetes 1.31) has the v1beta1 shape for everything this module reads.
ACCEPTED_VERSIONS = {f"{GROUP}/v1", f"{GROUP}/v1beta2", f"{GROUP}/v1beta1", f"{GROUP}/v1alpha3"}

# --- upstream limits (k8s.io/api/resource/v1/types.go) ---------------------------------------------------
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # any device with taints, consumesCounters or list attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_DOMAIN_LENGTH = 63
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
MAX_SELECTORS = 32
MAX_CONFIGS = 32
MAX_CEL_LENGTH = 10 * 1024
MAX_OPAQUE_PARAMETERS_LENGTH = 10 * 1024
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")

# --- ResourceSlice -----------------------------------------------------------------------------------------

SLICE_SPEC_FIELDS = frozenset({"driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection",
                               "devices", "sharedCounters", "partitionTypeAttribute", "skipNodeOperations"})
DEVICE_FIELDS = frozenset({"name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector",
                           "allNodes", "taints", "bindsToNode", "bindingConditions", "bindingFailureConditions",
                           "allowMultipleAllocations", "nodeAllocatableResources"})
BASIC_FIELDS = DEVICE_FIELDS - {"name"}
ATTRIBUTE_TYPES: dict[str, type[Any]] = {"int": int, "bool": bool, "string": str, "version": str,
                                         "ints": list, "bools": list, "strings": list, "versions": list}


def _from_v1beta1_slice_spec(spec: dict, errs: Errors) -> dict:
    """v1beta1: per-device fields under ``basic``; nodeName "" and allNodes false mean unset."""
    spec = dict(spec)
    if spec.get("nodeName") == "":
        del spec["nodeName"]
    if spec.get("allNodes") is False:
        del spec["allNodes"]
    devices = []
    for i, device in enumerate(as_list(spec.get("devices"), "spec.devices", errs)):
        path = f"spec.devices[{i}]"
        if not isinstance(device, dict):
            devices.append(device)
            continue
        flat = {k: v for k, v in device.items() if k != "basic"}
        basic = as_dict(device.get("basic"), f"{path}.basic", errs)
        check_unknown(basic, BASIC_FIELDS, f"{path}.basic", errs)
        for key, value in basic.items():
            if key == "capacity" and isinstance(value, dict):
                # v1alpha3 capacities were bare quantities; v1beta1 wraps them as {value: ...}.
                value = {k: (v if isinstance(v, dict) else {"value": v}) for k, v in value.items()}
            flat[key] = value
        devices.append(flat)
    if "devices" in spec:
        spec["devices"] = devices
    return spec


def normalize_resource_slice(obj: Any, copy: bool = True) -> dict:
    """Any accepted version of a ResourceSlice -> normalized, validated v1 ResourceSlice.

    ``copy=False`` skips the defensive deep copy (a third of the time on a big push): the result then
    shares dicts with ``obj``, and quantities given as JSON numbers are rewritten in ``obj`` as strings.
    Only for input that is thrown away afterwards, like a request body."""
    errs: Errors = []
    api_version, metadata, spec = check_envelope(obj, "ResourceSlice", ACCEPTED_VERSIONS, errs)
    if api_version.endswith(("/v1beta1", "/v1alpha3")):
        spec = _from_v1beta1_slice_spec(spec, errs)
    metadata = normalize_metadata(metadata, errs)
    spec = json_copy(spec) if copy else dict(spec)
    _check_slice_spec(spec, errs)
    return finish_object("ResourceSlice", metadata, spec, errs)


INT64_MAX = 2**63 - 1


def _int64_reason(value: Any, minimum: int) -> str | None:
    """Why ``value`` is not an int64 of at least ``minimum`` (both pool counters are int64 upstream and
    bigint columns here), or None. Integers past 2**64 arrive as floats from the JSON parser."""
    if value is None:
        return "Required value"
    shown = f"Invalid value: {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{shown}: must be an integer"
    if value > INT64_MAX:
        return f"{shown}: must be less than or equal to {INT64_MAX}"
    if isinstance(value, float):
        return f"{shown}: must be an integer"
    if value < minimum:
        return f"{shown}: must be greater than {'or equal to zero' if minimum == 0 else 'zero'}"
    return None


def _check_slice_spec(spec: dict, errs: Errors) -> None:
    check_unknown(spec, SLICE_SPEC_FIELDS, "spec", errs)
    errs += check_driver_name(spec.get("driver"), "spec.driver")
    _check_pool(spec.get("pool"), errs)
    _check_node_selection(spec, errs)
    if "sharedCounters" in spec and "devices" in spec:
        errs.append(("spec", "only one of `sharedCounters` or `devices` is allowed"))
    _check_devices(as_list(spec.get("devices"), "spec.devices", errs), spec.get("perDeviceNodeSelection") is True,
                   errs)
    _check_counter_sets(as_list(spec.get("sharedCounters"), "spec.sharedCounters", errs), errs)
    if "partitionTypeAttribute" in spec:
        value = spec["partitionTypeAttribute"]
        if not isinstance(value, str) or "/" not in value:
            errs.append(("spec.partitionTypeAttribute", "a fully qualified name must be a domain and a name "
                                                        "separated by a slash"))
        else:
            errs += check_qualified_name(value, "spec.partitionTypeAttribute")
    skip = check_string_list(spec.get("skipNodeOperations"), "spec.skipNodeOperations", errs, 3,
                             lambda v, p: [] if v in ("NodePrepareResources", "NodeUnprepareResources", "*")
                             else [(p, f"Unsupported value: {v!r}")])
    if "NodePrepareResources" in skip and not {"NodeUnprepareResources", "*"} & set(skip):
        errs.append(("spec.skipNodeOperations",
                     "NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped"))


def _check_pool(value: Any, errs: Errors) -> None:
    pool = as_dict(value, "spec.pool", errs, required=True)
    check_unknown(pool, frozenset({"name", "generation", "resourceSliceCount"}), "spec.pool", errs)
    errs += check_pool_name(pool.get("name"), "spec.pool.name")
    for field, minimum, default in (("generation", 0, 0), ("resourceSliceCount", 1, None)):
        reason = _int64_reason(pool.get(field, default), minimum)
        if reason:
            errs.append((f"spec.pool.{field}", reason))


def _check_node_selection(spec: dict, errs: Errors) -> None:
    """Exactly one of the slice's ways of saying which nodes reach its devices."""
    set_fields = []
    if "nodeName" in spec:
        if isinstance(spec["nodeName"], str) and spec["nodeName"]:
            set_fields.append("`nodeName`")
            errs += check_dns_subdomain(spec["nodeName"], "spec.nodeName")
        else:
            errs.append(("spec.nodeName", "must be either unset or set to a non-empty string"))
    if "nodeSelector" in spec:
        set_fields.append("`nodeSelector`")
        check_node_selector(spec["nodeSelector"], "spec.nodeSelector", errs)
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in spec:
            if spec[flag] is True:
                set_fields.append(f"`{flag}`")
            else:
                errs.append((f"spec.{flag}", f"Invalid value: {spec[flag]!r}: must be either unset or set to true"))
    one_of = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not set_fields:
        errs.append(("spec", one_of))
    elif len(set_fields) > 1:
        errs.append(("spec", f"{{{', '.join(set_fields)}}}: {one_of}, but multiple fields are set"))


def _uses_advanced_features(device: Any) -> bool:
    return isinstance(device, dict) and bool(
        device.get("taints") or device.get("consumesCounters") or (isinstance(device.get("attributes"), dict) and any(
            isinstance(a, dict) and any(k in a for k in ("ints", "bools", "strings", "versions"))
            for a in device["attributes"].values())))


def _check_devices(devices: list, per_device: bool, errs: Errors) -> None:
    # Only a slice of more than 64 devices needs to know whether it uses the advanced features.
    advanced = len(devices) > MAX_DEVICES_ADVANCED and any(_uses_advanced_features(d) for d in devices)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        errs.append(("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items"
                     + (" (devices with taints, consumesCounters or list attributes)" if advanced else "")))
        return
    names = set()
    for i, device in enumerate(devices):
        name = _check_device(device, f"spec.devices[{i}]", per_device, errs)
        if name in names:
            errs.append((f"spec.devices[{i}]", f"Duplicate value: {name!r}"))
        names.add(name)


def _check_counter_sets(counter_sets: list, errs: Errors) -> None:
    if len(counter_sets) > MAX_COUNTER_SETS:
        errs.append(too_many("spec.sharedCounters", len(counter_sets), MAX_COUNTER_SETS))
        return
    names = set()
    for i, counter_set in enumerate(counter_sets):
        path = f"spec.sharedCounters[{i}]"
        counter_set = as_dict(counter_set, path, errs)
        check_unknown(counter_set, frozenset({"name", "counters"}), path, errs)
        errs += check_dns_label(counter_set.get("name"), f"{path}.name")
        _counters(counter_set, path, MAX_COUNTERS_PER_SET, errs)
        if counter_set.get("name") in names:
            errs.append((path, f"Duplicate value: {counter_set.get('name')!r}"))
        names.add(counter_set.get("name"))


def _counters(holder: dict, path: str, limit: int, errs: Errors) -> None:
    counters = as_dict(holder.get("counters"), f"{path}.counters", errs, required=True)
    if not counters and isinstance(holder.get("counters"), dict):
        errs.append((f"{path}.counters", "Required value"))
    if len(counters) > limit:
        errs.append(too_many(f"{path}.counters", len(counters), limit))
        return
    for name, counter in counters.items():
        cpath = f"{path}.counters[{name}]"
        errs += check_dns_label(name, cpath)
        counter = as_dict(counter, cpath, errs)
        check_unknown(counter, frozenset({"value"}), cpath, errs)
        if "value" not in counter:
            errs.append((f"{cpath}.value", "Required value"))
        else:
            counter["value"] = normalize_quantity(counter["value"], f"{cpath}.value", errs)


# --- one device --------------------------------------------------------------------------------------------

def _check_device(device: Any, path: str, per_device: bool, errs: Errors) -> Any:
    """Check (and normalize in place) one device; returns its name for the duplicate check."""
    device = as_dict(device, path, errs, required=True)
    check_unknown(device, DEVICE_FIELDS, path, errs)
    errs += check_dns_label(device.get("name"), f"{path}.name")
    attributes = as_dict(device.get("attributes"), f"{path}.attributes", errs)
    capacity = as_dict(device.get("capacity"), f"{path}.capacity", errs)
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append((path, f"Invalid value: {len(attributes) + len(capacity)}: the total number of attributes and "
                           f"capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"))
    _check_attributes(attributes, path, errs)
    _check_capacity(capacity, path, device.get("allowMultipleAllocations") is True, errs)
    for flag in ("allowMultipleAllocations", "bindsToNode"):
        if flag in device and not isinstance(device[flag], bool):
            errs.append((f"{path}.{flag}", "must be a boolean"))
    taints = as_list(device.get("taints"), f"{path}.taints", errs)
    if len(taints) > MAX_TAINTS:
        errs.append(too_many(f"{path}.taints", len(taints), MAX_TAINTS))
    else:
        for i, taint in enumerate(taints):
            check_taint(taint, f"{path}.taints[{i}]", errs)
    _check_consumptions(as_list(device.get("consumesCounters"), f"{path}.consumesCounters", errs), path, errs)
    _check_device_nodes(device, path, per_device, errs)
    _check_binding_conditions(device, path, errs)
    if "nodeAllocatableResources" in device:
        as_dict(device["nodeAllocatableResources"], f"{path}.nodeAllocatableResources", errs)
    return device.get("name")


def _check_attributes(attributes: dict, path: str, errs: Errors) -> None:
    values = 0
    for name, attribute in attributes.items():
        # Hot path (a big push has ~10 attributes on each of 40,000 devices): the common valid scalar
        # costs a few dict and type checks; paths are only formatted when something is wrong.
        reasons = qualified_name_reasons(name) if type(name) is str else ("must be a string",)
        if reasons:
            errs += [(f"{path}.attributes", r) for r in reasons]
        if type(attribute) is dict and len(attribute) == 1:
            key, value = next(iter(attribute.items()))
            if key == "string" and type(value) is str and len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH:
                values += 1
                continue
            if (key == "version" and type(value) is str and len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH
                    and is_semver(value)):
                values += 1
                continue
            if (key == "int" and type(value) is int) or (key == "bool" and type(value) is bool):
                values += 1
                continue
        values += _check_attribute_slow(attribute, f"{path}.attributes[{name}]", errs)
    if values > MAX_ATTRIBUTE_VALUES:
        errs.append((path, f"Invalid value: {values}: the total number of attribute values must not exceed "
                           f"{MAX_ATTRIBUTE_VALUES}"))


def _check_attribute_slow(attribute: Any, apath: str, errs: Errors) -> int:
    """Full check of one attribute value (lists, wrong types, several values); returns how many values."""
    attribute = as_dict(attribute, apath, errs)
    set_keys = [k for k in attribute if k in ATTRIBUTE_TYPES]
    check_unknown(attribute, frozenset(ATTRIBUTE_TYPES), apath, errs)
    if len(set_keys) != 1:
        errs.append((apath, "exactly one value must be specified"))
        return 1
    key = set_keys[0]
    value = attribute[key]
    if not isinstance(value, ATTRIBUTE_TYPES[key]) or (key in ("int", "ints") and isinstance(value, bool)):
        errs.append((f"{apath}.{key}", f"must be of type {key}"))
        return 1
    is_list = isinstance(value, list)
    if is_list and not value:
        errs.append((f"{apath}.{key}", "must not be empty if specified"))
    for j, item in enumerate(value if is_list else [value]):
        ipath = f"{apath}.{key}[{j}]" if is_list else f"{apath}.{key}"
        if is_list:
            expected = {"strings": str, "versions": str, "ints": int, "bools": bool}[key]
            if not isinstance(item, expected) or (expected is int and isinstance(item, bool)):
                errs.append((ipath, f"must be of type {key[:-1]}"))
                continue
        if key in ("string", "strings", "version", "versions") and len(item) > MAX_ATTRIBUTE_VALUE_LENGTH:
            errs.append(too_long(ipath, MAX_ATTRIBUTE_VALUE_LENGTH))
        if key in ("version", "versions") and not is_semver(item):
            errs.append((ipath, f"Invalid value: {item!r}: must be a string compatible with semver.org spec 2.0.0"))
    return len(value) if is_list else 1


def _check_capacity(capacity: dict, path: str, multi: bool, errs: Errors) -> None:
    for name, cap in capacity.items():
        reasons = qualified_name_reasons(name) if type(name) is str else ("must be a string",)
        if reasons:
            errs += [(f"{path}.capacity", r) for r in reasons]
        if type(cap) is dict and len(cap) == 1 and type(cap.get("value")) is str and is_quantity(cap["value"]) \
                and quantity_range_reason(cap["value"]) is None:
            continue
        cpath = f"{path}.capacity[{name}]"
        cap = as_dict(cap, cpath, errs)
        check_unknown(cap, frozenset({"value", "requestPolicy"}), cpath, errs)
        if "value" not in cap:
            errs.append((f"{cpath}.value", "Required value"))
        else:
            cap["value"] = normalize_quantity(cap["value"], f"{cpath}.value", errs)
        if "requestPolicy" in cap:
            if not multi:
                errs.append((f"{cpath}.requestPolicy", "Forbidden: allowMultipleAllocations must be true"))
            _request_policy(cap["requestPolicy"], f"{cpath}.requestPolicy", errs)


def _check_consumptions(consumptions: list, path: str, errs: Errors) -> None:
    if len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
        errs.append(too_many(f"{path}.consumesCounters", len(consumptions), MAX_CONSUMPTIONS_PER_DEVICE))
        return
    seen = set()
    for i, consumption in enumerate(consumptions):
        cpath = f"{path}.consumesCounters[{i}]"
        consumption = as_dict(consumption, cpath, errs)
        check_unknown(consumption, frozenset({"counterSet", "counters", "compatibilityGroups"}), cpath, errs)
        errs += check_dns_label(consumption.get("counterSet"), f"{cpath}.counterSet")
        _counters(consumption, cpath, MAX_COUNTERS_PER_CONSUMPTION, errs)
        check_string_list(consumption.get("compatibilityGroups"), f"{cpath}.compatibilityGroups", errs, 2,
                          check_dns_label)
        if consumption.get("counterSet") in seen:
            errs.append((cpath, f"Duplicate value: {consumption.get('counterSet')!r}"))
        seen.add(consumption.get("counterSet"))


def _check_device_nodes(device: dict, path: str, per_device: bool, errs: Errors) -> None:
    """A device names its own nodes only when the slice says ``perDeviceNodeSelection``, and then exactly once."""
    node_fields = [f for f in ("nodeName", "nodeSelector", "allNodes") if f in device]
    if not per_device:
        if node_fields:
            errs.append((path, "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                               "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"))
        return
    if "nodeName" in device:
        if isinstance(device["nodeName"], str) and device["nodeName"]:
            errs += check_dns_subdomain(device["nodeName"], f"{path}.nodeName")
        else:
            errs.append((f"{path}.nodeName", "must not be empty"))
    if "nodeSelector" in device:
        check_node_selector(device["nodeSelector"], f"{path}.nodeSelector", errs)
    if "allNodes" in device and device["allNodes"] is not True:
        errs.append((f"{path}.allNodes", f"Invalid value: {device['allNodes']!r}: must be either unset or set to true"))
    if len(node_fields) != 1:
        errs.append((path, "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
                           "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"))


def _check_binding_conditions(device: dict, path: str, errs: Errors) -> None:
    conditions = check_string_list(device.get("bindingConditions"), f"{path}.bindingConditions", errs,
                                   MAX_BINDING_CONDITIONS, check_label_name)
    failures = check_string_list(device.get("bindingFailureConditions"), f"{path}.bindingFailureConditions", errs,
                                 MAX_BINDING_CONDITIONS, check_label_name)
    for i, condition in enumerate(failures):
        if condition in conditions:
            errs.append((f"{path}.bindingFailureConditions[{i}]",
                         "bindingFailureConditions must not overlap with bindingConditions"))
    if conditions and not failures:
        errs.append((f"{path}.bindingFailureConditions",
                     "bindingFailureConditions are required to use bindingConditions"))
    if failures and not conditions:
        errs.append((f"{path}.bindingConditions", "bindingConditions are required to use bindingFailureConditions"))


def _request_policy(value: Any, path: str, errs: Errors) -> None:
    policy = as_dict(value, path, errs)
    check_unknown(policy, frozenset({"default", "validValues", "validRange"}), path, errs)
    if policy.get("validValues") and policy.get("validRange") is not None:
        errs.append((path, 'Forbidden: exactly one policy can be specified, cannot specify "validValues" and '
                           '"validRange" at the same time'))
    if "default" in policy and policy["default"] is not None:
        policy["default"] = normalize_quantity(policy["default"], f"{path}.default", errs)
    valid_values = as_list(policy.get("validValues"), f"{path}.validValues", errs)
    if len(valid_values) > 10:
        errs.append(too_many(f"{path}.validValues", len(valid_values), 10))
    for i, item in enumerate(valid_values):
        valid_values[i] = normalize_quantity(item, f"{path}.validValues[{i}]", errs)
    if (valid_values or policy.get("validRange") is not None) and policy.get("default") is None:
        errs.append((f"{path}.default", "Required value: required when validValues or validRange is defined"))
    if policy.get("validRange") is not None:
        rng = as_dict(policy["validRange"], f"{path}.validRange", errs)
        check_unknown(rng, frozenset({"min", "max", "step"}), f"{path}.validRange", errs)
        if rng.get("min") is None:
            errs.append((f"{path}.validRange.min", "Required value: required when validRange is defined"))
        for key in ("min", "max", "step"):
            if rng.get(key) is not None:
                rng[key] = normalize_quantity(rng[key], f"{path}.validRange.{key}", errs)


def check_taint(value: Any, path: str, errs: Errors) -> dict:
    taint = as_dict(value, path, errs, required=True)
    check_unknown(taint, frozenset({"key", "value", "effect", "timeAdded"}), path, errs)
    errs += check_label_name(taint.get("key"), f"{path}.key")
    if taint.get("value"):
        errs += check_label_value(taint["value"], f"{path}.value")
    effect = taint.get("effect")
    if not effect:
        errs.append((f"{path}.effect", "Required value"))
    elif effect not in TAINT_EFFECTS:
        errs.append((f"{path}.effect", f"Unsupported value: {effect!r}: supported values: "
                     + ", ".join(f'"{e}"' for e in TAINT_EFFECTS)))
    if "timeAdded" in taint and taint["timeAdded"] is not None and not isinstance(taint["timeAdded"], str):
        errs.append((f"{path}.timeAdded", "must be an RFC 3339 timestamp"))
    return taint


# --- DeviceClass -------------------------------------------------------------------------------------------

def normalize_device_class(obj: Any, compile_cel: Callable[[str], Any] | None = None) -> dict:
    """Any accepted version of a DeviceClass -> normalized v1. ``compile_cel(expression)`` raises on a bad
    expression, including one too expensive to store (``dra.cel.compile_selector``); its message becomes the
    reason at ``spec.selectors[i].cel.expression``."""
    errs: Errors = []
    _, metadata, spec = check_envelope(obj, "DeviceClass", ACCEPTED_VERSIONS, errs)
    metadata = normalize_metadata(metadata, errs)
    spec = json_copy(spec)
    check_unknown(spec, frozenset({"selectors", "config", "extendedResourceName"}), "spec", errs)
    selectors = as_list(spec.get("selectors"), "spec.selectors", errs)
    if len(selectors) > MAX_SELECTORS:
        errs.append(too_many("spec.selectors", len(selectors), MAX_SELECTORS))
        selectors = []
    for i, selector in enumerate(selectors):
        check_cel_selector(selector, f"spec.selectors[{i}]", errs, compile_cel)
    configs = as_list(spec.get("config"), "spec.config", errs)
    if len(configs) > MAX_CONFIGS:
        errs.append(too_many("spec.config", len(configs), MAX_CONFIGS))
        configs = []
    for i, config in enumerate(configs):
        check_opaque_config(config, f"spec.config[{i}]", errs)
    if "extendedResourceName" in spec and not _is_extended_resource_name(spec["extendedResourceName"]):
        errs.append(("spec.extendedResourceName",
                     f"Invalid value: {spec['extendedResourceName']!r}: must be a valid extended resource name"))
    return finish_object("DeviceClass", metadata, spec, errs)


def check_cel_selector(value: Any, path: str, errs: Errors, compile_cel: Callable[[str], Any] | None) -> None:
    selector = as_dict(value, path, errs, required=True)
    check_unknown(selector, frozenset({"cel"}), path, errs)
    cel = as_dict(selector.get("cel"), f"{path}.cel", errs, required=True)
    check_unknown(cel, frozenset({"expression"}), f"{path}.cel", errs)
    expression = cel.get("expression")
    epath = f"{path}.cel.expression"
    if not isinstance(expression, str) or not expression.strip():
        errs.append((epath, "Required value"))
    elif len(expression) > MAX_CEL_LENGTH:
        errs.append(too_long(epath, MAX_CEL_LENGTH))
    elif compile_cel is not None:
        try:
            compile_cel(expression)
        except Exception as exc:  # the CEL library's own error type; its message is the reason
            reason = getattr(exc, "reason", None) or str(exc)
            position = getattr(exc, "position", None)
            where = f" (at character {position + 1})" if isinstance(position, int) else ""
            hint = getattr(exc, "hint", None)
            hint = f"; hint: {hint}" if hint else ""
            # Too expensive is upstream's field.Forbidden ("too complex, exceeds cost limit").
            kind = "Forbidden" if getattr(exc, "forbidden", False) else "Invalid value"
            errs.append((epath, f"{kind}: {reason}{where}{hint}"))


def check_opaque_config(value: Any, path: str, errs: Errors) -> None:
    config = as_dict(value, path, errs, required=True)
    check_unknown(config, frozenset({"opaque", "requests"}), path, errs)
    opaque = as_dict(config.get("opaque"), f"{path}.opaque", errs, required=True)
    check_unknown(opaque, frozenset({"driver", "parameters"}), f"{path}.opaque", errs)
    errs += check_driver_name(opaque.get("driver"), f"{path}.opaque.driver")
    params = opaque.get("parameters")
    if not isinstance(params, dict):
        errs.append((f"{path}.opaque.parameters",
                     "Required value" if params is None else "must be a valid JSON object"))
    elif len(json.dumps(params, separators=(",", ":"))) > MAX_OPAQUE_PARAMETERS_LENGTH:
        errs.append(too_long(f"{path}.opaque.parameters", MAX_OPAQUE_PARAMETERS_LENGTH))


def _is_extended_resource_name(value: Any) -> bool:
    """core/v1 helper IsExtendedResourceName: qualified, outside kubernetes.io, not requests.-prefixed."""
    if not isinstance(value, str) or "/" not in value or value.startswith("requests."):
        return False
    domain = value.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return not check_label_name("requests." + value, "")


# --- DeviceTaintRule ---------------------------------------------------------------------------------------

TAINT_RULE_VERSIONS = ACCEPTED_VERSIONS


def normalize_device_taint_rule(obj: Any) -> dict:
    errs: Errors = []
    _, metadata, spec = check_envelope(obj, "DeviceTaintRule", TAINT_RULE_VERSIONS, errs)
    metadata = normalize_metadata(metadata, errs)
    spec = json_copy(spec)
    check_unknown(spec, frozenset({"deviceSelector", "taint"}), "spec", errs)
    if "deviceSelector" in spec:
        selector = as_dict(spec["deviceSelector"], "spec.deviceSelector", errs)
        for removed in ("deviceClassName", "selectors"):
            if removed in selector:
                errs.append((f"spec.deviceSelector.{removed}", "Forbidden: removed after v1alpha3 and not supported: "
                                                                "select devices by driver, pool and device"))
        check_unknown(selector, frozenset({"driver", "pool", "device", "deviceClassName", "selectors"}),
                 "spec.deviceSelector", errs)
        if "driver" in selector:
            errs += check_driver_name(selector["driver"], "spec.deviceSelector.driver")
        if "pool" in selector:
            errs += check_pool_name(selector["pool"], "spec.deviceSelector.pool")
        if "device" in selector:
            errs += check_dns_label(selector["device"], "spec.deviceSelector.device")
    check_taint(spec.get("taint"), "spec.taint", errs)
    return finish_object("DeviceTaintRule", metadata, spec, errs)


def taint_rule_matches(rule_spec: dict, driver: str, pool: str, device: str) -> bool:
    """Upstream: all selector criteria must match; an empty selector matches all, no selector matches none."""
    selector = rule_spec.get("deviceSelector")
    if selector is None:
        return False
    return all(selector.get(key) in (None, value) for key, value in
               (("driver", driver), ("pool", pool), ("device", device)))
