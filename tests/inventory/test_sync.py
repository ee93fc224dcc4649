"""The agents' sync API: full pushes, incremental upserts, read-back, atomicity, YAML, token scoping."""
import copy

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext

from draservice.models import APIToken
from draservice.tokens import issue_token
from inventory.models import Cluster, Device, Node, Pool, ResourceSlice
from inventory.signals import inventory_changed
from tests.conftest import client_for
from tests.inventory.test_slices import to_v1beta1

pytestmark = pytest.mark.django_db


def push(client, cluster, body, **kwargs):
    return client.put(f"/api/v1/clusters/{cluster}/inventory", body, format="json", **kwargs)


def test_every_fixture_slice_ingests_and_reads_back_identically(cluster_factory, real_slices):
    cluster, agent = cluster_factory("c1")
    resp = push(agent, "c1", {"resourceSlices": real_slices})
    assert resp.status_code == 200, resp.json()
    result = resp.json()
    assert result["resourceSlices"]["created"] == 16 and result["devices"] == 248
    assert result["pools"] == {"complete": 8, "incomplete": 0, "invalid": 0}
    for obj in real_slices:
        got = agent.get(f"/api/v1/clusters/c1/resourceslices/{obj['metadata']['name']}")
        assert got.status_code == 200
        assert got.json() == obj
    whole = agent.get("/api/v1/clusters/c1/inventory").json()
    assert sorted(whole["resourceSlices"], key=lambda o: o["metadata"]["name"]) == \
        sorted(real_slices, key=lambda o: o["metadata"]["name"])
    # The flattened rows carry exactly the devices' attributes and capacities.
    stored = {(d.driver, d.pool_name, d.name): d for d in Device.objects.filter(cluster=cluster)}
    assert len(stored) == 248
    for obj in real_slices:
        for device in obj["spec"].get("devices", []):
            row = stored[(obj["spec"]["driver"], obj["spec"]["pool"]["name"], device["name"])]
            assert row.attributes == device["attributes"]
            assert row.capacity == device.get("capacity", {})
            assert row.consumes_counters == device.get("consumesCounters", [])
            assert row.node_name == obj["spec"]["nodeName"]


def test_each_fixture_slice_put_one_by_one_reads_back_identically(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    for obj in real_slices:
        name = obj["metadata"]["name"]
        resp = agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", obj, format="json")
        assert resp.status_code == 201, resp.json()
        assert resp.json() == obj and resp["ETag"]
    assert ResourceSlice.objects.count() == 16 and Device.objects.count() == 248
    assert set(Pool.objects.values_list("state", flat=True)) == {"complete"}


def test_v1beta1_and_v1beta2_pushes_store_the_same_v1(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    beta1 = [to_v1beta1(o) for o in real_slices]
    assert push(agent, "c1", {"resourceSlices": beta1}).status_code == 200
    assert agent.get("/api/v1/clusters/c1/inventory").json()["resourceSlices"] == \
        sorted(real_slices, key=lambda o: o["metadata"]["name"])
    beta2 = [{**o, "apiVersion": "resource.k8s.io/v1beta2"} for o in real_slices]
    again = push(agent, "c1", {"resourceSlices": beta2}).json()
    assert again["changed"] is False and again["resourceSlices"]["unchanged"] == 16


def test_push_replaces_what_is_gone_and_unchanged_push_changes_nothing(cluster_factory, real_slices):
    cluster, agent = cluster_factory("c1")
    nodes = [{"name": "h100-hgx-node-01", "labels": {"topology.kubernetes.io/zone": "a"}}]
    first = push(agent, "c1", {"resourceSlices": real_slices, "nodes": nodes}).json()
    cluster.refresh_from_db()
    version = cluster.inventory_version
    assert first["changed"] and version == 1
    same = push(agent, "c1", {"resourceSlices": real_slices, "nodes": nodes}).json()
    cluster.refresh_from_db()
    assert same["changed"] is False and cluster.inventory_version == version
    smaller = push(agent, "c1", {"resourceSlices": real_slices[:2]}).json()
    assert smaller["resourceSlices"] == {"created": 0, "updated": 0, "deleted": 14, "unchanged": 2}
    assert set(Node.objects.values_list("name", flat=True)) == {"h100-hgx-node-01"}
    # The push listed no nodes: the node its slices name stays, with the labels it had.
    assert Node.objects.get().labels == {"topology.kubernetes.io/zone": "a"}
    assert Device.objects.count() == 10 and Pool.objects.count() == 2
    cluster.refresh_from_db()
    assert cluster.inventory_version == version + 1 and cluster.last_sync_at is not None


def test_devices_link_to_pushed_nodes(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    push(agent, "c1", {"resourceSlices": real_slices[:1],
                       "nodes": [{"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": "h100-hgx-node-01", "labels": {"rack": "r1"}, "uid": "x"}}]})
    device = Device.objects.select_related("node").first()
    assert device.node.name == "h100-hgx-node-01" and device.node.labels == {"rack": "r1"}


def test_a_bad_object_rejects_the_whole_push_with_its_field_path(cluster_factory, real_slices):
    cluster, agent = cluster_factory("c1")
    assert push(agent, "c1", {"resourceSlices": real_slices[:2]}).status_code == 200
    cluster.refresh_from_db()
    before = (cluster.inventory_version, cluster.last_sync_at, ResourceSlice.objects.count(), Device.objects.count())
    bad = copy.deepcopy(real_slices)
    bad[3]["spec"]["devices"][5]["attributes"]["bad name!"] = {"string": "x"}
    resp = push(agent, "c1", {"resourceSlices": bad, "nodes": [{"name": "n1", "labels": {}}]})
    assert resp.status_code == 422
    assert resp["Content-Type"] == "application/problem+json"
    problem = resp.json()
    assert problem["errors"][0]["field"] == "resourceSlices[3].spec.devices[5].attributes"
    assert "C identifier" in problem["errors"][0]["reason"]
    cluster.refresh_from_db()
    after = (cluster.inventory_version, cluster.last_sync_at, ResourceSlice.objects.count(), Device.objects.count())
    assert after == before and not Node.objects.filter(name="n1").exists()


def test_a_database_failure_mid_push_leaves_nothing(cluster_factory, real_slices, monkeypatch):
    from inventory.services import sync

    _, agent = cluster_factory("c1")

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(sync, "_write_pools", explode)
    with pytest.raises(RuntimeError):
        push(agent, "c1", {"resourceSlices": real_slices})
    assert ResourceSlice.objects.count() == 0 and Device.objects.count() == 0 and Node.objects.count() == 0


def test_problem_lists_every_error_and_duplicates(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    body = {"resourceSlices": [real_slices[0], real_slices[0]], "nodes": [{"name": "UPPER"}], "extra": []}
    errors = {e["field"] for e in push(agent, "c1", body).json()["errors"]}
    assert errors == {"resourceSlices[1].metadata.name", "nodes[0].name", "extra"}


def test_push_never_500s_on_garbage(cluster_factory):
    _, agent = cluster_factory("c1")
    for body in ([1, 2], {"resourceSlices": "x"}, {"resourceSlices": [None, 3, {"kind": "Pod"}]}, "text",
                 {"kind": "List", "items": [{"kind": "Secret"}]}):
        resp = push(agent, "c1", body)
        assert 400 <= resp.status_code < 500, (body, resp.status_code)
    resp = agent.put("/api/v1/clusters/c1/inventory", b"{not json", content_type="application/json")
    assert resp.status_code == 400 and resp["Content-Type"] == "application/problem+json"


def test_yaml_push_and_kubernetes_list(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    docs = yaml.safe_dump_all(real_slices[:3] + [{"apiVersion": "v1", "kind": "Node",
                                                  "metadata": {"name": "h100-hgx-node-01"}}])
    resp = agent.put("/api/v1/clusters/c1/inventory", docs, content_type="application/yaml")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["resourceSlices"]["created"] == 3 and resp.json()["nodes"]["created"] >= 1
    one = yaml.safe_dump(to_v1beta1(real_slices[4]))
    name = real_slices[4]["metadata"]["name"]
    resp = agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", one, content_type="application/yaml")
    assert resp.status_code == 201 and resp.json() == real_slices[4]
    as_yaml = agent.get(f"/api/v1/clusters/c1/resourceslices/{name}", HTTP_ACCEPT="application/yaml")
    assert yaml.safe_load(as_yaml.content) == real_slices[4]
    listed = push(agent, "c1", {"apiVersion": "v1", "kind": "List", "items": real_slices[:1]}).json()
    assert listed["resourceSlices"]["deleted"] == 3


def test_incremental_slice_and_node_endpoints(cluster_factory, real_slices):
    cluster, agent = cluster_factory("c1")
    obj = copy.deepcopy(real_slices[0])
    name = obj["metadata"]["name"]
    del obj["metadata"]["name"]  # taken from the URL
    created = agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", obj, format="json")
    assert created.status_code == 201
    etag = created["ETag"]
    unchanged = agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", obj, format="json", HTTP_IF_MATCH=etag)
    assert unchanged.status_code == 200 and unchanged["ETag"] == etag
    obj["spec"]["pool"]["generation"] = 2
    stale = agent.put(f"/api/v1/clusters/c1/resourceslices/{name}", obj, format="json", HTTP_IF_MATCH='"nope"')
    assert stale.status_code == 412
    mismatch = agent.put("/api/v1/clusters/c1/resourceslices/other", {**obj, "metadata": {"name": name}},
                         format="json")
    assert mismatch.status_code == 422 and mismatch.json()["errors"][0]["field"] == "metadata.name"
    node = agent.put("/api/v1/clusters/c1/nodes/h100-hgx-node-01", {"labels": {"zone": "b"}}, format="json")
    assert node.status_code == 200 and node.json()["labels"] == {"zone": "b"}  # the slice had created it
    assert agent.get("/api/v1/clusters/c1/nodes/h100-hgx-node-01").json()["labels"] == {"zone": "b"}
    assert agent.delete("/api/v1/clusters/c1/nodes/h100-hgx-node-01").status_code == 204
    assert Device.objects.filter(node__isnull=True).count() == 8
    assert agent.delete(f"/api/v1/clusters/c1/resourceslices/{name}").status_code == 204
    assert Device.objects.count() == 0 and Pool.objects.count() == 0
    assert agent.delete(f"/api/v1/clusters/c1/resourceslices/{name}").status_code == 404
    cluster.refresh_from_db()
    assert cluster.inventory_version == 4


def test_heartbeat_records_agent_status(cluster_factory):
    cluster, agent = cluster_factory("c1")
    resp = agent.post("/api/v1/clusters/c1/heartbeat", {"agentVersion": "0.3.1", "synced": True,
                                                        "syncLagSeconds": 0.2}, format="json")
    assert resp.status_code == 200 and resp.json()["stale"] is False
    cluster.refresh_from_db()
    assert cluster.agent_version == "0.3.1" and cluster.agent_status["synced"] is True
    assert cluster.last_heartbeat_at is not None


def test_changes_signal_after_commit_only(cluster_factory, real_slices, django_capture_on_commit_callbacks):
    _, agent = cluster_factory("c1")
    seen = []

    def receiver(**kwargs):
        seen.append(kwargs)

    inventory_changed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            push(agent, "c1", {"resourceSlices": real_slices[:1]})
        with django_capture_on_commit_callbacks(execute=True):
            bad = copy.deepcopy(real_slices[:1])
            bad[0]["spec"]["driver"] = "!"
            assert push(agent, "c1", {"resourceSlices": bad}).status_code == 422
    finally:
        inventory_changed.disconnect(receiver)
    assert [(s["cluster"], s["reason"], s["inventory_version"]) for s in seen] == [("c1", "sync", 1)]


def test_push_is_bulk_not_per_device(cluster_factory, real_slices):
    _, agent = cluster_factory("c1")
    with CaptureQueriesContext(connection) as ctx:
        assert push(agent, "c1", {"resourceSlices": real_slices}).status_code == 200
    assert len(ctx.captured_queries) < 40, len(ctx.captured_queries)  # 248 devices, 16 slices, 8 pools


# ------------------------------------------------------------------------------------------- token scoping

@pytest.mark.parametrize("method,path,body", [
    ("put", "/api/v1/clusters/c2/inventory", {"resourceSlices": []}),
    ("put", "/api/v1/clusters/c2/resourceslices/s", {}),
    ("delete", "/api/v1/clusters/c2/resourceslices/s", None),
    ("put", "/api/v1/clusters/c2/nodes/n", {"labels": {}}),
    ("post", "/api/v1/clusters/c2/heartbeat", {}),
])
def test_a_cluster_token_cannot_write_another_cluster(cluster_factory, method, path, body):
    _, agent1 = cluster_factory("c1")
    cluster_factory("c2")
    resp = getattr(agent1, method)(path, body, format="json")
    assert resp.status_code == 403
    assert resp["Content-Type"] == "application/problem+json"


def test_who_may_write_what(cluster_factory, admin_client, real_slices):
    cluster_factory("c1")
    _, ro_admin = issue_token(kind=APIToken.ADMIN, read_only=True)
    _, tenant = issue_token(kind=APIToken.NAMESPACE, namespaces=["team-a"])
    body = {"resourceSlices": real_slices[:1]}
    assert push(admin_client, "c1", body).status_code == 200
    assert push(client_for(ro_admin), "c1", body).status_code == 403
    assert push(client_for(tenant), "c1", body).status_code == 403
    assert client_for(tenant).get("/api/v1/devices").status_code == 200  # tenants see the inventory
    _, agent = issue_token(kind=APIToken.CLUSTER, cluster=Cluster.objects.get(name="c1"))
    assert client_for(agent).post("/api/v1/clusters", {"name": "c9"}, format="json").status_code == 403
    assert push(admin_client, "missing", body).status_code == 404


def test_expired_cluster_token_gets_401(db):
    from datetime import timedelta

    cluster = Cluster.objects.create(name="c1")
    _, secret = issue_token(kind=APIToken.CLUSTER, cluster=cluster, expires_in=timedelta(seconds=-5))
    resp = push(client_for(secret), "c1", {"resourceSlices": []})
    assert resp.status_code == 401 and "expired" in resp.json()["detail"]
