"""A placed gang is one preemption candidate (issue 30): all its members get a notice together or none, the
victim set stays inclusion-minimal at the gang's grain, ``minRuntimeSeconds`` runs from the gang's placement,
and the requeued gang is Pending again as a whole. Real rounds, gang placements and passes in this process."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import lifecycle
from queues.models import Preemption
from scheduler.services import gang_placement, reclaim
from scheduler.services.allocation import allocate_round
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, ns, submit

pytestmark = pytest.mark.django_db


def gang(client, namespace: str, name: str, replicas: int, per_member: int) -> None:
    template = f"{name}-x{per_member}"
    resp = client.post(f"{ns(namespace)}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": template},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": per_member}}]}}}}, format="json")
    assert resp.status_code == 201, resp.content
    resp = client.post(f"{ns(namespace)}/gangs", {
        "apiVersion": "draservice.io/v1alpha1", "kind": "Gang", "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"resourceClaims": [
            {"name": "gpus", "resourceClaimTemplateName": template}]}}}, format="json")
    assert resp.status_code == 201, resp.content


def place_gangs() -> None:
    while gang_placement.place_next().gang_id is not None:
        pass


def two_gangs_fill_the_fleet(client, min_runtime: int = 0) -> None:
    """``default`` (nominal 0) holds both 8-GPU nodes through two placed gangs of 2 x 4 GPUs (g1 the older
    placement); team-a has nominal 8, idle."""
    pre = {"graceSeconds": 0, "minRuntimeSeconds": min_runtime}
    assert client.patch("/api/v1/queues/default", {"spec": {"preemption": pre}}, format="json").status_code == 200
    make(client, queue_body("team-a", namespaces=["a"], gpus=8))
    for g in ("g1", "g2"):
        gang(client, "ci", g, 2, 4)
        place_gangs()
    assert set(Gang.objects.values_list("name", "phase")) == {("g1", GangPhase.PLACED), ("g2", GangPhase.PLACED)}
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 4
    # g1 placed an hour ago, g2 a minute ago (most recently started first: g2 is the first candidate).
    now = timezone.now()
    Gang.objects.filter(name="g1").update(placed_at=now - timedelta(hours=1))
    Gang.objects.filter(name="g2").update(placed_at=now - timedelta(minutes=1))


def test_a_gang_is_one_victim_with_its_whole_demand(admin_client, h100_fleet):
    """team-a asks for 4 GPUs: the victims are ONE gang (the most recently placed), both its members (2
    notices, 8 GPUs freed though 4 would do: half a gang is not a victim); the preemptor runs; the gang is
    Pending again as a whole, and the other gang keeps running."""
    two_gangs_fill_the_fleet(admin_client)
    submit(admin_client, "a", "want4", 4)
    allocate_round()
    assert ResourceClaim.objects.get(name="want4").reason == "Unsatisfiable"
    out = reclaim.run()  # grace 0: marked and requeued in this pass
    assert (out["preemptions"], out["victims"], out["requeued"], out["gangs_requeued"]) == (1, 2, 2, 1), out
    g2_claims = set(ResourceClaim.objects.filter(
        reservations__consumer__gang_member__gang__name="g2").values_list("name", flat=True))
    assert set(Preemption.objects.values_list("victim__name", flat=True)) == g2_claims and len(g2_claims) == 2
    g2 = Gang.objects.get(name="g2")
    assert (g2.phase, g2.reason, g2.placed_count, g2.waiting_count) == (GangPhase.PENDING, "Preempted", 0, 2)
    assert set(GangMember.objects.filter(gang=g2).values_list("phase", flat=True)) == {MemberPhase.PENDING}
    assert Gang.objects.get(name="g1").phase == GangPhase.PLACED
    allocate_round()
    assert ResourceClaim.objects.get(name="want4").phase == Phase.ALLOCATED
    # g2 does not fit beside the preemptor (4 GPUs free, it needs 8) and waits; the sweep loses nobody.
    place_gangs()
    lifecycle.sweep()
    assert Gang.objects.get(name="g2").phase == GangPhase.PENDING
    assert Gang.objects.get(name="g1").phase == GangPhase.PLACED
    assert ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED).count() == 2
    assert reclaim.run()["victims"] == 0 and Preemption.objects.count() == 2


def test_a_requeued_gang_does_not_take_back_what_was_freed_for_its_preemptor(admin_client, h100_fleet):
    """The gang worker tries the requeued gang before any claims round tries the preemptor: the node its
    victims freed is held for the preemptor, so the gang waits (HeldForQueueHead) and is not placed there
    again to be preempted a second time; the preemptor then runs, with 2 notices in all."""
    two_gangs_fill_the_fleet(admin_client)
    submit(admin_client, "a", "want4", 4)
    allocate_round()
    assert reclaim.run()["gangs_requeued"] == 1
    place_gangs()
    g2 = Gang.objects.get(name="g2")
    assert (g2.phase, g2.reason) == (GangPhase.PENDING, "HeldForQueueHead"), (g2.phase, g2.reason)
    allocate_round()
    assert ResourceClaim.objects.get(name="want4").phase == Phase.ALLOCATED
    assert reclaim.run()["victims"] == 0 and Preemption.objects.count() == 2


def test_a_gang_younger_than_min_runtime_from_its_placement_is_spared(admin_client, h100_fleet):
    """minRuntimeSeconds 600: g2 (placed a minute ago) is protected, g1 (an hour ago) is the victim, whole."""
    two_gangs_fill_the_fleet(admin_client, min_runtime=600)
    submit(admin_client, "a", "want4", 4)
    allocate_round()
    out = reclaim.run()
    assert (out["victims"], out["gangs_requeued"]) == (2, 1), out
    assert {g.name: g.phase for g in Gang.objects.all()} == {"g1": GangPhase.PENDING, "g2": GangPhase.PLACED}


def test_a_gang_under_notice_stays_placed_until_every_member_is_requeued(admin_client, h100_fleet):
    """With a grace period the members keep their devices while the notice runs; the gang stays Placed and the
    lifecycle sweep does not count its members as lost. One member confirmed early: still Placed. Both: Pending."""
    two_gangs_fill_the_fleet(admin_client)
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 300}}},
                              format="json").status_code == 200
    submit(admin_client, "a", "want4", 4)
    allocate_round()
    out = reclaim.run()
    assert (out["victims"], out["requeued"]) == (2, 0), out
    victims = list(Preemption.objects.order_by("victim_id").values_list("victim__name", flat=True))
    first = victims[0]
    resp = admin_client.post(f"{ns('ci')}/resourceclaims/{first}/release-confirm", {}, format="json")
    assert resp.status_code in (200, 202), resp.content
    assert lifecycle.sweep()["requeued"] == 0
    g2 = Gang.objects.get(name="g2")
    assert g2.phase == GangPhase.PLACED and ResourceClaim.objects.get(name=first).phase == Phase.PENDING
    assert not GangMember.objects.filter(phase=MemberPhase.LOST).exists()
    resp = admin_client.post(f"{ns('ci')}/resourceclaims/{victims[1]}/release-confirm", {}, format="json")
    assert resp.status_code in (200, 202), resp.content
    assert lifecycle.sweep()["requeued"] == 1
    assert Gang.objects.get(name="g2").phase == GangPhase.PENDING
