"""ResourceClaim conversion, defaulting and validation (``dra.k8s.claims``), as the API server does it."""
from __future__ import annotations

import copy

import pytest

from dra.k8s.claims import ClaimConversionError, convert_claim_to_v1, default_claim, normalize_claim, validate_claim


def v1(requests, constraints=None, config=None, name="c"):
    devices = {"requests": requests}
    if constraints is not None:
        devices["constraints"] = constraints
    if config is not None:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def exact(name="r", **fields):
    return {"name": name, "exactly": dict({"deviceClassName": "gpu"}, **fields)}


def errors_of(claim):
    claim, errors = normalize_claim(claim)
    return dict(errors)


def test_defaults_exact_count_one_and_equal_operator_without_touching_input():
    claim = v1([exact(tolerations=[{"key": "k", "value": "v"}]),
                {"name": "fa", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"},
                                                  {"name": "b", "deviceClassName": "gpu", "allocationMode": "All"}]}])
    before = copy.deepcopy(claim)
    out = default_claim(claim)
    assert claim == before
    assert out["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"
    assert out["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    assert out["spec"]["devices"]["requests"][0]["exactly"]["tolerations"][0]["operator"] == "Equal"
    subs = out["spec"]["devices"]["requests"][1]["firstAvailable"]
    assert (subs[0]["allocationMode"], subs[0]["count"]) == ("ExactCount", 1)
    assert subs[1]["allocationMode"] == "All" and "count" not in subs[1]


def test_v1beta1_requests_move_under_exactly():
    beta = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [
                {"name": "r", "deviceClassName": "gpu", "count": 2, "adminAccess": True,
                 "selectors": [{"cel": {"expression": "true"}}]},
                {"name": "f", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}]}}}
    out = convert_claim_to_v1(beta)
    assert out["apiVersion"] == "resource.k8s.io/v1"
    assert out["spec"]["devices"]["requests"][0] == {
        "name": "r", "exactly": {"deviceClassName": "gpu", "count": 2, "adminAccess": True,
                                 "selectors": [{"cel": {"expression": "true"}}]}}
    assert out["spec"]["devices"]["requests"][1] == {"name": "f",
                                                     "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"


def test_v1beta2_has_the_v1_shape_and_unknown_versions_are_rejected():
    claim = v1([exact()])
    claim["apiVersion"] = "resource.k8s.io/v1beta2"
    assert convert_claim_to_v1(claim)["spec"] == claim["spec"]
    claim["apiVersion"] = "resource.k8s.io/v2"
    with pytest.raises(ClaimConversionError) as exc:
        convert_claim_to_v1(claim)
    assert exc.value.errors[0][0] == "apiVersion"


def test_a_valid_claim_has_no_errors():
    claim = v1([exact("a", count=2, selectors=[{"cel": {"expression": 'device.driver == "x"'}}]),
                {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": "gpu", "count": 2},
                                                 {"name": "small", "deviceClassName": "gpu"}]}],
               constraints=[{"requests": ["a", "b/big"], "matchAttribute": "x.example.com/numa"}],
               config=[{"requests": ["a"], "opaque": {"driver": "x.example.com", "parameters": {"k": "v"}}}])
    assert normalize_claim(claim)[1] == []


def test_limits_with_upstream_wording_and_field_paths():
    many = v1([exact(f"r{i}") for i in range(33)])
    assert errors_of(many)["spec.devices.requests"] == "Too many: 33: must have at most 32 items"
    subs = v1([{"name": "r", "firstAvailable": [{"name": f"s{i}", "deviceClassName": "gpu"} for i in range(9)]}])
    assert errors_of(subs)["spec.devices.requests[0].firstAvailable"] == "Too many: 9: must have at most 8 items"
    tols = v1([exact(tolerations=[{"operator": "Exists"}] * 17)])
    assert errors_of(tols)["spec.devices.requests[0].exactly.tolerations"] == \
        "Too many: 17: must have at most 16 items"
    cons = v1([exact()], constraints=[{"matchAttribute": "x.example.com/a"}] * 33)
    assert errors_of(cons)["spec.devices.constraints"] == "Too many: 33: must have at most 32 items"


def test_field_errors():
    # (count: 0 is "unset" to the API server and defaults to 1, as in Go; a negative count is an error.)
    errs = errors_of(v1([exact(count=-1), exact("r"), {"name": "Bad_Name", "exactly": {}},
                         {"name": "neither"}, exact("all", allocationMode="All", count=3),
                         exact("mode", allocationMode="Some")]))
    assert errs["spec.devices.requests[0].exactly.count"] == "Invalid value: -1: must be greater than zero"
    assert errs["spec.devices.requests[1].name"] == 'Duplicate value: "r"'
    assert errs["spec.devices.requests[2].name"].startswith('Invalid value: "Bad_Name": a lowercase RFC 1123 label')
    assert errs["spec.devices.requests[2].exactly.deviceClassName"] == "Required value"
    assert errs["spec.devices.requests[3]"].startswith("Required value: exactly one of")
    assert errs["spec.devices.requests[4].exactly.count"].endswith("must not be specified when allocationMode is 'All'")
    assert errs["spec.devices.requests[5].exactly.allocationMode"] == \
        'Unsupported value: "Some": supported values: "All", "ExactCount"'


def test_cel_capacity_constraint_and_config_references():
    errs = errors_of(v1([exact(selectors=[{"cel": {"expression": "device.nope =="}}],
                               capacity={"requests": {"memory": "lots"}})],
                        constraints=[{"requests": ["missing"], "matchAttribute": "numa"}],
                        config=[{"requests": ["r/sub"], "opaque": {"driver": "x.example.com", "parameters": []}}]))
    assert errs["spec.devices.requests[0].exactly.selectors[0].cel.expression"].startswith(
        'Invalid value: "device.nope ==": compilation failed')
    assert errs["spec.devices.requests[0].exactly.capacity.requests[memory]"].startswith('Invalid value: "lots"')
    assert errs["spec.devices.constraints[0].requests[0]"].startswith('Invalid value: "missing"')
    assert errs["spec.devices.constraints[0].matchAttribute"] == 'Invalid value: "numa": must include a domain'
    assert errs["spec.devices.config[0].requests[0]"].startswith('Invalid value: "r/sub"')
    assert errs["spec.devices.config[0].opaque.parameters"].endswith("parameters must be a valid JSON object")


def test_admin_access_only_on_exact_requests_and_toleration_rules():
    claim = v1([{"name": "r", "firstAvailable": [{"name": "s", "deviceClassName": "gpu", "adminAccess": True,
                                                  "tolerations": [{"operator": "Equal", "value": "x"},
                                                                  {"key": "k", "operator": "Exists",
                                                                   "value": "v"}]}]}])
    errs = validate_claim(default_claim(claim))
    paths = dict(errs)
    assert paths["spec.devices.requests[0].firstAvailable[0].adminAccess"] == "Forbidden: not supported for subrequests"
    assert "operator must be Exists when `key` is empty" in \
        paths["spec.devices.requests[0].firstAvailable[0].tolerations[0].operator"]
    assert [p for p, _ in errs].count("spec.devices.requests[0].firstAvailable[0].tolerations[1].operator") == 1


# --- what can be known at creation: limits the allocator would only hit later, and CEL cost -----------------

@pytest.mark.parametrize("count", [33, 64, 1_000_000_000, 2**70])
def test_a_request_over_the_claim_limit_is_refused_at_creation(count):
    errs = errors_of(v1([exact(count=count)]))
    assert errs == {"spec.devices.requests[0].exactly.count":
                    f"Invalid value: {count}: {count} exceeds the claim limit of 32"}
    assert errors_of(v1([exact(count=32)])) == {}


def test_requests_that_together_exceed_the_claim_limit_are_refused():
    errs = errors_of(v1([exact("a", count=20), exact("b", count=13)]))
    assert errs == {"spec.devices.requests": "Invalid value: 33: the requests need at least 33 devices in total, "
                                             "which exceeds the claim limit of 32"}
    # firstAvailable needs only its smallest alternative; All depends on the pool and is not counted here.
    ok = v1([exact("a", count=20), {"name": "f", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu", "count": 64}, {"name": "small", "deviceClassName": "gpu",
                                                                 "count": 12}]}, exact("all", allocationMode="All")])
    assert errors_of(ok) == {}
    none_fit = v1([{"name": "f", "firstAvailable": [{"name": "x", "deviceClassName": "gpu", "count": 40},
                                                    {"name": "y", "deviceClassName": "gpu", "count": 33}]}])
    assert errors_of(none_fit) == {"spec.devices.requests[0].firstAvailable[1].count":
                                   "Invalid value: 33: 33 exceeds the claim limit of 32"}


def test_simulation_leaves_the_claim_limit_to_the_allocator():
    claim = v1([exact(count=64)])
    assert normalize_claim(claim, check_cel=False)[1] == []


def test_a_selector_too_expensive_to_store_is_forbidden_with_the_numbers():
    ten = "[" + ",".join(str(i) for i in range(100)) + "]"
    expensive = f"{ten}.all(x, {ten}.all(y, {ten}.all(z, x + y + z >= 0)))"
    claim = v1([exact(selectors=[{"cel": {"expression": 'device.driver == "gpu"'}},
                                 {"cel": {"expression": expensive}}])])
    reason = errors_of(claim)["spec.devices.requests[0].exactly.selectors[1].cel.expression"]
    assert reason.startswith("Forbidden: too complex, exceeds cost limit: estimated rule cost exceeds budget by "
                             "factor of ")
    assert "budget 100,000)" in reason
    # Simulation leaves compile errors to the engine but still refuses what could never be stored.
    claim_errors = normalize_claim(claim, check_cel=False, check_cost=True)[1]
    assert [p for p, _ in claim_errors] == ["spec.devices.requests[0].exactly.selectors[1].cel.expression"]
    broken = v1([exact(selectors=[{"cel": {"expression": "device.driver =="}}])])
    assert normalize_claim(broken, check_cel=False, check_cost=True)[1] == []
