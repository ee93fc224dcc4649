"""dra.k8s.slices: conversion of v1beta1/v1beta2 to v1 and validation against Kubernetes' limits (no database)."""
import copy

import pytest

from dra.k8s import slices as k8s


def to_v1beta1(obj: dict) -> dict:
    """The v1beta1 form of a v1 slice: per-device fields under ``basic``."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    if "devices" in out["spec"]:
        out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                  for d in out["spec"]["devices"]]
    return out


def errors_of(fn, *args):
    with pytest.raises(k8s.ObjectInvalid) as info:
        fn(*args)
    return info.value.errors


def paths(errors):
    return [p for p, _ in errors]


def gpu_slice(devices=2, **spec_extra):
    spec = {"driver": "gpu.example.com", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [{"name": f"gpu-{i}", "attributes": {"model": {"string": "X"}, "index": {"int": i}},
                         "capacity": {"memory": {"value": "80Gi"}}} for i in range(devices)]}
    spec.update(spec_extra)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s1"}, "spec": spec}


def test_every_fixture_slice_is_valid_v1_and_normalizes_to_itself(real_slices):
    assert len(real_slices) == 16
    for obj in real_slices:
        assert k8s.normalize_resource_slice(obj) == obj, obj["metadata"]["name"]


def test_v1beta1_and_v1beta2_forms_convert_to_the_same_v1(real_slices):
    for obj in real_slices:
        beta2 = {**copy.deepcopy(obj), "apiVersion": "resource.k8s.io/v1beta2"}
        assert k8s.normalize_resource_slice(beta2) == obj
        assert k8s.normalize_resource_slice(to_v1beta1(obj)) == obj


def test_v1beta1_unset_markers_and_bare_capacities():
    v1beta1 = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "net"},
               "spec": {"driver": "dra.net", "pool": {"name": "fabric", "generation": 3, "resourceSliceCount": 1},
                        "nodeName": "", "allNodes": True,
                        "devices": [{"name": "nic0", "basic": {"attributes": {"rdma": {"bool": True}},
                                                               "capacity": {"bandwidth": "100G"}}}]}}
    v1 = k8s.normalize_resource_slice(v1beta1)
    assert v1["apiVersion"] == "resource.k8s.io/v1"
    assert "nodeName" not in v1["spec"] and v1["spec"]["allNodes"] is True
    assert v1["spec"]["devices"] == [{"name": "nic0", "attributes": {"rdma": {"bool": True}},
                                      "capacity": {"bandwidth": {"value": "100G"}}}]


def test_metadata_bookkeeping_is_dropped_and_numbers_become_quantities():
    obj = gpu_slice(1)
    obj["metadata"].update(uid="abc", resourceVersion="42", managedFields=[{}], labels={"a": "b"})
    obj["spec"]["devices"][0]["capacity"]["memory"]["value"] = 8
    out = k8s.normalize_resource_slice(obj)
    assert out["metadata"] == {"name": "s1", "labels": {"a": "b"}}
    assert out["spec"]["devices"][0]["capacity"]["memory"] == {"value": "8"}
    assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == 8  # input untouched by default


@pytest.mark.parametrize("mutate,path,fragment", [
    (lambda s: s["spec"].update(devices=[{"name": f"d{i}"} for i in range(129)]), "spec.devices", "at most 128"),
    (lambda s: s["spec"].update(devices=[{"name": f"d{i}", "taints": [{"key": "k", "effect": "NoSchedule"}]}
                                         for i in range(65)]), "spec.devices", "at most 64"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({f"a{i}": {"int": i} for i in range(31)}),
     "spec.devices[1]", "must not exceed 32"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({"9bad": {"int": 1}}),
     "spec.devices[1].attributes", "C identifier"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({"a/b/c": {"int": 1}}),
     "spec.devices[1].attributes", "more than one slash"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({"v": {"version": "1.2"}}),
     "spec.devices[1].attributes[v].version", "semver"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({"s": {"string": "x" * 65}}),
     "spec.devices[1].attributes[s].string", "64"),
    (lambda s: s["spec"]["devices"][1]["attributes"].update({"two": {"string": "x", "int": 1}}),
     "spec.devices[1].attributes[two]", "exactly one value"),
    (lambda s: s["spec"]["devices"][1].update(name="GPU_1"), "spec.devices[1].name", "RFC 1123 label"),
    (lambda s: s["spec"]["devices"][1].update(name="gpu-0"), "spec.devices[1]", "Duplicate"),
    (lambda s: s["spec"].update(allNodes=True), "spec", "multiple fields are set"),
    (lambda s: s["spec"].pop("nodeName"), "spec", "exactly one of `nodeName`"),
    (lambda s: s["spec"].update(nodeName=""), "spec.nodeName", "non-empty"),
    (lambda s: s["spec"].update(sharedCounters=[{"name": "cs", "counters": {"c": {"value": "1"}}}]), "spec",
     "only one of `sharedCounters` or `devices`"),
    (lambda s: s["spec"]["pool"].update(resourceSliceCount=0), "spec.pool.resourceSliceCount", "greater than zero"),
    (lambda s: s["spec"]["pool"].update(name="Bad_Pool"), "spec.pool.name", "subdomain"),
    (lambda s: s["spec"].update(driver="-x-"), "spec.driver", "subdomain"),
    (lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(value="lots"),
     "spec.devices[0].capacity[memory].value", "quantity"),
    (lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(requestPolicy={"default": "1Gi"}),
     "spec.devices[0].capacity[memory].requestPolicy", "allowMultipleAllocations"),
    (lambda s: s["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "PreferNoSchedule"}]),
     "spec.devices[0].taints[0].effect", "Unsupported"),
    (lambda s: s["spec"]["devices"][0].update(bindingConditions=["ready"]),
     "spec.devices[0].bindingFailureConditions", "required"),
    (lambda s: s["spec"]["devices"][0].update(nodeName="n"), "spec.devices[0]", "perDeviceNodeSelection"),
    (lambda s: s["spec"]["devices"][0].update(
        consumesCounters=[{"counterSet": "a", "counters": {"x": {"value": "1"}}}] * 3),
     "spec.devices[0].consumesCounters", "at most 2"),
    (lambda s: s["spec"].update(colour="blue"), "spec.colour", "unknown field"),
    (lambda s: s["metadata"].update(name="Not A Name"), "metadata.name", "subdomain"),
    (lambda s: s.update(apiVersion="resource.k8s.io/v2"), "apiVersion", "Unsupported"),
])
def test_invalid_slices_are_rejected_with_field_paths(mutate, path, fragment):
    obj = gpu_slice(2)
    mutate(obj)
    errors = errors_of(k8s.normalize_resource_slice, obj)
    assert any(p == path and fragment in reason for p, reason in errors), errors


def test_upstream_limits_are_inclusive():
    k8s.normalize_resource_slice(gpu_slice(128))
    taints = gpu_slice(64)
    for device in taints["spec"]["devices"]:
        device["taints"] = [{"key": "example.com/broken", "value": "yes", "effect": "NoExecute"}]
    k8s.normalize_resource_slice(taints)
    wide = gpu_slice(1)
    wide["spec"]["devices"][0]["attributes"] = {f"a{i}": {"int": i} for i in range(31)}
    k8s.normalize_resource_slice(wide)  # 31 attributes + 1 capacity = 32


def test_per_device_node_selection():
    obj = gpu_slice(2, perDeviceNodeSelection=True)
    del obj["spec"]["nodeName"]
    obj["spec"]["devices"][0]["nodeName"] = "node-a"
    obj["spec"]["devices"][1]["allNodes"] = True
    assert k8s.normalize_resource_slice(obj)["spec"]["perDeviceNodeSelection"] is True
    del obj["spec"]["devices"][1]["allNodes"]
    errors = errors_of(k8s.normalize_resource_slice, obj)
    assert ("spec.devices[1]" in paths(errors))


def test_node_selector_needs_exactly_one_term():
    obj = gpu_slice(1, nodeSelector={"nodeSelectorTerms": []})
    del obj["spec"]["nodeName"]
    assert "spec.nodeSelector.nodeSelectorTerms" in paths(errors_of(k8s.normalize_resource_slice, obj))
    obj["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}
    assert k8s.normalize_resource_slice(obj)["spec"]["nodeSelector"] == obj["spec"]["nodeSelector"]


def test_garbage_never_raises_anything_but_object_invalid():
    for garbage in (None, 3, "x", [], {"spec": []}, {"metadata": {"name": "a"}, "spec": {"devices": "no"}},
                    {"metadata": {"name": "a"}, "spec": {"devices": [None, 1, {"attributes": []}]}},
                    {"metadata": {"name": "a"}, "spec": {"pool": "x", "driver": 5}}):
        with pytest.raises(k8s.ObjectInvalid):
            k8s.normalize_resource_slice(garbage)


def test_device_class_validation_and_cel_hook():
    cls = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
                    "config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"sharing": "none"}}}],
                    "extendedResourceName": "example.com/gpu"}}
    assert k8s.normalize_device_class(cls)["apiVersion"] == "resource.k8s.io/v1"

    def refuse(expression):
        raise ValueError("no such field")

    errors = errors_of(k8s.normalize_device_class, cls, refuse)
    assert errors == [("spec.selectors[0].cel.expression", "Invalid value: no such field")]
    bad = copy.deepcopy(cls)
    bad["spec"]["selectors"] = [{"cel": {"expression": ""}}] + [{"cel": {"expression": "true"}}] * 2
    bad["spec"]["config"][0]["opaque"]["parameters"] = "not-an-object"
    bad["spec"]["extendedResourceName"] = "kubernetes.io/gpu"
    assert set(paths(errors_of(k8s.normalize_device_class, bad))) == {
        "spec.selectors[0].cel.expression", "spec.config[0].opaque.parameters", "spec.extendedResourceName"}
    too_many = copy.deepcopy(cls)
    too_many["spec"]["selectors"] = [{"cel": {"expression": "true"}}] * 33
    assert paths(errors_of(k8s.normalize_device_class, too_many)) == ["spec.selectors"]


def test_device_taint_rule_versions_and_removed_fields():
    rule = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "maint"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"},
                     "taint": {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}}}
    out = k8s.normalize_device_taint_rule(rule)
    assert out["apiVersion"] == "resource.k8s.io/v1" and out["spec"] == rule["spec"]
    assert k8s.taint_rule_matches(out["spec"], "gpu.nvidia.com", "node-1", "gpu-0")
    assert not k8s.taint_rule_matches(out["spec"], "gpu.nvidia.com", "node-1", "gpu-1")
    old = copy.deepcopy(rule)
    old["spec"]["deviceSelector"]["deviceClassName"] = "gpu.nvidia.com"
    old["spec"]["taint"]["effect"] = "Sometimes"
    assert set(paths(errors_of(k8s.normalize_device_taint_rule, old))) == {
        "spec.deviceSelector.deviceClassName", "spec.taint.effect"}
