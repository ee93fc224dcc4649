"""Every unit counted by reclaim (issue: every queue promise holds): a queue whose quota counts MIG memory (a
counter, not devices) reclaims from a queue that borrowed it. Real rounds and passes in this process."""
from __future__ import annotations

import pytest

from claims.models import Phase, ResourceClaim
from queues.models import Preemption
from scheduler.services import reclaim
from scheduler.services.allocation import allocate_round
from tests.claims import fleet as fleet_helpers
from tests.claims.fleet import gpu_claim
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, ns

pytestmark = pytest.mark.django_db
MIG = "mig.nvidia.com"


@pytest.fixture
def mig_fleet(db):
    """One A100 node: 8 GPUs of 80384Mi, each partitionable into MIG devices that consume its memory."""
    return fleet_helpers.load_fleet({"c1": [("a100-mig", 1)]})


def mig(client, namespace: str, name: str, profile: str) -> None:
    body = gpu_claim(name, 1, device_class=MIG)
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'}}]
    resp = client.post(f"{ns(namespace)}/resourceclaims", body, format="json")
    assert resp.status_code == 201, resp.content


def test_a_mig_memory_quota_reclaims_from_a_borrower(admin_client, mig_fleet):
    """``default`` (nominal 0) holds every A100 whole (8 x 7g.80gb: all the MIG memory). team-m (80Gi of MIG
    memory, no device count) asks for two 3g.40gb (2 x 40192Mi, within its 80Gi): one victim frees a GPU
    that holds both, and both run."""
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 0}}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-m", namespaces=["m"], quotas=[
        {"deviceClassName": MIG, "counters": {"memory": {"nominal": "80Gi"}}}]))
    for i in range(8):
        mig(admin_client, "ci", f"whole{i}", "7g.80gb")
    allocate_round()
    assert ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED).count() == 8
    mig(admin_client, "m", "half0", "3g.40gb")
    mig(admin_client, "m", "half1", "3g.40gb")
    allocate_round()
    assert set(ResourceClaim.objects.filter(namespace__name="m").values_list("reason", flat=True)) == {
        "Unsatisfiable"}
    out = reclaim.run()
    assert (out["victims"], out["requeued"]) == (1, 1), out
    assert set(Preemption.objects.values_list("victim__namespace__name", flat=True)) == {"ci"}
    allocate_round()
    assert ResourceClaim.objects.filter(namespace__name="m", phase=Phase.ALLOCATED).count() == 2
    assert ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED).count() == 7
    assert reclaim.run()["victims"] == 0  # team-m is at 78.5Gi of its 80Gi: nothing more to reclaim


def test_a_second_partition_arriving_after_the_notice_takes_no_victim_of_its_own(admin_client, mig_fleet):
    """As above, but half1 arrives after the pass that noticed a victim for half0, while that notice runs
    (grace 300 s): the victim's GPU holds both partitions, so the next pass gives half1 no victim; once the
    victim has stopped, both run, on 1 notice in all."""
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 300}}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-m", namespaces=["m"], quotas=[
        {"deviceClassName": MIG, "counters": {"memory": {"nominal": "80Gi"}}}]))
    for i in range(8):
        mig(admin_client, "ci", f"whole{i}", "7g.80gb")
    allocate_round()
    mig(admin_client, "m", "half0", "3g.40gb")
    allocate_round()
    assert reclaim.run()["victims"] == 1
    mig(admin_client, "m", "half1", "3g.40gb")
    allocate_round()
    assert ResourceClaim.objects.get(name="half1").reason == "Unsatisfiable"
    assert reclaim.run()["victims"] == 0
    victim = Preemption.objects.get().victim.name
    resp = admin_client.post(f"{ns('ci')}/resourceclaims/{victim}/release-confirm", {}, format="json")
    assert resp.status_code in (200, 202), resp.content
    allocate_round()
    assert ResourceClaim.objects.filter(namespace__name="m", phase=Phase.ALLOCATED).count() == 2
    assert Preemption.objects.count() == 1


def test_a_per_cluster_quota_reclaims_from_a_borrower(admin_client, h100_fleet):
    """team-a's nominal is for the clusters labelled region=eu only (``clusterSelector``): its 4-GPU claim
    reclaims exactly 4 of the 16 one-GPU claims ``default`` borrows (such quotas were skipped)."""
    from tests.queues.test_admission import submit
    from tests.queues.test_preemption import borrowed_fleet

    borrowed_fleet(admin_client, grace=0)
    resp = admin_client.patch("/api/v1/queues/team-a", {"spec": {"quotas": [
        {"deviceClassName": "gpu.nvidia.com", "clusterSelector": {"matchLabels": {"region": "eu"}},
         "devices": {"nominal": 8}}]}}, format="json")
    assert resp.status_code == 200, resp.content
    submit(admin_client, "a", "mine", 4)
    allocate_round()
    out = reclaim.run()
    assert (out["victims"], out["requeued"]) == (4, 4), out
    allocate_round()
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
