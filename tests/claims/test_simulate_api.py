"""``POST /api/v1/simulate`` over HTTP, with an admin bearer token (DB-backed)."""
from __future__ import annotations

import copy
import json

import pytest
from rest_framework.test import APIClient

from dra.k8s import claims as k8s_claims
from dra.k8s import slices as k8s_slices
from draservice.models import APIToken
from draservice.tokens import issue_token
from tests.engine.test_conformance import ALLOCATOR_CASES, XFAIL, _canon_allocation

URL = "/api/v1/simulate"


@pytest.fixture(scope="session")
def cases(allocator_cases):
    return {c["name"]: c for c in allocator_cases}


@pytest.fixture
def client(db):
    _, secret = issue_token(kind=APIToken.ADMIN, name="simulate test")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return c


def body_of(case: dict) -> dict:
    return {k: copy.deepcopy(v) for k, v in case.items() if k not in ("name", "expect")}


def post(client, body):
    return client.post(URL, data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_requires_a_token():
    assert APIClient().post(URL, data="{}", content_type="application/json").status_code == 401


def _api_valid(case: dict) -> bool:
    """Many upstream table cases use names the API server would reject (``subReq-0``, ``capacity-0``): the Go
    unit tests never validate their objects. Only cases that are valid API input can go through HTTP."""
    if not case["claims"]:
        return False
    for claim in case["claims"]:
        if k8s_claims.normalize_claim(claim, check_cel=False)[1]:
            return False
    try:
        for s in case["resourceSlices"]:
            k8s_slices.normalize_resource_slice(s)
        for c in case["deviceClasses"]:
            k8s_slices.normalize_device_class(c, None)
    except k8s_slices.ObjectInvalid:
        return False
    return True


def _through_http(case: dict) -> bool:
    return _api_valid(case) and case["name"] not in XFAIL


def test_most_of_the_table_is_valid_api_input(allocator_cases):
    assert sum(1 for c in allocator_cases if _through_http(c)) >= 100


@pytest.mark.vectors(ALLOCATOR_CASES, select=_through_http)
def test_conformance_case_through_http(client, case):
    """The same expectations as tests/engine/test_conformance.py, through the endpoint."""
    res = post(client, body_of(case))
    expect = case["expect"]
    if expect["error"]:
        assert res.status_code == 422, res.content
        assert expect["error"] in res.json()["detail"]
        return
    assert res.status_code == 200, res.content
    data = res.json()
    if expect["results"] is None:
        assert data["allocated"] is False
        return
    assert data["allocated"] is True
    exact = "gomega.Equal" in (expect.get("note") or "")
    for want, have in zip(expect["results"], [c["allocation"] for c in data["claims"]], strict=False):
        assert _canon_allocation(have, exact) == _canon_allocation(want, exact)


def test_unsatisfiable_answers_200_with_diagnostics(client, cases):
    case = cases["other-node"]
    body = body_of(case)
    body["claims"][0]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    res = post(client, body)
    assert res.status_code == 200
    data = res.json()
    assert data["allocated"] is False and data["reason"] == "unsatisfiable"
    assert data["claims"] == [{"name": "claim-0", "namespace": "", "allocation": None}]
    assert data["diagnostics"]["requests"][0]["request"] == "req-0"


@pytest.mark.parametrize("name,fragment", [
    ("unknown-class", "could not retrieve device class unknown-class"),
    ("invalid-CEL-one-device", "undeclared reference"),
    ("too-many-devices-single-request", "exceeds the claim limit"),
    ("all-devices-of-the-incomplete-pool", "asks for all devices, but resource pool driver-a/pool-1 is currently "
                                           "being updated"),
])
def test_input_errors_are_422_problems_with_upstream_wording(client, name, fragment, cases):
    body = body_of(cases[name])
    for claim in body["claims"]:  # the Go table sets count next to allocationMode All; the API forbids that
        for r in claim["spec"]["devices"]["requests"]:
            if (r.get("exactly") or {}).get("allocationMode") == "All":
                r["exactly"].pop("count", None)
    res = post(client, body)
    assert res.status_code == 422, res.content
    assert res["Content-Type"].startswith("application/problem+json")
    problem = res.json()
    assert fragment in problem["detail"]
    assert problem["errors"][0]["reason"] == problem["detail"]


def test_invalid_objects_are_422_with_field_paths(client, cases):
    body = body_of(cases["simple"])
    body["claims"][0]["spec"]["devices"]["requests"] = [{"name": f"r{i}", "exactly": {"deviceClassName": "class-a"}}
                                                        for i in range(33)]
    body["resourceSlices"][0]["spec"]["devices"][0]["name"] = "Not_A_DNS_Label"
    body["features"] = {"teleportation": True}
    res = post(client, body)
    assert res.status_code == 422
    fields = {e["field"] for e in res.json()["errors"]}
    assert "claims[0].spec.devices.requests" in fields
    assert any(f.startswith("resourceSlices[0].spec.devices[0]") for f in fields)
    assert "features" in fields


def test_v1beta1_claims_and_slices_are_accepted(client, cases):
    body = body_of(cases["simple"])
    beta_claim = body["claims"][0]
    beta_claim["apiVersion"] = "resource.k8s.io/v1beta1"
    beta_claim["spec"]["devices"]["requests"] = [{"name": "req-0", "deviceClassName": "class-a"}]
    res = post(client, body)
    assert res.status_code == 200, res.content
    assert res.json()["claims"][0]["allocation"]["devices"]["results"][0]["device"] == "device-1"


def test_stored_fleet_when_the_body_has_no_slices(client):
    from tests.claims import fleet as fleet_helpers

    fleet_helpers.load_fleet({"c1": [("h100", 1)]})
    claim = fleet_helpers.gpu_claim("what-if", count=2)
    res = post(client, {"claims": [claim]})
    assert res.status_code == 200, res.content
    data = res.json()
    assert data["allocated"] is True and data["cluster"] == "c1"
    assert len(data["claims"][0]["allocation"]["devices"]["results"]) == 2
    # Nothing was written: the same question has the same answer, and more than the node has is refused.
    assert post(client, {"claims": [claim]}).json()["claims"] == data["claims"]
    too_big = fleet_helpers.gpu_claim("too-big", count=9)
    assert post(client, {"claims": [too_big]}).json()["allocated"] is False


HOSTILE = ("[" + ",".join(str(i) for i in range(1000)) + "]" + ".all(x, " + "[" + ",".join(str(i) for i in range(1000))
           + "]" + ".all(y, device.attributes['gpu.nvidia.com'].uuid.size() + x + y > 0))")


def test_a_selector_too_expensive_to_store_is_refused_before_simulating(client, cases):
    body = body_of(cases["simple"])
    body["claims"][0]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": HOSTILE}}]
    res = post(client, body)
    assert res.status_code == 422, res.content
    errors = res.json()["errors"]
    assert errors[0]["field"] == "claims[0].spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert errors[0]["reason"].startswith("Forbidden: too complex, exceeds cost limit")
    body = body_of(cases["simple"])
    body["deviceClasses"][0]["spec"]["selectors"] = [{"cel": {"expression": HOSTILE}}]
    res = post(client, body)
    assert res.status_code == 422, res.content
    assert res.json()["errors"][0]["field"] == "deviceClasses[0].spec.selectors[0].cel.expression"


def test_all_evaluations_of_a_simulation_share_one_budget(client, monkeypatch, cases):
    from claims.api import simulate as simulate_api

    monkeypatch.setattr(simulate_api, "REQUEST_COST_BUDGET", 2)  # the class selector alone costs 4
    res = post(client, body_of(cases["simple"]))
    assert res.status_code == 422, res.content
    problem = res.json()
    assert problem["title"] == "CEL budget exhausted"
    assert "the request's CEL budget of 2 cost units is used up" in problem["errors"][0]["reason"]
