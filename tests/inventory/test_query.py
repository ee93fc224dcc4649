"""The query API: filters, ordering, cursor pagination, ETag/If-Match, clusters and DeviceClasses."""
import copy

import pytest

from inventory.models import Cluster, DeviceClass
from inventory.services.sync import push_inventory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def fleet(cluster_factory, real_slices):
    cluster_factory("c1", {"region": "eu-west"})
    cluster_factory("c2", {"region": "us-east"})
    push_inventory("c1", {"resourceSlices": real_slices,
                          "nodes": [{"name": "h100-hgx-node-01", "labels": {"topology.kubernetes.io/zone": "eu-a"}}]})
    push_inventory("c2", {"resourceSlices": [s for s in real_slices if s["spec"]["driver"] == "gpu.amd.com"]})
    return real_slices


def results(client, path, **params):
    resp = client.get(path, params)
    assert resp.status_code == 200, resp.json()
    return resp.json()["results"]


def test_device_filters(admin_client, fleet):
    assert len(results(admin_client, "/api/v1/devices", limit=1000)) == 248 + 24
    assert len(results(admin_client, "/api/v1/devices", cluster="c2")) == 24
    assert len(results(admin_client, "/api/v1/devices", cluster="c1,c2", driver="gpu.amd.com")) == 48
    h100 = results(admin_client, "/api/v1/devices", attribute=f"gpu.nvidia.com/productName={H100}")
    assert len(h100) == 8 and {d["node"] for d in h100} == {"h100-hgx-node-01"}
    assert len(results(admin_client, "/api/v1/devices", attribute=f"productName={H100}")) == 8  # bare name
    mig = results(admin_client, "/api/v1/devices", limit=500, attribute=["gpu.nvidia.com/type=mig",
                                                                         "gpu.nvidia.com/profile=1g.10gb"])
    assert len(mig) == 8 * 7 and all(d["attributes"]["profile"]["string"] == "1g.10gb" for d in mig)
    assert len(results(admin_client, "/api/v1/devices", attribute="resource.kubernetes.io/pciBusID=0000:19:00.0")) == 1
    assert len(results(admin_client, "/api/v1/devices", attribute="gpu.amd.com/cardIndex=32")) == 2  # int, 2 clusters
    assert len(results(admin_client, "/api/v1/devices", attribute="gpu.intel.com/sriov=true")) == 2  # bool
    assert len(results(admin_client, "/api/v1/devices", node="rpl-s", pool="rpl-s")) == 2
    assert len(results(admin_client, "/api/v1/devices", node_label="topology.kubernetes.io/zone=eu-a")) == 10
    assert results(admin_client, "/api/v1/devices", attribute="gpu.nvidia.com/productName=nothing") == []
    bad = admin_client.get("/api/v1/devices", {"attribute": "no-equals-sign"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "attribute"


def test_other_lists_and_their_filters(admin_client, fleet):
    assert [n["name"] for n in results(admin_client, "/api/v1/nodes", cluster="c1", ordering="name")][:2] == \
        ["a100-dgx-node-01", "dra-example-driver-cluster-worker"]
    assert len(results(admin_client, "/api/v1/nodes", label="topology.kubernetes.io/zone=eu-a")) == 1
    slices = results(admin_client, "/api/v1/resourceslices", cluster="c1", driver="gpu.nvidia.com",
                     pool="a100-dgx-node-01")
    assert len(slices) == 9 and all(s["object"]["spec"]["driver"] == "gpu.nvidia.com" for s in slices)
    assert len(results(admin_client, "/api/v1/pools", cluster="c1")) == 8
    assert [c["name"] for c in results(admin_client, "/api/v1/clusters", label="region=us-east")] == ["c2"]
    clusters = results(admin_client, "/api/v1/clusters", ordering="-name")
    assert [c["name"] for c in clusters] == ["c2", "c1"] and clusters[1]["deviceCount"] == 248


def test_cursor_pagination_walks_everything_once(admin_client, fleet):
    seen, url = [], "/api/v1/devices?limit=50&ordering=name"
    while url:
        page = admin_client.get(url).json()
        seen += [d["id"] for d in page["results"]]
        url = page["next"]
    assert len(seen) == len(set(seen)) == 272


def test_device_detail_and_allocation_hook(admin_client, fleet):
    from inventory import hooks

    device = results(admin_client, "/api/v1/devices", attribute=f"productName={H100}")[0]
    assert device["allocation"] == {"state": "free"} and device["clusterStale"] is False

    def provider(devices):
        return {d.pk: {"state": "allocated", "claim": "team-a/train"} for d in devices if d.name == "gpu-0"}

    hooks.register_allocation_state_provider(provider)
    try:
        detail = admin_client.get(f"/api/v1/devices/{device['id']}").json()
        listed = results(admin_client, "/api/v1/devices", attribute=f"productName={H100}")
    finally:
        hooks.unregister_allocation_state_provider(provider)
    assert detail["allocation"] == {"state": "allocated", "claim": "team-a/train"}
    assert sum(d["allocation"]["state"] == "allocated" for d in listed) == 1


def test_cluster_admin_crud_with_etag(admin_client, cluster_factory):
    created = admin_client.post("/api/v1/clusters", {"name": "eu-1", "labels": {"region": "eu"}}, format="json")
    assert created.status_code == 201
    token = created.json()["token"]
    assert token.startswith("dra_") and "token" not in admin_client.get("/api/v1/clusters/eu-1").json()
    duplicate = admin_client.post("/api/v1/clusters", {"name": "eu-1"}, format="json")
    assert duplicate.status_code == 400 and duplicate.json()["errors"][0]["field"] == "name"
    bad = admin_client.post("/api/v1/clusters", {"name": "EU 1", "labels": {"a": "!"}}, format="json")
    assert bad.status_code == 400 and {e["field"] for e in bad.json()["errors"]} == {"name", "labels.a"}
    etag = admin_client.get("/api/v1/clusters/eu-1")["ETag"]
    assert admin_client.get("/api/v1/clusters/eu-1", HTTP_IF_NONE_MATCH=etag).status_code == 304
    changed = admin_client.patch("/api/v1/clusters/eu-1", {"labels": {"region": "eu-west"}}, format="json",
                                 HTTP_IF_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    stale = admin_client.patch("/api/v1/clusters/eu-1", {"labels": {}}, format="json", HTTP_IF_MATCH=etag)
    assert stale.status_code == 412 and stale["Content-Type"] == "application/problem+json"
    assert admin_client.delete("/api/v1/clusters/eu-1", HTTP_IF_MATCH=etag).status_code == 412
    assert admin_client.delete("/api/v1/clusters/eu-1", HTTP_IF_MATCH=changed["ETag"]).status_code == 204
    assert not Cluster.objects.filter(name="eu-1").exists()


def test_device_class_crud_etag_and_cel(admin_client, cluster_factory, real_slices):
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                         "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
    created = admin_client.post("/api/v1/deviceclasses", cls, format="json")
    assert created.status_code == 201 and created.json()["object"] == cls and created.json()["scope"] == "fleet"
    assert admin_client.post("/api/v1/deviceclasses", cls, format="json").status_code == 409
    etag = created["ETag"]
    changed = copy.deepcopy(cls)
    changed["spec"]["selectors"][0]["cel"]["expression"] = "device.driver == 'gpu.nvidia.com'"
    assert admin_client.put("/api/v1/deviceclasses/gpu.nvidia.com", changed, format="json",
                            HTTP_IF_MATCH='"99"').status_code == 412
    ok = admin_client.put("/api/v1/deviceclasses/gpu.nvidia.com", changed, format="json", HTTP_IF_MATCH=etag)
    assert ok.status_code == 200 and ok.json()["resourceVersion"] == 2
    assert DeviceClass.objects.get().object == changed
    broken = copy.deepcopy(cls)
    broken["spec"]["selectors"] = [{"cel": {"expression": "device.driver =="}}]
    resp = admin_client.put("/api/v1/deviceclasses/gpu.nvidia.com", broken, format="json")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "spec.selectors[0].cel.expression"
    # Agents' own classes are listed next to fleet ones, but the detail URL is the fleet's.
    _, agent = cluster_factory("c1")
    agent.put("/api/v1/clusters/c1/inventory", {"resourceSlices": [], "deviceClasses": [cls]}, format="json")
    listed = results(admin_client, "/api/v1/deviceclasses")
    assert sorted((c["scope"], c["cluster"]) for c in listed) == [("cluster", "c1"), ("fleet", None)]
    assert [c["cluster"] for c in results(admin_client, "/api/v1/deviceclasses", scope="cluster")] == ["c1"]
    assert agent.post("/api/v1/deviceclasses", cls, format="json").status_code == 403
    assert admin_client.delete("/api/v1/deviceclasses/gpu.nvidia.com", HTTP_IF_MATCH=etag).status_code == 412
    assert admin_client.delete("/api/v1/deviceclasses/gpu.nvidia.com").status_code == 204
    assert DeviceClass.objects.filter(cluster__isnull=False).count() == 1


def test_all_real_device_class_selectors_compile(admin_client, real_cel):
    """The shipped demo classes use real selectors; every one must pass the API's CEL check."""
    from inventory.demo import standard_device_classes

    for cls in standard_device_classes():
        resp = admin_client.post("/api/v1/deviceclasses", cls, format="json")
        assert resp.status_code == 201, resp.json()
    expressions = {e["expression"] for e in real_cel}
    assert all(c["spec"]["selectors"][0]["cel"]["expression"] in expressions for c in standard_device_classes())


def test_device_taint_rules(admin_client):
    rule = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "maint"},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node-1"},
                     "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}}
    resp = admin_client.post("/api/v1/devicetainterules", rule, format="json")
    assert resp.status_code == 201 and resp.json()["object"]["apiVersion"] == "resource.k8s.io/v1"
    assert [r["name"] for r in results(admin_client, "/api/v1/devicetainterules", effect="NoSchedule",
                                       driver="gpu.nvidia.com")] == ["maint"]
    rule["spec"]["taint"]["effect"] = "Never"
    bad = admin_client.put("/api/v1/devicetainterules/maint", rule, format="json")
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "spec.taint.effect"


def test_schema_documents_the_inventory(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    # Routes accept an optional trailing slash; the schema lists the slash form.
    schema["paths"] = {p.rstrip("/"): v for p, v in schema["paths"].items()}
    for path in ("/api/v1/clusters/{cluster}/inventory", "/api/v1/devices", "/api/v1/deviceclasses/{name}",
                 "/api/v1/clusters/{cluster}/resourceslices/{slice_name}", "/api/v1/clusters/{cluster}/heartbeat"):
        assert path in schema["paths"], sorted(schema["paths"])
    assert "put" in schema["paths"]["/api/v1/clusters/{cluster}/inventory"]
    device_params = {p["name"] for p in schema["paths"]["/api/v1/devices"]["get"]["parameters"]}
    assert {"attribute", "cluster", "node", "driver", "pool", "continue", "limit", "ordering"} <= device_params
    assert "cursor" in device_params  # the deprecated alias, documented as such
