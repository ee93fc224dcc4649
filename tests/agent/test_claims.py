"""Claim write-back end to end: a ResourceClaim marked for the service in the test cluster is mirrored to
the real service, allocated there by the real engine (tasks run in-process), and the allocation is
written to the cluster's claim through the status subresource - then released when the claim goes."""
from __future__ import annotations

import copy

import pytest

from agent import metrics
from agent.claims import FINALIZER, MARK, SOURCE_UID
from claims.models import Phase, ResourceClaim
from tests.agent.conftest import wait_for
from tests.agent.test_deploy import rbac_misses
from tests.agent.test_sync import populate, settled

pytestmark = pytest.mark.django_db(transaction=True)
CLUSTER = "kind-east"


def claim(name: str, namespace: str = "team-a", marked: bool = True, count: int = 1) -> dict:
    annotations = {MARK: "true"} if marked else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


def service_claim(name: str, namespace: str = "team-a") -> ResourceClaim | None:
    return ResourceClaim.objects.filter(namespace__name=namespace, name=f"{CLUSTER}.{name}").first()


def cluster_claim(kube_api, name: str, namespace: str = "team-a") -> dict | None:
    return kube_api.get("resourceclaims", name, namespace)


def allocation_of(kube_api, name: str) -> dict | None:
    return ((cluster_claim(kube_api, name) or {}).get("status") or {}).get("allocation")


def counter(name: str, **labels) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0


@pytest.fixture
def running(kube_api, slices, start_agent):
    """The test cluster (NVIDIA H100 and A100 nodes, the gpu.nvidia.com class) with its agent in sync."""
    populate(kube_api, slices[:5])
    agent = start_agent()
    wait_for(lambda: settled(agent, kube_api), message="the inventory")
    return agent


def test_a_marked_claim_gets_its_allocation_written_back(kube_api, running):
    kube_api.create("resourceclaims", claim("train", count=2))
    wait_for(lambda: allocation_of(kube_api, "train") is not None, message="the write-back")

    remote = service_claim("train")
    assert remote.phase == Phase.ALLOCATED and remote.cluster == CLUSTER
    written = cluster_claim(kube_api, "train")
    # Exactly the engine's result, devices of this cluster's slices, and the release finalizer in place.
    assert written["status"]["allocation"] == remote.allocation
    results = written["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["driver"] for r in results} == {"gpu.nvidia.com"}
    cluster_devices = {(s["spec"]["pool"]["name"], d["name"]) for s in kube_api.objects["resourceslices"].values()
                       for d in s["spec"].get("devices") or []}
    assert all((r["pool"], r["device"]) in cluster_devices for r in results)
    assert FINALIZER in written["metadata"]["finalizers"]
    assert remote.annotations[SOURCE_UID] == written["metadata"]["uid"]
    # The write went through the status subresource, conditional on the resourceVersion read.
    assert kube_api.count("PUT", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train/status") == 1
    # And every request the agent made is granted by the ClusterRole in deploy/agent/agent.yaml.
    assert rbac_misses(kube_api.requests) == set()


def test_an_unmarked_claim_is_left_to_the_cluster(kube_api, running):
    kube_api.create("resourceclaims", claim("local", marked=False))
    kube_api.create("resourceclaims", claim("remote"))
    wait_for(lambda: allocation_of(kube_api, "remote") is not None, message="the marked claim")
    assert service_claim("local") is None
    assert allocation_of(kube_api, "local") is None
    assert not cluster_claim(kube_api, "local")["metadata"].get("finalizers")


def test_a_conflicting_status_write_is_reread_and_retried(kube_api, running):
    conflicts = counter("draservice_agent_claim_conflicts_total")

    def someone_else_writes_first(server, current):
        # Just before the agent's first status write lands, another client changes the claim: the
        # agent's resourceVersion is stale now and the API server must answer 409.
        server.status_hooks.remove(someone_else_writes_first)
        changed = copy.deepcopy(current)
        changed["metadata"].setdefault("labels", {})["team"] = "vision"
        server.update("resourceclaims", changed)

    kube_api.status_hooks.append(someone_else_writes_first)
    kube_api.create("resourceclaims", claim("contended"))
    wait_for(lambda: allocation_of(kube_api, "contended") is not None, message="the write-back")
    written = cluster_claim(kube_api, "contended")
    assert written["metadata"]["labels"] == {"team": "vision"}, "the other writer's change was lost"
    assert counter("draservice_agent_claim_conflicts_total") == conflicts + 1
    assert kube_api.count("PUT", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/contended/status") == 2


def test_deleting_the_claim_releases_it_in_the_service(kube_api, running):
    kube_api.create("resourceclaims", claim("short-lived"))
    wait_for(lambda: allocation_of(kube_api, "short-lived") is not None, message="the write-back")
    assert service_claim("short-lived").device_allocations.exists()

    kube_api.delete("resourceclaims", "short-lived", "team-a")
    # The finalizer holds the claim until the agent has released it; then it is gone everywhere.
    wait_for(lambda: cluster_claim(kube_api, "short-lived") is None, message="the claim to be deleted")
    assert service_claim("short-lived") is None
    from claims.models import DeviceAllocation

    assert not DeviceAllocation.objects.filter(claim__name=f"{CLUSTER}.short-lived").exists()


def test_removing_the_mark_releases_the_claim(kube_api, running):
    kube_api.create("resourceclaims", claim("changed-mind"))
    wait_for(lambda: service_claim("changed-mind") is not None, message="the mirror")
    current = cluster_claim(kube_api, "changed-mind")
    current["metadata"]["annotations"] = {}
    kube_api.update("resourceclaims", current)
    wait_for(lambda: service_claim("changed-mind") is None, message="the release")
    wait_for(lambda: not cluster_claim(kube_api, "changed-mind")["metadata"].get("finalizers"),
             message="the finalizer to go")
    # Marked again: mirrored and allocated afresh (not a replay of the first create).
    current = cluster_claim(kube_api, "changed-mind")
    current["metadata"]["annotations"] = {MARK: "true"}
    kube_api.update("resourceclaims", current)
    wait_for(lambda: allocation_of(kube_api, "changed-mind") is not None, message="the second write-back")
    assert service_claim("changed-mind").phase == Phase.ALLOCATED


def test_a_pending_claim_is_written_back_once_devices_free_up(kube_api, running):
    # The H100 node has eight GPUs: the first claim takes them all, the second has to wait...
    kube_api.create("resourceclaims", claim("all-eight", count=8))
    wait_for(lambda: allocation_of(kube_api, "all-eight") is not None, message="the first write-back")
    kube_api.create("resourceclaims", claim("waiting"))
    wait_for(lambda: service_claim("waiting") is not None, message="the second mirror")
    assert service_claim("waiting").phase == Phase.PENDING
    assert allocation_of(kube_api, "waiting") is None
    # ... until the first is deleted in the cluster: released in the service, its GPUs go to the second.
    kube_api.delete("resourceclaims", "all-eight", "team-a")
    wait_for(lambda: allocation_of(kube_api, "waiting") is not None, timeout=20, message="the second write-back")
    assert service_claim("waiting").phase == Phase.ALLOCATED
    assert cluster_claim(kube_api, "all-eight") is None


def test_the_sweep_releases_service_claims_whose_cluster_claim_vanished(kube_api, slices, start_agent):
    populate(kube_api, slices[:5])
    agent = start_agent(claim_sweep_period=0.5)
    wait_for(lambda: settled(agent, kube_api), message="the inventory")
    kube_api.create("resourceclaims", claim("orphan"))
    wait_for(lambda: allocation_of(kube_api, "orphan") is not None, message="the write-back")
    agent.stop()
    # While no agent runs, someone strips the finalizer and deletes the claim.
    current = cluster_claim(kube_api, "orphan")
    current["metadata"]["finalizers"] = []
    kube_api.update("resourceclaims", current)
    kube_api.delete("resourceclaims", "orphan", "team-a")
    assert service_claim("orphan") is not None
    start_agent(claim_sweep_period=0.5)
    wait_for(lambda: service_claim("orphan") is None, message="the sweep")


def test_an_allocation_the_service_takes_back_is_removed_unless_in_use(kube_api, slices, start_agent, caplog):
    from claims.services.claims import release_claim

    populate(kube_api, slices[:5])
    agent = start_agent(claim_sweep_period=0.3)
    wait_for(lambda: settled(agent, kube_api), message="the inventory")
    kube_api.create("resourceclaims", claim("idle"))
    kube_api.create("resourceclaims", claim("busy"))
    wait_for(lambda: allocation_of(kube_api, "idle") and allocation_of(kube_api, "busy"), message="write-backs")
    # A pod runs with "busy" (the scheduler reserved the claim for it).
    busy = cluster_claim(kube_api, "busy")
    busy["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer-0", "uid": "pod-uid-1"}]
    kube_api.update("resourceclaims", busy)

    # An admin releases both in the service: their devices are free there now.
    release_claim(service_claim("idle").pk)
    release_claim(service_claim("busy").pk)
    # The idle claim's allocation is withdrawn from the cluster, so no pod can start on devices the
    # service may give away; the busy one is kept (its pod is running) and that is reported loudly.
    wait_for(lambda: allocation_of(kube_api, "idle") is None, message="the idle allocation to go")
    wait_for(lambda: any("busy" in r.getMessage() and "still reserved" in r.getMessage() for r in caplog.records),
             message="the error about the busy claim")
    assert allocation_of(kube_api, "busy") is not None
