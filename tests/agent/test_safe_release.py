"""Safe release of preemption victims end to end: the real agent against its fake API server, the service's
rounds run by real Celery workers. A victim mirrored from the cluster keeps its devices while pods stay in its
``reservedFor`` (until ``forceAfterSeconds``), and hands them over within 2 s once the agent reports it empty or
its namespace confirms; another tenant may not confirm."""
from __future__ import annotations

import copy
import time

import pytest
from django.utils import timezone

from claims.models import ClaimEvent, Phase, ResourceClaim
from draservice.celery import app
from queues.models import Preemption, PreemptionState
from tests.agent.conftest import wait_for
from tests.agent.test_claims import allocation_of, claim, cluster_claim, service_claim
from tests.agent.test_sync import populate, settled
from tests.queues.conftest import queue_body
from usage.models import UsageInterval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WORKERS = 1  # read by the worker_pool fixture
PODS = [{"resource": "pods", "name": "trainer-0", "uid": "0f2d6c1e-pod-0"}]


@pytest.fixture
def victim(kube_api, slices, start_agent, live_broker, admin_client, settings):
    """One H100 node (8 GPUs) held whole by ``team-a/train`` (mirrored by the agent, in the default queue,
    which borrows them all; pods in its ``reservedFor``); queue ``qa`` (namespace ``a``, nominal 8) idle."""
    settings.ROOT_URLCONF = "draservice.urls"  # the queues' API too
    populate(kube_api, slices[:2])  # h100-hgx-node-01: 8 GPUs
    agent = start_agent()
    wait_for(lambda: settled(agent, kube_api), message="the inventory")

    def policy(force: int) -> None:
        assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {
            "graceSeconds": 1, "forceAfterSeconds": force}}}, format="json").status_code == 200
        assert admin_client.post("/api/v1/queues", queue_body("qa", namespaces=["a"], gpus=8),
                                 format="json").status_code == 201

    kube_api.create("resourceclaims", claim("train", count=8))
    wait_for(lambda: allocation_of(kube_api, "train") is not None, timeout=30, message="the write-back")
    held = copy.deepcopy(cluster_claim(kube_api, "train"))
    held["status"]["reservedFor"] = PODS  # the scheduler reserved it for its pod
    kube_api.update("resourceclaims", held)
    return policy


def kick_until(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        app.send_task("queues.tasks.preempt")
        time.sleep(0.2)


def handed_over_at(want: ResourceClaim):
    return UsageInterval.objects.filter(claim_id=want.id).order_by("started_at").values_list(
        "started_at", flat=True).first()


def noticed(admin_client) -> tuple:
    kick = ResourceClaim.objects.filter(name="want")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "want"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                          "count": 2}}]}}}
    assert admin_client.post("/api/v1/namespaces/a/resourceclaims", body, format="json").status_code == 201
    wait_for(lambda: kick.filter(reason="Unsatisfiable").exists(), timeout=30, message="the preemptor tried")
    kick_until(lambda: Preemption.objects.exists(), 30)
    p = Preemption.objects.get()
    victim = service_claim("train")
    assert victim.phase == Phase.ALLOCATED and victim.preemption["stopBy"] and victim.preemption["forceAt"]
    assert any(c["type"] == "Releasing" and c["status"] == "True" for c in victim.conditions)
    return p, kick.get()


def test_pods_in_reserved_for_keep_the_devices_until_force_after_seconds(kube_api, victim, admin_client):
    victim(force=6)
    p, want = noticed(admin_client)
    assert (p.deadline - p.stop_by).total_seconds() == 5  # forceAfterSeconds 6, graceSeconds 1, one notice time
    # Past stopBy the pods still run: the agent says so, the devices stay the victim's.
    time.sleep(3)
    app.send_task("queues.tasks.preempt")
    time.sleep(1)
    assert service_claim("train").phase == Phase.ALLOCATED
    assert ResourceClaim.objects.get(pk=want.pk).phase == Phase.PENDING
    kick_until(lambda: ResourceClaim.objects.get(pk=want.pk).phase == Phase.ALLOCATED, 15)
    p.refresh_from_db()
    assert p.state == PreemptionState.DONE and p.confirmed_at is None and p.confirmed_by == ""  # forced
    assert handed_over_at(want) >= p.deadline
    gone = service_claim("train")
    assert gone.phase == Phase.PENDING and gone.preemption["confirmedAt"] is None  # requeued (tried again since)
    # The pods still hold the cluster's claim: its allocation is kept there (and the agent says so loudly).
    assert allocation_of(kube_api, "train") is not None


def test_an_empty_reserved_for_hands_the_devices_over_within_2s(kube_api, victim, admin_client):
    victim(force=120)
    p, want = noticed(admin_client)
    freed = copy.deepcopy(cluster_claim(kube_api, "train"))
    freed["status"].pop("reservedFor")  # the pod ended
    kube_api.update("resourceclaims", freed)
    wait_for(lambda: ResourceClaim.objects.get(pk=want.pk).phase == Phase.ALLOCATED, timeout=10,
             message="the handover")
    report = ClaimEvent.objects.get(claim_id=service_claim("train").id, type="ReleaseConfirmed")
    assert report.data == {"confirmedBy": "agent:kind-east"}
    took = (handed_over_at(want) - report.created_at).total_seconds()
    assert 0 <= took <= 2, took
    assert timezone.now() < p.deadline  # long before forceAt
    kick_until(lambda: Preemption.objects.get().state == PreemptionState.DONE, 10)
    assert Preemption.objects.get().confirmed_by == "agent:kind-east"
    # The requeued claim's allocation is taken back from the cluster's claim: it waits to be allocated again.
    wait_for(lambda: allocation_of(kube_api, "train") is None, message="the allocation taken back")


def test_the_victims_namespace_confirms_and_another_tenant_may_not(kube_api, victim, admin_client, ns_client):
    victim(force=120)
    p, want = noticed(admin_client)
    url = f"/api/v1/namespaces/team-a/resourceclaims/{service_claim('train').name}/release-confirm"
    refused = ns_client("b").post(url, {}, format="json")
    assert refused.status_code == 403, refused.content
    assert service_claim("train").phase == Phase.ALLOCATED
    confirmed_at = timezone.now()
    resp = ns_client("team-a").post(url, {}, format="json")
    assert resp.status_code == 200, resp.content
    shown = resp.json()["status"]
    assert shown["phase"] == "Pending" and shown["preemption"]["confirmedBy"] == "namespace:team-a"
    assert set(shown["preemption"]) == {"stopBy", "forceAt", "confirmedAt", "confirmedBy"}
    wait_for(lambda: ResourceClaim.objects.get(pk=want.pk).phase == Phase.ALLOCATED, timeout=10,
             message="the handover")
    took = (handed_over_at(want) - confirmed_at).total_seconds()
    assert 0 <= took <= 2, took
    assert ns_client("team-a").post(url, {}, format="json").status_code == 200  # a retry is a no-op
