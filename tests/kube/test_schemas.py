"""The door's OpenAPI v3 schemas (kube.schemas): structural for every served kind and version, with upstream's
list semantics, and from the same definitions as fieldValidation and the validators' field sets."""
from __future__ import annotations

import pytest

from dra import windows
from dra.k8s import claims as k8s_claims
from dra.k8s import slices
from gangs import spec as gang_spec
from kube import fields, openapi, schemas
from kube.registry import RESOURCES, groups
from queues import reservation_spec
from queues import spec as queue_spec


def _walk(schema: dict, path: str, problems: list[str]) -> None:
    """Structural in the apiextensions sense: every node typed (or int-or-string), every object with properties,
    a map's value schema or explicitly free-form."""
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: no type")
    if schema.get("type") == "object" and not ({"properties", "additionalProperties"} & schema.keys()
                                               or schema.get("x-kubernetes-preserve-unknown-fields")):
        problems.append(f"{path}: an object without properties")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{path}: an array without items")
    for name, child in schema.get("properties", {}).items():
        _walk(child, f"{path}.{name}", problems)
    if isinstance(schema.get("additionalProperties"), dict):
        _walk(schema["additionalProperties"], f"{path}[*]", problems)
    if "items" in schema:
        _walk(schema["items"], f"{path}[]", problems)


def _all_schemas():
    for group, versions in groups().items():
        for version in versions:
            doc = openapi.document(group, version)
            assert doc is not None
            yield from doc["components"]["schemas"].items()


def test_every_served_kind_and_version_has_a_structural_schema_with_its_kind():
    seen = 0
    for name, schema in _all_schemas():
        problems: list[str] = []
        _walk(schema, name, problems)
        assert problems == []
        gvk = schema["x-kubernetes-group-version-kind"]
        assert len(gvk) == 1 and name.endswith(f".{gvk[0]['version']}.{gvk[0]['kind']}")
        assert schema["description"] and schema["properties"]["metadata"]["properties"]["name"]["type"] == "string"
        seen += 1
    assert seen == sum(len(r.versions) for r in RESOURCES)


def _claim(version: str) -> dict:
    doc = openapi.document("resource.k8s.io", version)
    assert doc is not None
    return doc["components"]["schemas"][f"io.draservice.resource_k8s_io.{version}.ResourceClaim"]


def test_claims_follow_upstreams_list_markers_and_carry_the_queue_status():
    claim = _claim("v1")
    devices = claim["properties"]["spec"]["properties"]["devices"]["properties"]
    assert {k: devices[k]["x-kubernetes-list-type"] for k in devices} == {
        "requests": "atomic", "constraints": "atomic", "config": "atomic"}
    exactly = devices["requests"]["items"]["properties"]["exactly"]
    assert exactly["required"] == ["deviceClassName"]
    assert set(exactly["properties"]) == {"deviceClassName", "selectors", "allocationMode", "count", "tolerations",
                                          "capacity", "adminAccess"}
    assert exactly["properties"]["allocationMode"]["enum"] == ["All", "ExactCount"]
    state = claim["properties"]["status"]["properties"]
    assert (state["reservedFor"]["x-kubernetes-list-type"], state["reservedFor"]["x-kubernetes-list-map-keys"]) \
        == ("map", ["uid"])
    assert state["devices"]["x-kubernetes-list-map-keys"] == ["driver", "device", "pool", "shareID"]
    assert state["positionInQueue"]["type"] == "integer"
    assert state["estimatedStartTime"]["format"] == "date-time"
    assert {"queue", "estimate", "preemption"} <= state.keys()
    flat = _claim("v1beta1")["properties"]["spec"]["properties"]["devices"]["properties"]["requests"]["items"]
    assert "exactly" not in flat["properties"] and "deviceClassName" in flat["properties"]


def _props(kind: str, group: str, version: str, *path: str) -> set[str]:
    node = schemas.definition(kind, group, version)
    for name in path:
        node = node.field(name)
        node = node.items or node
    return {name for name, _ in node.props}


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1", "v1alpha3"])
def test_the_definitions_name_the_fields_the_validators_check(version):
    assert _props("ResourceSlice", "resource.k8s.io", version, "spec") == slices.SLICE_SPEC_FIELDS
    device = _props("ResourceSlice", "resource.k8s.io", version, "spec", "devices")
    if version in ("v1", "v1beta2"):
        assert device == slices.DEVICE_FIELDS
    else:
        assert device == {"name", "basic"}
        assert _props("ResourceSlice", "resource.k8s.io", version, "spec", "devices", "basic") == slices.BASIC_FIELDS
    if version in ("v1beta1", "v1alpha3"):
        request = _props("ResourceClaim", "resource.k8s.io", version, "spec", "devices", "requests")
        assert set(k8s_claims.V1BETA1_EXACT_FIELDS) < request
    assert _props("Queue", "draservice.io", "v1alpha1", "spec") == set(queue_spec.SPEC_FIELDS)
    assert _props("Queue", "draservice.io", "v1alpha1", "spec", "preemption") == set(queue_spec.PREEMPTION_FIELDS)
    assert _props("Queue", "draservice.io", "v1alpha1", "spec", "quotas") == \
        {"deviceClassName", "clusterSelector", *queue_spec.UNITS}
    assert _props("Gang", "draservice.io", "v1alpha1", "spec") == gang_spec._SPEC_FIELDS
    assert _props("Reservation", "draservice.io", "v1alpha1", "spec") == set(reservation_spec.SPEC_FIELDS)
    assert _props("Reservation", "draservice.io", "v1alpha1", "spec", "resources") == \
        set(reservation_spec.RESOURCE_FIELDS)
    assert _props("Reservation", "draservice.io", "v1alpha1", "spec", "window") == set(windows.WINDOW_FIELDS)


def test_field_validation_uses_the_same_definitions():
    queue = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"},
             "spec": {"nominalQuta": 3, "quotas": [{"deviceClassName": "c", "devics": {"nominal": 1}}]}}
    kept, warnings = fields.validate(queue, "queues", "v1alpha1", "Warn")
    assert warnings == ['unknown field "spec.nominalQuta"', 'unknown field "spec.quotas[0].devics"']
    assert kept["spec"] == {"quotas": [{"deviceClassName": "c"}]}
    assert set(fields.TREES["v1"]) == {"resourceclaims", "resourceclaimtemplates", "deviceclasses"}
    assert set(fields.TREES["v1alpha1"]) == {"consumers", "gangs", "queues", "reservations"}
    assert set(fields.TREES["v1alpha3"]) == {"resourceclaims", "resourceclaimtemplates", "deviceclasses",
                                             "resourcepoolstatusrequests", "devicetaintrules"}
