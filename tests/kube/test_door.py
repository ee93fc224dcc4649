"""The /k8s door through HTTP (DRF's test client): discovery, OpenAPI, Status errors, field validation,
versions, Table, selectors, paging, patches, the status subresource, watch and its bounds."""
from __future__ import annotations

import json

import pytest

from claims.models import ResourceClaim
from claims.services import templates as template_services
from draservice import changes
from draservice.models import Change, ChangeLogState
from kube import watch as kube_watch
from tests.claims import fleet
from tests.gangs.fleet import gang_body, template_body

CLAIMS = "/k8s/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def claim(name: str, **meta) -> dict:
    body = fleet.gpu_claim(name)
    body["metadata"].update(meta)
    return body


@pytest.fixture
def admin(admin_client):
    fleet.load_fleet({"c1": [("h100", 2), ("a100-mig", 1)]})
    fleet.load_device_classes()
    return admin_client


def post(client, body, url=CLAIMS, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.post(f"{url}?{query}" if query else url, body, format="json")


def test_discovery_aggregated_and_legacy(admin):
    agg = admin.get("/k8s/apis", HTTP_ACCEPT=AGGREGATED)
    assert agg["Content-Type"].startswith("application/json;g=apidiscovery.k8s.io;v=v2")
    groups = {g["metadata"]["name"]: g for g in agg.json()["items"]}
    versions = [v["version"] for v in groups["resource.k8s.io"]["versions"]]
    assert versions == ["v1", "v1beta2", "v1beta1", "v1alpha3", "v1alpha2"]
    alpha2 = next(v for v in groups["resource.k8s.io"]["versions"] if v["version"] == "v1alpha2")
    assert {r["resource"]: r["verbs"] for r in alpha2["resources"]} == {"resourceclaims": ["create"],
                                                                        "resourceclasses": ["create"]}
    claims = next(r for r in groups["resource.k8s.io"]["versions"][0]["resources"] if r["resource"] == "resourceclaims")
    assert claims["scope"] == "Namespaced" and "watch" in claims["verbs"]
    legacy = admin.get("/k8s/apis").json()
    assert legacy["kind"] == "APIGroupList"
    resources = admin.get("/k8s/apis/resource.k8s.io/v1beta2").json()
    assert {r["name"] for r in resources["resources"]} >= {"resourceclaims", "resourceclaims/status", "resourceslices"}
    assert admin.get("/k8s/api").json()["versions"] == ["v1"]
    assert admin.get("/k8s/version").json()["gitVersion"].startswith("v1.35")


def test_openapi_declares_field_validation_on_patch_for_each_kind(admin):
    index = admin.get("/k8s/openapi/v3").json()["paths"]
    url = index["apis/resource.k8s.io/v1"]["serverRelativeURL"]
    assert url.startswith("/k8s/openapi/v3/apis/resource.k8s.io/v1?hash=")
    doc = admin.get(url).json()
    patches = [op["patch"] for op in doc["paths"].values() if "patch" in op]
    gvk = [p["x-kubernetes-group-version-kind"] for p in patches]
    assert {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"} in gvk
    assert all(any(q["name"] == "fieldValidation" and q["in"] == "query" for q in p["parameters"]) for p in patches)
    # kubectl computes a strategic merge patch from a schema only where the operation accepts one
    assert all("application/strategic-merge-patch+json" not in p["requestBody"]["content"] for p in patches)


@pytest.mark.django_db(transaction=True)  # as served: each request's own transactions (a 409 ends its own)
def test_errors_are_kubernetes_status_objects(admin):
    missing = admin.get(f"{CLAIMS}/nope").json()
    assert (missing["kind"], missing["code"], missing["reason"]) == ("Status", 404, "NotFound")
    assert missing["message"] == 'resourceclaims.resource.k8s.io "nope" not found'
    assert post(admin, claim("a")).status_code == 201
    again = post(admin, claim("a"))
    assert again.status_code == 409 and again.json()["reason"] == "AlreadyExists"
    bad = claim("b")
    bad["spec"]["devices"]["requests"][0]["name"] = "Not_A_Name"
    invalid = post(admin, bad).json()
    assert invalid["code"] == 422 and invalid["reason"] == "Invalid"
    assert invalid["message"].startswith('ResourceClaim.resource.k8s.io "b" is invalid: [')
    assert invalid["details"]["causes"][0]["field"] == "spec.devices.requests[0].name"
    assert admin.get("/k8s/apis/resource.k8s.io/v1/widgets").json()["reason"] == "NotFound"


def test_field_validation_strict_warn_ignore(admin):
    typo = claim("typo")
    typo["spec"]["devices"]["requests"][0]["exactly"]["deviceClasName"] = "x"
    strict = post(admin, typo, fieldValidation="Strict")
    assert strict.status_code == 400
    assert strict.json()["details"]["causes"][0]["field"] == "spec.devices.requests[0].exactly.deviceClasName"
    assert not ResourceClaim.objects.filter(name="typo").exists()
    warned = post(admin, typo)
    assert warned.status_code == 201 and 'unknown field' in warned["Warning"]
    assert "deviceClasName" not in json.dumps(warned.json()["spec"])
    assert post(admin, claim("c2"), fieldValidation="Sometimes").status_code == 400


def test_objects_come_back_in_the_version_asked_for(admin):
    v1beta1 = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "old"},
               "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}}}
    url = CLAIMS.replace("/v1/", "/v1beta1/")
    created = post(admin, v1beta1, url)
    assert created.status_code == 201, created.json()
    assert created.json()["apiVersion"] == "resource.k8s.io/v1beta1"
    assert created.json()["spec"]["devices"]["requests"][0]["deviceClassName"] == "gpu.nvidia.com"
    v1 = admin.get(f"{CLAIMS}/old").json()
    assert v1["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    mismatch = post(admin, claim("x"), url)
    assert mismatch.status_code == 400 and "does not match the expected API version" in mismatch.json()["message"]


def test_table_selectors_and_paging(admin):
    for i in range(5):
        assert post(admin, claim(f"c{i}", labels={"team": "ml" if i % 2 else "infra"})).status_code == 201
    table = admin.get(CLAIMS, HTTP_ACCEPT=TABLE).json()
    assert table["kind"] == "Table" and [c["name"] for c in table["columnDefinitions"]][:6] == [
        "Name", "State", "Cluster", "Node", "Devices", "Age"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    names = lambda r: [i["metadata"]["name"] for i in r.json()["items"]]  # noqa: E731
    assert names(admin.get(CLAIMS, {"labelSelector": "team=ml"})) == ["c1", "c3"]
    assert names(admin.get(CLAIMS, {"labelSelector": "team in (infra),team!=ml"})) == ["c0", "c2", "c4"]
    assert names(admin.get(CLAIMS, {"fieldSelector": "metadata.name=c3"})) == ["c3"]
    assert admin.get(CLAIMS, {"fieldSelector": "spec.x=1"}).json()["message"] == "field label not supported: spec.x"
    page = admin.get(CLAIMS, {"limit": 2}).json()
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    rest = admin.get(CLAIMS, {"limit": 10, "continue": page["metadata"]["continue"]}).json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c2", "c3", "c4"]
    assert rest["metadata"]["resourceVersion"] == page["metadata"]["resourceVersion"]
    assert admin.get(CLAIMS, {"continue": "garbage!"}).status_code == 400


def test_patches_and_the_status_subresource(admin):
    post(admin, claim("p"))
    merged = admin.patch(f"{CLAIMS}/p", json.dumps({"metadata": {"labels": {"a": "1"}}}),
                         content_type="application/merge-patch+json")
    assert merged.status_code == 200 and merged.json()["metadata"]["labels"] == {"a": "1"}
    ops = [{"op": "add", "path": "/metadata/labels/b", "value": "2"}]
    jp = admin.patch(f"{CLAIMS}/p", json.dumps(ops), content_type="application/json-patch+json")
    assert jp.json()["metadata"]["labels"] == {"a": "1", "b": "2"}
    immutable = admin.patch(f"{CLAIMS}/p", json.dumps({"spec": {"devices": {"requests": []}}}),
                            content_type="application/merge-patch+json")
    assert immutable.status_code == 422 and immutable.json()["reason"] == "Invalid"
    status = admin.patch(f"{CLAIMS}/p/status", json.dumps({"status": {"allocation": {}}}),
                         content_type="application/merge-patch+json")
    assert status.status_code == 405 and "written by the service only" in status.json()["message"]
    stale = admin.get(f"{CLAIMS}/p").json()
    stale["metadata"]["resourceVersion"] = "1"
    conflict = admin.put(f"{CLAIMS}/p", stale, format="json")
    assert conflict.status_code == 409 and conflict.json()["reason"] == "Conflict"
    sap = admin.patch(f"{CLAIMS}/p", "{}", content_type="application/apply-patch+yaml")  # kube.apply's tests
    assert sap.status_code == 422 and "fieldManager: Required value" in sap.json()["message"]


def test_strategic_merge_lists_merge_by_name():
    from kube.patch import strategic_merge

    current = {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                      "containers": [{"name": "b", "image": "z"}, {"name": "a", "$patch": "delete"}]}}
    assert strategic_merge(current, patch) == {"spec": {"containers": [{"name": "b", "image": "z"}]}}


@pytest.mark.django_db(transaction=True)
def test_watch_streams_changes_after_the_list_and_410_past_retention(admin_client):
    fleet.load_device_classes()
    changes.seal()
    changes.seal()  # past the seqs of rows earlier tests truncated (a gap that never fills)
    client = admin_client
    listed = client.get(CLAIMS).json()
    rv = listed["metadata"]["resourceVersion"]
    assert rv != "0"
    post(client, claim("w"))
    response = client.get(CLAIMS, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"})
    events = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "w"
    assert int(events[-1]["object"]["metadata"]["resourceVersion"]) > int(rv)
    table = client.get(CLAIMS, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}, HTTP_ACCEPT=TABLE)
    first = json.loads(b"".join(table.streaming_content).splitlines()[0])
    assert first["object"]["kind"] == "Table" and first["object"]["rows"][0]["cells"][0] == "w"
    ChangeLogState.objects.update(compacted_through=Change.objects.order_by("-seq").first().seq)
    expired = client.get(CLAIMS, {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"})
    error = json.loads(b"".join(expired.streaming_content).splitlines()[0])
    assert error["type"] == "ERROR" and error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"


def test_watches_per_process_are_bounded(admin, monkeypatch):
    monkeypatch.setattr(kube_watch, "_slots", kube_watch.threading.BoundedSemaphore(1))
    kube_watch.acquire_slot()
    busy = admin.get(CLAIMS, {"watch": "1", "timeoutSeconds": "1"})
    assert busy.status_code == 429 and busy["Retry-After"] == "1"
    kube_watch._slots.release()


ARTICLES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "articles"


def test_article_manifests_get_the_doctors_rewrite_through_the_door(admin):
    """kubectl apply (Strict validation) of a v1 claim written in the v1beta1 shape: a 422 whose rewrite,
    applied as given, is accepted; a v1alpha2 ResourceClass: an explanation and a DeviceClass skeleton."""
    import yaml

    shaped = yaml.safe_load((ARTICLES / "v1-claim-v1beta1-shape.yaml").read_text())
    refused = post(admin, shaped, fieldValidation="Strict")
    assert refused.status_code == 422, refused.json()
    body = refused.json()
    assert body["reason"] == "Invalid" and body["details"]["rewrite"]["spec"]["devices"]["requests"][0]["exactly"]
    rewrite = body["details"]["rewrite"]
    assert post(admin, rewrite, fieldValidation="Strict").status_code == 201
    classic = next(d for d in yaml.safe_load_all((ARTICLES / "classic-dra-v1alpha2.yaml").read_text())
                   if d["kind"] == "ResourceClass")
    skeleton = post(admin, classic, "/k8s/apis/resource.k8s.io/v1alpha2/resourceclasses")
    assert skeleton.status_code == 422
    assert skeleton.json()["details"]["skeleton"]["kind"] == "DeviceClass" and skeleton.json()["details"][
        "explanation"]
    assert admin.get("/k8s/apis/resource.k8s.io/v1alpha2/resourceclasses").status_code == 404


def test_fleet_device_classes_are_written_by_admins_only(admin, ns_client):
    url = "/k8s/apis/resource.k8s.io/v1/deviceclasses"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "big.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}}
    team = ns_client("team-a")
    assert post(team, body, url).status_code == 403
    created = post(admin, body, url)
    assert created.status_code == 201 and created.json()["metadata"]["name"] == "big.example.com"
    labelled = admin.patch(f"{url}/big.example.com", json.dumps({"metadata": {"labels": {"tier": "1"}}}),
                           content_type="application/merge-patch+json")
    assert labelled.status_code == 200, labelled.json()
    assert admin.delete(f"{url}/big.example.com").status_code == 200
    assert admin.get(f"{url}/big.example.com").status_code == 404


@pytest.mark.django_db(transaction=True)  # the claim is allocated by the round its commit starts
def test_a_pool_status_request_answers_availability_once(admin, ns_client):
    from claims.models import DeviceAllocation

    url = "/k8s/apis/resource.k8s.io/v1alpha3/resourcepoolstatusrequests"
    team = ns_client("team-a")
    assert post(team, claim("held")).status_code == 201  # the in-process round allocates one GPU
    held = DeviceAllocation.objects.filter(driver="gpu.nvidia.com").count()
    asked = post(team, {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourcePoolStatusRequest",
                        "metadata": {"name": "gpus"}, "spec": {"driver": "gpu.nvidia.com"}}, url)
    assert asked.status_code == 201, asked.json()
    status = asked.json()["status"]
    assert status["poolCount"] == len(status["pools"]) >= 1
    assert all(p["poolName"].startswith("c1.") for p in status["pools"])
    assert sum(p["allocatedDevices"] for p in status["pools"]) == held >= 1
    for p in status["pools"]:
        assert p["availableDevices"] + p["allocatedDevices"] + p["unavailableDevices"] == p["totalDevices"]
    assert team.get(f"{url}/gpus").json()["status"] == status  # fixed at creation
    bad = post(team, {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourcePoolStatusRequest",
                      "metadata": {"name": "bad"}, "spec": {"limit": 0}}, url)
    assert bad.status_code == 422
    assert {c["field"] for c in bad.json()["details"]["causes"]} == {"spec.driver", "spec.limit"}
    immutable = team.patch(f"{url}/gpus", json.dumps({"spec": {"limit": 5}}),
                           content_type="application/merge-patch+json")
    assert immutable.status_code in (403, 405)


def test_our_own_kinds_gangs_and_queues(admin, ns_client):
    template_services.create_template("team-a", template_body("gpu1", 1))
    gangs = "/k8s/apis/draservice.io/v1alpha1/namespaces/team-a/gangs"
    body = gang_body("g1", 2, template="gpu1", required=None, preferred=None)
    created = post(admin, body, gangs)
    assert created.status_code == 201, created.json()
    assert created.json()["kind"] == "Gang" and created.json()["status"]["minMember"] == 2
    assert [g["metadata"]["name"] for g in admin.get(gangs).json()["items"]] == ["g1"]
    assert admin.delete(f"{gangs}/g1").status_code == 200
    queues = "/k8s/apis/draservice.io/v1alpha1/queues"
    listed = ns_client("team-a").get(queues).json()
    assert listed["kind"] == "QueueList" and "default" in [q["metadata"]["name"] for q in listed["items"]]
    queue = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "ml"},
             "spec": {"namespaces": ["team-a"]}}
    assert post(ns_client("team-a"), queue, queues).status_code == 403
    made = post(admin, queue, queues)
    assert made.status_code == 201, made.json()
    assert admin.get(f"{queues}/ml").json()["status"] is not None


def test_djangos_own_errors_under_the_door_are_status_objects(client):
    from django.test import RequestFactory

    from draservice.problems import api_handler404, api_handler500

    request = RequestFactory().get("/k8s/apis/resource.k8s.io/v1/x")
    for answer, code in ((api_handler404(request), 404), (api_handler500(request), 500)):
        body = json.loads(answer.content)
        assert answer.status_code == code and body["kind"] == "Status" and body["code"] == code


def test_a_selector_is_bounded(admin):
    huge = ",".join(f"k{i}=v" for i in range(65))
    refused = admin.get(CLAIMS, {"labelSelector": huge})
    assert refused.status_code == 400 and "at most 64 requirements" in refused.json()["message"]
    assert admin.get(CLAIMS, {"labelSelector": ",".join(f"k{i}=v" for i in range(64))}).status_code == 200
