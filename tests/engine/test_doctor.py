"""The manifest doctor's pure part (``dra.k8s.doctor``, ``dra.k8s.doctor_cel``): each rewrite rule, that what it
writes compiles with ``dra.cel`` and selects what the article meant on the real slices, and each article fixture's
expected outcome."""
from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from dra.cel import CELDevice, CELRuntimeError, compile_selector
from dra.k8s import slices as k8s_slices
from dra.k8s.claims import normalize_claim
from dra.k8s.doctor import diagnose, diagnose_body, objects_in
from dra.k8s.doctor_cel import (
    FleetVocabulary,
    PublishedName,
    WorkBudget,
    _quote_bare_quantities,
    _string_spans,
    fix_selector,
)

ROOT = Path(__file__).resolve().parents[2]
REAL_SLICES = json.loads((ROOT.parent / "shared" / "fixtures" / "real-slices.json").read_text())
ARTICLES = ROOT / "tests" / "fixtures" / "articles"
NVIDIA_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
FLEET = FleetVocabulary.from_slices(REAL_SLICES, [NVIDIA_CLASS])
DEVICES = [CELDevice(driver=s["spec"]["driver"], attributes=d.get("attributes") or {},
                     capacity=d.get("capacity") or {})
           for s in REAL_SLICES for d in s["spec"].get("devices") or []]


def selected(expression: str) -> list[int]:
    compiled = compile_selector(expression)
    out = []
    for i, device in enumerate(DEVICES):
        try:
            if compiled.evaluate(device):
                out.append(i)
        except CELRuntimeError:
            pass  # as the allocator: a device the expression cannot read is not selected
    return out


def articles() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted(ARTICLES.glob("*.yaml")):
        text = path.read_text()
        expect = re.search(r"^# expect: (\w+)", text, re.M)
        assert expect and text.startswith("# Style:"), f"{path.name}: needs a '# Style:' header and '# expect:'"
        out += [(path.name, expect.group(1), doc) for doc in yaml.safe_load_all(text)]
    return out


# --------------------------------------------------------------------------------------------- vocabulary

def test_vocabulary_qualifies_names_as_a_resource_slice_does():
    assert PublishedName("capacity", "gpu.nvidia.com", "gpu.nvidia.com", "memory", "quantity") in FLEET.names
    assert PublishedName("attributes", "gpu.nvidia.com", "resource.kubernetes.io", "pcieRoot", "string") in FLEET.names
    assert FLEET.type_of("attributes", "gpu.nvidia.com", "driverVersion") == "version"
    assert {n.domain for n in FLEET.lookup("memory")} == {"gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com",
                                                          "gpu.example.com"}
    assert FLEET.class_drivers == {"gpu.nvidia.com": frozenset({"gpu.nvidia.com"})}


# --------------------------------------------------------------------------------------------- CEL rules

@pytest.mark.parametrize("written, drivers, want", [
    # an attribute without a domain, placed by the selector's own driver clause
    ('device.driver == "gpu.nvidia.com" && device.attributes["productName"] == "NVIDIA H100 80GB HBM3"', (),
     'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'),
    # ... or by the DeviceClass the request names
    ('device.attributes["productName"] == "NVIDIA H100 80GB HBM3"', ("gpu.nvidia.com",),
     'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'),
    # a quantity read as an attribute with a getter: the fleet publishes it as a capacity
    ('device.driver == "gpu.nvidia.com" && device.attributes["memory"].quantity() >= quantity("40Gi")', (),
     'device.driver == "gpu.nvidia.com" && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'),
    # a capacity without a domain compared with a string
    ('device.capacity["memory"] > "40Gi"', ("gpu.nvidia.com",),
     'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) > 0'),
    # "domain/name" in the index
    ('device.attributes["gpu.nvidia.com/productName"].string() == "x"', (),
     'device.attributes["gpu.nvidia.com"].productName == "x"'),
    # a getter on a v1 value; ordering on the left and on the right; a number; equality with a literal
    ("device.capacity['gpu.intel.com'].memory.quantity() <= quantity('16Gi')", (),
     "device.capacity['gpu.intel.com'].memory.compareTo(quantity('16Gi')) <= 0"),
    ('quantity("40Gi") < device.capacity["gpu.nvidia.com"].memory', (),
     'quantity("40Gi").compareTo(device.capacity["gpu.nvidia.com"].memory) < 0'),
    ('device.capacity["gpu.intel.com"].millicores >= 1000', (),
     'device.capacity["gpu.intel.com"].millicores.compareTo(quantity("1000")) >= 0'),
    ('device.capacity["gpu.nvidia.com"].memory == "81559Mi"', (),
     'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("81559Mi")) == 0'),
    # a method of the value, not of the domain map
    ('device.driver == "gpu.nvidia.com" && device.attributes["productName"].startsWith("NVIDIA H100")', (),
     'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")'),
    ('device.attributes["memory"].isGreaterThan(quantity("1Gi"))', ("gpu.nvidia.com",),
     'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("1Gi"))'),
    # a v1 path to the wrong map (compiles, selects nothing)
    ('device.attributes["gpu.nvidia.com"].memory >= quantity("40Gi")', (),
     'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'),
    # has() wants a field selection
    ('has(device.attributes["productName"])', ("gpu.nvidia.com",),
     'has(device.attributes["gpu.nvidia.com"].productName)'),
    # versions the fleet publishes as versions
    ('device.attributes["cudaComputeCapability"] >= "8.0.0"', (),
     'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0'),
])
def test_rewrite_rules_compile(written, drivers, want):
    fixed = fix_selector(written, FLEET, drivers)
    assert fixed.expression == want
    assert fixed.error is None and fixed.reasons and not fixed.unresolved
    compile_selector(fixed.expression)


@pytest.mark.parametrize("expression", [
    'device.attributes["gpu.nvidia.com"].productName == "x"',
    'device.attributes["gpu.nvidia.com"].exists(k, k == "uuid")',  # a macro over a domain map
    'device.attributes["gpu.nvidia.com"].size() > 3',
    'device.capacity["gpu.nvidia.com"].memory == quantity("80Gi")',  # == between quantities is defined
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
])
def test_v1_selectors_are_left_alone(expression):
    fixed = fix_selector(expression, FLEET)
    assert not fixed.changed and fixed.error is None


def test_ambiguous_name_lists_candidates_and_stays():
    fixed = fix_selector('device.attributes["memory"].quantity() >= quantity("40Gi")', FLEET)
    assert not fixed.changed and fixed.error
    assert len(fixed.unresolved) == 1
    for domain in ("gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com", "gpu.example.com"):
        assert f'device.capacity["{domain}"].memory' in fixed.unresolved[0]


def test_without_a_fleet_the_driver_clause_names_the_domain():
    fixed = fix_selector('device.driver == "gpu.nvidia.com" && device.attributes["memory"].quantity() >= '
                         'quantity("40Gi")', None)
    assert 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0' in fixed.expression
    assert fixed.error is None
    unplaced = fix_selector('device.attributes["productName"] == "x"', None)
    assert not unplaced.changed and "names no driver" in unplaced.unresolved[0]


def test_syntax_error_is_reported_not_rewritten():
    fixed = fix_selector('device.attributes["memory" >=', FLEET)
    assert not fixed.changed and fixed.error


@pytest.mark.parametrize("article, meant", [
    ('device.driver == "gpu.nvidia.com" && device.attributes["memory"].quantity() >= quantity("40Gi")',
     'device.driver == "gpu.nvidia.com" && device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))'),
    ('device.driver == "gpu.nvidia.com" && device.attributes["memory"].quantity() < quantity("40Gi")',
     'device.driver == "gpu.nvidia.com" && device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("40Gi"))'),
    ('device.driver == "gpu.amd.com" && device.attributes["productName"].string() == "AMD_Instinct_MI300X_OAM"',
     'device.driver == "gpu.amd.com" && device.attributes["gpu.amd.com"].productName == "AMD_Instinct_MI300X_OAM"'),
    ('device.driver == "gpu.intel.com" && device.capacity["memory"] >= "1Gi"',
     'device.driver == "gpu.intel.com" && !device.capacity["gpu.intel.com"].memory.isLessThan(quantity("1Gi"))'),
    ('device.attributes["cudaComputeCapability"] >= "9.0.0"',
     'device.driver == "gpu.nvidia.com" && has(device.attributes["gpu.nvidia.com"].cudaComputeCapability) && '
     '!device.attributes["gpu.nvidia.com"].cudaComputeCapability.isLessThan(semver("9.0.0"))'),
])
def test_rewrites_select_what_the_article_meant_on_real_slices(article, meant):
    fixed = fix_selector(article, FLEET)
    assert fixed.error is None, fixed
    want = selected(meant)
    assert want, "the hand-written v1 selector must select some real device"
    assert selected(fixed.expression) == want


# --------------------------------------------------------------------------------------------- objects

def claim(api_version: str, request: dict, **spec) -> dict:
    return {"apiVersion": api_version, "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [request]}, **spec}}


def test_valid_v1_has_no_rewrite_and_no_changes():
    d = diagnose(claim("resource.k8s.io/v1", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}), FLEET)
    assert (d.outcome, d.rewrite, d.changes) == ("valid", None, [])


def test_v1_in_v1beta1_shape_moves_fields_under_exactly():
    request = {"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 2, "adminAccess": False,
               "allocationMode": "ExactCount"}
    d = diagnose(claim("resource.k8s.io/v1", request), FLEET)
    assert d.outcome == "rewrite"
    assert d.rewrite["spec"]["devices"]["requests"] == [{"name": "g", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 2, "adminAccess": False, "allocationMode": "ExactCount"}}]
    assert [c["field"] for c in d.changes] == ["spec.devices.requests[0]"]
    assert d.changes[0]["was"] == request and "exactly" in d.changes[0]["why"]


def test_first_available_is_left_alone_but_its_selectors_are_fixed():
    request = {"name": "g", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com",
         "selectors": [{"cel": {"expression": 'device.capacity["memory"] >= quantity("80Gi")'}}]},
        {"name": "any", "deviceClassName": "gpu.nvidia.com"}]}
    d = diagnose(claim("resource.k8s.io/v1", request), FLEET)
    assert d.outcome == "rewrite"
    first = d.rewrite["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert first[0]["selectors"][0]["cel"]["expression"] == \
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0'
    assert first[1] == request["firstAvailable"][1]
    assert [c["field"] for c in d.changes] == \
        ["spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression"]


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha3"])
def test_older_claims_convert_with_the_claims_converter(version):
    d = diagnose(claim(f"resource.k8s.io/{version}", {"name": "g", "deviceClassName": "gpu.nvidia.com"},
                       **({"controller": "gpu.nvidia.com"} if version == "v1alpha3" else {})), FLEET)
    assert d.outcome == "rewrite" and d.rewrite["apiVersion"] == "resource.k8s.io/v1"
    assert d.rewrite["spec"] == {"devices": {"requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.nvidia.com"}}]}}
    fields = [c["field"] for c in d.changes]
    assert fields[0] == "apiVersion" and "spec.devices.requests[0]" in fields
    assert ("spec.controller" in fields) == (version == "v1alpha3")


def test_v1beta2_changes_only_the_api_version():
    d = diagnose(claim("resource.k8s.io/v1beta2", {"name": "g", "exactly": {"deviceClassName": "x"}}), FLEET)
    assert d.outcome == "rewrite" and [c["field"] for c in d.changes] == ["apiVersion"]


def test_v1alpha3_device_class_drops_suitable_nodes():
    obj = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceClass", "metadata": {"name": "x"},
           "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
                    "suitableNodes": {"nodeSelectorTerms": []}}}
    d = diagnose(obj, FLEET)
    assert d.outcome == "rewrite" and "suitableNodes" not in d.rewrite["spec"]
    assert k8s_slices.normalize_device_class(d.rewrite, compile_selector)


def test_unresolvable_selector_gives_no_rewrite_but_says_why():
    obj = claim("resource.k8s.io/v1beta1", {"name": "g", "deviceClassName": "unknown-class", "selectors": [
        {"cel": {"expression": 'device.attributes["memory"].quantity() >= quantity("40Gi")'}}]})
    d = diagnose(obj, FLEET)
    assert d.outcome == "unfixable" and d.rewrite is None
    assert d.remaining and "several domains" in d.explanation
    assert [c["field"] for c in d.changes][:2] == ["apiVersion", "spec.devices.requests[0]"]


def test_classic_resource_class_gets_a_device_class_skeleton():
    obj = {"apiVersion": "resource.k8s.io/v1alpha2", "kind": "ResourceClass", "metadata": {"name": "gpu"},
           "driverName": "gpu.resource.nvidia.com",
           "parametersRef": {"apiGroup": "gpu.resource.nvidia.com", "kind": "DeviceClassParameters", "name": "p"}}
    d = diagnose(obj, FLEET)
    assert d.outcome == "skeleton" and d.rewrite is None and d.explanation
    sk = d.skeleton
    assert sk["kind"] == "DeviceClass" and sk["metadata"] == {"name": "gpu"}
    assert sk["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.resource.nvidia.com"'}}]
    assert sk["spec"]["config"][0]["opaque"]["driver"] == "gpu.resource.nvidia.com"
    assert "TODO" in sk["spec"]["config"][0]["opaque"]["parameters"]
    k8s_slices.normalize_device_class(sk, compile_selector)  # a starting point that is already valid v1


def test_classic_template_gets_a_template_skeleton_and_other_classic_kinds_an_explanation():
    template = {"apiVersion": "resource.k8s.io/v1alpha2", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": {"resourceClassName": "gpu.nvidia.com",
                                  "parametersRef": {"kind": "GpuClaimParameters", "name": "p"}}}}
    d = diagnose(template, FLEET)
    assert d.outcome == "skeleton" and d.skeleton["kind"] == "ResourceClaimTemplate"
    inner = d.skeleton["spec"]["spec"]["devices"]
    assert inner["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert inner["config"][0]["opaque"]["driver"] == "gpu.nvidia.com"  # the class's driver, from the fleet
    params = diagnose({"apiVersion": "resource.k8s.io/v1alpha2", "kind": "ResourceClaimParameters",
                       "metadata": {"name": "p"}}, FLEET)
    assert params.outcome == "unfixable" and "no v1 counterpart" in params.explanation
    slice_ = diagnose({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {}}, FLEET)
    assert slice_.outcome == "unfixable" and "not ResourceSlices" in slice_.explanation


def test_not_a_dra_object():
    assert diagnose({"apiVersion": "v1", "kind": "Pod"}, FLEET).outcome == "unfixable"
    assert diagnose("text", FLEET).outcome == "unfixable"
    assert objects_in({"spec": {}}) is None and diagnose_body(42, FLEET) is None
    assert len(objects_in({"kind": "List", "items": [{}, {}]})) == 2
    assert len(objects_in({"items": [{}]})) == 1 and objects_in({"kind": "Pod", "items": []}) is None


@pytest.mark.parametrize("name, expect, obj", articles(), ids=lambda v: v if isinstance(v, str) else "")
def test_article_fixtures(name, expect, obj):
    d = diagnose(obj, FLEET)
    assert d.outcome == {"placed": "valid"}.get(expect, expect), d.explanation
    assert d.explanation
    if expect == "rewrite":
        assert d.rewrite["apiVersion"] == "resource.k8s.io/v1" and d.changes
        for change in d.changes:
            if change["field"].endswith("cel.expression"):
                compile_selector(change["now"])
    elif expect == "skeleton":
        assert d.skeleton["apiVersion"] == "resource.k8s.io/v1" and d.rewrite is None
    else:
        assert d.rewrite is None and d.changes == []


# --------------------------------------------------------------------------------------------- hostile input

def test_parsing_budget_bounds_the_work_of_one_request():
    selector = {"cel": {"expression": " && ".join(['device.capacity["memory"] >= "1Gi"'] * 50)}}
    request = {"name": "g", "deviceClassName": "gpu.nvidia.com",
               "selectors": [copy.deepcopy(selector) for _ in range(8)]}
    obj = claim("resource.k8s.io/v1beta1", request)
    budget = WorkBudget(8 * 1024)
    d = diagnose(obj, FLEET, budget)
    assert budget.left == 0 and d.outcome == "unfixable"
    assert any("budget" in c["why"] for c in d.changes)


def _paths(obj, path=()):
    yield path
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in children:
        yield from _paths(value, path + (key,))


@pytest.mark.parametrize("seed", range(4))
def test_wrong_shapes_anywhere_never_raise(seed):
    """Any value of the wrong type at any place of an article's objects (and of the versions the doctor knows)
    gets a diagnosis, never an exception."""
    rng = random.Random(seed)
    junk = [None, 0, 1, True, "", "x", "device.attributes[", [], {}, [1], {"a": 1}, [None], 1.5,
            {"cel": 3}, [{"cel": {"expression": 5}}], 'device.attributes["memory"] >= "1Gi"']
    docs = [doc for _, _, doc in articles()]
    for _ in range(300):
        obj = copy.deepcopy(rng.choice(docs))
        obj["apiVersion"] = rng.choice(["resource.k8s.io/v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2",
                                        "resource.k8s.io/v1alpha3", "resource.k8s.io/v1alpha2"])
        for _ in range(rng.randint(1, 3)):
            path = rng.choice([p for p in _paths(obj) if p])
            parent = obj
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = copy.deepcopy(rng.choice(junk))
        json.dumps(diagnose(obj, FLEET).as_dict())


def test_claim_defaulting_survives_wrong_shapes():
    for spec in ({"devices": {"requests": 1}}, {"devices": {"requests": [{"name": "a", "firstAvailable": 1}]}},
                 {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "x", "tolerations": 1}}]}}):
        _, errors = normalize_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                     "metadata": {"name": "x"}, "spec": spec})
        assert errors and all("must be a list" in reason for _, reason in errors)


# --------------------------------------------------------------------------------------------- bare quantities

def test_bare_quantities_are_quoted_outside_strings_only():
    written = ('device.capacity["memory"] >= 40Gi && device.attributes["gpu.nvidia.com"].productName != "80Gi" '
               "&& 1.5Ti > device.capacity['gpu.nvidia.com'].memory && device.attributes['gpu.nvidia.com'].x != 1e3")
    fixed = fix_selector(written, FLEET, ["gpu.nvidia.com"])
    assert fixed.error is None, fixed
    assert fixed.expression == (
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 && '
        'device.attributes["gpu.nvidia.com"].productName != "80Gi" && '
        "quantity(\"1.5Ti\").compareTo(device.capacity['gpu.nvidia.com'].memory) > 0 && "
        "device.attributes['gpu.nvidia.com'].x != 1e3")
    assert fixed.reasons[0].startswith("40Gi, 1.5Ti: a quantity is not a CEL literal")


def test_string_spans_know_escapes_and_triple_quotes():
    text = r'''a "b\"40Gi" '40Gi' """x"40Gi""" 40Gi'''
    spans = _string_spans(text)
    assert [text[s:e] for s, e in spans] == [r'"b\"40Gi"', "'40Gi'", '"""x"40Gi"""']
    quoted, found = _quote_bare_quantities(text)
    assert found == ["40Gi"] and quoted.endswith('quantity("40Gi")')


def test_a_syntax_error_quoting_does_not_cure_is_left_alone():
    fixed = fix_selector("device.capacity[ >= 40Gi", FLEET)
    assert not fixed.changed and fixed.error


def test_vocabulary_from_v1beta1_slices():
    beta = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "spec": {
        "driver": "gpu.example.com", "devices": [{"name": "d0", "basic": {
            "attributes": {"model": {"string": "LATEST-GPU-MODEL"}}, "capacity": {"memory": {"value": "80Gi"}}}}]}}
    vocabulary = FleetVocabulary.from_slices([beta])
    assert vocabulary.type_of("attributes", "gpu.example.com", "model") == "string"
    assert vocabulary.has("capacity", "gpu.example.com", "memory")
