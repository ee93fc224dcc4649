"""Safe release of preemption victims, in this process: forceAfterSeconds, stopBy and forceAt, the confirmations
(release-confirm, the /k8s annotation, an agent's report, NoConsumer at stopBy) and what they do. The same with the
real agent and workers: tests/agent/test_safe_release.py."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import ClaimEvent, Consumer, DeviceAllocation, Phase, Reservation, ResourceClaim
from inventory.models import Cluster
from queues.models import Preemption, PreemptionState
from scheduler.services import preemption, reclaim
from tests.chaos.checks import early_handovers
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, ns, rounds, submit
from tests.queues.test_preemption import borrowed_fleet

pytestmark = pytest.mark.django_db


def noticed(admin_client, grace=30, force=None) -> tuple[list[ResourceClaim], str]:
    """ci's 16 one-GPU claims borrow the fleet; ``a/mine`` (1 GPU) reclaims one: the victim, noticed."""
    borrowed_fleet(admin_client, grace=grace)
    if force is not None:
        assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {
            "graceSeconds": grace, "forceAfterSeconds": force}}}, format="json").status_code == 200
    submit(admin_client, "a", "mine", 1)
    rounds(1)
    assert reclaim.run()["victims"] == 1
    victim = ResourceClaim.objects.get(preemptions__state=PreemptionState.PENDING)
    return victim, f"{ns('ci')}/resourceclaims/{victim.name}"


@pytest.mark.parametrize("value", [10, -1, "60", True])
def test_force_after_seconds_below_grace_or_not_an_integer_is_a_400_naming_it(admin_client, value):
    resp = admin_client.post("/api/v1/queues", queue_body("q", namespaces=["q"], gpus=1, preemption={
        "graceSeconds": 30, "forceAfterSeconds": value}), format="json")
    assert resp.status_code in (400, 422), resp.content
    assert "spec.preemption.forceAfterSeconds" in resp.content.decode()


def test_force_after_seconds_defaults_to_grace_and_is_shown_when_set(admin_client, h100_fleet):
    make(admin_client, queue_body("q", namespaces=["q"], gpus=1, preemption={"graceSeconds": 30,
                                                                           "forceAfterSeconds": 300}))
    assert admin_client.get("/api/v1/queues/q").json()["spec"]["preemption"]["forceAfterSeconds"] == 300
    victim, _ = noticed(admin_client, grace=30)  # the default queue sets none: forced at stopBy
    p = Preemption.objects.get()
    assert p.deadline == p.stop_by


def test_a_victim_keeps_its_devices_shows_its_notice_and_cannot_renew(admin_client, h100_fleet):
    victim, url = noticed(admin_client, grace=30, force=600)
    p = Preemption.objects.get()
    assert (p.deadline - p.stop_by) == timedelta(seconds=570)
    status = admin_client.get(url).json()["status"]
    assert status["phase"] == "Allocated" and set(status["preemption"]) == {"stopBy", "forceAt"}
    assert any(c["type"] == "Releasing" and c["status"] == "True" for c in status["conditions"])
    assert admin_client.post(f"{url}/renew", {"ttl": "1h"}, format="json").status_code == 409
    assert preemption.sweep() == 0 and DeviceAllocation.objects.filter(claim=victim).count() == 1
    k8s = admin_client.get(f"/k8s/api/v1/namespaces/ci/resourceclaims/{victim.name}".replace(
        "/k8s/api/v1", "/k8s/apis/resource.k8s.io/v1")).json()
    assert k8s["status"]["preemption"] == status["preemption"]


def test_release_confirm_by_its_namespace_hands_over_and_another_tenant_gets_403(admin_client, ns_client, h100_fleet):
    victim, url = noticed(admin_client, grace=30, force=600)
    assert ns_client("a").post(f"{url}/release-confirm", {}, format="json").status_code == 403
    assert ns_client("ci", read_only=True).post(f"{url}/release-confirm", {}, format="json").status_code == 403
    resp = ns_client("ci").post(f"{url}/release-confirm", {}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"]["preemption"]["confirmedBy"] == "namespace:ci"
    victim.refresh_from_db()
    assert victim.phase == Phase.PENDING and not DeviceAllocation.objects.filter(claim=victim).exists()
    mine = ResourceClaim.objects.get(name="mine")
    assert mine.attempted_version is None  # woken: the next round places it
    rounds(1)
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
    assert preemption.sweep() == 0
    p = Preemption.objects.get()
    assert p.state == PreemptionState.DONE and p.confirmed_by == "namespace:ci" and p.confirmed_at is not None
    # The chaos test's check of this in SQL finds no early handover here, and would find one had it been early.
    assert early_handovers() == []
    Preemption.objects.update(confirmed_at=None, deadline=timezone.now() + timedelta(hours=1))
    assert [row[1:3] for row in early_handovers()] == [(victim.name, "mine")]
    Preemption.objects.update(confirmed_at=p.confirmed_at)
    # A retry is a no-op; a claim that is not being released has nothing to confirm.
    assert ns_client("ci").post(f"{url}/release-confirm", {}, format="json").status_code == 200
    other = ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED).first()
    assert admin_client.post(f"{ns('ci')}/resourceclaims/{other.name}/release-confirm").status_code == 409


def test_the_k8s_annotation_confirms_as_an_admin(admin_client, h100_fleet):
    victim, _ = noticed(admin_client, grace=30, force=600)
    path = f"/k8s/apis/resource.k8s.io/v1/namespaces/ci/resourceclaims/{victim.name}"
    obj = admin_client.get(path).json()
    obj["metadata"].setdefault("annotations", {})["draservice.io/release-confirm"] = "true"
    resp = admin_client.put(path, obj, format="json")
    assert resp.status_code == 200, resp.content
    victim.refresh_from_db()
    assert victim.phase == Phase.PENDING and victim.preemption["confirmedBy"] == "admin:test admin"
    assert "draservice.io/release-confirm" not in (victim.annotations or {})


def test_nothing_using_it_is_confirmed_at_stop_by_and_a_consumer_or_agent_waits_for_force_at(admin_client,
                                                                                                h100_fleet):
    victim, _ = noticed(admin_client, grace=30, force=600)
    assert preemption.sweep() == 0  # before stopBy
    Preemption.objects.update(stop_by=timezone.now())
    assert preemption.sweep() == 1
    victim.refresh_from_db()
    assert victim.phase == Phase.PENDING and victim.preemption["confirmedBy"] == "NoConsumer"
    assert Preemption.objects.get().confirmed_by == "NoConsumer"
    # A victim a consumer reserves: not at stopBy.
    submit(admin_client, "a", "mine2", 1)
    rounds(1)
    assert reclaim.run()["victims"] == 1
    p = Preemption.objects.get(preemptor__name="mine2")
    consumer = Consumer.objects.create(namespace=p.victim.namespace, name="job", spec={})
    Reservation.objects.create(claim=p.victim, consumer=consumer, entry="gpu")
    Preemption.objects.filter(pk=p.pk).update(stop_by=timezone.now())
    assert preemption.sweep() == 0
    # Nor when no consumer reserves it but an agent serves its cluster (it reports reservedFor itself).
    Reservation.objects.all().delete()
    Cluster.objects.update(last_heartbeat_at=timezone.now())
    assert preemption.sweep() == 0 and ResourceClaim.objects.get(pk=p.victim_id).phase == Phase.ALLOCATED
    Preemption.objects.filter(pk=p.pk).update(deadline=timezone.now())  # forceAt
    assert preemption.sweep() == 1
    p.refresh_from_db()
    assert p.state == PreemptionState.DONE and p.confirmed_at is None  # forced
    assert ResourceClaim.objects.get(pk=p.victim_id).phase == Phase.PENDING
    assert ClaimEvent.objects.filter(type="ReleaseConfirmed").count() == 1


def test_an_agent_report_needs_a_fresh_heartbeat_and_an_empty_reserved_for(admin_client, h100_fleet):
    from draservice.tokens import issue_token
    from tests.conftest import client_for

    victim, url = noticed(admin_client, grace=30, force=600)
    cluster = Cluster.objects.get(name="c1")
    _, secret = issue_token(kind="cluster", name="agent", cluster=cluster)
    agent = client_for(secret)
    stale = agent.post(f"{url}/release-confirm", {"reservedFor": []}, format="json")
    assert stale.status_code == 409 and "heartbeat" in stale.content.decode()
    Cluster.objects.update(last_heartbeat_at=timezone.now())
    bad = agent.post(f"{url}/release-confirm", {"reservedFor": "none"}, format="json")
    assert bad.status_code == 422 and "reservedFor" in bad.content.decode()
    busy = agent.post(f"{url}/release-confirm", {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
                      format="json")
    assert busy.status_code == 200 and ResourceClaim.objects.get(pk=victim.pk).phase == Phase.ALLOCATED
    done = agent.post(f"{url}/release-confirm", {"reservedFor": []}, format="json")
    assert done.status_code == 200 and done.json()["status"]["preemption"]["confirmedBy"] == "agent:c1"
    assert ResourceClaim.objects.get(pk=victim.pk).phase == Phase.PENDING


def test_the_claim_page_shows_the_notice_with_countdowns(admin_client, h100_fleet, client, django_user_model):
    victim, url = noticed(admin_client, grace=30, force=600)
    client.force_login(django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True))
    html = client.get(f"/claims/ci/{victim.name}/").content.decode()
    notice = victim.preemption
    assert 'data-testid="claim-preemption"' in html and f'data-countdown="{notice["forceAt"]}"' in html
    assert f'data-countdown="{notice["stopBy"]}"' in html and "not confirmed yet" in html
    assert ns_ok(admin_client, url)
    html = client.get(f"/claims/ci/{victim.name}/").content.decode()
    assert 'data-countdown="' not in html and "confirmed by <b>admin:test admin</b>" in html


def ns_ok(client, url: str) -> bool:
    return client.post(f"{url}/release-confirm").status_code == 200
