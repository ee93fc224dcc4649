"""No input gets a 500: every error of the API is application/problem+json with ``errors[]`` (issue 12).

One test per shape found by hand and by schemathesis; tests/test_schemathesis.py fuzzes the rest.
"""
from __future__ import annotations

import base64
import json

import pytest
import yaml
from django.test import Client

from draservice.models import APIToken
from draservice.tokens import issue_token
from tests.claims import fleet as fleet_helpers
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

CLAIMS = "/api/v1/namespaces/team-a/resourceclaims"


def assert_problem(resp, status: int, field: str | None = None) -> dict:
    """The response is a problem+json of ``status`` with a non-empty ``errors`` list (naming ``field``)."""
    assert resp.status_code == status, (resp.status_code, resp.content[:500])
    assert resp["Content-Type"].startswith("application/problem+json"), resp["Content-Type"]
    body = json.loads(resp.content)
    assert body["status"] == status and body["title"] and isinstance(body["detail"], str)
    assert body["errors"] and all(set(e) == {"field", "reason"} for e in body["errors"]), body
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
    return body


@pytest.fixture
def cluster(db):
    """Cluster c1 (one H100 node) and a client holding its agent token."""
    fleet_helpers.load_fleet({"c1": [("h100", 1)]})
    _, secret = issue_token(kind=APIToken.CLUSTER, cluster=_cluster("c1"))
    return client_for(secret)


def _cluster(name):
    from inventory.models import Cluster

    return Cluster.objects.get(name=name)


def _slice(generation=1, **spec) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s1"},
            "spec": {"driver": "gpu.example.com", "nodeName": "n1", "devices": [{"name": "d0"}],
                     "pool": {"name": "p1", "generation": generation, "resourceSliceCount": 1}, **spec}}


# ------------------------------------------------------------------------------------------ a. YAML errors

@pytest.mark.parametrize("how", [{"path": "?format=yaml"}, {"HTTP_ACCEPT": "application/yaml"}])
def test_404_asked_for_as_yaml_is_problem_json(admin_client, how):
    path = "/api/v1/clusters/nope" + how.pop("path", "")
    assert_problem(admin_client.get(path, **how), 404)


def test_validation_error_asked_for_as_yaml_is_problem_json(admin_client):
    resp = admin_client.post("/api/v1/clusters", {"name": "Not_A_Label"}, format="json", HTTP_ACCEPT="application/yaml")
    assert_problem(resp, 400, "name")


def test_yaml_renderer_takes_drf_string_subclasses():
    from rest_framework.exceptions import ErrorDetail

    from draservice.yaml import YAMLRenderer

    out = YAMLRenderer().render({"detail": ErrorDetail("Not found.", code="not_found"), "n": True, "i": 3})
    assert yaml.safe_load(out) == {"detail": "Not found.", "n": True, "i": 3}


# ------------------------------------------------------------------------------- b. apiVersion not a string

@pytest.mark.parametrize("api_version", [["resource.k8s.io/v1"], {"group": "resource.k8s.io"}, 1])
def test_api_version_of_wrong_type_is_422_for_device_classes(admin_client, api_version):
    body = {"apiVersion": api_version, "kind": "DeviceClass", "metadata": {"name": "x"}, "spec": {}}
    assert_problem(admin_client.post("/api/v1/deviceclasses", body, format="json"), 422, "apiVersion")


@pytest.mark.parametrize("api_version", [["resource.k8s.io/v1"], {"group": "resource.k8s.io"}])
def test_api_version_of_wrong_type_is_422_for_resource_slices(cluster, api_version):
    body = {**_slice(), "apiVersion": api_version}
    assert_problem(cluster.put("/api/v1/clusters/c1/resourceslices/s1", body, format="json"), 422, "apiVersion")


# ------------------------------------------------------------------------------------------- c. empty batch

def test_empty_batch_is_422(admin_client, classes_loaded):
    assert_problem(admin_client.post(f"{CLAIMS}/batch", {"items": []}, format="json"), 422, "items")


def test_batch_of_consumers_only_is_created(admin_client, classes_loaded):
    admin_client.post(CLAIMS, fleet_helpers.gpu_claim("shared"), format="json")
    consumer = {"apiVersion": "draservice.io/v1alpha1", "kind": "Consumer", "metadata": {"name": "job"},
                "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]}}
    resp = admin_client.post(f"{CLAIMS}/batch", {"items": [consumer]}, format="json")
    assert resp.status_code == 201, resp.content  # was the IndexError of an empty claim insert
    assert [o["kind"] for o in resp.json()["items"]] == ["Consumer"]


@pytest.fixture
def classes_loaded(db):
    fleet_helpers.load_device_classes()


# ------------------------------------------------------------------------------------------------ d. OPTIONS

OPTIONS_PATHS = [
    "/api/v1/clusters", "/api/v1/clusters/c1", "/api/v1/clusters/c1/inventory", "/api/v1/clusters/c1/heartbeat",
    "/api/v1/nodes", "/api/v1/resourceslices", "/api/v1/pools", "/api/v1/devices", "/api/v1/deviceclasses",
    "/api/v1/devicetainterules", "/api/v1/cel/validate", "/api/v1/cel/match", "/api/v1/simulate",
    "/api/v1/simulate/gang", "/api/v1/namespaces", "/api/v1/resourceclaims", "/api/v1/utilisation",
    CLAIMS, f"{CLAIMS}/batch", f"{CLAIMS}/x", f"{CLAIMS}/x/release", f"{CLAIMS}/x/renew", f"{CLAIMS}/x/explain",
    f"{CLAIMS}/x/events", "/api/v1/namespaces/team-a/resourceclaimtemplates",
    "/api/v1/namespaces/team-a/resourceclaimtemplates/x", "/api/v1/namespaces/team-a/consumers",
    "/api/v1/namespaces/team-a/consumers/x", "/api/v1/gangs", "/api/v1/namespaces/team-a/gangs",
    "/api/v1/namespaces/team-a/gangs/x", "/api/v1/namespaces/team-a/gangs/x/release",
    "/api/v1/namespaces/team-a/gangs/x/events",
]


@pytest.mark.parametrize("path", OPTIONS_PATHS)
def test_options_answers_metadata_on_every_route(admin_client, path):
    resp = admin_client.options(path)
    assert resp.status_code == 200, (path, resp.content[:300])
    assert resp.json()["name"]


# ------------------------------------------------------------------------------------------ e/f. NUL anywhere

def test_nul_in_a_json_key_of_a_heartbeat_is_400(cluster):
    resp = cluster.post("/api/v1/clusters/c1/heartbeat", b'{"status": {"a\\u0000b": 1}}',
                        content_type="application/json")
    assert_problem(resp, 400, "status.a\\u0000b")


def test_nul_in_a_json_string_is_400_with_its_path(admin_client):
    resp = admin_client.post("/api/v1/clusters", b'{"name": "c2", "labels": {"a": "x\\u0000"}}',
                             content_type="application/json")
    assert_problem(resp, 400, "labels.a")


def test_nul_in_a_yaml_string_is_400(admin_client):
    resp = admin_client.post("/api/v1/clusters", 'name: "c\\0"\n', content_type="application/yaml")
    assert_problem(resp, 400, "name")


def test_escaped_backslash_u0000_is_not_a_nul(admin_client):
    resp = admin_client.post("/api/v1/clusters", b'{"name": "c2", "labels": {"a": "\\\\u0000"}}',
                             content_type="application/json")
    assert_problem(resp, 400, "labels.a")  # refused as a label value, not as a NUL
    assert "NUL" not in resp.json()["errors"][0]["reason"]


@pytest.mark.parametrize("path", ["/api/v1/namespaces/a%00b/resourceclaims", "/api/v1/clusters/a%00b",
                                  "/api/v1/namespaces/team-a/resourceclaims/a%00b",
                                  "/api/v1/clusters?name=a%00b", "/api/v1/devices?x%00=1"])
def test_nul_in_the_url_is_400(admin_client, path):
    assert_problem(admin_client.get(path), 400)


def test_nul_in_a_dashboard_url_is_400_not_500():
    assert Client().get("/clusters/a%00b").status_code == 400


# ---------------------------------------------------------------------------------------- g. nesting depth

@pytest.mark.parametrize("depth", [101, 1024, 5000, 100_000])
def test_deep_json_is_400(admin_client, depth):
    body = b'{"name": "c2", "labels": ' + b"[" * depth + b"]" * depth + b"}"
    resp = admin_client.post("/api/v1/clusters", body, content_type="application/json")
    assert "nested more than 100 levels" in assert_problem(resp, 400)["detail"]


def test_json_nested_100_deep_is_parsed(admin_client):
    body = b'{"name": "c2", "labels": ' + b"[" * 99 + b"]" * 99 + b"}"
    resp = admin_client.post("/api/v1/clusters", body, content_type="application/json")
    assert_problem(resp, 400, "labels")  # parsed; refused by the serializer (labels must be an object)


def test_deep_yaml_flow_sequence_is_400(admin_client):
    body = "name: c2\nlabels: " + "[" * 50_000 + "]" * 50_000 + "\n"
    resp = admin_client.post("/api/v1/clusters", body, content_type="application/yaml")
    assert "nested more than 100 levels" in assert_problem(resp, 400)["detail"]


def test_deep_merge_patch_is_400(admin_client, classes_loaded):
    admin_client.post(CLAIMS, fleet_helpers.gpu_claim("x"), format="json")
    body = b'{"metadata": {"labels": ' + b"{\"a\":" * 5000 + b"1" + b"}" * 5000 + b"}}"
    resp = admin_client.patch(f"{CLAIMS}/x", body, content_type="application/merge-patch+json")
    assert_problem(resp, 400)


def test_yaml_alias_bomb_is_400(admin_client):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(8)]
    resp = admin_client.post("/api/v1/simulate", "\n".join(lines), content_type="application/yaml")
    assert "aliasing" in assert_problem(resp, 400)["detail"]


def test_yaml_values_json_cannot_hold_are_strings_or_400(admin_client):
    resp = admin_client.post("/api/v1/clusters", "name: c2\nlabels: {when: 2024-01-01}\n",
                             content_type="application/yaml")
    assert resp.status_code == 201, resp.content  # the date stays the string it was written as
    assert resp.json()["labels"] == {"when": "2024-01-01"}
    assert_problem(admin_client.post("/api/v1/simulate", "claims: [.inf]\n", content_type="application/yaml"), 400)


# ------------------------------------------------------------------------------------- h. int64 generation

@pytest.mark.parametrize("generation, reason", [
    (2**63, "must be less than or equal to 9223372036854775807"),
    (2**70, "must be less than or equal to 9223372036854775807"),
    (-1, "must be greater than or equal to zero"),
    (1.5, "must be an integer"),
    ("1", "must be an integer"),
])
def test_pool_generation_out_of_int64_is_422(cluster, generation, reason):
    resp = cluster.put("/api/v1/clusters/c1/resourceslices/s1", _slice(generation), format="json")
    body = assert_problem(resp, 422, "spec.pool.generation")
    assert reason in body["detail"], body


def test_pool_generation_at_int64_max_is_stored(cluster):
    resp = cluster.put("/api/v1/clusters/c1/resourceslices/s1", _slice(2**63 - 1), format="json")
    assert resp.status_code == 201, resp.content


def test_resource_slice_count_out_of_int64_is_422_in_a_full_push(cluster):
    obj = _slice()
    obj["spec"]["pool"]["resourceSliceCount"] = 2**64
    resp = cluster.put("/api/v1/clusters/c1/inventory", {"resourceSlices": [obj]}, format="json")
    assert_problem(resp, 422)


# --------------------------------------------------------------------------- problem+json for every status

def test_400_yaml_parse_error(admin_client):
    assert_problem(admin_client.post("/api/v1/clusters", "a: [", content_type="application/yaml"), 400)


def test_400_json_parse_error(admin_client):
    assert_problem(admin_client.post("/api/v1/clusters", b"{", content_type="application/json"), 400)


def test_401_without_a_token():
    assert_problem(client_for(None).get("/api/v1/clusters"), 401)


def test_403_for_another_namespace(ns_client):
    assert_problem(ns_client("team-b").get(CLAIMS), 403)


def test_404_of_an_unknown_api_path_is_problem_json(admin_client):
    for path in ("/api/v1/", "/api/v1/nope", "/api/nope"):
        assert_problem(admin_client.get(path), 404)


def test_405(admin_client):
    assert_problem(admin_client.delete("/api/v1/clusters"), 405)


def test_406(admin_client):
    assert_problem(admin_client.get("/api/v1/clusters", HTTP_ACCEPT="text/csv"), 406)


def test_409(admin_client):
    admin_client.post("/api/v1/deviceclasses", {"metadata": {"name": "x"}, "spec": {}}, format="json")
    resp = admin_client.post("/api/v1/deviceclasses", {"metadata": {"name": "x"}, "spec": {}}, format="json")
    assert_problem(resp, 409)


def test_412(admin_client):
    admin_client.post("/api/v1/clusters", {"name": "c2"}, format="json")
    resp = admin_client.patch("/api/v1/clusters/c2", {"labels": {"a": "b"}}, format="json", HTTP_IF_MATCH='"999"')
    assert_problem(resp, 412)


def test_415(admin_client):
    assert_problem(admin_client.post("/api/v1/clusters", "name=c2", content_type="text/plain"), 415)


def test_429_and_any_drf_error_carry_errors():
    from rest_framework.exceptions import Throttled
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    from draservice.problems import exception_handler

    request = Request(APIRequestFactory().get("/api/v1/clusters"))
    resp = exception_handler(Throttled(wait=3), {"request": request, "view": None})
    assert resp.status_code == 429 and resp.data["errors"][0]["field"] == "" and resp.data["title"]


def test_unhandled_exception_under_api_is_problem_json_500(admin_client, monkeypatch):
    from inventory.api.views import ClusterViewSet

    def boom(self, request, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(ClusterViewSet, "list", boom)
    admin_client.raise_request_exception = False
    body = assert_problem(admin_client.get("/api/v1/clusters"), 500)
    assert "boom" not in json.dumps(body)  # nothing internal leaks


def test_html_404_outside_the_api_stays_html():
    resp = Client().get("/no-such-page-at-all/")
    assert resp.status_code in (302, 404) and "problem" not in resp.get("Content-Type", "")


# -------------------------------------------------------------------------------------- list parameters

@pytest.mark.parametrize("path, param", [(CLAIMS, "continue"), ("/api/v1/clusters", "cursor"),
                                         ("/api/v1/namespaces/team-a/gangs", "continue")])
def test_malformed_continue_is_400(admin_client, path, param):
    assert_problem(admin_client.get(path, {param: "%%%not-base64"}), 400, param)


@pytest.mark.parametrize("path, param", [(CLAIMS, "continue"), ("/api/v1/clusters", "cursor")])
def test_continue_whose_position_no_longer_fits_is_410(admin_client, path, param):
    token = base64.b64encode(b"p=not-an-id").decode()
    body = assert_problem(admin_client.get(path, {param: token}), 410, param)
    assert body["title"] == "Gone" and "too old" in body["detail"]


@pytest.mark.parametrize("path", [CLAIMS, "/api/v1/clusters", "/api/v1/gangs"])
def test_limit_not_an_integer_is_400(admin_client, path):
    assert_problem(admin_client.get(path, {"limit": "abc"}), 400, "limit")


def test_limit_zero_or_negative_means_the_server_maximum(admin_client):
    for i in range(3):
        admin_client.post("/api/v1/clusters", {"name": f"c{i}"}, format="json")
    for limit in ("0", "-5"):
        resp = admin_client.get("/api/v1/clusters", {"limit": limit})
        assert resp.status_code == 200 and len(resp.json()["results"]) == 3 and resp.json()["next"] is None


def test_continue_pages_through_a_claim_list(admin_client, classes_loaded):
    for i in range(3):
        admin_client.post(CLAIMS, fleet_helpers.gpu_claim(f"c{i}"), format="json")
    first = admin_client.get(CLAIMS, {"limit": "2"}).json()
    token = first["metadata"]["continue"]
    rest = admin_client.get(CLAIMS, {"limit": "2", "continue": token}).json()
    assert [c["metadata"]["name"] for c in first["items"] + rest["items"]] == ["c0", "c1", "c2"]


@pytest.mark.parametrize("path", [CLAIMS, "/api/v1/clusters", "/api/v1/devices", "/api/v1/namespaces/team-a/gangs",
                                  "/api/v1/utilisation"])
def test_unsupported_field_selector_is_400_naming_the_supported_ones(admin_client, path):
    body = assert_problem(admin_client.get(path, {"fieldSelector": "spec.nodeName=n1"}), 400, "fieldSelector")
    assert "field label not supported: spec.nodeName" in body["detail"]


def test_field_selector_on_name_and_namespace(admin_client, classes_loaded):
    for name in ("a", "b"):
        admin_client.post(CLAIMS, fleet_helpers.gpu_claim(name), format="json")
    def names(selector):
        return [c["metadata"]["name"] for c in admin_client.get(CLAIMS, {"fieldSelector": selector}).json()["items"]]

    assert names("metadata.name=a") == ["a"]
    assert names("metadata.name!=a") == ["b"]
    assert names("metadata.namespace==team-a,metadata.name=b") == ["b"]
    assert names("metadata.namespace=team-b") == []
    assert "can't understand" in assert_problem(admin_client.get(CLAIMS, {"fieldSelector": "x"}), 400)["detail"]
    assert_problem(admin_client.get(CLAIMS, {"fieldSelector": "metadata.name"}), 400, "fieldSelector")
    admin_client.post("/api/v1/clusters", {"name": "c9"}, format="json")
    clusters = admin_client.get("/api/v1/clusters", {"fieldSelector": "metadata.name=c9"}).json()["results"]
    assert [c["name"] for c in clusters] == ["c9"]


@pytest.mark.parametrize("path", [CLAIMS, "/api/v1/resourceclaims", "/api/v1/namespaces/team-a/gangs",
                                  "/api/v1/gangs"])
def test_bad_phase_is_400_with_the_supported_values(admin_client, path):
    body = assert_problem(admin_client.get(path, {"phase": "Bogus"}), 400, "phase")
    assert body["title"] == "Invalid query parameter"
    assert 'Unsupported value: "Bogus": supported values: ' in body["errors"][0]["reason"]


def test_bad_filter_syntax_is_400_invalid_query_parameter(admin_client):
    body = assert_problem(admin_client.get("/api/v1/devices", {"attribute": "no-equals-sign"}), 400, "attribute")
    assert body["title"] == "Invalid query parameter"
    assert_problem(admin_client.get("/api/v1/utilisation", {"since": "yesterday"}), 400, "since")


def test_date_time_filters_take_any_rfc3339_offset(admin_client):
    # PostgreSQL takes offsets up to 15:59 (schemathesis found the 500); RFC 3339 allows up to 23:59
    assert admin_client.get("/api/v1/utilisation", {"since": "0566-04-15T17:31:17.336-19:42"}).status_code == 200
    assert_problem(admin_client.get("/api/v1/utilisation", {"until": "0001-01-01T00:00:00+05:00"}), 400, "until")


@pytest.mark.parametrize("ttl", [f"{2**63}s", f"{2**70}h", "99999999999999999999d"])
def test_lease_ttl_past_any_duration_is_422(admin_client, classes_loaded, ttl):
    claim = fleet_helpers.gpu_claim("leased", annotations={"draservice.io/lease-ttl": ttl})
    assert_problem(admin_client.post(CLAIMS, claim, format="json"), 422,
                   "metadata.annotations[draservice.io/lease-ttl]")
    admin_client.post(CLAIMS, fleet_helpers.gpu_claim("plain"), format="json")
    assert_problem(admin_client.post(f"{CLAIMS}/plain/renew", {"ttl": ttl}, format="json"), 422)


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_a_capacity_request_that_is_not_a_quantity_is_a_422(admin_client, value):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "cap"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": value}}}}]}}}
    resp = admin_client.post("/api/v1/namespaces/team-a/resourceclaims", body, format="json")
    assert resp.status_code == 422, resp.content
    assert resp.json()["errors"][0]["field"] == "spec.devices.requests[0].exactly.capacity.requests[memory]"


@pytest.mark.parametrize("path", ["/api/v1/devices", "/api/v1/namespaces/ci/resourceclaims", "/api/v1/queues",
                                  "/api/v1/namespaces/ci/gangs", "/api/v1/simulate"])
def test_trace_and_unknown_methods_are_405_problems(admin_client, path):
    for method in ("TRACE", "PROPFIND"):
        resp = admin_client.generic(method, path)
        assert resp.status_code == 405, (method, path, resp.status_code)
        assert resp["Content-Type"].startswith("application/problem+json")
