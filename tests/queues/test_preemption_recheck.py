"""Re-check of running preemption notices (issue 30): a victim whose preemptor no longer needs its devices keeps
them -- the preemptor found room freed by an unrelated release, was allocated elsewhere, or was deleted. Exact
counts of cancelled notices and of devices moved."""
from __future__ import annotations

import pytest
from django.utils import timezone

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from draservice.models import WebhookDelivery
from queues.models import Preemption, PreemptionState
from scheduler.services import preemption, reclaim
from tests.queues.test_admission import ns, rounds, submit
from tests.queues.test_preemption import borrowed_fleet
from tests.test_metrics_grafana import scrape

pytestmark = pytest.mark.django_db
HOOK = "https://hooks.example.test/preemption"


@pytest.fixture
def hooked(settings):
    settings.WEBHOOK_ALLOWED_TARGETS = ["https://hooks.example.test"]


def noticed(admin_client, *wants: tuple[str, int]) -> dict[str, set[int]]:
    """The default queue borrows all 16 GPUs (grace 300 s, a webhook); each of ``wants`` (name, GPUs) of team-a
    reclaims in one pass. Returns preemptor name -> its victims' ids."""
    borrowed_fleet(admin_client, grace=300, webhook=HOOK)
    for name, n in wants:
        submit(admin_client, "a", name, n)
    rounds(1)
    out = reclaim.run()
    assert out["victims"] == sum(n for _, n in wants), out
    return {name: set(Preemption.objects.filter(preemptor__name=name).values_list("victim_id", flat=True))
            for name, _ in wants}


def release_bystanders(admin_client, victims: set[int], node: str, n: int) -> None:
    """Release ``n`` claims of "ci" on ``node`` that are not victims (an unrelated release)."""
    others = (ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED, node=node)
              .exclude(id__in=victims).order_by("id")[:n])
    assert len(others) == n
    for c in others:
        assert admin_client.post(f"{ns('ci')}/resourceclaims/{c.name}/release", {}, format="json").status_code == 200


def assert_cancelled(victims: set[int]) -> None:
    """These victims kept their device, their notice is cancelled and said so (condition, event, webhook)."""
    for v in ResourceClaim.objects.filter(id__in=victims):
        assert v.phase == Phase.ALLOCATED and DeviceAllocation.objects.filter(claim=v).count() == 1
        cond = next(c for c in v.conditions if c["type"] == "Preempted")
        assert (cond["status"], cond["reason"]) == ("False", "PreemptionCancelled"), cond
        assert not any(c["type"] == "Releasing" for c in v.conditions) and v.preemption is None
    rows = Preemption.objects.filter(victim_id__in=victims)
    assert set(rows.values_list("state", flat=True)) == {PreemptionState.CANCELLED}
    assert ClaimEvent.objects.filter(claim_id__in=victims, reason="PreemptionCancelled").count() == len(victims)
    hooks = WebhookDelivery.objects.filter(event="preemption.cancelled")
    assert sorted(d.payload["claim"]["name"] for d in hooks) == sorted(
        ResourceClaim.objects.filter(id__in=victims).values_list("name", flat=True))
    assert all(d.payload["reason"] == "PreemptionCancelled" for d in hooks)


@pytest.mark.parametrize("first", ["pass", "round"])
def test_a_release_elsewhere_during_grace_cancels_every_victim_and_moves_nothing(admin_client, h100_fleet, hooked,
                                                                               first):
    victims = noticed(admin_client, ("mine", 4))["mine"]
    node = ResourceClaim.objects.get(id=next(iter(victims))).node
    other = ResourceClaim.objects.exclude(node=node).filter(phase=Phase.ALLOCATED).first().node
    release_bystanders(admin_client, victims, other, 4)  # room for mine on the other node
    if first == "pass":  # the pass's engine re-check finds it fits without them
        assert reclaim.run()["cancelled"] == 4
    rounds(1)  # "round": the commit that allocates mine cancels its notices in its transaction
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
    assert_cancelled(victims)
    Preemption.objects.update(deadline=timezone.now(), stop_by=timezone.now())
    assert preemption.sweep() == 0 and reclaim.run()["requeued"] == 0
    assert ResourceClaim.objects.filter(namespace__name="ci", phase=Phase.ALLOCATED).count() == 12
    assert ClaimEvent.objects.filter(type="Preempted", reason="Preempted").count() == 0  # 0 devices moved
    samples = scrape(admin_client)
    assert samples["draservice_preemption_cancelled_total"] == [({"queue": "default"}, 4.0)]
    assert not any(lab == {"queue": "default"} for lab, _ in samples.get("draservice_queue_preemptions_total", []))


def test_a_preemptor_deleted_during_grace_cancels_its_notices_in_that_transaction(admin_client, h100_fleet, hooked):
    victims = noticed(admin_client, ("mine", 3))["mine"]
    assert admin_client.delete(f"{ns('a')}/resourceclaims/mine").status_code in (200, 204)
    assert_cancelled(victims)
    assert Preemption.objects.filter(state=PreemptionState.PENDING).count() == 0
    assert preemption.sweep() == 0


def test_a_confirmation_after_room_was_freed_keeps_the_devices(admin_client, h100_fleet, hooked):
    victims = noticed(admin_client, ("mine", 2))["mine"]
    node = ResourceClaim.objects.get(id=min(victims)).node
    release_bystanders(admin_client, victims, node, 2)
    name = ResourceClaim.objects.get(id=min(victims)).name
    resp = admin_client.post(f"{ns('ci')}/resourceclaims/{name}/release-confirm", {}, format="json")
    assert resp.status_code == 200, resp.content
    assert_cancelled({min(victims)})  # just before its devices moved, the re-check withdrew its notice
    assert reclaim.run()["cancelled"] == 1  # the other one at the next pass
    assert_cancelled(victims)


@pytest.mark.parametrize("elsewhere", ["round", "pass"])
def test_of_two_preemptors_only_the_one_satisfied_elsewhere_loses_its_victims(admin_client, h100_fleet, hooked,
                                                                             elsewhere):
    victims = noticed(admin_client, ("one", 2), ("two", 2))
    assert len(victims["one"]) == len(victims["two"]) == 2
    busy = {ResourceClaim.objects.get(id=i).node for i in victims["one"] | victims["two"]}
    node = sorted(busy)[0]
    release_bystanders(admin_client, victims["one"] | victims["two"], node, 2)  # room for one of them
    if elsewhere == "round":
        rounds(1)
        assert ResourceClaim.objects.get(name="one").phase == Phase.ALLOCATED
        assert ResourceClaim.objects.get(name="two").phase == Phase.PENDING
        assert reclaim.run()["cancelled"] == 0  # two's victims are still needed
    else:
        assert reclaim.run()["cancelled"] == 2  # in notice order: one fits, then two does not
    assert_cancelled(victims["one"])
    assert set(Preemption.objects.filter(victim_id__in=victims["two"]).values_list("state", flat=True)) == {
        PreemptionState.PENDING}
    Preemption.objects.filter(state=PreemptionState.PENDING).update(deadline=timezone.now())
    assert preemption.sweep() == 2  # exactly two's victims move
    rounds(1)
    assert {ResourceClaim.objects.get(name=n).phase for n in ("one", "two")} == {Phase.ALLOCATED}
    assert ClaimEvent.objects.filter(type="Preempted", reason="Preempted").count() == 2
    assert ResourceClaim.objects.filter(id__in=victims["one"], phase=Phase.ALLOCATED).count() == 2


def test_a_gang_victim_is_given_back_whole_when_its_preemptor_is_deleted(admin_client, h100_fleet):
    from gangs.models import Gang, GangPhase
    from tests.queues.test_gang_victims import two_gangs_fill_the_fleet

    two_gangs_fill_the_fleet(admin_client)
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": {"graceSeconds": 300}}},
                              format="json").status_code == 200
    submit(admin_client, "a", "want4", 4)
    rounds(1)
    assert reclaim.run()["victims"] == 2  # one gang, both members
    victims = set(Preemption.objects.values_list("victim_id", flat=True))
    assert admin_client.delete(f"{ns('a')}/resourceclaims/want4").status_code in (200, 204)
    assert set(Preemption.objects.values_list("state", flat=True)) == {PreemptionState.CANCELLED}
    assert ResourceClaim.objects.filter(id__in=victims, phase=Phase.ALLOCATED).count() == 2
    assert {g.phase for g in Gang.objects.all()} == {GangPhase.PLACED}
    assert reclaim.run()["requeued"] == 0
