"""End to end: the real agent between the test Kubernetes API server and the real service on PostgreSQL.

What is asserted is what the service ends up holding (read from its database and its API), compared
with what the cluster holds - not which calls the agent made."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import urllib3

from agent import metrics
from inventory.models import Cluster, DeviceClass, Node, ResourceSlice
from tests.agent.conftest import GPU_CLASS, kube_client_for, node, wait_for
from tests.agent.kube_api import KubeAPIServer
from tests.agent.outage import OutageProxy
from tests.live import free_port

pytestmark = pytest.mark.django_db(transaction=True)
CLUSTER = "kind-east"


def service_slices() -> dict[str, dict]:
    return {r.name: r.object for r in ResourceSlice.objects.filter(cluster__name=CLUSTER)}


def service_nodes() -> dict[str, dict]:
    return {n.name: n.labels for n in Node.objects.filter(cluster__name=CLUSTER)}


def cluster_slices(kube_api) -> dict[str, dict]:
    return {name: obj for (_, name), obj in kube_api.objects["resourceslices"].items()}


def in_agreement(kube_api) -> bool:
    """The service holds exactly the cluster's slices (same specs) and nodes (same labels)."""
    ours = service_slices()
    theirs = cluster_slices(kube_api)
    if ours.keys() != theirs.keys() or any(ours[n]["spec"] != theirs[n]["spec"] for n in theirs):
        return False
    return service_nodes() == {name: o["metadata"]["labels"] for (_, name), o in kube_api.objects["nodes"].items()}


def settled(agent, kube_api) -> bool:
    """The service agrees with the cluster and the agent has nothing pending or in flight."""
    return agent.inventory.in_sync() and in_agreement(kube_api)


def pushes(kind: str, outcome: str = "ok") -> float:
    return metrics.REGISTRY.get_sample_value("draservice_agent_pushes_total", {"kind": kind, "outcome": outcome}) or 0


def populate(kube_api, slices):
    for name in sorted({s["spec"]["nodeName"] for s in slices if s["spec"].get("nodeName")}):
        kube_api.create("nodes", node(name, **{"topology.kubernetes.io/zone": "east-1a"}))
    for s in slices:
        kube_api.create("resourceslices", s)
    kube_api.create("deviceclasses", GPU_CLASS)


def test_a_clusters_slices_appear_in_the_service(kube_api, slices, start_agent, live_server, cluster_token):
    populate(kube_api, slices)
    agent = start_agent()
    wait_for(lambda: in_agreement(kube_api), message="the first full sync")
    assert len(service_slices()) == len(slices) == 16
    assert DeviceClass.objects.filter(cluster__name=CLUSTER, name="gpu.nvidia.com").exists()
    # The service's own API shows the same inventory to the agent's token.
    http = urllib3.PoolManager()
    resp = http.request("GET", f"{live_server.url}/api/v1/clusters/{CLUSTER}/inventory",
                        headers={"Authorization": f"Bearer {cluster_token[1]}", "Connection": "close"})
    assert resp.status == 200
    assert sorted(s["metadata"]["name"] for s in resp.json()["resourceSlices"]) == sorted(cluster_slices(kube_api))
    # ... and the heartbeat reached it, with the agent's view of its own health.
    wait_for(lambda: Cluster.objects.get(name=CLUSTER).agent_status.get("synced") is True,
             message="a heartbeat after the sync")
    status = Cluster.objects.get(name=CLUSTER).agent_status
    assert status["synced"] is True and status["kubernetesVersion"] == "v1.34.1-test"
    assert status["apiVersions"]["resourceslices"] == "resource.k8s.io/v1"
    assert agent.inventory.last_full_sync is not None


def test_changed_added_and_deleted_slices_and_nodes_follow(kube_api, slices, start_agent):
    populate(kube_api, slices[:6])
    agent = start_agent()
    wait_for(lambda: settled(agent, kube_api), message="the first full sync")
    full_before = pushes("full")

    # A driver republishes a slice with fewer devices, adds one, withdraws another; a node is relabelled.
    changed = kube_api.get("resourceslices", slices[3]["metadata"]["name"])
    changed["spec"]["devices"] = changed["spec"]["devices"][:3]
    kube_api.update("resourceslices", changed)
    kube_api.create("resourceslices", slices[6])
    kube_api.delete("resourceslices", slices[4]["metadata"]["name"])
    n = kube_api.get("nodes", "a100-dgx-node-01")
    n["metadata"]["labels"]["nvidia.com/gpu.present"] = "true"
    kube_api.update("nodes", n)

    wait_for(lambda: settled(agent, kube_api), message="the changes")
    assert len(service_slices()[slices[3]["metadata"]["name"]]["spec"]["devices"]) == 3
    assert slices[4]["metadata"]["name"] not in service_slices()
    assert service_nodes()["a100-dgx-node-01"]["nvidia.com/gpu.present"] == "true"
    assert pushes("full") == full_before, "changes are pushed one by one, not as a full sync"
    assert agent.inventory.lag() == 0.0


def test_a_node_status_update_is_not_pushed(kube_api, slices, start_agent):
    populate(kube_api, slices[:1])
    agent = start_agent()
    wait_for(lambda: settled(agent, kube_api), message="the first full sync")
    before = pushes("node")
    n = kube_api.get("nodes", "h100-hgx-node-01")
    n["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"  # the kubelet's update
    kube_api.update("nodes", n)
    n["metadata"]["labels"]["touched"] = "yes"  # then a real change, to know the first has been seen
    kube_api.update("nodes", n)
    wait_for(lambda: service_nodes()["h100-hgx-node-01"].get("touched") == "yes", message="the label")
    wait_for(lambda: settled(agent, kube_api), message="the push to complete")
    assert pushes("node") == before + 1


def test_410_relist_finds_what_the_watch_missed(kube_api, slices, start_agent):
    populate(kube_api, slices[:5])
    agent = start_agent()
    wait_for(lambda: settled(agent, kube_api), message="the first full sync")
    path = "/apis/resource.k8s.io/v1/resourceslices"
    lists_before = kube_api.count("GET", path, watch=None)
    # History is compacted while two changes happen that no watch will ever deliver.
    with kube_api.cond:
        kube_api.delete("resourceslices", slices[0]["metadata"]["name"])
        kube_api.create("resourceslices", slices[7])
        kube_api.expire_watches()
    wait_for(lambda: settled(agent, kube_api), message="agreement after the relist")
    assert kube_api.count("GET", path, watch=None) == lists_before + 1
    assert slices[0]["metadata"]["name"] not in service_slices()


def test_a_service_outage_is_survived_without_losing_changes(kube_api, slices, start_agent, live_server):
    populate(kube_api, slices[:6])
    host, port = live_server.url.removeprefix("http://").split(":")
    proxy = OutageProxy(host, int(port)).up()
    try:
        agent = start_agent(service_url=proxy.url)
        wait_for(lambda: settled(agent, kube_api), message="the first full sync")

        proxy.down()
        retries_before = pushes("slice", "retry") + pushes("node", "retry")
        # During the outage: a slice changes twice, one appears, one is created and deleted again,
        # one disappears, a node gets a label.
        s1 = kube_api.get("resourceslices", slices[1]["metadata"]["name"])
        s1["spec"]["devices"] = s1["spec"]["devices"][:1]
        kube_api.update("resourceslices", s1)
        s1["spec"]["devices"] = []
        kube_api.update("resourceslices", s1)
        kube_api.create("resourceslices", slices[8])
        kube_api.create("resourceslices", slices[9])
        kube_api.delete("resourceslices", slices[9]["metadata"]["name"])
        kube_api.delete("resourceslices", slices[2]["metadata"]["name"])
        n = kube_api.get("nodes", "a100-dgx-node-01")
        n["metadata"]["labels"]["maintenance"] = "planned"
        kube_api.update("nodes", n)
        wait_for(lambda: pushes("slice", "retry") + pushes("node", "retry") > retries_before,
                 message="a failed push")
        assert not in_agreement(kube_api)
        wait_for(lambda: agent.inventory.lag() > 0.3, message="the lag to grow")
        assert agent.inventory.pending() >= 4

        proxy.up()
        wait_for(lambda: settled(agent, kube_api), message="agreement after the outage")
        assert service_slices()[slices[1]["metadata"]["name"]]["spec"]["devices"] == []
        assert slices[9]["metadata"]["name"] not in service_slices()
        wait_for(lambda: agent.inventory.pending() == 0 and agent.inventory.lag() == 0.0, message="no lag")
    finally:
        proxy.down()


def test_the_service_down_at_start_gets_the_full_state_when_it_comes_up(kube_api, slices, start_agent, live_server):
    populate(kube_api, slices[:4])
    host, port = live_server.url.removeprefix("http://").split(":")
    proxy = OutageProxy(host, int(port)).up()
    proxy.down()
    try:
        before = pushes("full", "retry")
        agent = start_agent(service_url=proxy.url)
        wait_for(lambda: pushes("full", "retry") > before and agent.inventory.synced, message="a refused full sync")
        kube_api.create("resourceslices", slices[10])
        kube_api.delete("resourceslices", slices[0]["metadata"]["name"])
        proxy.up()
        wait_for(lambda: in_agreement(kube_api), message="agreement once the service is up")
    finally:
        proxy.down()


def test_an_older_cluster_syncs_and_gets_allocations_through_v1beta1(transactional_db, slices, cluster_token,
                                                                     live_server, tmp_path):
    """A 1.32 cluster serves resource.k8s.io/v1beta1 only: the agent reads and writes that version and
    the service converts (per-device fields under ``basic``, flat claim requests)."""
    from agent.claims import MARK
    from agent.runner import Agent, Settings
    from agent.service import ServiceClient, TokenSource
    from tests.agent.conftest import FAST

    server = KubeAPIServer(versions=("v1beta1",), token="agent-service-account-token").start()
    agent = None
    try:
        server.create("nodes", node("h100-hgx-node-01"))
        for s in slices[:3]:
            server.create("resourceslices", to_v1beta1(s))
        server.create("deviceclasses", {**GPU_CLASS, "apiVersion": "resource.k8s.io/v1beta1"})
        agent = Agent(kube_client_for(server, tmp_path),
                      ServiceClient(live_server.url, CLUSTER, TokenSource(token=cluster_token[1])), Settings(**FAST))
        agent.start()
        wait_for(lambda: len(service_slices()) == 3, message="the v1beta1 slices")
        # The service stored the v1 form: the same devices as the v1 originals.
        for original in slices[:3]:
            assert service_slices()[original["metadata"]["name"]]["spec"] == original["spec"]

        server.create("resourceclaims", {
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "metadata": {"name": "old-style", "namespace": "team-b", "annotations": {MARK: "true"}},
            "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}})
        path = "/apis/resource.k8s.io/v1beta1/namespaces/team-b/resourceclaims/old-style/status"
        wait_for(lambda: (server.get("resourceclaims", "old-style", "team-b").get("status") or {}).get("allocation"),
                 message="the allocation written back")
        assert server.count("PUT", path) == 1
        results = server.get("resourceclaims", "old-style", "team-b")["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2 and all(r["pool"] == "h100-hgx-node-01" for r in results)
    finally:
        if agent:
            agent.stop()
        server.close()


def test_once_mode_from_the_command_line(kube_api, slices, cluster_token, live_server, tmp_path):
    """The console entry point, as an operator runs it to check a set-up: one full sync, exit 0."""
    populate(kube_api, slices[:2])
    kube_client_for(kube_api, tmp_path)  # writes tmp_path/kubeconfig
    token_file = tmp_path / "token"
    token_file.write_text(cluster_token[1] + "\n")
    env = {**os.environ, "DRASERVICE_URL": live_server.url, "DRASERVICE_CLUSTER": CLUSTER,
           "DRASERVICE_TOKEN_FILE": str(token_file), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    env.pop("DRASERVICE_TOKEN", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "agent", "--once"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 0, proc.stderr
    assert "full sync pushed: 2 resourceslices, 1 nodes, 1 deviceclasses" in proc.stderr
    assert sorted(service_slices()) == sorted(cluster_slices(kube_api))
    assert time.monotonic() - started < 30


def test_the_agent_process_serves_metrics_and_stops_cleanly_on_sigterm(kube_api, slices, cluster_token,
                                                                      live_server, tmp_path):
    """``python -m agent`` as the Deployment runs it: env configuration, a token file, the metrics port,
    and a graceful exit on SIGTERM (what the kubelet sends when the pod is stopped)."""
    import signal

    populate(kube_api, slices[:3])
    kube_client_for(kube_api, tmp_path)  # writes tmp_path/kubeconfig
    token_file = tmp_path / "token"
    token_file.write_text(cluster_token[1])
    port = free_port()
    env = {**os.environ, "DRASERVICE_URL": live_server.url, "DRASERVICE_CLUSTER": CLUSTER,
           "DRASERVICE_TOKEN_FILE": str(token_file), "KUBECONFIG": str(tmp_path / "kubeconfig"),
           "DRASERVICE_METRICS_PORT": str(port), "DRASERVICE_METRICS_ADDRESS": "127.0.0.1",
           "DRASERVICE_HEARTBEAT_INTERVAL": "0.5", "DRASERVICE_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "agent"], env=env, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        wait_for(lambda: in_agreement(kube_api), timeout=30, message="the process's full sync")
        http = urllib3.PoolManager()

        def scraped() -> str:
            try:
                return http.request("GET", f"http://127.0.0.1:{port}/metrics").data.decode()
            except urllib3.exceptions.HTTPError:
                return ""
        wait_for(lambda: 'draservice_agent_pushes_total{kind="full",outcome="ok"} 1.0' in scraped(),
                 message="the pushes metric")
        assert "draservice_agent_sync_lag_seconds 0.0" in scraped()
        wait_for(lambda: Cluster.objects.get(name=CLUSTER).agent_version != "", message="a heartbeat")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
    messages = [entry["msg"] for entry in lines]
    assert any(m.startswith("full sync pushed: 3 resourceslices") for m in messages), messages
    assert messages[-1] == "stopped" and any("SIGTERM" in m for m in messages)


def test_a_wrong_token_is_reported_and_retried(kube_api, slices, start_agent, cluster_token, caplog):
    populate(kube_api, slices[:1])
    from draservice.models import APIToken

    APIToken.objects.filter(cluster__name=CLUSTER).delete()  # the token is revoked
    before = pushes("full", "retry")  # the counters are the process's, shared by all tests
    agent = start_agent()
    wait_for(lambda: pushes("full", "retry") > before, message="a refused push")
    assert any("401" in r.getMessage() or "403" in r.getMessage() for r in caplog.records
               if r.name == "agent.inventory"), [r.getMessage() for r in caplog.records]
    assert agent.inventory.pending() >= 1  # kept for when the operator fixes the token


def test_one_object_the_service_refuses_does_not_block_the_rest(kube_api, slices, start_agent, caplog):
    # A slice with a field from a newer Kubernetes than the service knows: the service refuses it.
    populate(kube_api, slices[:4])
    future = copy.deepcopy(slices[5])
    future["spec"]["devices"][0]["someFieldFromKubernetes137"] = True
    kube_api.create("resourceslices", future)
    # ... and a slice the service holds from an earlier run, deleted from the cluster since.
    from inventory.services.sync import put_resource_slice

    put_resource_slice(CLUSTER, slices[6]["metadata"]["name"], slices[6])
    agent = start_agent()
    wanted = {n for n in cluster_slices(kube_api) if n != future["metadata"]["name"]}
    wait_for(lambda: set(service_slices()) == wanted and agent.inventory.in_sync(), message="the other slices")
    assert any("REJECTED" in r.getMessage() and future["metadata"]["name"] in r.getMessage()
               and "someFieldFromKubernetes137" in r.getMessage() for r in caplog.records)


def test_a_token_file_that_appears_late_and_is_rotated_is_picked_up(kube_api, slices, cluster_token, live_server,
                                                                   tmp_path):
    """The Secret is mounted after the agent starts, first with a wrong token; fixing the Secret is
    enough - no restart - and nothing that changed meanwhile is lost."""
    from agent.runner import Agent, Settings
    from agent.service import ServiceClient, TokenSource
    from tests.agent.conftest import FAST

    populate(kube_api, slices[:2])
    token_file = tmp_path / "secret" / "token"
    service = ServiceClient(live_server.url, CLUSTER, TokenSource(path=str(token_file)), timeout=10)
    agent = Agent(kube_client_for(kube_api, tmp_path), service, Settings(**FAST))
    agent.start()
    try:
        wait_for(lambda: agent.inventory.synced
                 and "cannot read the service token" in (agent.inventory.last_error or ""),
                 message="the missing token to be reported")
        token_file.parent.mkdir()
        token_file.write_text("dra_wrong_token")
        wait_for(lambda: "401" in (agent.inventory.last_error or ""), message="the wrong token to be refused")
        kube_api.create("nodes", node("a100-dgx-node-01"))  # a new node and its slice, during the outage
        kube_api.create("resourceslices", slices[2])
        token_file.write_text(cluster_token[1] + "\n")
        wait_for(lambda: settled(agent, kube_api), message="the sync with the right token")
    finally:
        agent.stop()


def to_v1beta1(obj: dict) -> dict:
    """The same slice as a 1.32 cluster serves it: per-device fields under ``basic``."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    if "devices" in out["spec"]:
        out["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                  for d in out["spec"]["devices"]]
    return out
